//! Level states kept decoded in process memory, for hosts whose workers share an address space
//! (the native host): each level behind its own lock, updated in place by
//! [`super::update_level`] with no encoding, decoding or compare-and-swap.
//!
//! A store offers one through [`super::store::Store::levels`]; without one (the Wasm host, whose
//! VMs share only bytes) levels live as encoded values in the store. Levels are created rarely
//! (once per configured level), so the map of levels is behind a read-write lock taken for
//! reading by every update, and each level's state behind a mutex of its own: workers on
//! different levels never wait for each other.

use super::store::{MemStore, SetOutcome, Store, StoreError};
use super::LevelState;
use hashbrown::HashMap;
use std::sync::{Mutex, RwLock};

/// Levels' states, each updated under its own lock.
pub trait LevelTable: Sync {
    /// Runs `f` on the state of the level `key` (`None` when it has none yet; `f` may create
    /// it or leave it absent) under that level's lock.
    fn update(&self, key: &str, f: &mut dyn FnMut(&mut Option<LevelState>)) -> Result<(), StoreError>;
    /// Runs `f` on the level's state (`None` when absent) under its lock, creating nothing.
    fn read(&self, key: &str, f: &mut dyn FnMut(Option<&LevelState>)) -> Result<(), StoreError>;
}

/// The [`LevelTable`] of a process: a map of level keys to locked states. An update holds the
/// map's read lock while it holds its level's lock (no reference count touched per update);
/// only creating a level takes the write lock.
#[derive(Default)]
pub struct LevelMap {
    levels: RwLock<HashMap<String, Mutex<Option<LevelState>>>>,
}

fn poisoned(key: &str) -> StoreError {
    StoreError(format!("level {key}: lock poisoned"))
}

impl LevelMap {
    pub fn new() -> LevelMap {
        LevelMap::default()
    }

    /// Runs `f` on the slot of `key` if the level exists: whether it did.
    fn with_slot(&self, key: &str, f: &mut dyn FnMut(&mut Option<LevelState>)) -> Result<bool, StoreError> {
        let m = self.levels.read().map_err(|_| poisoned(key))?;
        let Some(slot) = m.get(key) else { return Ok(false) };
        let mut st = slot.lock().map_err(|_| poisoned(key))?;
        f(&mut st);
        Ok(true)
    }
}

impl LevelTable for LevelMap {
    fn update(&self, key: &str, f: &mut dyn FnMut(&mut Option<LevelState>)) -> Result<(), StoreError> {
        if self.with_slot(key, f)? {
            return Ok(());
        }
        // First update of the level: create its slot (another worker may have meanwhile).
        self.levels.write().map_err(|_| poisoned(key))?.entry(key.to_string()).or_default();
        match self.with_slot(key, f)? {
            true => Ok(()),
            false => Err(StoreError(format!("level {key}: slot vanished"))),
        }
    }

    fn read(&self, key: &str, f: &mut dyn FnMut(Option<&LevelState>)) -> Result<(), StoreError> {
        if !self.with_slot(key, &mut |st| f(st.as_ref()))? {
            f(None);
        }
        Ok(())
    }
}

/// The store of a host whose workers share its memory: shared values as bytes (a [`MemStore`],
/// proxy-wasm's semantics) and the levels decoded in a [`LevelMap`].
#[derive(Default)]
pub struct ProcessStore {
    pub bytes: MemStore,
    pub levels: LevelMap,
}

impl ProcessStore {
    pub fn new() -> ProcessStore {
        ProcessStore::default()
    }
}

impl Store for ProcessStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.bytes.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        self.bytes.set(key, value, cas)
    }
    fn get_into(&self, key: &str, buf: &mut Vec<u8>) -> Result<Option<u32>, StoreError> {
        self.bytes.get_into(key, buf)
    }
    fn levels(&self) -> Option<&dyn LevelTable> {
        Some(&self.levels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fairqueuing::QueueSetConfig;
    use std::sync::Arc;

    fn state(generation: u64) -> LevelState {
        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 3, strict_limit: false };
        LevelState::new(cfg, generation, 1_000).unwrap()
    }

    #[test]
    fn updates_in_place_and_reads_without_creating() {
        let t = LevelMap::new();
        let mut seen = Some(0);
        t.read("a", &mut |s| seen = s.map(|s| s.generation)).unwrap();
        assert_eq!(seen, None);
        assert!(t.levels.read().unwrap().is_empty(), "a read creates no level");
        t.update("a", &mut |s| *s = Some(state(3))).unwrap();
        t.update("a", &mut |s| s.iter_mut().for_each(|s| s.generation += 1)).unwrap();
        t.read("a", &mut |s| seen = s.map(|s| s.generation)).unwrap();
        assert_eq!(seen, Some(4));
        t.read("b", &mut |s| seen = s.map(|s| s.generation)).unwrap();
        assert_eq!(seen, None, "levels are apart");
    }

    #[test]
    fn a_poisoned_level_is_an_error_value() {
        let t = Arc::new(LevelMap::new());
        t.update("a", &mut |s| *s = Some(state(1))).unwrap();
        let t2 = Arc::clone(&t);
        let r = std::thread::spawn(move || t2.update("a", &mut |_| panic!("dies holding the lock"))).join();
        assert!(r.is_err());
        let e = t.update("a", &mut |_| {}).unwrap_err();
        assert!(e.0.contains("poisoned"), "{e}");
        assert!(t.read("a", &mut |_| {}).is_err());
        // Other levels are unaffected.
        t.update("b", &mut |s| *s = Some(state(1))).unwrap();
    }
}
