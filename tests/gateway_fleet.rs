#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Fleet mode through the gateway: three processes (two workers each, the mock host) in front
//! of one in-memory etcd (`simulate::memetcd`), driven tick by tick. The fleet's limit holds at
//! every step, the seats follow the load, and a replica that dies gives its seats back.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::etcd::{PutRequest, RequestOp, TxnRequest};
use apf_wasm::fleet::record::Record;
use apf_wasm::simulate::memetcd::MemEtcd;
use mock_host::{headers, Node, Proxy};
use serde_json::json;
use std::rc::Rc;
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";
const GROUP: &str = "e2e-users";
/// The fleet's limit: 20 seats, 15 of them the level's (catch-all keeps 5).
const FLEET_LEVEL_SEATS: u32 = 15;

fn config() -> String {
    config_with(&[], json!({"etcd": {"cluster": "etcd"}, "period": "1s", "leaseTtl": "5s"}))
}

/// The test policy plus `extra` levels (name, nominal shares; each one's flow schema sends the
/// group named like the level there), listed first, with the `fleet` object `fleet`.
fn config_with(extra: &[(&str, u32)], fleet: serde_json::Value) -> String {
    let mut cfg = json!({
        "serverConcurrencyLimit": 20,
        "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "fleet": fleet,
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
    });
    let policy = cfg["policy"].as_array_mut().unwrap();
    for (i, (name, shares)) in extra.iter().enumerate() {
        policy.insert(0, mock_host::priority_level(name, *shares, 16, 4, 100));
        policy.insert(1, mock_host::flow_schema(&format!("fs-{name}"), name, 900 + i as u32, &[name]));
    }
    cfg.to_string()
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
    /// etcd unreachable: every call fails (no answer).
    etcd_down: bool,
    /// Root contexts of an older configuration still alive (process, worker, root): every other
    /// step they tick first (and do the timer's work), else after the current ones.
    old_roots: Vec<(usize, usize, apf_wasm::gateway::Root)>,
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
        World { etcd: MemEtcd::new(), procs, now: Duration::from_secs(1), etcd_down: false, old_roots: Vec::new() }
    }

    fn nanos(&self) -> i64 {
        self.now.as_nanos() as i64
    }

    /// 50 ms: every live worker ticks and reads its mailbox, and etcd answers every call.
    fn step(&mut self) {
        self.now += Duration::from_millis(50);
        let now = self.nanos();
        self.etcd.advance(now);
        let old_first = (now / 50_000_000) % 2 == 0;
        for (pi, p) in self.procs.iter_mut().enumerate().filter(|(_, p)| p.alive) {
            p.proxy.now.set(now);
            for (wi, node) in p.nodes.iter_mut().enumerate() {
                let mut old = self.old_roots.iter_mut().filter(|(op, ow, _)| (*op, *ow) == (pi, wi)).peekable();
                if old.peek().is_none() || !old_first {
                    node.tick();
                }
                for (_, _, root) in old {
                    root.on_tick(&node.host, &mut node.worker);
                }
                if old_first {
                    node.tick();
                }
                node.deliver_mail();
            }
            // Calls and their answers until none is left (answers may start new calls).
            for _ in 0..10 {
                let calls: Vec<_> = p.proxy.calls.borrow_mut().drain(..).collect();
                if calls.is_empty() {
                    break;
                }
                for call in calls {
                    if self.etcd_down {
                        p.nodes[call.worker].call_response(call.token, None, &[]);
                        continue;
                    }
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

    /// The concurrency limit of `level` on process `p` now.
    fn limit(&self, p: usize, level: &str) -> u32 {
        let key = apf_wasm::engine::level_key(level);
        let st = apf_wasm::engine::read_level(&self.procs[p].proxy.store, &key).unwrap();
        st.map_or(0, |st| st.qs.config().concurrency_limit)
    }

    /// The worker of process `p` that drives its fleet membership.
    fn driver(&self, p: usize) -> &apf_wasm::gateway::fleet::FleetDriver {
        self.procs[p].nodes.iter().find_map(|n| n.worker.fleet_driver()).expect("a driver")
    }

    /// The replica records in etcd: (replica id, lease, record).
    fn records(&self) -> Vec<(String, i64, Record)> {
        let kvs = self.etcd.range(b"/apf-wasm/", b"/apf-wasm0");
        let id = |k: &[u8]| String::from_utf8_lossy(k).rsplit('/').next().unwrap().to_string();
        kvs.iter().map(|kv| (id(&kv.key), kv.lease, Record::decode(&kv.value).unwrap())).collect()
    }

    /// The record of process `p`'s replica, if any.
    fn record(&self, p: usize) -> Option<(i64, Record)> {
        let id = self.driver(p).feed().fleet().replica_id().to_string();
        self.records().into_iter().find(|(r, _, _)| *r == id).map(|(_, l, r)| (l, r))
    }

    /// A new configuration on every worker of process `p`; the old roots stay alive when `keep`.
    fn reload(&mut self, p: usize, cfg: &str, keep: bool) {
        for (wi, node) in self.procs[p].nodes.iter_mut().enumerate() {
            let mut root = apf_wasm::gateway::Root::default();
            *node.host.configuration.borrow_mut() = cfg.as_bytes().to_vec();
            assert!(root.on_configure(&node.host, cfg.as_bytes()));
            let old = std::mem::replace(&mut node.root, root);
            if keep {
                self.old_roots.push((p, wi, old));
            }
        }
    }

    /// `POST /apf-wasm/fleet/leave` on worker 0 of process `p` from `peer` to `local` (the
    /// connection's addresses): the reply, if the gateway answered.
    fn leave(&mut self, p: usize, peer: &str, local: &str) -> Option<mock_host::Reply> {
        let h = [(":method", "POST"), (":path", "/apf-wasm/fleet/leave"), (":authority", "localhost")];
        let node = &mut self.procs[p].nodes[0];
        let (ctx, _) = node.request(&h, &[("source.address", peer.as_bytes()), ("destination.address", local.as_bytes())]);
        let reply = node.stream(ctx).reply;
        node.close(ctx);
        reply
    }

    fn dump(&mut self, p: usize) -> serde_json::Value {
        let admin = [("x-remote-user", "admin"), ("x-remote-group", "system:masters")];
        serde_json::from_str(&self.procs[p].nodes[0].dump("dump_fleet", &admin, &[])).unwrap()
    }

    /// Ends every request of process `p` (executing or waiting).
    fn finish_all(&mut self, p: usize) {
        let proc_ = &mut self.procs[p];
        for (wi, ctx) in proc_.open.drain(..) {
            proc_.nodes[wi].close(ctx);
        }
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

fn fleet_object() -> serde_json::Value {
    json!({"etcd": {"cluster": "etcd"}, "period": "1s", "leaseTtl": "5s"})
}

/// Steps until every replica of the world has a record.
fn joined(world: &mut World) {
    for _ in 0..60 {
        world.step();
    }
    assert_eq!(world.records().len(), world.procs.len(), "every replica registered");
}

#[test]
fn a_policy_change_keeps_the_lease_and_the_seats_of_the_levels_it_keeps() {
    let mut world = World::new(3, 2);
    joined(&mut world);
    world.load(0, 10);
    for _ in 0..40 {
        world.step();
    }
    let leases: Vec<i64> = (0..3).map(|p| world.record(p).unwrap().0).collect();
    let before = world.executing(0);
    assert!(before > 0);
    // A new level, one process after the other (a rolling ECDS update).
    let cfg = config_with(&[("lvl2", 5)], fleet_object());
    for p in 0..3 {
        world.reload(p, &cfg, false);
        for _ in 0..10 {
            world.step();
            for q in 0..3 {
                assert!(world.limit(q, "lvl") > 0, "replica {q}: lvl lost its seats during the reload of {p}");
            }
            assert!(world.total_executing() <= FLEET_LEVEL_SEATS as usize);
            assert!(world.executing(0) >= before.min(world.limit(0, "lvl") as usize), "replica 0's requests keep their seats");
        }
    }
    for _ in 0..40 {
        world.step();
        assert!((0..3).all(|q| world.limit(q, "lvl") > 0));
    }
    let after: Vec<i64> = (0..3).map(|p| world.record(p).unwrap().0).collect();
    assert_eq!(leases, after, "the replicas kept their leases");
    for p in 0..3 {
        let (_, r) = world.record(p).unwrap();
        assert!(r.levels.contains_key("lvl2"), "the record names the new level: {:?}", r.levels.keys());
        assert!(world.limit(p, "lvl2") > 0, "replica {p}: the new level got seats through the fleet");
        assert!(world.driver(p).feed().fleet().policy().index("lvl2").is_some());
    }
    // The level removed again: its claims drain with its requests, then leave the record.
    let cfg = config_with(&[], fleet_object());
    for p in 0..3 {
        world.reload(p, &cfg, false);
    }
    for _ in 0..40 {
        world.step();
    }
    assert!(world.records().iter().all(|(_, _, r)| !r.levels.contains_key("lvl2")), "the removed level left the records");
    assert_eq!(leases, (0..3).map(|p| world.record(p).unwrap().0).collect::<Vec<_>>());
}

#[test]
fn a_removed_level_stays_claimed_while_its_requests_drain() {
    let mut world = World::new(2, 2);
    let with = config_with(&[("lvl2", 5)], fleet_object());
    for p in 0..2 {
        world.reload(p, &with, false);
    }
    joined(&mut world);
    // Requests on lvl2 that keep their seats.
    let node = &mut world.procs[0].nodes[0];
    let (ctx, _) = node.request(&headers("GET", PODS, "u-lvl2", &["lvl2"]), &[]);
    world.procs[0].open.push((0, ctx));
    for _ in 0..40 {
        world.step();
    }
    let in_use = |w: &World| {
        let st = apf_wasm::engine::read_level(&w.procs[0].proxy.store, &apf_wasm::engine::level_key("lvl2")).unwrap().unwrap();
        st.qs.seats_in_use()
    };
    assert!(in_use(&world) > 0, "lvl2 executes a request");
    let without = config_with(&[], fleet_object());
    world.reload(0, &without, true);
    for _ in 0..40 {
        world.step();
        let claim = world.record(0).unwrap().1.levels.get("lvl2").map_or(0, |l| l.claim);
        assert!(claim >= in_use(&world), "the record claims {claim} on the removed level, {} in use", in_use(&world));
    }
    world.finish_all(0);
    for _ in 0..30 {
        world.step();
    }
    assert!(!world.record(0).unwrap().1.levels.contains_key("lvl2"), "drained: the removed level left the record");
}

#[test]
fn an_older_root_context_ticking_changes_nothing() {
    let mut world = World::new(2, 2);
    joined(&mut world);
    let lease = world.record(0).unwrap().0;
    let lvl_before = world.driver(0).feed().fleet().policy().index("lvl");
    // Process 0 reloads; its old root contexts stay alive and keep ticking (after the new ones).
    world.reload(0, &config_with(&[("aux", 5)], fleet_object()), true);
    let mut newest = 0;
    for _ in 0..60 {
        world.step();
        let d = world.driver(0);
        assert!(d.feed().generation() >= newest, "the driver went back to generation {}", d.feed().generation());
        newest = d.feed().generation();
        let policy = d.feed().fleet().policy();
        assert!(policy.index("aux").is_some(), "the driver runs the newest policy");
        let limits: Vec<(String, Option<u32>)> =
            policy.levels.iter().map(|l| l.name.clone()).zip(d.feed().fleet().limits().to_vec()).collect();
        for (name, limit) in limits.into_iter().filter_map(|(n, l)| Some((n, l?))) {
            assert_eq!(world.limit(0, &name), limit, "{name} runs under the fleet's limit for it");
        }
        assert!(world.limit(0, "lvl") > 0);
        assert_ne!(policy.index("lvl"), lvl_before, "the new level moves lvl in the policy's order");
    }
    assert_eq!(world.record(0).unwrap().0, lease, "the lease is kept");
    assert!(world.limit(0, "aux") > 0);
}

#[test]
fn a_reload_while_etcd_is_unreachable_keeps_serving() {
    let mut world = World::new(2, 2);
    joined(&mut world);
    let lease = world.driver(0).feed().fleet().lease();
    let limit = world.limit(0, "lvl");
    assert!(limit > 0);
    world.etcd_down = true;
    for _ in 0..10 {
        world.step();
    }
    world.reload(0, &config_with(&[("lvl2", 5)], fleet_object()), false);
    world.load(0, 2);
    for i in 0..200 {
        world.step();
        assert!(world.limit(0, "lvl") > 0, "step {i}: no seats on lvl after the reload");
    }
    assert_eq!(world.executing(0), 2, "requests admitted after the reload");
    assert_eq!(world.driver(0).feed().fleet().lease(), lease, "same lease");
}

#[test]
fn a_fleet_configuration_change_registers_again_and_revokes_the_old_lease() {
    let mut world = World::new(1, 2);
    joined(&mut world);
    let old = world.record(0).unwrap().0;
    world.reload(0, &config_with(&[], json!({"etcd": {"cluster": "etcd"}, "period": "1s", "leaseTtl": "6s"})), false);
    for _ in 0..10 {
        world.step();
    }
    let new = world.record(0).expect("registered again").0;
    assert_ne!(new, old);
    assert!(world.etcd.leases().iter().all(|(id, _)| *id != old), "the old lease was revoked: {:?}", world.etcd.leases());
    assert_eq!(world.driver(0).feed().fleet().config().lease_ttl, 6_000_000_000);
}

#[test]
fn a_leaving_replica_gives_its_seats_to_the_others_within_a_period() {
    let mut world = World::new(2, 2);
    joined(&mut world);
    world.load(0, 20);
    world.load(1, 20);
    for _ in 0..80 {
        world.step();
    }
    let (on_0, on_1) = (world.executing(0), world.executing(1));
    assert!(on_0 > 0 && on_1 > 0, "{on_0} and {on_1}");
    // A remote peer cannot make a replica leave.
    for (peer, local) in [("10.1.2.3:4567", "10.0.0.7:6443"), ("10.1.2.3:4567", "127.0.0.1:6443"), ("127.0.0.1:4567", "10.0.0.7:6443")] {
        // A remote peer, or a loopback source on a connection to the pod's address (a
        // forwarded-for address taken as the peer).
        let refused = world.leave(0, peer, local).expect("answered");
        assert_eq!(refused.status, 403, "{peer} → {local}: {refused:?}");
    }
    for _ in 0..5 {
        world.step();
    }
    assert_eq!(world.driver(0).feed().fleet().mode(), apf_wasm::fleet::FleetMode::Synced, "a refused request changes nothing");
    let reply = world.leave(0, "127.0.0.1:4567", "127.0.0.1:6443").expect("answered");
    assert_eq!(reply.status, 200, "{reply:?}");
    let body: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["leaving"], true);
    assert_eq!(body["alreadyLeaving"], false);
    let again: serde_json::Value = serde_json::from_str(&world.leave(0, "[::1]:4567", "[::1]:6443").unwrap().body).unwrap();
    assert_eq!(again["alreadyLeaving"], true, "idempotent");
    // Nothing new admitted; the claims come down to the seats still in use.
    for _ in 0..30 {
        world.step();
        assert_eq!(world.limit(0, "lvl"), 0);
        assert!(world.total_executing() <= FLEET_LEVEL_SEATS as usize);
    }
    assert_eq!(world.dump(0)["mode"], "Leaving");
    let (_, r) = world.record(0).expect("still registered while requests run");
    assert_eq!(r.levels["lvl"].claim as usize, world.executing(0), "claims follow the seats in use");
    assert_eq!(r.levels["lvl"].granted as usize, world.executing(0), "and so do the granted seats");
    // Its requests finish: the record goes, and replica 1 takes the seats within a period.
    world.finish_all(0);
    let mut steps = 0;
    while world.executing(1) * 100 < FLEET_LEVEL_SEATS as usize * 85 {
        world.step();
        steps += 1;
        assert!(steps <= 20, "replica 1 has {} seats one period after replica 0 drained", world.executing(1));
    }
    eprintln!("replica 1 went from {on_1} to {} seats {} ms after replica 0 drained", world.executing(1), steps * 50);
    assert_eq!(world.records().len(), 1, "the leaving replica's record is gone");
    // Its later requests wait (no seats), exempt ones pass.
    world.load(0, 1);
    world.step();
    assert_eq!(world.executing(0), 0);
}

#[test]
fn the_leave_request_is_not_intercepted_without_fleet_mode() {
    let mut cfg: serde_json::Value = serde_json::from_str(&config()).unwrap();
    cfg.as_object_mut().unwrap().remove("fleet");
    let cfg = cfg.to_string();
    let (_proxy, mut nodes) = mock_host::gateway(1, &cfg);
    let h = [(":method", "POST"), (":path", "/apf-wasm/fleet/leave"), (":authority", "localhost")];
    let (ctx, action) = nodes[0].request(&h, &[("source.address", b"127.0.0.1:1")]);
    assert_eq!(action, apf_wasm::gateway::Action::Continue);
    assert!(nodes[0].stream(ctx).reply.is_none());
}

#[test]
fn records_nobody_trusts_are_ignored_counted_and_shown() {
    let mut world = World::new(2, 2);
    for _ in 0..60 {
        world.step();
    }
    // A lease-less record claiming every seat there is, written under the fleet's prefix.
    let put = PutRequest {
        key: b"/apf-wasm/default/replicas/forged".to_vec(),
        value: br#"{"format":1,"levels":{"lvl":{"claim":4294967295,"granted":4294967295}}}"#.to_vec(),
        lease: 0,
    };
    world.etcd.txn(&TxnRequest { success: vec![RequestOp::Put(put)], ..Default::default() }).unwrap();
    world.load(0, 40);
    for _ in 0..80 {
        world.step();
    }
    let on_0 = world.executing(0);
    assert!(on_0 * 100 >= FLEET_LEVEL_SEATS as usize * 85, "replica 0 uses {on_0} of {FLEET_LEVEL_SEATS} seats");
    let dump = world.dump(0);
    assert_eq!(dump["replicas"].as_array().unwrap().len(), 2, "{dump}");
    let ignored = dump["ignoredRecords"].as_array().unwrap();
    assert_eq!(ignored.len(), 1, "{dump}");
    assert_eq!(ignored[0]["id"], "forged", "{dump}");
    assert!(ignored[0]["reason"].as_str().unwrap().starts_with("no lease"), "{dump}");
    assert_eq!(dump["dataLosses"], 0, "{dump}");
    // Counted once, however often it is read.
    assert_eq!(world.procs[0].proxy.stat("apf_wasm_fleet_ignored_records_total"), 1);
}
