//! The APF engine: one global QueueSet per priority level ([`LevelState`]), kept in a shared
//! key-value store with compare-and-swap so that every Envoy worker VM of the process sees and
//! updates the same seats and queues (`docs/design.md` shows the shared keys). The engine is
//! host-independent: the clock is a `Nanos` argument, the store a [`store::Store`]. Keys are
//! namespaced and versioned because Istio leaves `vm_id` empty, so several plugins may share one
//! namespace. Operations return [`Notice`]s: requests owned by some worker that must now be
//! resumed (dispatched) or answered 429; [`requests`] routes them to their owner.

pub mod cache;
pub mod compiled;
pub mod contention;
pub mod debug;
pub mod object_counts;
pub mod requests;
pub mod store;
pub mod watches;
pub mod workers;

use crate::codec::{CodecError, Reader, Writer};
use crate::fairqueuing::queueset::{Arrival, QueueSet};
use crate::fairqueuing::{Dispatched, QueueSetConfig, Receipt, RejectReason, RequestId, RequestTag, WorkEstimate};
use crate::limits::borrowing::{update_borrowing, BorrowingLevel, SeatDemandStats};
use crate::limits::integrator::Integrator;
use crate::limits::retry_after::DroppedRequestsTracker;
use crate::Nanos;
pub use compiled::{Compiled, LevelRuntime};
use store::{update, Store, StoreError};
use workers::Registry;

pub const LEVEL_STATE_VERSION: u8 = 1;
/// CAS retries before an operation gives up (the caller then fails open for that request).
pub const MAX_CAS_TRIES: u32 = 64;
pub const REGISTRY_KEY: &str = "apf/v3/workers";
pub const BORROW_KEY: &str = "apf/v3/borrow";
pub const WATCHES_KEY: &str = "apf/v3/watches";
pub const LEVEL_KEY_PREFIX: &str = "apf/v3/pl/";

pub fn level_key(level_name: &str) -> String {
    format!("{LEVEL_KEY_PREFIX}{level_name}")
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    Store(StoreError),
    Corrupt(CodecError),
    Config(String),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        EngineError::Store(e)
    }
}
impl From<CodecError> for EngineError {
    fn from(e: CodecError) -> Self {
        EngineError::Corrupt(e)
    }
}
impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Store(e) => write!(f, "{e}"),
            EngineError::Corrupt(e) => write!(f, "{e}"),
            EngineError::Config(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Store(e) => Some(e),
            EngineError::Corrupt(e) => Some(e),
            EngineError::Config(_) => None,
        }
    }
}

/// The state of one priority level as stored in the shared store.
#[derive(Debug, Clone)]
pub struct LevelState {
    /// Configuration generation that last (re)configured the QueueSet; an older configuration
    /// still serving in-flight requests never reconfigures a level a newer one has set.
    pub generation: u64,
    pub qs: QueueSet,
    pub demand: Integrator,
    pub dropped: DroppedRequestsTracker,
}

impl LevelState {
    pub fn new(cfg: QueueSetConfig, generation: u64, now: Nanos) -> Result<LevelState, EngineError> {
        Ok(LevelState {
            generation,
            qs: QueueSet::new(cfg, now).map_err(EngineError::Config)?,
            demand: Integrator::new(now),
            dropped: DroppedRequestsTracker::default(),
        })
    }

    pub fn decode(bytes: &[u8]) -> Result<LevelState, CodecError> {
        Self::decode_reusing(bytes, None)
    }

    /// [`LevelState::decode`] reusing `prior`'s unchanged queues ([`QueueSet::decode_reusing`]).
    pub fn decode_reusing(bytes: &[u8], prior: Option<LevelState>) -> Result<LevelState, CodecError> {
        let mut r = versioned(bytes, LEVEL_STATE_VERSION, "level state version")?;
        let generation = r.u64()?;
        let qs = QueueSet::decode_reusing(&mut r, prior.map(|p| p.qs))?;
        let demand = Integrator::decode(&mut r)?;
        let dropped = DroppedRequestsTracker::decode(&mut r)?;
        Ok(LevelState { generation, qs, demand, dropped })
    }

