#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Short, deterministic fuzzing of every input an attacker or a broken operator controls:
//! the `cargo fuzz` targets of `fuzz/src/targets.rs`, driven by the mutation fuzzer of
//! `fuzz/src/harness.rs` over the seed corpora in `fuzz/corpus/<target>/`.
//!
//! The default run is short (a few seconds per target). Longer: `scripts/fuzz.sh [SECONDS]` or
//! `APF_FUZZ_SECS=60 cargo test --test fuzz_targets -- --nocapture`; see the harness for the other
//! `APF_FUZZ_*` variables. A counting global allocator measures each input's peak live heap.

#[path = "../fuzz/src/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../fuzz/src/targets.rs"]
#[allow(dead_code)]
mod targets;

use std::cell::Cell;
use std::path::{Path, PathBuf};

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{LIVE, PEAK};

fn probe_reset() {
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
}

/// Peak live bytes since the last reset, above what was live at the reset.
fn probe_peak() -> usize {
    PEAK.with(Cell::get).saturating_sub(BASE.with(Cell::get))
}

thread_local! {
    static BASE: Cell<usize> = const { Cell::new(0) };
}

fn probe_reset_with_base() {
    probe_reset();
    BASE.with(|b| b.set(LIVE.with(Cell::get)));
}

const PROBE: harness::Probe = harness::Probe { reset: probe_reset_with_base, peak: probe_peak };

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn artifacts() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-artifacts")
}

/// Runs one target with its default short budget.
fn run(name: &str, iters: u64, secs: f64) {
    let (_, target, dict, max_len) = *targets::find(name).unwrap();
    let corpus = harness::load_corpus(&root().join("fuzz/corpus").join(name));
    assert!(!corpus.is_empty(), "no seed corpus in fuzz/corpus/{name}");
    let cfg = harness::Config::from_env(iters, secs, max_len);
    let s = harness::fuzz(name, target, corpus, dict, &cfg, Some(PROBE), &artifacts());
    eprintln!(
        "fuzz {name}: {} corpus + {} mutants in {:.2?} ({} accepted, pool {}), slowest input {:.2?}, peak heap {} KiB",
        s.corpus,
        s.execs.saturating_sub(s.corpus as u64),
        s.elapsed,
        s.accepted,
        s.pool,
        s.slowest,
        s.peak_bytes / 1024
    );
}

#[test]
fn fuzz_plugin_config() {
    run("plugin_config", 10_000, 6.0);
}

#[test]
fn fuzz_request_info() {
    run("request_info", 20_000, 4.0);
}

#[test]
fn fuzz_request_verb() {
    run("request_verb", 20_000, 4.0);
}

#[test]
fn fuzz_identity() {
    run("identity", 10_000, 4.0);
}

#[test]
fn fuzz_duration() {
    run("duration", 20_000, 2.0);
}

#[test]
fn fuzz_codec_reader() {
    run("codec_reader", 20_000, 2.0);
}

#[test]
fn fuzz_state_integrator() {
    run("state_integrator", 10_000, 2.0);
}

#[test]
fn fuzz_state_retry_after() {
    run("state_retry_after", 10_000, 2.0);
}

#[test]
fn fuzz_state_queueset() {
    run("state_queueset", 10_000, 3.0);
}

#[test]
fn fuzz_state_level() {
    run("state_level", 10_000, 3.0);
}

#[test]
fn fuzz_state_notice() {
    run("state_notice", 10_000, 1.0);
}

#[test]
fn fuzz_state_registry() {
    run("state_registry", 10_000, 1.0);
}

#[test]
fn fuzz_state_borrow() {
    run("state_borrow", 10_000, 1.0);
}

#[test]
fn fuzz_state_watches() {
    run("state_watches", 10_000, 1.0);
}

#[test]
fn fuzz_queueset_ops() {
    run("queueset_ops", 5_000, 4.0);
}

#[test]
fn fuzz_simulate() {
    run("simulate", 2_000, 6.0);
}

#[test]
fn fuzz_metrics_scan() {
    run("metrics_scan", 5_000, 3.0);
}

#[test]
fn fuzz_initial_events() {
    run("initial_events", 5_000, 2.0);
}

