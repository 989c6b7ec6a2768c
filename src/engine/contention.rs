//! What the global state costs one worker, counted in its [`super::store::WorkerState`] and
//! exported as deltas by the host glue (`apf_wasm_*_total`). With one worker conflicts, decodes
//! after the first and wake-ups stay at 0; with several they measure how much the workers get
//! in each other's way.

/// Counter values (or deltas, from [`WorkerState::take`](super::store::WorkerState::take)).
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

/// Adds one to the counter `field` picks in the calling worker's state (if the store has one),
/// e.g. `count(store, |c| &mut c.writes)`.
pub fn count(store: &dyn super::store::Store, field: fn(&mut Contention) -> &mut u64) {
    if let Some(w) = store.worker() {
        w.count(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::store::{update, MemStore, Store, StoreError, WorkerStore};
    use crate::engine::{cache, LevelState};
    use crate::fairqueuing::QueueSetConfig;

    #[test]
    fn counts_writes_conflicts_decodes_and_reuses() {
        let shared = MemStore::new();
        let s = WorkerStore::new(&shared);
        shared.set("k", b"v0", None).unwrap();
        // The first attempt's write loses to another writer (as another worker would), the
        // second one wins: one conflict, one write.
        let mut calls = 0;
        update::<_, StoreError>(&s, "k", 4, |_| {
            calls += 1;
            if calls == 1 {
                shared.set("k", b"other", None).unwrap();
            }
            Ok((b"mine".to_vec(), ()))
        })
        .unwrap();
        assert_eq!(calls, 2);
        let c = s.state.take();
        assert_eq!((c.writes, c.conflicts), (1, 1));
        assert_eq!(s.state.take(), Contention::default(), "take resets");

        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 3, strict_limit: false };
        let st = LevelState::new(cfg, 7, 1_000).unwrap();
        let other = LevelState::new(cfg, 8, 1_000).unwrap().encode();
        let key = "apf/v3/pl/contention-test";
        let bytes = cache::encode(&s, key, st);
        // Our own last write: reused (once; then decoded); another worker's bytes: decoded.
        cache::decode(&s, key, &bytes).unwrap();
        cache::decode(&s, key, &bytes).unwrap();
        cache::decode(&s, key, &other).unwrap();
        count(&s, |c| &mut c.wakeups);
        let c = s.state.take();
        assert_eq!((c.reuses, c.decodes, c.wakeups), (1, 2, 1));
        // A store without a worker state counts nothing and caches nothing.
        cache::decode(&shared, key, &bytes).unwrap();
        count(&shared, |c| &mut c.wakeups);
        assert_eq!(s.state.take(), Contention::default());
    }
}
