//! The shared key-value store the engine keeps its global state in.
//!
//! In Envoy this is proxy-wasm shared data: process-wide, keyed by string, with a compare-and-swap
//! token per value. Its semantics (proxy-wasm-cpp-host `shared_data.cc`) are mirrored by
//! [`MemStore`] so native tests exercise the same races: a CAS token is a process-global counter;
//! a write with a stale token fails; **a write to a missing key ignores the token** (so
//! create-if-absent is not atomic — callers must re-read after creating); values are never
//! deleted (an empty value stands for "absent").

// hashbrown's default hasher: every engine call reads and writes keys here, and std's SipHash
// cost the native host more per request than the lock did.
use hashbrown::HashMap;
use std::sync::Mutex;

/// A failure of the host store other than a CAS mismatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "shared store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    Written,
    CasMismatch,
}

pub trait Store {
    /// The value and its CAS token; `None` when the key is absent (or holds an empty value,
    /// in which case the token is still returned so the key can be overwritten atomically).
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;
    /// Writes `value` if `cas` is `None` or matches the stored token.
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError>;
    /// [`Store::get`] into `buf` (cleared first; left empty when the key is absent or empty):
    /// a store in process memory copies into the caller's buffer instead of a fresh one.
    fn get_into(&self, key: &str, buf: &mut Vec<u8>) -> Result<Option<u32>, StoreError> {
        let (v, cas) = self.get(key)?;
        buf.clear();
        if let Some(v) = v {
            *buf = v;
        }
        Ok(cas)
    }
    /// The calling worker's own state, when the host keeps one for it: the level states it
    /// wrote last ([`super::cache`]) and its contention counters. Without it every read decodes.
    fn worker(&self) -> Option<&WorkerState> {
        None
    }
    /// The level states, when the host keeps them decoded in process memory
    /// ([`super::level_table`]); without, levels are encoded values in this store.
    fn levels(&self) -> Option<&dyn super::level_table::LevelTable> {
        None
    }
}

/// What one worker keeps for itself between engine calls (never shared): its decoded-state
/// cache and contention counters. The host owns one per worker and hands it to the engine with
/// its store ([`Store::worker`]); the engine keeps no per-thread state of its own.
#[derive(Default)]
pub struct WorkerState {
    pub(crate) cache: std::cell::RefCell<super::cache::LevelCache>,
    counts: std::cell::Cell<super::contention::Contention>,
    /// Value buffers kept between store updates (read into, encoded into), so a worker's
    /// read-modify-write allocates nothing once warm.
    buffers: std::cell::RefCell<Vec<Vec<u8>>>,
}

/// Buffers a worker keeps at most (an update holds two: the value read and the one written).
const MAX_BUFFERS: usize = 4;

impl WorkerState {
    pub fn new() -> WorkerState {
        WorkerState::default()
    }

    /// Adds one to the counter `field` picks.
    pub fn count(&self, field: fn(&mut super::contention::Contention) -> &mut u64) {
        let mut v = self.counts.get();
        let n = field(&mut v);
        *n = n.wrapping_add(1);
        self.counts.set(v);
    }

    /// An empty buffer, reused when one was given back.
    pub fn take_buffer(&self) -> Vec<u8> {
        self.buffers.borrow_mut().pop().unwrap_or_default()
    }

    /// Keeps `buf` for a later [`WorkerState::take_buffer`].
    pub fn give_buffer(&self, mut buf: Vec<u8>) {
        let mut b = self.buffers.borrow_mut();
        if b.len() < MAX_BUFFERS && buf.capacity() > 0 {
            buf.clear();
            b.push(buf);
        }
    }

    /// The counts since the last call (and resets them).
    pub fn take(&self) -> super::contention::Contention {
        self.counts.take()
    }
}

/// A worker's view of a shared store: the shared values plus this worker's own state (for
/// native hosts: tests, the simulator, one per simulated worker or thread).
pub struct WorkerStore<'a> {
    pub shared: &'a dyn Store,
    pub state: WorkerState,
}

impl<'a> WorkerStore<'a> {
    pub fn new(shared: &'a dyn Store) -> WorkerStore<'a> {
        WorkerStore { shared, state: WorkerState::new() }
    }
}

impl Store for WorkerStore<'_> {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.shared.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        self.shared.set(key, value, cas)
    }
    fn get_into(&self, key: &str, buf: &mut Vec<u8>) -> Result<Option<u32>, StoreError> {
        self.shared.get_into(key, buf)
    }
    fn worker(&self) -> Option<&WorkerState> {
        Some(&self.state)
    }
    fn levels(&self) -> Option<&dyn super::level_table::LevelTable> {
        self.shared.levels()
    }
}

#[derive(Default)]
struct MemInner {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
}

/// An in-process store with the host's semantics (thread-safe, for native tests and the CLI).
#[derive(Default)]
pub struct MemStore {
    inner: Mutex<MemInner>,
}

impl MemStore {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn value_len(&self, key: &str) -> usize {
        self.inner.lock().ok().and_then(|g| g.map.get(key).map(|(v, _)| v.len())).unwrap_or(0)
    }
}

