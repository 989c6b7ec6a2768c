//! The engine's global state across workers, natively: two "workers" share one MemStore (the
//! same CAS semantics as Envoy's shared data) and never exceed a level's seats; dispatches are
//! addressed to the owning worker; dead workers' seats come back through lease expiry.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/one_level.rs"]
mod one_level;
use apf_wasm::config::parse_plugin_config;
use apf_wasm::engine::store::MemStore;
use apf_wasm::engine::{self, Arriving, Compiled, Decision, NoticeKind};
use apf_wasm::fairqueuing::{RequestTag, WorkEstimate};
use apf_wasm::NANOS_PER_SEC;
use one_level::{one_level_json, Queuing};

const MS: i64 = 1_000_000;

/// One Limited level "test" with exactly `seats` seats.
fn config(seats: u32) -> Compiled {
    let q = Queuing { queues: 16, hand_size: 2, queue_length: 10 };
    let cfg = parse_plugin_config(one_level_json("test", seats, q, true).as_bytes()).unwrap();
    Compiled::new(cfg, 1)
}

fn level(c: &Compiled) -> usize {
    c.levels.iter().position(|l| l.name == "test").unwrap()
}

fn tag(owner: u32, context: u32, hash: u64, now: i64) -> RequestTag {
    RequestTag { owner, context, flow_schema: 0, flow_hash: hash, wait_deadline: now + 15 * NANOS_PER_SEC }
}

#[test]
fn two_workers_share_one_limit_and_wake_the_owner() {
    let c = config(4);
    let lvl = level(&c);
    assert_eq!(c.levels[lvl].qs_config.concurrency_limit, 4);
    let store = MemStore::new();
    let key = c.levels[lvl].key.to_string();
    let mut executing = Vec::new();
    let mut queued = Vec::new();
    let mut notices = Vec::new();
    // 10 requests alternate between worker 1 and worker 2.
    for i in 0..10u32 {
        let owner = 1 + (i % 2);
        match engine::admit(
            &c,
            &store,
            i as i64 * MS,
            Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(owner, 100 + i, i as u64 * 7919, 0) },
            &mut notices,
        )
        .unwrap()
        .0
        {
            Decision::Execute(id) => executing.push((owner, id)),
            Decision::Queued(id) => queued.push((owner, 100 + i, id)),
            Decision::Rejected { .. } => panic!("no rejection expected"),
        }
    }
    assert_eq!(executing.len(), 4, "exactly the level's seats execute");
    assert_eq!(queued.len(), 6);
    assert!(notices.is_empty());
    // A worker-1 request finishes: the dispatched one may belong to worker 2 — the notice says so.
    let (_, rc) = executing.remove(0);
    assert!(engine::finish(&store, 20 * MS, &key, &rc, &mut notices).unwrap());
    // a second finish with the same receipt changes nothing
    let mut more = Vec::new();
    assert!(!engine::finish(&store, 21 * MS, &key, &rc, &mut more).unwrap() || more.is_empty());
    assert_eq!(notices.len(), 1);
    let n = &notices[0];
    assert!(matches!(n.kind, NoticeKind::Run { .. }));
    assert!(queued.iter().any(|(o, ctx, qid)| *o == n.owner && *ctx == n.context && *qid == n.id));
    let st = engine::read_level(&store, &key).unwrap().unwrap();
    assert_eq!(st.qs.seats_in_use(), 4);
    assert_eq!(st.qs.requests_waiting(), 5);
}

#[test]
fn dead_worker_seats_are_reaped() {
    let c = config(2);
    let lvl = level(&c);
    let store = MemStore::new();
    let key = c.levels[lvl].key.to_string();
    let w1 = engine::heartbeat(&store, 0xaaaa, 0).unwrap();
    let w2 = engine::heartbeat(&store, 0xbbbb, 0).unwrap();
    let mut notices = Vec::new();
    // worker 1 takes both seats, worker 2 queues one.
    for i in 0..2 {
        assert!(matches!(
            engine::admit(&c, &store, 0, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(w1, i, i as u64, 0) }, &mut notices)
                .unwrap()
                .0,
            Decision::Execute(_)
        ));
    }
    assert!(matches!(
        engine::admit(&c, &store, 0, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(w2, 9, 99, 0) }, &mut notices).unwrap().0,
        Decision::Queued(_)
    ));
    // worker 2 keeps heart-beating; worker 1 dies.
    engine::heartbeat(&store, 0xbbbb, 4 * NANOS_PER_SEC).unwrap();
    let dead = engine::reap_dead_workers(&store, 6 * NANOS_PER_SEC, 5 * NANOS_PER_SEC, std::slice::from_ref(&key), &mut notices).unwrap();
    assert_eq!(dead.iter().map(|d| d.slot).collect::<Vec<_>>(), vec![w1]);
    assert_eq!(notices.len(), 1, "the queued request of the live worker is dispatched");
    assert_eq!(notices[0].owner, w2);
    let st = engine::read_level(&store, &key).unwrap().unwrap();
    assert_eq!(st.qs.seats_in_use(), 1);
    assert_eq!(st.qs.requests_waiting(), 0);
}

