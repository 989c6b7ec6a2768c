//! A replica's fleet changing under it: a new policy for the same fleet (levels carried over by
//! name, removed levels claimed until they drain), and leaving the fleet (gracefully, or at
//! once by revoking the lease).

use super::calls::{CallKind, EtcdCall};
use super::slot::LevelSlot;
use super::Fleet;
use crate::etcd;
use crate::fleet::levels::{remap, FleetPolicy};
use crate::Nanos;

impl Fleet {
    /// A new policy (levels, fleet limit) for the same fleet: the lease and the record stay,
    /// and every level's state (limits, claims, granted seats, demand, wide need, the limits'
    /// history) carries over by name. A new level starts with no seats, raised by the next
    /// round's transaction; a limited level the policy removes (or makes exempt) stays claimed,
    /// outside the policy's levels, with the seats that may still be in use on it, until they
    /// drain ([`Fleet::set_draining_in_use`]). The new allocation lowers limits at once; raises
    /// only ever come from a transaction. Recovering, a level new to the policy gets no seats
    /// until the safe mode ends.
    pub fn set_policy(&mut self, policy: FleetPolicy, now: Nanos) {
        let bound = self.in_use_bound();
        let old = std::mem::replace(&mut self.policy, policy);
        let map: Vec<Option<usize>> = self.policy.levels.iter().map(|l| old.index(&l.name)).collect();
        let new = &self.policy;
        let removed = old.levels.iter().zip(bound).filter(|(l, seats)| !l.exempt && *seats > 0 && !new.is_limited(&l.name));
        self.draining.extend(removed.map(|(l, seats)| (l.name.clone(), seats)));
        let limits_of = |v: &[Option<u32>]| -> Vec<Option<u32>> {
            new.levels.iter().zip(remap(v, &map, None)).map(|(l, x)| (!l.exempt).then(|| x.unwrap_or(0))).collect()
        };
        self.limits.current = limits_of(&self.limits.current);
        self.limits.history = self.limits.history.iter().map(|(g, l)| (*g, limits_of(l))).collect();
        self.slots = remap(&self.slots, &map, LevelSlot::default());
        for p in &mut self.pending {
            p.claims = remap(&p.claims, &map, 0);
            p.granted = remap(&p.granted, &map, 0);
        }
        self.undrain();
        self.allocation = self.snapshot.as_ref().map(|s| s.allocate(&self.policy));
        self.limits.new_generation();
        self.refresh(now);
    }

    /// A draining level limited again: what may still be in use on it counts as in use.
    fn undrain(&mut self) {
        let (back, draining) = std::mem::take(&mut self.draining).into_iter().partition(|(n, _)| self.policy.is_limited(n));
        self.draining = draining;
        for (name, seats) in back {
            if let Some(slot) = self.policy.index(&name).and_then(|i| self.slots.get_mut(i)) {
                slot.in_use = slot.in_use.max(seats);
            }
        }
    }

    /// The limited levels a new policy removed whose seats may still be in use.
    pub fn draining_levels(&self) -> impl Iterator<Item = &str> + '_ {
        self.draining.iter().map(|(n, _)| n.as_str())
    }

    /// The seats that may be in use on a removed level now (in use, plus its limit while
    /// requests wait); its claim only comes down, and the level leaves the record at 0.
    pub fn set_draining_in_use(&mut self, level: &str, seats: u32) {
        for (_, s) in self.draining.iter_mut().filter(|(n, _)| n == level) {
            *s = (*s).min(seats);
        }
        self.draining.retain(|(_, s)| *s > 0);
    }

    /// Whether a removed level's claim in etcd is above what may still be in use on it.
    pub(super) fn draining_lowers(&self) -> bool {
        let Some(Ok(r)) = self.snapshot.as_ref().and_then(|s| s.get(&self.id)).map(|e| e.record.as_ref()) else { return false };
        let draining = |n: &str| self.draining.iter().find(|(d, _)| d == n).map_or(0, |(_, s)| *s);
        r.levels.iter().filter(|(n, _)| !self.policy.is_limited(n)).any(|(n, l)| l.claim > draining(n))
    }

    /// Leave the fleet gracefully: call on every tick once asked to (idempotent). From the
    /// first call on the replica admits nothing new on limited levels (limits 0, no raise),
    /// publishes no demand, and its record's claims and granted seats come down to the seats
    /// still in use as they drain (the others raise into the freed seats at their next read).
    /// Once nothing is in use, or after `leaseTtl` at most, the lease is revoked
    /// ([`Fleet::leave`]); returns that call.
    pub fn leave_gracefully(&mut self, now: Nanos) -> Vec<EtcdCall> {
        if self.left {
            return Vec::new();
        }
        if self.leaving.is_none() {
            log::info!("fleet {}: leaving: admitting nothing new, claims follow the seats in use", self.id);
            self.leaving = Some(now);
            self.refresh(now);
        }
        let since = self.leaving.unwrap_or(now);
        let bound = self.in_use_bound();
        let limited = self.policy.levels.iter().zip(&bound).filter(|(l, _)| !l.exempt);
        let drained = limited.map(|(_, u)| *u).max().unwrap_or(0) == 0 && self.draining.is_empty();
        if self.lease.id.is_none() || drained || now >= since.saturating_add(self.config.lease_ttl) {
            log::info!("fleet {}: left the fleet (drained: {drained})", self.id);
            return self.leave(now);
        }
        Vec::new()
    }

    /// Leave the fleet: revoke the lease (etcd deletes the record at once). Call once the
    /// replica's requests have finished; its seats then serve the others at their next write.
    pub fn leave(&mut self, now: Nanos) -> Vec<EtcdCall> {
        self.left = true;
        self.own = None;
        self.claims_seen = true;
        self.slots.iter_mut().for_each(|s| s.claim = 0);
        let calls = match self.lease.id.take() {
            Some(id) => vec![self.call(CallKind::Revoke, etcd::LEASE_REVOKE, etcd::lease_id_request(id), now)],
            None => Vec::new(),
        };
        self.refresh(now);
        calls
    }
}
