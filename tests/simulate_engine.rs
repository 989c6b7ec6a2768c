//! `apf simulate` runs the filter's admission path (the engine over a store with Envoy's
//! shared-data semantics, simulated workers, notices routed to their owner). With one worker
//! that path must be upstream's harness (`queueset_test.go: uniformScenario`, which drives the
//! QueueSet directly) event by event: the same calls arrive, start (after the same waits), end
//! and are rejected (for the same reasons) at the same times in the same order, for every
//! fixture in tests/fixtures/scenarios and for scenarios exercising what the fixtures do not
//! (wait limits, Reject levels, round trips, service jitter, lingering seats, large clocks).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::simulate::{run_scenario, run_scenario_with, CallKind, Options, Run};

fn run(data: &[u8], engine: bool, workers: u32) -> Run {
    let opts = Options { engine: Some(engine), workers: Some(workers), trace: true, record_calls: true };
    run_scenario_with(data, &opts).unwrap()
}

/// Runs `data` both ways with one worker and compares everything.
fn same_both_ways(name: &str, data: &[u8]) -> Run {
    let bare = run(data, false, 1);
    let engine = run(data, true, 1);
    assert!(!bare.calls.is_empty(), "{name}: no calls");
    assert_eq!(bare.calls.len(), engine.calls.len(), "{name}: number of call events");
    for (i, (b, e)) in bare.calls.iter().zip(&engine.calls).enumerate() {
        assert_eq!(b, e, "{name}: call event {i} differs (bare QueueSet vs engine)");
    }
    assert_eq!(bare.trace, engine.trace, "{name}: seat trace");
    assert_eq!(bare.result, engine.result, "{name}: result");
    assert_eq!(bare.result.to_json(), engine.result.to_json(), "{name}");
    // The default run is the engine path with the scenario's workers (1 unless it says).
    assert_eq!(run_scenario(data).unwrap(), engine.result, "{name}: default run");
    engine
}

#[test]
fn every_fixture_runs_the_same_through_the_engine() {
    let dir = format!("{}/tests/fixtures/scenarios", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    names.sort();
    assert!(names.len() >= 39, "{} fixtures", names.len());
    let (mut starts, mut queued) = (0usize, 0usize);
    for path in names {
        let data = std::fs::read(&path).unwrap();
        // Fleet scenarios (several replicas) run only through the engine: tests/simulate_fleet.rs.
        if serde_json::from_slice::<serde_json::Value>(&data).unwrap().get("replicas").is_some() {
            continue;
        }
        let r = same_both_ways(&path.display().to_string(), &data);
        for c in &r.calls {
            if let CallKind::Start { waited } = c.kind {
                starts += 1;
                queued += usize::from(waited > 0);
            }
        }
    }
    // The comparison covers dispatches from queues, not only immediate starts.
    assert!(starts > 5_000 && queued > 4_000, "{starts} starts, {queued} after queuing");
}

const LEVEL: &str = r#""priorityLevel":{"concurrencyLimit":2,"queues":9,"queueLengthLimit":3,"handSize":3}"#;

#[test]
fn wait_limits_and_rejections_are_the_same() {
    // Time-outs in queue (requestWaitLimit) and queue-full rejections.
    let s = format!(
        r#"{{{LEVEL},"evalDuration":"10s","requestWaitLimit":"1500ms",
            "clients":[{{"hash":"1001001001","threads":16,"calls":10,"exec":"1s","think":"0s"}},
                       {{"hash":2002002002,"threads":2,"calls":10,"exec":"1s","think":"1s"}}]}}"#
    );
    let r = same_both_ways("wait limits", s.as_bytes());
    let kinds: Vec<_> = r.calls.iter().filter_map(|c| if let CallKind::Reject(x) = c.kind { Some(x.as_str()) } else { None }).collect();
    assert!(kinds.contains(&"time-out") && kinds.contains(&"queue-full"), "{kinds:?}");
    // A Reject level (no queues): concurrency-limit.
    let s = r#"{"priorityLevel":{"concurrencyLimit":3},"evalDuration":"13s",
        "clients":[{"hash":"1001001001","threads":6,"calls":10,"exec":"1s","think":"57ms"},{"hash":"2002002002","threads":4,"calls":15,"exec":"1s","think":"750ms"}]}"#;
    let r = same_both_ways("reject level", s.as_bytes());
    assert!(r.result.clients.iter().any(|c| c.rejected.concurrency_limit > 0));
}

