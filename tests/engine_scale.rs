//! Scale: the global state of a level holds queued and executing requests and
//! the (bounded) set of non-idle queues — never anything per flow ever seen. 100,000 distinct
//! users (flows, hashed as the filter does with `classify::flow_hash`) arrive and finish in one
//! level, uncontended and contended; the encoded `LevelState` stays within a bound linear in the
//! requests present, and returns to its empty size afterwards.
//!
//! The per-request cost versus the number of flows seen is measured, not asserted:
//! `cargo test --release --test engine_scale -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/one_level.rs"]
mod one_level;
use std::collections::VecDeque;

use apf_wasm::config::parse_plugin_config;
use apf_wasm::engine::store::{MemStore, Store};
use apf_wasm::engine::{self, Arriving, Compiled, Decision, NoticeKind};
use apf_wasm::fairqueuing::{RequestId, RequestTag, WorkEstimate};
use apf_wasm::{Nanos, NANOS_PER_SEC};
use one_level::{one_level_json, Queuing};

const US: Nanos = 1_000;
const FLOWS: u32 = 100_000;
/// Bytes a waiting or executing request may take in the encoded state (it takes ~30).
const PER_REQUEST: usize = 64;
/// Bytes a non-idle queue may take besides its requests (index delta, virtual start, counts).
const PER_QUEUE: usize = 16;
/// Growth of the empty state's varint-encoded monotonic counters (dispatched, ids, virtual
/// time, ...) over the run: logarithmic in requests served, independent of flows.
const VARINT_GROWTH: usize = 40;

/// One Limited level `scale` with exactly `seats` seats, `queues` queues, hand size 6, queue
/// length limit 50, ByUser flows.
fn config(seats: u32, queues: u32) -> Compiled {
    let q = Queuing { queues, hand_size: 6, queue_length: 50 };
    let c = Compiled::new(parse_plugin_config(one_level_json("scale", seats, q, false).as_bytes()).unwrap(), 1);
    assert_eq!(c.levels[level(&c)].qs_config.concurrency_limit, seats);
    c
}

fn level(c: &Compiled) -> usize {
    c.levels.iter().position(|l| l.name == "scale").unwrap()
}

fn user_hash(u: u32) -> u64 {
    apf_wasm::classify::flow_hash("scale", &format!("user-{u}"))
}

/// Drives `flows` users through one level with at most `window` requests present at once (each
/// user sends one request; the oldest present request ends when the window is full). Returns
/// (max encoded size, max requests present, final encoded size, empty size, dispatched).
struct Run {
    max_size: usize,
    max_excess: i64,
    max_present: u32,
    final_size: usize,
    empty_size: usize,
    dispatched: u64,
}

fn drive(c: &Compiled, flows: u32, window: usize, check_every: u32) -> Run {
    let store = MemStore::new();
    let lvl = level(c);
    let key = c.levels[lvl].key.to_string();
    let queues = usize::try_from(c.levels[lvl].qs_config.desired_queues).unwrap();
    let mut notices = Vec::new();
    // The empty state: one request in and out.
    let Decision::Execute(rc) =
        engine::admit(c, &store, 0, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(0, u64::MAX) }, &mut notices).unwrap().0
    else {
        panic!()
    };
    engine::end(&store, 1, &key, rc.id, Some(&rc), &mut notices).unwrap();
    let mut receipts: std::collections::HashMap<RequestId, apf_wasm::fairqueuing::Receipt> = Default::default();
    let empty_size = store.value_len(&key);
    let mut present: VecDeque<RequestId> = VecDeque::new();
    let mut run = Run { max_size: 0, max_excess: 0, max_present: 0, final_size: 0, empty_size, dispatched: 0 };
    let mut now: Nanos = NANOS_PER_SEC;
    for u in 0..flows {
        now += 10 * US;
        if present.len() >= window {
            let id = present.pop_front().unwrap();
            engine::end(&store, now, &key, id, receipts.remove(&id).as_ref(), &mut notices).unwrap();
        }
        match engine::admit(c, &store, now, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(u, user_hash(u)) }, &mut notices)
            .unwrap()
            .0
        {
            Decision::Execute(rc) => {
                present.push_back(rc.id);
                receipts.insert(rc.id, rc);
            }
            Decision::Queued(id) => present.push_back(id),
            Decision::Rejected { .. } => panic!("no rejection expected with a window of {window}"),
        }
        for n in notices.drain(..) {
            let NoticeKind::Run { receipt, .. } = n.kind else { panic!("unexpected {n:?}") };
            receipts.insert(n.id, receipt);
            run.dispatched += 1;
        }
        if u % check_every == 0 || u + 1 == flows {
            let st = engine::read_level(&store, &key).unwrap().unwrap();
            let reqs = st.qs.requests_waiting() + st.qs.requests_executing();
            let active = st.qs.snapshot().queues.len();
            let size = store.value_len(&key);
            let bound = empty_size + VARINT_GROWTH + PER_REQUEST * reqs as usize + PER_QUEUE * active.min(queues);
            assert!(size <= bound, "after {u} flows: {size} bytes for {reqs} requests in {active} queues (bound {bound})");
            run.max_excess = run.max_excess.max(size as i64 - empty_size as i64 - (PER_REQUEST * reqs as usize) as i64);
            run.max_size = run.max_size.max(size);
            run.max_present = run.max_present.max(reqs);
        }
    }
    while let Some(id) = present.pop_front() {
        now += 10 * US;
        engine::end(&store, now, &key, id, receipts.remove(&id).as_ref(), &mut notices).unwrap();
        for n in notices.drain(..) {
            if let NoticeKind::Run { receipt, .. } = n.kind {
                receipts.insert(n.id, receipt);
            }
            run.dispatched += 1;
        }
    }
    let st = engine::read_level(&store, &key).unwrap().unwrap();
    assert_eq!((st.qs.seats_in_use(), st.qs.requests_waiting()), (0, 0));
    run.final_size = store.value_len(&key);
    run
}

