//! White-box tests of the QueueSet (upstream's `queueset_test.go` vectors and our properties).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
use super::codec::{encode_segment, has_duplicates, ID_WINDOW};
use super::fifo::Waiting;
use super::*;
use crate::codec::{Reader, Writer};
use crate::test_rng::Rng;
use crate::NANOS_PER_SEC;
use std::collections::VecDeque;

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;

fn cfg(q: i32, qll: u32, hand: u32, c: u32) -> QueueSetConfig {
    QueueSetConfig { desired_queues: q, queue_length_limit: qll, hand_size: hand, concurrency_limit: c, strict_limit: false }
}
fn tag(hash: u64) -> RequestTag {
    RequestTag { owner: 1, context: hash as u32, flow_schema: 0, flow_hash: hash, wait_deadline: Nanos::MAX }
}
fn one() -> WorkEstimate {
    WorkEstimate { initial_seats: 1, final_seats: 0, additional_latency: 0 }
}
fn ss(secs: f64) -> u64 {
    seats_times_duration(1.0, (secs * 1e9) as Nanos).0
}

/// Builds a queue with one waiting request of `seats` seats.
fn queue_with_head(qs: &mut QueueSet, index: u32, next_r: u64, seats: u32) {
    let mut q = Queue::new(index);
    q.next_dispatch_r = next_r;
    let work = WorkEstimate { initial_seats: seats, final_seats: 0, additional_latency: 0 };
    q.max_seats_sum = seats as u64;
    q.initial_seats_sum = seats as u64;
    q.total_work_sum = request_work(&work, qs.g).1 .0;
    let id = qs.new_id();
    q.waiting.edit().push_back(Waiting { id, tag: tag(index as u64), work, arrival_r: 0, arrival: 0 });
    qs.tot_requests_waiting += 1;
    qs.tot_seats_waiting += seats as u64;
    qs.queues.push(q);
}

fn find_case(c: u32, in_use: u64, robin_minus_one_of: u32, queues: &[(u64, u32)]) -> QueueSet {
    let mut qs = QueueSet::new(cfg(queues.len() as i32, 8, 1, c), 0).unwrap();
    // robinIndex −1 ≡ nq−1 (mod nq): the scan starts at queue 0.
    qs.robin_index = robin_minus_one_of - 1;
    qs.tot_seats_in_use = in_use;
    for (i, (r, seats)) in queues.iter().enumerate() {
        queue_with_head(&mut qs, i as u32, *r, *seats);
    }
    qs
}

fn picked(qs: &mut QueueSet) -> Option<u32> {
    qs.find_dispatch_queue().map(|p| {
        let idx = qs.queues[p].index;
        // upstream sets robinIndex inside findDispatchQueueToBoundLocked
        qs.robin_index = idx;
        idx
    })
}

#[test]
fn find_dispatch_queue_vectors() {
    // 1. seats available, the queue with less virtual start wins
    let mut qs = find_case(1, 0, 2, &[(ss(200.0), 1), (ss(100.0), 1)]);
    assert_eq!(picked(&mut qs), Some(1));
    assert_eq!(qs.robin_index, 1);
    // 2. all seats occupied
    let mut qs = find_case(1, 1, 1, &[(ss(200.0), 1)]);
    assert_eq!(picked(&mut qs), None);
    assert_eq!(qs.robin_index, 0);
    // 3. wide requests, fits
    let mut qs = find_case(50, 25, 2, &[(ss(200.0), 50), (ss(100.0), 25)]);
    assert_eq!(picked(&mut qs), Some(1));
    assert_eq!(qs.robin_index, 1);
    // 4. minimal finish does not fit; the other would but is not chosen
    let mut qs = find_case(50, 26, 2, &[(ss(200.0), 10), (ss(100.0), 25)]);
    for _ in 0..3 {
        assert_eq!(picked(&mut qs), None);
        assert_eq!(qs.robin_index, 1);
    }
    assert_eq!(qs.counters.no_accommodation, 3);
    // 5. seats become available before the 3rd attempt
    let mut qs = find_case(50, 26, 2, &[(ss(200.0), 10), (ss(100.0), 25)]);
    assert_eq!(picked(&mut qs), None);
    assert_eq!(qs.robin_index, 1);
    assert_eq!(picked(&mut qs), None);
    assert_eq!(qs.robin_index, 1);
    qs.tot_seats_in_use = 25;
    assert_eq!(picked(&mut qs), Some(1));
    assert_eq!(qs.robin_index, 1);
}

#[test]
fn finish_request_vectors() {
    for work in [
        WorkEstimate { initial_seats: 1, final_seats: 10, additional_latency: 60 * SEC },
        WorkEstimate { initial_seats: 10, final_seats: 0, additional_latency: 0 },
    ] {
        let mut qs = QueueSet::new(cfg(1, 8, 1, 1000), 0).unwrap();
        qs.g = SEC;
        let max = work.max_seats();
        let mut q = Queue::new(0);
        q.requests_executing = 2;
        q.seats_in_use = 22;
        qs.queues.push(q);
        // Request 1 (owner 1) under test; another one of owner 2 holds the other seats.
        qs.execs = vec![
            ExecutingByOwner { owner: 1, queue: 0, executing: 1, seats: max as u64 },
            ExecutingByOwner { owner: 2, queue: 0, executing: 1, seats: 22 - max as u64 },
        ];
        qs.tot_requests_executing = 111;
        qs.tot_seats_in_use = 222;
        let rc = Receipt {
            id: 1,
            queue: 0,
            owner: 1,
            initial_seats: work.initial_seats,
            max_seats: max,
            start: 0,
            additional_latency: work.additional_latency,
        };
        let mut out = Vec::new();
        assert!(qs.finish(0, &rc, &mut out));
        // Service-time correction: G − (now − start) = 1 s at InitialSeats.
        assert_eq!(qs.queues[0].next_dispatch_r, 0u64.wrapping_sub(seats_times_duration(work.initial_seats as f64, SEC).0));
        let before = qs.clone();
        assert!(!qs.finish(0, &rc, &mut out), "second finish of the same request");
        assert!(!qs.finish(0, &Receipt { owner: 3, ..rc }, &mut out), "unknown owner");
        assert_eq!(qs, before, "a refused finish changes nothing");
        let mut to = Vec::new();
        qs.expire(work.additional_latency, &mut to, &mut out);
        assert_eq!(qs.tot_requests_executing, 110);
        assert_eq!(qs.tot_seats_in_use, 222 - max as u64);
        assert_eq!(qs.queues[0].seats_in_use, 22 - max as u64);
        assert_eq!(qs.queues[0].requests_executing, 1);
        assert_eq!(qs.execs, vec![ExecutingByOwner { owner: 2, queue: 0, executing: 1, seats: 22 - max as u64 }]);
        assert!(qs.lingers.is_empty());
        assert!(out.is_empty() && to.is_empty());
    }
}

