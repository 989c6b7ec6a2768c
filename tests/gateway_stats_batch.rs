#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! A flow's records made in one batch (`Stats::with_flow`: one lock, one lookup) flush exactly
//! what the same records made one by one (`Stats::add`, `Stats::observe`) flush: the same
//! series, under the same names, with the same deltas, histograms included, flush after flush.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::config::parse_plugin_config;
use apf_wasm::engine::Compiled;
use apf_wasm::gateway::stats::{Labels, Stats, EXTRA_NONE, M};
use mock_host::{Node, Proxy};
use std::collections::BTreeMap;

/// One record: a counter or gauge delta, or a histogram sample.
#[derive(Clone, Copy)]
enum Rec {
    Add(M, &'static str, i64),
    Observe(M, &'static str, f64),
}

/// A flow's records at one moment: (level, FlowSchema, records).
type Moment = (usize, usize, Vec<Rec>);

fn compiled() -> Compiled {
    Compiled::new(parse_plugin_config(br#"{"identity":{"sources":[{"type":"frontProxy"}]}}"#).unwrap(), 3)
}

/// A label value equal to `s` but stored elsewhere (not the same literal).
fn copy_of(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// Two rounds of a request's transitions over three flows: admissions (executing, queued,
/// rejected), time-outs and ends, in the usual order and out of it, with a third label's value
/// that is sometimes the same literal and sometimes an equal copy.
fn rounds() -> Vec<Vec<Moment>> {
    let admitted = |seats: i64| {
        vec![
            Rec::Observe(M::WorkEstimatedSeats, EXTRA_NONE, seats as f64),
            Rec::Add(M::Dispatched, EXTRA_NONE, 1),
            Rec::Add(M::ExecutingRequests, EXTRA_NONE, 1),
            Rec::Add(M::ExecutingSeats, EXTRA_NONE, seats),
            Rec::Observe(M::WaitDuration, "true", 0.0),
        ]
    };
    let queued = vec![
        Rec::Observe(M::WorkEstimatedSeats, EXTRA_NONE, 2.0),
        Rec::Observe(M::QueueLengthAfterEnqueue, EXTRA_NONE, 3.0),
        Rec::Add(M::InqueueRequests, EXTRA_NONE, 1),
        Rec::Add(M::InqueueSeats, EXTRA_NONE, 2),
    ];
    let rejected = vec![
        Rec::Observe(M::WorkEstimatedSeats, EXTRA_NONE, 1.0),
        Rec::Add(M::Rejected, "queue-full", 1),
        Rec::Observe(M::WaitDuration, copy_of("false"), 0.0),
    ];
    let timed_out = vec![
        Rec::Add(M::InqueueRequests, EXTRA_NONE, -1),
        Rec::Add(M::InqueueSeats, EXTRA_NONE, -2),
        Rec::Add(M::Rejected, copy_of("time-out"), 1),
        Rec::Observe(M::WaitDuration, "false", 0.25),
    ];
    let finished = |seats: i64, t: &'static str, secs: f64| {
        vec![
            Rec::Add(M::ExecutingRequests, EXTRA_NONE, -1),
            Rec::Add(M::ExecutingSeats, EXTRA_NONE, -seats),
            Rec::Observe(M::ExecutionDuration, t, secs),
        ]
    };
    vec![
        vec![(0, 0, admitted(1)), (1, 2, queued.clone()), (2, 1, rejected.clone()), (0, 0, finished(1, "regular", 0.003))],
        vec![
            (1, 2, timed_out.clone()),
            (1, 2, queued),
            (2, 1, admitted(4)),
            (2, 1, rejected),
            (2, 1, finished(4, copy_of("watch"), 12.0)),
            (1, 2, timed_out),
            (0, 0, admitted(1)),
            // Out of the usual order, one series twice in a moment.
            (0, 0, admitted(1).into_iter().rev().chain(finished(1, "regular", 0.5)).collect()),
        ],
    ]
}

/// What `node`'s stats hold, by name.
fn stats(node: &Node) -> BTreeMap<String, i64> {
    node.host.proxy.stats.borrow().iter().map(|(k, (_, v))| (k.clone(), *v)).collect()
}

#[test]
fn batched_records_flush_the_same_deltas_as_single_records() {
    let c = compiled();
    assert!(c.levels.len() >= 3 && c.config.policy.flow_schemas.len() >= 3, "the defaults have three levels and schemas");
    let (single_node, batch_node) = (Node::new(&Proxy::new(), 0), Node::new(&Proxy::new(), 0));
    let (mut single, mut batch) = (Stats::default(), Stats::default());
    let mut previous = BTreeMap::new();
    for round in rounds() {
        for (pl, fs, recs) in round {
            let l = Labels { compiled: &c, pl, fs };
            for &r in &recs {
                match r {
                    Rec::Add(m, extra, d) => single.add(l, m, extra, d),
                    Rec::Observe(m, extra, v) => single.observe(l, m, extra, v),
                }
            }
            batch.with_flow(l, |f| {
                for &r in &recs {
                    match r {
                        Rec::Add(m, extra, d) => f.add(m, extra, d),
                        Rec::Observe(m, extra, v) => f.observe(m, extra, v),
                    }
                }
            });
        }
        single.set(&single_node.host, &c, M::CurrentLimit, 1, 7);
        batch.set(&batch_node.host, &c, M::CurrentLimit, 1, 7);
        single.flush(&single_node.host);
        batch.flush(&batch_node.host);
        let (s, b) = (stats(&single_node), stats(&batch_node));
        assert_eq!(b, s, "a batch flushes what single records flush");
        assert_ne!(s, previous, "every round flushes new deltas");
        previous = s;
    }
    let name = |metric: &str, labels: &str| format!("apiserver_flowcontrol_{metric}.{labels}");
    let level = |pl: usize| &c.levels[pl].name;
    let schema = |fs: usize| &c.config.policy.flow_schemas[fs].name;
    let flow = |pl, fs| format!("priority_level.{}.flow_schema.{}", level(pl), schema(fs));
    assert_eq!(previous[&name("dispatched_requests_total", &flow(0, 0))], 3);
    assert_eq!(previous[&name("current_executing_requests", &flow(0, 0))], 1, "admitted three times, finished twice");
    assert_eq!(previous.get(&name("current_inqueue_seats", &flow(1, 2))), Some(&0), "queued twice, timed out twice");
    let timed_out = format!("{}.reason.time-out", flow(1, 2));
    assert_eq!(previous[&name("rejected_requests_total", &timed_out)], 2, "equal label values are one series: {previous:#?}");
    let waited = format!("{}.execute.false", flow(1, 2));
    assert_eq!(previous[&name("request_wait_duration_seconds_count", &waited)], 2);
    assert_eq!(previous[&name("request_wait_duration_microseconds_sum", &waited)], 500_000);
    let watch = format!("{}.type.watch", flow(2, 1));
    assert_eq!(previous[&name("request_execution_microseconds_sum", &watch)], 12_000_000);
    let level_gauge = format!("priority_level.{}", level(1));
    assert_eq!(previous[&name("current_limit_seats", &level_gauge)], 7);
}