    pub fn encode(&self) -> Vec<u8> {
        // Sized for the usual value (≈ 10 bytes per waiting request) so it is allocated once.
        let mut w = Writer::with_capacity(128 + 16 * self.qs.requests_waiting() as usize);
        w.u8(LEVEL_STATE_VERSION);
        w.u64(self.generation);
        self.qs.encode(&mut w);
        self.demand.encode(&mut w);
        self.dropped.encode(&mut w);
        w.into_bytes()
    }

    /// Loads the stored state, creating it for `lvl` when absent or unreadable, and applies
    /// `lvl`'s queuing configuration if it comes from a newer generation.
    fn load(
        store: &dyn Store,
        key: &str,
        bytes: Option<&[u8]>,
        lvl: &LevelRuntime,
        generation: u64,
        now: Nanos,
        out: &mut Vec<Dispatched>,
    ) -> Result<LevelState, EngineError> {
        // A match, not Option/Result adapters: those move the whole state twice more (memcpy).
        let existing = bytes.and_then(|b| match cache::decode(store, key, b) {
            Ok(s) => Some(s),
            Err(e) => {
                log::error!("apf: discarding unreadable level state ({e})");
                None
            }
        });
        let Some(mut st) = existing else { return LevelState::new(lvl.qs_config, generation, now) };
        if generation > st.generation {
            let mut cfg = lvl.qs_config;
            // The concurrency limit is dynamic (borrowing); keep the current one unless the
            // level changed between exempt / reject / queuing.
            let cur = st.qs.config();
            if cur.desired_queues.signum() == cfg.desired_queues.signum() {
                cfg.concurrency_limit = cur.concurrency_limit.clamp(lvl.min_limit, lvl.max_limit.max(lvl.min_limit));
            }
            if cfg != cur {
                out.extend(st.qs.reconfigure(cfg, now).map_err(EngineError::Config)?);
            }
            st.generation = generation;
        }
        Ok(st)
    }

    /// Counts a request rejected at `now`; returns the Retry-After to answer it with.
    fn reject(&mut self, now: Nanos) -> i64 {
        self.dropped.record_dropped(now.div_euclid(crate::NANOS_PER_SEC));
        self.dropped.retry_after()
    }
}

/// What happened to an arriving request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Seats taken; let the request through now. Keep the receipt to finish it.
    Execute(Receipt),
    /// Waiting in a queue; hold the request until a [`Notice`] says otherwise.
    Queued(RequestId),
    /// Answer 429 with this `Retry-After`.
    Rejected { reason: RejectReason, retry_after: i64 },
}

/// Something a worker must do for one of its paused requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub owner: u32,
    pub context: u32,
    pub level_key: String,
    pub id: RequestId,
    pub kind: NoticeKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    /// Dispatched: resume it (and keep the receipt to finish it).
    Run { waited: Nanos, receipt: Receipt },
    /// Gave up waiting: answer 429.
    Reject { reason: RejectReason, retry_after: i64 },
}

impl Notice {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(32 + self.level_key.len());
        w.u32(self.owner);
        w.u32(self.context);
        w.str(&self.level_key);
        w.u64(self.id);
        match self.kind {
            NoticeKind::Run { waited, receipt } => {
                w.u8(0);
                w.i64(waited);
                receipt.encode(&mut w);
            }
            NoticeKind::Reject { reason, retry_after } => {
                w.u8(1);
                w.u8(reason.code());
                w.i64(retry_after);
            }
        }
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Notice, CodecError> {
        let mut r = Reader::new(bytes);
        let owner = r.u32()?;
        let context = r.u32()?;
        let level_key = r.str()?.to_string();
        let id = r.u64()?;
        let kind = match r.u8()? {
            0 => NoticeKind::Run { waited: r.i64()?, receipt: Receipt::decode(&mut r)? },
            1 => NoticeKind::Reject { reason: RejectReason::from_code(r.u8()?).ok_or(CodecError("reason"))?, retry_after: r.i64()? },
            _ => return Err(CodecError("notice kind")),
        };
        Ok(Notice { owner, context, level_key, id, kind })
    }
}