#[test]
fn request_work_and_seats() {
    let w = WorkEstimate { initial_seats: 3, final_seats: 50, additional_latency: 70 * SEC };
    let (_, total) = request_work(&w, 2 * SEC);
    assert_eq!(total, seats_times_duration(3.0, 2 * SEC).wrapping_add(seats_times_duration(50.0, 70 * SEC)));
    assert_eq!(total.to_string(), "3506.00000000ss");
    let seats = |i, f| WorkEstimate { initial_seats: i, final_seats: f, additional_latency: 0 }.max_seats();
    assert_eq!(seats(3, 3), 3);
    assert_eq!(seats(1, 3), 3);
    assert_eq!(seats(3, 1), 3);
}

fn ndr(qs: &QueueSet, index: u32) -> u64 {
    qs.queues.iter().find(|q| q.index == index).map(|q| q.next_dispatch_r).unwrap()
}

/// Worked example derived by hand from `queueset.go` (`syncTimeLocked`, `dispatchLocked`,
/// `finishRequestLocked`): C = 1, hand size 1 (flow X on q0, flow Y on q1), G = 3 ms; X1 runs,
/// Y1 and X2 queue; when X1 finishes after 0.1 s its queue is charged the actual 0.1 seat-s, so
/// Y1 is dispatched before X2.
#[test]
fn worked_example() {
    let mut qs = QueueSet::new(cfg(2, 8, 1, 1), 0).unwrap();
    let mut out = Vec::new();
    // Dealer(2,1): hash mod 2 → X (hash 0) uses q0, Y (hash 1) uses q1.
    let x1 = qs.start_request(0, one(), tag(0), &mut out).arrival;
    assert!(matches!(x1, Arrival::Executing(_)));
    assert_eq!(ndr(&qs, 0), ss(0.003));
    assert_eq!(qs.robin_index, 0);
    let y1 = qs.start_request(0, one(), tag(1), &mut out).arrival;
    let x2 = qs.start_request(0, one(), tag(0), &mut out).arrival;
    let (Arrival::Executing(x1), Arrival::Queued(y1), Arrival::Queued(x2)) = (x1, y1, x2) else { panic!() };
    assert!(out.is_empty());
    assert_eq!(qs.virtual_time_ratio(), 0.5);
    assert_eq!((x1.queue, x1.owner, x1.start, x1.max_seats), (0, 1, 0, 1));
    assert!(qs.finish(100 * MS, &x1, &mut out));
    assert_eq!(qs.current_r, ss(0.05));
    assert_eq!(ndr(&qs, 0), ss(0.1));
    assert_eq!(out.iter().map(|d| d.id).collect::<Vec<_>>(), vec![y1]);
    assert_eq!(out[0].waited, 100 * MS);
    assert_eq!(ndr(&qs, 1), ss(0.003));
    assert_eq!(qs.robin_index, 1);
    let y1 = out[0].receipt;
    assert_eq!((y1.queue, y1.start), (1, 100 * MS));
    out.clear();
    assert!(qs.finish(200 * MS, &y1, &mut out));
    assert_eq!(qs.current_r, ss(0.1));
    assert_eq!(out.iter().map(|d| d.id).collect::<Vec<_>>(), vec![x2]);
    assert_eq!(ndr(&qs, 0), ss(0.103));
    // q1 became idle and is no longer stored.
    assert_eq!(qs.queues.len(), 1);
    let x2 = out[0].receipt;
    out.clear();
    assert!(qs.finish(300 * MS, &x2, &mut out));
    assert!(qs.is_idle() && qs.is_empty());
}

/// TestContextCancel: the cancelled waiting request never executes; no dispatch attempt.
#[test]
fn context_cancel() {
    let mut qs = QueueSet::new(cfg(11, 11, 1, 1), 0).unwrap();
    let mut out = Vec::new();
    let Arrival::Executing(r1) = qs.start_request(0, one(), tag(1), &mut out).arrival else { panic!() };
    let Arrival::Queued(r2) = qs.start_request(0, one(), tag(2), &mut out).arrival else { panic!() };
    assert_eq!(qs.cancel(SEC, r2), Some(tag(2)));
    assert_eq!(qs.cancel(SEC, r2), None);
    assert_eq!(qs.counters.timed_out, 1);
    assert!(!qs.is_idle());
    assert!(qs.finish(SEC, &r1, &mut out));
    assert!(out.is_empty());
    assert!(qs.is_idle() && qs.is_empty());
}

