//! Every worker's lease, renewed by the main thread. A lease exists so that the seats of a
//! worker that is gone (a Wasm VM torn down or crashed) are reaped (`engine::workers`). Here a
//! worker is an Envoy worker thread, which lives exactly as long as the process, and a panic
//! is caught at every hook: no worker can be gone while the process runs. So the main thread's
//! timer (`glue::config_scheduled`) renews every worker's lease, and a worker needs no timer of
//! its own to keep its seats: a stream holding seats gets a scheduler only when something of
//! its own is timed (`glue::ensure_waker`), not to renew the lease on an otherwise idle worker.

use super::idle_stats::take_turn;
use crate::engine;
use crate::gateway::worker::HEARTBEAT_EVERY;
use crate::gateway::Host;
use crate::Nanos;
use std::sync::atomic::AtomicI64;
use std::sync::{Mutex, PoisonError};

/// The instance ids of the process's workers (workers live as long as the process).
static INSTANCES: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// Registers a worker's instance id: its lease is renewed by the main thread from now on (once
/// the worker registered itself in the store).
pub fn register(instance: u64) {
    INSTANCES.lock().unwrap_or_else(PoisonError::into_inner).push(instance);
}

/// Renews every registered worker's lease when a heartbeat is due (main thread, inside a
/// configuration's timer hook).
pub fn renew(h: &dyn Host) {
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = h.monotonic_nanos();
    if !take_turn(&LAST, now, renewal_due) {
        return;
    }
    let instances = INSTANCES.lock().unwrap_or_else(PoisonError::into_inner).clone();
    if let Err(e) = engine::renew_leases(h.store(), &instances, now) {
        log::warn!("apf: renewing the workers' leases failed: {e}");
    }
}

/// Whether a renewal is due at `now`, the last one at `last`: as often as a worker heartbeats.
fn renewal_due(now: Nanos, last: Nanos) -> bool {
    now.saturating_sub(last) >= HEARTBEAT_EVERY
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::worker::LEASE_TTL;

    #[test]
    fn renewals_come_well_within_a_lease() {
        let t0: Nanos = 1 << 40;
        assert!(renewal_due(t0, 0), "the first renewal is at once");
        assert!(!renewal_due(t0 + HEARTBEAT_EVERY - 1, t0));
        assert!(renewal_due(t0 + HEARTBEAT_EVERY, t0));
    }

    /// A renewal late by two periods still keeps the lease.
    const _: () = assert!(3 * HEARTBEAT_EVERY <= LEASE_TTL);
}