#[test]
fn fuzz_list_size() {
    run("list_size", 3_000, 2.0);
}

#[test]
fn fuzz_state_object_counts() {
    run("state_object_counts", 5_000, 1.0);
}

#[test]
fn fuzz_host_pairs() {
    run("host_pairs", 10_000, 1.0);
}

/// Scenarios too big to simulate are rejected quickly, before any allocation in proportion to
/// their size.
#[test]
fn huge_scenarios_are_rejected_quickly() {
    let client = |threads: u64, calls: u64| format!(r#"{{"hash":1,"threads":{threads},"calls":{calls},"exec":"1s","think":"0s"}}"#);
    let scenario = |clients: &[String]| {
        format!(
            r#"{{"priorityLevel":{{"concurrencyLimit":1,"queues":8,"queueLengthLimit":5,"handSize":3}},"evalDuration":"10s","clients":[{}]}}"#,
            clients.join(",")
        )
    };
    for (t, c) in [(1, 1_000_000_000u64), (1_000_000_000, 1), (1_000_000, 1_000_000), (1000, 1001), (u64::MAX, 2)] {
        let doc = scenario(&[client(t, c)]);
        probe_reset_with_base();
        let start = std::time::Instant::now();
        assert!(apf_wasm::simulate::run_scenario(doc.as_bytes()).is_err(), "{doc}");
        assert!(start.elapsed() < std::time::Duration::from_secs(1), "{doc} took {:?}", start.elapsed());
        assert!(probe_peak() < 1 << 20, "{doc} allocated {} bytes", probe_peak());
    }
    // Many clients whose sum is too big.
    let doc = scenario(&vec![client(1000, 1000); 2]);
    assert!(apf_wasm::simulate::run_scenario(doc.as_bytes()).is_err());
}

/// Every target has a corpus directory, and every corpus directory a target.
#[test]
fn corpus_dirs_match_targets() {
    for (name, ..) in targets::TARGETS {
        assert!(root().join("fuzz/corpus").join(name).is_dir(), "fuzz/corpus/{name} missing");
        assert!(root().join("fuzz/fuzz_targets").join(format!("{name}.rs")).is_file(), "fuzz/fuzz_targets/{name}.rs missing");
    }
    for e in std::fs::read_dir(root().join("fuzz/corpus")).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        assert!(targets::find(&n).is_some(), "fuzz/corpus/{n} has no target");
    }
}

/// The harness itself: reproducible mutants, and a failing target is caught and minimised.
#[test]
fn harness_is_deterministic_and_minimises() {
    let pool = vec![b"{\"a\": [1, 2, 3]}".to_vec()];
    let mut a = harness::Rng::new(7);
    let mut b = harness::Rng::new(7);
    for _ in 0..100 {
        assert_eq!(harness::mutant(&mut a, &pool, targets::CONFIG_DICT, 1024), harness::mutant(&mut b, &pool, targets::CONFIG_DICT, 1024));
    }
    fn picky(d: &[u8]) -> bool {
        assert!(!d.windows(2).any(|w| w == b"!!"), "found it");
        true
    }
    let cfg = harness::Config {
        iters: 0,
        budget: std::time::Duration::ZERO,
        seed: 1,
        timeout: std::time::Duration::from_secs(60),
        max_peak_bytes: usize::MAX,
        max_len: 64,
    };
    let r = std::panic::catch_unwind(|| harness::fuzz("selftest", picky, vec![b"abc!!def".to_vec()], &[], &cfg, None, &artifacts()));
    let msg = r.unwrap_err().downcast::<String>().unwrap();
    assert!(msg.contains("minimised (2 bytes"), "{msg}");
    assert!(msg.contains("b\"!!\""), "{msg}");
}

