//! Object counts from the cluster, shared by every worker: upstream's object-count tracker
//! (`pkg/util/flowcontrol/request/object_count_tracker.go`) fed from the protected
//! kube-apiserver's `/metrics` instead of the storage layer.
//!
//! One shared value, `apf/v3/objectcounts`, holds the tracker and the polling schedule. A worker
//! whose timer finds the next poll due claims it with one CAS (so one worker polls for all, and
//! a worker that dies mid-poll only delays the next one by the claim's lease), fetches `/metrics`,
//! and records the result with another CAS. Every worker reads the value on its timer and keeps
//! the decoded tracker; the request path only looks it up.
//!
//! Tracker semantics as upstream: `Set` stores the stats with the time; `Get` of an unknown
//! resource is `ObjectCountNotFoundErr` (the LIST costs 1 seat), of one not refreshed within the
//! stale threshold (upstream 3 minutes) the old stats with `ObjectCountStaleErr` (the estimator
//! then assumes 10⁹ objects of 1.5 MB); entries not refreshed within an hour are pruned
//! (`pruneInterval`). A resource the metrics report with an error value (-1) keeps its last value,
//! as upstream's `Set` ignores negative counts.

use super::store::{update, Store};
use super::{EngineError, MAX_CAS_TRIES};
use crate::codec::{CodecError, CodecResult, Reader, Writer};
use crate::digest::metrics_scan::ScrapedCounts;
pub use crate::digest::work_estimate::resource_key;
use crate::digest::work_estimate::{get_by_resource, ObjectStats, StatsLookup};
use crate::Nanos;
use std::collections::BTreeMap;

pub const OBJECT_COUNTS_KEY: &str = "apf/v3/objectcounts";
const VERSION: u8 = 1;
/// Upstream `pruneInterval`: entries not refreshed for this long are forgotten.
pub const PRUNE_AFTER: Nanos = 3600 * crate::NANOS_PER_SEC;
/// After a failed poll, the next one is at most this far away.
pub const RETRY_AFTER_FAILURE: Nanos = 10 * crate::NANOS_PER_SEC;
/// A claimed poll may take its timeout plus this before another worker may claim it.
pub const CLAIM_GRACE: Nanos = 2 * crate::NANOS_PER_SEC;

/// Upstream's object-count tracker: stats per resource key (`resource` for the core group,
/// `group/resource` otherwise) with the time they were last set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectCountTracker {
    entries: BTreeMap<String, (ObjectStats, Nanos)>,
}

impl ObjectCountTracker {
    /// `objectCountTracker.Set`.
    pub fn set(&mut self, key: &str, stats: ObjectStats, now: Nanos) {
        if stats.count >= 0 {
            self.entries.insert(key.to_string(), (stats, now));
        }
    }

    /// `objectCountTracker.Get` for (group, resource).
    pub fn get(&self, group: &str, resource: &str, now: Nanos, stale_after: Nanos) -> StatsLookup {
        match get_by_resource(&self.entries, group, resource) {
            None => StatsLookup::NotFound,
            Some((_, at)) if now.saturating_sub(*at) > stale_after => StatsLookup::Stale,
            Some((s, _)) => StatsLookup::Found(*s),
        }
    }

    /// `objectCountTracker.prune`: forgets entries not refreshed within [`PRUNE_AFTER`].
    pub fn prune(&mut self, now: Nanos) {
        self.entries.retain(|_, (_, at)| now.saturating_sub(*at) <= PRUNE_AFTER);
    }

    /// Every entry: key, stats, time last set.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &ObjectStats, Nanos)> {
        self.entries.iter().map(|(k, (s, at))| (k.as_str(), s, *at))
    }

    /// How many entries are stale at `now`.
    pub fn stale(&self, now: Nanos, stale_after: Nanos) -> usize {
        self.entries.values().filter(|(_, at)| now.saturating_sub(*at) > stale_after).count()
    }

    fn encode(&self, w: &mut Writer) {
        w.usize(self.entries.len());
        for (k, (s, at)) in &self.entries {
            w.str(k);
            w.i64(s.count);
            w.i64(s.average_object_size_bytes);
            w.i64(*at);
        }
    }

    fn decode(r: &mut Reader) -> CodecResult<Self> {
        let n = r.count(4)?;
        let mut entries = BTreeMap::new();
        for _ in 0..n {
            let k = r.str()?.to_string();
            let s = ObjectStats { count: r.i64()?, average_object_size_bytes: r.i64()? };
            let at = r.i64()?;
            if entries.insert(k, (s, at)).is_some() {
                return Err(CodecError("duplicate object count key"));
            }
        }
        Ok(ObjectCountTracker { entries })
    }
}

/// The shared value: the tracker and the polling schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedCounts {
    /// When the next poll is due (a claim pushes it out by the poll's lease).
    pub next_poll: Nanos,
    /// The worker instance that claimed the poll under way (0: none).
    pub poller: u64,
    /// Last successful poll (0: never).
    pub last_success: Nanos,
    /// Last failed poll (0: never) and why.
    pub last_failure: Nanos,
    pub last_error: String,
    /// Failed polls since the last success.
    pub consecutive_failures: u32,
    pub tracker: ObjectCountTracker,
    /// Learned from complete LIST responses (`workEstimator.learnFromResponses`); never stale,
    /// pruned like the tracker.
    pub learned: ObjectCountTracker,
}

