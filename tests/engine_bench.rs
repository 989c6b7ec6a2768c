//! Native cost of the request path pieces (not a test: run with
//! `cargo test --release --test engine_bench -- --ignored --nocapture`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::codec::{Reader, Writer};
use apf_wasm::config::parse_plugin_config;
use apf_wasm::digest::identity::IdentityInput;
use apf_wasm::engine::compiled::RequestLine;
use apf_wasm::engine::store::MemStore;
use apf_wasm::engine::{self, Arriving, Compiled, Decision};
use apf_wasm::fairqueuing::queueset::{Arrival, QueueSet};
use apf_wasm::fairqueuing::{QueueSetConfig, Receipt, RequestTag, WorkEstimate};
use apf_wasm::Nanos;
use std::collections::VecDeque;
use std::time::Instant;

/// Iterations per measurement (`APF_BENCH_N`, default 200000; lower it under callgrind).
fn iterations() -> u32 {
    std::env::var("APF_BENCH_N").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000)
}

fn compiled() -> Compiled {
    let cfg = parse_plugin_config(br#"{"identity":{"sources":[{"type":"frontProxy"}]}}"#).unwrap();
    Compiled::new(cfg, 1)
}

#[test]
#[ignore]
fn bench_request_path() {
    let c = compiled();
    let headers: Vec<(&str, &[u8])> = vec![("x-remote-user", b"bench-user"), ("x-remote-group", b"system:authenticated")];
    let input = IdentityInput { headers: &headers, ..Default::default() };
    let n = iterations();
    let t = Instant::now();
    let mut lvl = 0;
    for _ in 0..n {
        let line = RequestLine { method: b"GET", path: b"/api/v1/namespaces/default/pods", namespace_header: None };
        let d = c.digest(line, &input, |_| 0, &apf_wasm::digest::work_estimate::no_cluster_stats);
        lvl = d.class.priority_level;
    }
    let digest_ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    let store = MemStore::new();
    let key = c.levels[lvl].key.to_string();
    let mut notices = Vec::new();
    let t = Instant::now();
    for i in 0..n {
        let tag = RequestTag { owner: 1, context: i, flow_schema: 0, flow_hash: 42, wait_deadline: i64::MAX };
        let now = i64::from(i) * 1000;
        let Decision::Execute(rc) =
            engine::admit(&c, &store, now, Arriving { level: lvl, work: apf_wasm::fairqueuing::WorkEstimate::ONE, tag }, &mut notices)
                .unwrap()
                .0
        else {
            panic!()
        };
        engine::end(&store, now + 500, &key, rc.id, Some(&rc), &mut notices).unwrap();
    }
    let engine_ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    let (v, _) = apf_wasm::engine::store::Store::get(&store, &key).unwrap();
    let bytes = v.unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let st = engine::LevelState::decode(&bytes).unwrap();
        std::hint::black_box(st.encode());
    }
    let codec_ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    println!("digest {digest_ns:.0} ns; admit+end {engine_ns:.0} ns; decode+encode {codec_ns:.0} ns; state {} bytes", bytes.len());
}

#[test]
#[ignore]
fn bench_digest_parts() {
    use apf_wasm::digest::identity::identify;
    use apf_wasm::digest::request_info::parse_request_info;
    use apf_wasm::digest::work_estimate::estimate;
    let c = compiled();
    let headers: Vec<(&str, &[u8])> = vec![("x-remote-user", b"bench-user"), ("x-remote-group", b"system:authenticated")];
    let input = IdentityInput { headers: &headers, ..Default::default() };
    let n = iterations();
    let time = |name: &str, f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        println!("{name}: {:.0} ns", t.elapsed().as_nanos() as f64 / f64::from(n));
    };
    let info = parse_request_info("GET", b"/api/v1/namespaces/default/pods");
    let user = identify(&c.config.identity, &input);
    time("parse_request_info", &mut || {
        std::hint::black_box(parse_request_info("GET", b"/api/v1/namespaces/default/pods"));
    });
    time("identify", &mut || {
        std::hint::black_box(identify(&c.config.identity, &input));
    });
    time("classify", &mut || {
        std::hint::black_box(c.classifier.classify(&info, &user));
    });
    time("flow_hash", &mut || {
        std::hint::black_box(apf_wasm::classify::flow_hash("global-default", "bench-user"));
    });
    time("estimate", &mut || {
        std::hint::black_box(estimate(&c.config.work_estimator, &info, Some(8), 0));
    });
}

