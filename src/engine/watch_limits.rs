//! Open-watch limits (`watchLimits`; beyond upstream): the most WATCHes one flow, or one priority
//! level, may hold open on this process. Upstream charges a watch only while its initial events
//! stream (`priority-and-fairness.go: priorityAndFairnessHandler.Handle`, `watchInitialization`)
//! and never limits how many stay open; here every open watch holds a *place* from admission
//! until its stream ends, whatever way it ends.
//!
//! The places live in one shared value, per worker slot (as [`super::watches`] keeps open watches
//! for the estimator), so every worker of the process counts against the same limits and a dead
//! worker's places disappear when its lease is reaped ([`purge`]). A flow is APF's: FlowSchema
//! and distinguisher, i.e. the flow hash (`queueset.go: shuffleShardLocked`, `hashFlowID`).

use super::store::Store;
use super::{update_value, EngineError};
use crate::codec::{CodecError, Reader, Writer};

pub const WATCH_PLACES_KEY: &str = "apf/v3/watch-places";
const VERSION: u8 = 1;

pub use crate::config::watch_limits::{Limit, WatchLimits};

/// Whose place: a watch's priority level and flow (FlowSchema name for the dumps).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Place {
    pub level: String,
    pub flow_schema: String,
    pub flow_hash: u64,
}

/// The limit a refused watch would exceed, and how many places its flow or level holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    Flow { open: u32, limit: u32 },
    Level { open: u32, limit: u32 },
}

/// One worker slot's places: each with its number of open watches.
type SlotPlaces = (u32, Vec<(Place, u32)>);

/// The shared value: every worker slot's places.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Places(Vec<SlotPlaces>);

fn decode_place(r: &mut Reader<'_>) -> Result<(Place, u32), CodecError> {
    let (level, flow_schema) = (r.str()?.to_string(), r.str()?.to_string());
    Ok((Place { level, flow_schema, flow_hash: r.fixed64()? }, r.u32()?))
}

fn decode(bytes: Option<&[u8]>) -> Result<Places, CodecError> {
    let Some(b) = bytes else { return Ok(Places::default()) };
    let mut r = super::versioned(b, VERSION, "watch places version")?;
    let slots = r.count(2)?;
    let slot = |r: &mut Reader<'_>| -> Result<SlotPlaces, CodecError> {
        let s = r.u32()?;
        let n = r.count(11)?;
        Ok((s, (0..n).map(|_| decode_place(r)).collect::<Result<_, _>>()?))
    };
    Ok(Places((0..slots).map(|_| slot(&mut r)).collect::<Result<_, _>>()?))
}

fn encode(p: &Places) -> Vec<u8> {
    let mut w = Writer::new();
    w.u8(VERSION);
    w.usize(p.0.len());
    for (slot, places) in &p.0 {
        w.u32(*slot);
        w.usize(places.len());
        for (place, n) in places {
            w.str(&place.level);
            w.str(&place.flow_schema);
            w.fixed64(place.flow_hash);
            w.u32(*n);
        }
    }
    w.into_bytes()
}

impl Places {
    fn all(&self) -> impl Iterator<Item = &(Place, u32)> {
        self.0.iter().flat_map(|(_, p)| p.iter())
    }

    /// Open watches of the flow `flow_hash` (every worker).
    pub fn of_flow(&self, flow_hash: u64) -> u32 {
        self.all().filter(|(p, _)| p.flow_hash == flow_hash).fold(0, |a, (_, n)| a.saturating_add(*n))
    }

    /// Open watches of the level `level` (every worker).
    pub fn of_level(&self, level: &str) -> u32 {
        self.all().filter(|(p, _)| p.level == level).fold(0, |a, (_, n)| a.saturating_add(*n))
    }

