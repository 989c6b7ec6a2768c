//! The next record write on the latest snapshot: what it publishes, the seats it grants (a
//! raise checked against the others' claims), the claims it makes, and what it compares.
//!
//! Per limited level, with `t` the allocation of the state this write creates (in safe mode
//! at most the recovery cap: nothing is granted above it), `g` the granted seats, `cur` the
//! current claim and `u` the bound of seats in use:
//! - raise (`t > g`): granted `g' = min(t, max(g, room))`, `room` = the level's fleet
//!   CurrentCL − Σ the others' claims; otherwise `g' = min(g, max(t, u))` (`grants`);
//! - over all levels, Σ the others' claims + Σ `g'` ≤ Σ fleet CurrentCL: raises are trimmed,
//!   last levels first (`trim`);
//! - claim `= max(u, g', min(cur, t))`: never below the seats in use or the grant, lowered
//!   toward the allocation, above the current claim only by a grant or by seats in use the
//!   record no longer covered (a registration after the record was lost).

use super::slot::at;
use super::Fleet;
use crate::fleet::allocation::Allocation;
use crate::fleet::record::{LevelRecord, Record};
use crate::fleet::snapshot::OthersClaims;
use crate::Nanos;

/// What a write compared: its own record's mod revision, or the whole prefix's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Base {
    Own(i64),
    Prefix(i64),
}

/// A write that may apply (sent, answer not seen).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Pending {
    pub(super) heartbeat: u64,
    pub(super) base: Base,
    pub(super) claims: Vec<u32>,
    pub(super) granted: Vec<u32>,
}

/// A planned record write.
pub(super) struct Plan {
    pub(super) base: Base,
    pub(super) claims: Vec<u32>,
    pub(super) granted: Vec<u32>,
    pub(super) record: Record,
    /// Whether it raises a grant or a claim (then it compares the whole prefix).
    pub(super) raises: bool,
}

/// One level's starting point: `t`, `g`, `cur` and `u` (see the module documentation).
#[derive(Debug, Clone, Copy)]
struct Basis {
    limited: bool,
    target: u32,
    granted: u32,
    claim: u32,
    in_use: u32,
}

impl Fleet {
    /// The next record write on the latest snapshot, raising grants only when `raise` (a
    /// registration always may).
    pub(super) fn plan(&self, raise: bool, now: Nanos) -> Option<Plan> {
        let snap = self.snapshot.as_ref()?;
        let present = self.own.is_some();
        let raise = (raise || !present) && self.leaving.is_none();
        let mut record = self.record_to_write(snap.revision);
        // The state this write creates, and its allocation.
        let after = snap.with_record(&self.id, record.clone());
        let alloc = after.allocate(&self.policy);
        let others = after.others_claims(&self.policy, &self.id);
        let basis = self.basis(&alloc, now);
        let mut granted = grants(&basis, &alloc, &others, raise);
        let draining = self.draining.iter().map(|(_, s)| u64::from(*s)).sum::<u64>();
        trim(&mut granted, &basis, others.total.saturating_add(draining), alloc.limited_total());
        let claim = |(b, g): (&Basis, &u32)| if b.limited { b.in_use.max(*g).max(b.claim.min(b.target)) } else { 0 };
        let claims: Vec<u32> = basis.iter().zip(&granted).map(claim).collect();
        for ((l, c), g) in self.policy.levels.iter().zip(&claims).zip(&granted).filter(|((l, _), _)| !l.exempt) {
            if let Some(lr) = record.levels.get_mut(&l.name) {
                (lr.claim, lr.granted) = (*c, *g);
            }
        }
        let up = |((b, g), c): ((&Basis, &u32), &u32)| *g > b.granted || *c > b.claim;
        let raises = !present || basis.iter().zip(&granted).zip(&claims).any(up);
        let base = match (raises, self.own) {
            (false, Some(m)) => Base::Own(m),
            _ => Base::Prefix(snap.revision),
        };
        Some(Plan { base, claims, granted, record, raises })
    }