impl SharedCounts {
    /// The cluster's count for (group, resource), else a learned one.
    pub fn lookup(&self, group: &str, resource: &str, now: Nanos, stale_after: Nanos) -> StatsLookup {
        match self.tracker.get(group, resource, now, stale_after) {
            StatsLookup::NotFound => self.learned_lookup(group, resource, now),
            found => found,
        }
    }

    /// A learned count: never stale; one older than [`PRUNE_AFTER`] is forgotten (the next
    /// complete LIST response teaches it again).
    pub fn learned_lookup(&self, group: &str, resource: &str, now: Nanos) -> StatsLookup {
        match self.learned.get(group, resource, now, PRUNE_AFTER) {
            StatsLookup::Found(s) => StatsLookup::Found(s),
            _ => StatsLookup::NotFound,
        }
    }

    pub fn decode(bytes: &[u8]) -> CodecResult<SharedCounts> {
        let mut r = Reader::new(bytes);
        if r.u8()? != VERSION {
            return Err(CodecError("object counts version"));
        }
        Ok(SharedCounts {
            next_poll: r.i64()?,
            poller: r.u64()?,
            last_success: r.i64()?,
            last_failure: r.i64()?,
            last_error: r.str()?.to_string(),
            consecutive_failures: r.u32()?,
            tracker: ObjectCountTracker::decode(&mut r)?,
            learned: ObjectCountTracker::decode(&mut r)?,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let entries = self.tracker.entries.len() + self.learned.entries.len();
        let mut w = Writer::with_capacity(64 + 48 * entries);
        w.u8(VERSION);
        w.i64(self.next_poll);
        w.u64(self.poller);
        w.i64(self.last_success);
        w.i64(self.last_failure);
        w.str(&self.last_error);
        w.u32(self.consecutive_failures);
        self.tracker.encode(&mut w);
        self.learned.encode(&mut w);
        w.into_bytes()
    }
}

fn decode_or_default(cur: Option<&[u8]>) -> SharedCounts {
    let decoded = cur.map(SharedCounts::decode).transpose().unwrap_or_else(|e| {
        log::error!("apf: discarding unreadable object counts ({e})");
        None
    });
    decoded.unwrap_or_default()
}

/// The stored value and its CAS token (`None` when nothing was stored yet).
pub fn read(store: &dyn Store) -> Result<(Option<SharedCounts>, Option<u32>), EngineError> {
    let (bytes, cas) = store.get(OBJECT_COUNTS_KEY)?;
    Ok((bytes.map(|b| SharedCounts::decode(&b)).transpose()?, cas))
}

/// Claims the next poll for worker `instance` if it is due at `now`; true = this worker polls
/// now (and must [`record`] the outcome). The claim holds the poll for `timeout` plus a grace.
pub fn claim(store: &dyn Store, now: Nanos, instance: u64, timeout: Nanos) -> Result<bool, EngineError> {
    let claimed = update(store, OBJECT_COUNTS_KEY, MAX_CAS_TRIES, |cur| {
        let mut s = decode_or_default(cur);
        if now < s.next_poll {
            // Not due: no write, and no store error either.
            return Err(None);
        }
        s.next_poll = now.saturating_add(timeout).saturating_add(CLAIM_GRACE);
        s.poller = instance;
        Ok((s.encode(), true))
    });
    claimed.or_else(|e| e.map_or(Ok(false), |e| Err(EngineError::Store(e))))
}

/// Records a poll's outcome: the scraped counts (each resource set at `now`, old entries
/// pruned) or the failure; schedules the next poll `period` from now (a failure: at most
/// [`RETRY_AFTER_FAILURE`]).
pub fn record(store: &dyn Store, now: Nanos, period: Nanos, outcome: Result<&ScrapedCounts, &str>) -> Result<SharedCounts, EngineError> {
    update(store, OBJECT_COUNTS_KEY, MAX_CAS_TRIES, |cur| {
        let mut s = decode_or_default(cur);
        s.poller = 0;
        match outcome {
            Ok(scraped) => {
                for (k, st) in &scraped.entries {
                    s.tracker.set(k, *st, now);
                }
                s.tracker.prune(now);
                s.last_success = now;
                s.consecutive_failures = 0;
                s.next_poll = now.saturating_add(period);
            }
            Err(why) => {
                s.last_failure = now;
                s.last_error = why.chars().take(200).collect();
                s.consecutive_failures = s.consecutive_failures.saturating_add(1);
                s.next_poll = now.saturating_add(period.min(RETRY_AFTER_FAILURE));
            }
        }
        Ok::<_, EngineError>((s.encode(), s))
    })
}

/// Records what a complete LIST response showed of resource `key` (learned costs).
pub fn learn(store: &dyn Store, now: Nanos, key: &str, stats: ObjectStats) -> Result<(), EngineError> {
    update(store, OBJECT_COUNTS_KEY, MAX_CAS_TRIES, |cur| {
        let mut s = decode_or_default(cur);
        s.learned.set(key, stats, now);
        s.learned.prune(now);
        Ok::<_, EngineError>((s.encode(), ()))
    })
}
