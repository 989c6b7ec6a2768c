#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Open-watch limits (`watchLimits`) through the gateway with a mock host: a WATCH beyond its
//! flow's or its level's limit is answered 429 with a Retry-After and counted with
//! `reason="watch-limit"`; other flows, other requests and other levels are unaffected; a watch's
//! place is freed at once however its stream ends (upstream end, client close, reset), every
//! worker of the process counts against the same limits, and a dead worker's places are reaped
//! with its lease.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::gateway::host::Action;
use apf_wasm::gateway::worker::{LEASE_TTL, REAP_EVERY};
use mock_host::{flow_schema, gateway, headers, priority_level, Node, Proxy};
use serde_json::{json, Value};
use std::time::Duration;

const GROUP: &str = "watchers";
const WATCH: &str = "/api/v1/namespaces/default/pods?watch=true";
const LIST: &str = "/api/v1/namespaces/default/pods";
const REJECTED: &str = "apiserver_flowcontrol_rejected_requests_total.priority_level.lvl.flow_schema.fs.reason.watch-limit";
const OPEN: &str = "apf_wasm_open_watches.priority_level.lvl";
const ADMIN: [(&str, &str); 2] = [("x-remote-user", "admin"), ("x-remote-group", "system:masters")];

/// A level "lvl" with plenty of seats for `GROUP` (one flow per user), and `limits` as
/// `watchLimits` (none when null).
fn config(limits: Value, enforce: bool) -> String {
    let mut c = json!({
        "serverConcurrencyLimit": 200,
        "suggestedDefaults": false,
        "enforce": enforce,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "explainGroups": ["explain"],
        "policy": [priority_level("lvl", 5, 16, 4, 50), priority_level("other", 5, 16, 4, 50),
                   flow_schema("fs", "lvl", 1000, &[GROUP]), flow_schema("fs-other", "other", 1000, &["others"])]
    });
    if !limits.is_null() {
        c["watchLimits"] = limits;
    }
    c.to_string()
}

fn limited(limits: Value) -> (std::rc::Rc<Proxy>, Vec<Node>) {
    gateway(2, &config(limits, true))
}

/// A WATCH by `user` (group `GROUP`): the gateway's action; when let through, the upstream's
/// response headers (a long-lived stream) are delivered.
fn watch_as(node: &mut Node, user: &str, group: &str) -> (u32, Action) {
    let (ctx, action) = node.request(&headers("GET", WATCH, user, &[group, "explain"]), &[]);
    if action == Action::Continue {
        node.response_headers(ctx, 200, &[("content-type", "application/json")], false);
    }
    (ctx, action)
}

fn watch(node: &mut Node, user: &str) -> (u32, Action) {
    watch_as(node, user, GROUP)
}

fn assert_refused(node: &Node, ctx: u32, action: Action, why: &str) {
    assert_eq!(action, Action::Pause, "{why}");
    let reply = node.stream(ctx).reply.unwrap_or_else(|| panic!("{why}: no reply"));
    assert_eq!(reply.status, 429, "{why}");
    let ra: i64 = reply.header("retry-after").expect("retry-after").parse().unwrap();
    assert!((1..=32).contains(&ra), "{why}: retry-after {ra}");
    assert_eq!(reply.body, "Too many requests, please try again later.\n");
    assert_eq!(reply.header("x-apf-reject-reason"), Some("watch-limit"), "{why}");
    assert_eq!(reply.header("x-kubernetes-pf-prioritylevel-uid"), Some("pl-lvl"));
}

fn flush(proxy: &Proxy, node: &mut Node) {
    proxy.advance(Duration::from_secs(1));
    node.tick();
}

#[test]
fn a_flow_over_its_limit_gets_429_and_other_flows_and_requests_pass() {
    let (proxy, mut w) = limited(json!({"perFlow": 2}));
    let a1 = watch(&mut w[0], "alice");
    let a2 = watch(&mut w[0], "alice");
    assert_eq!((a1.1, a2.1), (Action::Continue, Action::Continue));
    let (ctx, action) = watch(&mut w[0], "alice");
    assert_refused(&w[0], ctx, action, "alice's third watch");
    w[0].close(ctx);
    // Another flow (another user: ByUser), a non-watch request of the same flow: unaffected.
    for u in ["bob", "bob"] {
        assert_eq!(watch(&mut w[0], u).1, Action::Continue, "{u}'s watch");
    }
    let (get, action) = w[0].request(&headers("GET", LIST, "alice", &[GROUP]), &[]);
    assert_eq!(action, Action::Continue, "a LIST of the flow at its watch limit");
    w[0].respond(get, 200, &[], &[b"{}"]);
    flush(&proxy, &mut w[0]);
    assert_eq!(proxy.stat(REJECTED), 1);
    assert_eq!(proxy.stat(OPEN), 4);
}

