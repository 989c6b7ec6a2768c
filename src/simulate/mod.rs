//! Deterministic discrete-event simulator behind `apf simulate`: upstream's `uniformScenario`
//! harness (`queueset_test.go`) driving the filter's admission path — the engine
//! (`crate::engine`: `admit`, `finish`, `expire_level` over a store with the semantics of
//! Envoy's shared data) with `workers` simulated Envoy workers — on a virtual clock. The
//! scenario's fields are those of `apf simulate --help` (0 `queues`: a Reject level; durations
//! are Go durations or integer nanoseconds); why a closed-loop client beside a heavier flow gets
//! less than its fair share with a constant service time (phase locking): docs/simulate.md.
//!
//! # Clients
//! Thread `j` of client `i` starts at `90·j + 20·i` ns (a `split` client starts its second half
//! of threads at `evalDuration/2` with half the calls), is a connection to worker
//! `(i + j) mod workers` and makes `calls` synchronous calls; a rejected or timed-out call
//! stops its thread. A call's handler runs `exec` (drawn by [`jitter`] with `serviceJitter`, or
//! one of the measured `serviceTimes`),
//! then returns (the request may keep its seats for `additionalLatency`). With `think`
//! (upstream `uniformClient`) the next call arrives `exec + think` after the previous one was
//! *dispatched*, so with `think` 0 just before its predecessor's seat is released; with
//! `roundTrip` (a real closed-loop client) that long after the previous handler returned.
//!
//! The flow hash is used as is, as upstream's harness does. The shuffle-sharding dealer reads
//! it as digits (in bases `queues`, `queues − 1`, …), so a small hash (such as upstream's
//! `1001001001`) deals a hand whose last cards are the lowest queues: with 64 queues and hands
//! of 8, `1001001001` and `2002002002` share 4 queues. Real flow hashes are 64-bit.
//!
//! # Workers
//! Each worker is an Envoy worker of the filter ([`engine_level`]). With any number of them
//! the dispatch order, times and rejections are the bare QueueSet's (upstream's harness,
//! `"engine": false`; tests/simulate_engine.rs compares them event by event with one worker):
//! the dispatch order does not depend on which worker dispatches. Not modelled: borrowing
//! between levels (upstream's harness has none), mailbox latency (a notice for another worker
//! is handled at once), CAS conflicts (workers take turns), lease expiry (workers never die).
//!
//! # Fleets
//! With `"replicas": N` the level is shared by a fleet of N gateway processes (fleet mode,
//! docs/fleet.md): each replica has its own store, `workers` workers and clients (a client's
//! `replica`, by default client `i` on replica `i mod N`), and drives the production fleet code
//! (`crate::fleet::FleetFeed` over `crate::fleet::Fleet`) as the gateway does, against one
//! in-memory etcd (`crate::simulate::memetcd::MemEtcd`; `src/simulate/fleet.rs`). `fleet` sets the
//! plugin configuration's `period` and `leaseTtl` and the etcd round trip `etcdDelay`. The
//! result's [`FleetResult`] has every replica's seats per period and the fleet-wide maximum of
//! seats in use, which fleet mode is to keep at or below the level's `concurrencyLimit`.
//!
//! # Results
//! [`ClientResult`]; seats are integrated as the upstream harness does, from exact integer
//! integrals (seat·ns). Upstream's fake event clock runs all events due at one instant
//! concurrently (in an unspecified order) before advancing; here events are processed in
//! (time, scheduling order), which is one of those orders, so the same input gives the same
//! bytes.

mod admission;
mod engine_level;
mod error;
mod event_loop;
mod fleet;
mod jitter;
pub mod memetcd;
mod results;
mod scenario;

pub use results::{
    CallEvent, CallKind, ClientResult, FleetResult, QueueWait, Rejections, ReplicaResult, SeatChange, SeatTrace, SimulationResult,
};

use crate::engine::store::MemStore;
use crate::Nanos;
use admission::{Admission, BareQueueSet};
use engine_level::EngineLevel;
pub use error::{SimError, SimErrorKind};
use event_loop::EventLoop;
use fleet::FleetLevels;
use results::Accounts;
use scenario::Scenario;

