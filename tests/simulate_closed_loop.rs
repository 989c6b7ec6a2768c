//! Closed-loop clients (`roundTrip`, `serviceJitter`) against a measurement in real Envoy.
//!
//! Setup (Envoy on loopback): an 18-seat level (64 queues, hand size 8, queue length limit 50,
//! so nothing is rejected: at most 44 requests wait), a quiet client with 4 threads beside a
//! heavy client with 40, each thread a closed loop whose next request leaves 0.3 ms after the
//! previous response, upstream service time 50 ms. The quiet client alone would make
//! 4 / 50.3 ms = 79.5 calls/s ("standalone"). Envoy measured:
//! - constant 50 ms service: the quiet client keeps 67–72 % of its standalone throughput; its
//!   queue wait median ≈ 1 ms, p90 ≈ 49 ms, max ≈ 51 ms;
//! - ±20 % service jitter: 91–94 %, median ≈ 2 ms, p90 ≈ 7 ms.
//!
//! Why the quiet client loses so much with a constant service time (upstream's behaviour, see
//! the simulate module documentation, "Phase locking"): the seat its call frees goes at once
//! to a waiting heavy request, its next call arrives a round trip later, and seats free at the
//! same phases of the 50 ms period cycle after cycle, so it waits for the next seat to free at
//! a later phase — almost a full service time when the phases are bunched.
//!
//! What the simulator predicts (20 s window, hands of the two flows disjoint as the Envoy max
//! wait of ≈ 51 ms implies — see `hands_are_disjoint`):
//! - jitter ±20 %: 94.1 % (1 worker) / 94.2 % (2 workers), median 2.1 ms, p90 6.9 / 6.7 ms —
//!   within a few percent of Envoy; asserted: 91–96 %, median 1.5–2.8 ms, p90 5.5–8.5 ms.
//! - an exactly constant service time: 50.3 % and every call waits 49.7 ms — the limit of a
//!   perfect phase lock (the threads start 90 ns apart, so all 18 seats free within 4 µs of
//!   each other forever: no seat ever idles to shift its phase). Asserted exactly; this is
//!   below Envoy's 67–72 % because a real "constant" upstream is not constant to the
//!   microsecond.
//! - a constant service time with timer-scale noise, ±25 µs (`serviceJitter` 0.0005): 70.4 %
//!   (1 worker) / 73.4 % (2 workers), median 0.1 ms, p90 49.4–49.7 ms, max 49.7 ms — Envoy's
//!   figures. Asserted: 65–75 %, median < 1.5 ms, p90 48–50 ms, max 49.5–51 ms. This is a
//!   consistency check, not a prediction: the noise makes the bunched phases diffuse, so the
//!   figure grows with the noise amplitude and the run length (20 s: ±10 µs 51–57 %, ±25 µs
//!   70 %, ±50 µs 80 %, ±100 µs 86 %; ±25 µs over 10 s 65 %, over 40 s 75 %).
//! - the constant case as this repository's e2e harness serves it (tests/e2e, Python upstream
//!   asked for exactly 50 ms): the upstream's real service times were 50.08–53.9 ms (p50
//!   50.23 ms, p90 ≈ 51.0 ms: sleep overshoot) and the round trip ≈ 2.1 ms; Envoy measured the
//!   quiet client keeping 87.1–90.1 % (8 runs, 1 and 2 workers, mean 88.6 %), queue wait max
//!   43–49 ms. Given those measured service times (`serviceTimes`: their 100 quantiles,
//!   tests/fixtures/scenarios/closed_loop_measured.json) and that round trip, the simulator
//!   predicts 90.7 % (1 and 2 workers), max wait 48.1 ms. Asserted: 86–93 %.
//! - upstream's pacing (`think` 0, the next call issued when its predecessor's seat is
//!   released, before it is): the quiet client keeps ≈ 4 of its 4 seats (3.98) and never
//!   waits — which is why the default pacing is not a real client.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::fairqueuing::shuffle_sharding::Dealer;
use apf_wasm::simulate::{run_scenario_with, ClientResult, Options, SimulationResult};

const QUIET: u64 = 4_354_685_564_936_845_610;
const HEAVY: u64 = 6_018_027_440_424_183_571;
/// 4 threads × 1 / (50 ms + 0.3 ms).
const STANDALONE: f64 = 4.0 / 0.0503;

/// The scenario with each client's pacing (`"roundTrip":"300us"` or `"think":"0s"`) and jitter.
fn scenario(pacing: &str, jitter: f64) -> String {
    let jitter = if jitter > 0.0 { format!(r#","serviceJitter":{jitter}"#) } else { String::new() };
    format!(
        r#"{{"priorityLevel":{{"concurrencyLimit":18,"queues":64,"queueLengthLimit":50,"handSize":8}},"evalDuration":"20s",
            "clients":[{{"hash":"{QUIET}","threads":4,"calls":500,"exec":"50ms",{pacing}{jitter}}},
                       {{"hash":"{HEAVY}","threads":40,"calls":200,"exec":"50ms",{pacing}{jitter}}}]}}"#
    )
}

fn run(pacing: &str, jitter: f64, workers: u32) -> SimulationResult {
    let r =
        run_scenario_with(scenario(pacing, jitter).as_bytes(), &Options { workers: Some(workers), ..Options::default() }).unwrap().result;
    for c in &r.clients {
        assert_eq!(c.rejected.queue_full + c.rejected.concurrency_limit + c.rejected.time_out, 0, "{}", r.to_json());
    }
    // The heavy client is still saturating the level at the end of the window.
    assert!(r.clients[1].executed > 5_000, "{}", r.to_json());
    r
}