#[test]
fn a_level_over_its_limit_refuses_every_flow_and_other_levels_pass() {
    let (proxy, mut w) = limited(json!({"perLevel": {"lvl": 3}}));
    for u in ["alice", "alice", "bob"] {
        assert_eq!(watch(&mut w[0], u).1, Action::Continue);
    }
    let (ctx, action) = watch(&mut w[0], "carol");
    assert_refused(&w[0], ctx, action, "a fourth watch on the level");
    for _ in 0..5 {
        assert_eq!(watch_as(&mut w[0], "dave", "others").1, Action::Continue, "another level has no limit");
    }
    flush(&proxy, &mut w[0]);
    assert_eq!(proxy.stat(OPEN), 3);
    assert_eq!(proxy.stat("apf_wasm_open_watches.priority_level.other"), 5, "counted, not limited");
}

#[test]
fn a_place_is_freed_at_once_however_the_watch_ends() {
    let (_, mut w) = limited(json!({"perFlow": 1}));
    type End = fn(&mut Node, u32);
    let ends: [(&str, End); 4] = [
        ("upstream end (last body chunk)", |n, c| n.response_body(c, b"", true)),
        ("upstream end (trailers)", |n, c| {
            let mut r = n.requests.remove(&c).unwrap();
            r.on_response_trailers(&n.host, &mut n.worker);
            n.requests.insert(c, r);
        }),
        ("client close", |n, c| n.close(c)),
        ("stream reset before the response", |_, _| {}),
    ];
    for (how, end) in ends {
        let (ctx, action) = if how.starts_with("stream reset") {
            w[0].request(&headers("GET", WATCH, "alice", &[GROUP]), &[])
        } else {
            watch(&mut w[0], "alice")
        };
        assert_eq!(action, Action::Continue, "{how}: the first watch");
        let (refused, action) = watch(&mut w[0], "alice");
        assert_refused(&w[0], refused, action, how);
        w[0].close(refused);
        end(&mut w[0], ctx);
        if how.starts_with("stream reset") {
            w[0].close(ctx);
        }
        let (next, action) = watch(&mut w[0], "alice");
        assert_eq!(action, Action::Continue, "{how}: the place was freed at once");
        w[0].close(next);
        w[0].close(ctx);
    }
}

#[test]
fn every_worker_counts_against_the_same_limit() {
    let (proxy, mut w) = limited(json!({"perFlow": 2}));
    assert_eq!(watch(&mut w[0], "alice").1, Action::Continue);
    let (on_1, action) = watch(&mut w[1], "alice");
    assert_eq!(action, Action::Continue);
    let (ctx, action) = watch(&mut w[1], "alice");
    assert_refused(&w[1], ctx, action, "the third watch on another worker");
    let (ctx, action) = watch(&mut w[0], "alice");
    assert_refused(&w[0], ctx, action, "the third watch on the first worker");
    w[1].close(on_1);
    assert_eq!(watch(&mut w[0], "alice").1, Action::Continue, "freed by the other worker");
    flush(&proxy, &mut w[1]);
    assert_eq!(proxy.stat(OPEN), 2, "the gauge is the process's count");
}

#[test]
fn a_dead_workers_places_are_reaped_with_its_lease() {
    let (proxy, mut w) = limited(json!({"perFlow": 2}));
    watch(&mut w[1], "alice");
    watch(&mut w[1], "alice");
    let (ctx, action) = watch(&mut w[0], "alice");
    assert_refused(&w[0], ctx, action, "at the limit");
    // Worker 1's VM is gone: its streams never end, it never ticks again.
    let _dead = w.pop();
    let step = Duration::from_millis(500);
    let deadline = LEASE_TTL + 2 * REAP_EVERY;
    let mut waited = 0;
    while waited <= deadline {
        proxy.advance(step);
        w[0].tick();
        waited += 500_000_000;
    }
    let (_, action) = watch(&mut w[0], "alice");
    assert_eq!(action, Action::Continue, "the dead worker's places were reaped");
    flush(&proxy, &mut w[0]);
    assert_eq!(proxy.stat(OPEN), 1);
}