/// The saturated shape of `bench/run.py --variants apf-saturated`: a 2-seat level with 16
/// clients in one flow (2 executing, 14 waiting). Per request: one arrival and one finish, each
/// a decode + operation + encode of the level's shared value, as the filter does.
#[test]
#[ignore]
fn bench_saturated_level() {
    use apf_wasm::engine::LevelState;
    use apf_wasm::fairqueuing::{QueueSetConfig, WorkEstimate};
    let cfg = QueueSetConfig { desired_queues: 16, queue_length_limit: 100, hand_size: 4, concurrency_limit: 2, strict_limit: false };
    let mut st = LevelState::new(cfg, 1, 0).unwrap();
    let mut out = Vec::new();
    let mut running = std::collections::VecDeque::new();
    let tag = |i: u32| RequestTag { owner: 1 + (i % 2), context: i, flow_schema: 0, flow_hash: 42, wait_deadline: i64::MAX };
    for i in 0..16u32 {
        if let apf_wasm::fairqueuing::queueset::Arrival::Executing(rc) = st.qs.start_request(0, WorkEstimate::ONE, tag(i), &mut out).arrival
        {
            running.push_back(rc);
        }
    }
    let mut bytes = st.encode();
    let n = iterations() / 4;
    let t = Instant::now();
    for i in 0..n {
        let now = i64::from(i) * 100_000 + 1_000_000;
        let rc = running.pop_front().unwrap();
        let mut s = LevelState::decode(&bytes).unwrap();
        out.clear();
        s.qs.finish(now, &rc, &mut out);
        running.extend(out.iter().map(|d| d.receipt));
        bytes = s.encode();
        let mut s = LevelState::decode(&bytes).unwrap();
        out.clear();
        let _ = s.qs.start_request(now, WorkEstimate::ONE, tag(16 + i), &mut out);
        bytes = s.encode();
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    println!(
        "saturated level: {ns:.0} ns per request (2 decode + op + encode); state {} bytes, {} waiting",
        bytes.len(),
        LevelState::decode(&bytes).unwrap().qs.requests_waiting()
    );
}

/// Encoding and decoding cost of a level's shared value by the number of waiting requests.
#[test]
#[ignore]
fn bench_codec_by_queue_length() {
    use apf_wasm::engine::LevelState;
    use apf_wasm::fairqueuing::{QueueSetConfig, WorkEstimate};
    for (seats, clients) in [(2u32, 16u32), (8, 64), (8, 128)] {
        let cfg =
            QueueSetConfig { desired_queues: 16, queue_length_limit: 100, hand_size: 4, concurrency_limit: seats, strict_limit: false };
        let mut st = LevelState::new(cfg, 1, 0).unwrap();
        let mut out = Vec::new();
        for i in 0..clients {
            let tag = RequestTag {
                owner: 1 + (i % 2),
                context: i,
                flow_schema: 0,
                flow_hash: 42 + u64::from(i % 4),
                wait_deadline: 30_000_000_000,
            };
            let _ = st.qs.start_request(i64::from(i) * 1000, WorkEstimate::ONE, tag, &mut out);
        }
        let bytes = st.encode();
        let n = iterations();
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(std::hint::black_box(&st).encode());
        }
        let enc = t.elapsed().as_nanos() as f64 / f64::from(n);
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(LevelState::decode(std::hint::black_box(&bytes)).unwrap());
        }
        let dec = t.elapsed().as_nanos() as f64 / f64::from(n);
        println!("{seats} seats, {} waiting: {} bytes, encode {enc:.0} ns, decode {dec:.0} ns", st.qs.requests_waiting(), bytes.len());
    }
}

