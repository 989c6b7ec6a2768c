//! The claim protocol in scenarios, over the in-memory etcd model in model time: convergence,
//! load moving between replicas, a replica joining, dying, leaving, cut off from etcd, etcd
//! down, token authentication. The invariant is checked after every event
//! (`common/fleet_sim.rs: Sim::check`), and every successful write against the snapshot it
//! compared (`Sim::verify_write`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

#[path = "common/fleet_sim.rs"]
mod fleet_sim;

use apf_wasm::fleet::config::Credentials;
use apf_wasm::fleet::FleetMode;
use apf_wasm::simulate::memetcd::MemEtcd;
use fleet_sim::{Net, Sim, MS, S};

const DT: i64 = 50 * MS;
const HIGH: usize = 1;
const LOW: usize = 2;

/// Three replicas started 300 ms apart with the same demand, run until converged.
fn three(net: Net, demand: [u32; 4]) -> Sim {
    let mut sim = Sim::new(7, net);
    for _ in 0..3 {
        sim.start_replica(None, demand.to_vec());
        sim.run(0.3, DT);
    }
    sim.run(4.0, DT);
    sim.converged().unwrap();
    sim
}

/// Steps until `cond` holds; returns the model time it took (panics after `limit`).
fn until(sim: &mut Sim, limit: i64, what: &str, mut cond: impl FnMut(&Sim) -> bool) -> i64 {
    let start = sim.now;
    while !cond(sim) {
        assert!(sim.now - start <= limit, "{what}: not within {} ms", limit / MS);
        sim.step(DT);
    }
    sim.now - start
}

fn share_of(sim: &Sim, slot: usize, level: usize) -> f64 {
    let current = sim.allocation_now().levels[level].current;
    f64::from(sim.replicas[slot].fleet.limits()[level].unwrap()) / f64::from(current)
}

#[test]
fn three_replicas_converge_to_the_allocation() {
    let sim = three(Net::perfect(), [0, 10, 10, 2]);
    let alloc = sim.allocation_now();
    // 60 seats: high 20 (demand 30, nobody lends: low wants its 30), low 30, catch-all 10.
    let current: Vec<u32> = alloc.levels.iter().map(|l| l.current).collect();
    assert_eq!(current[1..], [20, 30, 10]);
    for r in sim.live() {
        let limits = r.fleet.limits();
        assert_eq!(limits[0], None, "exempt levels are not limited");
        assert_eq!(limits[LOW], Some(10));
    }
    let high: u32 = sim.live().map(|r| r.fleet.limits()[HIGH].unwrap()).sum();
    assert_eq!(high, 20);
}

#[test]
fn load_moving_between_replicas_moves_the_seats() {
    let mut sim = three(Net::perfect(), [0, 0, 0, 0]);
    // All of "high"'s load on replica 0: "low" is idle and lends, "high" borrows.
    sim.replicas[0].demand = vec![0, 60, 0, 0];
    let took = until(&mut sim, 3 * S, "replica 0 gets 85 % of high", |s| share_of(s, 0, HIGH) >= 0.85);
    eprintln!("load on replica 0: 85 % of the level after {} ms", took / MS);
    sim.run(3.0, DT);
    sim.converged().unwrap();
    assert!(share_of(&sim, 0, HIGH) >= 7.0 / 8.0 - 0.01, "{}", share_of(&sim, 0, HIGH));
    // The load moves to replica 2.
    sim.replicas[0].demand = vec![0, 0, 0, 0];
    sim.replicas[2].demand = vec![0, 60, 0, 0];
    let took = until(&mut sim, 3 * S, "replica 2 gets 85 % of high", |s| share_of(s, 2, HIGH) >= 0.85);
    eprintln!("load moved to replica 2: 85 % of the level after {} ms", took / MS);
    sim.run(3.0, DT);
    sim.converged().unwrap();
}

