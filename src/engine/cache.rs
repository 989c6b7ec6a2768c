//! Decoded level states kept by the worker that last wrote them, keyed by their exact bytes.
//!
//! Every operation on a level reads its shared value, decodes it, changes it and writes it back.
//! When the value read is byte for byte the one this thread wrote last (nobody else changed the
//! level in between: always with one worker, often with more), the state it encoded is taken
//! from here instead of being decoded again. Decoding is a pure function of the bytes, so a hit
//! gives exactly what decoding would; a miss (another worker wrote, or a CAS failed) decodes.
//! One entry per level key and thread, so memory is bounded by the number of levels.

use super::{ops, LevelState};
use crate::codec::{CodecError, Writer};
use crate::fairqueuing::Dispatched;
use std::cell::RefCell;

struct Entry {
    key: String,
    /// The value this thread wrote last (state and trailer).
    bytes: Vec<u8>,
    /// Its write id (what a trailer's "previous state" names; 0 without a trailer).
    id: u64,
    /// Taken by the next operation that reads the same bytes, or replays onto them.
    state: Option<LevelState>,
    /// Writes left with a trailer: set to [`FOREIGN_WINDOW`] whenever the value read was not
    /// this thread's own last write (another worker is active on the level), so a worker that
    /// is alone on a level spends nothing on trailers.
    foreign: u16,
}

/// How many of its own writes a thread keeps sealing after it last saw another worker's write.
const FOREIGN_WINDOW: u16 = 1024;

/// More levels than this (a policy has a few dozen at most) evicts the oldest entry.
const MAX_ENTRIES: usize = 128;

thread_local! {
    static CACHE: RefCell<Vec<Entry>> = const { RefCell::new(Vec::new()) };
    /// A replay's dispatch list and encoding (see [`decode`]).
    static SCRATCH: RefCell<(Vec<Dispatched>, Vec<u8>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The state stored as `bytes` under `key`: this thread's own last write if the bytes are
/// unchanged; else that state with the writer's operation replayed onto it, when the value
/// says it was derived from it and the result encodes to exactly its state bytes
/// ([`ops`]); else decoded, reusing the queues of the state this thread holds whose
/// encoding is unchanged ([`LevelState::decode_reusing`]).
pub fn decode(key: &str, bytes: &[u8]) -> Result<LevelState, CodecError> {
    // Lives on the stack for this call only; boxing the replay would cost an allocation each.
    #[allow(clippy::large_enum_variant)]
    enum Found<'a> {
        Own(LevelState),
        Replay(LevelState, ops::Replay, &'a [u8]),
        Decode(Option<LevelState>),
    }
    let found = CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let Some(e) = c.iter_mut().find(|e| e.key == key) else {
            push(&mut c, Entry { key: key.to_string(), bytes: Vec::new(), id: 0, state: None, foreign: FOREIGN_WINDOW });
            return Found::Decode(None);
        };
        let own = e.bytes == bytes;
        if !own {
            e.foreign = FOREIGN_WINDOW;
        }
        let Some(st) = e.state.take() else { return Found::Decode(None) };
        if own {
            return Found::Own(st);
        }
        match ops::unseal(bytes).and_then(|v| Some((v.ops_since(e.id)?, v.state))) {
            Some((ops, state)) => Found::Replay(st, ops, state),
            None => Found::Decode(Some(st)),
        }
    });
    let prior = match found {
        Found::Own(st) => {
            super::contention::count(|c| &mut c.reuses);
            return Ok(st);
        }
        Found::Replay(mut st, ops, state_bytes) => {
            // The dispatch list and the check's encoding go to buffers kept for the next replay.
            let same = SCRATCH.with(|s| {
                let mut s = s.borrow_mut();
                let (out, buf) = &mut *s;
                replay(&mut st, ops, state_bytes, out, buf)
            });
            if same {
                super::contention::count(|c| &mut c.replays);
                return Ok(st);
            }
            Some(st)
        }
        Found::Decode(prior) => prior,
    };
    super::contention::count(|c| &mut c.decodes);
    LevelState::decode_reusing(bytes, prior)
}