/// (share of standalone throughput, wait p50 / p90 / max in ms)
fn quiet(r: &SimulationResult) -> (f64, f64, f64, f64) {
    let c: &ClientResult = &r.clients[0];
    (c.throughput / STANDALONE, c.queue_wait.p50 * 1e3, c.queue_wait.p90 * 1e3, c.queue_wait.max * 1e3)
}

fn within(what: &str, v: f64, lo: f64, hi: f64) {
    assert!((lo..=hi).contains(&v), "{what} = {v}, want [{lo}, {hi}]");
}

#[test]
fn fixtures_are_these_scenarios() {
    // `apf simulate [--workers N] tests/fixtures/scenarios/closed_loop_{constant,jitter}.json`
    // reproduces the runs below.
    for (name, jitter) in [("closed_loop_constant", 0.0), ("closed_loop_jitter", 0.2)] {
        let path = format!("{}/tests/fixtures/scenarios/{name}.json", env!("CARGO_MANIFEST_DIR"));
        let file: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&scenario(r#""roundTrip":"300us""#, jitter)).unwrap();
        assert_eq!(file, ours, "{name}");
    }
}

#[test]
fn hands_are_disjoint() {
    // In Envoy the quiet flow never waited more than one service time (max ≈ 51 ms), so it
    // never queued behind heavy requests. With hands sharing queues, a quiet call sometimes
    // lands in a shared queue (the shortest of its hand by waiting work when it arrives) and
    // competes at the heavy flow's virtual time there: waits of 2–6 service times (with the
    // fixtures' hashes 1001001001 / 2002002002, whose hands share 4 of 8 queues: 47 %).
    let dealer = Dealer::new(64, 8).unwrap();
    let hand = |h: u64| {
        let (a, n) = dealer.deal_array(h);
        a[..n].to_vec()
    };
    let (q, h) = (hand(QUIET), hand(HEAVY));
    assert!(q.iter().all(|x| !h.contains(x)), "{q:?} {h:?}");
}

#[test]
fn jittered_service_matches_envoy() {
    for workers in [1, 2] {
        let (share, p50, p90, _) = quiet(&run(r#""roundTrip":"300us""#, 0.2, workers));
        eprintln!("jitter ±20 %, {workers} worker(s): {:.1} % of standalone, wait p50 {p50:.2} ms, p90 {p90:.2} ms", share * 100.0);
        within("share", share, 0.91, 0.96);
        within("p50 (ms)", p50, 1.5, 2.8);
        within("p90 (ms)", p90, 5.5, 8.5);
    }
}

#[test]
fn constant_service_phase_locks() {
    for workers in [1, 2] {
        // Exactly constant: every quiet call waits for the bunch of seats one period later.
        let r = run(r#""roundTrip":"300us""#, 0.0, workers);
        let (share, p50, p90, max) = quiet(&r);
        eprintln!(
            "constant, {workers} worker(s): {:.1} % of standalone, wait p50 {p50:.2} ms, p90 {p90:.2} ms, max {max:.2} ms",
            share * 100.0
        );
        within("share", share, 0.50, 0.51);
        for v in [p50, p90, max] {
            within("wait (ms)", v, 49.69, 49.71);
        }
        within("quiet seats", r.clients[0].average_seats, 1.99, 2.01);
        // With timer-scale noise (±25 µs) the bunch spreads a little: Envoy's figures.
        let (share, p50, p90, max) = quiet(&run(r#""roundTrip":"300us""#, 0.0005, workers));
        eprintln!(
            "constant ±25 µs, {workers} worker(s): {:.1} % of standalone, wait p50 {p50:.2} ms, p90 {p90:.2} ms, max {max:.2} ms",
            share * 100.0
        );
        within("share", share, 0.65, 0.75);
        within("p50 (ms)", p50, 0.0, 1.5);
        within("p90 (ms)", p90, 48.0, 50.0);
        within("max (ms)", max, 49.5, 51.0);
    }
}

#[test]
fn upstream_pacing_keeps_the_seats() {
    for workers in [1, 2] {
        let r = run(r#""think":"0s""#, 0.0, workers);
        let c = &r.clients[0];
        eprintln!("think 0, {workers} worker(s): quiet seats {:.3}, wait p50 {:.2} ms", c.average_seats, c.queue_wait.p50 * 1e3);
        within("quiet seats", c.average_seats, 3.9, 4.0);
        assert_eq!(c.queue_wait.p50, 0.0);
    }
}

#[test]
fn measured_service_times_predict_envoy() {
    let path = format!("{}/tests/fixtures/scenarios/closed_loop_measured.json", env!("CARGO_MANIFEST_DIR"));
    let both: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut alone = both.clone();
    alone["clients"].as_array_mut().unwrap().truncate(1);
    for workers in [1, 2] {
        let sim = |v: &serde_json::Value| {
            run_scenario_with(v.to_string().as_bytes(), &Options { workers: Some(workers), ..Options::default() }).unwrap().result
        };
        let (b, a) = (sim(&both), sim(&alone));
        let share = b.clients[0].throughput / a.clients[0].throughput;
        let w = &b.clients[0].queue_wait;
        eprintln!(
            "measured service times, {workers} worker(s): {:.1} % of standalone, wait p50 {:.2} ms, max {:.2} ms",
            share * 100.0,
            w.p50 * 1e3,
            w.max * 1e3
        );
        within("share", share, 0.86, 0.93);
        within("max wait (ms)", w.max * 1e3, 40.0, 51.0);
    }
}