#[test]
fn wait_deadline_expiry_and_next_event() {
    let mut qs = QueueSet::new(cfg(4, 10, 1, 1), 0).unwrap();
    let mut out = Vec::new();
    let Arrival::Executing(r1) = qs.start_request(0, one(), tag(1), &mut out).arrival else { panic!() };
    let mut t = tag(2);
    t.wait_deadline = 5 * SEC;
    let Arrival::Queued(r2) = qs.start_request(0, one(), t, &mut out).arrival else { panic!() };
    assert_eq!(qs.next_event(), Some(5 * SEC));
    let mut to = Vec::new();
    qs.expire(4 * SEC, &mut to, &mut out);
    assert!(to.is_empty());
    qs.expire(6 * SEC, &mut to, &mut out);
    assert_eq!(to, vec![(r2, t)]);
    assert!(out.is_empty());
    assert_eq!(qs.next_event(), None);
    assert!(qs.finish(7 * SEC, &r1, &mut out));
    assert!(qs.is_empty());
}

#[test]
fn reject_levels_and_exempt() {
    let mut qs = QueueSet::new(cfg(0, 0, 0, 2), 0).unwrap();
    let mut out = Vec::new();
    let w2 = WorkEstimate { initial_seats: 2, final_seats: 0, additional_latency: 0 };
    assert!(matches!(qs.start_request(0, one(), tag(1), &mut out).arrival, Arrival::Executing(_)));
    assert_eq!(qs.start_request(0, w2, tag(1), &mut out).arrival, Arrival::Rejected(RejectReason::ConcurrencyLimit));
    assert_eq!(qs.counters.rejected_concurrency_limit, 1);
    let mut ex = QueueSet::new(cfg(-1, 0, 0, 0), 0).unwrap();
    for _ in 0..5 {
        assert!(matches!(ex.start_request(0, w2, tag(1), &mut out).arrival, Arrival::Executing(_)));
    }
    assert_eq!(ex.seats_in_use(), 10);
    // too wide runs alone
    let mut qs = QueueSet::new(cfg(4, 10, 1, 2), 0).unwrap();
    let w3 = WorkEstimate { initial_seats: 3, final_seats: 0, additional_latency: 0 };
    let Arrival::Executing(a) = qs.start_request(0, one(), tag(0), &mut out).arrival else { panic!() };
    let Arrival::Queued(b) = qs.start_request(0, w3, tag(1), &mut out).arrival else { panic!() };
    assert!(qs.finish(SEC, &a, &mut out));
    assert_eq!(out.iter().map(|d| (d.id, d.receipt.max_seats)).collect::<Vec<_>>(), vec![(b, 3)]);
    assert_eq!(qs.seats_in_use(), 3);
}

#[test]
fn final_seats_narrowing_and_linger() {
    let mut qs = QueueSet::new(cfg(4, 10, 1, 4), 0).unwrap();
    let mut out = Vec::new();
    let w = WorkEstimate { initial_seats: 1, final_seats: 8, additional_latency: SEC };
    // MaxSeats 8 > C: runs alone; final seats narrowed to 4, latency doubled.
    let r = qs.start_request(0, w, tag(0), &mut out).arrival;
    let Arrival::Executing(id) = r else { panic!("{r:?}") };
    assert_eq!(qs.seats_in_use(), 4);
    assert!(qs.finish(SEC, &id, &mut out));
    assert!(qs.is_idle());
    assert_eq!(qs.seats_in_use(), 4);
    assert_eq!(qs.next_event(), Some(3 * SEC));
    let mut to = Vec::new();
    qs.expire(3 * SEC, &mut to, &mut out);
    assert_eq!(qs.seats_in_use(), 0);
    assert!(qs.is_empty());
}

#[test]
fn reconfigure_and_remove_owner() {
    let mut qs = QueueSet::new(cfg(8, 10, 2, 1), 0).unwrap();
    let mut out = Vec::new();
    let Arrival::Executing(_a) = qs.start_request(0, one(), tag(5), &mut out).arrival else { panic!() };
    let mut t = tag(6);
    t.owner = 2;
    let Arrival::Queued(_b) = qs.start_request(0, one(), t, &mut out).arrival else { panic!() };
    let Arrival::Queued(c) = qs.start_request(0, one(), tag(7), &mut out).arrival else { panic!() };
    assert!(qs.reconfigure(cfg(512, 8, 8, 1), SEC).unwrap_err().contains("required entropy bits"));
    // owner 1 gone: its executing request releases its seat, its... c is owner 1 too
    let n = qs.remove_owner(2, SEC, &mut out);
    assert_eq!(n, 1);
    assert!(out.is_empty());
    let d = qs.reconfigure(cfg(4, 10, 1, 2), 2 * SEC).unwrap();
    assert_eq!(d.iter().map(|d| d.id).collect::<Vec<_>>(), vec![c]);
    assert_eq!(qs.remove_owner(1, 3 * SEC, &mut out), 2);
    assert!(qs.is_empty());
    // Reject level keeps old QLL / hand.
    qs.reconfigure(cfg(0, 0, 0, 3), 3 * SEC).unwrap();
    assert_eq!(qs.config(), cfg(0, 10, 1, 3));
}

/// Lease expiry releases executing and lingering seats of the owner; its receipts are
/// refused afterwards; other owners are untouched.
#[test]
fn remove_owner_releases_aggregates_and_lingers() {
    let mut qs = QueueSet::new(cfg(4, 10, 1, 10), 0).unwrap();
    let mut out = Vec::new();
    let lw = WorkEstimate { initial_seats: 2, final_seats: 3, additional_latency: SEC };
    let mut t7 = tag(0);
    t7.owner = 7;
    let Arrival::Executing(a) = qs.start_request(0, lw, t7, &mut out).arrival else { panic!() };
    let Arrival::Executing(b) = qs.start_request(0, one(), t7, &mut out).arrival else { panic!() };
    let Arrival::Executing(c) = qs.start_request(0, one(), tag(0), &mut out).arrival else { panic!() };
    assert_eq!((a.queue, b.queue, c.queue), (0, 0, 0));
    assert_eq!(qs.execs.len(), 2, "one aggregate per (owner, queue)");
    assert!(qs.finish(MS, &a, &mut out));
    assert_eq!(qs.seats_in_use(), 5, "a lingers on 3 seats");
    assert_eq!(qs.remove_owner(7, 2 * MS, &mut out), 2);
    assert_eq!((qs.seats_in_use(), qs.requests_executing()), (1, 1));
    assert!(qs.lingers.is_empty() && qs.next_event().is_none());
    assert!(!qs.finish(3 * MS, &b, &mut out), "reaped");
    assert_eq!(qs.snapshot().queues[0].executing_by_owner, vec![ExecutingByOwner { owner: 1, queue: 0, executing: 1, seats: 1 }]);
    assert!(qs.finish(3 * MS, &c, &mut out));
    assert!(!qs.finish(3 * MS, &c, &mut out), "double finish");
    assert!(qs.is_empty());
}

