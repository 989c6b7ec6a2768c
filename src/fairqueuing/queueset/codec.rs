//! The wire format of a QueueSet in the shared store: a fixed header, the executing aggregates
//! and lingering seats, and per non-idle queue its waiting requests as a self-contained,
//! delta-coded segment (kept with the queue, so an operation re-encodes only the queues it
//! changed and a reader reuses the unchanged queues of a state it holds). Decoding never panics
//! and rejects structurally inconsistent input.

use std::collections::VecDeque;
use std::iter::Peekable;
use std::vec;

use super::executing::{ExecutingByOwner, Linger};
use super::fifo::{Queue, WaitList, Waiting};
use super::{request_work, Counters, QueueSet, MAX_QUEUES};
use crate::codec::{CodecError, CodecResult, Reader, Writer};
use crate::fairqueuing::{QueueSetConfig, RequestId, RequestTag, WorkEstimate};
use crate::Nanos;

/// Values of another version are not read (state keys carry the version, so modules of
/// different versions never share a value).
const ENCODING_VERSION: u8 = 6;
/// Flags of a waiting request's encoding: which fields repeat the previous request's.
const SAME_OWNER: u8 = 1;
const SAME_SCHEMA: u8 = 2;
const SAME_FLOW: u8 = 4;
const SAME_WORK: u8 = 8;
const SAME_ALLOWANCE: u8 = 16;
const ALL_FLAGS: u8 = 31;

impl QueueSet {
    pub fn encode(&self, w: &mut Writer) {
        w.u8(ENCODING_VERSION);
        w.i32(self.cfg.desired_queues);
        w.u32(self.cfg.queue_length_limit);
        w.u32(self.cfg.hand_size);
        w.u32(self.cfg.concurrency_limit);
        w.u8(u8::from(self.cfg.strict_limit));
        w.u64(self.current_r);
        w.i64(self.last_real_time);
        w.u32(self.robin_index);
        w.u64(self.enqueues);
        w.u64(self.next_id);
        // An array, not a chain of iterators: the loop unrolls into plain writes.
        for v in self.counters.values() {
            w.u64(v);
        }
        w.usize(self.execs.len());
        for e in &self.execs {
            w.u32(e.owner);
            w.i32(e.queue);
            w.u32(e.executing);
            w.u64(e.seats);
        }
        w.usize(self.lingers.len());
        for l in &self.lingers {
            w.i64(l.until.wrapping_sub(self.last_real_time));
            w.i32(l.queue);
            w.u32(l.owner);
            w.u64(l.seats);
        }
        w.usize(self.queues.len());
        let mut prev: u32 = 0;
        for q in &self.queues {
            // Index delta from the previous one (first: absolute).
            w.u32(q.index.wrapping_sub(prev));
            prev = q.index;
            w.i64(q.next_dispatch_r.wrapping_sub(self.current_r) as i64);
            w.usize(q.waiting.len());
            w.bytes(q.waiting.encoded());
        }
    }

    /// One waiting request, delta-coded against the one before it in its queue (`prev`):
    /// a flags byte says which of owner, FlowSchema, flow, work and wait allowance (deadline
    /// minus arrival) repeat the previous request's and are left out; id, context, arrival
    /// and virtual arrival are differences from the previous request's (the first request's
    /// are absolute, so a queue's encoding depends on its requests alone). Requests of one
    /// queue mostly come from one flow moments apart, so an entry takes ≈ 10 bytes, not ≈ 30.
    pub(super) fn encode_waiting(w: &mut Writer, r: &Waiting, prev: Option<&Waiting>) {
        let t = &r.tag;
        let allowance = wait_allowance(r);
        let flags = prev.map_or(0, |p| {
            u8::from(p.tag.owner == t.owner) * SAME_OWNER
                + u8::from(p.tag.flow_schema == t.flow_schema) * SAME_SCHEMA
                + u8::from(p.tag.flow_hash == t.flow_hash) * SAME_FLOW
                + u8::from(p.work == r.work) * SAME_WORK
                + u8::from(wait_allowance(p) == allowance) * SAME_ALLOWANCE
        });
        w.u8(flags);
        match prev {
            None => {
                w.u64(r.id);
                w.u32(t.context);
                w.u64(r.arrival_r);
                w.i64(r.arrival);
            }
            Some(p) => {
                w.i64(r.id.wrapping_sub(p.id) as i64);
                w.i64(i64::from(t.context) - i64::from(p.tag.context));
                w.i64(r.arrival_r.wrapping_sub(p.arrival_r) as i64);
                w.i64(r.arrival.wrapping_sub(p.arrival));
            }
        }
        if flags & SAME_OWNER == 0 {
            w.u32(t.owner);
        }
        if flags & SAME_SCHEMA == 0 {
            w.u32(u32::from(t.flow_schema));
        }
        if flags & SAME_FLOW == 0 {
            w.fixed64(t.flow_hash);
        }
        if flags & SAME_WORK == 0 {
            w.u32(r.work.initial_seats);
            w.u32(r.work.final_seats);
            w.i64(r.work.additional_latency);
        }
        if flags & SAME_ALLOWANCE == 0 {
            w.u8(u8::from(allowance.is_some()));
            if let Some(a) = allowance {
                w.i64(a);
            }
        }
    }

