//! Deterministic discrete-event simulator behind `apf simulate`: upstream's `uniformScenario`
//! harness (`queueset_test.go`, reference §10.2) driving the very same [`QueueSet`] as the
//! filter.
//!
//! Clients have threads that each make `calls` synchronous calls. Thread `j` of client `i` starts
//! at `90·j + 20·i` ns (split clients start their second half of threads at `evalDuration/2`
//! with half the calls). Call `k+1` is issued `exec + think` after call `k` was dispatched; the
//! call's handler runs `exec`, then returns (the request may keep its seats for
//! `additionalLatency`). A rejected or timed-out thread stops. The measured quantity is the
//! time-weighted number of *initial* seats executing per client over `[0, evalDuration]` and its
//! two halves, exactly as the upstream harness integrates it.
//!
//! Time is virtual. Upstream's fake event clock runs all events due at one instant concurrently
//! (in an unspecified order) before advancing; here events are processed in (time, scheduling
//! order) which is one of those orders, so the result is deterministic: same input, same bytes.
//! Averages are computed from exact integer integrals (seat·ns), not from a running float sum.
//!
//! Optional knobs beyond the upstream harness: `requestWaitLimit` (each request's queue wait
//! limit, as the APF filter derives from the request deadline, §1 step 6) and `startTime`
//! (absolute time of the scenario start, to exercise large clock values).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};

use serde::{Deserialize, Serialize};

