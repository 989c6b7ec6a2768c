#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Dry run natively (the e2e suite's dry-run test): with `"enforce": false`, or the level in
//! `dryRunPriorityLevels`, every request goes upstream at once and none gets a 429, while the
//! level's state and the metrics account what would have been queued, dispatched or rejected.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::gateway::host::Action;
use mock_host::{flow_schema, gateway, header_value, headers, level_row, priority_level, Node, Proxy};
use serde_json::{json, Value};
use std::time::Duration;

const PODS: &str = "/api/v1/namespaces/default/pods";
const GROUP: &str = "e2e-users";

/// Level "lvl": 2 seats (4 server seats, 5 shares next to catch-all's 5), one queue of 2.
fn config(dry_run: Value, limit_response: Option<Value>) -> String {
    let mut level = priority_level("lvl", 5, 1, 1, 2);
    if let Some(r) = limit_response {
        level["spec"]["limited"]["limitResponse"] = r;
    }
    let mut cfg = json!({
        "serverConcurrencyLimit": 4,
        "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "explainGroups": ["explain"],
        "policy": [level, flow_schema("fs", "lvl", 1000, &[GROUP])]
    });
    cfg.as_object_mut().unwrap().extend(dry_run.as_object().unwrap().clone());
    cfg.to_string()
}

