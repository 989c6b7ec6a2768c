//! What a run reports: per-client results ([`ClientResult`]), the optional time series
//! ([`SeatTrace`], [`CallEvent`]) and the accounting that produces them (exact seat integrals,
//! completions and queue waits inside the evaluation window).

use serde::Serialize;

use super::admission::CallId;
use crate::fairqueuing::RejectReason;
use crate::Nanos;

/// Rejections of one client by reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Rejections {
    pub queue_full: u64,
    pub concurrency_limit: u64,
    pub time_out: u64,
}

/// Queue-wait percentiles (seconds) of the calls that started executing inside the evaluation
/// window (a call that executed at once waited 0). Nearest rank: `p50` is the smallest wait
/// that at least half of those calls did not exceed. All 0 when no call started.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct QueueWait {
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize)]
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
    /// Calls whose handler returned inside the evaluation window, per second of it.
    pub throughput: f64,
    pub queue_wait: QueueWait,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimulationResult {
    pub clients: Vec<ClientResult>,
    /// Successful epoch advances of the QueueSet's progress meter.
    pub epoch_advances: u64,
    /// Simulated Envoy workers the run used (per replica in fleet mode).
    pub workers: u32,
    /// Fleet mode (`"replicas"`): how the replicas shared the level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetResult>,
}

/// How a fleet of replicas shared the level (fleet mode).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetResult {
    /// The level's fleet limit: its `concurrencyLimit`, for all replicas together.
    pub limit: u32,
    /// The most seats in use in the whole fleet at once (Σ over replicas, after every event of
    /// the run), and when (seconds after the start). Fleet mode keeps it ≤ `limit`.
    pub max_executing: u32,
    pub max_executing_at: f64,
    /// When the samples were taken: every period from the start to the end of the window
    /// (seconds after the start).
    pub sample_times: Vec<f64>,
    pub replicas: Vec<ReplicaResult>,
}

/// One replica of a fleet.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaResult {
    /// Its replica id in etcd.
    pub id: String,
    /// The clients whose connections it serves (scenario order).
    pub clients: Vec<u32>,
    /// At each sample time: the seats the fleet allocated it (its level's concurrency limit).
    pub seats: Vec<u32>,
    /// At each sample time: its seats in use.
    pub executing: Vec<u32>,
    /// Every change of its seats: (seconds after the start, seats from then on).
    pub seat_changes: Vec<(f64, u32)>,
    /// The most seats it had in use at once.
    pub max_executing: u32,
}

impl SimulationResult {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

/// One change of a client's executing (initial) seats, for [`super::run_scenario_traced`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatChange {
    /// Virtual time (the scenario starts at `startTime`, default 0).
    pub t: Nanos,
    /// Client index (scenario order).
    pub client: u32,
    /// The client's executing seats from `t` on.
    pub seats: i64,
}

/// The time series [`super::run_scenario_traced`] records besides the result.
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

/// What happened to one call, for [`super::Options::record_calls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// The call was issued (reached the filter).
    Arrive,
    /// It started executing after waiting this long in its queue (0: at once).
    Start { waited: Nanos },
    /// Its handler returned.
    End,
    /// It was answered 429.
    Reject(RejectReason),
}

/// One step of one call: thread `thread` (numbered over all clients in scenario order), call
/// `call` of that thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallEvent {
    pub t: Nanos,
    pub client: u32,
    pub thread: u32,
    pub call: u32,
    pub kind: CallKind,
}

/// One client's accounting: the exact integral of its executing seats over the two halves of
/// the window, its completions and the queue waits of its calls started inside it.
#[derive(Default)]
struct Account {
    seats: i64,
    last: Nanos,
    halves: [i128; 2],
    completed: u64,
    waits: Vec<Nanos>,
    result: ClientResult,
}

/// Per-client accounting of a run.
pub struct Accounts {
    /// Window start, middle and end.
    bounds: [Nanos; 3],
    clients: Vec<Account>,
    trace: Option<Vec<SeatChange>>,
    calls: Option<Vec<CallEvent>>,
}

impl Accounts {
    pub fn new(clients: usize, bounds: [Nanos; 3], opts: &super::Options) -> Accounts {
        let [start, ..] = bounds;
        let clients = (0..clients).map(|_| Account { last: start, ..Account::default() }).collect();
        Accounts { bounds, clients, trace: opts.trace.then(Vec::new), calls: opts.record_calls.then(Vec::new) }
    }