/// State size depends on distinct (owner, queue) pairs, not on executing requests.
#[test]
fn executing_requests_do_not_grow_the_state() {
    let size = |qs: &QueueSet| {
        let mut w = Writer::new();
        qs.encode(&mut w);
        w.buf.len()
    };
    let mut qs = QueueSet::new(cfg(-1, 0, 0, 0), SEC).unwrap();
    let mut out = Vec::new();
    qs.start_request(SEC, one(), tag(1), &mut out);
    let one_size = size(&qs);
    for i in 0..500 {
        qs.start_request(SEC + i, one(), tag(1), &mut out);
    }
    // Only varints grow (counters, next id, the aggregate's count and seats).
    assert!(size(&qs) <= one_size + 8, "{} vs {one_size}", size(&qs));
    assert_eq!(qs.requests_executing(), 501);
    let back = QueueSet::decode(&mut Reader::new(&{
        let mut w = Writer::new();
        qs.encode(&mut w);
        w.buf
    }))
    .unwrap();
    assert_eq!(back, qs);
}

#[test]
fn decode_rejects_inconsistent_aggregates() {
    let enc = |qs: &QueueSet| {
        let mut w = Writer::new();
        qs.encode(&mut w);
        w.buf
    };
    let mut qs = QueueSet::new(cfg(4, 10, 1, 10), 0).unwrap();
    let mut out = Vec::new();
    qs.start_request(0, one(), tag(0), &mut out);
    assert!(QueueSet::decode(&mut Reader::new(&enc(&qs))).is_ok());
    // Seats held in a queue that is not stored.
    let mut bad = qs.clone();
    bad.execs[0].queue = 3;
    assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
    bad = qs.clone();
    bad.lingers.push(Linger { until: 5, queue: 2, owner: 1, seats: 1 });
    assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
    // Duplicate / unsorted aggregates, empty aggregate.
    bad = qs.clone();
    bad.execs.push(bad.execs[0]);
    assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
    bad = qs.clone();
    bad.execs[0].executing = 0;
    assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
    // A stored queue with nothing in it.
    bad = qs.clone();
    bad.execs.clear();
    assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
    // Overflowing totals.
    bad = qs.clone();
    bad.execs.push(ExecutingByOwner { owner: 9, queue: -1, executing: 1, seats: u64::MAX });
    assert!(QueueSet::decode(&mut Reader::new(&enc(&bad))).is_err());
}

fn busy_state() -> QueueSet {
    let mut qs = QueueSet::new(cfg(64, 50, 8, 3), 1_000_000_000_000).unwrap();
    let mut out = Vec::new();
    let mut now = 1_000_000_000_000;
    let mut running = Vec::new();
    for i in 0..40u64 {
        now += 1_234_567;
        let mut t = tag(i.wrapping_mul(0x9E3779B97F4A7C15));
        if i % 3 == 0 {
            t.wait_deadline = now + 15 * SEC;
        }
        let w = WorkEstimate { initial_seats: 1 + (i % 2) as u32, final_seats: (i % 5) as u32, additional_latency: (i % 4) as i64 * MS };
        if let Arrival::Executing(rc) = qs.start_request(now, w, t, &mut out).arrival {
            running.push(rc);
        }
    }
    // Two finish (one of them lingers: additional latency), the third keeps executing.
    for rc in running.iter().skip(1) {
        now += MS / 2;
        assert!(qs.finish(now, rc, &mut out));
    }
    assert!(!qs.lingers.is_empty() && !qs.execs.is_empty());
    qs
}

#[test]
fn encode_roundtrip() {
    let qs = busy_state();
    assert!(qs.requests_waiting() > 10);
    let mut w = Writer::new();
    qs.encode(&mut w);
    let bytes = w.into_bytes();
    let back = QueueSet::decode(&mut Reader::new(&bytes)).unwrap();
    assert_eq!(back, qs);
    assert_eq!(back.snapshot(), qs.snapshot());
    // Common case: one executing request.
    let mut qs = QueueSet::new(cfg(128, 50, 6, 100), 123_456_789_000_000).unwrap();
    let mut out = Vec::new();
    let mut t = tag(17644606172554983095);
    t.wait_deadline = 123_456_789_000_000 + 15 * SEC;
    qs.start_request(123_456_789_000_000, one(), t, &mut out);
    let mut w = Writer::new();
    qs.encode(&mut w);
    let n = w.buf.len();
    assert!(n < 54, "{n} bytes");
    assert_eq!(QueueSet::decode(&mut Reader::new(&w.buf)).unwrap(), qs);
}