#[test]
fn a_joining_replica_is_absorbed() {
    let mut sim = Sim::new(11, Net::perfect());
    for _ in 0..2 {
        sim.start_replica(None, vec![0, 20, 20, 5]);
        sim.run(0.4, DT);
    }
    sim.run(4.0, DT);
    sim.converged().unwrap();
    // The newcomer uses nothing before its first claim (Sim::check), then its share.
    let slot = sim.start_replica(None, vec![0, 20, 20, 5]);
    let took = until(&mut sim, 3 * S, "the joiner converges", |s| s.converged().is_ok() && s.replicas[slot].fleet.limits()[HIGH] > Some(0));
    eprintln!("joiner absorbed after {} ms", took / MS);
    let high: Vec<u32> = sim.live().map(|r| r.fleet.limits()[HIGH].unwrap()).collect();
    assert_eq!(high.iter().sum::<u32>(), sim.allocation_now().levels[HIGH].current);
    assert!(high.iter().all(|&h| h >= 6), "{high:?}");
}

#[test]
fn a_crashed_replicas_seats_are_redistributed_within_lease_ttl_plus_two_periods() {
    for seed in [3, 4, 5] {
        let mut sim = three(Net { delay_max: 50 * MS, ..Net::perfect() }, [0, 20, 20, 5]);
        sim.rng.0 = seed;
        sim.crash(1);
        let crashed = sim.replicas[1].fleet.replica_id().to_string();
        let bound = sim.config.lease_ttl + 2 * sim.config.period;
        let took = until(&mut sim, bound, "survivors take the crashed replica's seats", |s| {
            !s.records().contains_key(&crashed) && s.converged().is_ok()
        });
        eprintln!("seed {seed}: crashed replica's seats redistributed after {} ms (bound {} ms)", took / MS, bound / MS);
        let alloc = sim.allocation_now();
        assert_eq!(alloc.replicas.len(), 2);
        for (i, l) in sim.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
            let sum: u32 = sim.live().map(|r| r.fleet.limits()[i].unwrap()).sum();
            assert_eq!(sum, alloc.levels[i].current, "level {}", l.name);
        }
    }
}

#[test]
fn a_leaving_replica_frees_its_seats_at_once() {
    let mut sim = three(Net::perfect(), [0, 20, 20, 5]);
    sim.replicas[2].demand = vec![0; 4];
    sim.run(1.0, DT);
    let calls = sim.replicas[2].fleet.leave(sim.now);
    assert_eq!(calls.len(), 1);
    assert_eq!(sim.replicas[2].fleet.limits()[HIGH], Some(0));
    let (status, _) = sim.etcd.handle(calls[0].path, &calls[0].headers, &calls[0].body, sim.now);
    assert_eq!(status, 200);
    sim.crash(2);
    let took = until(&mut sim, 2 * S, "the others take the seats", |s| s.converged().is_ok() && s.allocation_now().replicas.len() == 2);
    eprintln!("seats of a replica that left taken after {} ms", took / MS);
}

#[test]
fn etcd_outage_keeps_the_allocation_then_falls_back_then_rebalances() {
    let mut sim = three(Net::perfect(), [0, 30, 5, 5]);
    sim.replicas[0].demand = vec![0, 60, 40, 10];
    sim.run(4.0, DT);
    sim.converged().unwrap();
    let before: Vec<Vec<Option<u32>>> = sim.live().map(|r| r.fleet.limits().to_vec()).collect();
    let claims: Vec<Vec<u32>> = sim.live().map(|r| r.fleet.claims().unwrap().to_vec()).collect();
    sim.set_etcd_up(false);
    // While the lease may be alive: the last allocation.
    sim.run(2.5, DT);
    let during: Vec<Vec<Option<u32>>> = sim.live().map(|r| r.fleet.limits().to_vec()).collect();
    assert_eq!(during, before);
    assert!(sim.live().all(|r| r.fleet.mode() == FleetMode::Synced));
    // Past leaseTtl − period: the static share, never above the last claims.
    sim.run(3.0, DT);
    for (r, c) in sim.live().zip(&claims) {
        assert_eq!(r.fleet.mode(), FleetMode::Fallback);
        let shares = r.fleet.static_shares();
        for (i, l) in r.fleet.limits().iter().enumerate() {
            if let Some(l) = l {
                assert_eq!(*l, shares[i].min(c[i]), "{} level {i}", r.fleet.replica_id());
            }
        }
        // Every replica with demand keeps seats on every level: nothing fails because of etcd.
        assert!(r.fleet.limits()[HIGH].unwrap() > 0 && r.fleet.limits()[LOW].unwrap() > 0);
    }
    sim.run(10.0, DT);
    // etcd back (leases renewed to their full TTL): rebalanced.
    sim.set_etcd_up(true);
    let took = until(&mut sim, 3 * S, "rebalanced after the outage", |s| s.converged().is_ok());
    eprintln!("rebalanced {} ms after etcd came back", took / MS);
    assert_eq!(sim.stats.forced_registrations, 0);
}

