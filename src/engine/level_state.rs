//! One priority level's state in the shared store ([`LevelState`]: its QueueSet, seat-demand
//! integrator and Retry-After tracker), its one write path ([`update_level`]: bytes with
//! compare-and-swap, or in place in a store's [`LevelTable`]) and its reads ([`read_level`],
//! [`peek_level`]).

use super::compiled::LevelRuntime;
use super::level_table::LevelTable;
use super::store::{update, Store};
use super::*;
use crate::codec::{CodecError, Writer};
use crate::fairqueuing::queueset::QueueSet;
use crate::fairqueuing::{Dispatched, QueueSetConfig};
use crate::limits::integrator::Integrator;
use crate::limits::retry_after::DroppedRequestsTracker;
use crate::Nanos;

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
        self.encode_into(Vec::new())
    }

    /// [`LevelState::encode`] into `buf` (cleared first), reusing its allocation.
    pub fn encode_into(&self, mut buf: Vec<u8>) -> Vec<u8> {
        buf.clear();
        // Sized for the usual value (≈ 10 bytes per waiting request) so it is allocated once.
        buf.reserve(128 + 16 * self.qs.requests_waiting() as usize);
        let mut w = Writer { buf };
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
        at: &LevelWrite<'_>,
        bytes: Option<&[u8]>,
        lvl: &LevelRuntime,
        generation: u64,
        out: &mut Vec<Dispatched>,
    ) -> Result<LevelState, EngineError> {
        // A match, not Option/Result adapters: those move the whole state twice more (memcpy).
        let existing = bytes.and_then(|b| match cache::decode(at.store, at.key, b) {
            Ok(s) => Some(s),
            Err(e) => {
                log::error!("apf: discarding unreadable level state ({e})");
                None
            }
        });
        let Some(mut st) = existing else { return LevelState::new(lvl.qs_config, generation, at.now) };
        st.configure(lvl, generation, at.now, out)?;
        Ok(st)
    }

    /// Applies `lvl`'s queuing configuration if `generation` is newer than the state's (what
    /// that dispatches goes to `out`); on error the state is unchanged.
    fn configure(&mut self, lvl: &LevelRuntime, generation: u64, now: Nanos, out: &mut Vec<Dispatched>) -> Result<(), EngineError> {
        if generation <= self.generation {
            return Ok(());
        }
        let mut cfg = lvl.qs_config;
        // The concurrency limit is dynamic (borrowing); keep the current one unless the
        // level changed between exempt / reject / queuing.
        let cur = self.qs.config();
        if cur.desired_queues.signum() == cfg.desired_queues.signum() {
            cfg.concurrency_limit = cur.concurrency_limit.clamp(lvl.min_limit, lvl.max_limit.max(lvl.min_limit));
        }
        if cfg != cur {
            // `reconfigure` checks the configuration before it changes anything.
            out.extend(self.qs.reconfigure(cfg, now).map_err(EngineError::Config)?);
        }
        self.generation = generation;
        Ok(())
    }

    /// Counts a request rejected at `now`; returns the Retry-After to answer it with.
    pub(crate) fn reject(&mut self, now: Nanos) -> i64 {
        self.dropped.record_dropped(now.div_euclid(crate::NANOS_PER_SEC));
        self.dropped.retry_after()
    }
}

/// The call context of a level's write path: the shared store, the level's key in it and the
/// time of the call.
struct LevelWrite<'a> {
    store: &'a dyn Store,
    key: &'a str,
    now: Nanos,
}

/// What a level's update returned and what it dispatched.
type Updated<T> = Option<(T, Vec<Dispatched>)>;

