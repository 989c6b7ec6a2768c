#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! A worker's pending stats taken out to be added elsewhere (the native host's main thread takes
//! every worker's deltas through a handle and adds them): what is taken is no longer pending, and
//! adding it gives exactly what a flush would have — no delta lost, none counted twice.

#[path = "common/mock_host.rs"]
mod mock_host;

use mock_host::{gateway, headers, Node};
use std::collections::BTreeMap;

const CONFIG: &str = r#"{"identity": {"sources": [{"type": "frontProxy"}]}}"#;

/// Three requests served on `node`.
fn traffic(node: &mut Node) {
    for user in ["ann", "bob", "carl"] {
        let (ctx, _) = node.request(&headers("GET", "/api/v1/namespaces/default/pods", user, &["team"]), &[]);
        node.respond(ctx, 200, &[], &[b"{}"]);
    }
}

fn flush(node: &mut Node) {
    let Node { worker, host, .. } = node;
    worker.stats().flush(host);
}

fn stats(node: &Node) -> BTreeMap<String, i64> {
    node.host.proxy.stats.borrow().iter().map(|(k, (_, v))| (k.clone(), *v)).collect()
}

#[test]
fn taken_deltas_added_elsewhere_equal_one_flush_and_are_not_flushed_again() {
    let (_, mut flushed) = gateway(1, CONFIG);
    let (_, mut handed) = gateway(1, CONFIG);
    for w in [&mut flushed, &mut handed] {
        flush(&mut w[0]);
        traffic(&mut w[0]);
    }
    let before = stats(&handed[0]);
    flush(&mut flushed[0]);
    let node = &mut handed[0];
    let mut deltas = Vec::new();
    node.worker.stats().take_pending(&node.host, &mut deltas);
    assert!(deltas.iter().all(|&(_, by)| by != 0), "only deltas are taken: {deltas:?}");
    flush(node);
    let after_take = stats(node);
    assert!(!deltas.is_empty());
    // Taking defines the stats (at 0) but adds nothing: the deltas left the worker.
    assert!(before.iter().all(|(k, v)| after_take.get(k) == Some(v)), "a flush after the take added what was taken");
    for (id, by) in deltas {
        apf_wasm::gateway::Host::increment_metric(&node.host, id, by);
    }
    let total = stats(node);
    assert_eq!(total, stats(&flushed[0]), "taken and added elsewhere = flushed in place");
    assert!(
        total
            .get("apiserver_flowcontrol_dispatched_requests_total.priority_level.global-default.flow_schema.global-default")
            .is_some_and(|&v| v == 3),
        "{total:#?}"
    );
    let mut again = Vec::new();
    node.worker.stats().take_pending(&node.host, &mut again);
    assert!(again.is_empty(), "nothing is pending twice: {again:?}");
}

const WRITES: &str = "apf_wasm_shared_state_writes_total";

/// Takes `node`'s pending deltas through its handle and adds them, as the main thread does.
fn take_through_handle(node: &mut Node) -> usize {
    let handle = node.worker.stats().pending();
    let mut deltas = Vec::new();
    handle.take(&node.host, &mut deltas);
    for &(id, by) in &deltas {
        apf_wasm::gateway::Host::increment_metric(&node.host, id, by);
    }
    deltas.len()
}

#[test]
fn a_handle_takes_what_the_worker_recorded_and_the_store_counts_once_collected() {
    let (_, mut flushed) = gateway(1, CONFIG);
    let (_, mut handed) = gateway(1, CONFIG);
    for w in [&mut flushed, &mut handed] {
        flush(&mut w[0]);
        traffic(&mut w[0]);
    }
    flush(&mut flushed[0]);
    let node = &mut handed[0];
    let writes_before = stats(node).get(WRITES).copied();
    assert!(take_through_handle(node) > 0);
    assert_eq!(stats(node).get(WRITES).copied(), writes_before, "the store's counts stay with the worker's thread");
    // The worker going idle moves its store counts where the handle reaches them.
    let Node { worker, host, .. } = node;
    worker.stats().collect_store_counts(host);
    assert!(take_through_handle(node) > 0);
    assert_eq!(take_through_handle(node), 0, "nothing is taken twice");
    flush(node);
    let total = stats(node);
    assert_eq!(total, stats(&flushed[0]), "taken through the handle = flushed in place");
    assert!(total.get(WRITES).is_some_and(|&v| v > 0), "{total:#?}");
}

#[test]
fn takes_through_the_handle_between_flushes_lose_and_repeat_nothing() {
    let (_, mut flushed) = gateway(1, CONFIG);
    let (_, mut handed) = gateway(1, CONFIG);
    for w in [&mut flushed, &mut handed] {
        flush(&mut w[0]);
    }
    for round in 0..3 {
        traffic(&mut flushed[0]);
        traffic(&mut handed[0]);
        if round == 1 {
            flush(&mut handed[0]);
        } else {
            take_through_handle(&mut handed[0]);
        }
    }
    flush(&mut flushed[0]);
    flush(&mut handed[0]);
    assert_eq!(stats(&handed[0]), stats(&flushed[0]));
}