/// The saturated shape of `bench/run.py` natively: a level of `APF_BENCH_SEATS` seats (default
/// 8), 64 closed-loop clients split over `APF_BENCH_WORKERS` threads (1 or 2, default 2) that
/// take turns, each with its own decoded-state cache as an Envoy worker has. Per request: one
/// admission and one end on the owner's thread. Reports ns per request and the contention
/// counters; under callgrind, compare instructions per request between 1 and 2 workers.
#[test]
#[ignore]
fn bench_saturated_workers() {
    use apf_wasm::engine::{contention, NoticeKind};
    use apf_wasm::fairqueuing::{Receipt, WorkEstimate};
    use std::sync::mpsc;
    let env = |k: &str, d: u32| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (seats, workers) = (env("APF_BENCH_SEATS", 8), env("APF_BENCH_WORKERS", 2).clamp(1, 2));
    let cfg = format!(
        r#"{{"identity":{{"sources":[{{"type":"frontProxy"}}]}},"serverConcurrencyLimit":{},"suggestedDefaults":false,"policy":[
        {{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration","metadata":{{"name":"l"}},
          "spec":{{"type":"Limited","limited":{{"nominalConcurrencyShares":4,"lendablePercent":0,"limitResponse":{{"type":"Queue","queuing":{{"queues":16,"handSize":4,"queueLengthLimit":100}}}}}}}}}},
        {{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{{"name":"s"}},
          "spec":{{"priorityLevelConfiguration":{{"name":"l"}},"matchingPrecedence":1000,"distinguisherMethod":{{"type":"ByUser"}},
            "rules":[{{"subjects":[{{"kind":"Group","group":{{"name":"system:authenticated"}}}}],"nonResourceRules":[{{"verbs":["*"],"nonResourceURLs":["*"]}}]}}]}}}}]}}"#,
        seats * 2
    );
    let c = std::sync::Arc::new(Compiled::new(parse_plugin_config(cfg.as_bytes()).unwrap(), 1));
    let store = std::sync::Arc::new(MemStore::new());
    let level = c.levels.iter().position(|l| l.key.contains("/l")).unwrap();
    let key = c.levels[level].key.to_string();
    enum Cmd {
        Arrive(u32, i64),
        End(Receipt, i64),
        Stop,
    }
    // Each worker thread answers a command with the receipts of the requests that now run.
    let mut txs = Vec::new();
    let (back_tx, back_rx) = mpsc::channel::<(Vec<Receipt>, contention::Contention)>();
    let mut handles = Vec::new();
    for w in 0..workers {
        let (tx, rx) = mpsc::channel::<Cmd>();
        txs.push(tx);
        let (c, store, key, back) = (c.clone(), store.clone(), key.clone(), back_tx.clone());
        handles.push(std::thread::spawn(move || {
            let store = apf_wasm::engine::store::WorkerStore::new(&*store);
            let mut notices = Vec::new();
            while let Ok(cmd) = rx.recv() {
                notices.clear();
                let mut run = Vec::new();
                match cmd {
                    Cmd::Arrive(ctx, now) => {
                        let tag = RequestTag { owner: w + 1, context: ctx, flow_schema: 0, flow_hash: 42, wait_deadline: i64::MAX };
                        if let Decision::Execute(rc) =
                            engine::admit(&c, &store, now, Arriving { level, work: WorkEstimate::ONE, tag }, &mut notices).unwrap().0
                        {
                            run.push(rc);
                        }
                    }
                    Cmd::End(rc, now) => engine::end(&store, now, &key, rc.id, Some(&rc), &mut notices).unwrap(),
                    Cmd::Stop => break,
                }
                run.extend(notices.iter().filter_map(|n| match n.kind {
                    NoticeKind::Run { receipt, .. } => Some(receipt),
                    _ => None,
                }));
                back.send((run, store.state.take())).unwrap();
            }
        }));
    }
    let n = iterations() / 4;
    let mut running: std::collections::VecDeque<Receipt> = std::collections::VecDeque::new();
    let mut totals = contention::Contention::default();
    let mut step = |cmd: Cmd, owner: u32, running: &mut std::collections::VecDeque<Receipt>| {
        txs[(owner - 1) as usize].send(cmd).unwrap();
        let (run, cont) = back_rx.recv().unwrap();
        running.extend(run);
        totals.writes += cont.writes;
        totals.decodes += cont.decodes;
        totals.reuses += cont.reuses;
    };
    for i in 0..64u32 {
        step(Cmd::Arrive(i, 0), 1 + i % workers, &mut running);
    }
    let t = Instant::now();
    for i in 0..n {
        let now = 1_000_000 + i64::from(i) * 50_000;
        let rc = running.pop_front().unwrap();
        step(Cmd::End(rc, now), rc.owner, &mut running);
        // The connection sends its next request (through the same worker).
        step(Cmd::Arrive(64 + i, now), rc.owner, &mut running);
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    for tx in &txs {
        tx.send(Cmd::Stop).unwrap();
    }
    for h in handles {
        h.join().unwrap();
    }
    let per = |v: u64| v as f64 / f64::from(n);
    println!(
        "{seats} seats, {workers} worker(s): {ns:.0} ns per request (incl. thread hand-offs); per request {:.2} writes, {:.2} decoded, {:.2} reused",
        per(totals.writes), per(totals.decodes), per(totals.reuses)
    );
}