    /// The client's executing seats change by `delta` at `now`.
    fn add_seats(&mut self, client: usize, now: Nanos, delta: i64) {
        let [start, mid, end] = self.bounds;
        let Some(a) = self.clients.get_mut(client) else { return };
        for (x, (lo, hi)) in a.halves.iter_mut().zip([(start, mid), (mid, end)]) {
            let (lo, hi) = (a.last.max(lo), now.min(hi));
            if hi > lo {
                *x += a.seats as i128 * (hi as i128 - lo as i128);
            }
        }
        a.last = now;
        a.seats += delta;
        if let (Some(tr), true) = (self.trace.as_mut(), delta != 0) {
            tr.push(SeatChange { t: now, client: u32::try_from(client).unwrap_or(u32::MAX), seats: a.seats });
        }
    }

    /// What happened at `t` to `call` of the client, whose calls take `seats` initial seats.
    pub fn note(&mut self, t: Nanos, client: usize, call: CallId, kind: CallKind, seats: i64) {
        let client32 = u32::try_from(client).unwrap_or(u32::MAX);
        if let Some(calls) = self.calls.as_mut() {
            calls.push(CallEvent { t, client: client32, thread: call.thread, call: call.k, kind });
        }
        let [start, _, end] = self.bounds;
        let in_window = t >= start && t <= end;
        let Some(a) = self.clients.get_mut(client) else { return };
        let delta = match kind {
            CallKind::Arrive => return,
            CallKind::Start { waited } => {
                a.result.executed += 1;
                if in_window {
                    a.waits.push(waited);
                }
                seats
            }
            CallKind::End => {
                a.completed += u64::from(in_window);
                -seats
            }
            CallKind::Reject(reason) => {
                let r = &mut a.result.rejected;
                *match reason {
                    RejectReason::QueueFull => &mut r.queue_full,
                    RejectReason::ConcurrencyLimit => &mut r.concurrency_limit,
                    RejectReason::TimeOut => &mut r.time_out,
                } += 1;
                return;
            }
        };
        self.add_seats(client, t, delta);
    }

    /// Closes the integrals at the end of the window and computes the averages, throughputs
    /// and wait percentiles; the seat trace of a level of `concurrency_limit` seats.
    pub fn finish(mut self, concurrency_limit: u32) -> (Vec<ClientResult>, SeatTrace, Vec<CallEvent>) {
        let [start, mid, end] = self.bounds;
        for i in 0..self.clients.len() {
            let last = self.clients.get(i).map_or(end, |a| a.last);
            self.add_seats(i, end.max(last), 0);
        }
        let eval = end - start;
        let dur = [(mid - start) as f64, (end - mid) as f64];
        let secs = eval as f64 / crate::NANOS_PER_SEC as f64;
        let results = self.clients.into_iter().map(|mut a| {
            let [x, y] = a.halves;
            a.result.average_seats = (x + y) as f64 / eval as f64;
            a.result.average_seats_halves = [if dur[0] > 0.0 { x as f64 / dur[0] } else { 0.0 }, y as f64 / dur[1]];
            a.result.throughput = a.completed as f64 / secs;
            a.result.queue_wait = percentiles(&mut a.waits);
            a.result
        });
        let changes = self.trace.unwrap_or_default();
        let trace = SeatTrace { start, eval_end: end, concurrency_limit, changes };
        (results.collect(), trace, self.calls.unwrap_or_default())
    }
}

/// Nearest-rank percentiles of `waits` (sorted in place), in seconds.
fn percentiles(waits: &mut [Nanos]) -> QueueWait {
    waits.sort_unstable();
    let n = waits.len();
    let rank = |p: usize| {
        // The smallest index i with (i + 1) ≥ p·n/100.
        let i = (n * p).div_ceil(100).max(1) - 1;
        waits.get(i).copied().unwrap_or(0) as f64 / crate::NANOS_PER_SEC as f64
    };
    QueueWait { p50: rank(50), p90: rank(90), max: rank(100) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        assert_eq!(percentiles(&mut []), QueueWait::default());
        let ms = |x: f64| x / 1000.0;
        let mut one = [5_000_000];
        assert_eq!(percentiles(&mut one), QueueWait { p50: ms(5.0), p90: ms(5.0), max: ms(5.0) });
        // 1..=10 ms: p50 is the 5th, p90 the 9th.
        let mut ten: Vec<Nanos> = (1..=10).rev().map(|i| i * 1_000_000).collect();
        assert_eq!(percentiles(&mut ten), QueueWait { p50: ms(5.0), p90: ms(9.0), max: ms(10.0) });
        let mut three = [3, 1, 2];
        let q = percentiles(&mut three);
        assert_eq!((q.p50, q.p90, q.max), (2e-9, 3e-9, 3e-9));
    }
}