    /// The record to write, before its claims and grants: the demand, seats in use and wide
    /// need per level (a leaving replica wants nothing: the allocation gives its seats to the
    /// others), and the claims of the levels still draining.
    fn record_to_write(&self, revision: i64) -> Record {
        let staying = self.leaving.is_none();
        let level = |s: &super::LevelSlot| LevelRecord {
            demand: if staying { s.demand } else { Default::default() },
            in_use: s.in_use,
            wide: if staying { s.wide } else { 0 },
            wide_since: if staying { s.wide_since } else { 0 },
            ..LevelRecord::default()
        };
        let mut record = Record {
            heartbeat: 0,
            revision,
            server_concurrency_limit: self.policy.server_concurrency_limit,
            levels: self.policy.levels.iter().zip(&self.slots).map(|(l, s)| (l.name.clone(), level(s))).collect(),
        };
        for (name, seats) in &self.draining {
            record.levels.entry(name.clone()).or_default().claim = *seats;
        }
        record
    }

    /// Each level's starting point under the allocation `alloc` of the state the write creates.
    fn basis(&self, alloc: &Allocation, now: Nanos) -> Vec<Basis> {
        let (present, recovering) = (self.own.is_some(), self.recovering(now));
        // The state the write creates holds this replica's record: the allocation names it.
        let target = alloc.seats_of(&self.id);
        debug_assert!(target.is_some(), "the planned state holds this replica");
        let target = target.filter(|_| self.leaving.is_none()).unwrap_or_default();
        let in_use = self.in_use_bound();
        let levels = self.policy.levels.iter().zip(&self.slots).enumerate();
        let basis = |(i, (l, s)): (usize, (&crate::fleet::levels::FleetLevel, &super::LevelSlot))| Basis {
            limited: !l.exempt,
            // Safe mode: never granted above the cap.
            target: if recovering { at(&target, i).min(s.recovery_cap) } else { at(&target, i) },
            granted: if present { s.granted } else { 0 },
            claim: if present { s.claim } else { 0 },
            in_use: at(&in_use, i),
        };
        levels.map(basis).collect()
    }
}

/// The granted seats per level (0 on exempt ones): a raise up to the room the others' claims
/// leave in the level's fleet CurrentCL, else the grant lowered toward the allocation.
fn grants(basis: &[Basis], alloc: &Allocation, others: &OthersClaims, raise: bool) -> Vec<u32> {
    let grant = |(i, b): (usize, &Basis)| {
        if !b.limited {
            return 0;
        }
        if raise && b.target > b.granted {
            let fleet_cl = alloc.levels.get(i).map_or(0, |a| u64::from(a.current));
            let others_claims = others.per_level.get(i).copied().unwrap_or(u64::MAX);
            let room = u32::try_from(fleet_cl.saturating_sub(others_claims)).unwrap_or(u32::MAX);
            return b.target.min(b.granted.max(room));
        }
        b.granted.min(b.target.max(b.in_use))
    };
    basis.iter().enumerate().map(grant).collect()
}

/// The total over all levels must fit the fleet's Σ CurrentCL `limit` with the others' (and
/// the draining levels') claims `held`: raises are trimmed, last levels first.
fn trim(granted: &mut [u32], basis: &[Basis], held: u64, limit: u64) {
    let total = granted.iter().map(|&g| u64::from(g)).sum::<u64>().saturating_add(held);
    let mut excess = total.saturating_sub(limit);
    for (g, b) in granted.iter_mut().zip(basis).rev() {
        let raised = g.saturating_sub(b.granted);
        let cut = u32::try_from(excess.min(u64::from(raised))).unwrap_or(0);
        *g = g.saturating_sub(cut);
        excess = excess.saturating_sub(u64::from(cut));
    }
}
