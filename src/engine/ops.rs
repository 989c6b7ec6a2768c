//! Level operations that another worker can replay.
//!
//! Every update of a level reads its shared value, decodes it, applies one operation and writes
//! it back. With several workers the value read was usually written by another worker, so the
//! reader's cached copy (its own last write, [`super::cache`]) is a few operations behind. Each
//! value therefore ends with a small trailer naming the states it was derived from and the
//! operations applied (the last [`MAX_STEPS`]): a reader whose cached state is one of those
//! previous states replays the operations since on its copy instead of decoding the whole value,
//! and keeps the result only if it encodes to exactly the stored bytes (so a replay is never
//! trusted, it is checked; otherwise it decodes).
//!
//! Layout: `state ‖ trailer ‖ trailer length (u16 LE) ‖ TRAILER_MAGIC`, the trailer being
//! `write id (8 B) ‖ step*`, newest step first, each step `previous write id (8 B) ‖ operation
//! length (1 B) ‖ operation` ([`next_write_id`]); operations are written with fixed-width
//! fields ([`Op::encode`]; modules before 2026-11-24 wrote varints, still read). Modules before
//! 2026-11-22 wrote one step without the length, naming states by a hash of their bytes: such
//! trailers read as steps that do not parse or ids that match nothing, so the value is decoded.
//! [`super::LevelState::decode`] ignores what follows the state, so values with and without a
//! trailer are read alike by every version of the module.

use super::{unix_secs, Decision, LevelState};
use crate::codec::{CodecError, CodecResult, Reader, Writer};
use crate::fairqueuing::queueset::Arrival;
use crate::fairqueuing::{Dispatched, Receipt, RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

/// Last byte of a value that carries a trailer.
const TRAILER_MAGIC: u8 = 0xA7;

/// An operation on a level's state, applied the same way by its writer and by a replaying
/// reader ([`apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A request arrives (admission).
    Arrive { now: Nanos, work: WorkEstimate, tag: RequestTag },
    /// An executing request's handler returned.
    Finish { now: Nanos, receipt: Receipt },
    /// A waiting request leaves its queue (stream ended).
    Cancel { now: Nanos, id: RequestId },
}

/// What an operation returned to its writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Decision(Decision),
    Finished(bool),
    Cancelled,
}

/// Applies `op` to `st` (including the seat-demand sample every update takes).
pub fn apply(st: &mut LevelState, op: &Op, out: &mut Vec<Dispatched>) -> Outcome {
    let r = match *op {
        Op::Arrive { now, work, tag } => Outcome::Decision(match st.qs.arrive(now, work, tag, out) {
            Arrival::Executing(rc) => Decision::Execute(rc),
            Arrival::Queued(id) => Decision::Queued(id),
            Arrival::Rejected(reason) => {
                st.dropped.record_dropped(unix_secs(now));
                Decision::Rejected { reason, retry_after: st.dropped.retry_after() }
            }
        }),
        Op::Finish { now, receipt } => Outcome::Finished(st.qs.finish(now, &receipt, out)),
        Op::Cancel { now, id } => {
            st.qs.cancel(now, id);
            Outcome::Cancelled
        }
    };
    st.note_demand(op.now());
    r
}

impl Op {
    fn now(&self) -> Nanos {
        match *self {
            Op::Arrive { now, .. } | Op::Finish { now, .. } | Op::Cancel { now, .. } => now,
        }
    }

    /// Fixed-width fields (tags [`ARRIVE`], [`FINISH`], [`CANCEL`]): a reader decodes an
    /// operation with a handful of loads instead of a dozen varints (times are 9-byte
    /// varints). Decoding also accepts the varint form modules before 2026-11-24 wrote (tags
    /// 1–3); a trailer is only ever read to replay, and replays are checked.
    fn encode(&self, w: &mut Writer) {
        match *self {
            Op::Arrive { now, work, tag } => {
                w.u8(ARRIVE);
                w.fixed64(now as u64);
                w.fixed32(work.initial_seats);
                w.fixed32(work.final_seats);
                w.fixed64(work.additional_latency as u64);
                w.fixed32(tag.owner);
                w.fixed32(tag.context);
                w.fixed16(tag.flow_schema);
                w.fixed64(tag.flow_hash);
                w.fixed64(tag.wait_deadline as u64);
            }
            Op::Finish { now, receipt: rc } => {
                w.u8(FINISH);
                w.fixed64(now as u64);
                w.fixed64(rc.id);
                w.fixed32(rc.queue as u32);
                w.fixed32(rc.owner);
                w.fixed32(rc.initial_seats);
                w.fixed32(rc.max_seats);
                w.fixed64(rc.start as u64);
                w.fixed64(rc.additional_latency as u64);
            }
            Op::Cancel { now, id } => {
                w.u8(CANCEL);
                w.fixed64(now as u64);
                w.fixed64(id);
            }
        }
    }

