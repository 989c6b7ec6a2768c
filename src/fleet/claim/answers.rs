//! What etcd's answers teach a replica: a token, a lease granted, alive or gone, a write
//! applied or not, and a snapshot of the fleet — what it says about this replica's record, and
//! the allocation it gives.

use super::calls::{CallKind, InFlight};
use super::lease::Token;
use super::plan::Base;
use super::slot::at;
use super::Fleet;
use crate::etcd::{AuthenticateResponse, EtcdError, LeaseResponse, RangeResponse, TxnResponse};
use crate::fleet::snapshot::{per_level, Snapshot};
use crate::Nanos;

impl Fleet {
    fn failed(&mut self, e: &EtcdError) {
        self.sync_failures = self.sync_failures.saturating_add(1);
        if e.is_auth() {
            self.lease.token = None;
        }
        log::debug!("fleet {}: etcd call failed: {e}", self.id);
    }

    pub(super) fn on_authenticate(&mut self, status: u16, body: &[u8]) {
        match AuthenticateResponse::decode(status, body) {
            Ok(r) => self.lease.token = Some(Token(r.token)),
            Err(e) => self.failed(&e),
        }
    }

    pub(super) fn on_lease(&mut self, call: InFlight, status: u16, body: &[u8], now: Nanos) {
        match call.kind {
            CallKind::Grant => match LeaseResponse::decode_grant(status, body) {
                Ok(r) => {
                    self.seen_header(&call, &r.header, now);
                    self.lease.granted(r.id, call.sent);
                }
                Err(e) => self.failed(&e),
            },
            CallKind::KeepAlive => match LeaseResponse::decode_keepalive(status, body) {
                Ok(r) => {
                    self.seen_header(&call, &r.header, now);
                    if r.ttl > 0 {
                        self.lease.renewed(call.sent);
                    } else {
                        self.lease_gone(now);
                    }
                }
                Err(e) if e.is_lease_not_found() => self.lease_gone(now),
                Err(e) => self.failed(&e),
            },
            _ => {}
        }
    }

    /// etcd no longer has the lease: it deleted the record with it, and no pending write can
    /// apply any more (a put naming a missing lease fails). While the lease was trusted it
    /// cannot have expired: with other replicas in the fleet, etcd lost its data.
    fn lease_gone(&mut self, now: Nanos) {
        if self.lease.id.is_some() && self.lease.trusted(now) && self.recovery.others_seen {
            self.data_lost("the lease vanished while trusted", now);
        }
        log::info!("fleet {}: lease gone, registering again", self.id);
        self.lease.gone();
        self.lost(now);
        self.pending.clear();
    }

    /// The record is gone: others may already use its seats. Until registered again the replica
    /// admits nothing (it learnt this from etcd, so registering is one or two round trips away).
    pub(super) fn lost(&mut self, now: Nanos) {
        if self.own.take().is_some() && self.lost_at.is_none() {
            self.lost_at = Some(now);
        }
    }

    pub(super) fn on_kv(&mut self, call: InFlight, status: u16, body: &[u8], now: Nanos) {
        self.round.kv_error = true;
        match call.kind {
            CallKind::Range => {
                match RangeResponse::decode(status, body).and_then(|r| Ok((r.header, Snapshot::from_range(&self.prefix, &r)?))) {
                    Ok((header, s)) => {
                        self.round.kv_error = false;
                        self.seen_header(&call, &header, now);
                        self.observe(s, now);
                    }
                    Err(e) => self.failed(&e),
                }
            }
            CallKind::Txn(heartbeat) => self.on_txn(call, heartbeat, status, body, now),
            _ => {}
        }
    }