    /// Every flow's open watches (all workers together), most first.
    pub fn flows(&self) -> Vec<(Place, u32)> {
        let mut by: Vec<(Place, u32)> = Vec::new();
        for (p, n) in self.all() {
            match by.iter_mut().find(|(q, _)| q == p) {
                Some((_, m)) => *m = m.saturating_add(*n),
                None => by.push((p.clone(), *n)),
            }
        }
        by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.level.cmp(&b.0.level)).then_with(|| a.0.flow_hash.cmp(&b.0.flow_hash)));
        by
    }

    /// The limit a new watch of `place` would exceed, if any.
    fn exceeded(&self, place: &Place, limit: Limit) -> Option<Exceeded> {
        let flow = limit.per_flow.map(|l| (self.of_flow(place.flow_hash), l)).filter(|(open, l)| open >= l);
        let level = limit.per_level.map(|l| (self.of_level(&place.level), l)).filter(|(open, l)| open >= l);
        flow.map(|(open, limit)| Exceeded::Flow { open, limit }).or(level.map(|(open, limit)| Exceeded::Level { open, limit }))
    }

    fn add(&mut self, slot: u32, place: &Place) {
        if !self.0.iter().any(|(s, _)| *s == slot) {
            self.0.push((slot, Vec::new()));
        }
        let Some((_, mine)) = self.0.iter_mut().find(|(s, _)| *s == slot) else { return };
        match mine.iter_mut().find(|(p, _)| p == place) {
            Some((_, n)) => *n = n.saturating_add(1),
            None => mine.push((place.clone(), 1)),
        }
    }

    fn remove(&mut self, slot: u32, place: &Place) {
        if let Some((_, mine)) = self.0.iter_mut().find(|(s, _)| *s == slot) {
            mine.iter_mut().filter(|(p, _)| p == place).for_each(|(_, n)| *n = n.saturating_sub(1));
            mine.retain(|(_, n)| *n > 0);
        }
        self.0.retain(|(_, p)| !p.is_empty());
    }
}

/// Takes a place for a new watch of worker `slot` unless `limit` is reached: `Ok(None)` when it
/// took one (give it back with [`release`]), or the limit it would exceed.
pub fn acquire(store: &dyn Store, slot: u32, place: &Place, limit: Limit) -> Result<Option<Exceeded>, EngineError> {
    update_value(store, WATCH_PLACES_KEY, decode, encode, |p| {
        let over = p.exceeded(place, limit);
        if over.is_none() {
            p.add(slot, place);
        }
        over
    })
}

/// Gives back a place of worker `slot` (its watch ended).
pub fn release(store: &dyn Store, slot: u32, place: &Place) -> Result<(), EngineError> {
    update_value(store, WATCH_PLACES_KEY, decode, encode, |p| p.remove(slot, place))
}

/// Drops every place of a dead worker (its lease was reaped).
pub fn purge(store: &dyn Store, slot: u32) -> Result<(), EngineError> {
    let places = read(store)?;
    if !places.0.iter().any(|(s, _)| *s == slot) {
        return Ok(());
    }
    update_value(store, WATCH_PLACES_KEY, decode, encode, |p| p.0.retain(|(s, _)| *s != slot))
}

/// Counts a refused watch as a rejection of its level (`level_key`) and returns the Retry-After
/// to answer with, as for APF's own rejections (`DroppedRequestsTracker`); 1 when the level has
/// no state yet.
pub fn refused(store: &dyn Store, now: crate::Nanos, level_key: &str) -> i64 {
    let r = super::update_level(store, now, level_key, None, &mut Vec::new(), |st, _| st.reject(now));
    r.ok().flatten().unwrap_or(1)
}

/// Every worker's places (empty when none was ever taken, or on an unreadable value).
pub fn read(store: &dyn Store) -> Result<Places, EngineError> {
    let (cur, _) = store.get(WATCH_PLACES_KEY)?;
    Ok(decode(cur.as_deref()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_round_trip() {
        let mut p = Places::default();
        let a = Place { level: "l".into(), flow_schema: "fs".into(), flow_hash: 7 };
        p.add(3, &a);
        p.add(3, &a);
        p.add(4, &a);
        assert_eq!(decode(Some(&encode(&p))).unwrap(), p);
        assert_eq!((p.of_flow(7), p.of_level("l"), p.of_level("x")), (3, 3, 0));
        assert!(decode(Some(&[9])).is_err());
    }
}