#[test]
fn dry_run_counts_the_refusal_but_lets_the_watch_through() {
    let (proxy, mut w) = gateway(1, &config(json!({"perFlow": 1}), false));
    watch(&mut w[0], "alice");
    let (ctx, action) = watch(&mut w[0], "alice");
    assert_eq!(action, Action::Continue);
    assert!(w[0].stream(ctx).reply.is_none());
    flush(&proxy, &mut w[0]);
    assert_eq!(proxy.stat(REJECTED), 1);
    assert_eq!(proxy.stat(OPEN), 1, "a watch let through in dry run takes no place");
}

#[test]
fn off_unless_configured() {
    let (proxy, mut w) = gateway(1, &config(Value::Null, true));
    for _ in 0..50 {
        assert_eq!(watch(&mut w[0], "alice").1, Action::Continue);
    }
    flush(&proxy, &mut w[0]);
    assert!(!proxy.has_stat(OPEN));
    assert_eq!(w[0].dump("dump_watches", &ADMIN, &[]), "# watch limits: off (watchLimits)\n");
}

#[test]
fn the_watches_dump_lists_levels_and_the_flows_with_most_open_watches() {
    let (_, mut w) = limited(json!({"perFlow": 5, "perLevel": {"lvl": 10}}));
    for u in ["alice", "alice", "alice", "bob"] {
        watch(&mut w[0], u);
    }
    let dump = w[0].dump("dump_watches", &ADMIN, &[]);
    let rows: Vec<Vec<&str>> = dump.lines().map(|l| l.split(',').map(str::trim).collect()).collect();
    assert!(rows.contains(&vec!["lvl", "4", "10"]), "{dump}");
    assert!(rows.contains(&vec!["other", "0", "-"]), "{dump}");
    let flows: Vec<&Vec<&str>> = rows.iter().filter(|r| r.len() == 5 && r[0] == "lvl").collect();
    assert_eq!(flows.len(), 2, "{dump}");
    assert_eq!((flows[0][1], flows[0][3], flows[0][4]), ("fs", "3", "5"), "most open first:\n{dump}");
    assert_eq!(flows[1][3], "1");
    assert!(flows[0][2].starts_with("hash:"));
}

#[test]
fn an_apf_rejection_of_a_watch_gives_its_place_back() {
    // One seat, no queue: the second concurrent request is rejected by APF itself.
    let cfg = json!({
        "serverConcurrencyLimit": 2, "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "watchLimits": {"perFlow": 1},
        "policy": [{"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
                    "metadata": {"name": "lvl"}, "spec": {"type": "Limited", "limited": {
                        "nominalConcurrencyShares": 5, "lendablePercent": 0, "limitResponse": {"type": "Reject"}}}},
                   flow_schema("fs", "lvl", 1000, &[GROUP])]
    });
    let (_, mut w) = gateway(1, &cfg.to_string());
    let (busy, action) = w[0].request(&headers("GET", LIST, "bob", &[GROUP]), &[]);
    assert_eq!(action, Action::Continue);
    let (ctx, action) = w[0].request(&headers("GET", WATCH, "alice", &[GROUP]), &[]);
    assert_eq!(action, Action::Pause);
    assert_eq!(w[0].stream(ctx).reply.unwrap().status, 429);
    assert!(!w[0].worker.has_watch_place(ctx), "no place kept for a watch APF rejected");
    w[0].respond(busy, 200, &[], &[b"{}"]);
    w[0].close(busy);
    assert_eq!(watch(&mut w[0], "alice").1, Action::Continue, "alice's place was given back");
}

#[test]
fn in_fleet_mode_the_limit_is_per_replica() {
    let mut cfg: Value = serde_json::from_str(&config(json!({"perFlow": 2}), true)).unwrap();
    cfg["fleet"] = json!({"etcd": {"cluster": "etcd"}, "period": "1s", "leaseTtl": "5s"});
    // Two replicas (processes), nothing shared but etcd: each counts its own watches.
    for replica in 0..2 {
        let (_, mut w) = gateway(2, &cfg.to_string());
        for (i, node) in w.iter_mut().enumerate() {
            let (ctx, _) = node.request(&headers("GET", WATCH, "alice", &[GROUP]), &[]);
            assert!(node.stream(ctx).reply.is_none(), "replica {replica}: watch {i} takes a place");
        }
        let (ctx, action) = w[0].request(&headers("GET", WATCH, "alice", &[GROUP, "explain"]), &[]);
        assert_refused(&w[0], ctx, action, "the third watch on one replica");
    }
}