/// Applies `ops` to `st` and tells whether the result encodes to exactly `state_bytes` (the
/// replay [`decode`] trusts only when true). `out` (the dispatch lists) and `buf` (the check's
/// encoding) are scratch space kept by the caller between calls.
pub fn replay(st: &mut LevelState, ops: impl IntoIterator<Item = ops::Op>, state_bytes: &[u8],
              out: &mut Vec<Dispatched>, buf: &mut Vec<u8>) -> bool {
    for op in ops {
        out.clear();
        ops::apply(st, &op, out);
    }
    out.clear();
    let mut w = Writer { buf: std::mem::take(buf) };
    w.buf.clear();
    st.encode_to(&mut w);
    let same = w.buf == state_bytes;
    *buf = w.buf;
    same
}

/// Encodes `st` for `key` with its trailer (`from`: the value holding the state it was derived
/// from by `op`, when a reader may replay it; see [`ops::seal`]) and keeps it for the next
/// [`decode`].
/// Without another worker active on the level (see `Entry::foreign`), no trailer is written.
pub fn encode(key: &str, st: LevelState, from: Option<&[u8]>, op: Option<&ops::Op>) -> Vec<u8> {
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        let pos = c.iter().position(|e| e.key == key);
        let sealing = pos.and_then(|p| c.get(p)).is_some_and(|e| e.foreign > 0);
        let (bytes, id) = if sealing { ops::seal(st.encode_with_room(ops::TRAILER_MAX), from, op) } else { (st.encode(), 0) };
        match pos.and_then(|p| c.get_mut(p)) {
            Some(e) => {
                e.bytes.clear();
                e.bytes.extend_from_slice(&bytes);
                e.id = id;
                e.state = Some(st);
                e.foreign = e.foreign.saturating_sub(1);
            }
            None => push(&mut c, Entry { key: key.to_string(), bytes: bytes.clone(), id, state: Some(st), foreign: 0 }),
        }
        bytes
    })
}

