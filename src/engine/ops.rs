//! Level operations that another worker can replay.
//!
//! Every update of a level reads its shared value, decodes it, applies one operation and writes
//! it back. With several workers the value read was usually written by another worker, so the
//! reader's cached copy (its own last write, [`super::cache`]) is one operation behind. Each
//! value therefore ends with a small trailer naming the state it was derived from and the
//! operation applied: a reader whose cached state is that previous state replays the operation
//! on its copy instead of decoding the whole value, and keeps the result only if it encodes to
//! exactly the stored bytes (so a replay is never trusted, it is checked; otherwise it decodes).
//!
//! Layout: `state ‖ trailer ‖ trailer length (u16 LE) ‖ TRAILER_MAGIC`, the trailer being
//! `write id (8 B) ‖ previous write id (8 B) ‖ operation` ([`next_write_id`]; modules before
//! 2026-11-22 wrote hashes of the state bytes there, which read as ids that match nothing). [`super::LevelState::decode`]
//! ignores what follows the state, so values with and without a trailer are read alike by every
//! version of the module.

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

    fn encode(&self, w: &mut Writer) {
        match *self {
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

    fn decode(r: &mut Reader) -> CodecResult<Op> {
        Ok(match r.u8()? {
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

/// Room a trailer needs at most (ids, the largest operation, length and magic).
pub const TRAILER_MAX: usize = 96;

/// Appends the trailer to `w`, which holds the encoded state (written with [`TRAILER_MAX`]
/// bytes to spare): a fresh write id ([`next_write_id`]), the previous state's id and the
/// operation (none: a value nobody can replay to, e.g. after a reconfiguration). Returns the
/// value and its id.
pub fn seal(mut w: Writer, prev: Option<u64>, op: Option<&Op>) -> (Vec<u8>, u64) {
    let start = w.len();
    let id = next_write_id();
    w.fixed64(id);
    match (prev, op) {
        (Some(p), Some(op)) => {
            w.fixed64(p);
            op.encode(&mut w);
        }
        _ => w.fixed64(0),
    }
    let len = u16::try_from(w.len().saturating_sub(start)).unwrap_or(u16::MAX);
    w.fixed16(len);
    w.u8(TRAILER_MAGIC);
    (w.into_bytes(), id)
}

/// The trailer's write id alone (what the next writer records as "previous").
pub fn sealed_id(value: &[u8]) -> Option<u64> {
    let (_, trailer) = split(value)?;
    Reader::new(trailer).fixed64().ok()
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
    /// The previous state's id and the operation that led here, when replayable.
    pub step: Option<(u64, Op)>,
}

/// Splits a value written by [`seal`]; `None` for values without a (well-formed) trailer.
pub fn unseal(value: &[u8]) -> Option<Sealed<'_>> {
    let (state, trailer) = split(value)?;
    let mut r = Reader::new(trailer);
    let id = r.fixed64().ok()?;
    let prev = r.fixed64().ok()?;
    let step = if prev == 0 || r.remaining() == 0 { None } else { Some((prev, Op::decode(&mut r).ok()?)) };
    if r.remaining() != 0 {
        return None;
    }
    Some(Sealed { state, id, step })
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
        for op in ops() {
            let state = vec![1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];
            let (v, id) = seal(writer(&state), Some(0x1234), Some(&op));
            let s = unseal(&v).unwrap();
            assert_eq!(s, Sealed { state: &state, id, step: Some((0x1234, op)) });
            assert_eq!(sealed_id(&v), Some(id));
            assert!(v.len() - state.len() <= TRAILER_MAX);
            // Without a replayable step.
            let (v, _) = seal(writer(&state), None, Some(&op));
            assert_eq!(unseal(&v).unwrap().step, None);
            assert_eq!(unseal(&v).unwrap().state, &state[..]);
        }
        // A value without a trailer, or a damaged one, is not unsealed (and never panics).
        assert_eq!(unseal(&[]), None);
        assert_eq!(unseal(&[TRAILER_MAGIC]), None);
        assert_eq!(unseal(&[1, 2, 3]), None);
        assert_eq!(sealed_id(&[1, 2, 3]), None);
        let (v, _) = seal(writer(&[9; 30]), Some(1), Some(&ops()[0]));
        for cut in 0..v.len() {
            let _ = (unseal(&v[cut..]), sealed_id(&v[cut..]));
            let _ = (unseal(&v[..cut]), sealed_id(&v[..cut]));
        }
        for i in 0..v.len() {
            let mut d = v.clone();
            d[i] ^= 0x55;
            let _ = (unseal(&d), sealed_id(&d));
        }
        // The largest operation fits the reserved room.
        let big = Op::Finish { now: i64::MIN, receipt: Receipt { id: u64::MAX, queue: i32::MIN, owner: u32::MAX, initial_seats: u32::MAX, max_seats: u32::MAX, start: i64::MIN, additional_latency: i64::MIN } };
        let (v, _) = seal(writer(&[]), Some(u64::MAX), Some(&big));
        assert!(v.len() <= TRAILER_MAX, "{}", v.len());
        let big = Op::Arrive { now: i64::MIN, work: WorkEstimate { initial_seats: u32::MAX, final_seats: u32::MAX, additional_latency: i64::MIN }, tag: RequestTag { owner: u32::MAX, context: u32::MAX, flow_schema: u16::MAX, flow_hash: u64::MAX, wait_deadline: i64::MIN } };
        let (v, _) = seal(writer(&[]), Some(u64::MAX), Some(&big));
        assert!(v.len() <= TRAILER_MAX, "{}", v.len());
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