#[test]
fn direct_dispatch_matches_enqueue_then_dispatch() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut direct = 0;
    for case in 0..300 {
        let queues = 1 + rng.below(8) as i32;
        let hand = 1 + rng.below(queues as u64) as u32;
        let c = 1 + rng.below(6) as u32;
        let mut a = QueueSet::new(cfg(queues, rng.below(4) as u32, hand, c), 1_000 * SEC).unwrap();
        if case % 7 == 0 {
            a.current_r = u64::MAX - rng.below(1 << 40);
        }
        let mut b = a.clone();
        let mut now = 1_000 * SEC;
        // Waiting (None) or executing (its receipt) requests.
        let mut ids: Vec<(RequestId, Option<Receipt>)> = Vec::new();
        let note = |ids: &mut Vec<(RequestId, Option<Receipt>)>, out: &[Dispatched]| {
            for d in out {
                for e in ids.iter_mut().filter(|e| e.0 == d.id) {
                    e.1 = Some(d.receipt);
                }
            }
        };
        for _ in 0..200 {
            now += rng.below(5) as i64 * MS;
            match rng.below(10) {
                0..=4 => {
                    let w = WorkEstimate {
                        initial_seats: 1 + rng.below(3) as u32 + if rng.below(10) == 0 { c } else { 0 },
                        final_seats: rng.below(4) as u32 + if rng.below(10) == 0 { 2 * c } else { 0 },
                        additional_latency: rng.below(3) as i64 * MS,
                    };
                    let mut t = tag(rng.below(u64::MAX));
                    t.wait_deadline = now + rng.below(50) as i64 * MS;
                    let (mut oa, mut ob) = (Vec::new(), Vec::new());
                    let ra = a.start_request(now, w, t, &mut oa).arrival;
                    let rb = b.start_request_via(now, w, t, &mut ob, false).arrival;
                    assert_eq!(ra, rb);
                    assert_eq!(oa, ob);
                    note(&mut ids, &oa);
                    match ra {
                        Arrival::Executing(rc) => {
                            assert_eq!((rc.owner, rc.start, rc.initial_seats), (t.owner, now, w.initial_seats));
                            direct += 1;
                            ids.push((rc.id, Some(rc)))
                        }
                        Arrival::Queued(id) => ids.push((id, None)),
                        Arrival::Rejected(_) => {}
                    }
                }
                5..=7 if !ids.is_empty() => {
                    let (id, rc) = ids.swap_remove(rng.below(ids.len() as u64) as usize);
                    let (mut oa, mut ob) = (Vec::new(), Vec::new());
                    if let Some(rc) = rc {
                        let fa = a.finish(now, &rc, &mut oa);
                        let fb = b.finish(now, &rc, &mut ob);
                        assert!(fa);
                        assert_eq!((fa, &oa), (fb, &ob));
                        note(&mut ids, &oa);
                    } else {
                        assert_eq!(a.cancel(now, id), b.cancel(now, id));
                    }
                }
                _ => {
                    let (mut ta, mut tb, mut oa, mut ob) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                    a.expire(now, &mut ta, &mut oa);
                    b.expire(now, &mut tb, &mut ob);
                    assert_eq!((&ta, &oa), (&tb, &ob));
                    note(&mut ids, &oa);
                    ids.retain(|e| !ta.iter().any(|(id, _)| *id == e.0));
                }
            }
            assert_eq!(a, b, "case {case}");
        }
    }
    assert!(direct > 1000, "{direct}");
}

#[test]
fn config_fast_check_agrees_with_dealer() {
    for deck in (1..=300).chain([1 << 10, (1 << 26) - 1, 1 << 26, (1 << 26) + 1, i32::MAX]) {
        for hand in (0..=20).chain([deck as u32, u32::MAX]) {
            let c = cfg(deck, 10, hand, 5);
            let want = Dealer::new(deck, hand.min(i32::MAX as u32) as i32).is_ok();
            assert_eq!(check_config(&c).is_ok(), want, "deck {deck} hand {hand}");
        }
    }
}

#[test]
fn id_set_finds_duplicates() {
    for n in [0usize, 1, 2, 15, 16, 17, 40] {
        // Close ids (bitmap) and spread ones (sorting).
        for spread in [1u64, 3, ID_WINDOW - 1, ID_WINDOW, 1 << 40] {
            let id = |i: usize| 7 + i as u64 * spread;
            let mut s = Vec::new();
            for i in 0..n {
                s.push(id(i));
            }
            assert!(!has_duplicates(&mut s), "{n} {spread}");
            for dup in 0..n {
                let mut s = Vec::new();
                for i in 0..n {
                    s.push(id(i));
                }
                s.push(id(dup));
                assert!(has_duplicates(&mut s), "{n} {dup} {spread}");
            }
        }
    }
}

