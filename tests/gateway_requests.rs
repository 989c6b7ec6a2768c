#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! The filter's request paths, natively: the gateway over a mock host with two workers sharing
//! one process (tests/common/mock_host.rs). What the e2e suite shows in Envoy, here step by step:
//! admit, queue, reject with 429 and Retry-After, PF and explanation headers, resume by another
//! worker's release through its mailbox, time-out, client abort, release at the upstream
//! response's end, debug dumps and who gets them.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::gateway::host::Action;
use mock_host::{gateway, headers, level_row, Node, Proxy};
use serde_json::json;
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";
const GROUP: &str = "e2e-users";

/// `suggestedDefaults: false` and one level ("lvl", ByUser flows for `GROUP`) with `seats`
/// seats: NominalCL = ⌈S·NCS/(NCS+5)⌉ (catch-all has 5 shares) with S = 2·seats.
fn config(seats: u32, queue_length_limit: u32, reject: bool) -> String {
    let server = 2 * seats;
    let ncs = (1..1000).find(|n| (server * n).div_ceil(n + 5) == seats).unwrap();
    let limit_response = if reject {
        json!({"type": "Reject"})
    } else {
        json!({"type": "Queue", "queuing": {"queues": 4, "handSize": 2, "queueLengthLimit": queue_length_limit}})
    };
    json!({
        "serverConcurrencyLimit": server,
        "requestTimeout": "60s",
        "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "debugGroups": ["system:masters"],
        "explainGroups": ["explain"],
        "policy": [
            {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
             "metadata": {"name": "lvl", "uid": "pl-uid"},
             "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": ncs, "lendablePercent": 0,
                      "borrowingLimitPercent": 0, "limitResponse": limit_response}}},
            {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
             "metadata": {"name": "fs", "uid": "fs-uid"},
             "spec": {"priorityLevelConfiguration": {"name": "lvl"}, "matchingPrecedence": 1000,
                      "distinguisherMethod": {"type": "ByUser"},
                      "rules": [{"subjects": [{"kind": "Group", "group": {"name": GROUP}}],
                                 "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                    "namespaces": ["*"], "clusterScope": true}],
                                 "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}
        ]
    })
    .to_string()
}

/// (waiting, executing) requests of level `lvl`, from the priority-level dump.
fn level(node: &mut Node) -> (u32, u32) {
    let admin = [("x-remote-user", "admin"), ("x-remote-group", "system:masters")];
    level_row(&node.dump("dump_priority_levels", &admin, &[]), "lvl")
}

fn get(node: &mut Node, user: &str) -> (u32, Action) {
    node.request(&headers("GET", PODS, user, &[GROUP]), &[])
}

#[test]
fn admitted_request_gets_pf_headers_and_frees_its_seat_at_the_response_end() {
    let (_, mut w) = gateway(1, &config(1, 10, false));
    let (ctx, action) = get(&mut w[0], "alice");
    assert_eq!(action, Action::Continue);
    assert_eq!(level(&mut w[0]), (0, 1));
    let h = w[0].respond(ctx, 200, &[("content-type", "application/json")], &[b"{}"]);
    let get_h = |n: &str| h.iter().find(|(k, _)| k == n).map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    assert_eq!(get_h("x-kubernetes-pf-flowschema-uid").as_deref(), Some("fs-uid"));
    assert_eq!(get_h("x-kubernetes-pf-prioritylevel-uid").as_deref(), Some("pl-uid"));
    assert_eq!(get_h("x-apf-seats"), None, "explanations only for explainGroups");
    // The response ended: the seat is free although the stream is still open downstream.
    assert_eq!(level(&mut w[0]), (0, 0));
    w[0].close(ctx);
    assert_eq!(level(&mut w[0]), (0, 0));
}

#[test]
fn explain_callers_get_names_seats_and_queue_time() {
    let (_, mut w) = gateway(1, &config(1, 10, false));
    let (ctx, _) = w[0].request(&headers("GET", PODS, "alice", &[GROUP, "explain"]), &[]);
    let h = w[0].respond(ctx, 200, &[], &[]);
    let names: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
    for n in ["x-apf-flowschema", "x-apf-prioritylevel", "x-apf-seats", "x-apf-queued-ms"] {
        assert!(names.contains(&n), "{n} missing in {names:?}");
    }
    assert_eq!(w[0].stream(ctx).response_header("x-apf-flowschema").as_deref(), Some("fs"));
    assert_eq!(w[0].stream(ctx).response_header("x-apf-seats").as_deref(), Some("1"));
}

#[test]
fn queued_request_is_resumed_by_another_workers_release_through_its_mailbox() {
    let (_, mut w) = gateway(2, &config(1, 10, false));
    let (a, action_a) = get(&mut w[0], "alice");
    let (b, action_b) = get(&mut w[1], "bob");
    assert_eq!((action_a, action_b), (Action::Continue, Action::Pause));
    assert_eq!(level(&mut w[0]), (1, 1));
    assert!(!w[1].stream(b).resumed);
    w[0].respond(a, 200, &[], &[b"done"]);
    // Worker 0 freed the seat and dispatched bob's request, which worker 1 owns.
    assert!(!w[1].stream(b).resumed, "only the owner resumes, from its mailbox");
    w[1].deliver_mail();
    assert!(w[1].stream(b).resumed);
    assert_eq!(level(&mut w[0]), (0, 1));
    w[1].respond(b, 200, &[], &[]);
    assert_eq!(level(&mut w[0]), (0, 0));
}

#[test]
fn full_queues_reject_with_429_retry_after_and_pf_headers() {
    let (_, mut w) = gateway(1, &config(1, 1, false));
    let (_a, _) = get(&mut w[0], "alice");
    // One queue slot per queue (4 queues, hand 2): alice's flow fills its hand's two queues.
    let queued: Vec<(u32, Action)> = (0..2).map(|_| get(&mut w[0], "alice")).collect();
    assert!(queued.iter().all(|(_, a)| *a == Action::Pause));
    let (c, action) = w[0].request(&headers("GET", PODS, "alice", &[GROUP, "explain"]), &[]);
    assert_eq!(action, Action::Pause);
    let reply = w[0].stream(c).reply.expect("429");
    assert_eq!(reply.status, 429);
    let ra: i64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=32).contains(&ra), "Retry-After {ra}");
    assert_eq!(reply.header("x-kubernetes-pf-prioritylevel-uid"), Some("pl-uid"));
    assert_eq!(reply.header("x-apf-reject-reason"), Some("queue-full"));
    assert_eq!(reply.body, "Too many requests, please try again later.\n");
    // A rejected stream's response callbacks add nothing and hold nothing.
    w[0].respond(c, 429, &[], &[]);
    w[0].close(c);
    assert_eq!(level(&mut w[0]), (2, 1));
}