    fn decode(r: &mut Reader) -> CodecResult<Op> {
        Ok(match r.u8()? {
            ARRIVE => {
                let now = r.fixed64()? as i64;
                let work = WorkEstimate { initial_seats: r.fixed32()?, final_seats: r.fixed32()?, additional_latency: r.fixed64()? as i64 };
                let (owner, context, flow_schema) = (r.fixed32()?, r.fixed32()?, r.fixed16()?);
                let tag = RequestTag { owner, context, flow_schema, flow_hash: r.fixed64()?, wait_deadline: r.fixed64()? as i64 };
                Op::Arrive { now, work, tag }
            }
            FINISH => {
                let now = r.fixed64()? as i64;
                let receipt = Receipt {
                    id: r.fixed64()?,
                    queue: r.fixed32()? as i32,
                    owner: r.fixed32()?,
                    initial_seats: r.fixed32()?,
                    max_seats: r.fixed32()?,
                    start: r.fixed64()? as i64,
                    additional_latency: r.fixed64()? as i64,
                };
                Op::Finish { now, receipt }
            }
            CANCEL => Op::Cancel { now: r.fixed64()? as i64, id: r.fixed64()? },
            1 => {
                let now = r.i64()?;
                let work = WorkEstimate { initial_seats: r.u32()?, final_seats: r.u32()?, additional_latency: r.i64()? };
                let owner = r.u32()?;
                let context = r.u32()?;
                let flow_schema = u16::try_from(r.u32()?).map_err(|_| CodecError("bad flow schema"))?;
                let tag = RequestTag { owner, context, flow_schema, flow_hash: r.fixed64()?, wait_deadline: r.i64()? };
                Op::Arrive { now, work, tag }
            }
            2 => Op::Finish { now: r.i64()?, receipt: Receipt::decode(r)? },
            3 => Op::Cancel { now: r.i64()?, id: r.u64()? },
            _ => return Err(CodecError("unknown level operation")),
        })
    }
}

/// Operation tags of the fixed-width form ([`Op::encode`]).
const ARRIVE: u8 = 0x11;
const FINISH: u8 = 0x12;
const CANCEL: u8 = 0x13;

/// A fresh id for a value about to be written: what a trailer names as "this state" and the
/// next writer's trailer as "previous". Unique per thread (a counter) and, with a random start
/// per thread, across workers. It only tells a reader which cached state a replay starts from;
/// the replay is checked against the stored bytes, so a collision only costs a failed check.
/// (Identifying states by a hash of their bytes would cost a pass over every value written.)
pub fn next_write_id() -> u64 {
    thread_local! {
        static NEXT: std::cell::Cell<u64> = std::cell::Cell::new({
            let mut b = [0u8; 8];
            match getrandom::getrandom(&mut b) {
                Ok(()) => u64::from_le_bytes(b),
                Err(_) => 0x9e37_79b9_7f4a_7c15,
            }
        });
    }
    NEXT.with(|n| {
        // 0 means "no previous state" in a trailer: never an id.
        let id = n.get().max(1);
        n.set(id.wrapping_add(1));
        id
    })
}

/// Operations a trailer keeps: a reader at most this many operations behind replays them.
pub const MAX_STEPS: usize = 3;

/// Room a trailer needs at most (ids, [`MAX_STEPS`] of the largest operation, length, magic).
pub const TRAILER_MAX: usize = 8 + MAX_STEPS * (9 + 72) + 3;

