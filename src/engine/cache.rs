//! Decoded level states kept by the worker that last wrote them, keyed by their exact bytes.
//!
//! When the value an operation reads is byte for byte the one this thread wrote last (always
//! with one worker, often with more), the state it encoded is taken from here instead of being
//! decoded again. Decoding is a pure function of the bytes, so a hit gives exactly what decoding
//! would; a miss decodes, reusing the held state's unchanged queues
//! ([`LevelState::decode_reusing`]). One entry per level key, in the worker's own state
//! ([`super::store::Store::worker`]); a store without one always decodes.

use super::store::Store;
use super::LevelState;
use crate::codec::CodecError;

/// A worker's cached level states.
pub(crate) type LevelCache = Vec<Entry>;

pub(crate) struct Entry {
    key: String,
    /// The value this thread wrote last.
    bytes: Vec<u8>,
    /// Taken by the next operation that reads the same bytes (or reused by its decoding).
    state: Option<LevelState>,
}

/// More levels than this (a policy has a few dozen at most) evicts the oldest entry.
const MAX_ENTRIES: usize = 128;

/// The state stored as `bytes` under `key`: this thread's own last write if the bytes are
/// unchanged, else decoded (reusing the unchanged queues of the state this thread holds).
pub fn decode(store: &dyn Store, key: &str, bytes: &[u8]) -> Result<LevelState, CodecError> {
    let Some(w) = store.worker() else { return LevelState::decode(bytes) };
    let mut c = w.cache.borrow_mut();
    let entry = c.iter_mut().find(|e| e.key == key);
    // Whether the bytes are this worker's last write, and the state it holds for the key.
    let held = entry.and_then(|e| Some((e.bytes == bytes, e.state.take()?)));
    match held {
        Some((true, st)) => {
            w.count(|c| &mut c.reuses);
            Ok(st)
        }
        held => {
            w.count(|c| &mut c.decodes);
            LevelState::decode_reusing(bytes, held.map(|(_, st)| st))
        }
    }
}

/// Encodes `st` for `key` and keeps it for the next [`decode`].
pub fn encode(store: &dyn Store, key: &str, st: LevelState) -> Vec<u8> {
    let Some(w) = store.worker() else { return st.encode() };
    // Into a buffer the worker's store updates give back ([`super::store::update`]).
    let bytes = st.encode_into(w.take_buffer());
    let mut c = w.cache.borrow_mut();
    match c.iter_mut().find(|e| e.key == key) {
        Some(e) => {
            e.bytes.clone_from(&bytes);
            e.state = Some(st);
        }
        None => {
            if c.len() >= MAX_ENTRIES {
                c.remove(0);
            }
            c.push(Entry { key: key.to_string(), bytes: bytes.clone(), state: Some(st) });
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::store::{MemStore, WorkerStore};
    use crate::fairqueuing::QueueSetConfig;

    #[test]
    fn hits_only_on_identical_bytes_and_equals_decoding() {
        let shared = MemStore::new();
        let w = WorkerStore::new(&shared);
        let encode = |k: &str, st: LevelState| super::encode(&w, k, st);
        let decode = |k: &str, b: &[u8]| super::decode(&w, k, b);
        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 3, strict_limit: false };
        let st = LevelState::new(cfg, 7, 1_000).unwrap();
        let bytes = encode("apf/v3/pl/x", st.clone());
        let a = decode("apf/v3/pl/x", &bytes).unwrap();
        assert_eq!(a.encode(), bytes);
        assert_eq!(a.generation, 7);
        // Taken: a second read of the same bytes decodes (same result).
        let b = decode("apf/v3/pl/x", &bytes).unwrap();
        assert_eq!(b.encode(), bytes);
        // Other bytes or another key: decoded, never the cached state.
        let mut other = st.clone();
        other.generation = 8;
        let ob = other.encode();
        let _ = encode("apf/v3/pl/x", st);
        assert_eq!(decode("apf/v3/pl/x", &ob).unwrap().generation, 8);
        assert_eq!(decode("apf/v3/pl/y", &bytes).unwrap().generation, 7);
        assert!(decode("apf/v3/pl/x", &[1, 2, 3]).is_err());
    }
}