/// Adversarial length prefixes fail fast, without allocating in proportion to the claimed count.
#[test]
fn huge_counts_fail_without_allocating() {
    use apf_wasm::codec::{Reader, Writer};
    for claimed in [1u64 << 40, u64::MAX, 1 << 20, 1 << 32] {
        let mut w = Writer::new();
        w.u64(claimed);
        w.u64(0);
        let bytes = w.into_bytes();
        probe_reset_with_base();
        assert!(Reader::new(&bytes).count(1).is_err());
        assert!(Reader::new(&bytes).bytes().is_err());
        assert!(Reader::new(&bytes).str().is_err());
        for (name, target, ..) in targets::TARGETS.iter().filter(|t| t.0.starts_with("state_")) {
            // Length prefix at every position of a valid encoding.
            for seed in harness::load_corpus(&root().join("fuzz/corpus").join(name)) {
                for at in 0..=seed.len() {
                    let mut d = seed.clone();
                    d.splice(at..at, bytes.iter().copied());
                    d.truncate(at + bytes.len() + 16);
                    probe_reset_with_base();
                    let _ = target(&d);
                    assert!(probe_peak() < 1 << 20, "{name}: count {claimed} at {at} allocated {} bytes", probe_peak());
                }
            }
        }
    }
}

/// Regenerates fuzz/corpus/host_pairs with the host's serialization:
/// `cargo test --test fuzz_targets -- --ignored write_host_pairs_corpus`.
#[test]
#[ignore = "regenerates fuzz/corpus/host_pairs"]
fn write_host_pairs_corpus() {
    use apf_wasm::gateway::host::serialize_pairs;
    let request: &[(&str, &[u8])] = &[
        (":method", b"GET"),
        (":path", b"/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true"),
        (":authority", b"kubernetes.default.svc"),
        ("x-remote-user", b"alice"),
        ("x-remote-group", b"dev"),
        ("x-remote-group", b"system:authenticated"),
    ];
    let request = serialize_pairs(request);
    write_corpus("host_pairs", "request", &request);
    write_corpus("host_pairs", "empty", &serialize_pairs(&[]));
    write_corpus("host_pairs", "call-response", &serialize_pairs(&[(":status", b"200"), ("content-type", b"text/plain; version=0.0.4")]));
    // A JWT list claim as Envoy serializes a list property: the items as names, values empty.
    write_corpus("host_pairs", "list-claim", &serialize_pairs(&[("jwt-team", b""), ("qa", b"")]));
    write_corpus("host_pairs", "odd-bytes", &serialize_pairs(&[("", b""), ("n\0ul", b"\0\xff\n:"), ("\u{e9}", b"")]));
    // Cut in the count, in the size table, in a name, before the last NUL.
    for at in [3, 13, 60, request.len() - 1] {
        write_corpus("host_pairs", &format!("request-cut-{at}"), &request[..at]);
    }
    write_corpus("host_pairs", "lines", b":status:200\ncontent-type:application/json\nx-remote-group:dev");
}