    /// Decodes a state written by [`QueueSet::encode`]. Never panics; rejects structurally
    /// inconsistent input (bad config, unsorted or idle queues, duplicate ids, overflowing sums).
    pub fn decode(r: &mut Reader) -> CodecResult<QueueSet> {
        Self::decode_reusing(r, None)
    }

    /// [`QueueSet::decode`], taking each queue's waiting requests from `prior` (a state this
    /// thread holds, e.g. the one it wrote last) when they encode to exactly the stored
    /// segment: the result is the same, but only the queues that changed are decoded.
    pub fn decode_reusing(r: &mut Reader, prior: Option<QueueSet>) -> CodecResult<QueueSet> {
        // Room for as many ids as the prior state held waiting (the usual count).
        let id_room = prior.as_ref().map_or(0, |p| p.tot_requests_waiting as usize).saturating_add(8);
        let mut prior_queues = prior.map(|p| p.queues).unwrap_or_default().into_iter().peekable();
        let mut qs = Self::decode_header(r)?;
        let mut ids: Vec<RequestId> = Vec::with_capacity(id_room);
        qs.decode_executing(r)?;
        qs.decode_lingering(r)?;
        let nq = r.count(3)?;
        qs.queues.reserve(nq);
        let mut prev: Option<u32> = None;
        for _ in 0..nq {
            let index = Self::decode_queue_index(r, prev)?;
            prev = Some(index);
            let q = qs.decode_queue(r, index, &mut prior_queues, &mut ids)?;
            qs.queues.push(q);
        }
        qs.attach_held_seats()?;
        if qs.queues.iter().any(|q| q.is_stored_idle()) {
            return Err(CodecError("idle queue stored"));
        }
        if has_duplicates(&mut ids) {
            return Err(CodecError("duplicate request id"));
        }
        Ok(qs)
    }

    /// The fixed header: version, configuration, clocks, id counter and counters.
    #[inline]
    fn decode_header(r: &mut Reader) -> CodecResult<QueueSet> {
        if r.u8()? != ENCODING_VERSION {
            return Err(CodecError("unknown queueset encoding version"));
        }
        let (desired_queues, queue_length_limit, hand_size) = (r.i32()?, r.u32()?, r.u32()?);
        let concurrency_limit = r.u32()?;
        let strict_limit = match r.u8()? {
            0 => false,
            1 => true,
            _ => return Err(CodecError("bad strict-limit flag")),
        };
        let cfg = QueueSetConfig { desired_queues, queue_length_limit, hand_size, concurrency_limit, strict_limit };
        let mut qs = QueueSet::new(cfg, 0).map_err(|_| CodecError("invalid queueset config"))?;
        qs.current_r = r.u64()?;
        qs.last_real_time = r.i64()?;
        qs.robin_index = r.u32()?;
        qs.enqueues = r.u64()?;
        qs.next_id = r.u64()?;
        if qs.next_id == 0 {
            return Err(CodecError("bad next id"));
        }
        qs.counters = Counters {
            dispatched: r.u64()?,
            rejected_queue_full: r.u64()?,
            rejected_concurrency_limit: r.u64()?,
            timed_out: r.u64()?,
            epoch_advances: r.u64()?,
            epoch_advance_failures: r.u64()?,
            no_accommodation: r.u64()?,
        };
        Ok(qs)
    }