/// Admits a classified request to priority level `level` (index into the compiled levels).
pub fn admit(
    c: &Compiled,
    store: &dyn Store,
    now: Nanos,
    level: usize,
    work: WorkEstimate,
    tag: RequestTag,
    notices: &mut Vec<Notice>,
) -> Result<Decision, EngineError> {
    admit_observed(c, store, now, level, work, tag, notices).map(|(d, _)| d)
}

/// [`admit`], also giving the length of the request's queue after it was enqueued (`None`
/// when it was not enqueued): upstream's `request_queue_length_after_enqueue`.
pub fn admit_observed(
    c: &Compiled,
    store: &dyn Store,
    now: Nanos,
    level: usize,
    work: WorkEstimate,
    tag: RequestTag,
    notices: &mut Vec<Notice>,
) -> Result<(Decision, Option<u32>), EngineError> {
    let lvl = c.levels.get(level).ok_or_else(|| EngineError::Config("level index out of range".into()))?;
    let r = update_level(store, now, &lvl.key, Some((lvl, c.generation)), notices, |st, out| {
        let (arrival, length) = st.qs.arrive_observed(now, work, tag, out);
        let decision = match arrival {
            Arrival::Executing(rc) => Decision::Execute(rc),
            Arrival::Queued(id) => Decision::Queued(id),
            Arrival::Rejected(reason) => Decision::Rejected { reason, retry_after: st.reject(now) },
        };
        (decision, length)
    })?;
    r.ok_or_else(|| EngineError::Config("arrival without a decision".into()))
}

/// The one write path of a level: one CAS update of its stored state. Loads the state
/// (decoded, or this worker's own last write from [`cache`]); with `create`, a missing or
/// unreadable state is created for that level and a newer configuration generation applied;
/// without, nothing changes when the level has no state (then `None`). Applies `f` (which may
/// dispatch into the list it gets), records the seat demand, encodes; what was dispatched is
/// appended to `notices`.
fn update_level<T>(
    store: &dyn Store,
    now: Nanos,
    level_key: &str,
    create: Option<(&LevelRuntime, u64)>,
    notices: &mut Vec<Notice>,
    mut f: impl FnMut(&mut LevelState, &mut Vec<Dispatched>) -> T,
) -> Result<Option<T>, EngineError> {
    let r = update(store, level_key, MAX_CAS_TRIES, |cur| {
        let mut out = Vec::new();
        let mut st = match create {
            Some((lvl, generation)) => LevelState::load(store, level_key, cur, lvl, generation, now, &mut out)?,
            None => match cur {
                Some(bytes) => cache::decode(store, level_key, bytes)?,
                None => return Ok::<_, EngineError>((Vec::new(), None)),
            },
        };
        let r = f(&mut st, &mut out);
        st.demand.set(now, f64::from(st.qs.seat_demand()));
        Ok((cache::encode(store, level_key, st), Some((r, out))))
    })?;
    Ok(r.map(|(r, dispatched)| {
        notices.extend(dispatched.iter().map(|d| Notice {
            owner: d.tag.owner,
            context: d.tag.context,
            level_key: level_key.to_string(),
            id: d.id,
            kind: NoticeKind::Run { waited: d.waited, receipt: d.receipt },
        }));
        r
    }))
}