#[test]
fn reject_levels_answer_at_once_when_full() {
    let (_, mut w) = gateway(1, &config(1, 0, true));
    let (_, a) = get(&mut w[0], "alice");
    let (b, action) = get(&mut w[0], "bob");
    assert_eq!((a, action), (Action::Continue, Action::Pause));
    assert_eq!(w[0].stream(b).reply.unwrap().status, 429);
}

#[test]
fn a_queued_request_times_out_with_429_after_a_quarter_of_its_deadline() {
    let (proxy, mut w) = gateway(1, &config(1, 10, false));
    let (_a, _) = get(&mut w[0], "alice");
    let (b, action) = w[0].request(&headers("GET", &format!("{PODS}?timeout=8s"), "bob", &[GROUP, "explain"]), &[]);
    assert_eq!(action, Action::Pause);
    proxy.advance(Duration::from_millis(1900));
    w[0].tick();
    assert!(w[0].stream(b).reply.is_none(), "still within 8s / 4");
    proxy.advance(Duration::from_millis(200));
    w[0].tick();
    let reply = w[0].stream(b).reply.expect("timed out");
    assert_eq!((reply.status, reply.header("x-apf-reject-reason")), (429, Some("time-out")));
    assert_eq!(level(&mut w[0]), (0, 1));
}