    /// The executing aggregates (sorted by owner and queue), summed into the totals.
    #[inline]
    fn decode_executing(&mut self, r: &mut Reader) -> CodecResult<()> {
        let n = r.count(4)?;
        self.execs.reserve(n);
        for _ in 0..n {
            let e = ExecutingByOwner { owner: r.u32()?, queue: r.i32()?, executing: r.u32()?, seats: r.u64()? };
            if e.queue < -1 || e.executing == 0 {
                return Err(CodecError("bad executing aggregate"));
            }
            if self.execs.last().is_some_and(|p| (p.owner, p.queue) >= (e.owner, e.queue)) {
                return Err(CodecError("executing aggregates not sorted"));
            }
            self.tot_requests_executing = self.tot_requests_executing.checked_add(e.executing).ok_or(CodecError("too many requests"))?;
            self.tot_seats_in_use = self.tot_seats_in_use.checked_add(e.seats).ok_or(CodecError("seat overflow"))?;
            self.execs.push(e);
        }
        Ok(())
    }

    /// The lingering seats (their times relative to the last real time), summed into the totals.
    #[inline]
    fn decode_lingering(&mut self, r: &mut Reader) -> CodecResult<()> {
        let n = r.count(4)?;
        self.lingers.reserve(n);
        for _ in 0..n {
            let l = Linger { until: self.last_real_time.wrapping_add(r.i64()?), queue: r.i32()?, owner: r.u32()?, seats: r.u64()? };
            if l.queue < -1 {
                return Err(CodecError("bad lingering queue"));
            }
            self.tot_seats_in_use = self.tot_seats_in_use.checked_add(l.seats).ok_or(CodecError("seat overflow"))?;
            self.lingers.push(l);
        }
        Ok(())
    }

    /// A stored queue's index, delta-coded from the previous one's (`prev`): strictly
    /// increasing and below [`MAX_QUEUES`].
    #[inline]
    fn decode_queue_index(r: &mut Reader, prev: Option<u32>) -> CodecResult<u32> {
        let d = r.u32()?;
        if prev.is_some() && d == 0 {
            return Err(CodecError("queues not sorted"));
        }
        let index = prev.unwrap_or(0).checked_add(d).ok_or(CodecError("queue index overflow"))?;
        if index >= MAX_QUEUES {
            return Err(CodecError("queue index out of range"));
        }
        Ok(index)
    }

    /// One stored queue (its index already read): its next dispatch R and waiting requests,
    /// whose ids are checked and collected into `ids` and whose counts go into the totals.
    #[inline]
    fn decode_queue(
        &mut self,
        r: &mut Reader,
        index: u32,
        prior_queues: &mut Peekable<vec::IntoIter<Queue>>,
        ids: &mut Vec<RequestId>,
    ) -> CodecResult<Queue> {
        let mut q = Queue::new(index);
        q.next_dispatch_r = self.current_r.wrapping_add(r.i64()? as u64);
        // The queue's requests, and their sums, taken from the prior state when its segment
        // is unchanged (the sums depend on the requests alone); else decoded.
        let nw = r.count(0)?;
        let seg = r.bytes()?;
        // `peek` rather than `next_if`: the latter does not inline here.
        while prior_queues.peek().is_some_and(|p| p.index < index) {
            prior_queues.next();
        }
        match prior_queues.next_if(|p| p.index == index) {
            Some(p) if p.waiting.len() == nw && p.waiting.enc.get().map(Vec::as_slice) == Some(seg) => {
                (q.initial_seats_sum, q.max_seats_sum, q.total_work_sum) = (p.initial_seats_sum, p.max_seats_sum, p.total_work_sum);
                q.waiting = p.waiting;
            }
            _ => {
                q.waiting = decode_segment(seg, nw)?;
                for &Waiting { work, .. } in q.waiting.iter() {
                    q.initial_seats_sum = q.initial_seats_sum.checked_add(work.initial_seats as u64).ok_or(CodecError("seat overflow"))?;
                    q.max_seats_sum = q.max_seats_sum.checked_add(work.max_seats() as u64).ok_or(CodecError("seat overflow"))?;
                    q.total_work_sum = q.total_work_sum.wrapping_add(request_work(&work, self.g).1 .0);
                }
            }
        }
        // Ids the state has handed out (1 to `next_id` − 1), checked and collected in one pass.
        for w in q.waiting.iter() {
            if w.id == 0 || w.id >= self.next_id {
                return Err(CodecError("bad request id"));
            }
            ids.push(w.id);
        }
        let n = u32::try_from(q.waiting.len()).map_err(|_| CodecError("too many requests"))?;
        self.tot_requests_waiting = self.tot_requests_waiting.checked_add(n).ok_or(CodecError("too many requests"))?;
        self.tot_seats_waiting = self.tot_seats_waiting.checked_add(q.max_seats_sum).ok_or(CodecError("seat overflow"))?;
        Ok(q)
    }

