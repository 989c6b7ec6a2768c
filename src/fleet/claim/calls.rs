//! The calls a replica sends to etcd and when: the periodic round (authenticate, grant or keep
//! the lease alive, write the record), the nudges between rounds, and the follow-ups an answer
//! asks for at once (a registration, a retry, a raise). At most one call of each kind (auth,
//! lease, kv) is in flight; one not answered within `leaseTtl` is given up.

use super::plan::{Base, Pending, Plan};
use super::slot::at;
use super::{Fleet, MAX_WRITES_PER_PERIOD, NUDGES_PER_PERIOD};
use crate::etcd::{self, Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
use crate::Nanos;

/// One HTTP call to etcd: `POST path` with a JSON body. The host adds `:method`, `:path` and
/// `:authority` (`fleet.etcd.authority`) and sends it to the `fleet.etcd.cluster` cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdCall {
    pub id: u64,
    pub path: &'static str,
    pub body: Vec<u8>,
    /// `content-type`, and `authorization` (the token, raw) when authentication is on.
    pub headers: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallKind {
    Authenticate,
    Grant,
    KeepAlive,
    Revoke,
    Range,
    /// A record write, identified by its heartbeat.
    Txn(u64),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) id: u64,
    pub(super) kind: CallKind,
    pub(super) sent: Nanos,
    /// The highest store revision seen when the call was sent: etcd applies the call later, so
    /// its answer's revision is at least that unless etcd lost its data.
    pub(super) floor: i64,
}

/// The calls in flight, one per kind at most.
#[derive(Debug, Clone, Default)]
pub(super) struct Calls {
    next_id: u64,
    pub(super) auth: Option<InFlight>,
    pub(super) lease: Option<InFlight>,
    pub(super) kv: Option<InFlight>,
}

impl Calls {
    /// Answers to calls sent before etcd lost its data are not judged by their revision.
    pub(super) fn forget_floors(&mut self) {
        for c in [&mut self.auth, &mut self.lease, &mut self.kv].into_iter().flatten() {
            c.floor = 0;
        }
    }
}

/// The current period's round.
#[derive(Debug, Clone, Default)]
pub(super) struct Round {
    /// When the round and the latest nudge started.
    pub(super) last: Option<Nanos>,
    pub(super) last_nudge: Option<Nanos>,
    pub(super) writes: u32,
    pub(super) published: bool,
    /// The last kv call failed (no follow-up until the next period).
    pub(super) kv_error: bool,
}

impl Fleet {
    /// Periodic work: authenticate, grant or keep the lease alive, publish the record. Call at
    /// least every `period`.
    pub fn tick(&mut self, now: Nanos) -> Vec<EtcdCall> {
        let mut calls = self.expire_calls(now);
        if !self.left && self.needs_token() {
            calls.extend(self.auth_call(now));
        } else if !self.left {
            if self.calls.lease.is_none() {
                calls.extend(self.lease_call(now));
            }
            if self.calls.kv.is_none() && self.lease.due(self.round.last, now) {
                self.round = Round { last: Some(now), last_nudge: self.round.last_nudge, ..Round::default() };
                calls.extend(self.round_call(now));
            } else if self.calls.kv.is_none() && self.nudge_due(now) {
                self.round.last_nudge = Some(now);
                calls.extend(self.nudge_call(now));
            }
        }
        self.refresh(now);
        calls
    }

    fn auth_call(&mut self, now: Nanos) -> Option<EtcdCall> {
        if self.calls.auth.is_some() || !self.lease.due(self.lease.last_auth, now) {
            return None;
        }
        let c = self.config.etcd.credentials.as_ref()?;
        let body = etcd::authenticate_request(&c.username, &c.password);
        self.lease.last_auth = Some(now);
        Some(self.call(CallKind::Authenticate, etcd::AUTHENTICATE, body, now))
    }

    /// A grant when there is no lease, else a keepalive every period.
    fn lease_call(&mut self, now: Nanos) -> Option<EtcdCall> {
        match self.lease.id {
            None if self.lease.due(self.lease.last_grant, now) => Some(self.grant_call(now)),
            Some(id) if self.lease.due(self.lease.last_keepalive, now) => {
                self.lease.last_keepalive = Some(now);
                Some(self.call(CallKind::KeepAlive, etcd::LEASE_KEEPALIVE, etcd::lease_id_request(id), now))
            }
            _ => None,
        }
    }