/// The one write path of a level. Loads the state; with `create`, a missing (or unreadable)
/// state is created for that level and a newer configuration generation applied; without,
/// nothing changes when the level has no state (then `None`). Applies `f` (which may dispatch
/// into the list it gets) and records the seat demand; what was dispatched is appended to
/// `notices`. In a store with a [`LevelTable`] the state is updated in place under its level's
/// lock; otherwise it is one CAS update of its stored bytes ([`update_bytes`]).
pub(crate) fn update_level<T>(
    store: &dyn Store,
    now: Nanos,
    level_key: &str,
    create: Option<(&LevelRuntime, u64)>,
    notices: &mut Vec<Notice>,
    mut f: impl FnMut(&mut LevelState, &mut Vec<Dispatched>) -> T,
) -> Result<Option<T>, EngineError> {
    let r = match store.levels() {
        Some(table) => update_in_place(table, store, now, level_key, create, &mut f)?,
        None => update_bytes(store, now, level_key, create, &mut f)?,
    };
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

/// [`update_level`] over stored bytes: decoded (or this worker's own last write from
/// [`cache`]), updated, encoded, written back with compare-and-swap (redone on a conflict).
fn update_bytes<T>(
    store: &dyn Store,
    now: Nanos,
    level_key: &str,
    create: Option<(&LevelRuntime, u64)>,
    f: &mut impl FnMut(&mut LevelState, &mut Vec<Dispatched>) -> T,
) -> Result<Updated<T>, EngineError> {
    let at = LevelWrite { store, key: level_key, now };
    update(store, level_key, MAX_CAS_TRIES, |cur| {
        let mut out = Vec::new();
        let mut st = match create {
            Some((lvl, generation)) => LevelState::load(&at, cur, lvl, generation, &mut out)?,
            None => match cur {
                Some(bytes) => cache::decode(store, level_key, bytes)?,
                None => return Ok::<_, EngineError>((Vec::new(), None)),
            },
        };
        let r = operate(&mut st, now, f, &mut out);
        Ok((cache::encode(store, level_key, st), Some((r, out))))
    })
}

/// [`update_level`] on the decoded state `table` keeps, under the level's lock: no encoding,
/// no decoding, no conflicts; each update that found or created a state counts as a write.
fn update_in_place<T>(
    table: &dyn LevelTable,
    store: &dyn Store,
    now: Nanos,
    level_key: &str,
    create: Option<(&LevelRuntime, u64)>,
    f: &mut impl FnMut(&mut LevelState, &mut Vec<Dispatched>) -> T,
) -> Result<Updated<T>, EngineError> {
    let mut r = Ok(None);
    table.update(level_key, &mut |slot| r = apply(slot, now, create, &mut *f))?;
    if matches!(r, Ok(Some(_))) {
        super::contention::count(store, |c| &mut c.writes);
    }
    r
}

/// Loads (creating and configuring as [`LevelState::load`] does) and updates the level's
/// state in `slot`.
fn apply<T>(
    slot: &mut Option<LevelState>,
    now: Nanos,
    create: Option<(&LevelRuntime, u64)>,
    f: &mut impl FnMut(&mut LevelState, &mut Vec<Dispatched>) -> T,
) -> Result<Updated<T>, EngineError> {
    let mut out = Vec::new();
    let st = match (slot, create) {
        (Some(st), Some((lvl, generation))) => {
            st.configure(lvl, generation, now, &mut out)?;
            st
        }
        (Some(st), None) => st,
        (slot, Some((lvl, generation))) => slot.insert(LevelState::new(lvl.qs_config, generation, now)?),
        (None, None) => return Ok(None),
    };
    let r = operate(st, now, f, &mut out);
    Ok(Some((r, out)))
}

/// Runs the operation `f` on a level's state and records the seat demand it leaves (both write
/// paths).
fn operate<T>(
    st: &mut LevelState,
    now: Nanos,
    f: &mut impl FnMut(&mut LevelState, &mut Vec<Dispatched>) -> T,
    out: &mut Vec<Dispatched>,
) -> T {
    let r = f(st, out);
    st.demand.set(now, f64::from(st.qs.seat_demand()));
    r
}

/// Reads a level's state (for dumps and metrics): a copy.
pub fn read_level(store: &dyn Store, level_key: &str) -> Result<Option<LevelState>, EngineError> {
    peek_level(store, level_key, LevelState::clone)
}

/// `f` of a level's state (`None` when it has none), without copying a state kept in place.
pub fn peek_level<T>(store: &dyn Store, level_key: &str, f: impl FnOnce(&LevelState) -> T) -> Result<Option<T>, EngineError> {
    if let Some(table) = store.levels() {
        let mut f = Some(f);
        let mut r = None;
        table.read(level_key, &mut |st| r = st.zip(f.take()).map(|(st, f)| f(st)))?;
        return Ok(r);
    }
    let (cur, _) = store.get(level_key)?;
    Ok(cur.map(|b| LevelState::decode(&b)).transpose()?.as_ref().map(f))
}