/// The request's handler returned (or a WATCH finished initializing): release its seats
/// (after its additional latency, if any) and dispatch what fits. Returns false when the seats
/// were already released (double finish, or the owner's lease was reaped).
pub fn finish(store: &dyn Store, now: Nanos, level_key: &str, receipt: &Receipt, notices: &mut Vec<Notice>) -> Result<bool, EngineError> {
    Ok(update_level(store, now, level_key, None, notices, |st, out| st.qs.finish(now, receipt, out))?.unwrap_or(false))
}

/// The request's stream ended: an executing request (its receipt given) finishes; a waiting
/// one leaves its queue (counted as `time-out`, as upstream counts cancellations). A request
/// dispatched while its wake-up is still in flight is finished when the wake-up arrives.
pub fn end(
    store: &dyn Store,
    now: Nanos,
    level_key: &str,
    id: RequestId,
    receipt: Option<&Receipt>,
    notices: &mut Vec<Notice>,
) -> Result<(), EngineError> {
    if let Some(rc) = receipt {
        return finish(store, now, level_key, rc, notices).map(|_| ());
    }
    update_level(store, now, level_key, None, notices, |st, _| st.qs.cancel(now, id)).map(|_| ())
}

/// Gives up waiting for a queued request (its wait limit passed). Returns the Retry-After to
/// answer with, or `None` when it was dispatched meanwhile (then it must be resumed instead).
pub fn time_out(store: &dyn Store, now: Nanos, level_key: &str, id: RequestId) -> Result<Option<i64>, EngineError> {
    let r = update_level(store, now, level_key, None, &mut Vec::new(), |st, _| st.qs.cancel(now, id).map(|_| st.reject(now)));
    Ok(r?.flatten())
}

/// Timer work for one level: wait deadlines and lingering seats that are due. Cheap when
/// nothing is due (one read, no write).
pub fn expire_level(store: &dyn Store, now: Nanos, level_key: &str, notices: &mut Vec<Notice>) -> Result<(), EngineError> {
    if read_level(store, level_key)?.and_then(|st| st.qs.next_event()).is_none_or(|t| t > now) {
        return Ok(());
    }
    // The time-outs come before the dispatches they made room for.
    let mut runs = Vec::new();
    let timed_out = update_level(store, now, level_key, None, &mut runs, |st, out| {
        let mut timed = Vec::new();
        st.qs.expire(now, &mut timed, out);
        let notice = |(id, tag): (RequestId, RequestTag), retry_after| {
            let kind = NoticeKind::Reject { reason: RejectReason::TimeOut, retry_after };
            Notice { owner: tag.owner, context: tag.context, level_key: level_key.to_string(), id, kind }
        };
        timed.into_iter().map(|t| notice(t, st.reject(now))).collect::<Vec<_>>()
    })?;
    notices.extend(timed_out.into_iter().flatten());
    notices.append(&mut runs);
    Ok(())
}

/// Lease expiry: drops every request of a dead worker from a level and dispatches what fits.
pub fn purge_owner(store: &dyn Store, now: Nanos, level_key: &str, owner: u32, notices: &mut Vec<Notice>) -> Result<usize, EngineError> {
    Ok(update_level(store, now, level_key, None, notices, |st, out| st.qs.remove_owner(owner, now, out))?.unwrap_or(0))
}

/// Reads a level's state (for dumps and metrics).
pub fn read_level(store: &dyn Store, level_key: &str) -> Result<Option<LevelState>, EngineError> {
    let (cur, _) = store.get(level_key)?;
    Ok(cur.map(|b| LevelState::decode(&b)).transpose()?)
}

/// A reader of a shared value's fields after its format version, which must be `version`.
pub(crate) fn versioned<'a>(bytes: &'a [u8], version: u8, what: &'static str) -> Result<Reader<'a>, CodecError> {
    let mut r = Reader::new(bytes);
    if r.u8()? == version {
        Ok(r)
    } else {
        Err(CodecError(what))
    }
}

