//! QueueSet property test (random operations keep the cached totals consistent: the state
//! survives an encode/decode round trip unchanged, which recomputes every derived sum) and an
//! ignored benchmark (`cargo test --release --test fairqueuing_queueset -- --ignored --nocapture`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::codec::{Reader, Writer};
use apf_wasm::fairqueuing::queueset::{Arrival, QueueSet};
use apf_wasm::fairqueuing::{Dispatched, QueueSetConfig, Receipt, RequestTag, WorkEstimate};
use apf_wasm::Nanos;
use std::collections::VecDeque;
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn roundtrip(qs: &QueueSet) -> QueueSet {
    let mut w = Writer::new();
    qs.encode(&mut w);
    let back = QueueSet::decode(&mut Reader::new(&w.buf)).unwrap();
    assert_eq!(&back, qs);
    back
}

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

fn bench(with_codec: bool, ops: u64) -> (f64, usize) {
    let cfg = QueueSetConfig { desired_queues: 128, queue_length_limit: 50, hand_size: 6, concurrency_limit: 100, strict_limit: false };
    let mut qs = QueueSet::new(cfg, 0).unwrap();
    let mut bytes = Vec::new();
    let mut executing: VecDeque<Receipt> = VecDeque::new();
    let mut out = Vec::with_capacity(16);
    let mut now: Nanos = 1_000_000_000;
    let mut max_len = 0;
    let t0 = Instant::now();
    for i in 0..ops {
        now += 10_000;
        let flow = (i % 10_000).wrapping_mul(0x9E3779B97F4A7C15) ^ 0x1234_5678;
        let tag = RequestTag { owner: 1, context: i as u32, flow_schema: 3, flow_hash: flow, wait_deadline: now + 15_000_000_000 };
        out.clear();
        if with_codec {
            qs = QueueSet::decode(&mut Reader::new(&bytes)).unwrap_or(qs);
        }
        match qs.start_request(now, WorkEstimate::ONE, tag, &mut out).arrival {
            Arrival::Executing(rc) => executing.push_back(rc),
            Arrival::Queued(_) | Arrival::Rejected(_) => {}
        }
        executing.extend(out.iter().map(|d| d.receipt));
        if with_codec {
            let mut w = Writer::with_capacity(bytes.len() + 64);
            qs.encode(&mut w);
            bytes = w.into_bytes();
            max_len = max_len.max(bytes.len());
            qs = QueueSet::decode(&mut Reader::new(&bytes)).unwrap();
        }
        // keep ~95 executing: finish the oldest
        if executing.len() > 95 {
            let rc = executing.pop_front().unwrap();
            out.clear();
            qs.finish(now, &rc, &mut out);
            executing.extend(out.iter().map(|d| d.receipt));
        }
        if with_codec {
            let mut w = Writer::with_capacity(bytes.len() + 64);
            qs.encode(&mut w);
            bytes = w.into_bytes();
        }
    }
    let el = t0.elapsed().as_secs_f64();
    (el / ops as f64 * 1e9, max_len)
}

#[test]
#[ignore]
fn bench_queueset() {
    let (ns, _) = bench(false, 2_000_000);
    println!("arrive+dispatch+finish, 128 queues, 10k flows, ~95 executing: {ns:.0} ns per request");
    let (ns, max_len) = bench(true, 200_000);
    println!("same with decode+encode around each op: {ns:.0} ns per request (state up to {max_len} bytes)");
    // Bytes of encoded state per queued request.
    let cfg = QueueSetConfig { desired_queues: 128, queue_length_limit: 50, hand_size: 6, concurrency_limit: 1, strict_limit: false };
    let mut qs = QueueSet::new(cfg, 1_000_000_000_000).unwrap();
    let mut out = Vec::new();
    let size = |qs: &QueueSet| {
        let mut w = Writer::new();
        qs.encode(&mut w);
        w.buf.len()
    };
    let now = 1_000_000_000_000 + 5_000_000;
    qs.start_request(
        now,
        WorkEstimate::ONE,
        RequestTag { flow_hash: 1, wait_deadline: now + 15_000_000_000, ..Default::default() },
        &mut out,
    );
    let base = size(&qs);
    println!("one executing request: {base} bytes");
    let n = 1000u64;
    for i in 0..n {
        let t = now + i as i64 * 1000;
        let tag = RequestTag {
            owner: 3,
            context: 1000 + i as u32,
            flow_schema: 7,
            flow_hash: (i % 500).wrapping_mul(0x9E3779B97F4A7C15),
            wait_deadline: t + 15_000_000_000,
        };
        qs.start_request(t, WorkEstimate::ONE, tag, &mut out);
    }
    let full = size(&qs);
    println!(
        "{} queued: {full} bytes, {:.1} bytes per queued request",
        qs.requests_waiting(),
        (full - base) as f64 / qs.requests_waiting() as f64
    );
}
