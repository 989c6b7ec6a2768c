//! What the global state costs this thread: counters of shared-state writes, CAS conflicts
//! (another worker wrote between our read and our write, so the update was redone), level
//! states decoded versus reused from [`super::cache`], and wake-ups posted to other workers.
//!
//! Counted per thread (one Envoy worker's VM, or a native thread) and taken as deltas by the
//! host glue, which exports them as `apf_wasm_*_total` counters. With one worker conflicts,
//! decodes after the first and wake-ups stay at 0; with several they measure how much the
//! workers get in each other's way.

use std::cell::Cell;

/// Counter values (or deltas, from [`take`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contention {
    /// Successful conditional writes of shared values.
    pub writes: u64,
    /// Writes refused because the value changed since it was read (the update is redone).
    pub conflicts: u64,
    /// Level states decoded from their shared bytes for an update.
    pub decodes: u64,
    /// Level states taken from this thread's cache (the bytes were its own last write).
    pub reuses: u64,
    /// Notices (dispatches, rejections) posted to another worker's mailbox.
    pub wakeups: u64,
}

thread_local! {
    static COUNTS: Cell<Contention> = const { Cell::new(Contention { writes: 0, conflicts: 0, decodes: 0, reuses: 0, wakeups: 0 }) };
}

/// Adds one to the counter `field` picks, e.g. `count(|c| &mut c.writes)`.
pub fn count(field: fn(&mut Contention) -> &mut u64) {
    COUNTS.with(|c| {
        let mut v = c.get();
        let n = field(&mut v);
        *n = n.wrapping_add(1);
        c.set(v);
    });
}

/// This thread's counts since the last call (and resets them).
pub fn take() -> Contention {
    COUNTS.with(|c| c.replace(Contention::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::store::{update, MemStore, Store, StoreError};
    use crate::engine::{cache, LevelState};
    use crate::fairqueuing::QueueSetConfig;

    #[test]
    fn counts_writes_conflicts_decodes_and_reuses() {
        let _ = take();
        let s = MemStore::new();
        s.set("k", b"v0", None).unwrap();
        // The first attempt's write loses to another writer (as another worker would), the
        // second one wins: one conflict, one write.
        let mut calls = 0;
        update::<_, StoreError>(&s, "k", 4, |_| {
            calls += 1;
            if calls == 1 {
                s.set("k", b"other", None).unwrap();
            }
            Ok((b"mine".to_vec(), ()))
        })
        .unwrap();
        assert_eq!(calls, 2);
        let c = take();
        assert_eq!((c.writes, c.conflicts), (1, 1));
        assert_eq!(take(), Contention::default(), "take resets");

        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 3 };
        let st = LevelState::new(cfg, 7, 1_000).unwrap();
        let other = LevelState::new(cfg, 8, 1_000).unwrap().encode();
        let key = "apf/v2/pl/contention-test";
        let bytes = cache::encode(key, st);
        // Our own last write: reused (once; then decoded); another worker's bytes: decoded.
        cache::decode(key, &bytes).unwrap();
        cache::decode(key, &bytes).unwrap();
        cache::decode(key, &other).unwrap();
        count(|c| &mut c.wakeups);
        let c = take();
        assert_eq!((c.reuses, c.decodes, c.wakeups), (1, 2, 1));
    }
}