    /// A record write's answer: applied or not, the snapshot it read.
    fn on_txn(&mut self, call: InFlight, heartbeat: u64, status: u16, body: &[u8], now: Nanos) {
        let answer = TxnResponse::decode(status, body);
        let read = answer.as_ref().ok().map(|t| t.range().map(|r| Snapshot::from_range(&self.prefix, r)));
        match (answer, read) {
            (Ok(t), Some(Some(Ok(snapshot)))) => {
                self.seen_header(&call, &t.header, now);
                let written = self.pending.iter().position(|p| p.heartbeat == heartbeat).map(|i| self.pending.swap_remove(i));
                self.round.kv_error = false;
                if t.succeeded {
                    if let Some(p) = written {
                        // Every other pending write compared an older state of the record.
                        self.pending.clear();
                        self.set_own(t.header.revision, &p.claims);
                        for (s, g) in self.slots.iter_mut().zip(p.granted) {
                            s.granted = g;
                        }
                        self.lost_at = None;
                    }
                    self.round.published = true;
                }
                self.observe(snapshot, now);
            }
            (Ok(_), _) => self.failed(&EtcdError::Malformed("txn answer without a valid range".into())),
            (Err(e), _) => {
                if e.is_auth() || e.is_lease_not_found() {
                    // Rejected before anything was applied.
                    self.pending.retain(|p| p.heartbeat != heartbeat);
                }
                if e.is_lease_not_found() {
                    self.lease_gone(now);
                }
                self.failed(&e);
            }
        }
    }

    /// The record is in etcd at mod revision `m` with `claims`.
    fn set_own(&mut self, m: i64, claims: &[u32]) {
        self.own = Some(m);
        self.claims_seen = true;
        debug_assert_eq!(claims.len(), self.slots.len(), "claims per level of the policy");
        for (i, s) in self.slots.iter_mut().enumerate() {
            s.claim = at(claims, i);
        }
    }

    /// A snapshot read: what it says about this replica's record, and the new allocation.
    ///
    /// Kv calls are sent one at a time and a late answer to a given-up call is ignored, so every
    /// snapshot is newer than the previous one (a lower revision means etcd's data was replaced,
    /// which [`Fleet::seen_header`] has seen). A fleet that is empty — no valid record at all,
    /// this replica's included — after other replicas were seen, while the lease is trusted,
    /// means etcd lost its data too.
    fn observe(&mut self, s: Snapshot, now: Nanos) {
        let s = s.checked(&self.policy, &self.id);
        self.ignored.note(&s.ignored, &self.prefix, &self.id);
        if s.replicas.is_empty() && self.own.is_some() && self.recovery.others_seen && self.lease.trusted(now) {
            self.data_lost("the fleet vanished while the lease was trusted", now);
        }
        self.recovery.others_seen = s.replicas.iter().any(|e| e.id != self.id);
        match s.get(&self.id) {
            Some(e) => {
                let r = e.record.as_ref().ok();
                self.observe_own(e.mod_revision, &per_level(r, &self.policy, |l| l.claim), &per_level(r, &self.policy, |l| l.granted));
            }
            None => {
                if self.own.is_some() {
                    log::info!("fleet {}: record gone from etcd", self.id);
                }
                self.lost(now);
                self.pending.retain(|p| matches!(p.base, Base::Prefix(_)));
            }
        }
        self.allocation = Some(s.allocate(&self.policy));
        self.snapshot = Some(s);
        self.last_sync = Some(now);
    }

    /// This replica's record seen at mod revision `m` with `claims` and `granted` seats.
    fn observe_own(&mut self, m: i64, claims: &[u32], granted: &[u32]) {
        // A pending write is dead once the record moved past what it compared.
        self.pending.retain(|p| match p.base {
            Base::Own(b) => b == m,
            Base::Prefix(r) => m <= r,
        });
        if self.own != Some(m) {
            // A write whose answer was lost applied, or a record from an earlier run of this
            // replica: keep the smaller of the grants (a registration's grant can be below its
            // claims, which cover seats in use it was not granted).
            for (s, r) in self.slots.iter_mut().zip(granted) {
                s.granted = s.granted.min(*r);
            }
            self.lost_at = None;
        }
        self.set_own(m, claims);
    }
}
