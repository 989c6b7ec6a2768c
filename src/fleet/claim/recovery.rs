//! etcd losing its data, detected and survived (the safe mode, [`super::FleetMode::Recovering`]),
//! and the bookkeeping of records the snapshots ignore (each logged once per mod revision).

use super::calls::CallKind;
use super::calls::InFlight;
use super::slot::at;
use super::Fleet;
use crate::etcd::Header;
use crate::fleet::snapshot::IgnoredRecord;
use crate::Nanos;
use std::collections::BTreeMap;

/// What the answers tell about etcd's data.
#[derive(Debug, Clone, Default)]
pub(super) struct Recovery {
    /// The highest store revision any answer carried, and the cluster id of the answers.
    pub(super) max_revision: i64,
    pub(super) cluster_id: Option<u64>,
    /// Whether the latest snapshot held another replica's record.
    pub(super) others_seen: bool,
    /// Safe mode after etcd lost its data: until when (the limits' caps are in the slots).
    pub(super) until: Option<Nanos>,
    pub(super) losses: u64,
}

/// Records the snapshots ignored.
#[derive(Debug, Clone, Default)]
pub(super) struct IgnoredLog {
    /// Per key ignored in the latest snapshot, the mod revision it was logged at.
    logged: BTreeMap<String, i64>,
    /// Distinct (key, mod revision) pairs seen ignored.
    pub(super) total: u64,
}

impl IgnoredLog {
    /// Logs each ignored key once per mod revision, and counts them.
    pub(super) fn note(&mut self, ignored: &[IgnoredRecord], prefix: &[u8], replica: &str) {
        let mut logged = BTreeMap::new();
        for r in ignored {
            if self.logged.get(&r.id) != Some(&r.mod_revision) {
                let key = format!("{}{}", String::from_utf8_lossy(prefix), r.id);
                log::warn!("fleet {replica}: ignoring key {key:?} (mod revision {}): {}", r.mod_revision, r.reason);
                self.total = self.total.saturating_add(1);
            }
            logged.insert(r.id.clone(), r.mod_revision);
        }
        self.logged = logged;
    }
}

impl Fleet {
    pub(super) fn recovering(&self, now: Nanos) -> bool {
        !self.left && self.recovery.until.is_some_and(|t| now < t)
    }

    /// An answer's header: etcd lost its data when its cluster id changed or its revision is
    /// below the highest one seen before the call was sent. A keepalive's revision is not
    /// judged: a member that is not the leader forwards the renewal and fills the header with
    /// its own applied revision, which may lag (etcd `server/etcdserver/api/v3rpc/header.go: fill`); ranges (linearizable),
    /// txns and lease grants (through raft) are answered at least at the revision committed
    /// when they arrived.
    pub(super) fn seen_header(&mut self, call: &InFlight, h: &Header, now: Nanos) {
        if h.cluster_id != 0 {
            if let Some(old) = self.recovery.cluster_id.filter(|&c| c != h.cluster_id) {
                self.data_lost(&format!("etcd's cluster id changed from {old:x} to {:x}", h.cluster_id), now);
            }
            self.recovery.cluster_id = Some(h.cluster_id);
        }
        if h.revision > 0 && h.revision < call.floor && call.kind != CallKind::KeepAlive {
            self.data_lost(&format!("etcd's revision went back from {} to {}", call.floor, h.revision), now);
        }
        if h.revision > 0 {
            self.recovery.max_revision = self.recovery.max_revision.max(h.revision);
        }
    }

    /// etcd lost its data while the other replicas may still use their allocations: safe mode
    /// for `leaseTtl` (every old lease has then been renewed or has expired), under the static
    /// share of the last fleet known (at least `maxReplicas` replicas) and the seats granted now.
    /// The revision seen so far no longer counts (answers to calls sent before are not judged).
    pub(super) fn data_lost(&mut self, why: &str, now: Nanos) {
        let recovering = self.recovery.until.is_some_and(|t| now < t);
        if !recovering {
            // Further signs of the same loss (the lease gone, the fleet empty) only extend it.
            log::warn!("fleet {}: etcd lost its data ({why}): recovering for leaseTtl", self.id);
            self.recovery.losses = self.recovery.losses.saturating_add(1);
        }
        let shares = self.static_shares();
        for (i, s) in self.slots.iter_mut().enumerate() {
            let cap = at(&shares, i).min(s.granted);
            s.recovery_cap = if recovering { cap.min(s.recovery_cap) } else { cap };
            (s.wide, s.wide_since) = (0, 0);
        }
        self.recovery.until = Some(now.saturating_add(self.config.lease_ttl));
        // The snapshot is of the lost data: a registration checked against it would pass a
        // prefix compare on the new store's lower revisions. Read the fleet again first.
        self.snapshot = None;
        self.recovery.max_revision = 0;
        self.calls.forget_floors();
    }

    /// Safe mode's limits (before the claims and the granted seats): the allocation while the
    /// record is in etcd and the lease trusted, else the static share; never above the cap.
    pub(super) fn recovery_limits(&self, now: Nanos) -> Vec<u32> {
        let base = match self.targets() {
            Some(t) if self.own.is_some() && self.lease.id.is_some() && self.lease.trusted(now) => t,
            _ => self.static_shares(),
        };
        self.slots.iter().enumerate().map(|(i, s)| at(&base, i).min(s.recovery_cap)).collect()
    }
}
