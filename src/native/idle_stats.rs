//! Every worker's pending stats, added by the main thread: nothing in Envoy 1.40's ABI wakes a
//! worker without a stream, so an idle worker could not flush what its last requests recorded.
//! Each worker registers a handle on its pending deltas once ([`register`]); the main thread's
//! timer (`glue::config_scheduled`) takes them all every second timer period and adds them
//! through the configuration ([`add_pending`]): a burst's last requests reach Envoy within two
//! periods though no request follows. A worker going idle does nothing for its stats. A delta is taken under its
//! worker's lock by one thread (the main thread here, or the worker's own timer flush) and added
//! by that thread: each delta is added once. Stat ids are process-wide (`metrics`), so the main
//! thread adds a worker's deltas under the worker's ids.

use super::abi::FilterPtr;
use super::metrics;
use crate::gateway::root::TICK_MS;
use crate::gateway::stats::PendingStats;
use crate::gateway::Host;
use crate::Nanos;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};

/// One handle per worker thread (workers live as long as the process).
static WORKERS: Mutex<Vec<PendingStats>> = Mutex::new(Vec::new());

/// Registers a worker's pending deltas, to be added by the main thread from now on.
pub fn register(p: PendingStats) {
    WORKERS.lock().unwrap_or_else(PoisonError::into_inner).push(p);
}

/// The least time between two drains: every second period of the timer (whose ticks come at
/// least a period apart), once however many configurations tick.
const DRAIN_GAP: Nanos = 3 * TICK_MS as Nanos * 1_000_000 / 2;

/// Whether a drain at `now` is due, the last one at `last`.
fn drain_due(now: Nanos, last: Nanos) -> bool {
    now.saturating_sub(last) >= DRAIN_GAP
}

/// Whether a main-thread task whose last turn was at `last` runs at `now` (`due`); if so, its
/// turn is taken: once per period however many configurations' timers tick.
pub(super) fn take_turn(last: &AtomicI64, now: Nanos, due: fn(Nanos, Nanos) -> bool) -> bool {
    if !due(now, last.load(Ordering::Relaxed)) {
        return false;
    }
    last.store(now, Ordering::Relaxed);
    true
}

/// Takes every worker's pending deltas and adds them when a drain is due (main thread, inside
/// a configuration's hook; `h` defines the stats not defined yet).
pub fn add_pending(h: &dyn Host) {
    static LAST: AtomicI64 = AtomicI64::new(0);
    if !take_turn(&LAST, h.monotonic_nanos(), drain_due) {
        return;
    }
    let workers: Vec<PendingStats> = WORKERS.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut deltas = Vec::new();
    for w in &workers {
        // Taken under the worker's lock, added after it is released: a worker's request never
        // waits for Envoy's stats calls.
        w.take(h, &mut deltas);
        for (id, by) in deltas.drain(..) {
            metrics::increment(FilterPtr::none(), id, by);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_main_thread_drains_every_second_timer_period() {
        let t0: Nanos = 1 << 40;
        let period = Nanos::from(TICK_MS) * 1_000_000;
        assert!(drain_due(t0, 0), "the first drain is at once");
        assert!(!drain_due(t0 + period, t0), "not at the next tick");
        assert!(drain_due(t0 + 2 * period, t0), "at the one after");
        assert!(!drain_due(t0 + DRAIN_GAP - 1, t0));
    }
}