#[test]
fn a_partitioned_replica_overshoots_at_most_its_static_share() {
    let mut sim = three(Net::perfect(), [0, 30, 30, 10]);
    let cut = sim.replicas[0].fleet.replica_id().to_string();
    let last_claims = sim.replicas[0].fleet.claims().unwrap().to_vec();
    sim.replicas[0].partitioned = true;
    let t0 = sim.now;
    // The others see its record until its lease expires; it falls back one period before.
    let limit = sim.config.lease_ttl + S;
    until(&mut sim, limit, "the partitioned replica's record expires", |s| !s.records().contains_key(&cut));
    assert_eq!(sim.replicas[0].fleet.mode(), FleetMode::Fallback);
    assert!(sim.now - t0 >= sim.config.lease_ttl - sim.config.period);
    // Its older requests drain; from then on it uses at most min(static share, last claim).
    sim.run(1.0, DT);
    let shares = sim.replicas[0].fleet.static_shares();
    for _ in 0..100 {
        sim.step(DT);
        let used = sim.replicas[0].in_use();
        for (i, l) in sim.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
            assert!(used[i] <= shares[i].min(last_claims[i]), "level {}: {} > min({}, {})", l.name, used[i], shares[i], last_claims[i]);
        }
    }
    assert!(sim.stats.max_overshoot > 0, "the overshoot was exercised");
    eprintln!("partition: overshoot at most {} seats (static shares {shares:?}, last claims {last_claims:?})", sim.stats.max_overshoot);
    // Healed: it learns its lease is gone, registers again with what it still uses, converges,
    // and the overshoot drains.
    sim.replicas[0].partitioned = false;
    let took = until(&mut sim, 4 * S, "the partitioned replica rejoins", |s| s.converged().is_ok() && s.last_overshoot == 0);
    eprintln!("rejoined {} ms after the partition healed", took / MS);
    sim.run(3.0, DT);
    assert_eq!(sim.last_overshoot, 0);
}

#[test]
fn token_authentication_and_token_expiry() {
    let mut sim = Sim::new(5, Net::perfect());
    sim.etcd = MemEtcd::with_auth(&[("apf", "s3cret")], 3 * S);
    sim.config.etcd.credentials = Some(Credentials { username: "apf".into(), password: "s3cret".into() });
    for _ in 0..3 {
        sim.start_replica(None, vec![0, 10, 10, 3]);
        sim.run(0.3, DT);
    }
    sim.run(4.0, DT);
    sim.converged().unwrap();
    // Tokens expire every 3 s: the replicas authenticate again and stay converged.
    for _ in 0..5 {
        sim.run(2.0, DT);
        sim.converged().unwrap();
    }
    // A replica with a wrong password never joins and never uses a seat.
    sim.config.etcd.credentials = Some(Credentials { username: "apf".into(), password: "wrong".into() });
    let slot = sim.start_replica(None, vec![0, 10, 10, 3]);
    sim.run(5.0, DT);
    assert_eq!(sim.replicas[slot].fleet.mode(), FleetMode::Joining);
    assert!(sim.replicas[slot].fleet.sync_failures() >= 4);
    assert!(sim.replicas[slot].in_use().iter().all(|&u| u == 0));
}

#[test]
fn lossy_network_still_converges() {
    let mut sim = three(Net::perfect(), [0, 15, 15, 3]);
    sim.net = Net::lossy();
    sim.run(30.0, DT);
    sim.net = Net::perfect();
    sim.run(5.0, DT);
    sim.converged().unwrap();
    eprintln!("{:?}", sim.stats);
}