    fn nudge_due(&self, now: Nanos) -> bool {
        let step = self.config.period / NUDGES_PER_PERIOD;
        let since = |t: Option<Nanos>| t.is_none_or(|t| now.saturating_sub(t) >= step);
        self.round.last.is_some()
            && since(self.round.last)
            && since(self.round.last_nudge)
            && self.round.writes < MAX_WRITES_PER_PERIOD
            && self.lease.trusted(now)
            && self.nudge_useful()
    }

    /// Whether a claim is above the bound of seats in use and the allocation (it can come
    /// down), or the allocation above the granted seats (a raise may fit now).
    pub(super) fn nudge_useful(&self) -> bool {
        let (Some(_), Some(targets)) = (self.own, self.targets()) else { return false };
        let in_use = self.in_use_bound();
        let lowers = self.limited_slots().any(|(i, s)| {
            let t = at(&targets, i);
            s.claim > t.max(at(&in_use, i)).max(s.granted.min(t))
        });
        lowers || self.wants_more(&targets) || self.draining_lowers()
    }

    /// Whether the allocation `targets` gives a limited level more than its granted seats.
    fn wants_more(&self, targets: &[u32]) -> bool {
        self.limited_slots().any(|(i, s)| at(targets, i) > s.granted)
    }

    /// Between rounds (neither left nor waiting for a token): lower the claims where the seats in
    /// use allow it, else read the fleet when this replica may use more seats than it is granted
    /// (the answer's follow-up raises).
    fn nudge_call(&mut self, now: Nanos) -> Option<EtcdCall> {
        self.lease.id.and(self.own)?;
        let plan = self.plan(false, now)?;
        if plan.claims.iter().zip(&self.slots).any(|(p, s)| *p < s.claim) {
            return Some(self.write_call(plan, now));
        }
        let targets = self.targets()?;
        self.wants_more(&targets).then(|| self.range_call(now))
    }

    /// A read of every record under the prefix.
    pub(super) fn range_call(&mut self, now: Nanos) -> EtcdCall {
        let body = etcd::to_vec(&RangeRequest::prefix(&self.prefix));
        self.call(CallKind::Range, etcd::KV_RANGE, body, now)
    }

    /// An answer to call `id`: the HTTP status (0 when there was none: a timeout, a reset) and
    /// the body. Returns calls to send at once (a retry, a raise, a registration).
    pub fn on_response(&mut self, id: u64, status: u16, body: &[u8], now: Nanos) -> Vec<EtcdCall> {
        let take = |slot: &mut Option<InFlight>| slot.take_if(|c| c.id == id);
        let mut calls = Vec::new();
        if take(&mut self.calls.auth).is_some() {
            self.on_authenticate(status, body);
            if !self.left && !self.needs_token() {
                if self.lease.id.is_none() && self.calls.lease.is_none() {
                    calls.push(self.grant_call(now));
                }
                calls.extend(self.follow_up(now));
            }
        } else if let Some(call) = take(&mut self.calls.lease) {
            self.on_lease(call, status, body, now);
            if call.kind == CallKind::Grant && self.lease.id.is_some() {
                // A new lease: register at once.
                self.round.kv_error = false;
                calls.extend(self.follow_up(now));
            }
        } else if let Some(call) = take(&mut self.calls.kv) {
            self.on_kv(call, status, body, now);
            calls.extend(self.follow_up(now));
        }
        // The lease is gone (a keepalive or a write said so): a new one at once.
        let regrant = self.lease.id.is_none() && self.calls.lease.is_none() && self.lease.last_grant.is_none();
        if !self.left && !self.needs_token() && regrant {
            calls.push(self.grant_call(now));
        }
        self.refresh(now);
        calls
    }

    pub(super) fn needs_token(&self) -> bool {
        self.config.etcd.credentials.is_some() && self.lease.token.is_none()
    }