    /// Attaches the executing and lingering seats to their queues (which must be stored).
    #[inline]
    fn attach_held_seats(&mut self) -> CodecResult<()> {
        let execs = self.execs.iter().map(|e| (e.queue, e.executing, 0, e.seats));
        for (queue, executing, lingering, seats) in execs.chain(self.lingers.iter().map(|l| (l.queue, 0, 1, l.seats))) {
            let Ok(index) = u32::try_from(queue) else { continue };
            let pos = self.queues.binary_search_by_key(&index, |q| q.index);
            let pos = pos.map_err(|_| CodecError("seats held in a queue that is not stored"))?;
            let q = self.queues.get_mut(pos).ok_or(CodecError("bad queue position"))?;
            q.requests_executing = q.requests_executing.checked_add(executing).ok_or(CodecError("too many requests"))?;
            q.lingering = q.lingering.checked_add(lingering).ok_or(CodecError("too many requests"))?;
            q.seats_in_use = q.seats_in_use.checked_add(seats).ok_or(CodecError("seat overflow"))?;
        }
        Ok(())
    }

    /// Moves past one entry written by [`Self::encode_waiting`] (`first`: the segment's first,
    /// written without a previous request) without decoding it: where an entry ends is all a
    /// kept segment's edits need.
    pub(super) fn skip_waiting(r: &mut Reader, first: bool) -> CodecResult<()> {
        let flags = r.u8()?;
        let given = |bit: u8| usize::from(first || flags & bit == 0);
        // In the encoding's order: id, context, arrival R and time, owner and FlowSchema
        // (varints), flow (fixed 8 bytes), work (3 varints), allowance (flag byte, varint).
        r.skip_varints(4 + given(SAME_OWNER) + given(SAME_SCHEMA))?;
        if given(SAME_FLOW) == 1 {
            r.fixed64()?;
        }
        r.skip_varints(3 * given(SAME_WORK))?;
        let deadline = if given(SAME_ALLOWANCE) == 1 { r.u8()? } else { 0 };
        if deadline > 1 {
            return Err(CodecError("bad deadline flag"));
        }
        r.skip_varints(deadline.into())
    }