#[test]
fn client_abort_frees_queued_and_executing_requests() {
    let (_, mut w) = gateway(2, &config(1, 10, false));
    let (a, _) = get(&mut w[0], "alice");
    let (b, _) = get(&mut w[1], "bob");
    let (c, _) = get(&mut w[1], "carol");
    assert_eq!(level(&mut w[0]), (2, 1));
    w[1].close(b);
    assert_eq!(level(&mut w[0]), (1, 1));
    // The executing request's client goes away before any response: its seat goes to carol.
    w[0].close(a);
    w[1].deliver_mail();
    assert!(w[1].stream(c).resumed);
    assert_eq!(level(&mut w[0]), (0, 1));
}

#[test]
fn a_response_that_never_reaches_the_client_frees_its_seat_at_the_upstream_end() {
    let (_, mut w) = gateway(1, &config(1, 10, false));
    let (a, _) = get(&mut w[0], "mallory");
    let (b, action) = get(&mut w[0], "alice");
    assert_eq!(action, Action::Pause);
    // Headers, then the body's last chunk: the upstream is done; the client reads nothing.
    w[0].response_headers(a, 200, &[("content-type", "application/json")], false);
    assert_eq!(level(&mut w[0]), (1, 1));
    w[0].response_body(a, b"{\"items\":[]}", true);
    assert!(w[0].stream(b).resumed, "alice is dispatched when mallory's response ends");
    // Trailers end a response too.
    let (c, _) = get(&mut w[0], "carol");
    let node = &mut w[0];
    node.response_headers(b, 200, &[], false);
    node.response_body(b, b"partial", false);
    node.requests.get_mut(&b).unwrap().on_response_trailers(&node.host, &mut node.worker);
    assert!(w[0].stream(c).resumed);
}

#[test]
fn debug_dumps_only_for_debug_groups() {
    let (_, mut w) = gateway(1, &config(1, 10, false));
    let dump = "/debug/api_priority_and_fairness/dump_priority_levels";
    let (ctx, action) = w[0].request(&headers("GET", dump, "admin", &["system:masters"]), &[]);
    assert_eq!(action, Action::Pause);
    let reply = w[0].stream(ctx).reply.unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.body.starts_with("PriorityLevelName"), "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("text/plain; charset=utf-8"));
    let (ctx, action) = w[0].request(&headers("GET", dump, "alice", &[GROUP]), &[]);
    assert_eq!(action, Action::Continue, "others reach the upstream");
    assert!(w[0].stream(ctx).reply.is_none());
}

#[test]
fn stats_are_flushed_as_deltas_under_upstreams_names() {
    let (proxy, mut w) = gateway(1, &config(1, 10, false));
    let (a, _) = get(&mut w[0], "alice");
    proxy.advance(Duration::from_secs(1));
    w[0].tick();
    let dispatched = "apiserver_flowcontrol_dispatched_requests_total";
    let executing = "apiserver_flowcontrol_current_executing_requests";
    let find =
        |p: &Proxy, prefix: &str| p.stats.borrow().iter().find(|(k, _)| k.starts_with(prefix) && k.contains("lvl")).map(|(_, v)| v.1);
    assert_eq!(find(&proxy, dispatched), Some(1));
    assert_eq!(find(&proxy, executing), Some(1));
    w[0].respond(a, 200, &[], &[]);
    proxy.advance(Duration::from_secs(1));
    w[0].tick();
    assert_eq!(find(&proxy, executing), Some(0));
}
