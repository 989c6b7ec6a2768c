//! The claim protocol: the state machine one replica runs against etcd ([`Fleet`]).
//!
//! **Invariant.** While etcd is reachable, the fleet's seats in use never exceed the fleet's
//! limit. Each record carries, per limited level, a **claim** (an upper bound of the replica's
//! seats in use: the others leave it alone) and **granted** seats (≤ the claim: the replica
//! admits only below them). On every level, every replica's seats in use ≤ its claim, and the
//! granted seats only grow through a transaction that checked them, with the others' claims,
//! against the level's fleet CurrentCL (and over all levels against Σ CurrentCL) on the revision
//! it read. Normally claim = granted; a claim exceeds the granted seats only to cover requests
//! admitted while the record was lost (cut off from etcd), until they drain.
//!
//! - A replica **lowers** its local limit at once and publishes `claim = max(allocation, seats
//!   still in use)`, lower again as they drain. Seats in use are bounded by what the host reports
//!   and by every local limit handed out since that report (see [`Fleet::set_seats_in_use`]).
//! - A replica **raises** its local limit only after a transaction succeeded that (i) compares
//!   the whole prefix's `mod_revision < R+1` (nothing under the prefix changed since the
//!   revision `R` it read) and (ii) puts its record with the higher granted seats, computed so
//!   that the others' claims in the snapshot at `R` plus them fit the level's fleet CurrentCL of
//!   the state the write creates. Every other write compares the record's own `mod_revision`,
//!   so a delayed older write can never overwrite a newer one, and never raises anything.
//! - Each transaction also reads the prefix (`success: [put, range]`, `failure: [range]`): one
//!   round trip gives the next snapshot, and a raise is sent (or a failed one retried) at once
//!   on it, at most [`MAX_WRITES_PER_PERIOD`] writes a period.
//! - A write whose outcome is unknown (no answer) may still apply later: its claims count as
//!   possible until the replica sees its record move past what the write compared; the local
//!   limit stays under every claim etcd may hold, and a raise counts only once confirmed.
//! - Records are bound to the replica's lease, kept alive every `period`. The lease is trusted
//!   until `k + leaseTtl − period`, `k` the time the last successful keepalive was *sent* (etcd
//!   refreshed it later, so it expires after `k + leaseTtl` by etcd's clock; the `period` of
//!   margin absorbs clock rate differences and the time to act). Past that the replica falls
//!   back to the static share (fleet CurrentCL ÷ the last known number of replicas), never above
//!   its last claims and granted seats.
//! - A replica that learns from etcd that its record is gone (lease expired while it was cut
//!   off) admits nothing until it has registered again, one or two round trips later; its
//!   registration claims what it still uses and is granted only what the check allows. If it
//!   cannot register for `leaseTtl − period`, it falls back as above.
//! - A replica that never had a record admits nothing on limited levels until its first
//!   registration succeeds.
//! - Records are checked, not trusted ([`Snapshot::checked`]): a key without a lease, a record
//!   that does not decode and one whose numbers are impossible count for nothing; each is
//!   logged once per mod revision ([`Fleet::ignored_records`], [`Fleet::ignored_total`]).
//! - etcd losing its data is detected — an answer's revision below the highest seen before the
//!   call was sent, a changed cluster id, the lease or the whole fleet gone while the lease was
//!   trusted and other replicas were seen — and survived: for `leaseTtl` the replica is
//!   [`FleetMode::Recovering`], under the static share of the last fleet it knew and the seats
//!   granted then, while it registers again and after, so that the replicas that have not yet
//!   noticed (they keep their allocations until their next call) and those that have fit the
//!   limit together. After `leaseTtl` every old lease was renewed (its replica registered
//!   again) or expired, and the allocation resumes.
//!
//! The host calls [`Fleet::tick`] at least every `period`, sends the returned calls, and passes
//! every answer (or its failure, status 0) to [`Fleet::on_response`]; it feeds the levels' seat
//! demand and seats in use, and applies [`Fleet::limits`] to the engine.

use super::allocation::{static_share, Allocation};
use super::config::FleetConfig;
use super::etcd::{
    self, AuthenticateResponse, Compare, EtcdError, Header, LeaseResponse, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse,
};
use super::levels::FleetPolicy;
use super::record::{valid_replica_id, LevelRecord, Record};
use super::snapshot::{claims_of, granted_of, IgnoredRecord, Snapshot};
use crate::limits::borrowing::SeatDemandStats;
use crate::Nanos;
use std::collections::BTreeMap;

/// Record writes a replica sends per period at most (the periodic one and the retries or
/// raises that follow it at once).
pub const MAX_WRITES_PER_PERIOD: u32 = 4;

/// Between rounds, every `period / NUDGES_PER_PERIOD` a replica whose claims can come down
/// (its seats in use drained under a lower limit) writes them lower, and one that may use more
/// than it is granted reads the fleet again to raise into seats the others freed: seats move
/// within a period of being freed rather than at the next rounds of both replicas.
pub const NUDGES_PER_PERIOD: i64 = 4;

/// Generations of limits kept for the bound of seats in use (older ones are folded together).
const MAX_HISTORY: usize = 32;

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

/// Where the replica stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetMode {
    /// No record of this replica in etcd (not yet, or known gone): no seats on limited levels.
    Joining,
    /// The record is in etcd and the lease trusted: the allocation, under the granted seats.
    Synced,
    /// etcd unreachable for as long as the lease may live: the static share, under the last
    /// claims and granted seats.
    Fallback,
    /// Leaving the fleet gracefully ([`Fleet::leave_gracefully`]): nothing new admitted on
    /// limited levels, the claims lowered to the seats in use as they drain, then the lease
    /// revoked.
    Leaving,
    /// etcd lost its data (its revision went back, its cluster id changed, or the lease or the
    /// whole fleet vanished while the lease was trusted): for `leaseTtl` from the detection, at
    /// most the static share of the last fleet known before the loss and the seats granted
    /// then, also while registering again and after the new registration's grant.
    Recovering,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKind {
    Authenticate,
    Grant,
    KeepAlive,
    Revoke,
    Range,
    /// A record write, identified by its heartbeat.
    Txn(u64),
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    id: u64,
    kind: CallKind,
    sent: Nanos,
    /// The highest store revision seen when the call was sent: etcd applies the call later, so
    /// its answer's revision is at least that unless etcd lost its data.
    floor: i64,
}

