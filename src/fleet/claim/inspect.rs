//! Read-only views of a replica's state beyond its limits: for the host's stats and logs (the
//! records ignored, etcd's data losses) and for tests and diagnostics (the claims as etcd holds
//! them, the lease and its deadline, the policy, when the next tick is due).

use super::{Fleet, NUDGES_PER_PERIOD};
use crate::fleet::levels::FleetPolicy;
use crate::fleet::snapshot::IgnoredRecord;
use crate::Nanos;

impl Fleet {
    /// When the host should call [`Fleet::tick`] next at the latest: the next keepalive or
    /// round, or the lease deadline (where the limits fall back), whichever comes first.
    pub fn next_tick(&self, now: Nanos) -> Nanos {
        let p = self.config.period;
        let nudge = self.round.last.max(self.round.last_nudge);
        let nudge = nudge.map(|t| t.saturating_add(p / NUDGES_PER_PERIOD)).filter(|_| self.nudge_useful());
        let due = [
            self.lease.last_keepalive.map(|k| k.saturating_add(p)),
            self.round.last.map(|r| r.saturating_add(p)),
            nudge,
            self.lease.deadline(),
            self.recovery.until,
        ];
        due.into_iter().flatten().filter(|&t| t > now).fold(now.saturating_add(p), Nanos::min)
    }

    pub fn policy(&self) -> &FleetPolicy {
        &self.policy
    }

    /// This replica's claims as etcd holds them (latest observation).
    pub fn claims(&self) -> Option<Vec<u32>> {
        self.own.map(|_| self.slots.iter().map(|s| s.claim).collect())
    }

    pub fn lease(&self) -> Option<i64> {
        self.lease.id
    }

    /// Until when the lease is trusted (`k + leaseTtl − period`).
    pub fn lease_deadline(&self) -> Option<Nanos> {
        self.lease.deadline()
    }

    /// The keys under the prefix the latest snapshot ignored, and why (sorted by key).
    pub fn ignored_records(&self) -> &[IgnoredRecord] {
        self.snapshot.as_ref().map_or(&[], |s| s.ignored.as_slice())
    }

    /// Distinct (key, mod revision) pairs seen ignored since the start.
    pub fn ignored_total(&self) -> u64 {
        self.ignored.total
    }

    /// How many times etcd was seen losing its data (signs seen while recovering count once).
    pub fn data_losses(&self) -> u64 {
        self.recovery.losses
    }

    /// Until when the replica stays in [`super::FleetMode::Recovering`] (the latest detection
    /// + `leaseTtl`), if it has been in it.
    pub fn recovering_until(&self) -> Option<Nanos> {
        self.recovery.until
    }
}
