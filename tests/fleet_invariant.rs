//! The fleet's invariant under chaos: 3 to 5 replicas over the in-memory etcd model, in model
//! time, through random phases — lossy network (random delays, lost requests, lost replies,
//! host timeouts; answers may arrive after the timeout and requests reach etcd after it), random
//! demand changes, replica crashes and restarts, replicas joining, etcd outages (a restart
//! renews the leases), a replica cut off from etcd (while another may join: the cut-off replica's
//! number of replicas is then stale), etcd losing its data while the replicas run (revision back
//! to 1, a new cluster id, every key and lease gone), foreign keys written under the prefix — and
//! quiet phases. Half the seeds set `maxReplicas`.
//!
//! After **every** event (`common/fleet_sim.rs: Sim::check`): every live replica with a record
//! uses at most its claim; Σ over replicas of the seats in the fleet's accounting ≤ the level's
//! fleet CurrentCL of the last checked grant, per level, and in total ≤ the largest Σ CurrentCL;
//! a replica whose record expired while it was cut off is not synced and stays under its last
//! claims (that is the overshoot, reported). Every successful write is checked against the
//! snapshot it compared (`Sim::verify_write`). Within 5 periods of the start of every quiet phase
//! the fleet has converged (limits = claims = the allocation of etcd's state, no overshoot left);
//! after a crash in a clean phase
//! the crashed replica's seats serve the others within leaseTtl + 2 periods. After etcd lost its
//! data, until every replica has recovered, Σ seats in use of every replica — in the fleet's
//! accounting or not — stays within Σ claims before the loss (the fleet's CurrentCL), and every
//! replica notices. A cut-off replica whose older requests drained uses at most its static share
//! (⌊CurrentCL ÷ max(the replicas it last saw, maxReplicas)⌋). Foreign keys are ignored and do
//! not keep the fleet from converging. Seeds are fixed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

#[path = "common/fleet_sim.rs"]
mod fleet_sim;

use apf_wasm::fleet::FleetMode;
use fleet_sim::{Net, Rng, Sim, MS, S};

const DT: i64 = 50 * MS;

fn random_demand(rng: &mut Rng) -> Vec<u32> {
    (0..4).map(|i| if i == 0 || rng.chance(25.0) { 0 } else { rng.below(25) as u32 }).collect()
}

fn lossy(rng: &mut Rng) -> Net {
    Net {
        delay_min: MS,
        delay_max: rng.range(20, 450) * MS,
        loss_request: rng.range(0, 15) as f64,
        loss_reply: rng.range(0, 15) as f64,
        timeout: rng.range(200, 600) * MS,
    }
}

fn clean() -> Net {
    Net { delay_max: 30 * MS, ..Net::perfect() }
}

#[derive(Default, Debug)]
struct Phases {
    quiet: u32,
    lossy: u32,
    crash: u32,
    restart: u32,
    join: u32,
    outage: u32,
    partition: u32,
    stale_n: u32,
    lost_data: u32,
    foreign: u32,
}

fn run_until_converged(sim: &mut Sim, limit: i64) -> Option<i64> {
    let start = sim.now;
    while sim.now - start <= limit {
        if sim.converged().is_ok() && sim.last_overshoot == 0 {
            return Some(sim.now - start);
        }
        sim.step(DT);
    }
    None
}