/// What a write compared: its own record's mod revision, or the whole prefix's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Own(i64),
    Prefix(i64),
}

/// A write that may apply (sent, answer not seen).
#[derive(Debug, Clone, PartialEq)]
struct Pending {
    heartbeat: u64,
    base: Base,
    claims: Vec<u32>,
    granted: Vec<u32>,
}

/// A planned record write.
struct Plan {
    base: Base,
    claims: Vec<u32>,
    granted: Vec<u32>,
    record: Record,
    raises: bool,
}

/// etcd's auth token (not printed).
#[derive(Clone)]
struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One replica's side of the fleet.
#[derive(Debug, Clone)]
pub struct Fleet {
    config: FleetConfig,
    policy: FleetPolicy,
    id: String,
    key: Vec<u8>,
    prefix: Vec<u8>,
    next_id: u64,
    // Inputs.
    demand: Vec<SeatDemandStats>,
    /// Per level: the widest request waiting for more seats than the local limit (0: none), and
    /// the revision since which it has been waiting for them.
    wide: Vec<u32>,
    wide_since: Vec<i64>,
    in_use: Vec<u32>,
    in_use_generation: u64,
    // Authentication and lease.
    token: Option<Token>,
    lease: Option<i64>,
    /// `k`: when the last keepalive (or grant) that proved the lease alive was sent.
    lease_alive_at: Option<Nanos>,
    last_keepalive: Option<Nanos>,
    last_grant: Option<Nanos>,
    last_auth: Option<Nanos>,
    auth_call: Option<InFlight>,
    lease_call: Option<InFlight>,
    kv_call: Option<InFlight>,
    // Rounds.
    last_round: Option<Nanos>,
    last_nudge: Option<Nanos>,
    writes_this_round: u32,
    published_this_round: bool,
    /// The last kv call failed (no follow-up until the next period).
    kv_error: bool,
    snapshot: Option<Snapshot>,
    allocation: Option<Allocation>,
    /// The record as etcd holds it per the latest observation: (mod revision, claims).
    own: Option<(i64, Vec<u32>)>,
    /// The claims last seen in etcd; kept when the record is lost (the fallback stays under them).
    last_claims: Option<Vec<u32>>,
    /// Per level, the seats a confirmed write was granted by the fleet check: the replica
    /// admits only below them (kept when the record is lost, for the fallback).
    granted: Vec<u32>,
    /// When the replica learnt that its record is gone (from etcd's answers).
    lost_at: Option<Nanos>,
    pending: Vec<Pending>,
    heartbeat: u64,
    // Output.
    limits: Vec<Option<u32>>,
    generation: u64,
    /// Limits of every generation since the one seats in use were last reported under.
    history: Vec<(u64, Vec<Option<u32>>)>,
    mode: FleetMode,
    last_sync: Option<Nanos>,
    sync_failures: u64,
    left: bool,
    /// Since when the replica is leaving gracefully.
    leaving: Option<Nanos>,
    /// Limited levels a new policy removed, with the seats that may still be in use on them:
    /// claimed in the record (outside the policy's levels) until they drain.
    draining: Vec<(String, u32)>,
    // Records ignored, and etcd losing its data.
    /// Per key ignored in the latest snapshot, the mod revision it was logged at.
    ignored_logged: BTreeMap<String, i64>,
    ignored_total: u64,
    /// The highest store revision any answer carried, and the cluster id of the answers.
    max_revision: i64,
    cluster_id: Option<u64>,
    /// Whether the latest snapshot held another replica's record.
    others_seen: bool,
    /// Safe mode after etcd lost its data: until when, and the limits' cap per level.
    recovering_until: Option<Nanos>,
    recovery_cap: Vec<u32>,
    data_losses: u64,
}

fn limited(policy: &FleetPolicy) -> impl Iterator<Item = bool> + '_ {
    policy.levels.iter().map(|l| !l.exempt)
}

impl Fleet {
    /// A replica `replica_id` (unique among live processes: hostname plus a random suffix, for
    /// instance; printable ASCII without `/`) of the fleet `config`, whose levels are `policy`.
    pub fn new(config: FleetConfig, policy: FleetPolicy, replica_id: &str) -> Result<Fleet, String> {
        if !valid_replica_id(replica_id) {
            return Err(format!("replica id {replica_id:?}: must be 1 to 253 printable ASCII characters without /"));
        }
        let n = policy.levels.len();
        let limits: Vec<Option<u32>> = limited(&policy).map(|l| l.then_some(0)).collect();
        Ok(Fleet {
            key: config.replica_key(replica_id).into_bytes(),
            prefix: config.replicas_prefix().into_bytes(),
            config,
            id: replica_id.to_string(),
            next_id: 1,
            demand: vec![SeatDemandStats::default(); n],
            wide: vec![0; n],
            wide_since: vec![0; n],
            in_use: vec![0; n],
            in_use_generation: 0,
            token: None,
            lease: None,
            lease_alive_at: None,
            last_keepalive: None,
            last_grant: None,
            last_auth: None,
            auth_call: None,
            lease_call: None,
            kv_call: None,
            last_round: None,
            last_nudge: None,
            writes_this_round: 0,
            published_this_round: false,
            kv_error: false,
            snapshot: None,
            allocation: None,
            own: None,
            last_claims: None,
            granted: vec![0; n],
            lost_at: None,
            pending: Vec::new(),
            heartbeat: 0,
            history: vec![(0, limits.clone())],
            limits,
            generation: 0,
            mode: FleetMode::Joining,
            last_sync: None,
            sync_failures: 0,
            left: false,
            leaving: None,
            draining: Vec::new(),
            ignored_logged: BTreeMap::new(),
            ignored_total: 0,
            max_revision: 0,
            cluster_id: None,
            others_seen: false,
            recovering_until: None,
            recovery_cap: vec![0; n],
            data_losses: 0,
            policy,
        })
    }

    // -----------------------------------------------------------------------------------------
    // inputs

    /// This replica's seat demand statistics per level (policy order), as the engine keeps them
    /// for upstream's borrowing; published with the next write.
    pub fn set_local_demand(&mut self, demand: &[SeatDemandStats]) {
        for (i, d) in self.demand.iter_mut().enumerate() {
            *d = demand.get(i).copied().unwrap_or_default();
        }
    }

