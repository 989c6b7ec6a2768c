#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! A replica leaving the fleet gracefully ([`Fleet::leave_gracefully`]) over the in-memory etcd
//! model, on a clean and on a lossy network: the invariant holds after every event
//! (`common/fleet_sim.rs: Sim::check`: every replica uses at most its claim and its granted
//! seats, Σ covered seats ≤ the fleet's CurrentCL); the leaving replica admits nothing new, its
//! claims come down with its seats in use, and its record goes within `leaseTtl` at most (here
//! its lease revoke is never delivered: the lease expires); the others then converge.

#[path = "common/fleet_sim.rs"]
mod fleet_sim;

use apf_wasm::fleet::snapshot::claims_of;
use apf_wasm::fleet::FleetMode;
use fleet_sim::{Net, Sim, MS};

const DT: i64 = 50 * MS;

fn leave(seed: u64, net: Net) {
    let mut sim = Sim::new(seed, net);
    for _ in 0..3 {
        sim.start_replica(None, vec![0, 20, 15, 10]);
        sim.run(0.3, DT);
    }
    sim.run(5.0, DT);
    let id = sim.replicas[0].fleet.replica_id().to_string();
    let (period, ttl) = (sim.config.period, sim.config.lease_ttl);
    let start = sim.now;
    let mut last_claims = u32::MAX;
    while sim.records().contains_key(&id) {
        assert!(sim.now - start <= ttl + period, "seed {seed}: {id}'s record still there {} ms after leaving", (sim.now - start) / MS);
        let now = sim.now;
        // The revoke (when drained) is lost on the way: the lease expires instead.
        drop(sim.replicas[0].fleet.leave_gracefully(now));
        let f = &sim.replicas[0].fleet;
        assert_eq!(f.mode(), FleetMode::Leaving);
        assert!(f.limits().iter().flatten().all(|&l| l == 0), "seed {seed}: limits {:?} while leaving", f.limits());
        if let Some(rec) = sim.records().get(&id) {
            let total: u32 = claims_of(rec, &sim.policy).iter().sum();
            assert!(total <= last_claims, "seed {seed}: the leaving replica's claims went up from {last_claims} to {total}");
            last_claims = total;
        }
        sim.step(DT);
    }
    assert!(sim.replicas[0].in_use().iter().all(|&u| u == 0), "seed {seed}: drained before the record went");
    sim.crash(0);
    sim.net = Net { delay_max: 30 * MS, ..Net::perfect() };
    let from = sim.now;
    while sim.converged().is_err() {
        assert!(sim.now - from <= 3 * period, "seed {seed}: not converged after the leave: {:?}", sim.converged());
        sim.step(DT);
    }
    eprintln!("seed {seed}: left after {} ms, the others converged {} ms later", (from - start) / MS, (sim.now - from) / MS);
}

#[test]
fn a_replica_leaves_gracefully_on_a_clean_network() {
    for seed in [1, 2, 3] {
        leave(seed, Net { delay_max: 30 * MS, ..Net::perfect() });
    }
}

#[test]
fn a_replica_leaves_gracefully_on_a_lossy_network() {
    for seed in [4, 5, 6] {
        leave(seed, Net::lossy());
    }
}