#[test]
fn stream_end_cancels_queued_and_releases_executing() {
    let c = config(1);
    let lvl = level(&c);
    let store = MemStore::new();
    let key = c.levels[lvl].key.to_string();
    let mut notices = Vec::new();
    let Decision::Execute(a) =
        engine::admit(&c, &store, 0, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(1, 1, 1, 0) }, &mut notices).unwrap().0
    else {
        panic!()
    };
    let Decision::Queued(b) =
        engine::admit(&c, &store, 0, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(1, 2, 2, 0) }, &mut notices).unwrap().0
    else {
        panic!()
    };
    // the queued client goes away: no dispatch happens, nothing leaks
    engine::end(&store, MS, &key, b, None, &mut notices).unwrap();
    assert!(notices.is_empty());
    engine::end(&store, 2 * MS, &key, a.id, Some(&a), &mut notices).unwrap();
    let st = engine::read_level(&store, &key).unwrap().unwrap();
    assert_eq!((st.qs.seats_in_use(), st.qs.requests_waiting()), (0, 0));
}

#[test]
fn wait_limit_times_out_with_retry_after() {
    let c = config(1);
    let lvl = level(&c);
    let store = MemStore::new();
    let key = c.levels[lvl].key.to_string();
    let mut notices = Vec::new();
    engine::admit(&c, &store, 0, Arriving { level: lvl, work: WorkEstimate::ONE, tag: tag(1, 1, 1, 0) }, &mut notices).unwrap();
    let mut t = tag(1, 2, 2, 0);
    t.wait_deadline = 500 * MS;
    engine::admit(&c, &store, 0, Arriving { level: lvl, work: WorkEstimate::ONE, tag: t }, &mut notices).unwrap();
    engine::expire_level(&store, 400 * MS, &key, &mut notices).unwrap();
    assert!(notices.is_empty());
    engine::expire_level(&store, 500 * MS, &key, &mut notices).unwrap();
    assert_eq!(notices.len(), 1);
    assert!(matches!(notices[0].kind, NoticeKind::Reject { retry_after: 1, .. }));
    assert_eq!(notices[0].context, 2);
}

#[test]
fn notices_roundtrip_and_garbage_is_rejected() {
    let n = engine::Notice {
        owner: 3,
        context: 77,
        level_key: "apf/v3/pl/x".into(),
        id: 12345,
        kind: NoticeKind::Run {
            waited: 42,
            receipt: apf_wasm::fairqueuing::Receipt {
                id: 12345,
                queue: 3,
                owner: 3,
                initial_seats: 1,
                max_seats: 2,
                start: 99,
                additional_latency: 0,
            },
        },
    };
    assert_eq!(engine::Notice::decode(&n.encode()).unwrap(), n);
    assert!(engine::Notice::decode(&[1, 2, 3]).is_err());
    assert!(engine::LevelState::decode(&[1, 0, 0, 0]).is_err());
}

#[test]
fn borrowing_runs_once_per_period_and_on_new_generation() {
    let c = config(4);
    let store = MemStore::new();
    let mut notices = Vec::new();
    assert!(engine::adjust_borrowing(&c, &store, 0, &mut notices).unwrap());
    assert!(!engine::adjust_borrowing(&c, &store, NANOS_PER_SEC, &mut notices).unwrap());
    assert!(engine::adjust_borrowing(&c, &store, 10 * NANOS_PER_SEC, &mut notices).unwrap());
    let lvl = level(&c);
    let st = engine::read_level(&store, &c.levels[lvl].key).unwrap().unwrap();
    assert_eq!(st.qs.config().concurrency_limit, 4, "lendable 0 / borrowing 0 keeps the nominal limit");
}

#[test]
fn watches_are_counted_per_worker_and_reaped_with_it() {
    use apf_wasm::digest::request_info::parse_request_info;
    use apf_wasm::engine::watches;
    let store = MemStore::new();
    let w = parse_request_info("GET", b"/api/v1/namespaces/foo/pods?watch=true");
    let k1 = watches::register(&store, 1, &w).unwrap().unwrap();
    watches::register(&store, 2, &parse_request_info("GET", b"/api/v1/pods?watch=true")).unwrap().unwrap();
    let create = parse_request_info("POST", b"/api/v1/namespaces/foo/pods");
    assert_eq!(watches::interested_count(&store, &create), 2);
    watches::forget(&store, 1, &k1).unwrap();
    assert_eq!(watches::interested_count(&store, &create), 1);
    watches::purge(&store, 2).unwrap();
    assert_eq!(watches::interested_count(&store, &create), 0);
}