/// Appends the trailer to `w`, which holds the encoded state (written with [`TRAILER_MAX`]
/// bytes to spare): a fresh write id ([`next_write_id`]) and, when the state was derived by
/// `op` from the state stored in `from` (the sealed value read), the step `from`'s id → `op`
/// followed by `from`'s own steps (at most [`MAX_STEPS`] in all). Without `from` or `op` (e.g.
/// after a reconfiguration) nobody can replay to this value. Returns the value and its id.
pub fn seal(mut w: Writer, from: Option<&[u8]>, op: Option<&Op>) -> (Vec<u8>, u64) {
    let start = w.len();
    let id = next_write_id();
    w.fixed64(id);
    if let (Some(from), Some(op)) = (from.and_then(unseal), op) {
        w.fixed64(from.id);
        let len_at = w.len();
        w.u8(0);
        op.encode(&mut w);
        let op_len = w.len().saturating_sub(len_at + 1);
        if let (Ok(n), Some(b)) = (u8::try_from(op_len), w.buf.get_mut(len_at)) {
            *b = n;
        }
        // The older steps, as they are.
        for step in raw_steps(from.steps).take(MAX_STEPS - 1) {
            w.buf.extend_from_slice(step);
        }
    }
    let len = u16::try_from(w.len().saturating_sub(start)).unwrap_or(u16::MAX);
    w.fixed16(len);
    w.u8(TRAILER_MAGIC);
    (w.into_bytes(), id)
}

/// The trailer's write id alone.
pub fn sealed_id(value: &[u8]) -> Option<u64> {
    unseal(value).map(|s| s.id)
}

/// A trailer's steps, each as its bytes (`previous write id ‖ operation length ‖ operation`),
/// newest first; stops where one does not fit.
fn raw_steps(mut steps: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let n = usize::from(*steps.get(8)?);
        let (step, rest) = steps.split_at_checked(9 + n)?;
        steps = rest;
        Some(step)
    })
}

/// A value's state bytes and trailer, if it ends with [`TRAILER_MAGIC`] and a fitting length.
fn split(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let (&magic, rest) = value.split_last()?;
    if magic != TRAILER_MAGIC || rest.len() < 2 {
        return None;
    }
    let (body, len) = rest.split_at(rest.len() - 2);
    let len = usize::from(u16::from_le_bytes([*len.first()?, *len.get(1)?]));
    Some(body.split_at(body.len().checked_sub(len)?))
}

/// A stored value split into its state bytes and trailer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed<'a> {
    pub state: &'a [u8],
    /// The write id ([`next_write_id`]).
    pub id: u64,
    steps: &'a [u8],
}

impl Sealed<'_> {
    /// The steps that led here, newest first: the id of the state each started from and its
    /// operation. Stops at the first that does not parse, and after [`MAX_STEPS`].
    pub fn steps(&self) -> impl Iterator<Item = (u64, Op)> + '_ {
        raw_steps(self.steps)
            .map_while(|step| {
                let mut r = Reader::new(step);
                let prev = r.fixed64().ok()?;
                r.u8().ok()?;
                let op = Op::decode(&mut r).ok()?;
                (r.remaining() == 0).then_some((prev, op))
            })
            .take(MAX_STEPS)
    }

    /// The operations leading from the state with write id `from` to this one, oldest first
    /// (`None` when `from` is not among the steps).
    pub fn ops_since(&self, from: u64) -> Option<Replay> {
        if from == 0 {
            return None;
        }
        let mut ops = [None; MAX_STEPS];
        for (k, (prev, op)) in self.steps().enumerate() {
            *ops.get_mut(k)? = Some(op);
            if prev == from {
                return Some(Replay { ops, next: k + 1 });
            }
        }
        None
    }
}

/// Operations to replay, oldest first (an iterator; no allocation).
#[derive(Debug, Clone)]
pub struct Replay {
    /// Newest first; the first `next` are set.
    ops: [Option<Op>; MAX_STEPS],
    next: usize,
}

impl Iterator for Replay {
    type Item = Op;
    fn next(&mut self) -> Option<Op> {
        self.next = self.next.checked_sub(1)?;
        self.ops.get(self.next).copied().flatten()
    }
}