/// Foreign keys under the replicas prefix: each is ignored by every replica.
fn foreign_key(sim: &mut Sim, rng: &mut Rng) {
    let n = rng.next();
    let huge = r#"{"format":1,"levels":{"high":{"claim":4294967295,"granted":4294967295}}}"#.to_string();
    let demand = r#"{"format":1,"levels":{"low":{"avg":1e9,"stdDev":1e9,"highWatermark":1000000000,"smoothed":1e9}}}"#.to_string();
    match n % 5 {
        0 => sim.put_foreign(format!("junk-{n}").as_bytes(), b"\x00not json", 0),
        1 => sim.put_foreign(format!("huge-{n}").as_bytes(), huge.as_bytes(), 0),
        2 => sim.put_foreign(format!("demand-{n}").as_bytes(), demand.as_bytes(), 30),
        3 => sim.put_foreign(format!("newer-{n}").as_bytes(), br#"{"format":2}"#, 30),
        _ => sim.put_foreign(format!("a/b-{n}").as_bytes(), br#"{"format":1}"#, 30),
    }
}

fn unpartition(sim: &mut Sim) {
    for r in sim.replicas.iter_mut() {
        r.partitioned = false;
    }
}

/// One replica cut off from etcd while the others see it, for `secs`; with `join`, another
/// replica starts meanwhile (the cut-off one's count of replicas is stale). Once it has been in
/// fallback long enough for its older requests to drain, it uses at most its static share.
fn partition(sim: &mut Sim, slot: usize, secs: i64, join: Option<Vec<u32>>) {
    sim.replicas[slot].partitioned = true;
    let drain = sim.service_max + sim.apply_lag + DT;
    let mut fallback_since = None;
    let end = sim.now + secs * S;
    let join_at = sim.now + S;
    let mut join = join;
    while sim.now < end {
        if sim.now >= join_at {
            if let Some(d) = join.take() {
                let dead = sim.replicas.iter().find(|r| !r.alive).map(|r| r.slot);
                sim.start_replica(dead, d);
            }
        }
        sim.step(DT);
        let r = &sim.replicas[slot];
        if r.fleet.mode() != FleetMode::Fallback {
            fallback_since = None;
            continue;
        }
        let since = *fallback_since.get_or_insert(sim.now);
        if sim.now - since >= drain {
            let (shares, used) = (r.fleet.static_shares(), r.in_use());
            for (i, l) in sim.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
                assert!(used[i] <= shares[i], "t={}: cut off, level {} uses {} > static share {}", sim.now, l.name, used[i], shares[i]);
            }
        }
    }
    sim.replicas[slot].partitioned = false;
}

/// etcd loses its data while the replicas run, from a converged fleet on a clean network.
fn lose_data(sim: &mut Sim, seed: u64) {
    let (period, ttl) = (sim.config.period, sim.config.lease_ttl);
    assert!(run_until_converged(sim, 10 * S).is_some(), "seed {seed}: not converged before the loss: {:?}", sim.converged());
    let before = sim.allocation_now();
    let losses: Vec<u64> = sim.replicas.iter().map(|r| r.fleet.data_losses()).collect();
    let bound = sim.wipe_etcd(ttl + 2 * period);
    for (i, l) in before.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
        assert!(bound[i] <= u64::from(l.current), "seed {seed}: level {i}: claims {} above CurrentCL {}", bound[i], l.current);
    }
    while sim.wipe_bound.as_ref().is_some_and(|(until, _)| sim.now < *until) {
        sim.step(DT);
    }
    for r in sim.replicas.iter().filter(|r| r.alive) {
        assert!(r.fleet.data_losses() > losses[r.slot], "seed {seed}: {} did not notice", r.fleet.replica_id());
    }
}