    /// The seats of the widest waiting request per level (policy order; 0: none), published with
    /// the next write when they exceed the local limit: the allocation then makes room for them,
    /// oldest need first. A replica keeps its place in line (the latest snapshot's revision when
    /// the need began) until its limit covers the need.
    pub fn set_widest_waiting(&mut self, widest: &[u32]) {
        let revision = self.snapshot.as_ref().map_or(1, |s| s.revision.max(1));
        for (i, (w, since)) in self.wide.iter_mut().zip(self.wide_since.iter_mut()).enumerate() {
            let seats = widest.get(i).copied().unwrap_or(0);
            let limit = self.limits.get(i).copied().flatten();
            if limit.is_some_and(|l| seats > l) {
                *w = seats;
                if *since == 0 {
                    *since = revision;
                }
            } else {
                (*w, *since) = (0, 0);
            }
        }
    }

    /// Seats in use per level (policy order), measured while the limits of `generation` (or a
    /// later one) were the only ones any worker admitted under. A claim is only ever lowered to
    /// the larger of this and every limit handed out since `generation`. A report under an
    /// older generation than an earlier report's is ignored (it may predate admissions the
    /// earlier one counted).
    pub fn set_seats_in_use(&mut self, in_use: &[u32], generation: u64) {
        let generation = generation.min(self.generation);
        if generation < self.in_use_generation {
            return;
        }
        for (i, x) in self.in_use.iter_mut().enumerate() {
            *x = in_use.get(i).copied().unwrap_or(0);
        }
        self.in_use_generation = generation;
        self.history.retain(|(g, _)| *g >= generation);
    }

    // -----------------------------------------------------------------------------------------
    // outputs

    /// Seats this replica may use now, per level (policy order); `None` for exempt levels.
    pub fn limits(&self) -> &[Option<u32>] {
        &self.limits
    }