/// Splits a value written by [`seal`]; `None` for values without a (well-formed) trailer.
pub fn unseal(value: &[u8]) -> Option<Sealed<'_>> {
    let (state, trailer) = split(value)?;
    let id = Reader::new(trailer).fixed64().ok()?;
    Some(Sealed { state, id, steps: trailer.get(8..)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops() -> Vec<Op> {
        let tag = RequestTag { owner: 3, context: 77, flow_schema: 5, flow_hash: 0xdead_beef_1234_5678, wait_deadline: i64::MAX };
        vec![
            Op::Arrive { now: 123_456_789, work: WorkEstimate { initial_seats: 2, final_seats: 7, additional_latency: 5_000_000 }, tag },
            Op::Arrive { now: -5, work: WorkEstimate::ONE, tag: RequestTag { wait_deadline: 99, ..tag } },
            Op::Finish { now: 9, receipt: Receipt { id: 42, queue: -1, owner: 2, initial_seats: 1, max_seats: 3, start: 4, additional_latency: 0 } },
            Op::Cancel { now: 1 << 40, id: u64::MAX },
        ]
    }

    fn writer(state: &[u8]) -> Writer {
        let mut w = Writer::with_capacity(state.len() + TRAILER_MAX);
        for &b in state {
            w.u8(b);
        }
        w
    }

    #[test]
    fn seal_unseal_roundtrip() {
        let state = vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
        for op in ops() {
            let (v0, id0) = seal(writer(&[7; 5]), None, None);
            let (v, id) = seal(writer(&state), Some(&v0), Some(&op));
            let s = unseal(&v).unwrap();
            assert_eq!((s.state, s.id), (&state[..], id));
            assert_eq!(s.steps().collect::<Vec<_>>(), vec![(id0, op)]);
            assert_eq!(s.ops_since(id0).map(Iterator::collect::<Vec<_>>), Some(vec![op]));
            assert!(s.ops_since(id).is_none());
            assert_eq!(sealed_id(&v), Some(id));
            assert!(v.len() - state.len() <= TRAILER_MAX);
            // Without a replayable step: from a value without a trailer, or without an op.
            for (from, op) in [(Some(&state[..]), Some(&op)), (Some(&v0[..]), None), (None, Some(&op))] {
                let (v, _) = seal(writer(&state), from, op);
                assert_eq!(unseal(&v).unwrap().steps().count(), 0);
                assert_eq!(unseal(&v).unwrap().state, &state[..]);
            }
        }
        // A chain keeps the last MAX_STEPS operations, newest first; the operations since an
        // older state come oldest first.
        let all = ops();
        let (mut v, first) = seal(writer(&[1]), None, None);
        let mut ids = vec![first];
        for k in 0..8 {
            let (next, id) = seal(writer(&[k as u8]), Some(&v), all.get(k % all.len()));
            v = next;
            ids.push(id);
            let s = unseal(&v).unwrap();
            let steps: Vec<_> = s.steps().collect();
            assert_eq!(steps.len(), (k + 1).min(MAX_STEPS));
            for (j, (prev, op)) in steps.iter().enumerate() {
                assert_eq!(*prev, ids[k - j]);
                assert_eq!(Some(op), all.get((k - j) % all.len()));
            }
            for back in 1..=(k + 1).min(MAX_STEPS + 1) {
                let want = (back <= MAX_STEPS).then(|| (0..back).rev().map(|j| all[(k - j) % all.len()]).collect::<Vec<_>>());
                assert_eq!(s.ops_since(ids[k + 1 - back]).map(Iterator::collect::<Vec<_>>), want, "k {k} back {back}");
            }
            assert!(v.len() - 1 <= TRAILER_MAX);
        }
        // A value without a trailer, or a damaged one, is not unsealed (and never panics).
        assert_eq!(unseal(&[]), None);
        assert_eq!(unseal(&[TRAILER_MAGIC]), None);
        assert_eq!(unseal(&[1, 2, 3]), None);
        assert_eq!(sealed_id(&[1, 2, 3]), None);
        for cut in 0..v.len() {
            for d in [&v[cut..], &v[..cut]] {
                let _ = (unseal(d).map(|s| (s.steps().count(), s.ops_since(first))), sealed_id(d));
                let _ = seal(writer(&[]), Some(d), Some(&all[0]));
            }
        }
        for i in 0..v.len() {
            let mut d = v.clone();
            d[i] ^= 0x55;
            let _ = (unseal(&d).map(|s| (s.steps().count(), s.ops_since(first))), sealed_id(&d));
            let _ = seal(writer(&[]), Some(&d), Some(&all[0]));
        }
        // The largest operations fit the reserved room, MAX_STEPS of them.
        let big = Op::Finish { now: i64::MIN, receipt: Receipt { id: u64::MAX, queue: i32::MIN, owner: u32::MAX, initial_seats: u32::MAX, max_seats: u32::MAX, start: i64::MIN, additional_latency: i64::MIN } };
        let big2 = Op::Arrive { now: i64::MIN, work: WorkEstimate { initial_seats: u32::MAX, final_seats: u32::MAX, additional_latency: i64::MIN }, tag: RequestTag { owner: u32::MAX, context: u32::MAX, flow_schema: u16::MAX, flow_hash: u64::MAX, wait_deadline: i64::MIN } };
        for big in [big, big2] {
            let (mut v, _) = seal(writer(&[]), None, None);
            for _ in 0..MAX_STEPS + 1 {
                v = seal(writer(&[]), Some(&v), Some(&big)).0;
            }
            assert!(v.len() <= TRAILER_MAX, "{}", v.len());
            assert_eq!(unseal(&v).unwrap().steps().collect::<Vec<_>>().len(), MAX_STEPS);
        }
    }

    /// A value sealed by a module before 2026-11-22 (`hash ‖ previous hash ‖ operation`, no
    /// length byte) yields no step: nothing is replayed from it, it is decoded.
    #[test]
    fn old_single_step_trailers_yield_no_steps() {
        for op in ops() {
            let state = [5u8; 9];
            let mut w = writer(&state);
            w.fixed64(0x1111_2222_3333_4444);
            w.fixed64(0x5555_6666_7777_8888);
            encode_varint_form(&op, &mut w);
            let len = u16::try_from(w.len() - state.len()).unwrap();
            w.fixed16(len);
            w.u8(TRAILER_MAGIC);
            let v = w.into_bytes();
            let s = unseal(&v).unwrap();
            assert_eq!(s.state, &state[..]);
            assert_eq!(s.steps().count(), 0, "{op:?}");
            assert!(s.ops_since(0x5555_6666_7777_8888).is_none());
        }
    }

    /// Operations as modules before 2026-11-24 encoded them (varints, tags 1–3).
    fn encode_varint_form(op: &Op, w: &mut Writer) {
        match *op {
            Op::Arrive { now, work, tag } => {
                w.u8(1);
                w.i64(now);
                w.u32(work.initial_seats);
                w.u32(work.final_seats);
                w.i64(work.additional_latency);
                w.u32(tag.owner);
                w.u32(tag.context);
                w.u32(u32::from(tag.flow_schema));
                w.fixed64(tag.flow_hash);
                w.i64(tag.wait_deadline);
            }
            Op::Finish { now, receipt } => {
                w.u8(2);
                w.i64(now);
                receipt.encode(w);
            }
            Op::Cancel { now, id } => {
                w.u8(3);
                w.i64(now);
                w.u64(id);
            }
        }
    }

    /// Both forms decode to the operation; the fixed-width one is what is written.
    #[test]
    fn operations_decode_in_both_forms() {
        for op in ops() {
            let (mut fixed, mut varint) = (Writer::new(), Writer::new());
            op.encode(&mut fixed);
            encode_varint_form(&op, &mut varint);
            assert_ne!(fixed.as_slice(), varint.as_slice());
            for w in [fixed, varint] {
                let mut r = Reader::new(w.as_slice());
                assert_eq!(Op::decode(&mut r), Ok(op));
                assert_eq!(r.remaining(), 0);
            }
        }
    }

    #[test]
    fn write_ids_are_fresh_and_never_zero() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let (v, id) = seal(writer(&[1, 2, 3]), None, None);
            assert_ne!(id, 0);
            assert!(seen.insert(id), "id {id} repeated");
            assert_eq!(unseal(&v).map(|s| s.id), Some(id));
        }
        // Another thread (another worker) starts elsewhere.
        let other = std::thread::spawn(next_write_id).join().unwrap();
        assert!(!seen.contains(&other));
    }
}