const DRY_RUNS: [&str; 2] = [r#"{"enforce": false}"#, r#"{"dryRunPriorityLevels": ["lvl"]}"#];

fn send(node: &mut Node, user: &str, path: &str) -> u32 {
    let (ctx, action) = node.request(&headers("GET", path, user, &[GROUP, "explain"]), &[]);
    assert_eq!(action, Action::Continue, "{user}: a dry run holds nothing back");
    assert!(node.stream(ctx).reply.is_none(), "{user}: answered by the gateway");
    ctx
}

fn levels(node: &mut Node) -> (u32, u32) {
    level_row(&node.dump("dump_priority_levels", &[("x-remote-user", "admin"), ("x-remote-group", "system:masters")], &[]), "lvl")
}

/// The sum of the flushed series of `metric` for level "lvl" whose name contains `label`.
fn metric(proxy: &Proxy, metric: &str, label: &str) -> i64 {
    let prefix = format!("apiserver_flowcontrol_{metric}");
    let stats = proxy.stats.borrow();
    let series = stats.iter().filter(|(k, _)| k.starts_with(&prefix) && k.contains(".priority_level.lvl") && k.contains(label));
    series.map(|(_, v)| v.1).sum()
}

fn flush(proxy: &Proxy, node: &mut Node) {
    proxy.advance(Duration::from_secs(1));
    node.tick();
}

#[test]
fn would_be_queued_and_rejected_requests_go_through_and_are_accounted() {
    for dry in DRY_RUNS {
        let (proxy, mut w) = gateway(1, &config(serde_json::from_str(dry).unwrap(), None));
        // 2 would run, 2 would wait in the queue, 4 would find it full.
        let all: Vec<u32> = (0..8).map(|i| send(&mut w[0], &format!("d{i}"), PODS)).collect();
        assert_eq!(levels(&mut w[0]), (2, 2), "{dry}");
        flush(&proxy, &mut w[0]);
        assert_eq!(metric(&proxy, "rejected_requests_total", ".reason.queue-full"), 4, "{dry}");
        assert_eq!(metric(&proxy, "dispatched_requests_total", ""), 2, "{dry}");
        assert_eq!(metric(&proxy, "current_inqueue_requests", ""), 2, "{dry}");
        // Every response is the upstream's, with the PF headers and no reject reason.
        for ctx in all {
            let h = w[0].respond(ctx, 200, &[], &[b"{}"]);
            assert_eq!(header_value(&h, "x-kubernetes-pf-prioritylevel-uid").as_deref(), Some("pl-lvl"));
            assert_eq!(header_value(&h, "x-apf-reject-reason"), None);
        }
        assert_eq!(levels(&mut w[0]), (0, 0), "{dry}");
        flush(&proxy, &mut w[0]);
        let (rejected, dispatched) = (metric(&proxy, "rejected_requests_total", ""), metric(&proxy, "dispatched_requests_total", ""));
        assert_eq!(rejected + dispatched, 8, "{dry}: each request counted once");
        assert_eq!((metric(&proxy, "current_inqueue_requests", ""), metric(&proxy, "current_executing_requests", "")), (0, 0), "{dry}");
    }
}

#[test]
fn a_would_be_queued_request_is_dispatched_in_the_state_when_a_seat_frees() {
    let (proxy, mut w) = gateway(1, &config(json!({"enforce": false}), None));
    let (a, _, c) = (send(&mut w[0], "a", PODS), send(&mut w[0], "b", PODS), send(&mut w[0], "c", PODS));
    assert_eq!(levels(&mut w[0]), (1, 2));
    w[0].respond(a, 200, &[], &[]);
    assert_eq!(levels(&mut w[0]), (0, 2), "c took a's seat");
    assert!(!w[0].stream(c).resumed, "nothing to resume: it never stopped");
    flush(&proxy, &mut w[0]);
    assert_eq!(metric(&proxy, "dispatched_requests_total", ""), 3);
}

#[test]
fn a_would_be_timed_out_request_gets_no_429() {
    let (proxy, mut w) = gateway(1, &config(json!({"enforce": false}), None));
    send(&mut w[0], "a", PODS);
    send(&mut w[0], "b", PODS);
    let late = send(&mut w[0], "c", &format!("{PODS}?timeout=8s"));
    proxy.advance(Duration::from_millis(2_100));
    w[0].tick();
    assert!(w[0].stream(late).reply.is_none());
    assert_eq!(levels(&mut w[0]), (0, 2));
    flush(&proxy, &mut w[0]);
    assert_eq!(metric(&proxy, "rejected_requests_total", ".reason.time-out"), 1);
}

#[test]
fn a_reject_level_in_dry_run_counts_its_would_be_rejections() {
    let (proxy, mut w) = gateway(1, &config(json!({"dryRunPriorityLevels": ["lvl"]}), Some(json!({"type": "Reject"}))));
    for i in 0..5 {
        send(&mut w[0], &format!("r{i}"), PODS);
    }
    flush(&proxy, &mut w[0]);
    assert_eq!(metric(&proxy, "rejected_requests_total", ".reason.concurrency-limit"), 3);
}

#[test]
fn enforcement_elsewhere_is_unchanged_by_dry_run_levels() {
    // The same load with another level in dry run: the third request is queued for real.
    let mut cfg: Value = serde_json::from_str(&config(json!({}), None)).unwrap();
    cfg["policy"].as_array_mut().unwrap().push(priority_level("other", 1, 1, 1, 1));
    cfg["dryRunPriorityLevels"] = json!(["other"]);
    let (_, mut w) = gateway(1, &cfg.to_string());
    send(&mut w[0], "a", PODS);
    send(&mut w[0], "b", PODS);
    let (c, action) = w[0].request(&headers("GET", PODS, "c", &[GROUP]), &[]);
    assert_eq!(action, Action::Pause);
    assert!(w[0].stream(c).reply.is_none());
}

#[test]
fn a_would_be_queued_request_that_completes_first_counts_as_timed_out() {
    // docs/deviations.md: it would have waited at least that long.
    let (proxy, mut w) = gateway(1, &config(json!({"enforce": false}), None));
    send(&mut w[0], "a", PODS);
    send(&mut w[0], "b", PODS);
    let c = send(&mut w[0], "c", PODS);
    w[0].respond(c, 200, &[], &[]);
    assert_eq!(levels(&mut w[0]), (0, 2));
    flush(&proxy, &mut w[0]);
    assert_eq!(metric(&proxy, "rejected_requests_total", ".reason.time-out"), 1);
    assert_eq!(metric(&proxy, "current_inqueue_requests", ""), 0);
}