/// Upper bound on the total number of calls (Σ threads × calls).
pub const MAX_TOTAL_CALLS: i64 = 1_000_000;
/// Bound on the threads of all clients together (each thread is simulated state).
pub const MAX_TOTAL_THREADS: i64 = 100_000;
/// Bound on the simulated Envoy workers (per replica).
pub const MAX_WORKERS: u32 = 64;
/// Bound on the replicas of a fleet.
pub const MAX_REPLICAS: u32 = 32;

/// How to run a scenario ([`run_scenario_with`]); the default runs it as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Overrides the scenario's `workers` (`apf simulate --workers N`).
    pub workers: Option<u32>,
    /// Overrides the scenario's `engine`: false drives the bare QueueSet as upstream's harness
    /// does (one owner, no store), for comparison with the engine path.
    pub engine: Option<bool>,
    /// Records every change of a client's executing seats ([`Run::trace`]).
    pub trace: bool,
    /// Records every call's arrival, start, end and rejection ([`Run::calls`]).
    pub record_calls: bool,
}

/// The outcome of [`run_scenario_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub result: SimulationResult,
    /// Empty `changes` unless [`Options::trace`].
    pub trace: SeatTrace,
    /// Empty unless [`Options::record_calls`]; in processing order (times never decrease).
    pub calls: Vec<CallEvent>,
}

/// Runs one scenario (JSON, see the module documentation) to completion.
pub fn run_scenario(json: &[u8]) -> Result<SimulationResult, SimError> {
    run_scenario_with(json, &Options::default()).map(|r| r.result)
}

/// Like [`run_scenario`], also recording every client's executing seats over time.
pub fn run_scenario_traced(json: &[u8]) -> Result<(SimulationResult, SeatTrace), SimError> {
    run_scenario_with(json, &Options { trace: true, ..Options::default() }).map(|r| (r.result, r.trace))
}

/// `a + b` on the virtual clock.
fn add_time(a: Nanos, b: Nanos) -> Result<Nanos, SimError> {
    a.checked_add(b).ok_or_else(|| SimError::scenario("scenario times overflow the clock"))
}

/// Runs one scenario with [`Options`].
pub fn run_scenario_with(json: &[u8], opts: &Options) -> Result<Run, SimError> {
    let mut sc = Scenario::parse(json)?;
    if let Some(w) = opts.workers {
        sc.workers = scenario::ranged(w.into(), 1, MAX_WORKERS.into(), "workers")?;
    }
    sc.engine = opts.engine.unwrap_or(sc.engine);
    scenario::check_workers(sc.engine, sc.workers)?;
    scenario::check_fleet(sc.engine, sc.fleet.as_ref())?;
    let bounds = [sc.start, add_time(sc.start, sc.eval / 2)?, add_time(sc.start, sc.eval)?];
    let acc = Accounts::new(sc.clients.len(), bounds, opts);
    // One store per process: the replicas of a fleet, else one.
    let stores: Vec<MemStore> = (0..sc.fleet.as_ref().map_or(1, |f| f.replicas)).map(|_| MemStore::new()).collect();
    let adm: Box<dyn Admission> = match (&sc.fleet, stores.first()) {
        (Some(f), _) => Box::new(FleetLevels::new(&stores, &sc, f)?),
        (None, Some(shared)) if sc.engine => Box::new(EngineLevel::new(shared, &sc)?),
        _ => Box::new(BareQueueSet::new(sc.cfg, sc.start)?),
    };
    let mut lp = EventLoop::new(&sc, adm, acc)?;
    lp.run()?;
    let epoch_advances = lp.adm.epoch_advances()?;
    let fleet = lp.adm.fleet_result();
    let (clients, trace, calls) = lp.acc.finish(sc.cfg.concurrency_limit);
    let result = SimulationResult { clients, epoch_advances, workers: sc.workers, fleet };
    Ok(Run { result, trace, calls })
}

