#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Fleet mode through the gateway: three processes (two workers each, the mock host) in front
//! of one in-memory etcd (`fleet::memetcd`), driven tick by tick. The fleet's limit holds at
//! every step, the seats follow the load, and a replica that dies gives its seats back.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::fleet::memetcd::MemEtcd;
use mock_host::{headers, Node, Proxy};
use serde_json::json;
use std::rc::Rc;
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";
const GROUP: &str = "e2e-users";
/// The fleet's limit: 20 seats, 15 of them the level's (catch-all keeps 5).
const FLEET_LEVEL_SEATS: u32 = 15;

fn config() -> String {
    json!({
        "serverConcurrencyLimit": 20,
        "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "fleet": {"etcd": {"cluster": "etcd"}, "period": "1s", "leaseTtl": "5s"},
        "policy": [
            {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
             "metadata": {"name": "lvl"},
             "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 15, "lendablePercent": 0,
                      "borrowingLimitPercent": 0,
                      "limitResponse": {"type": "Queue", "queuing": {"queues": 16, "handSize": 4, "queueLengthLimit": 100}}}}},
            {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
             "metadata": {"name": "fs"},
             "spec": {"priorityLevelConfiguration": {"name": "lvl"}, "matchingPrecedence": 1000,
                      "distinguisherMethod": {"type": "ByUser"},
                      "rules": [{"subjects": [{"kind": "Group", "group": {"name": GROUP}}],
                                 "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                    "namespaces": ["*"], "clusterScope": true}]}]}}
        ]
    })
    .to_string()
}

/// One Envoy process: its shared data and its workers.
struct Process {
    proxy: Rc<Proxy>,
    nodes: Vec<Node>,
    /// Requests executing (admitted or resumed), by (worker, context).
    open: Vec<(usize, u32)>,
    alive: bool,
}

struct World {
    etcd: MemEtcd,
    procs: Vec<Process>,
    now: Duration,
}

impl World {
    fn new(n: usize, workers: usize) -> World {
        let procs = (0..n)
            .map(|_| {
                let proxy = Proxy::new();
                let mut nodes: Vec<Node> = (0..workers).map(|i| Node::new(&proxy, i)).collect();
                for node in &mut nodes {
                    assert!(node.configure(&config()));
                }
                Process { proxy, nodes, open: Vec::new(), alive: true }
            })
            .collect();
        World { etcd: MemEtcd::new(), procs, now: Duration::from_secs(1) }
    }

    fn nanos(&self) -> i64 {
        self.now.as_nanos() as i64
    }

    /// 50 ms: every live worker ticks and reads its mailbox, and etcd answers every call.
    fn step(&mut self) {
        self.now += Duration::from_millis(50);
        let now = self.nanos();
        self.etcd.advance(now);
        for p in self.procs.iter_mut().filter(|p| p.alive) {
            p.proxy.now.set(now);
            for node in &mut p.nodes {
                node.tick();
                node.deliver_mail();
            }
            // Calls and their answers until none is left (answers may start new calls).
            for _ in 0..10 {
                let calls: Vec<_> = p.proxy.calls.borrow_mut().drain(..).collect();
                if calls.is_empty() {
                    break;
                }
                for call in calls {
                    let path = call.header(":path").unwrap().to_string();
                    let hdrs: Vec<(&str, String)> = call.headers.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
                    let (status, body) = self.etcd.handle(&path, &hdrs, &call.body, now);
                    p.nodes[call.worker].call_response(call.token, Some(u32::from(status)), &body);
                }
            }
            for node in &mut p.nodes {
                node.deliver_mail();
            }
        }
    }

    /// `n` requests on process `p` (spread over its workers) that never finish.
    fn load(&mut self, p: usize, n: usize) {
        let proc_ = &mut self.procs[p];
        for i in 0..n {
            let wi = i % proc_.nodes.len();
            let (ctx, _) = proc_.nodes[wi].request(&headers("GET", PODS, &format!("u{p}-{i}"), &[GROUP]), &[]);
            proc_.open.push((wi, ctx));
        }
    }

    /// Requests of the level executing on process `p` now (from its shared level state).
    fn executing(&self, p: usize) -> usize {
        let key = apf_wasm::engine::level_key("lvl");
        let st = apf_wasm::engine::read_level(&self.procs[p].proxy.store, &key).unwrap();
        st.map_or(0, |st| st.qs.requests_executing() as usize)
    }

    fn total_executing(&self) -> usize {
        (0..self.procs.len()).filter(|&p| self.procs[p].alive).map(|p| self.executing(p)).sum()
    }
}

#[test]
fn the_fleet_limit_holds_and_the_seats_follow_the_load() {
    let mut world = World::new(3, 2);
    // Join: every replica registers; nothing is loaded yet.
    for _ in 0..60 {
        world.step();
    }
    assert_eq!(world.etcd.range(b"/apf-wasm/", b"/apf-wasm0").len(), 3, "three replica records");
    // Every worker serves dump_fleet (from what its process's driver published), and the
    // driver's stats say how many replicas the fleet has.
    for p in 0..3 {
        for w in 0..2 {
            let admin = [("x-remote-user", "admin"), ("x-remote-group", "system:masters")];
            let dump: serde_json::Value = serde_json::from_str(&world.procs[p].nodes[w].dump("dump_fleet", &admin, &[])).unwrap();
            assert_eq!(dump["replicas"].as_array().unwrap().len(), 3, "{dump}");
            assert_eq!(dump["mode"], "Synced", "{dump}");
            assert!(dump["lastSyncAgeSeconds"].as_f64().unwrap() < 3.0, "{dump}");
            assert!(dump["limits"]["lvl"].as_u64().is_some(), "{dump}");
        }
        assert_eq!(world.procs[p].proxy.stat("apf_wasm_fleet_replicas"), 3);
    }
    // All the load on replica 0: 40 requests that never finish.
    world.load(0, 40);
    let mut max_total = 0;
    for _ in 0..80 {
        world.step();
        let total = world.total_executing();
        max_total = max_total.max(total);
        assert!(total <= FLEET_LEVEL_SEATS as usize, "{total} executing in the fleet, limit {FLEET_LEVEL_SEATS}");
    }
    let on_0 = world.executing(0);
    eprintln!("load on replica 0 only: {on_0} of {FLEET_LEVEL_SEATS} seats there, at most {max_total} in the fleet");
    assert!(on_0 * 100 >= FLEET_LEVEL_SEATS as usize * 85, "replica 0 uses {on_0} of {FLEET_LEVEL_SEATS} seats");
    // Its driver exports its seats per level with the state it publishes (once a period); the
    // exempt level has none.
    let admin = [("x-remote-user", "admin"), ("x-remote-group", "system:masters")];
    let dump: serde_json::Value = serde_json::from_str(&world.procs[0].nodes[0].dump("dump_fleet", &admin, &[])).unwrap();
    let allocated = world.procs[0].proxy.stat("apf_wasm_fleet_allocated_seats.priority_level.lvl");
    assert_eq!(Some(allocated as u64), dump["limits"]["lvl"].as_u64(), "{dump}");
    assert!(allocated > 1, "allocated {allocated}");
    assert!(!world.procs[0].proxy.has_stat("apf_wasm_fleet_allocated_seats.priority_level.exempt"));
    // The load moves to replica 1 as well; replica 0's requests keep their seats.
    world.load(1, 40);
    for _ in 0..80 {
        world.step();
        let total = world.total_executing();
        assert!(total <= FLEET_LEVEL_SEATS as usize, "{total} executing in the fleet, limit {FLEET_LEVEL_SEATS}");
    }
    eprintln!("load on 0 and 1: {} and {} seats", world.executing(0), world.executing(1));
    // Replica 0 dies: its lease expires and replica 1 gets its seats.
    world.procs[0].alive = false;
    let held_by_0 = world.executing(0);
    let before = world.executing(1);
    for _ in 0..(20 * 8) {
        world.step();
    }
    let after = world.executing(1);
    eprintln!("replica 0 died holding {held_by_0}: replica 1 went from {before} to {after} seats");
    assert!(after > before, "replica 1 went from {before} to {after} seats after replica 0 ({held_by_0}) died");
    assert!(after * 100 >= FLEET_LEVEL_SEATS as usize * 85, "replica 1 uses {after} of {FLEET_LEVEL_SEATS} seats");
}