fn push(c: &mut Vec<Entry>, e: Entry) {
    if c.len() >= MAX_ENTRIES {
        c.remove(0);
    }
    c.push(e);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::contention;
    use crate::fairqueuing::{QueueSetConfig, RequestTag, WorkEstimate};

    fn state_of(bytes: &[u8]) -> &[u8] {
        ops::unseal(bytes).map_or(bytes, |v| v.state)
    }

    /// Alone on a level, a thread writes no trailer once its window has passed; another
    /// worker's write turns trailers back on.
    #[test]
    fn seals_only_while_another_worker_writes() {
        let key = "apf/v1/pl/window-test";
        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 3 };
        let mut bytes = encode(key, LevelState::new(cfg, 1, 0).unwrap(), None, None);
        assert!(ops::unseal(&bytes).is_none(), "never saw another writer");
        let other = LevelState::new(cfg, 2, 0).unwrap().encode();
        let st = decode(key, &other).unwrap();
        bytes = encode(key, st, None, None);
        assert!(ops::unseal(&bytes).is_some());
        for _ in 0..FOREIGN_WINDOW {
            let st = decode(key, &bytes).unwrap();
            bytes = encode(key, st, None, None);
        }
        assert!(ops::unseal(&bytes).is_none(), "window passed");
    }

    #[test]
    fn hits_only_on_identical_bytes_and_equals_decoding() {
        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 3 };
        let st = LevelState::new(cfg, 7, 1_000).unwrap();
        let bytes = encode("apf/v1/pl/x", st.clone(), None, None);
        let a = decode("apf/v1/pl/x", &bytes).unwrap();
        assert_eq!(a.encode(), state_of(&bytes));
        assert_eq!(a.generation, 7);
        // Taken: a second read of the same bytes decodes (same result).
        let b = decode("apf/v1/pl/x", &bytes).unwrap();
        assert_eq!(b.encode(), state_of(&bytes));
        // Other bytes or another key: decoded, never the cached state.
        let mut other = st.clone();
        other.generation = 8;
        let ob = other.encode();
        let _ = encode("apf/v1/pl/x", st, None, None);
        assert_eq!(decode("apf/v1/pl/x", &ob).unwrap().generation, 8);
        assert_eq!(decode("apf/v1/pl/y", &bytes).unwrap().generation, 7);
        assert!(decode("apf/v1/pl/x", &[1, 2, 3]).is_err());
    }

    /// Another worker's write derived from this thread's last write by one operation is
    /// replayed onto the cached state (equal to decoding); a trailer that does not match what
    /// was written (here: a different operation) fails the check and the value is decoded.
    #[test]
    fn replays_one_operation_of_another_worker() {
        let key = "apf/v1/pl/replay-test";
        let cfg = QueueSetConfig { desired_queues: 8, queue_length_limit: 10, hand_size: 2, concurrency_limit: 1 };
        let tag = |owner, context| RequestTag { owner, context, flow_schema: 0, flow_hash: 99, wait_deadline: 5_000_000_000 };
        let mut st = LevelState::new(cfg, 1, 1_000).unwrap();
        let mut out = Vec::new();
        for i in 0..4 {
            ops::apply(&mut st, &ops::Op::Arrive { now: 2_000 + i, work: WorkEstimate::ONE, tag: tag(1, i as u32) }, &mut out);
        }
        // A first read of the level counts as another worker's write: this thread seals.
        assert!(decode(key, &[1, 2, 3]).is_err());
        let mine = encode(key, st, None, None);
        assert!(ops::unseal(&mine).is_some());
        // The other worker (its own thread, so its own cache) reads our value and applies `n`
        // ops, writing after each; with `lie` its last trailer names another operation.
        let theirs = |mine: &Vec<u8>, n: u32, lie: bool| {
            let mut v = mine.clone();
            std::thread::spawn(move || {
                for i in 0..n {
                    let mut st = decode(key, &v).unwrap();
                    let op = ops::Op::Arrive { now: 9_000 + i64::from(i), work: WorkEstimate::ONE, tag: tag(2, 50 + i) };
                    ops::apply(&mut st, &op, &mut Vec::new());
                    let said = if lie { ops::Op::Cancel { now: 9_000, id: 2 } } else { op };
                    v = encode(key, st, Some(&v), Some(&said));
                }
                v
            })
            .join()
            .unwrap()
        };
        let _ = contention::take();
        let v = theirs(&mine, 1, false);
        let got = decode(key, &v).unwrap();
        assert_eq!(got.encode(), LevelState::decode(&v).unwrap().encode());
        assert_eq!(got.qs.requests_waiting(), 4);
        let c = contention::take();
        assert_eq!((c.replays, c.decodes), (1, 0));

        // Several operations behind, up to the steps a trailer keeps: replayed in order.
        for n in 2..=ops::MAX_STEPS as u32 + 1 {
            let mine = encode(key, LevelState::decode(&mine).unwrap(), None, None);
            let v = theirs(&mine, n, false);
            assert_eq!(ops::unseal(&v).unwrap().steps().count(), ops::MAX_STEPS.min(n as usize));
            let got = decode(key, &v).unwrap();
            assert_eq!(got.encode(), LevelState::decode(&v).unwrap().encode());
            let c = contention::take();
            let replayed = n as usize <= ops::MAX_STEPS;
            assert_eq!((c.replays, c.decodes), (u64::from(replayed), u64::from(!replayed)), "{n} operations behind");
        }

        // Our cached state was taken by the replay: write it again, then a lying trailer.
        let mine = encode(key, LevelState::decode(&mine).unwrap(), None, None);
        let v = theirs(&mine, 1, true);
        let got = decode(key, &v).unwrap();
        assert_eq!(got.encode(), LevelState::decode(&v).unwrap().encode());
        let c = contention::take();
        assert_eq!((c.replays, c.decodes), (0, 1));
    }
}