/// Upstream test helper `fairAlloc`: max-min fair allocation of `capacity` to `demands`.
pub fn fair_alloc(demands: &[f64], capacity: f64) -> Vec<f64> {
    let count = demands.len();
    let mut sorted: Vec<(f64, usize)> = demands.iter().copied().zip(0..).collect();
    sorted.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
    let mut alloc = vec![0.0; count];
    let mut capacity = capacity;
    let mut prev = 0.0;
    let mut next = 0;
    for &(demand, i) in &sorted {
        if demand > 0.0 {
            let bite = (count - next) as f64 * (demand - prev);
            if bite > capacity {
                break;
            }
            prev = demand;
            if let Some(a) = alloc.get_mut(i) {
                *a = demand;
            }
            capacity -= bite;
        }
        next += 1;
    }
    for &(_, i) in sorted.iter().skip(next) {
        if let Some(a) = alloc.get_mut(i) {
            *a = prev + capacity / (count - next) as f64;
        }
    }
    alloc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_alloc_vectors() {
        assert_eq!(fair_alloc(&[0.0, 0.0], 42.0), vec![0.0, 0.0]);
        assert_eq!(fair_alloc(&[47.0, 0.0], 42.0), vec![42.0, 0.0]);
        assert_eq!(fair_alloc(&[1.0, 47.0], 42.0), vec![1.0, 41.0]);
        assert_eq!(fair_alloc(&[3.0, 7.0, 9.0, 1.0], 14.0), vec![3.0, 5.0, 5.0, 1.0]);
        assert_eq!(fair_alloc(&[1.0, 9.0, 7.0, 3.0], 21.0), vec![1.0, 9.0, 7.0, 3.0]);
    }

    #[test]
    fn validation_errors() {
        let base = |pl: &str, extra: &str| {
            format!(
                r#"{{"priorityLevel":{pl},"evalDuration":"10s","clients":[{{"hash":"1","threads":1,"calls":1,"exec":"1s","think":"0s"{extra}}}]}}"#
            )
        };
        let ok = r#"{"concurrencyLimit":1,"queues":4,"queueLengthLimit":2,"handSize":1}"#;
        assert!(run_scenario(base(ok, "").as_bytes()).is_ok());
        for (pl, extra, want) in [
            (r#"{"concurrencyLimit":1,"queues":512,"queueLengthLimit":2,"handSize":8}"#, "", "entropy"),
            (ok, r#","threads2":1"#, "unknown field"),
            (ok, r#","initialSeats":-1"#, "initialSeats"),
            (ok, r#","exec":"-1s""#, "duplicate"),
            (r#"{"concurrencyLimit":-1}"#, "", "concurrencyLimit"),
        ] {
            let e = run_scenario(base(pl, extra).as_bytes()).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
        let big = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"1s","clients":[{"hash":1,"threads":1001,"calls":1000,"exec":"1s","think":"1s"}]}"#;
        assert!(run_scenario(big.as_bytes()).unwrap_err().to_string().contains("too many calls"));
        let zero = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"0s","clients":[]}"#;
        assert!(run_scenario(zero.as_bytes()).unwrap_err().to_string().contains("evalDuration"));
        let neg = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"1s","clients":[{"hash":1,"threads":1,"calls":1,"exec":"-1s","think":"1s"}]}"#;
        assert!(run_scenario(neg.as_bytes()).unwrap_err().to_string().contains("exec"));
        let huge = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"2562047h","clients":[{"hash":1,"threads":1,"calls":3,"exec":"2562047h","think":"1s"}]}"#;
        assert!(run_scenario(huge.as_bytes()).is_err());
        assert!(run_scenario(b"garbage").is_err());
        // Pacing, jitter, workers.
        let client = |extra: &str| {
            format!(
                r#"{{"priorityLevel":{{"concurrencyLimit":1,"queues":4,"queueLengthLimit":2,"handSize":1}},"evalDuration":"1s","clients":[{{"hash":1,"threads":1,"calls":2,"exec":"1s"{extra}}}]}}"#
            )
        };
        assert!(run_scenario(client(r#","roundTrip":"1ms","serviceJitter":0.5"#).as_bytes()).is_ok());
        for (extra, want) in [
            ("", "one of think and roundTrip"),
            (r#","think":"0s","roundTrip":"1ms""#, "exclude"),
            (r#","roundTrip":"-1ms""#, "roundTrip must not be negative"),
            (r#","think":"0s","serviceJitter":1.5"#, "serviceJitter"),
            (r#","think":"0s","serviceJitter":-0.1"#, "serviceJitter"),
            (r#","think":"0s","serviceTimes":["1ms"]"#, "serviceTimes excludes exec"),
            (r#","think":"0s","serviceTimes":["-1ms"]"#, "serviceTimes[] must not be negative"),
        ] {
            let e = run_scenario(client(extra).as_bytes()).unwrap_err();
            assert!(e.to_string().contains(want), "{extra}: {e}");
        }
        let no_exec = |extra: &str| client(extra).replace(r#","exec":"1s""#, "");
        assert!(run_scenario(no_exec(r#","think":"0s""#).as_bytes()).unwrap_err().to_string().contains("one of exec and serviceTimes"));
        assert!(run_scenario(no_exec(r#","think":"0s","serviceTimes":["1ms"],"serviceJitter":0.1"#).as_bytes())
            .unwrap_err()
            .to_string()
            .contains("excludes"));
        assert!(run_scenario(no_exec(r#","think":"0s","serviceTimes":["1ms","2ms"]"#).as_bytes()).is_ok());
        let e = run_scenario_with(client(r#","think":"0s""#).as_bytes(), &Options { workers: Some(MAX_WORKERS + 1), ..Options::default() })
            .unwrap_err();
        assert!(e.to_string().contains("workers"), "{e}");
    }

    #[test]
    fn round_trip_paces_after_the_response() {
        // One thread, 1 s calls, 100 ms round trip: calls start at 0, 1.1, 2.2, … s.
        let s = br#"{"priorityLevel":{"concurrencyLimit":1,"queues":4,"queueLengthLimit":2,"handSize":1},"evalDuration":"10s",
            "clients":[{"hash":1,"threads":1,"calls":20,"exec":"1s","roundTrip":"100ms"}]}"#;
        let run = run_scenario_with(s, &Options { record_calls: true, ..Options::default() }).unwrap();
        let starts: Vec<_> = run.calls.iter().filter(|c| matches!(c.kind, CallKind::Start { .. })).map(|c| c.t).collect();
        assert_eq!(starts.len(), 20);
        assert!(starts.iter().enumerate().all(|(k, t)| *t == k as i64 * 1_100_000_000), "{starts:?}");
        let c = &run.result.clients[0];
        // Handlers returning in [0, 10 s]: at 1, 2.1, …, 9.8 s.
        assert_eq!(c.throughput, 0.9);
        assert_eq!((c.queue_wait.p50, c.queue_wait.max), (0.0, 0.0));
        assert!((c.average_seats - 9.1 / 10.0).abs() < 1e-12, "{}", c.average_seats);
    }

    #[test]
    fn trace_integrates_to_the_averages() {
        let s = br#"{"priorityLevel":{"concurrencyLimit":3,"queues":9,"queueLengthLimit":6,"handSize":1},"evalDuration":"20s",
            "clients":[{"hash":"1001001001","threads":4,"calls":20,"exec":"1s","think":"999999999ns"},
                       {"hash":"2002002002","threads":2,"calls":20,"exec":"1s","think":"999999999ns"}]}"#;
        let (r, tr) = run_scenario_traced(s).unwrap();
        assert_eq!(r, run_scenario(s).unwrap());
        assert_eq!((tr.start, tr.eval_end, tr.concurrency_limit), (0, 20_000_000_000, 3));
        assert!(tr.changes.windows(2).all(|w| w[0].t <= w[1].t));
        // Re-integrate each client's step function over [start, eval_end].
        for (i, cr) in r.clients.iter().enumerate() {
            let (mut area, mut seats, mut last) = (0i128, 0i64, 0i64);
            for ch in tr.changes.iter().filter(|c| c.client as usize == i) {
                let t = ch.t.min(tr.eval_end);
                area += seats as i128 * (t - last) as i128;
                last = t;
                seats = ch.seats;
            }
            area += seats as i128 * (tr.eval_end - last) as i128;
            assert!((area as f64 / 20e9 - cr.average_seats).abs() < 1e-9, "client {i}");
        }
    }

    #[test]
    fn deterministic_output() {
        let s = br#"{"priorityLevel":{"concurrencyLimit":2,"queues":9,"queueLengthLimit":8,"handSize":3},"evalDuration":"10s","requestWaitLimit":"1500ms",
            "clients":[{"hash":"1001001001","threads":4,"calls":10,"exec":"1s","think":"0s"},{"hash":2002002002,"threads":1,"calls":10,"exec":"1s","think":"1s"}]}"#;
        let a = run_scenario(s).unwrap().to_json();
        let b = run_scenario(s).unwrap().to_json();
        assert_eq!(a, b);
        assert!(a.starts_with(r#"{"clients":[{"averageSeats":"#), "{a}");
        assert!(a.contains(r#""rejected":{"queue-full":"#), "{a}");
        let r = run_scenario(s).unwrap();
        assert!(r.clients[0].rejected.time_out > 0, "{a}");
    }
}