    /// The inverse of [`QueueSet::encode_waiting`] (the id is checked by the caller).
    pub(super) fn decode_waiting(r: &mut Reader, prev: Option<&Waiting>) -> CodecResult<Waiting> {
        let flags = r.u8()?;
        if flags & !ALL_FLAGS != 0 || (prev.is_none() && flags != 0) {
            return Err(CodecError("bad waiting-request flags"));
        }
        let (id, context, arrival_r, arrival) = match prev {
            None => (r.u64()?, r.u32()?, r.u64()?, r.i64()?),
            Some(p) => (
                p.id.wrapping_add(r.i64()? as u64),
                u32::try_from(i64::from(p.tag.context).wrapping_add(r.i64()?)).map_err(|_| CodecError("bad context"))?,
                p.arrival_r.wrapping_add(r.i64()? as u64),
                p.arrival.wrapping_add(r.i64()?),
            ),
        };
        let same = |bit: u8| prev.filter(|_| flags & bit != 0);
        // `match`es, not `map_or_else` with closures: these inline into the decoding loop.
        let owner = match same(SAME_OWNER) {
            Some(p) => p.tag.owner,
            None => r.u32()?,
        };
        let flow_schema = match same(SAME_SCHEMA) {
            Some(p) => p.tag.flow_schema,
            None => u16::try_from(r.u32()?).map_err(|_| CodecError("bad flow schema"))?,
        };
        let flow_hash = match same(SAME_FLOW) {
            Some(p) => p.tag.flow_hash,
            None => r.fixed64()?,
        };
        let work = match same(SAME_WORK) {
            Some(p) => p.work,
            None => WorkEstimate { initial_seats: r.u32()?, final_seats: r.u32()?, additional_latency: r.i64()? },
        };
        let allowance = match same(SAME_ALLOWANCE) {
            Some(p) => wait_allowance(p),
            None => match r.u8()? {
                0 => None,
                1 => Some(r.i64()?),
                _ => return Err(CodecError("bad deadline flag")),
            },
        };
        let wait_deadline = allowance.map_or(Nanos::MAX, |a| arrival.wrapping_add(a));
        Ok(Waiting { id, tag: RequestTag { owner, context, flow_schema, flow_hash, wait_deadline }, work, arrival_r, arrival })
    }
}

/// Ids within this distance of the smallest are checked for duplicates with a bitmap (the usual
/// case: waiting requests arrived recently), others by sorting.
pub(super) const ID_WINDOW: u64 = 4096;

/// Whether a request id appears twice in `ids`.
pub(super) fn has_duplicates(ids: &mut [RequestId]) -> bool {
    let Some((lo, hi)) = ids.iter().fold(None, |b, &id| Some(b.map_or((id, id), |(lo, hi): (u64, u64)| (lo.min(id), hi.max(id))))) else {
        return false;
    };
    // A bitmap no larger than the ids span (usually a few hundred ids: 8 words, not 64 to zero).
    match hi - lo {
        0..512 => repeats(ids, lo, &mut [0u64; 8]),
        512..ID_WINDOW => repeats(ids, lo, &mut [0u64; (ID_WINDOW / 64) as usize]),
        _ => {
            ids.sort_unstable();
            ids.windows(2).any(|w| w.first() == w.get(1))
        }
    }
}

/// Whether an id occurs twice, with `seen` (zeroed) as a bitmap from `lo`.
fn repeats(ids: &[RequestId], lo: u64, seen: &mut [u64]) -> bool {
    !ids.iter().all(|&id| {
        let (word, bit) = (seen.get_mut(((id - lo) / 64) as usize), 1u64 << ((id - lo) % 64));
        word.is_some_and(|w| std::mem::replace(w, *w | bit) & bit == 0)
    })
}

/// A queue's segment: its requests, each delta-coded against the one before it.
pub(super) fn encode_segment(reqs: &VecDeque<Waiting>) -> Vec<u8> {
    let mut w = Writer::with_capacity(12 * reqs.len());
    // The previous entry carried along, not looked up by index (a `VecDeque` lookup each).
    let mut prev: Option<&Waiting> = None;
    for r in reqs {
        QueueSet::encode_waiting(&mut w, r, prev);
        prev = Some(r);
    }
    w.into_bytes()
}

/// A queue's `n` waiting requests from its segment (which must hold exactly them); the
/// segment is kept as their encoding.
pub(super) fn decode_segment(seg: &[u8], n: usize) -> CodecResult<WaitList> {
    if n.saturating_mul(5) > seg.len() {
        return Err(CodecError("count exceeds input"));
    }
    let mut r = Reader::new(seg);
    let mut reqs: VecDeque<Waiting> = VecDeque::with_capacity(n);
    for _ in 0..n {
        reqs.push_back(QueueSet::decode_waiting(&mut r, reqs.back())?);
    }
    if r.remaining() != 0 {
        return Err(CodecError("trailing bytes in a queue"));
    }
    Ok(WaitList { reqs, enc: seg.to_vec().into() })
}

/// How long a waiting request may wait from its arrival (`None`: no deadline).
fn wait_allowance(w: &Waiting) -> Option<Nanos> {
    (w.tag.wait_deadline != Nanos::MAX).then(|| w.tag.wait_deadline.wrapping_sub(w.arrival))
}
