//! The claim protocol: the state machine one replica runs against etcd ([`Fleet`]).
//!
//! **Invariant.** While etcd is reachable, the fleet's seats in use never exceed the fleet's
//! limit. Per limited level each record carries a **claim** (an upper bound of the replica's
//! seats in use) and **granted** seats (≤ the claim; the replica admits only below them). A
//! replica lowers at once, locally; it raises only through a transaction that compares the whole
//! prefix's `mod_revision < R+1` and checks the others' claims at `R` plus its new grant against
//! the level's fleet CurrentCL (and Σ CurrentCL). Every other write compares the record's own
//! `mod_revision`. Writes whose outcome is unknown count as possible until seen superseded.
//! Past the lease's trust (`k + leaseTtl − period`, `k` when the last successful keepalive was
//! sent) the replica falls back to the static share; when etcd loses its data it recovers for
//! `leaseTtl` ([`FleetMode::Recovering`]). docs/fleet.md, "The claim protocol", is the long form.
//!
//! The host calls [`Fleet::tick`] at least every `period`, sends the returned calls, and passes
//! every answer (or its failure, status 0) to [`Fleet::on_response`]; it feeds the levels' seat
//! demand and seats in use, and applies [`Fleet::limits`] to the engine.
//!
//! Rooms: `slot` (one level's state), `lease` (the lease and the auth token), `calls` (rounds,
//! nudges, follow-ups), `answers` (what an answer teaches), `plan` (the next write: grants,
//! claims, trims), `limits` (the mode and the limits handed out), `recovery` (etcd losing its
//! data, ignored records), `reconfigure` (a new policy, leaving), `inspect` (read-only views).

mod answers;
mod calls;
mod inspect;
mod lease;
mod limits;
mod plan;
mod reconfigure;
mod recovery;
mod slot;

pub use calls::EtcdCall;

use super::allocation::Allocation;
use super::config::FleetConfig;
use super::levels::FleetPolicy;
use super::record::valid_replica_id;
use super::snapshot::Snapshot;
use crate::limits::borrowing::SeatDemandStats;
use crate::Nanos;
use calls::{Calls, Round};
use lease::Lease;
use limits::Limits;
use plan::Pending;
use recovery::{IgnoredLog, Recovery};
use slot::LevelSlot;

/// Record writes a replica sends per period at most (the periodic one and the retries or
/// raises that follow it at once).
pub const MAX_WRITES_PER_PERIOD: u32 = 4;

/// Between rounds, every `period / NUDGES_PER_PERIOD`, a replica writes claims that can come
/// down, or reads the fleet to raise into freed seats: seats move within a period of being freed.
pub const NUDGES_PER_PERIOD: i64 = 4;

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
    /// limited levels, the claims following the seats in use down, then the lease revoked.
    Leaving,
    /// etcd lost its data ([`Fleet::data_losses`]): for `leaseTtl`, at most the static share of
    /// the last fleet known before the loss and the seats granted then.
    Recovering,
}

/// Why a [`Fleet`] cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetError {
    /// The replica id cannot be part of a key (see [`Fleet::new`]).
    InvalidReplicaId(String),
}

impl std::fmt::Display for FleetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetError::InvalidReplicaId(id) => write!(f, "replica id {id:?}: must be 1 to 253 printable ASCII characters without /"),
        }
    }
}

impl std::error::Error for FleetError {}

/// One replica's side of the fleet.
#[derive(Debug, Clone)]
pub struct Fleet {
    config: FleetConfig,
    policy: FleetPolicy,
    id: String,
    key: Vec<u8>,
    prefix: Vec<u8>,
    /// Per level, in the policy's order.
    slots: Vec<LevelSlot>,
    /// The generation the seats in use were last reported under.
    in_use_generation: u64,
    lease: Lease,
    calls: Calls,
    round: Round,
    snapshot: Option<Snapshot>,
    allocation: Option<Allocation>,
    /// The mod revision of the record as etcd holds it per the latest observation (its claims
    /// are the slots' `claim`).
    own: Option<i64>,
    /// Whether claims were ever seen in etcd (the slots' `claim` keeps the last ones when the
    /// record is lost: the fallback stays under them).
    claims_seen: bool,
    /// When the replica learnt that its record is gone (from etcd's answers).
    lost_at: Option<Nanos>,
    /// Writes that may still apply.
    pending: Vec<Pending>,
    heartbeat: u64,
    limits: Limits,
    mode: FleetMode,
    last_sync: Option<Nanos>,
    sync_failures: u64,
    left: bool,
    /// Since when the replica is leaving gracefully.
    leaving: Option<Nanos>,
    /// Limited levels a new policy removed, with the seats that may still be in use on them:
    /// claimed in the record (outside the policy's levels) until they drain.
    draining: Vec<(String, u32)>,
    ignored: IgnoredLog,
    recovery: Recovery,
}