fn chaos(seed: u64, steps: u64) -> (fleet_sim::Stats, Phases) {
    let mut sim = Sim::new(seed, clean());
    if seed.is_multiple_of(2) {
        sim.config.max_replicas = Some(5);
    }
    let mut rng = Rng(seed ^ 0xc4a0_5eed);
    let mut phases = Phases::default();
    let n = rng.range(3, 5) as usize;
    for _ in 0..n {
        let d = random_demand(&mut rng);
        sim.start_replica(None, d);
        sim.run(rng.range(1, 9) as f64 / 10.0, DT);
    }
    let period = sim.config.period;
    let ttl = sim.config.lease_ttl;
    while sim.stats.steps < steps {
        match rng.below(12) {
            0..=2 => {
                // Quiet: a clean network, fixed demand; the fleet converges within 5 periods.
                phases.quiet += 1;
                sim.net = clean();
                for r in sim.replicas.iter_mut() {
                    r.partitioned = false;
                }
                sim.set_etcd_up(true);
                let took = run_until_converged(&mut sim, 5 * period);
                assert!(took.is_some(), "seed {seed} t={}: not converged: {:?}", sim.now, sim.converged());
            }
            3..=4 => {
                // Lossy network and demand changes.
                phases.lossy += 1;
                sim.net = lossy(&mut rng);
                for _ in 0..rng.range(2, 6) {
                    for slot in 0..sim.replicas.len() {
                        if rng.chance(40.0) {
                            sim.replicas[slot].demand = random_demand(&mut rng);
                        }
                    }
                    sim.run(rng.range(5, 30) as f64 / 10.0, DT);
                }
            }
            5 => {
                // A crash in a clean phase: the survivors get its seats within leaseTtl + 2 periods.
                let live: Vec<usize> = sim.replicas.iter().filter(|r| r.alive).map(|r| r.slot).collect();
                if live.len() < 2 {
                    continue;
                }
                phases.crash += 1;
                sim.net = clean();
                sim.set_etcd_up(true);
                for r in sim.replicas.iter_mut() {
                    r.partitioned = false;
                }
                if run_until_converged(&mut sim, 10 * S).is_none() {
                    panic!("seed {seed}: not converged before the crash: {:?}", sim.converged());
                }
                let victim = live[rng.below(live.len() as u64) as usize];
                let id = sim.replicas[victim].fleet.replica_id().to_string();
                sim.crash(victim);
                let start = sim.now;
                while sim.records().contains_key(&id) || sim.converged().is_err() {
                    assert!(
                        sim.now - start <= ttl + 2 * period,
                        "seed {seed}: {id}'s seats not redistributed within leaseTtl + 2 periods: {:?}",
                        sim.converged()
                    );
                    sim.step(DT);
                }
            }
            6 => {
                // A crashed replica restarts (a new process: a new id), or a new one joins.
                let dead: Vec<usize> = sim.replicas.iter().filter(|r| !r.alive).map(|r| r.slot).collect();
                let d = random_demand(&mut rng);
                if let Some(&slot) = dead.first() {
                    phases.restart += 1;
                    sim.start_replica(Some(slot), d);
                } else if sim.replicas.len() < 5 {
                    phases.join += 1;
                    sim.start_replica(None, d);
                }
                sim.run(rng.range(1, 4) as f64, DT);
            }
            7..=8 => {
                // etcd down for a while (possibly longer than the leases), then back.
                phases.outage += 1;
                sim.net = if rng.chance(50.0) { clean() } else { lossy(&mut rng) };
                sim.set_etcd_up(false);
                sim.run(rng.range(1, 12) as f64, DT);
                sim.set_etcd_up(true);
                sim.run(rng.range(1, 3) as f64, DT);
            }
            10 => {
                // etcd loses its data while the replicas run.
                phases.lost_data += 1;
                sim.net = clean();
                unpartition(&mut sim);
                sim.set_etcd_up(true);
                lose_data(&mut sim, seed);
            }
            11 => {
                // Someone writes under the replicas prefix.
                phases.foreign += 1;
                foreign_key(&mut sim, &mut rng);
                sim.run(rng.range(1, 3) as f64, DT);
            }
            _ => {
                // One replica cut off from etcd while the others see it (and one may join).
                let live: Vec<usize> = sim.replicas.iter().filter(|r| r.alive).map(|r| r.slot).collect();
                phases.partition += 1;
                let slot = live[rng.below(live.len() as u64) as usize];
                let can_join = sim.replicas.iter().any(|r| !r.alive) || sim.replicas.len() < 5;
                let join = (can_join && rng.chance(50.0)).then(|| random_demand(&mut rng));
                phases.stale_n += u32::from(join.is_some());
                let secs = rng.range(2, 10);
                partition(&mut sim, slot, secs, join);
                sim.run(1.0, DT);
            }
        }
    }
    (sim.stats.clone(), phases)
}

#[test]
fn invariant_holds_under_chaos() {
    for seed in [1, 2, 3, 4] {
        let (stats, phases) = chaos(seed, 3000);
        eprintln!("seed {seed}: {phases:?}\n  {stats:?}");
        assert!(stats.writes_ok > 150 && stats.raises_checked > 20, "seed {seed}: the protocol was exercised: {stats:?}");
        assert!(
            phases.quiet >= 3
                && phases.lossy >= 3
                && phases.outage >= 2
                && phases.partition >= 1
                && phases.crash >= 1
                && phases.lost_data >= 1
                && phases.foreign >= 1,
            "seed {seed}: {phases:?}"
        );
    }
}
