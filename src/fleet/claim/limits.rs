//! The mode the replica is in and the limits it hands out: under the claims etcd may hold, the
//! granted seats, and the mode's cap (the allocation, the static share, the safe mode's cap).
//! Every change of the limits is a new generation; the limits of the generations since the
//! seats in use were last reported bound the seats in use now.

use super::slot::at;
use super::{Fleet, FleetMode};
use crate::fleet::allocation::static_share;
use crate::fleet::levels::FleetPolicy;
use crate::Nanos;

/// Generations of limits kept for the bound of seats in use (older ones are folded together).
const MAX_HISTORY: usize = 32;

/// The limits handed out, and those of every generation since seats in use were reported.
#[derive(Debug, Clone)]
pub(super) struct Limits {
    /// Per level; `None` for exempt levels.
    pub(super) current: Vec<Option<u32>>,
    pub(super) generation: u64,
    /// Limits of every generation since the one seats in use were last reported under.
    pub(super) history: Vec<(u64, Vec<Option<u32>>)>,
}

impl Limits {
    /// No seats on limited levels.
    pub(super) fn new(policy: &FleetPolicy) -> Limits {
        let current: Vec<Option<u32>> = policy.levels.iter().map(|l| (!l.exempt).then_some(0)).collect();
        Limits { history: vec![(0, current.clone())], current, generation: 0 }
    }

    /// A new generation of the current limits.
    pub(super) fn new_generation(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        self.history.push((self.generation, self.current.clone()));
    }

    /// A new generation with `limits`.
    fn push(&mut self, limits: Vec<Option<u32>>) {
        self.current = limits;
        self.new_generation();
        // A host that reports rarely: fold the oldest generations into one (the larger
        // limits under the later generation, which keeps the bound of seats in use).
        while self.history.len() > MAX_HISTORY {
            let first = self.history.remove(0);
            if let Some((_, next)) = self.history.first_mut() {
                for (n, f) in next.iter_mut().zip(first.1) {
                    *n = (*n).max(f);
                }
            }
        }
    }

    /// Seats in use were measured under `generation`: older limits no longer bound them.
    pub(super) fn forget_before(&mut self, generation: u64) {
        self.history.retain(|(g, _)| *g >= generation);
    }
}

impl Fleet {
    fn compute_mode(&self, now: Nanos) -> FleetMode {
        if self.leaving.is_some() {
            return FleetMode::Leaving;
        }
        if self.recovering(now) {
            return FleetMode::Recovering;
        }
        let trusted = self.lease.id.is_some() && self.lease.trusted(now);
        // Unable to register again for as long as a lease may live: as if cut off.
        let rejoin_after = |t: Nanos| t.saturating_add(self.config.lease_ttl).saturating_sub(self.config.period);
        let rejoin_failed = self.lost_at.is_some_and(|t| now >= rejoin_after(t));
        match self.own {
            Some(_) if trusted && !self.left => FleetMode::Synced,
            // A record of an earlier run of this replica, no lease of its own yet.
            Some(_) if self.lease.alive_at.is_none() && self.lease.id.is_none() => FleetMode::Joining,
            Some(_) => FleetMode::Fallback,
            None if rejoin_failed && self.claims_seen && !self.left => FleetMode::Fallback,
            None => FleetMode::Joining,
        }
    }

    /// Recomputes the mode and the limits; a change starts a new generation.
    pub(super) fn refresh(&mut self, now: Nanos) {
        self.mode = self.compute_mode(now);
        let floor = self.claim_floor();
        let cap: Vec<u32> = match self.mode {
            FleetMode::Joining | FleetMode::Leaving => vec![0; self.slots.len()],
            FleetMode::Synced => self.targets().unwrap_or_else(|| floor.clone()),
            FleetMode::Fallback => self.static_shares(),
            FleetMode::Recovering => self.recovery_limits(now),
        };
        let levels = self.policy.levels.iter().zip(&self.slots).enumerate();
        let limits: Vec<Option<u32>> =
            levels.map(|(i, (l, s))| (!l.exempt).then(|| at(&cap, i).min(at(&floor, i)).min(s.granted))).collect();
        if limits != self.limits.current {
            self.limits.push(limits);
        }
    }

    /// An upper bound of the seats in use now: the last report, and every limit handed out
    /// since the generation it was measured under.
    pub(super) fn in_use_bound(&self) -> Vec<u32> {
        let history = &self.limits.history;
        let bound =
            |i: usize, s: &super::LevelSlot| history.iter().filter_map(|(_, l)| l.get(i).copied().flatten()).fold(s.in_use, u32::max);
        self.slots.iter().enumerate().map(|(i, s)| bound(i, s)).collect()
    }

    /// Per level, the smallest claim etcd may hold for this replica now or later: the latest
    /// observed one and every pending write's (the last claims when the record is gone; none
    /// seen yet: 0).
    fn claim_floor(&self) -> Vec<u32> {
        let pending = |i: usize| self.pending.iter().filter_map(move |p| p.claims.get(i).copied());
        self.slots.iter().enumerate().map(|(i, s)| pending(i).fold(s.claim, u32::min)).collect()
    }

    /// This replica's seats in the latest allocation (none while leaving).
    pub fn targets(&self) -> Option<Vec<u32>> {
        if self.leaving.is_some() {
            return Some(vec![0; self.slots.len()]);
        }
        self.allocation.as_ref().and_then(|a| a.seats_of(&self.id))
    }

    /// The static share per level: fleet CurrentCL ÷ max(the last known number of replicas,
    /// `maxReplicas`).
    pub fn static_shares(&self) -> Vec<u32> {
        let Some(a) = &self.allocation else { return vec![0; self.slots.len()] };
        let seen = a.replicas.len() + usize::from(a.replica_index(&self.id).is_none());
        let n = seen.max(self.config.max_replicas.map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX)));
        a.levels.iter().map(|l| static_share(l.current, n)).collect()
    }
}