    pub(super) fn call(&mut self, kind: CallKind, path: &'static str, body: Vec<u8>, now: Nanos) -> EtcdCall {
        let id = self.calls.next_id.max(1);
        self.calls.next_id = id.wrapping_add(1).max(1);
        let slot = InFlight { id, kind, sent: now, floor: self.recovery.max_revision };
        match kind {
            CallKind::Authenticate => self.calls.auth = Some(slot),
            CallKind::Grant | CallKind::KeepAlive | CallKind::Revoke => self.calls.lease = Some(slot),
            CallKind::Range | CallKind::Txn(_) => self.calls.kv = Some(slot),
        }
        let mut headers = vec![("content-type", "application/json".to_string())];
        if let Some(t) = &self.lease.token {
            headers.push(("authorization", t.0.clone()));
        }
        EtcdCall { id, path, body, headers }
    }

    fn grant_call(&mut self, now: Nanos) -> EtcdCall {
        self.lease.last_grant = Some(now);
        self.call(CallKind::Grant, etcd::LEASE_GRANT, etcd::lease_grant_request(self.config.lease_ttl_secs()), now)
    }

    /// Calls not answered within `leaseTtl` are given up (as if the host reported a failure);
    /// a late answer is then ignored.
    fn expire_calls(&mut self, now: Nanos) -> Vec<EtcdCall> {
        let ttl = self.config.lease_ttl;
        let stale = |c: &Option<InFlight>| c.filter(|c| now.saturating_sub(c.sent) > ttl);
        let mut calls = Vec::new();
        for call in [stale(&self.calls.auth), stale(&self.calls.lease), stale(&self.calls.kv)].into_iter().flatten() {
            calls.extend(self.on_response(call.id, 0, b"", now));
        }
        calls
    }

    /// The periodic record write; a read when there is no lease or snapshot yet, or when the
    /// lease is not trusted (writes wait until a keepalive succeeds again, so that writes whose
    /// outcome is unknown do not pile up while etcd is unreachable).
    fn round_call(&mut self, now: Nanos) -> Option<EtcdCall> {
        self.round.kv_error = false;
        if self.lease.id.is_some() && self.snapshot.is_some() && !self.needs_token() && self.lease.trusted(now) {
            if let Some(plan) = self.plan(self.own.is_none(), now) {
                return Some(self.write_call(plan, now));
            }
        }
        Some(self.range_call(now))
    }

    /// After an answer: register, retry this period's write, or raise on the fresh snapshot
    /// (not after a failed call: the next period retries).
    pub(super) fn follow_up(&mut self, now: Nanos) -> Option<EtcdCall> {
        if self.left || self.round.kv_error || self.calls.kv.is_some() || self.lease.id.is_none() || self.needs_token() {
            return None;
        }
        if self.snapshot.is_none() {
            // Dropped when etcd lost its data: read the fleet before registering again.
            return self.recovery.until.is_some().then(|| self.range_call(now));
        }
        if self.round.writes >= MAX_WRITES_PER_PERIOD || self.round.last.is_none() {
            return None;
        }
        let plan = self.plan(true, now)?;
        (plan.raises || !self.round.published).then(|| self.write_call(plan, now))
    }

    /// The transaction of a planned write: compare (the record's or the prefix's mod revision),
    /// put the record, read the prefix either way.
    fn write_call(&mut self, plan: Plan, now: Nanos) -> EtcdCall {
        debug_assert!(self.lease.id.is_some(), "records are written under the lease");
        self.heartbeat = self.heartbeat.wrapping_add(1);
        self.round.writes = self.round.writes.saturating_add(1);
        let heartbeat = self.heartbeat;
        let mut record = plan.record;
        record.heartbeat = heartbeat;
        let compare = match plan.base {
            Base::Own(m) => Compare::mod_equal(&self.key, m),
            Base::Prefix(r) => Compare::mod_less(&self.prefix, &etcd::prefix_range_end(&self.prefix), r.saturating_add(1)),
        };
        let read = RequestOp::Range(RangeRequest::prefix(&self.prefix));
        let put = RequestOp::Put(PutRequest { key: self.key.clone(), value: record.encode(), lease: self.lease.id.unwrap_or(0) });
        let txn = TxnRequest { compare: vec![compare], success: vec![put, read.clone()], failure: vec![read] };
        self.pending.push(Pending { heartbeat, base: plan.base, claims: plan.claims, granted: plan.granted });
        self.call(CallKind::Txn(heartbeat), etcd::KV_TXN, txn.to_body(), now)
    }
}
