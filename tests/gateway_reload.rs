#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Reloads natively (the e2e suite's hot reload through ECDS): a new configuration on a worker
//! is a second root on the same worker; requests queued or executing under the first keep
//! their configuration and are still dispatched and released, new requests follow the new one,
//! and a configuration that does not parse is refused while the previous one keeps serving.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::gateway::host::Action;
use mock_host::{flow_schema, gateway, header_value, headers, level_row, priority_level, Node, Proxy};
use serde_json::json;
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";
const GROUP: &str = "e2e-users";
const NEW_GROUP: &str = "e2e-new-group";
const NOMINAL: &str = "apiserver_flowcontrol_nominal_limit_seats";

/// Level "lvl" with `shares` next to catch-all's 5 at 2 server seats: 5 shares → 1 seat,
/// 15 → ⌈2·15/20⌉ = 2. With `new_schema`, a FlowSchema "new" takes `NEW_GROUP` first.
fn config(shares: u32, new_schema: bool) -> String {
    let mut policy = vec![priority_level("lvl", shares, 8, 2, 50), flow_schema("old", "lvl", 1000, &[GROUP])];
    if new_schema {
        policy.push(flow_schema("new", "lvl", 500, &[NEW_GROUP]));
    }
    json!({
        "serverConcurrencyLimit": 2,
        "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "explainGroups": ["explain"],
        "policy": policy
    })
    .to_string()
}

/// A request by `user`, also in `NEW_GROUP` (it moves to FlowSchema "new" once that exists).
fn mover(node: &mut Node, user: &str) -> (u32, Action) {
    node.request(&headers("GET", PODS, user, &[GROUP, NEW_GROUP, "explain"]), &[])
}

fn levels(node: &mut Node) -> (u32, u32) {
    level_row(&node.dump("dump_priority_levels", &[("x-remote-user", "admin"), ("x-remote-group", "system:masters")], &[]), "lvl")
}

fn schema(node: &mut Node, ctx: u32) -> String {
    header_value(&node.respond(ctx, 200, &[], &[]), "x-apf-flowschema").unwrap()
}

fn nominal(proxy: &Proxy) -> Option<i64> {
    proxy.stats.borrow().iter().find(|(k, _)| k.starts_with(NOMINAL) && k.contains("lvl")).map(|(_, v)| v.1)
}

#[test]
fn queued_requests_survive_a_reload_and_new_requests_follow_it() {
    let (proxy, mut w) = gateway(2, &config(5, false));
    let (a, action_a) = mover(&mut w[0], "a");
    let (b, action_b) = mover(&mut w[1], "b");
    assert_eq!((action_a, action_b), (Action::Continue, Action::Pause));
    assert_eq!(levels(&mut w[0]), (1, 1));
    assert!(w[0].reload(&config(15, true)) && w[1].reload(&config(15, true)));
    // The first request under the new configuration takes the level to 2 seats: b, queued
    // under the old one, is dispatched to its worker's mailbox, and the new request waits.
    let (d, action_d) = mover(&mut w[0], "d");
    assert_eq!(action_d, Action::Pause);
    w[1].deliver_mail();
    assert!(w[1].stream(b).resumed, "queued before the reload, dispatched after it");
    // a finishes under the configuration it was admitted with; d gets its seat.
    assert_eq!(schema(&mut w[0], a), "old");
    assert!(w[0].stream(d).resumed);
    assert_eq!(schema(&mut w[1], b), "old");
    assert_eq!(schema(&mut w[0], d), "new");
    assert_eq!(levels(&mut w[0]), (0, 0));
    proxy.advance(Duration::from_secs(1));
    w[0].tick();
    assert_eq!(nominal(&proxy), Some(2));
}

#[test]
fn a_configuration_that_does_not_parse_is_refused_and_the_previous_one_keeps_serving() {
    let (_, mut w) = gateway(1, &config(5, true));
    let (a, _) = mover(&mut w[0], "a");
    let (b, action) = mover(&mut w[0], "b");
    assert_eq!(action, Action::Pause);
    let mut bad: serde_json::Value = serde_json::from_str(&config(15, false)).unwrap();
    bad["bogusKey"] = json!(true);
    bad["policy"][0]["spec"]["limited"]["nominalConcurrencyShares"] = json!(-3);
    let bad = bad.to_string();
    // As a new root, and on the running root itself.
    assert!(!w[0].reload(&bad));
    assert!(!w[0].configure(&bad));
    assert!(!w[0].configure("{not json"));
    let (c, action) = mover(&mut w[0], "c");
    assert_eq!(action, Action::Pause, "still one seat");
    assert_eq!(schema(&mut w[0], a), "new", "still the previous policy");
    assert!(w[0].stream(b).resumed);
    assert_eq!(schema(&mut w[0], b), "new");
    assert_eq!(schema(&mut w[0], c), "new");
    assert_eq!(levels(&mut w[0]), (0, 0));
}

#[test]
fn a_level_the_reload_removed_still_drains_its_queue() {
    let (proxy, mut w) = gateway(1, &config(5, false));
    let (a, _) = mover(&mut w[0], "a");
    let (b, _) = w[0].request(&headers("GET", &format!("{PODS}?timeout=8s"), "b", &[GROUP, "explain"]), &[]);
    let (c, action) = mover(&mut w[0], "c");
    assert_eq!(action, Action::Pause);
    // The new configuration has no level "lvl" at all.
    let other = config(5, false).replace("\"lvl\"", "\"other\"");
    assert!(w[0].reload(&other));
    // The old level's queue still times out on the new root's timer (its expiry, before this
    // worker's own backstop 100 ms past the deadline)...
    proxy.advance(Duration::from_millis(2_050));
    w[0].tick();
    let reply = w[0].stream(b).reply.expect("timed out");
    assert_eq!((reply.status, reply.header("x-apf-reject-reason")), (429, Some("time-out")));
    // ...and still dispatches when a seat frees.
    w[0].respond(a, 200, &[], &[]);
    assert!(w[0].stream(c).resumed);
    assert_eq!(schema(&mut w[0], c), "old");
}
