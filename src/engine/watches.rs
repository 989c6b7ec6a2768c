//! Open WATCH counts for the mutating-request work estimator (`watch_tracker.go`,
//! `mutating_work_estimator.go: estimate`). Watches pass through the
//! gateway, so the engine counts them itself: one [`WatchTracker`] per worker slot, all in one
//! shared value, so that a dead worker's watches disappear with its lease.

use super::store::Store;
use super::{update_value, EngineError, WATCHES_KEY};
use crate::codec::{CodecError, Writer};
use crate::digest::request_info::RequestInfo;
use crate::digest::work_estimate::{WatchKey, WatchTracker};

/// The shared value: each worker slot's watches.
type PerSlot = Vec<(u32, WatchTracker)>;

fn decode(bytes: Option<&[u8]>) -> Result<PerSlot, CodecError> {
    let Some(b) = bytes else { return Ok(PerSlot::new()) };
    let mut r = super::versioned(b, 1, "watches version")?;
    let n = r.count(2)?;
    (0..n).map(|_| Ok((r.u32()?, WatchTracker::decode(&mut r)?))).collect()
}

fn encode(per_slot: &PerSlot) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(1);
    w.usize(per_slot.len());
    for (slot, t) in per_slot {
        w.u32(*slot);
        t.encode(&mut w);
    }
    w.into_bytes()
}

/// Registers a WATCH of worker `slot`; returns the key to forget when it ends.
pub fn register(store: &dyn Store, slot: u32, info: &RequestInfo) -> Result<Option<WatchKey>, EngineError> {
    if info.verb != "watch" {
        return Ok(None);
    }
    update_value(store, WATCHES_KEY, decode, encode, |w| {
        if !w.iter().any(|(s, _)| *s == slot) {
            w.push((slot, WatchTracker::new()));
        }
        w.iter_mut().find(|(s, _)| *s == slot).and_then(|(_, t)| t.register(info))
    })
}

pub fn forget(store: &dyn Store, slot: u32, key: &WatchKey) -> Result<(), EngineError> {
    update_value(store, WATCHES_KEY, decode, encode, |w| {
        if let Some((_, t)) = w.iter_mut().find(|(s, _)| *s == slot) {
            t.forget(key);
        }
        w.retain(|(_, t)| t.total() > 0);
    })
}

/// Drops every watch of a dead worker, and its places under the open-watch limits.
pub fn purge(store: &dyn Store, slot: u32) -> Result<(), EngineError> {
    super::watch_limits::purge(store, slot)?;
    let (cur, _) = store.get(WATCHES_KEY)?;
    if !decode(cur.as_deref()).unwrap_or_default().iter().any(|(s, _)| *s == slot) {
        return Ok(());
    }
    update_value(store, WATCHES_KEY, decode, encode, |w| w.retain(|(s, _)| *s != slot))
}

/// Number of open watches a mutating request would notify: upstream `GetInterestedWatchCount`
/// over every worker's watches (one read; 0 on any error).
pub fn interested_count(store: &dyn Store, info: &RequestInfo) -> u32 {
    let Ok((cur, _)) = store.get(WATCHES_KEY) else { return 0 };
    let per_slot = decode(cur.as_deref()).unwrap_or_default();
    per_slot.iter().fold(0u32, |a, (_, t)| a.saturating_add(t.interested_count(info)))
}
