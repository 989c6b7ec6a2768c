//! Open WATCH counts for the mutating-request work estimator (`watch_tracker.go`,
//! `mutating_work_estimator.go: estimate`). Watches pass through the
//! gateway, so the engine counts them itself: one [`WatchTracker`] per worker slot, all in one
//! shared value, so that a dead worker's watches disappear with its lease.

use super::store::Store;
use super::{update_value, EngineError, WATCHES_KEY};
use crate::codec::{CodecError, Writer};
use crate::digest::request_info::RequestInfo;
use crate::digest::work_estimate::{WatchKey, WatchTracker};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Watches {
    pub per_slot: Vec<(u32, WatchTracker)>,
}

impl Watches {
    pub fn decode(bytes: Option<&[u8]>) -> Result<Watches, CodecError> {
        let Some(b) = bytes else { return Ok(Watches::default()) };
        let mut r = super::versioned(b, 1, "watches version")?;
        let n = r.count(2)?;
        let per_slot = (0..n).map(|_| Ok((r.u32()?, WatchTracker::decode(&mut r)?)));
        Ok(Watches { per_slot: per_slot.collect::<Result<_, CodecError>>()? })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(1);
        w.usize(self.per_slot.len());
        for (slot, t) in &self.per_slot {
            w.u32(*slot);
            t.encode(&mut w);
        }
        w.into_bytes()
    }
}

/// Registers a WATCH of worker `slot`; returns the key to forget when it ends.
pub fn register(store: &dyn Store, slot: u32, info: &RequestInfo) -> Result<Option<WatchKey>, EngineError> {
    if info.verb != "watch" {
        return Ok(None);
    }
    update_value(store, WATCHES_KEY, Watches::decode, Watches::encode, |w| {
        if !w.per_slot.iter().any(|(s, _)| *s == slot) {
            w.per_slot.push((slot, WatchTracker::new()));
        }
        w.per_slot.iter_mut().find(|(s, _)| *s == slot).and_then(|(_, t)| t.register(info))
    })
}

pub fn forget(store: &dyn Store, slot: u32, key: &WatchKey) -> Result<(), EngineError> {
    update_value(store, WATCHES_KEY, Watches::decode, Watches::encode, |w| {
        if let Some((_, t)) = w.per_slot.iter_mut().find(|(s, _)| *s == slot) {
            t.forget(key);
        }
        w.per_slot.retain(|(_, t)| t.total() > 0);
    })
}

/// Drops every watch of a dead worker.
pub fn purge(store: &dyn Store, slot: u32) -> Result<(), EngineError> {
    let (cur, _) = store.get(WATCHES_KEY)?;
    if !Watches::decode(cur.as_deref()).unwrap_or_default().per_slot.iter().any(|(s, _)| *s == slot) {
        return Ok(());
    }
    update_value(store, WATCHES_KEY, Watches::decode, Watches::encode, |w| w.per_slot.retain(|(s, _)| *s != slot))
}

/// Number of open watches a mutating request would notify: upstream `GetInterestedWatchCount`
/// over every worker's watches (one read; 0 on any error).
pub fn interested_count(store: &dyn Store, info: &RequestInfo) -> u32 {
    let Ok((cur, _)) = store.get(WATCHES_KEY) else { return 0 };
    let per_slot = Watches::decode(cur.as_deref()).map(|w| w.per_slot).unwrap_or_default();
    per_slot.iter().fold(0u32, |a, (_, t)| a.saturating_add(t.interested_count(info)))
}
