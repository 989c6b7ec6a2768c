//! One priority level's state in the shared store ([`LevelState`]: its QueueSet, seat-demand
//! integrator and Retry-After tracker) and its one write path ([`update_level`]).

use super::compiled::LevelRuntime;
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
        let now = at.now;
        // A match, not Option/Result adapters: those move the whole state twice more (memcpy).
        let existing = bytes.and_then(|b| match cache::decode(at.store, at.key, b) {
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

/// The one write path of a level: one CAS update of its stored state. Loads the state
/// (decoded, or this worker's own last write from [`cache`]); with `create`, a missing or
/// unreadable state is created for that level and a newer configuration generation applied;
/// without, nothing changes when the level has no state (then `None`). Applies `f` (which may
/// dispatch into the list it gets), records the seat demand, encodes; what was dispatched is
/// appended to `notices`.
pub(crate) fn update_level<T>(
    store: &dyn Store,
    now: Nanos,
    level_key: &str,
    create: Option<(&LevelRuntime, u64)>,
    notices: &mut Vec<Notice>,
    mut f: impl FnMut(&mut LevelState, &mut Vec<Dispatched>) -> T,
) -> Result<Option<T>, EngineError> {
    let at = LevelWrite { store, key: level_key, now };
    let r = update(store, level_key, MAX_CAS_TRIES, |cur| {
        let mut out = Vec::new();
        let mut st = match create {
            Some((lvl, generation)) => LevelState::load(&at, cur, lvl, generation, &mut out)?,
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

/// Reads a level's state (for dumps and metrics).
pub fn read_level(store: &dyn Store, level_key: &str) -> Result<Option<LevelState>, EngineError> {
    let (cur, _) = store.get(level_key)?;
    Ok(cur.map(|b| LevelState::decode(&b)).transpose()?)
}
