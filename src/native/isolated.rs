//! Benchmark control for the saturated benchmark (not part of the product; cargo feature
//! `native-isolated-levels`): the native host with a store that gives each worker levels of its
//! own (its own [`LevelMap`], kept decoded as the real host keeps the shared one; level keys in
//! the bytes suffixed per worker), so that every worker runs the same code on levels of its own
//! and nothing is shared.
//! Measured beside the real module it isolates what sharing costs, as bench/isolated does for
//! the wasm module. Never a production module: it splits each level per worker.

use crate::engine::level_table::{LevelMap, LevelTable};
use crate::engine::store::{SetOutcome, Store, StoreError, WorkerState};
use crate::engine::LEVEL_KEY_PREFIX;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};

/// `shared` with the levels of this worker (thread) apart.
struct IsolatedLevels {
    shared: &'static dyn Store,
    suffix: String,
    levels: LevelMap,
}

/// This worker's view of `shared`: its levels apart from every other worker's.
pub fn per_worker(shared: &'static dyn Store) -> &'static dyn Store {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let suffix = format!("#w{}", NEXT.fetch_add(1, Ordering::Relaxed));
    Box::leak(Box::new(IsolatedLevels { shared, suffix, levels: LevelMap::new() }))
}

impl IsolatedLevels {
    fn key<'k>(&self, key: &'k str) -> Cow<'k, str> {
        if key.starts_with(LEVEL_KEY_PREFIX) {
            Cow::Owned(format!("{key}{}", self.suffix))
        } else {
            Cow::Borrowed(key)
        }
    }
}

impl Store for IsolatedLevels {
    fn get(&self, k: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.shared.get(&self.key(k))
    }

    fn set(&self, k: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        self.shared.set(&self.key(k), value, cas)
    }

    fn get_into(&self, k: &str, buf: &mut Vec<u8>) -> Result<Option<u32>, StoreError> {
        self.shared.get_into(&self.key(k), buf)
    }

    fn worker(&self) -> Option<&WorkerState> {
        self.shared.worker()
    }

    fn levels(&self) -> Option<&dyn LevelTable> {
        // Typed like the shared host's when it keeps its levels decoded, bytes when it does not.
        self.shared.levels().map(|_| &self.levels as &dyn LevelTable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::level_table::ProcessStore;
    use crate::engine::store::MemStore;
    use crate::engine::LevelState;
    use crate::fairqueuing::QueueSetConfig;

    #[test]
    fn each_view_keys_levels_apart_and_shares_everything_else() {
        let shared: &'static MemStore = Box::leak(Box::new(MemStore::new()));
        let (a, b) = (per_worker(shared), per_worker(shared));
        let level = format!("{LEVEL_KEY_PREFIX}x");
        a.set(&level, b"a", None).unwrap();
        a.set("other", b"o", None).unwrap();
        assert_eq!(b.get(&level).unwrap().0, None, "a level is per worker");
        assert_eq!(a.get(&level).unwrap().0.as_deref(), Some(&b"a"[..]));
        assert_eq!(b.get("other").unwrap().0.as_deref(), Some(&b"o"[..]), "other keys are shared");
        assert!(a.levels().is_none(), "over a byte store, levels stay bytes");
    }

    #[test]
    fn each_view_has_its_own_typed_levels_over_a_typed_store() {
        let shared: &'static ProcessStore = Box::leak(Box::new(ProcessStore::new()));
        let (a, b) = (per_worker(shared), per_worker(shared));
        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 3, strict_limit: false };
        let level = format!("{LEVEL_KEY_PREFIX}x");
        let create = |s: &mut Option<LevelState>| *s = LevelState::new(cfg, 1, 0).ok();
        a.levels().unwrap().update(&level, &mut |s| create(s)).unwrap();
        let present = |t: &dyn Store| {
            let mut p = false;
            t.levels().unwrap().read(&level, &mut |s| p = s.is_some()).unwrap();
            p
        };
        assert!(present(a) && !present(b), "a level is per worker");
        assert!(!present(shared), "and not in the shared table");
    }
}