    /// Increases whenever [`Fleet::limits`] changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn mode(&self) -> FleetMode {
        self.mode
    }

    pub fn replica_id(&self) -> &str {
        &self.id
    }

    pub fn policy(&self) -> &FleetPolicy {
        &self.policy
    }

    pub fn config(&self) -> &FleetConfig {
        &self.config
    }

    /// The latest snapshot read.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }

    /// The allocation of the latest snapshot.
    pub fn allocation(&self) -> Option<&Allocation> {
        self.allocation.as_ref()
    }

    /// This replica's seats in the latest allocation.
    pub fn targets(&self) -> Option<Vec<u32>> {
        if self.leaving.is_some() {
            return Some(vec![0; self.policy.levels.len()]);
        }
        self.allocation.as_ref().and_then(|a| a.seats_of(&self.id))
    }

    /// This replica's claims as etcd holds them (latest observation).
    pub fn claims(&self) -> Option<&[u32]> {
        self.own.as_ref().map(|(_, c)| c.as_slice())
    }

    pub fn lease(&self) -> Option<i64> {
        self.lease
    }

    /// Until when the lease is trusted (`k + leaseTtl − period`).
    pub fn lease_deadline(&self) -> Option<Nanos> {
        let k = self.lease_alive_at?;
        Some(k.saturating_add(self.config.lease_ttl).saturating_sub(self.config.period))
    }

    /// When the host should call [`Fleet::tick`] next at the latest: the next keepalive or
    /// round, or the lease deadline (where the limits fall back), whichever comes first.
    pub fn next_tick(&self, now: Nanos) -> Nanos {
        let p = self.config.period;
        let nudge = self.last_round.max(self.last_nudge).map(|t| t.saturating_add(p / NUDGES_PER_PERIOD)).filter(|_| self.nudge_useful());
        let due = [
            self.last_keepalive.map(|k| k.saturating_add(p)),
            self.last_round.map(|r| r.saturating_add(p)),
            nudge,
            self.lease_deadline(),
            self.recovering_until,
        ];
        due.into_iter().flatten().filter(|&t| t > now).fold(now.saturating_add(p), Nanos::min)
    }

    /// When the latest snapshot was received.
    pub fn last_sync(&self) -> Option<Nanos> {
        self.last_sync
    }

    /// Calls that failed (no answer, an error, a malformed answer).
    pub fn sync_failures(&self) -> u64 {
        self.sync_failures
    }

    /// The static share per level: fleet CurrentCL ÷ max(the last known number of replicas,
    /// `maxReplicas`).
    pub fn static_shares(&self) -> Vec<u32> {
        let Some(a) = &self.allocation else { return vec![0; self.policy.levels.len()] };
        let seen = a.replicas.len() + usize::from(a.replica_index(&self.id).is_none());
        let n = seen.max(self.config.max_replicas.map_or(0, |m| usize::try_from(m).unwrap_or(usize::MAX)));
        a.levels.iter().map(|l| static_share(l.current, n)).collect()
    }

    /// The keys under the prefix the latest snapshot ignored, and why (sorted by key).
    pub fn ignored_records(&self) -> &[IgnoredRecord] {
        self.snapshot.as_ref().map_or(&[], |s| s.ignored.as_slice())
    }

    /// Distinct (key, mod revision) pairs seen ignored since the start.
    pub fn ignored_total(&self) -> u64 {
        self.ignored_total
    }

    /// How many times etcd was seen losing its data (signs seen while recovering count once).
    pub fn data_losses(&self) -> u64 {
        self.data_losses
    }

    /// Until when the replica stays in [`FleetMode::Recovering`] (the latest detection +
    /// `leaseTtl`), if it has been in it.
    pub fn recovering_until(&self) -> Option<Nanos> {
        self.recovering_until
    }

    // -----------------------------------------------------------------------------------------
    // driving

    /// Periodic work: authenticate, grant or keep the lease alive, publish the record. Call at
    /// least every `period`.
    pub fn tick(&mut self, now: Nanos) -> Vec<EtcdCall> {
        let mut calls = self.expire_calls(now);
        if self.left {
            self.refresh(now);
            return calls;
        }
        let due = |last: Option<Nanos>| last.is_none_or(|t| now.saturating_sub(t) >= self.config.period);
        if self.needs_token() {
            if self.auth_call.is_none() && due(self.last_auth) {
                if let Some(c) = &self.config.etcd.credentials {
                    let body = etcd::authenticate_request(&c.username, &c.password);
                    self.last_auth = Some(now);
                    calls.push(self.call(CallKind::Authenticate, etcd::AUTHENTICATE, body, now));
                }
            }
            self.refresh(now);
            return calls;
        }
        if self.lease_call.is_none() {
            match self.lease {
                None if due(self.last_grant) => calls.push(self.grant_call(now)),
                None => {}
                Some(id) if self.last_keepalive.is_none_or(|t| now.saturating_sub(t) >= self.config.period) => {
                    self.last_keepalive = Some(now);
                    calls.push(self.call(CallKind::KeepAlive, etcd::LEASE_KEEPALIVE, etcd::lease_id_request(id), now));
                }
                Some(_) => {}
            }
        }
        if self.kv_call.is_none() && self.last_round.is_none_or(|t| now.saturating_sub(t) >= self.config.period) {
            self.last_round = Some(now);
            self.writes_this_round = 0;
            self.published_this_round = false;
            calls.extend(self.round_call(now));
        } else if self.kv_call.is_none() && self.nudge_due(now) {
            self.last_nudge = Some(now);
            calls.extend(self.nudge_call(now));
        }
        self.refresh(now);
        calls
    }

    fn nudge_due(&self, now: Nanos) -> bool {
        let step = self.config.period / NUDGES_PER_PERIOD;
        let since = |t: Option<Nanos>| t.is_none_or(|t| now.saturating_sub(t) >= step);
        self.last_round.is_some()
            && since(self.last_round)
            && since(self.last_nudge)
            && self.writes_this_round < MAX_WRITES_PER_PERIOD
            && self.lease_deadline().is_some_and(|d| now < d)
            && self.nudge_useful()
    }

    /// Whether a claim is above the bound of seats in use and the allocation (it can come
    /// down), or the allocation above the granted seats (a raise may fit now).
    fn nudge_useful(&self) -> bool {
        let (Some((_, claims)), Some(targets)) = (self.own.as_ref(), self.targets()) else { return false };
        let in_use = self.in_use_bound();
        let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
        let lowers = self.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt).any(|(i, _)| {
            let (c, t, g) = (at(claims, i), at(&targets, i), at(&self.granted, i));
            c > t.max(at(&in_use, i)).max(g.min(t))
        });
        lowers || self.wants_more(&targets) || self.draining_lowers()
    }

    /// Whether the allocation `targets` gives a limited level more than its granted seats.
    fn wants_more(&self, targets: &[u32]) -> bool {
        let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
        self.policy.levels.iter().enumerate().any(|(i, l)| !l.exempt && at(targets, i) > at(&self.granted, i))
    }

    /// Between rounds: lower the claims where the seats in use allow it, else read the fleet
    /// when this replica may use more seats than it is granted (the answer's follow-up raises).
    fn nudge_call(&mut self, now: Nanos) -> Option<EtcdCall> {
        if self.left || self.lease.is_none() || self.needs_token() {
            return None;
        }
        let current = self.own.as_ref().map(|(_, c)| c.clone())?;
        let plan = self.plan(false, now)?;
        if plan.claims.iter().zip(&current).any(|(p, c)| p < c) {
            return Some(self.write_call(plan, now));
        }
        let targets = self.targets()?;
        self.wants_more(&targets).then(|| self.range_call(now))
    }

    /// A read of every record under the prefix.
    fn range_call(&mut self, now: Nanos) -> EtcdCall {
        let body = RangeRequest::prefix(&self.prefix).to_json();
        self.call(CallKind::Range, etcd::KV_RANGE, serde_json::to_vec(&body).unwrap_or_default(), now)
    }

    /// An answer to call `id`: the HTTP status (0 when there was none: a timeout, a reset) and
    /// the body. Returns calls to send at once (a retry, a raise, a registration).
    pub fn on_response(&mut self, id: u64, status: u16, body: &[u8], now: Nanos) -> Vec<EtcdCall> {
        let take = |slot: &mut Option<InFlight>| slot.take_if(|c| c.id == id);
        let mut calls = Vec::new();
        if take(&mut self.auth_call).is_some() {
            self.on_authenticate(status, body);
            if !self.left && !self.needs_token() {
                if self.lease.is_none() && self.lease_call.is_none() {
                    calls.push(self.grant_call(now));
                }
                calls.extend(self.follow_up(now));
            }
        } else if let Some(call) = take(&mut self.lease_call) {
            self.on_lease(call, status, body, now);
            if call.kind == CallKind::Grant && self.lease.is_some() {
                // A new lease: register at once.
                self.kv_error = false;
                calls.extend(self.follow_up(now));
            }
        } else if let Some(call) = take(&mut self.kv_call) {
            self.on_kv(call, status, body, now);
            calls.extend(self.follow_up(now));
        }
        // The lease is gone (a keepalive or a write said so): a new one at once.
        if !self.left && !self.needs_token() && self.lease.is_none() && self.lease_call.is_none() && self.last_grant.is_none() {
            calls.push(self.grant_call(now));
        }
        self.refresh(now);
        calls
    }

    /// Leave the fleet: revoke the lease (etcd deletes the record at once). Call once the
    /// replica's requests have finished; its seats then serve the others at their next write.
    pub fn leave(&mut self, now: Nanos) -> Vec<EtcdCall> {
        self.left = true;
        self.own = None;
        self.last_claims = Some(vec![0; self.policy.levels.len()]);
        let calls = match self.lease.take() {
            Some(id) => vec![self.call(CallKind::Revoke, etcd::LEASE_REVOKE, etcd::lease_id_request(id), now)],
            None => Vec::new(),
        };
        self.refresh(now);
        calls
    }

    // -----------------------------------------------------------------------------------------
    // calls

    fn needs_token(&self) -> bool {
        self.config.etcd.credentials.is_some() && self.token.is_none()
    }

    fn call(&mut self, kind: CallKind, path: &'static str, body: Vec<u8>, now: Nanos) -> EtcdCall {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let slot = InFlight { id, kind, sent: now, floor: self.max_revision };
        match kind {
            CallKind::Authenticate => self.auth_call = Some(slot),
            CallKind::Grant | CallKind::KeepAlive | CallKind::Revoke => self.lease_call = Some(slot),
            CallKind::Range | CallKind::Txn(_) => self.kv_call = Some(slot),
        }
        let mut headers = vec![("content-type", "application/json".to_string())];
        if let Some(t) = &self.token {
            headers.push(("authorization", t.0.clone()));
        }
        EtcdCall { id, path, body, headers }
    }

    fn grant_call(&mut self, now: Nanos) -> EtcdCall {
        self.last_grant = Some(now);
        self.call(CallKind::Grant, etcd::LEASE_GRANT, etcd::lease_grant_request(self.config.lease_ttl_secs()), now)
    }

    /// Calls not answered within `leaseTtl` are given up (as if the host reported a failure);
    /// a late answer is then ignored.
    fn expire_calls(&mut self, now: Nanos) -> Vec<EtcdCall> {
        let ttl = self.config.lease_ttl;
        let stale = |c: &Option<InFlight>| c.filter(|c| now.saturating_sub(c.sent) > ttl);
        let mut calls = Vec::new();
        for call in [stale(&self.auth_call), stale(&self.lease_call), stale(&self.kv_call)].into_iter().flatten() {
            calls.extend(self.on_response(call.id, 0, b"", now));
        }
        calls
    }

    /// The periodic record write; a read when there is no lease or snapshot yet, or when the
    /// lease is not trusted (writes wait until a keepalive succeeds again, so that writes whose
    /// outcome is unknown do not pile up while etcd is unreachable).
    fn round_call(&mut self, now: Nanos) -> Option<EtcdCall> {
        self.kv_error = false;
        let trusted = self.lease_deadline().is_some_and(|d| now < d);
        if self.lease.is_some() && self.snapshot.is_some() && !self.needs_token() && trusted {
            let raise = self.own.is_none();
            if let Some(plan) = self.plan(raise, now) {
                return Some(self.write_call(plan, now));
            }
        }
        Some(self.range_call(now))
    }

    /// After an answer: register, retry this period's write, or raise on the fresh snapshot
    /// (not after a failed call: the next period retries).
    fn follow_up(&mut self, now: Nanos) -> Option<EtcdCall> {
        if self.left || self.kv_error || self.kv_call.is_some() || self.lease.is_none() || self.needs_token() {
            return None;
        }
        if self.snapshot.is_none() {
            // Dropped when etcd lost its data: read the fleet before registering again.
            return self.recovering_until.is_some().then(|| self.range_call(now));
        }
        if self.writes_this_round >= MAX_WRITES_PER_PERIOD || self.last_round.is_none() {
            return None;
        }
        let plan = self.plan(true, now)?;
        if plan.raises || !self.published_this_round {
            return Some(self.write_call(plan, now));
        }
        None
    }

    fn write_call(&mut self, plan: Plan, now: Nanos) -> EtcdCall {
        self.heartbeat = self.heartbeat.wrapping_add(1);
        self.writes_this_round = self.writes_this_round.saturating_add(1);
        let heartbeat = self.heartbeat;
        let mut record = plan.record;
        record.heartbeat = heartbeat;
        let compare = match plan.base {
            Base::Own(m) => Compare::mod_equal(&self.key, m),
            Base::Prefix(r) => Compare::mod_less(&self.prefix, &etcd::prefix_range_end(&self.prefix), r.saturating_add(1)),
        };
        let read = RequestOp::Range(RangeRequest::prefix(&self.prefix));
        let put = RequestOp::Put(PutRequest { key: self.key.clone(), value: record.encode(), lease: self.lease.unwrap_or(0) });
        let txn = TxnRequest { compare: vec![compare], success: vec![put, read.clone()], failure: vec![read] };
        self.pending.push(Pending { heartbeat, base: plan.base, claims: plan.claims, granted: plan.granted });
        self.call(CallKind::Txn(heartbeat), etcd::KV_TXN, txn.to_body(), now)
    }

    // -----------------------------------------------------------------------------------------
    // answers

    fn failed(&mut self, e: &EtcdError) {
        self.sync_failures = self.sync_failures.saturating_add(1);
        if e.is_auth() {
            self.token = None;
        }
        log::debug!("fleet {}: etcd call failed: {e}", self.id);
    }

    fn on_authenticate(&mut self, status: u16, body: &[u8]) {
        match AuthenticateResponse::decode(status, body) {
            Ok(r) => self.token = Some(Token(r.token)),
            Err(e) => self.failed(&e),
        }
    }

    fn on_lease(&mut self, call: InFlight, status: u16, body: &[u8], now: Nanos) {
        match call.kind {
            CallKind::Grant => match LeaseResponse::decode_grant(status, body) {
                Ok(r) => {
                    self.seen_header(&call, &r.header, now);
                    self.lease = Some(r.id);
                    self.lease_alive_at = Some(call.sent);
                    self.last_keepalive = Some(call.sent);
                }
                Err(e) => self.failed(&e),
            },
            CallKind::KeepAlive => match LeaseResponse::decode_keepalive(status, body) {
                Ok(r) if r.ttl > 0 => {
                    self.seen_header(&call, &r.header, now);
                    self.lease_alive_at = Some(self.lease_alive_at.map_or(call.sent, |k| k.max(call.sent)));
                }
                Ok(r) => {
                    self.seen_header(&call, &r.header, now);
                    self.lease_gone(now);
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
        if self.lease.is_some() && self.lease_trusted(now) && self.others_seen {
            self.data_lost("the lease vanished while trusted", now);
        }
        log::info!("fleet {}: lease gone, registering again", self.id);
        self.lease = None;
        self.lease_alive_at = None;
        self.last_grant = None;
        self.lost(now);
        self.pending.clear();
    }

    /// The record is gone: others may already use its seats. Until registered again the replica
    /// admits nothing (it learnt this from etcd, so registering is one or two round trips away).
    fn lost(&mut self, now: Nanos) {
        if self.own.take().is_some() && self.lost_at.is_none() {
            self.lost_at = Some(now);
        }
    }

    fn on_kv(&mut self, call: InFlight, status: u16, body: &[u8], now: Nanos) {
        self.kv_error = true;
        match call.kind {
            CallKind::Range => {
                match RangeResponse::decode(status, body).and_then(|r| Ok((r.header, Snapshot::from_range(&self.prefix, &r)?))) {
                    Ok((header, s)) => {
                        self.kv_error = false;
                        self.seen_header(&call, &header, now);
                        self.observe(s, now);
                    }
                    Err(e) => self.failed(&e),
                }
            }
            CallKind::Txn(heartbeat) => {
                let answer = TxnResponse::decode(status, body);
                let read = answer.as_ref().ok().map(|t| t.range().map(|r| Snapshot::from_range(&self.prefix, r)));
                match (answer, read) {
                    (Ok(t), Some(Some(Ok(snapshot)))) => {
                        self.seen_header(&call, &t.header, now);
                        let written = self.pending.iter().position(|p| p.heartbeat == heartbeat).map(|i| self.pending.swap_remove(i));
                        self.kv_error = false;
                        if t.succeeded {
                            if let Some(p) = written {
                                // Every other pending write compared an older state of the record.
                                self.pending.clear();
                                self.own = Some((t.header.revision, p.claims.clone()));
                                self.last_claims = Some(p.claims);
                                self.granted = p.granted;
                                self.lost_at = None;
                            }
                            self.published_this_round = true;
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
            _ => {}
        }
    }

    /// An answer's header: etcd lost its data when its cluster id changed or its revision is
    /// below the highest one seen before the call was sent. A keepalive's revision is not
    /// judged: a member that is not the leader forwards the renewal and fills the header with
    /// its own applied revision, which may lag (etcd `server/etcdserver/api/v3rpc/header.go: fill`); ranges (linearizable),
    /// txns and lease grants (through raft) are answered at least at the revision committed
    /// when they arrived.
    fn seen_header(&mut self, call: &InFlight, h: &Header, now: Nanos) {
        if h.cluster_id != 0 {
            if let Some(old) = self.cluster_id.filter(|&c| c != h.cluster_id) {
                self.data_lost(&format!("etcd's cluster id changed from {old:x} to {:x}", h.cluster_id), now);
            }
            self.cluster_id = Some(h.cluster_id);
        }
        if h.revision > 0 && h.revision < call.floor && call.kind != CallKind::KeepAlive {
            self.data_lost(&format!("etcd's revision went back from {} to {}", call.floor, h.revision), now);
        }
        if h.revision > 0 {
            self.max_revision = self.max_revision.max(h.revision);
        }
    }

    /// etcd lost its data while the other replicas may still use their allocations: safe mode
    /// for `leaseTtl` (every old lease has then been renewed or has expired), under the static
    /// share of the last fleet known (at least `maxReplicas` replicas) and the seats granted now.
    /// The revision seen so far no longer counts (answers to calls sent before are not judged).
    fn data_lost(&mut self, why: &str, now: Nanos) {
        let recovering = self.recovering_until.is_some_and(|t| now < t);
        if !recovering {
            // Further signs of the same loss (the lease gone, the fleet empty) only extend it.
            log::warn!("fleet {}: etcd lost its data ({why}): recovering for leaseTtl", self.id);
            self.data_losses = self.data_losses.saturating_add(1);
        }
        let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
        let shares = self.static_shares();
        self.recovery_cap = (0..self.policy.levels.len())
            .map(|i| {
                let cap = at(&shares, i).min(at(&self.granted, i));
                if recovering {
                    cap.min(at(&self.recovery_cap, i))
                } else {
                    cap
                }
            })
            .collect();
        self.recovering_until = Some(now.saturating_add(self.config.lease_ttl));
        // The snapshot is of the lost data: a registration checked against it would pass a
        // prefix compare on the new store's lower revisions. Read the fleet again first.
        self.snapshot = None;
        self.max_revision = 0;
        for c in [&mut self.auth_call, &mut self.lease_call, &mut self.kv_call].into_iter().flatten() {
            c.floor = 0;
        }
        (self.wide.iter_mut().zip(self.wide_since.iter_mut())).for_each(|(w, since)| (*w, *since) = (0, 0));
    }

    fn lease_trusted(&self, now: Nanos) -> bool {
        self.lease_deadline().is_some_and(|d| now < d)
    }

    fn recovering(&self, now: Nanos) -> bool {
        !self.left && self.recovering_until.is_some_and(|t| now < t)
    }

    /// Logs each ignored key once per mod revision, and counts them.
    fn note_ignored(&mut self, ignored: &[IgnoredRecord]) {
        let mut logged = BTreeMap::new();
        for r in ignored {
            if self.ignored_logged.get(&r.id) != Some(&r.mod_revision) {
                let key = format!("{}{}", String::from_utf8_lossy(&self.prefix), r.id);
                log::warn!("fleet {}: ignoring key {key:?} (mod revision {}): {}", self.id, r.mod_revision, r.reason);
                self.ignored_total = self.ignored_total.saturating_add(1);
            }
            logged.insert(r.id.clone(), r.mod_revision);
        }
        self.ignored_logged = logged;
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
        self.note_ignored(&s.ignored);
        if s.replicas.is_empty() && self.own.is_some() && self.others_seen && self.lease_trusted(now) {
            self.data_lost("the fleet vanished while the lease was trusted", now);
        }
        self.others_seen = s.replicas.iter().any(|e| e.id != self.id);
        match s.get(&self.id) {
            Some(e) => {
                let (claims, granted) = match &e.record {
                    Ok(r) => (claims_of(r, &self.policy), granted_of(r, &self.policy)),
                    Err(_) => (vec![0; self.policy.levels.len()], vec![0; self.policy.levels.len()]),
                };
                let m = e.mod_revision;
                // A pending write is dead once the record moved past what it compared.
                self.pending.retain(|p| match p.base {
                    Base::Own(b) => b == m,
                    Base::Prefix(r) => m <= r,
                });
                if self.own.as_ref().is_none_or(|(known, _)| *known != m) {
                    // A write whose answer was lost applied, or a record from an earlier run
                    // of this replica: keep the smaller of the grants (a registration's grant
                    // can be below its claims, which cover seats in use it was not granted).
                    for (g, r) in self.granted.iter_mut().zip(&granted) {
                        *g = (*g).min(*r);
                    }
                    self.lost_at = None;
                }
                self.own = Some((m, claims.clone()));
                self.last_claims = Some(claims);
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

    // -----------------------------------------------------------------------------------------
    // claims and limits

    /// An upper bound of the seats in use now: the last report, and every limit handed out
    /// since the generation it was measured under.
    fn in_use_bound(&self) -> Vec<u32> {
        (0..self.policy.levels.len())
            .map(|i| {
                let limits = self.history.iter().filter_map(|(_, l)| l.get(i).copied().flatten());
                limits.fold(self.in_use.get(i).copied().unwrap_or(0), u32::max)
            })
            .collect()
    }

    /// Per level, the smallest claim etcd may hold for this replica now or later: the latest
    /// observed one and every pending write's (the last claims when the record is gone).
    fn claim_floor(&self) -> Option<Vec<u32>> {
        let base = self.own.as_ref().map(|(_, c)| c).or(self.last_claims.as_ref())?;
        Some(
            base.iter().enumerate().map(|(i, &c)| self.pending.iter().filter_map(|p| p.claims.get(i).copied()).fold(c, u32::min)).collect(),
        )
    }

    /// The next record write on the latest snapshot, raising grants only when `raise` (a
    /// registration always may).
    ///
    /// Per limited level, with `t` the allocation of the state this write creates (in safe mode
    /// at most the recovery cap: nothing is granted above it), `g` the
    /// granted seats, `cur` the current claim and `u` the bound of seats in use:
    /// - raise (`t > g`): granted `g' = min(t, max(g, room))`, `room` = the level's fleet
    ///   CurrentCL − Σ the others' claims; otherwise `g' = min(g, max(t, u))`;
    /// - claim `= max(u, g', min(cur, t))`: never below the seats in use or the grant, lowered
    ///   toward the allocation, above the current claim only by a grant or by seats in use the
    ///   record no longer covered (a registration after the record was lost);
    /// - over all levels, Σ the others' claims + Σ `g'` ≤ Σ fleet CurrentCL: raises are trimmed,
    ///   last levels first.
    fn plan(&self, raise: bool, now: Nanos) -> Option<Plan> {
        let snap = self.snapshot.as_ref()?;
        let present = self.own.is_some();
        let raise = (raise || !present) && self.leaving.is_none();
        let in_use = self.in_use_bound();
        let n = self.policy.levels.len();
        let mut record = Record {
            heartbeat: 0,
            revision: snap.revision,
            server_concurrency_limit: self.policy.server_concurrency_limit,
            levels: self
                .policy
                .levels
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    // A leaving replica wants nothing: the allocation gives its seats to the others.
                    let staying = self.leaving.is_none();
                    let demand = self.demand.get(i).copied().filter(|_| staying).unwrap_or_default();
                    let record = LevelRecord {
                        demand,
                        in_use: self.in_use.get(i).copied().unwrap_or(0),
                        wide: self.wide.get(i).copied().filter(|_| staying).unwrap_or(0),
                        wide_since: self.wide_since.get(i).copied().filter(|_| staying).unwrap_or(0),
                        ..LevelRecord::default()
                    };
                    (l.name.clone(), record)
                })
                .collect(),
        };
        for (name, seats) in &self.draining {
            record.levels.entry(name.clone()).or_default().claim = *seats;
        }
        // The state this write creates, and its allocation.
        let after = snap.with_record(&self.id, record.clone());
        let alloc = after.allocate(&self.policy);
        let mut target = alloc.seats_of(&self.id).filter(|_| self.leaving.is_none()).unwrap_or_else(|| vec![0; n]);
        if self.recovering(now) {
            // Safe mode: never granted above the cap.
            for (t, c) in target.iter_mut().zip(&self.recovery_cap) {
                *t = (*t).min(*c);
            }
        }
        let others = after.others_claims(&self.policy, &self.id);
        let zeros = vec![0u32; n];
        let current: &[u32] = self.own.as_ref().map_or(&zeros, |(_, c)| c);
        let old_granted: &[u32] = if present { &self.granted } else { &zeros };
        let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
        let mut granted = vec![0u32; n];
        for (i, l) in self.policy.levels.iter().enumerate() {
            if l.exempt {
                continue;
            }
            let (t, g, u) = (at(&target, i), at(old_granted, i), at(&in_use, i));
            let g2 = if raise && t > g {
                let fleet_cl = alloc.levels.get(i).map_or(0, |a| u64::from(a.current));
                let others_claims = others.per_level.get(i).copied().unwrap_or(u64::MAX);
                let room = u32::try_from(fleet_cl.saturating_sub(others_claims)).unwrap_or(u32::MAX);
                t.min(g.max(room))
            } else {
                g.min(t.max(u))
            };
            if let Some(x) = granted.get_mut(i) {
                *x = g2;
            }
        }
        // The total over all levels must fit the fleet's Σ CurrentCL: trim raises, last levels first.
        let draining = self.draining.iter().map(|(_, s)| u64::from(*s)).sum::<u64>();
        let total = granted.iter().map(|&g| u64::from(g)).sum::<u64>().saturating_add(others.total).saturating_add(draining);
        let mut excess = total.saturating_sub(alloc.limited_total());
        for (i, g2) in granted.iter_mut().enumerate().rev() {
            let raised = g2.saturating_sub(at(old_granted, i));
            let cut = u32::try_from(excess.min(u64::from(raised))).unwrap_or(0);
            *g2 = g2.saturating_sub(cut);
            excess = excess.saturating_sub(u64::from(cut));
        }
        let claims: Vec<u32> = self
            .policy
            .levels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                if l.exempt {
                    return 0;
                }
                at(&in_use, i).max(at(&granted, i)).max(at(current, i).min(at(&target, i)))
            })
            .collect();
        for (i, l) in self.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
            if let Some(lr) = record.levels.get_mut(&l.name) {
                lr.claim = at(&claims, i);
                lr.granted = at(&granted, i);
            }
        }
        let raises = !present || (0..n).any(|i| at(&granted, i) > at(old_granted, i) || at(&claims, i) > at(current, i));
        let base = match (raises, &self.own) {
            (false, Some((m, _))) => Base::Own(*m),
            _ => Base::Prefix(snap.revision),
        };
        Some(Plan { base, claims, granted, record, raises })
    }

    fn compute_mode(&self, now: Nanos) -> FleetMode {
        if self.leaving.is_some() {
            return FleetMode::Leaving;
        }
        if self.recovering(now) {
            return FleetMode::Recovering;
        }
        let trusted = self.lease.is_some() && self.lease_deadline().is_some_and(|d| now < d);
        // Unable to register again for as long as a lease may live: as if cut off.
        let rejoin_failed = self.lost_at.is_some_and(|t| now >= t.saturating_add(self.config.lease_ttl).saturating_sub(self.config.period));
        match &self.own {
            Some(_) if trusted && !self.left => FleetMode::Synced,
            // A record of an earlier run of this replica, no lease of its own yet.
            Some(_) if self.lease_alive_at.is_none() && self.lease.is_none() => FleetMode::Joining,
            Some(_) => FleetMode::Fallback,
            None if rejoin_failed && self.last_claims.is_some() && !self.left => FleetMode::Fallback,
            None => FleetMode::Joining,
        }
    }

    /// Safe mode's limits (before the claims and the granted seats): the allocation while the
    /// record is in etcd and the lease trusted, else the static share; never above the cap.
    fn recovery_limits(&self, now: Nanos) -> Vec<u32> {
        let base = match self.targets() {
            Some(t) if self.own.is_some() && self.lease.is_some() && self.lease_trusted(now) => t,
            _ => self.static_shares(),
        };
        base.iter().zip(&self.recovery_cap).map(|(b, c)| (*b).min(*c)).collect()
    }

    /// Recomputes the mode and the limits; a change starts a new generation.
    fn refresh(&mut self, now: Nanos) {
        self.mode = self.compute_mode(now);
        let floor = self.claim_floor().unwrap_or_else(|| vec![0; self.policy.levels.len()]);
        let cap: Vec<u32> = match self.mode {
            FleetMode::Joining | FleetMode::Leaving => vec![0; self.policy.levels.len()],
            FleetMode::Synced => self.targets().unwrap_or_else(|| floor.clone()),
            FleetMode::Fallback => self.static_shares(),
            FleetMode::Recovering => self.recovery_limits(now),
        };
        let at = |v: &[u32], i: usize| v.get(i).copied().unwrap_or(0);
        let limits: Vec<Option<u32>> = self
            .policy
            .levels
            .iter()
            .enumerate()
            .map(|(i, l)| (!l.exempt).then(|| at(&cap, i).min(at(&floor, i)).min(at(&self.granted, i))))
            .collect();
        if limits != self.limits {
            self.generation = self.generation.wrapping_add(1);
            self.history.push((self.generation, limits.clone()));
            self.limits = limits;
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
    }

    // -----------------------------------------------------------------------------------------
    // a new policy, leaving

    /// A new policy (levels, fleet limit) for the same fleet: the lease and the record stay,
    /// and every level's state (limits, claims, granted seats, demand, wide need, the limits'
    /// history) carries over by name. A new level starts with no seats, raised by the next
    /// round's transaction; a limited level the policy removes (or makes exempt) stays claimed,
    /// outside the policy's levels, with the seats that may still be in use on it, until they
    /// drain ([`Fleet::set_draining_in_use`]). The new allocation lowers limits at once; raises
    /// only ever come from a transaction.
    pub fn set_policy(&mut self, policy: FleetPolicy, now: Nanos) {
        let bound = self.in_use_bound();
        let old = std::mem::replace(&mut self.policy, policy);
        let map: Vec<Option<usize>> = self.policy.levels.iter().map(|l| old.index(&l.name)).collect();
        let new = &self.policy;
        for (i, l) in old.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
            let seats = bound.get(i).copied().unwrap_or(0);
            if seats > 0 && new.index(&l.name).is_none_or(|j| new.levels.get(j).is_some_and(|n| n.exempt)) {
                self.draining.push((l.name.clone(), seats));
            }
        }
        let limits_of = |v: &[Option<u32>]| -> Vec<Option<u32>> {
            new.levels.iter().zip(remap(v, &map, None)).map(|(l, x)| (!l.exempt).then(|| x.unwrap_or(0))).collect()
        };
        self.limits = limits_of(&self.limits);
        self.history = self.history.iter().map(|(g, l)| (*g, limits_of(l))).collect();
        self.demand = remap(&self.demand, &map, SeatDemandStats::default());
        self.wide = remap(&self.wide, &map, 0);
        self.wide_since = remap(&self.wide_since, &map, 0);
        self.in_use = remap(&self.in_use, &map, 0);
        self.granted = remap(&self.granted, &map, 0);
        // Recovering: a level new to the policy gets no seats until the safe mode ends.
        self.recovery_cap = remap(&self.recovery_cap, &map, 0);
        self.own = self.own.take().map(|(m, c)| (m, remap(&c, &map, 0)));
        self.last_claims = self.last_claims.take().map(|c| remap(&c, &map, 0));
        for p in &mut self.pending {
            p.claims = remap(&p.claims, &map, 0);
            p.granted = remap(&p.granted, &map, 0);
        }
        // A level limited again: what may still be in use on it counts as in use.
        let (policy, mut back) = (&self.policy, Vec::new());
        self.draining.retain(|(n, s)| match policy.index(n).filter(|&i| policy.levels.get(i).is_some_and(|l| !l.exempt)) {
            Some(i) => {
                back.push((i, *s));
                false
            }
            None => true,
        });
        for (i, seats) in back {
            if let Some(u) = self.in_use.get_mut(i) {
                *u = (*u).max(seats);
            }
        }
        self.allocation = self.snapshot.as_ref().map(|s| s.allocate(&self.policy));
        self.generation = self.generation.wrapping_add(1);
        self.history.push((self.generation, self.limits.clone()));
        self.refresh(now);
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
    fn draining_lowers(&self) -> bool {
        let Some(Ok(r)) = self.snapshot.as_ref().and_then(|s| s.get(&self.id)).map(|e| e.record.as_ref()) else { return false };
        let limited = |n: &str| self.policy.index(n).and_then(|i| self.policy.levels.get(i)).is_some_and(|l| !l.exempt);
        let published = r.levels.iter().filter(|(n, _)| !limited(n));
        published.into_iter().any(|(n, l)| l.claim > self.draining.iter().find(|(d, _)| d == n).map_or(0, |(_, s)| *s))
    }

    /// Leave the fleet gracefully: call on every tick once asked to (idempotent). From the
    /// first call on the replica admits nothing new on limited levels (limits 0, no raise),
    /// publishes no demand, and its record's claims and granted seats come down to the seats
    /// still in use as they drain (the others raise into the freed seats at their next read). Once nothing is in use, or
    /// after `leaseTtl` at most, the lease is revoked ([`Fleet::leave`]); returns that call.
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
        if self.lease.is_none() || drained || now >= since.saturating_add(self.config.lease_ttl) {
            log::info!("fleet {}: left the fleet (drained: {drained})", self.id);
            return self.leave(now);
        }
        Vec::new()
    }
}

/// `v` (in an old policy's level order) in a new policy's order: `map` names each new level's
/// old index; a level new to the policy gets `fill`.
fn remap<T: Clone>(v: &[T], map: &[Option<usize>], fill: T) -> Vec<T> {
    map.iter().map(|m| m.and_then(|i| v.get(i).cloned()).unwrap_or_else(|| fill.clone())).collect()
}