/// Decoding rejects a request id that appears twice, within one queue or across queues,
/// and accepts every state `encode` writes.
#[test]
fn decode_rejects_duplicate_ids() {
    let roundtrip = |qs: &QueueSet| {
        let mut w = Writer::new();
        qs.encode(&mut w);
        let b = w.into_bytes();
        QueueSet::decode(&mut Reader::new(&b))
    };
    // One queue (one flow), several waiting.
    let mut one = QueueSet::new(cfg(4, 50, 1, 1), 0).unwrap();
    let mut out = Vec::new();
    for _ in 0..6 {
        let _ = one.start_request(1, WorkEstimate::ONE, tag(7), &mut out);
    }
    assert_eq!(one.queues.iter().filter(|q| !q.waiting.is_empty()).count(), 1);
    assert!(roundtrip(&one).is_ok());
    for (a, b) in [(0usize, 1usize), (1, 3), (0, 4)] {
        let mut bad = one.clone();
        let q = bad.queues.iter_mut().find(|q| !q.waiting.is_empty()).unwrap();
        let a_id = q.waiting[a].id;
        q.waiting.edit()[b].id = a_id;
        assert!(roundtrip(&bad).is_err(), "{a} {b}");
    }
    // Several queues.
    let qs = busy_state();
    assert!(qs.queues.iter().filter(|q| !q.waiting.is_empty()).count() > 1);
    assert!(roundtrip(&qs).is_ok());
    let mut bad = qs.clone();
    let first = bad.queues.iter().find(|q| !q.waiting.is_empty()).unwrap().waiting[0].id;
    let other = bad.queues.iter_mut().filter(|q| !q.waiting.is_empty()).nth(1).unwrap();
    let last = other.waiting.len() - 1;
    other.waiting.edit()[last].id = first;
    assert!(roundtrip(&bad).is_err());
    // Decoding with a prior state whose queues are taken unchanged: a request decoded here
    // that repeats a kept request's id, or another decoded request's, is rejected too.
    let encode = |qs: &QueueSet| {
        let mut w = Writer::new();
        qs.encode(&mut w);
        w.into_bytes()
    };
    let with_prior = |qs: &QueueSet, prior: &QueueSet| QueueSet::decode_reusing(&mut Reader::new(&encode(qs)), Some(prior.clone()));
    let mut prior = qs.clone();
    prior.queues.iter_mut().for_each(|q| {
        q.waiting.encoded();
    });
    assert_eq!(with_prior(&qs, &prior).unwrap(), qs);
    let nonempty: Vec<usize> = (0..qs.queues.len()).filter(|&i| !qs.queues[i].waiting.is_empty()).collect();
    let (qa, qb) = (nonempty[0], nonempty[1]);
    let kept_id = qs.queues[qa].waiting[0].id;
    let appended = |qs: &mut QueueSet, q: usize, id: RequestId| {
        let mut w = qs.queues[q].waiting.back().unwrap().clone();
        w.id = id;
        qs.queues[q].waiting.push_back(w);
        qs.next_id = qs.next_id.max(id + 1);
    };
    // Appended with a fresh id: accepted (and decoded from the prior's queues).
    let mut ok = qs.clone();
    appended(&mut ok, qb, qs.next_id);
    assert_eq!(with_prior(&ok, &prior).unwrap(), QueueSet::decode(&mut Reader::new(&encode(&ok))).unwrap());
    // Appended with the id of a request of another queue the prior holds unchanged.
    let mut dup = qs.clone();
    appended(&mut dup, qb, kept_id);
    assert!(with_prior(&dup, &prior).is_err());
    // Two appended requests with the same fresh id.
    let mut dup = qs.clone();
    appended(&mut dup, qa, qs.next_id + 3);
    appended(&mut dup, qb, qs.next_id + 3);
    assert!(with_prior(&dup, &prior).is_err());
    // A fresh id at or above the state's next id.
    let mut bad = ok.clone();
    bad.next_id = qs.next_id;
    assert!(with_prior(&bad, &prior).is_err());
}

#[test]
fn garbage_decode_never_panics() {
    let qs = busy_state();
    let mut w = Writer::new();
    qs.encode(&mut w);
    let good = w.into_bytes();
    for cut in 0..good.len() {
        assert!(QueueSet::decode(&mut Reader::new(&good[..cut])).is_err());
    }
    let mut rng = Rng(88172645463325252);
    let mut x = 0;
    for round in 0..3000 {
        let mut b = good.clone();
        for _ in 0..(1 + round % 4) {
            x = rng.next();
            let i = (x % b.len() as u64) as usize;
            b[i] = (x >> 20) as u8;
        }
        if let Ok(mut q) = QueueSet::decode(&mut Reader::new(&b)) {
            // whatever decoded must be usable without panics
            let mut out = Vec::new();
            let mut to = Vec::new();
            q.start_request(q.last_real_time + SEC, one(), tag(x), &mut out);
            q.expire(q.last_real_time + 100 * SEC, &mut to, &mut out);
            let _ = q.snapshot();
        }
        let rnd: Vec<u8> = (0..(round % 64)).map(|k| (x >> (k % 57)) as u8).collect();
        let _ = QueueSet::decode(&mut Reader::new(&rnd));
    }
}

fn owned(owner: u32, ctx: u32) -> RequestTag {
    // One flow: every request lands in the same queue (hand size 1, one queue).
    RequestTag { owner, context: ctx, flow_schema: 0, flow_hash: 7, wait_deadline: Nanos::MAX }
}

#[test]
fn single_owner_order_is_fifo() {
    let mut qs = QueueSet::new(cfg(1, 100, 1, 1), 0).unwrap();
    let mut out = Vec::new();
    let Arrival::Executing(mut rc) = qs.start_request(0, one(), owned(1, 1), &mut out).arrival else { panic!("runs") };
    let ids: Vec<RequestId> = (0..5)
        .map(|k| match qs.start_request(MS, one(), owned(1, 10 + k), &mut out).arrival {
            Arrival::Queued(id) => id,
            other => panic!("{other:?}"),
        })
        .collect();
    let mut got = Vec::new();
    for k in 0..5 {
        out.clear();
        assert!(qs.finish((10 + k) * MS, &rc, &mut out));
        rc = out[0].receipt;
        got.push(out[0].id);
    }
    assert_eq!(got, ids);
}