/// Read-modify-write of a whole shared value with [`update`]; an absent or unreadable value
/// starts from the default.
pub(crate) fn update_value<S: Default, T>(
    store: &dyn Store,
    key: &str,
    decode: fn(Option<&[u8]>) -> Result<S, CodecError>,
    encode: fn(&S) -> Vec<u8>,
    mut f: impl FnMut(&mut S) -> T,
) -> Result<T, EngineError> {
    update(store, key, MAX_CAS_TRIES, |cur| {
        let mut st = decode(cur).unwrap_or_default();
        let r = f(&mut st);
        Ok((encode(&st), r))
    })
}

/// Renews this worker's lease (registering it on first call); returns its slot.
pub fn heartbeat(store: &dyn Store, instance: u64, now: Nanos) -> Result<u32, EngineError> {
    update_value(store, REGISTRY_KEY, Registry::decode, Registry::encode, |reg| reg.heartbeat(instance, now))
}

/// Reaps workers whose lease expired and releases everything they held in `level_keys`.
pub fn reap_dead_workers(
    store: &dyn Store,
    now: Nanos,
    ttl: Nanos,
    level_keys: &[String],
    notices: &mut Vec<Notice>,
) -> Result<Vec<workers::WorkerEntry>, EngineError> {
    let (cur, _) = store.get(REGISTRY_KEY)?;
    let reg = Registry::decode(cur.as_deref()).unwrap_or_default();
    if !reg.workers.iter().any(|e| now.saturating_sub(e.heartbeat) > ttl) {
        return Ok(Vec::new());
    }
    let dead = update_value(store, REGISTRY_KEY, Registry::decode, Registry::encode, |reg| reg.reap(now, ttl))?;
    for e in &dead {
        for key in level_keys {
            purge_owner(store, now, key, e.slot, notices)?;
        }
        watches::purge(store, e.slot)?;
    }
    Ok(dead)
}

/// Looks up the mailbox instance of a worker slot.
pub fn instance_of(store: &dyn Store, slot: u32) -> Result<Option<u64>, EngineError> {
    let (cur, _) = store.get(REGISTRY_KEY)?;
    Ok(Registry::decode(cur.as_deref()).unwrap_or_default().instance_of(slot))
}

/// Upstream `borrowingAdjustmentPeriod`.
pub const BORROWING_PERIOD: Nanos = 10 * crate::NANOS_PER_SEC;

/// Shared state of the periodic borrowing adjustment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BorrowState {
    pub last: Nanos,
    pub generation: u64,
    /// Per level name: smoothed demand statistics and the CurrentCL last assigned.
    pub levels: Vec<(String, SeatDemandStats, u32)>,
    pub fair_frac: f64,
}

impl BorrowState {
    pub fn decode(bytes: Option<&[u8]>) -> Result<BorrowState, CodecError> {
        let Some(b) = bytes else { return Ok(BorrowState::default()) };
        let mut r = versioned(b, 1, "borrow state version")?;
        let last = r.i64()?;
        let generation = r.u64()?;
        let fair_frac = r.f64()?;
        let n = r.count(20)?;
        let levels =
            (0..n).map(|_| Ok((r.str()?.to_string(), SeatDemandStats::decode(&mut r)?, r.u32()?))).collect::<Result<_, CodecError>>()?;
        Ok(BorrowState { last, generation, levels, fair_frac })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(32 + self.levels.len() * 48);
        w.u8(1);
        w.i64(self.last);
        w.u64(self.generation);
        w.f64(self.fair_frac);
        w.usize(self.levels.len());
        for (name, stats, cur) in &self.levels {
            w.str(name);
            stats.encode(&mut w);
            w.u32(*cur);
        }
        w.into_bytes()
    }
}