#[test]
fn closed_loop_clients_are_the_same() {
    // Round trips, jitter, lingering seats (additionalLatency, final seats wider than the
    // level), a start far from 0.
    let s = format!(
        r#"{{{LEVEL},"evalDuration":"20s","seed":42,"startTime":"2000000h",
            "clients":[{{"hash":"1001001001","threads":5,"calls":30,"exec":"500ms","roundTrip":"1ms","serviceJitter":0.3}},
                       {{"hash":"2002002002","threads":2,"calls":30,"exec":"300ms","roundTrip":"0s","finalSeats":3,"additionalLatency":"100ms"}},
                       {{"hash":"3003003003","threads":3,"calls":20,"exec":"700ms","think":"-1ns","initialSeats":2,"split":true}}]}}"#
    );
    let r = same_both_ways("closed loop", s.as_bytes());
    // Jitter: exec times differ from call to call.
    let mut execs = std::collections::BTreeSet::new();
    let mut start = std::collections::HashMap::new();
    for c in r.calls.iter().filter(|c| c.client == 0) {
        match c.kind {
            CallKind::Start { .. } => {
                start.insert((c.thread, c.call), c.t);
            }
            CallKind::End => {
                execs.insert(c.t - start[&(c.thread, c.call)]);
            }
            _ => {}
        }
    }
    assert!(execs.len() > 100 && execs.iter().all(|e| (350_000_000..=650_000_000).contains(e)), "{execs:?}");
}

#[test]
fn several_workers_run_the_same_calls() {
    // With several workers every call is served or rejected exactly once and no client is
    // starved.
    let dir = format!("{}/tests/fixtures/scenarios", env!("CARGO_MANIFEST_DIR"));
    for name in ["uniform_flows_hand_size3", "different_widths", "separations_12", "different_flows_without_queuing"] {
        let data = std::fs::read(format!("{dir}/{name}.json")).unwrap();
        let one = run(&data, true, 1);
        for workers in [2, 4] {
            let r = run(&data, true, workers);
            assert_eq!(r.result.workers, workers);
            let count = |r: &Run, f: fn(&CallKind) -> bool| r.calls.iter().filter(|c| f(&c.kind)).count();
            assert_eq!(
                count(&r, |k| matches!(k, CallKind::Arrive)),
                count(&r, |k| matches!(k, CallKind::Start { .. } | CallKind::Reject(_))),
                "{name} × {workers}"
            );
            assert_eq!(count(&r, |k| matches!(k, CallKind::Start { .. })), count(&r, |k| matches!(k, CallKind::End)), "{name} × {workers}");
            if name != "different_flows_without_queuing" {
                assert_eq!(
                    r.result.clients.iter().map(|c| c.executed).sum::<u64>(),
                    one.result.clients.iter().map(|c| c.executed).sum::<u64>(),
                    "{name} × {workers}"
                );
            }
        }
    }
}

#[test]
fn worker_option_and_scenario_field() {
    let base = r#"{"priorityLevel":{"concurrencyLimit":1,"queues":9,"queueLengthLimit":8,"handSize":3},"evalDuration":"4s","clients":[{"hash":1,"threads":2,"calls":3,"exec":"1s","think":"0s"}]"#;
    let with = |extra: &str| format!("{base}{extra}}}");
    assert_eq!(run_scenario(with("").as_bytes()).unwrap().workers, 1);
    assert_eq!(run_scenario(with(r#","workers":3"#).as_bytes()).unwrap().workers, 3);
    let o = Options { workers: Some(2), ..Options::default() };
    assert_eq!(run_scenario_with(with(r#","workers":3"#).as_bytes(), &o).unwrap().result.workers, 2);
    for (extra, want) in
        [(r#","workers":0"#, "workers"), (r#","workers":65"#, "workers"), (r#","engine":false,"workers":2"#, "bare QueueSet")]
    {
        let e = run_scenario(with(extra).as_bytes()).unwrap_err();
        assert!(e.to_string().contains(want), "{extra}: {e}");
    }
    let e = run_scenario_with(with("").as_bytes(), &Options { workers: Some(0), ..Options::default() }).unwrap_err();
    assert!(e.to_string().contains("workers"), "{e}");
    // engine: false is the bare QueueSet, same result with one worker.
    assert_eq!(run_scenario(with(r#","engine":false"#).as_bytes()).unwrap(), run_scenario(with("").as_bytes()).unwrap());
}