fn tag(u: u32, hash: u64) -> RequestTag {
    RequestTag { owner: 1, context: u, flow_schema: 0, flow_hash: hash, wait_deadline: 3600 * NANOS_PER_SEC }
}

#[test]
fn state_size_is_bounded_by_requests_present_not_flows_seen_uncontended() {
    let c = config(16, 128);
    let r = drive(&c, FLOWS, 8, 997);
    assert!(r.max_present <= 8);
    // 8 executing requests, whatever the number of flows behind them.
    assert!(
        r.max_size <= r.empty_size + VARINT_GROWTH + 8 * PER_REQUEST + 8 * PER_QUEUE,
        "max {} bytes (empty {})",
        r.max_size,
        r.empty_size
    );
    // Back to the empty size, plus the varint growth of monotonic counters and clocks.
    assert!(r.final_size <= r.empty_size + VARINT_GROWTH, "final {} bytes vs empty {}", r.final_size, r.empty_size);
}

#[test]
fn state_size_is_bounded_by_requests_present_not_flows_seen_contended() {
    // 4 seats, 60 requests present: 56 wait in up to 128 queues, spread over 100,000 flows.
    let c = config(4, 128);
    let r = drive(&c, FLOWS, 60, 997);
    assert_eq!(r.max_present, 60);
    assert!(r.dispatched > u64::from(FLOWS) * 9 / 10, "queued requests were dispatched as others ended ({})", r.dispatched);
    assert!(
        r.max_size <= r.empty_size + VARINT_GROWTH + 60 * PER_REQUEST + 60 * PER_QUEUE,
        "max {} bytes (empty {})",
        r.max_size,
        r.empty_size
    );
    assert!(r.final_size <= r.empty_size + VARINT_GROWTH, "final {} bytes vs empty {}", r.final_size, r.empty_size);
}

/// ns per admit+end with K distinct flows cycling, uncontended (window 4, 16 seats) and
/// contended (window 60, 4 seats): flat in K if nothing is kept per flow.
#[test]
#[ignore]
fn bench_cost_per_request_vs_flows() {
    use std::time::Instant;
    let n: u32 = 200_000;
    for (name, seats, window) in [("uncontended", 16u32, 4usize), ("contended", 4, 60)] {
        let c = config(seats, 128);
        let lvl = level(&c);
        let key = c.levels[lvl].key.to_string();
        for k in [10u32, 1_000, 100_000] {
            let hashes: Vec<u64> = (0..k).map(user_hash).collect();
            let store = MemStore::new();
            let mut notices = Vec::new();
            let mut present: VecDeque<RequestId> = VecDeque::new();
            let mut receipts: std::collections::HashMap<RequestId, apf_wasm::fairqueuing::Receipt> = Default::default();
            let mut max_len = 0usize;
            let t = Instant::now();
            for i in 0..n {
                let now = NANOS_PER_SEC + Nanos::from(i) * 10 * US;
                if present.len() >= window {
                    let id = present.pop_front().unwrap();
                    engine::end(&store, now, &key, id, receipts.remove(&id).as_ref(), &mut notices).unwrap();
                }
                let h = hashes[(i % k) as usize];
                match engine::admit(&c, &store, now, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(i, h) }, &mut notices)
                    .unwrap()
                    .0
                {
                    Decision::Execute(rc) => {
                        present.push_back(rc.id);
                        receipts.insert(rc.id, rc);
                    }
                    Decision::Queued(id) => present.push_back(id),
                    Decision::Rejected { .. } => {}
                }
                for n in notices.drain(..) {
                    if let NoticeKind::Run { receipt, .. } = n.kind {
                        receipts.insert(n.id, receipt);
                    }
                }
                if i % 1024 == 0 {
                    max_len = max_len.max(store.value_len(&key));
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
            let (v, _) = store.get(&key).unwrap();
            println!(
                "{name:11} K={k:6}: {ns:7.0} ns per admit+end; state max {max_len} bytes, now {} bytes",
                v.map(|b| b.len()).unwrap_or(0)
            );
        }
    }
}