use crate::duration::parse_go_duration;
use crate::fairqueuing::queueset::{Arrival, QueueSet};
use crate::fairqueuing::{Dispatched, QueueSetConfig, Receipt, RejectReason, RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

/// Upper bound on the total number of calls (Σ threads × calls).
pub const MAX_TOTAL_CALLS: i64 = 1_000_000;
/// Bound on the threads of all clients together (each thread is simulated state).
pub const MAX_TOTAL_THREADS: i64 = 100_000;
const MAX_SEATS: i64 = 1_000_000;
const MAX_EVENTS: u64 = 50_000_000;

#[derive(Deserialize)]
#[serde(untagged)]
enum DurationIn {
    Str(String),
    Nanos(i64),
}

impl DurationIn {
    fn get(&self, what: &str) -> Result<Nanos, String> {
        match self {
            DurationIn::Str(s) => parse_go_duration(s).map_err(|e| format!("{what}: {e}")),
            DurationIn::Nanos(n) => Ok(*n),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum HashIn {
    Str(String),
    Num(u64),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LevelIn {
    concurrency_limit: i64,
    #[serde(default)]
    queues: i64,
    #[serde(default)]
    queue_length_limit: i64,
    #[serde(default)]
    hand_size: i64,
    #[serde(default)]
    exempt: bool,
}

fn one() -> i64 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClientIn {
    hash: HashIn,
    threads: i64,
    calls: i64,
    exec: DurationIn,
    think: DurationIn,
    #[serde(default = "one")]
    initial_seats: i64,
    #[serde(default = "one")]
    final_seats: i64,
    #[serde(default)]
    additional_latency: Option<DurationIn>,
    #[serde(default)]
    split: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScenarioIn {
    priority_level: LevelIn,
    eval_duration: DurationIn,
    clients: Vec<ClientIn>,
    #[serde(default)]
    request_wait_limit: Option<DurationIn>,
    #[serde(default)]
    start_time: Option<DurationIn>,
}

/// Rejections of one client by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Rejections {
    #[serde(rename = "queue-full")]
    pub queue_full: u64,
    #[serde(rename = "concurrency-limit")]
    pub concurrency_limit: u64,
    #[serde(rename = "time-out")]
    pub time_out: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientResult {
    /// Time-weighted initial seats executing over `[0, evalDuration]`.
    pub average_seats: f64,
    /// The same over `[0, evalDuration/2]` and `[evalDuration/2, evalDuration]`.
    pub average_seats_halves: [f64; 2],
    /// Calls that executed (over the whole run, which continues past evalDuration until every
    /// thread is done).
    pub executed: u64,
    pub rejected: Rejections,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulationResult {
    pub clients: Vec<ClientResult>,
    /// Successful epoch advances of the QueueSet's progress meter.
    pub epoch_advances: u64,
}

/// One change of a client's executing (initial) seats, for [`run_scenario_traced`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatChange {
    /// Virtual time (the scenario starts at `startTime`, default 0).
    pub t: Nanos,
    /// Client index (scenario order).
    pub client: u32,
    /// The client's executing seats from `t` on.
    pub seats: i64,
}

/// The time series [`run_scenario_traced`] records besides the result.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SeatTrace {
    /// Scenario start and end of the evaluation window (`start + evalDuration`).
    pub start: Nanos,
    pub eval_end: Nanos,
    /// The priority level's concurrency limit (seats).
    pub concurrency_limit: u32,
    /// Every change of a client's executing seats, in time order (the run continues past
    /// `eval_end` until every thread is done).
    pub changes: Vec<SeatChange>,
}

impl SimulationResult {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

struct Client {
    hash: u64,
    threads: u32,
    calls: u32,
    exec: Nanos,
    think: Nanos,
    work: WorkEstimate,
    split: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Call { thread: u32, k: u32 },
    ExecEnd { thread: u32, id: RequestId },
    Timer,
}

struct Thread {
    client: usize,
    calls: u32,
}

/// Exact integral of a client's executing seats over the two halves.
struct Integrator {
    seats: i64,
    last: Nanos,
    halves: [i128; 2],
}

struct Sim {
    qs: QueueSet,
    clients: Vec<Client>,
    threads: Vec<Thread>,
    events: BinaryHeap<Reverse<(Nanos, u64, Ev)>>,
    seq: u64,
    timers: BTreeSet<Nanos>,
    pending: HashMap<RequestId, (u32, u32)>,
    /// Receipts of the executing calls (handed back to `QueueSet::finish`).
    running: HashMap<RequestId, Receipt>,
    integ: Vec<Integrator>,
    results: Vec<ClientResult>,
    wait_limit: Option<Nanos>,
    bounds: [Nanos; 3],
    processed: u64,
    trace: Option<Vec<SeatChange>>,
}

fn checked_time(a: Nanos, b: Nanos) -> Result<Nanos, String> {
    a.checked_add(b).ok_or_else(|| String::from("scenario times overflow the clock"))
}

impl Sim {
    fn schedule(&mut self, t: Nanos, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn add_seats(&mut self, client: usize, now: Nanos, delta: i64) {
        let bounds = self.bounds;
        let Some(ig) = self.integ.get_mut(client) else { return };
        for (h, w) in bounds.windows(2).enumerate() {
            let (a, b) = match *w {
                [a, b] => (a, b),
                _ => continue,
            };
            let lo = ig.last.max(a);
            let hi = now.min(b);
            if hi > lo {
                if let Some(x) = ig.halves.get_mut(h) {
                    *x += ig.seats as i128 * (hi as i128 - lo as i128);
                }
            }
        }
        ig.last = now;
        ig.seats += delta;
        if let (Some(tr), true) = (self.trace.as_mut(), delta != 0) {
            tr.push(SeatChange { t: now, client: u32::try_from(client).unwrap_or(u32::MAX), seats: ig.seats });
        }
    }

    fn started(&mut self, now: Nanos, thread: u32, k: u32, receipt: Receipt) -> Result<(), String> {
        let id = receipt.id;
        let Some(th) = self.threads.get(thread as usize) else { return Ok(()) };
        let ci = th.client;
        let Some(c) = self.clients.get(ci) else { return Ok(()) };
        let (exec, think, seats) = (c.exec, c.think, c.work.initial_seats as i64);
        if let Some(r) = self.results.get_mut(ci) {
            r.executed += 1;
        }
        self.add_seats(ci, now, seats);
        let next = checked_time(now, checked_time(exec, think)?)?.max(now);
        self.schedule(next, Ev::Call { thread, k: k + 1 });
        let end = checked_time(now, exec)?.max(now);
        self.running.insert(id, receipt);
        self.schedule(end, Ev::ExecEnd { thread, id });
        Ok(())
    }

    fn dispatched(&mut self, now: Nanos, out: &mut Vec<Dispatched>) -> Result<(), String> {
        for d in std::mem::take(out) {
            if let Some((thread, k)) = self.pending.remove(&d.id) {
                self.started(now, thread, k, d.receipt)?;
            }
        }
        Ok(())
    }

    fn arm_timer(&mut self) {
        if let Some(t) = self.qs.next_event() {
            if self.timers.insert(t) {
                self.schedule(t, Ev::Timer);
            }
        }
    }

    fn reject(&mut self, thread: u32, reason: RejectReason) {
        let Some(th) = self.threads.get(thread as usize) else { return };
        if let Some(r) = self.results.get_mut(th.client) {
            match reason {
                RejectReason::QueueFull => r.rejected.queue_full += 1,
                RejectReason::ConcurrencyLimit => r.rejected.concurrency_limit += 1,
                RejectReason::TimeOut => r.rejected.time_out += 1,
            }
        }
    }

    fn step(&mut self, now: Nanos, ev: Ev) -> Result<(), String> {
        let mut out = Vec::new();
        match ev {
            Ev::Call { thread, k } => {
                let Some(th) = self.threads.get(thread as usize) else { return Ok(()) };
                if k >= th.calls {
                    return Ok(());
                }
                let ci = th.client;
                let Some(c) = self.clients.get(ci) else { return Ok(()) };
                let wait_deadline = match self.wait_limit {
                    Some(l) => now.saturating_add(l),
                    None => Nanos::MAX,
                };
                let tag = RequestTag {
                    owner: 0,
                    context: thread,
                    flow_schema: u16::try_from(ci).unwrap_or(u16::MAX),
                    flow_hash: c.hash,
                    wait_deadline,
                };
                let work = c.work;
                match self.qs.arrive(now, work, tag, &mut out) {
                    Arrival::Executing(receipt) => self.started(now, thread, k, receipt)?,
                    Arrival::Queued(id) => {
                        self.pending.insert(id, (thread, k));
                    }
                    Arrival::Rejected(reason) => self.reject(thread, reason),
                }
            }
            Ev::ExecEnd { thread, id } => {
                if let Some(th) = self.threads.get(thread as usize) {
                    let ci = th.client;
                    let seats = self.clients.get(ci).map(|c| c.work.initial_seats as i64).unwrap_or(0);
                    self.add_seats(ci, now, -seats);
                }
                if let Some(receipt) = self.running.remove(&id) {
                    self.qs.finish(now, &receipt, &mut out);
                }
            }
            Ev::Timer => {
                self.timers.remove(&now);
                let mut timed_out = Vec::new();
                self.qs.expire(now, &mut timed_out, &mut out);
                for (id, _) in timed_out {
                    if let Some((thread, _)) = self.pending.remove(&id) {
                        self.reject(thread, RejectReason::TimeOut);
                    }
                }
            }
        }
        self.dispatched(now, &mut out)?;
        self.arm_timer();
        Ok(())
    }
}

fn parse_hash(h: &HashIn) -> Result<u64, String> {
    match h {
        HashIn::Num(n) => Ok(*n),
        HashIn::Str(s) => s.trim().parse::<u64>().map_err(|_| format!("client hash {s:?} is not a decimal uint64")),
    }
}

fn ranged(v: i64, lo: i64, hi: i64, what: &str) -> Result<u32, String> {
    if v < lo || v > hi {
        return Err(format!("{what} must be in [{lo}, {hi}], got {v}"));
    }
    u32::try_from(v).map_err(|_| format!("{what} out of range"))
}

/// Runs one scenario (JSON, see module doc) to completion.
pub fn run_scenario(json: &[u8]) -> Result<SimulationResult, String> {
    run(json, false).map(|(r, _)| r)
}

/// Like [`run_scenario`], also recording every client's executing seats over time.
pub fn run_scenario_traced(json: &[u8]) -> Result<(SimulationResult, SeatTrace), String> {
    run(json, true)
}

fn run(json: &[u8], traced: bool) -> Result<(SimulationResult, SeatTrace), String> {
    let sc: ScenarioIn = serde_json::from_slice(json).map_err(|e| format!("bad scenario: {e}"))?;
    let pl = &sc.priority_level;
    let c = ranged(pl.concurrency_limit, 0, MAX_SEATS, "priorityLevel.concurrencyLimit")?;
    let cfg = if pl.exempt {
        QueueSetConfig { desired_queues: -1, queue_length_limit: 0, hand_size: 0, concurrency_limit: c }
    } else {
        QueueSetConfig {
            desired_queues: ranged(pl.queues, 0, 1 << 26, "priorityLevel.queues")? as i32,
            queue_length_limit: ranged(pl.queue_length_limit, 0, MAX_SEATS, "priorityLevel.queueLengthLimit")?,
            hand_size: ranged(pl.hand_size, 0, 1 << 26, "priorityLevel.handSize")?,
            concurrency_limit: c,
        }
    };
    let eval = sc.eval_duration.get("evalDuration")?;
    if eval <= 0 {
        return Err(format!("evalDuration must be positive, got {eval}ns"));
    }
    let start = match &sc.start_time {
        Some(d) => d.get("startTime")?,
        None => 0,
    };
    let wait_limit = match &sc.request_wait_limit {
        Some(d) => {
            let l = d.get("requestWaitLimit")?;
            if l < 0 {
                return Err(String::from("requestWaitLimit must not be negative"));
            }
            Some(l)
        }
        None => None,
    };
    if sc.clients.len() > u16::MAX as usize {
        return Err(String::from("too many clients"));
    }
    let qs = QueueSet::new(cfg, start)?;
    let mut clients = Vec::with_capacity(sc.clients.len());
    let mut total_calls: i64 = 0;
    let mut total_threads: i64 = 0;
    for (i, ci) in sc.clients.iter().enumerate() {
        let what = |f: &str| format!("clients[{i}].{f}");
        let threads = ranged(ci.threads, 0, MAX_TOTAL_CALLS, &what("threads"))?;
        let calls = ranged(ci.calls, 0, MAX_TOTAL_CALLS, &what("calls"))?;
        total_calls = total_calls.saturating_add((threads as i64).saturating_mul(calls as i64));
        total_threads = total_threads.saturating_add(threads as i64);
        if total_threads > MAX_TOTAL_THREADS {
            return Err(format!("too many threads in total (summed over clients > {MAX_TOTAL_THREADS})"));
        }
        if total_calls > MAX_TOTAL_CALLS {
            return Err(format!("too many calls in total (threads × calls summed over clients > {MAX_TOTAL_CALLS})"));
        }
        let exec = ci.exec.get(&what("exec"))?;
        if exec < 0 {
            return Err(format!("{} must not be negative", what("exec")));
        }
        let think = ci.think.get(&what("think"))?;
        let additional_latency = match &ci.additional_latency {
            Some(d) => d.get(&what("additionalLatency"))?,
            None => 0,
        };
        clients.push(Client {
            hash: parse_hash(&ci.hash)?,
            threads,
            calls,
            exec,
            think,
            work: WorkEstimate {
                initial_seats: ranged(ci.initial_seats, 0, MAX_SEATS, &what("initialSeats"))?,
                final_seats: ranged(ci.final_seats, 0, MAX_SEATS, &what("finalSeats"))?,
                additional_latency,
            },
            split: ci.split,
        });
    }
    let half = eval / 2;
    let bounds = [start, checked_time(start, half)?, checked_time(start, eval)?];
    let mut sim = Sim {
        qs,
        threads: Vec::new(),
        events: BinaryHeap::new(),
        seq: 0,
        timers: BTreeSet::new(),
        pending: HashMap::new(),
        running: HashMap::new(),
        integ: clients.iter().map(|_| Integrator { seats: 0, last: start, halves: [0, 0] }).collect(),
        results: clients
            .iter()
            .map(|_| ClientResult { average_seats: 0.0, average_seats_halves: [0.0, 0.0], executed: 0, rejected: Rejections::default() })
            .collect(),
        wait_limit,
        bounds,
        processed: 0,
        clients: Vec::new(),
        trace: if traced { Some(Vec::new()) } else { None },
    };
    for (i, c) in clients.iter().enumerate() {
        for j in 0..c.threads {
            let mut delay = 90 * j as i64 + 20 * i as i64;
            let mut calls = c.calls;
            if c.split && j >= c.threads / 2 {
                delay += half;
                calls /= 2;
            }
            let thread = u32::try_from(sim.threads.len()).map_err(|_| String::from("too many threads"))?;
            sim.threads.push(Thread { client: i, calls });
            sim.schedule(checked_time(start, delay)?, Ev::Call { thread, k: 0 });
        }
    }
    sim.clients = clients;
    while let Some(Reverse((t, _, ev))) = sim.events.pop() {
        sim.processed += 1;
        if sim.processed > MAX_EVENTS {
            return Err(String::from("simulation exceeded its event budget"));
        }
        sim.step(t, ev)?;
    }
    // Close the integrals at the end of the evaluation window.
    let end = bounds[2];
    for i in 0..sim.integ.len() {
        let last = sim.integ.get(i).map(|g| g.last).unwrap_or(end);
        sim.add_seats(i, end.max(last), 0);
    }
    let dur = [(bounds[1] - bounds[0]) as f64, (bounds[2] - bounds[1]) as f64];
    for (r, ig) in sim.results.iter_mut().zip(sim.integ.iter()) {
        let [a, b] = ig.halves;
        r.average_seats = (a + b) as f64 / eval as f64;
        r.average_seats_halves = [if dur[0] > 0.0 { a as f64 / dur[0] } else { 0.0 }, b as f64 / dur[1]];
    }
    let trace = SeatTrace { start, eval_end: end, concurrency_limit: c, changes: sim.trace.take().unwrap_or_default() };
    Ok((SimulationResult { clients: sim.results, epoch_advances: sim.qs.counters().epoch_advances }, trace))
}

/// Upstream test helper `fairAlloc`: max-min fair allocation of `capacity` to `demands`.
pub fn fair_alloc(demands: &[f64], capacity: f64) -> Vec<f64> {
    let count = demands.len();
    let mut idx: Vec<usize> = (0..count).collect();
    idx.sort_by(|a, b| {
        let da = demands.get(*a).copied().unwrap_or(0.0);
        let db = demands.get(*b).copied().unwrap_or(0.0);
        da.partial_cmp(&db).unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut alloc = vec![0.0; count];
    let mut capacity = capacity;
    let mut prev = 0.0;
    let mut next = 0;
    while next < count {
        let i = idx.get(next).copied().unwrap_or(0);
        let demand = demands.get(i).copied().unwrap_or(0.0);
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
    for j in next..count {
        if let Some(a) = idx.get(j).and_then(|i| alloc.get_mut(*i)) {
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
            assert!(e.contains(want), "{e}");
        }
        let big = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"1s","clients":[{"hash":1,"threads":1001,"calls":1000,"exec":"1s","think":"1s"}]}"#;
        assert!(run_scenario(big.as_bytes()).unwrap_err().contains("too many calls"));
        let zero = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"0s","clients":[]}"#;
        assert!(run_scenario(zero.as_bytes()).unwrap_err().contains("evalDuration"));
        let neg = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"1s","clients":[{"hash":1,"threads":1,"calls":1,"exec":"-1s","think":"1s"}]}"#;
        assert!(run_scenario(neg.as_bytes()).unwrap_err().contains("exec"));
        let huge = r#"{"priorityLevel":{"concurrencyLimit":1},"evalDuration":"2562047h","clients":[{"hash":1,"threads":1,"calls":3,"exec":"2562047h","think":"1s"}]}"#;
        assert!(run_scenario(huge.as_bytes()).is_err());
        assert!(run_scenario(b"garbage").is_err());
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