/// Decoding with a prior state gives exactly what decoding alone gives, whatever the prior
/// (an older state, a newer one, one of another configuration), and every kept queue
/// encoding is exactly its requests' encoding: random arrivals, finishes, cancellations,
/// time-outs and owner purges from 3 owners, decoding each state with earlier ones.
#[test]
fn decoding_with_a_prior_state_equals_decoding() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut qs = QueueSet::new(cfg(8, 20, 2, 3), 0).unwrap();
    let mut now: Nanos = 0;
    let mut executing: Vec<Receipt> = Vec::new();
    let mut history: Vec<(Vec<u8>, QueueSet)> = Vec::new();
    let mut out = Vec::new();
    let mut reused = 0;
    for step in 0..4000u32 {
        now += rng.below(3 * MS as u64) as Nanos;
        out.clear();
        match rng.below(20) {
            0 => {
                let _ = qs.cancel(now, qs.next_id.saturating_sub(1 + rng.below(8)));
            }
            1 => {
                qs.expire(now, &mut Vec::new(), &mut out);
            }
            2 if step % 500 == 0 => {
                let _ = qs.remove_owner(1 + rng.below(3) as u32, now, &mut out);
            }
            k if k < 12 => {
                let mut tag = RequestTag {
                    owner: 1 + rng.below(3) as u32,
                    context: step,
                    flow_schema: rng.below(2) as u16,
                    flow_hash: rng.below(6),
                    wait_deadline: Nanos::MAX,
                };
                if rng.below(3) == 0 {
                    tag.wait_deadline = now + rng.below(40 * MS as u64) as Nanos;
                }
                let work = WorkEstimate {
                    initial_seats: 1 + rng.below(2) as u32,
                    final_seats: rng.below(2) as u32,
                    additional_latency: rng.below(2) as Nanos * MS,
                };
                if let Arrival::Executing(rc) = qs.start_request(now, work, tag, &mut out).arrival {
                    executing.push(rc);
                }
            }
            _ if !executing.is_empty() => {
                let rc = executing.remove(rng.below(executing.len() as u64) as usize);
                let _ = qs.finish(now, &rc, &mut out);
            }
            _ => {}
        }
        executing.extend(out.iter().map(|d| d.receipt));
        executing.retain(|rc| qs.execs.iter().any(|e| e.owner == rc.owner));
        let mut w = Writer::new();
        qs.encode(&mut w);
        let bytes = w.into_bytes();
        for q in &qs.queues {
            if let Some(enc) = q.waiting.enc.get() {
                assert_eq!(*enc, encode_segment(&q.waiting), "step {step}: a kept queue encoding is stale");
            }
        }
        let plain = QueueSet::decode(&mut Reader::new(&bytes)).unwrap();
        assert_eq!(plain, qs);
        for back in [1usize, 2, 7] {
            let Some((_, prior)) = history.len().checked_sub(back).and_then(|i| history.get(i)) else { continue };
            let got = QueueSet::decode_reusing(&mut Reader::new(&bytes), Some(prior.clone())).unwrap();
            assert_eq!(got, plain, "step {step}: decoding with the state {back} steps back differs");
            reused += got
                .queues
                .iter()
                .zip(&prior.queues)
                .filter(|(a, b)| a.index == b.index && a.waiting.enc == b.waiting.enc && !a.waiting.is_empty())
                .count();
            let mut w = Writer::new();
            got.encode(&mut w);
            assert_eq!(w.into_bytes(), bytes, "step {step}: re-encoding differs");
        }
        // A prior newer than the value, and one of another configuration.
        if let Some((old, _)) = history.get(history.len().saturating_sub(5)) {
            assert_eq!(
                QueueSet::decode_reusing(&mut Reader::new(old), Some(qs.clone())).unwrap(),
                QueueSet::decode(&mut Reader::new(old)).unwrap()
            );
        }
        history.push((bytes, plain));
    }
    assert!(reused > 1000, "queues were reused only {reused} times");
    assert!(history.iter().any(|(_, q)| q.requests_waiting() > 10), "never saturated");
}

/// Each entry decodes back to its request, whatever it repeats of the entry before it, and
/// the entries end exactly where the segment ends.
#[test]
fn segment_entries_decode_back() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for _ in 0..2000 {
        let mut reqs = VecDeque::new();
        let mut id = 1 + rng.below(1 << 40);
        for _ in 0..1 + rng.below(6) {
            id += 1 + rng.below(3);
            let arrival = rng.below(1 << 50) as Nanos;
            let big = |r: u64| if r == 0 { u32::MAX } else { r as u32 };
            reqs.push_back(Waiting {
                id,
                tag: RequestTag {
                    owner: 1 + rng.below(2) as u32,
                    context: big(rng.below(4)),
                    flow_schema: rng.below(2) as u16,
                    flow_hash: rng.below(3) << 60,
                    wait_deadline: if rng.below(2) == 0 { Nanos::MAX } else { arrival + rng.below(1 << 35) as Nanos },
                },
                work: WorkEstimate {
                    initial_seats: 1 + rng.below(2) as u32,
                    final_seats: rng.below(2) as u32,
                    additional_latency: rng.below(2) as Nanos * MS,
                },
                arrival_r: rng.below(u64::MAX),
                arrival,
            });
        }
        let seg = encode_segment(&reqs);
        let mut d = Reader::new(&seg);
        let mut prev: Option<Waiting> = None;
        for want in &reqs {
            let got = QueueSet::decode_waiting(&mut d, prev.as_ref()).unwrap();
            assert_eq!(&got, want);
            prev = Some(got);
        }
        assert!(d.is_empty());
    }
}

/// `request_queue_length_after_enqueue`: the queue's length with the request in it, also for a
/// request dispatched at once (upstream enqueues, then dispatches); nothing for a rejection or
/// a level without queues.
#[test]
fn queue_length_after_enqueue() {
    let mut qs = QueueSet::new(cfg(1, 2, 1, 1), 0).unwrap();
    let mut out = Vec::new();
    let lens: Vec<Option<u32>> = (0..4).map(|k| qs.start_request(k, one(), tag(7), &mut out).queue_length).collect();
    assert_eq!(lens, vec![Some(1), Some(1), Some(2), None], "runs, waits, waits, queue full");
    let mut reject_level = QueueSet::new(cfg(0, 0, 0, 1), 0).unwrap();
    assert_eq!(reject_level.start_request(0, one(), tag(7), &mut out).queue_length, None);
}

#[test]
fn a_strict_limit_is_never_exceeded() {
    let strict = |q: i32, c: u32| QueueSetConfig { strict_limit: true, ..cfg(q, 10, 1, c) };
    let mut out = Vec::new();
    let w3 = WorkEstimate { initial_seats: 3, final_seats: 0, additional_latency: 0 };
    // Queuing: a request wider than the limit waits on an idle level until the limit grows.
    let mut qs = QueueSet::new(strict(4, 2), 0).unwrap();
    let Arrival::Queued(b) = qs.start_request(0, w3, tag(1), &mut out).arrival else { panic!() };
    assert_eq!((qs.seats_in_use(), qs.widest_waiting()), (0, 3));
    assert!(qs.reconfigure(strict(4, 3), SEC).unwrap().iter().map(|d| d.id).eq([b]));
    assert_eq!((qs.seats_in_use(), qs.widest_waiting()), (3, 0));
    // The state round-trips with its flag.
    let mut w = Writer { buf: Vec::new() };
    qs.encode(&mut w);
    assert_eq!(QueueSet::decode(&mut Reader::new(&w.buf)).unwrap().config(), strict(4, 3));
    // Without queues: at limit 0 (a replica without seats) nothing is admitted.
    let mut qs = QueueSet::new(strict(0, 0), 0).unwrap();
    assert_eq!(qs.start_request(0, one(), tag(1), &mut out).arrival, Arrival::Rejected(RejectReason::ConcurrencyLimit));
    assert_eq!(qs.seats_in_use(), 0);
}