impl Store for MemStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        let g = self.inner.lock().map_err(|_| StoreError("poisoned".into()))?;
        Ok(match g.map.get(key) {
            None => (None, None),
            Some((v, cas)) if v.is_empty() => (None, Some(*cas)),
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
        })
    }
    fn get_into(&self, key: &str, buf: &mut Vec<u8>) -> Result<Option<u32>, StoreError> {
        buf.clear();
        let g = self.inner.lock().map_err(|_| StoreError("poisoned".into()))?;
        Ok(g.map.get(key).map(|(v, cas)| {
            buf.extend_from_slice(v);
            *cas
        }))
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<SetOutcome, StoreError> {
        let mut g = self.inner.lock().map_err(|_| StoreError("poisoned".into()))?;
        if let (Some(want), Some((_, have))) = (cas, g.map.get(key)) {
            if want != 0 && want != *have {
                return Ok(SetOutcome::CasMismatch);
            }
        }
        // Tokens are never 0 (the host's "no token").
        g.next_cas = g.next_cas.wrapping_add(1).max(1);
        let token = g.next_cas;
        // Overwrites in place: no key string or value buffer allocated per write.
        match g.map.get_mut(key) {
            Some(slot) => {
                slot.0.clear();
                slot.0.extend_from_slice(value);
                slot.1 = token;
            }
            None => drop(g.map.insert(key.to_string(), (value.to_vec(), token))),
        }
        Ok(SetOutcome::Written)
    }
}

/// Read-modify-write of one key with bounded CAS retries. `f` gets the current value (`None`
/// when absent or empty) and returns the new value plus a result; it may be called several
/// times, so it must be a pure function of its input. Returns `Err` after `max_tries` mismatches.
///
/// A missing key is first created with an empty value (the host ignores the token for missing
/// keys, so creation is not atomic; creating an *empty* value keeps the race harmless because
/// two creators write the same thing), then updated with a real compare-and-swap. The only
/// remaining window is a creator whose empty write lands after another worker's first update,
/// microseconds after the key first appears; it can only happen once per key and process.
pub fn update<T, E: From<StoreError>>(
    store: &dyn Store,
    key: &str,
    max_tries: u32,
    mut f: impl FnMut(Option<&[u8]>) -> Result<(Vec<u8>, T), E>,
) -> Result<T, E> {
    let w = store.worker();
    let mut cur = w.map(WorkerState::take_buffer).unwrap_or_default();
    let r = attempts(store, key, max_tries, &mut cur, &mut f);
    if let Some(w) = w {
        w.give_buffer(cur);
    }
    r?.ok_or_else(|| E::from(StoreError(format!("too much contention on {key}"))))
}

/// [`update`]'s tries, reading into `cur`; `None` after `max_tries` mismatches. A written
/// value's buffer goes back to the worker ([`WorkerState::give_buffer`]).
fn attempts<T, E: From<StoreError>>(
    store: &dyn Store,
    key: &str,
    max_tries: u32,
    cur: &mut Vec<u8>,
    f: &mut impl FnMut(Option<&[u8]>) -> Result<(Vec<u8>, T), E>,
) -> Result<Option<T>, E> {
    for _ in 0..max_tries.max(1) {
        let Some(token) = store.get_into(key, cur)? else {
            store.set(key, &[], None)?;
            continue;
        };
        let (new, out) = f((!cur.is_empty()).then_some(cur.as_slice()))?;
        let written = store.set(key, &new, Some(token))? == SetOutcome::Written;
        if let Some(w) = store.worker() {
            w.give_buffer(new);
        }
        super::contention::count(store, if written { |c| &mut c.writes } else { |c| &mut c.conflicts });
        if written {
            return Ok(Some(out));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_semantics_mirror_the_host() {
        let s = MemStore::new();
        assert_eq!(s.get("k").unwrap(), (None, None));
        // create ignores the token
        assert_eq!(s.set("k", b"a", Some(99)).unwrap(), SetOutcome::Written);
        let (v, cas) = s.get("k").unwrap();
        assert_eq!(v.as_deref(), Some(&b"a"[..]));
        assert_eq!(s.set("k", b"b", Some(cas.unwrap() + 1)).unwrap(), SetOutcome::CasMismatch);
        assert_eq!(s.set("k", b"b", cas).unwrap(), SetOutcome::Written);
        assert_eq!(s.set("k", b"c", cas).unwrap(), SetOutcome::CasMismatch);
        // empty value reads as absent with a token
        let (_, cas) = s.get("k").unwrap();
        s.set("k", b"", cas).unwrap();
        let (v, cas) = s.get("k").unwrap();
        assert!(v.is_none() && cas.is_some());
    }

    #[test]
    fn reads_into_a_buffer_as_get_reads() {
        let s = MemStore::new();
        let mut buf = b"stale".to_vec();
        assert_eq!(s.get_into("k", &mut buf).unwrap(), None);
        assert!(buf.is_empty());
        s.set("k", b"abc", None).unwrap();
        let cas = s.get_into("k", &mut buf).unwrap();
        assert_eq!((buf.as_slice(), cas), (&b"abc"[..], s.get("k").unwrap().1));
        s.set("k", b"", cas).unwrap();
        assert!(s.get_into("k", &mut buf).unwrap().is_some() && buf.is_empty());
    }

    #[test]
    fn a_worker_updates_with_its_own_buffers() {
        let shared = MemStore::new();
        let w = WorkerStore::new(&shared);
        for i in 0..5u8 {
            let seen = update::<_, StoreError>(&w, "k", 8, |cur| Ok((vec![i; 3], cur.map(<[u8]>::to_vec)))).unwrap();
            assert_eq!(seen, (i > 0).then(|| vec![i - 1; 3]));
        }
        // The value read and the value written went back to the worker, emptied.
        let (a, b) = (w.state.take_buffer(), w.state.take_buffer());
        assert!(a.is_empty() && b.is_empty() && a.capacity() > 0 && b.capacity() > 0);
    }

    #[test]
    fn update_retries_and_counts() {
        let s = MemStore::new();
        for _ in 0..10 {
            update::<(), StoreError>(&s, "n", 8, |cur| {
                let n = cur.map(|b| b.len()).unwrap_or(0);
                Ok((vec![0u8; n + 1], ()))
            })
            .unwrap();
        }
        assert_eq!(s.value_len("n"), 10);
    }
}