fn write_corpus(target: &str, name: &str, bytes: &[u8]) {
    let dir = root().join("fuzz/corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// Regenerates the binary seed corpora with the real encoders:
/// `cargo test --test fuzz_targets -- --ignored write_state_corpus`.
#[test]
#[ignore = "regenerates fuzz/corpus/{codec_reader,state_*}"]
fn write_state_corpus() {
    use apf_wasm::codec::Writer;
    use apf_wasm::limits::integrator::Integrator;
    use apf_wasm::limits::retry_after::DroppedRequestsTracker;
    const S: i64 = 1_000_000_000;

    let mut igr = Integrator::new(1_700_000_000 * S);
    let mut w = Writer::new();
    igr.encode(&mut w);
    write_corpus("state_integrator", "new", &w.into_bytes());
    igr.add(1_700_000_000 * S, 3.0);
    igr.set(1_700_000_001 * S, 2.0);
    igr.add(1_700_000_001 * S + 1_000_000, -1.0);
    let mut w = Writer::new();
    igr.encode(&mut w);
    write_corpus("state_integrator", "busy", &w.into_bytes());
    let _ = igr.reset(1_700_000_002 * S);
    let mut w = Writer::new();
    igr.encode(&mut w);
    write_corpus("state_integrator", "reset", &w.into_bytes());

    let mut t = DroppedRequestsTracker::default();
    let mut w = Writer::new();
    t.encode(&mut w);
    write_corpus("state_retry_after", "new", &w.into_bytes());
    for (i, sec) in [100i64, 100, 100, 101, 101, 101, 101, 102, 103, 103, 103, 103, 103, 103, 110, 111, 112, 113].iter().enumerate() {
        t.record_dropped(*sec);
        if i % 6 == 5 {
            let mut w = Writer::new();
            t.encode(&mut w);
            write_corpus("state_retry_after", &format!("after-{i}"), &w.into_bytes());
        }
    }

    // codec_reader: 16 operation bytes, then the values.
    let mut w = Writer::new();
    let ops: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 5, 9, 8];
    for op in ops {
        w.u8(op);
    }
    w.u8(7);
    w.u8(1);
    w.u64(u64::MAX);
    w.u32(u32::MAX);
    w.usize(12345);
    w.i64(i64::MIN);
    w.i32(-7);
    w.fixed64(0xdead_beef);
    w.f64(0.977);
    w.bytes(&[1, 2, 3]);
    w.str("héllo");
    w.usize(2);
    w.u64(300);
    w.i64(-300);
    w.bytes(b"");
    w.f64(f64::NAN);
    write_corpus("codec_reader", "all-ops", &w.into_bytes());
    write_corpus("codec_reader", "varints", &[2, 2, 2, 5, 5, 11, 0x80, 0x01, 0xff, 0x7f, 0x01, 0x02, 0x03, 0x03, 0x00]);
    write_queueing_corpus();
}

fn write_queueing_corpus() {
    use apf_wasm::codec::Writer;
    use apf_wasm::engine::workers::Registry;
    use apf_wasm::engine::{LevelState, Notice, NoticeKind};
    use apf_wasm::fairqueuing::queueset::QueueSet;
    use apf_wasm::fairqueuing::{QueueSetConfig, RejectReason, RequestTag, WorkEstimate};
    const S: i64 = 1_000_000_000;
    let now = 1_700_000_000 * S;
    let configs = [
        ("queuing", QueueSetConfig { desired_queues: 8, queue_length_limit: 5, hand_size: 3, concurrency_limit: 2, strict_limit: false }),
        ("one-queue", QueueSetConfig { desired_queues: 1, queue_length_limit: 3, hand_size: 1, concurrency_limit: 1, strict_limit: false }),
        ("reject", QueueSetConfig { desired_queues: 0, queue_length_limit: 0, hand_size: 0, concurrency_limit: 3, strict_limit: false }),
        ("exempt", QueueSetConfig { desired_queues: -1, queue_length_limit: 0, hand_size: 0, concurrency_limit: 0, strict_limit: false }),
    ];
    for (name, cfg) in configs {
        let mut st = LevelState::new(cfg, 3, now).unwrap();
        write_corpus("state_level", &format!("{name}-new"), &st.encode());
        let mut out = Vec::new();
        let mut first = None;
        for i in 0..9u32 {
            let t = now + i64::from(i) * 1_000_000;
            let work = WorkEstimate { initial_seats: 1 + i % 2, final_seats: i % 3, additional_latency: i64::from(i % 2) * 5_000_000 };
            let tag = RequestTag {
                owner: i % 2,
                context: i,
                flow_schema: (i % 3) as u16,
                flow_hash: u64::from(i % 4) * 0x1234_5678_9abc,
                wait_deadline: if i % 4 == 0 { i64::MAX } else { t + 15 * S },
            };
            if let apf_wasm::fairqueuing::queueset::Arrival::Executing(rc) = st.qs.start_request(t, work, tag, &mut out).arrival {
                first = first.or(Some(rc));
            }
            st.demand.set(t, f64::from(st.qs.seat_demand()));
            if let (6, Some(rc)) = (i, first) {
                st.qs.finish(t, &rc, &mut out);
                st.dropped.record_dropped(t / S);
            }
        }
        let mut w = Writer::new();
        st.qs.encode(&mut w);
        write_corpus("state_queueset", name, &w.into_bytes());
        write_corpus("state_level", &format!("{name}-busy"), &st.encode());
        let mut w = Writer::new();
        QueueSet::new(cfg, now).unwrap().encode(&mut w);
        write_corpus("state_queueset", &format!("{name}-new"), &w.into_bytes());
    }
    let notices = [
        Notice {
            owner: 1,
            context: 42,
            level_key: "apf/level/workload-low".into(),
            id: 7,
            kind: NoticeKind::Run {
                waited: 12_345,
                receipt: apf_wasm::fairqueuing::Receipt {
                    id: 7,
                    queue: 2,
                    owner: 1,
                    initial_seats: 1,
                    max_seats: 1,
                    start: 5,
                    additional_latency: 0,
                },
            },
        },
        Notice {
            owner: 0,
            context: 0,
            level_key: String::new(),
            id: u64::MAX,
            kind: NoticeKind::Reject { reason: RejectReason::TimeOut, retry_after: 32 },
        },
        Notice {
            owner: u32::MAX,
            context: 9,
            level_key: "é".into(),
            id: 1,
            kind: NoticeKind::Reject { reason: RejectReason::QueueFull, retry_after: 1 },
        },
    ];
    for (i, n) in notices.iter().enumerate() {
        write_corpus("state_notice", &format!("n{i}"), &n.encode());
    }
    let mut reg = Registry::default();
    write_corpus("state_registry", "empty", &reg.encode());
    for (i, inst) in [0xdead_beef_u64, 42, u64::MAX].iter().enumerate() {
        reg.heartbeat(*inst, now + i as i64 * S);
    }
    write_corpus("state_registry", "three", &reg.encode());
    let mut watches = apf_wasm::digest::work_estimate::WatchTracker::new();
    let mut w = Writer::new();
    watches.encode(&mut w);
    write_corpus("state_watches", "empty", &w.into_bytes());
    for t in [
        "/api/v1/namespaces/ns/pods?watch=1",
        "/api/v1/watch/configmaps",
        "/apis/apps/v1/namespaces/a/deployments/d?watch=true",
        "/api/v1/namespaces/ns/pods?watch=1",
    ] {
        let _ = watches.register(&apf_wasm::digest::request_info::parse_request_info("GET", t.as_bytes()));
    }
    let mut w = Writer::new();
    watches.encode(&mut w);
    write_corpus("state_watches", "some", &w.into_bytes());
    let bs = apf_wasm::engine::BorrowState::default();
    write_corpus("state_borrow", "default", &bs.encode());
    let mut w = Writer::new();
    w.f64(2.5);
    w.f64(0.5);
    w.i64(7);
    w.f64(3.0);
    let stats = apf_wasm::limits::borrowing::SeatDemandStats::decode(&mut apf_wasm::codec::Reader::new(&w.into_bytes())).unwrap();
    let bs = apf_wasm::engine::BorrowState {
        last: now,
        generation: 4,
        levels: vec![("global-default".into(), stats, 49), ("workload-low".into(), stats, 245), ("exempt".into(), stats, 0)],
        fair_frac: 0.75,
    };
    write_corpus("state_borrow", "three-levels", &bs.encode());
    // queueset_ops: config bytes then 4-byte steps.
    write_corpus(
        "queueset_ops",
        "mixed",
        &[
            10, 5, 3, 2, 0, 1, 1, 9, 0, 2, 2, 8, 1, 3, 3, 7, 2, 0, 0, 0, 4, 0, 0, 0, 5, 10, 10, 0, 0, 4, 4, 1, 3, 1, 0, 0, 7, 0, 1, 0, 7,
            1, 5, 4,
        ],
    );
    write_corpus("queueset_ops", "exempt", &[1, 0, 0, 0, 0, 1, 1, 1, 0, 2, 2, 2, 2, 0, 0, 0, 6, 3, 0, 0, 4, 0, 0, 0]);
    write_corpus("queueset_ops", "reject", &[2, 0, 0, 1, 0, 1, 1, 1, 0, 1, 1, 1, 2, 1, 0, 0, 0, 1, 1, 1]);
}

// ---------------------------------------------------------------------------------------------
// fleet: etcd JSON API responses

#[test]
fn fuzz_etcd_response() {
    run("etcd_response", 5_000, 3.0);
}

/// Regenerates `fuzz/corpus/etcd_response` from the in-memory etcd model's answers to a replica:
/// `cargo test --test fuzz_targets -- --ignored write_etcd_response_corpus`.
#[test]
#[ignore = "regenerates fuzz/corpus/etcd_response"]
fn write_etcd_response_corpus() {
    use apf_wasm::etcd;
    use apf_wasm::fleet::{Fleet, FleetConfig, FleetPolicy};
    use apf_wasm::limits::borrowing::SeatDemandStats;
    use apf_wasm::simulate::memetcd::MemEtcd;
    const S: i64 = 1_000_000_000;
    let policy = FleetPolicy::new(100, &apf_wasm::policy::default_policy().priority_levels);
    let mut etcd = MemEtcd::with_auth(&[("apf", "pw")], 300 * S);
    let mut cfg = FleetConfig::from_json(&serde_json::json!({"etcd": {"cluster": "etcd"}})).unwrap();
    cfg.etcd.credentials = Some(apf_wasm::fleet::config::Credentials { username: "apf".into(), password: "pw".into() });
    let mut seen: Vec<(String, Vec<u8>)> = Vec::new();
    let selector = |path: &str, status: u16, txn_range: bool| -> u8 {
        let kind = match path {
            etcd::KV_RANGE => 0,
            etcd::KV_TXN if txn_range => 0,
            etcd::KV_TXN => 1,
            etcd::LEASE_GRANT => 2,
            etcd::LEASE_KEEPALIVE => 3,
            etcd::AUTHENTICATE => 4,
            _ => 5,
        };
        let st = match status {
            200 => 0,
            0 => 3,
            400 => 4,
            401 => 5,
            404 => 6,
            _ => 7,
        };
        kind | (st << 3)
    };
    let mut fleets: Vec<Fleet> = ["gw-a", "gw-b"].iter().map(|id| Fleet::new(cfg.clone(), policy.clone(), id).unwrap()).collect();
    for (i, f) in fleets.iter_mut().enumerate() {
        let d = SeatDemandStats { avg: 3.5 + i as f64, std_dev: 1.25, high_watermark: 6, smoothed: 4.0 };
        f.set_local_demand(&vec![d; policy.levels.len()]);
    }
    for t in 0..4 {
        let now = 1_000 * S + t * S;
        if t == 3 {
            // An expired token and a lease gone: error answers.
            etcd.restart(now);
            let id = fleets[0].lease().unwrap();
            etcd.handle(etcd::LEASE_REVOKE, &[], &etcd::lease_id_request(id), now);
        }
        for f in fleets.iter_mut() {
            let mut calls = f.tick(now);
            while let Some(c) = calls.pop() {
                let (status, body) = etcd.handle(c.path, &c.headers, &c.body, now);
                seen.push((
                    format!("{}-{status}", c.path.trim_start_matches("/v3/").replace('/', "-")),
                    vec![selector(c.path, status, false)].into_iter().chain(body.iter().copied()).collect(),
                ));
                if c.path == etcd::KV_TXN && status == 200 {
                    // The range inside the answer, alone, and the records in it.
                    let t = etcd::TxnResponse::decode(status, &body).unwrap();
                    if let Some(r) = t.range() {
                        let range = serde_json::to_vec(&r.to_json()).unwrap();
                        seen.push(("range-in-txn".into(), vec![0].into_iter().chain(range).collect()));
                        for kv in &r.kvs {
                            seen.push(("record".into(), vec![6].into_iter().chain(kv.value.iter().copied()).collect()));
                        }
                    }
                }
                calls.extend(f.on_response(c.id, status, &body, now));
            }
        }
    }
    // The state machine given a few of these answers to every call.
    let fleet_inputs: Vec<Vec<u8>> = seen
        .iter()
        .filter(|(n, _)| n.starts_with("kv-txn-200") || n.starts_with("lease-keepalive"))
        .take(3)
        .map(|(_, d)| {
            let mut d = d.clone();
            d[0] = (d[0] & !7) | 7;
            d
        })
        .collect();
    let dir = root().join("fuzz/corpus/etcd_response");
    let _ = std::fs::remove_dir_all(&dir);
    let mut names = std::collections::BTreeMap::new();
    for (name, bytes) in seen.into_iter().chain(fleet_inputs.into_iter().map(|d| ("fleet".to_string(), d))) {
        let n = names.entry(name.clone()).or_insert(0);
        *n += 1;
        if *n <= 3 {
            write_corpus("etcd_response", &format!("{name}-{n}"), &bytes);
        }
    }
}