impl Fleet {
    /// A replica `replica_id` (unique among live processes: hostname plus a random suffix, for
    /// instance; printable ASCII without `/`) of the fleet `config`, whose levels are `policy`.
    pub fn new(config: FleetConfig, policy: FleetPolicy, replica_id: &str) -> Result<Fleet, FleetError> {
        if !valid_replica_id(replica_id) {
            return Err(FleetError::InvalidReplicaId(replica_id.to_string()));
        }
        Ok(Fleet {
            key: config.replica_key(replica_id).into_bytes(),
            prefix: config.replicas_prefix().into_bytes(),
            id: replica_id.to_string(),
            slots: vec![LevelSlot::default(); policy.levels.len()],
            in_use_generation: 0,
            lease: Lease::new(&config),
            calls: Calls::default(),
            round: Round::default(),
            snapshot: None,
            allocation: None,
            own: None,
            claims_seen: false,
            lost_at: None,
            pending: Vec::new(),
            heartbeat: 0,
            limits: Limits::new(&policy),
            mode: FleetMode::Joining,
            last_sync: None,
            sync_failures: 0,
            left: false,
            leaving: None,
            draining: Vec::new(),
            ignored: IgnoredLog::default(),
            recovery: Recovery::default(),
            config,
            policy,
        })
    }

    /// This replica's seat demand statistics per level (policy order), as the engine keeps them
    /// for upstream's borrowing; published with the next write.
    pub fn set_local_demand(&mut self, demand: &[SeatDemandStats]) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            s.demand = demand.get(i).copied().unwrap_or_default();
        }
    }

    /// The seats of the widest waiting request per level (policy order; 0: none), published with
    /// the next write when they exceed the local limit: the allocation then makes room for them,
    /// oldest need first. A replica keeps its place in line (the latest snapshot's revision when
    /// the need began) until its limit covers the need.
    pub fn set_widest_waiting(&mut self, widest: &[u32]) {
        let revision = self.snapshot.as_ref().map_or(1, |s| s.revision.max(1));
        for (i, s) in self.slots.iter_mut().enumerate() {
            let seats = widest.get(i).copied().unwrap_or(0);
            let limit = self.limits.current.get(i).copied().flatten();
            if limit.is_some_and(|l| seats > l) {
                s.wide = seats;
                if s.wide_since == 0 {
                    s.wide_since = revision;
                }
            } else {
                (s.wide, s.wide_since) = (0, 0);
            }
        }
    }

    /// Seats in use per level (policy order), measured while the limits of `generation` (or a
    /// later one) were the only ones any worker admitted under. A claim is only ever lowered to
    /// the larger of this and every limit handed out since `generation`. A report under an
    /// older generation than an earlier report's is ignored (it may predate admissions the
    /// earlier one counted).
    pub fn set_seats_in_use(&mut self, in_use: &[u32], generation: u64) {
        let generation = generation.min(self.limits.generation);
        if generation < self.in_use_generation {
            return;
        }
        for (i, s) in self.slots.iter_mut().enumerate() {
            s.in_use = in_use.get(i).copied().unwrap_or(0);
        }
        self.in_use_generation = generation;
        self.limits.forget_before(generation);
    }

    /// Seats this replica may use now, per level (policy order); `None` for exempt levels.
    pub fn limits(&self) -> &[Option<u32>] {
        &self.limits.current
    }

    /// Increases whenever [`Fleet::limits`] changes.
    pub fn generation(&self) -> u64 {
        self.limits.generation
    }

    pub fn mode(&self) -> FleetMode {
        self.mode
    }

    pub fn replica_id(&self) -> &str {
        &self.id
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

    /// When the latest snapshot was received.
    pub fn last_sync(&self) -> Option<Nanos> {
        self.last_sync
    }

    /// Calls that failed (no answer, an error, a malformed answer).
    pub fn sync_failures(&self) -> u64 {
        self.sync_failures
    }

    /// Each limited level's index with its slot.
    fn limited_slots(&self) -> impl Iterator<Item = (usize, &LevelSlot)> + '_ {
        self.policy.levels.iter().zip(&self.slots).enumerate().filter(|(_, (l, _))| !l.exempt).map(|(i, (_, s))| (i, s))
    }
}