/// etcd loses its data under load (stopped, wiped, restarted): every replica notices within a
/// period, recovers for leaseTtl under min(static share, its grant), and Σ seats in use of every
/// replica never exceeds the limit (Sim::check, the claims before the loss). `same_cluster`: the
/// wiped member comes back with the same cluster id (as etcd does with the same configuration),
/// so the revision going back or the lease vanishing tells.
fn lost_data(same_cluster: bool) {
    let mut sim = Sim::with_policy(13, Net { delay_max: 30 * MS, ..Net::perfect() }, fleet_sim::one_level_policy(20));
    for d in [30, 5, 12] {
        sim.start_replica(None, vec![d]);
        sim.run(0.3, DT);
    }
    sim.run(4.0, DT);
    sim.converged().unwrap();
    assert_eq!(sim.fleet_in_use(), vec![20]);
    let (ttl, period) = (sim.config.lease_ttl, sim.config.period);
    let before: Vec<(u32, u32)> = sim.live().map(|r| (r.fleet.limits()[0].unwrap(), r.fleet.static_shares()[0])).collect();
    let id = sim.etcd.cluster_id();
    let bound = sim.wipe_etcd(ttl + 2 * period);
    assert_eq!(bound, vec![20]);
    if same_cluster {
        sim.etcd.set_cluster_id(id);
    }
    let t0 = sim.now;
    let mut noticed = [None; 3];
    let mut most = 0;
    while sim.now - t0 < ttl + 2 * period {
        sim.step(DT);
        most = most.max(sim.fleet_in_use()[0]);
        for r in sim.live() {
            if r.fleet.mode() == FleetMode::Recovering {
                noticed[r.slot].get_or_insert(sim.now - t0);
                let (limit, share) = before[r.slot];
                assert!(r.fleet.limits()[0].unwrap() <= limit.min(share), "{}: above min({limit}, {share})", r.fleet.replica_id());
            }
        }
    }
    let noticed: Vec<i64> = noticed.iter().map(|t| t.expect("every replica notices") / MS).collect();
    assert!(noticed.iter().all(|&t| t <= period / MS + 100), "noticed after {noticed:?} ms");
    eprintln!("etcd lost its data (same cluster id: {same_cluster}): noticed after {noticed:?} ms, at most {most} of 20 seats in use");
    assert!(most <= 20);
    let took = until(&mut sim, 3 * S, "converged after recovering", |s| s.converged().is_ok() && s.last_overshoot == 0);
    eprintln!("  converged {} ms after leaseTtl + 2 periods; then {:?} of 20 seats in use", took / MS, sim.fleet_in_use());
    assert!(sim.live().all(|r| r.fleet.data_losses() == 1));
}

#[test]
fn etcd_losing_its_data_under_load_never_overshoots() {
    lost_data(false);
    lost_data(true);
}

/// One replica alone (it saw N = 1) is cut off from etcd; two more start and take the seats once
/// its lease expired. Its fallback is ⌊20 / max(1, maxReplicas)⌋: with maxReplicas 3, 6 seats,
/// so the fleet stays within 20 + 7 once its older requests drained; without, 20: up to 40.
fn stale_count(max_replicas: Option<u32>) -> u32 {
    let mut sim = Sim::with_policy(17, Net::perfect(), fleet_sim::one_level_policy(20));
    sim.config.max_replicas = max_replicas;
    sim.start_replica(None, vec![30]);
    sim.run(3.0, DT);
    sim.converged().unwrap();
    assert_eq!(sim.fleet_in_use(), vec![20]);
    let cut = sim.replicas[0].fleet.replica_id().to_string();
    sim.replicas[0].partitioned = true;
    sim.run(1.0, DT);
    sim.start_replica(None, vec![30]);
    sim.start_replica(None, vec![30]);
    let ttl = sim.config.lease_ttl;
    until(&mut sim, ttl, "the cut-off replica's record expires", |s| !s.records().contains_key(&cut));
    // Its older requests drain (the longest takes 400 ms); the others take the seats.
    sim.run(1.0, DT);
    let mut most = 0;
    for _ in 0..100 {
        sim.step(DT);
        most = most.max(sim.fleet_in_use()[0]);
    }
    let share = sim.replicas[0].fleet.static_shares()[0];
    eprintln!("maxReplicas {max_replicas:?}: static share {share}, at most {most} of 20 seats in use");
    assert!(most <= 20 + share, "{most} > 20 + {share}");
    most
}

#[test]
fn max_replicas_bounds_the_fallback_of_a_replica_that_saw_fewer() {
    let with = stale_count(Some(3));
    assert!(with <= 20 + 20_u32.div_ceil(3), "{with}");
    let without = stale_count(None);
    assert_eq!(without, 40, "without maxReplicas the cut-off replica keeps the whole limit");
}