/// `qs` through the codec, checked equal.
fn roundtrip(qs: &QueueSet) -> QueueSet {
    let mut w = Writer::new();
    qs.encode(&mut w);
    let back = QueueSet::decode(&mut Reader::new(&w.buf)).unwrap();
    assert_eq!(&back, qs);
    back
}

/// Random operations keep the cached totals consistent: the state survives an encode/decode
/// round trip unchanged after every operation (decoding recomputes every derived sum), and
/// draining it leaves it empty and idle.
#[test]
fn random_operations_keep_state_consistent() {
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15));
        let desired = [-1, 0, 1, 8, 64][(seed % 5) as usize];
        let c = 1 + rng.below(6) as u32;
        let cfg = QueueSetConfig {
            desired_queues: desired,
            queue_length_limit: 1 + rng.below(5) as u32,
            hand_size: if desired > 1 { 1 + rng.below(4) as u32 } else { 1 },
            concurrency_limit: c,
            strict_limit: false,
        };
        let mut qs = QueueSet::new(cfg, 0).unwrap();
        let mut now: Nanos = 0;
        let mut executing: Vec<Receipt> = Vec::new();
        let mut waiting: Vec<u64> = Vec::new();
        let mut out: Vec<Dispatched> = Vec::new();
        for step in 0..600 {
            now += rng.below(300_000_000) as Nanos;
            out.clear();
            match rng.below(10) {
                0..=4 => {
                    let tag = RequestTag {
                        owner: rng.below(3) as u32,
                        context: step,
                        flow_schema: 0,
                        flow_hash: rng.below(20),
                        wait_deadline: if rng.below(2) == 0 { now + rng.below(2_000_000_000) as Nanos } else { Nanos::MAX },
                    };
                    let work = WorkEstimate {
                        initial_seats: rng.below(4) as u32,
                        final_seats: rng.below(8) as u32,
                        additional_latency: rng.below(3) as Nanos * 100_000_000,
                    };
                    match qs.start_request(now, work, tag, &mut out).arrival {
                        Arrival::Executing(rc) => executing.push(rc),
                        Arrival::Queued(id) => waiting.push(id),
                        Arrival::Rejected(_) => {}
                    }
                }
                5..=7 => {
                    if !executing.is_empty() {
                        let i = rng.below(executing.len() as u64) as usize;
                        let rc = executing.swap_remove(i);
                        assert!(qs.finish(now, &rc, &mut out));
                        assert!(!qs.finish(now, &Receipt { owner: 3, ..rc }, &mut out), "unknown owner");
                    }
                }
                8 => {
                    if !waiting.is_empty() {
                        let i = rng.below(waiting.len() as u64) as usize;
                        let id = waiting.swap_remove(i);
                        let _ = qs.cancel(now, id);
                    }
                }
                _ => {
                    let mut to = Vec::new();
                    if rng.below(4) == 0 {
                        let owner = rng.below(3) as u32;
                        let _ = qs.remove_owner(owner, now, &mut out);
                        let (gone, kept): (Vec<Receipt>, Vec<Receipt>) = executing.iter().partition(|rc| rc.owner == owner);
                        executing = kept;
                        // Receipts of a reaped owner are refused.
                        if let Some(rc) = gone.first() {
                            assert!(!qs.finish(now, rc, &mut out));
                        }
                    } else if rng.below(3) == 0 {
                        let c2 = 1 + rng.below(6) as u32;
                        out.extend(qs.reconfigure(QueueSetConfig { concurrency_limit: c2, ..qs.config() }, now).unwrap());
                    } else {
                        qs.expire(now, &mut to, &mut out);
                    }
                    for (id, _) in to {
                        waiting.retain(|w| *w != id);
                    }
                }
            }
            for d in &out {
                waiting.retain(|w| *w != d.id);
                executing.push(d.receipt);
            }
            if desired > 0 {
                assert!(qs.seats_in_use() <= c.max(6) * 2 + 8, "seats {}", qs.seats_in_use());
            }
            qs = roundtrip(&qs);
        }
        // Drain everything: finish all that still executes, expire lingering.
        now += 1_000_000_000_000;
        let mut guard = 0;
        loop {
            out.clear();
            let mut to = Vec::new();
            qs.expire(now, &mut to, &mut out);
            for (id, _) in to {
                waiting.retain(|w| *w != id);
            }
            for rc in std::mem::take(&mut executing) {
                assert!(qs.finish(now, &rc, &mut out));
            }
            for d in &out {
                waiting.retain(|w| *w != d.id);
                executing.push(d.receipt);
            }
            for id in std::mem::take(&mut waiting) {
                qs.cancel(now, id);
            }
            now += 1_000_000_000_000;
            guard += 1;
            if (executing.is_empty() && qs.next_event().is_none() && qs.requests_waiting() == 0) || guard > 100 {
                break;
            }
        }
        assert!(qs.is_empty(), "seed {seed}: drained by finishes alone: {:?}", qs.snapshot());
        qs.remove_owner(0, now, &mut out);
        qs.remove_owner(1, now, &mut out);
        qs.remove_owner(2, now, &mut out);
        assert!(qs.is_idle(), "seed {seed}: {:?}", qs.snapshot());
        assert!(qs.is_empty(), "seed {seed}");
    }
}
