//! The levels' concurrency limits over time: the periodic borrowing adjustment
//! (`apf_controller.go: updateBorrowingLocked`) or, in fleet mode, the fleet's allocation.

use super::compiled::{Compiled, LevelRuntime};
use super::store::Store;
use super::*;
use crate::codec::{CodecError, Writer};
use crate::fairqueuing::QueueSetConfig;
use crate::limits::borrowing::{update_borrowing, BorrowingLevel, SeatDemandStats};
use crate::Nanos;

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