/// The periodic CurrentCL adjustment (`apf_controller.go: updateBorrowingLocked`), run by whichever
/// worker claims it first: every `BORROWING_PERIOD`, and right away when a newer configuration
/// generation appears. Returns whether this call ran it.
pub fn adjust_borrowing(c: &Compiled, store: &dyn Store, now: Nanos, notices: &mut Vec<Notice>) -> Result<bool, EngineError> {
    let (cur, _) = store.get(BORROW_KEY)?;
    let st = BorrowState::decode(cur.as_deref()).unwrap_or_default();
    let due = |st: &BorrowState| {
        c.generation > st.generation || (c.generation == st.generation && now.saturating_sub(st.last) >= BORROWING_PERIOD)
    };
    if !due(&st) {
        return Ok(false);
    }
    // Claim this period.
    let claimed = update_value(store, BORROW_KEY, BorrowState::decode, BorrowState::encode, |st| {
        if !due(st) {
            return None;
        }
        st.last = now;
        st.generation = c.generation;
        Some(st.clone())
    })?;
    let Some(prev) = claimed else { return Ok(false) };
    // Collect each level's demand over the period.
    let mut levels = Vec::with_capacity(c.levels.len());
    for lvl in &c.levels {
        let r = update_level(store, now, &lvl.key, Some((lvl, c.generation)), notices, |st, _| {
            (st.demand.reset(now), st.qs.config().concurrency_limit)
        })?;
        let Some((results, current)) = r else { continue };
        let mut stats = prev.levels.iter().find(|(n, _, _)| n == &lvl.name).map(|(_, s, _)| *s).unwrap_or_default();
        stats.update(&results);
        levels.push(BorrowingLevel { exempt: lvl.exempt, nominal: lvl.nominal, min: lvl.min_limit, max: lvl.max_limit, stats, current });
    }
    let nominal_sum = c.levels.iter().fold(0u32, |a, l| a.saturating_add(l.nominal));
    let fair_frac = update_borrowing(&mut levels, nominal_sum).fair_frac;
    let new_levels: Vec<(String, SeatDemandStats, u32)> =
        c.levels.iter().zip(&levels).map(|(l, b)| (l.name.clone(), b.stats, b.current)).collect();
    update_value(store, BORROW_KEY, BorrowState::decode, BorrowState::encode, |st| {
        st.levels = new_levels.clone();
        st.fair_frac = fair_frac;
    })?;
    // Push the new limits into the QueueSets (which dispatch right away if they grew). In fleet
    // mode the fleet's allocation sets them instead ([`set_limits`]).
    if c.config.fleet.is_none() {
        for (lvl, b) in c.levels.iter().zip(&levels) {
            set_limit(c, store, now, lvl, b.current, notices)?;
        }
    }
    Ok(true)
}

/// Sets a limited level's concurrency limit (a level whose limit grew dispatches at once).
fn set_limit(
    c: &Compiled,
    store: &dyn Store,
    now: Nanos,
    lvl: &LevelRuntime,
    limit: u32,
    notices: &mut Vec<Notice>,
) -> Result<(), EngineError> {
    if lvl.exempt {
        return Ok(());
    }
    let mut runs = Vec::new();
    let r = update_level(store, now, &lvl.key, Some((lvl, c.generation)), &mut runs, |st, out| {
        let cfg = QueueSetConfig { concurrency_limit: limit, ..st.qs.config() };
        if cfg != st.qs.config() {
            out.extend(st.qs.reconfigure(cfg, now)?);
        }
        Ok(())
    })?;
    r.transpose().map_err(EngineError::Config)?;
    notices.append(&mut runs);
    Ok(())
}

/// Fleet mode: this replica's seats per level (in the policy's order; `None`: exempt, left
/// alone) become the levels' concurrency limits.
pub fn set_limits(
    c: &Compiled,
    store: &dyn Store,
    now: Nanos,
    limits: &[Option<u32>],
    notices: &mut Vec<Notice>,
) -> Result<(), EngineError> {
    for (lvl, limit) in c.levels.iter().zip(limits) {
        if let Some(limit) = *limit {
            set_limit(c, store, now, lvl, limit, notices)?;
        }
    }
    Ok(())
}