/// A reader one operation behind on the saturated shape (8 seats, 64 clients, 16 queues, 56
/// waiting): decoding the value reusing its state's unchanged queues vs decoding from scratch,
/// as `engine::cache` may. `APF_BENCH_ONLY=reusing|scratch` runs one (for callgrind).
#[test]
#[ignore]
fn bench_decode_reusing_vs_scratch() {
    use apf_wasm::engine::LevelState;
    use apf_wasm::fairqueuing::queueset::Arrival;
    use apf_wasm::fairqueuing::{QueueSetConfig, WorkEstimate};
    let cfg = QueueSetConfig { desired_queues: 16, queue_length_limit: 100, hand_size: 4, concurrency_limit: 8, strict_limit: false };
    let mut st = LevelState::new(cfg, 1, 0).unwrap();
    let tag =
        |i: u32| RequestTag { owner: 1 + (i % 2), context: i, flow_schema: 0, flow_hash: 42 + u64::from(i % 8), wait_deadline: i64::MAX };
    let mut running = std::collections::VecDeque::new();
    let mut out = Vec::new();
    for i in 0..64u32 {
        if let Arrival::Executing(rc) = st.qs.start_request(0, WorkEstimate::ONE, tag(i), &mut out).arrival {
            running.push_back(rc);
        }
    }
    // (state before, encoded state after), alternating finish and arrival.
    let n = (iterations() / 20).max(1) as usize;
    let mut steps = Vec::with_capacity(n);
    for i in 0..n {
        let now = 1_000_000 + i as i64 * 50_000;
        let before = st.clone();
        let _ = before.encode(); // keeps its queues' encodings, as a cached state has them
        out.clear();
        match i % 2 {
            0 => {
                let rc = running.pop_front().unwrap();
                st.qs.finish(now, &rc, &mut out);
            }
            _ => {
                if let Arrival::Executing(rc) = st.qs.start_request(now, WorkEstimate::ONE, tag(64 + i as u32), &mut out).arrival {
                    running.push_back(rc);
                }
            }
        }
        running.extend(out.iter().map(|d| d.receipt));
        steps.push((before, st.encode()));
    }
    let only = std::env::var("APF_BENCH_ONLY").unwrap_or_default();
    type Step = (LevelState, Vec<u8>);
    let timed = |what: &str, f: &mut dyn FnMut(&Step, LevelState)| -> Option<f64> {
        if !only.is_empty() && only != what {
            return None;
        }
        let priors: Vec<LevelState> = steps.iter().map(|s| s.0.clone()).collect();
        let t = Instant::now();
        for (step, prior) in steps.iter().zip(priors) {
            f(step, prior);
        }
        Some(t.elapsed().as_nanos() as f64 / n as f64)
    };
    let reusing = timed("reusing", &mut |(_, after), s| {
        std::hint::black_box(LevelState::decode_reusing(after, Some(s)).unwrap());
    });
    let scratch = timed("scratch", &mut |(_, after), _| {
        std::hint::black_box(LevelState::decode(after).unwrap());
    });
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ns"));
    println!(
        "one operation behind, {} waiting: decode reusing the prior {}, decode from scratch {}",
        st.qs.requests_waiting(),
        show(reusing),
        show(scratch)
    );
}

/// ns per request of a QueueSet alone (arrive, dispatch, finish), optionally with a decode and
/// an encode of its state around each operation, and the largest encoded state.
fn queueset_ns_per_request(with_codec: bool, ops: u64) -> (f64, usize) {
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

/// The QueueSet alone: ns per request at 128 queues and 10k flows, and bytes of encoded state per
/// queued request.
#[test]
#[ignore]
fn bench_queueset() {
    let (ns, _) = queueset_ns_per_request(false, 2_000_000);
    println!("arrive+dispatch+finish, 128 queues, 10k flows, ~95 executing: {ns:.0} ns per request");
    let (ns, max_len) = queueset_ns_per_request(true, 200_000);
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
