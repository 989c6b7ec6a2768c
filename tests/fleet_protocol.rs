//! The claim protocol in scenarios, over the in-memory etcd model in model time: convergence,
//! load moving between replicas, a replica joining, dying, cut off from etcd, etcd down, and
//! token authentication. The invariant is checked after every event (`common/fleet_sim.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

#[path = "common/fleet_sim.rs"]
mod fleet_sim;

use fleet_sim::{Net, Sim, MS};

const DT: i64 = 50 * MS;

#[test]
fn three_replicas_converge() {
    let mut sim = Sim::new(1, Net::perfect());
    for d in [[0, 10, 10, 2], [0, 10, 10, 2], [0, 10, 10, 2]] {
        sim.start_replica(None, d.to_vec());
        sim.run(0.3, DT);
    }
    sim.run(5.0, DT);
    sim.converged().unwrap();
    eprintln!("{:?}", sim.stats);
    for r in sim.live() {
        eprintln!("{} {:?} {:?}", r.fleet.replica_id(), r.fleet.limits(), r.fleet.targets());
    }
}
