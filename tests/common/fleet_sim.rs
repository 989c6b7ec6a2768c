//! A fleet of replicas over the in-memory etcd model, in model time: a network with random
//! delays and losses (requests and replies), host timeouts, replica crashes and restarts, etcd
//! outages and partitions; each replica runs a small closed-loop workload under the limits its
//! `Fleet` hands out (applied with a lag, as workers pick them up) and reports its seats in use.
//!
//! [`Sim::check`] asserts the invariant after every step, and every successful record write is
//! verified against the snapshot it compared (see [`Sim::verify_write`]).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use apf_wasm::etcd::{self, CompareTarget, KeyValue, RequestOp, TxnRequest, TxnResponse};
use apf_wasm::fleet::allocation::Allocation;
use apf_wasm::fleet::config::FleetConfig;
use apf_wasm::fleet::levels::FleetPolicy;
use apf_wasm::fleet::record::Record;
use apf_wasm::fleet::snapshot::{claims_of, granted_of, Snapshot};
use apf_wasm::fleet::{EtcdCall, Fleet, FleetMode};
use apf_wasm::limits::borrowing::SeatDemandStats;
use apf_wasm::policy::model::{LimitResponse, PriorityLevel, PriorityLevelSpec, Queuing};
use apf_wasm::simulate::memetcd::MemEtcd;
use apf_wasm::Nanos;
use std::collections::BTreeMap;

pub const S: Nanos = 1_000_000_000;
pub const MS: Nanos = 1_000_000;

/// A fleet configuration with defaults for everything but the etcd cluster.
pub fn config_with_cluster(cluster: &str) -> FleetConfig {
    FleetConfig::from_json(&serde_json::json!({ "etcd": { "cluster": cluster } })).unwrap()
}

#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

/// The test policy: an exempt level and three limited ones (60 seats, `nominalCLSum` 60).
pub fn test_policy() -> FleetPolicy {
    let limited = |name: &str, shares: i32, lendable: i32| PriorityLevel {
        name: name.into(),
        uid: String::new(),
        spec: PriorityLevelSpec::Limited {
            nominal_concurrency_shares: shares,
            lendable_percent: lendable,
            borrowing_limit_percent: None,
            limit_response: LimitResponse::Queue(Queuing { queues: 16, hand_size: 4, queue_length_limit: 50 }),
        },
    };
    let levels = vec![
        PriorityLevel {
            name: "exempt".into(),
            uid: String::new(),
            spec: PriorityLevelSpec::Exempt { nominal_concurrency_shares: 0, lendable_percent: 0 },
        },
        limited("high", 20, 25),
        limited("low", 30, 90),
        limited("catch-all", 10, 0),
    ];
    FleetPolicy::new(60, &levels)
}

/// One limited level of `limit` seats that neither lends nor borrows (its CurrentCL is the
/// limit), as in the Envoy tests.
pub fn one_level_policy(limit: u32) -> FleetPolicy {
    let level = PriorityLevel {
        name: "workload".into(),
        uid: String::new(),
        spec: PriorityLevelSpec::Limited {
            nominal_concurrency_shares: 10,
            lendable_percent: 0,
            borrowing_limit_percent: Some(0),
            limit_response: LimitResponse::Queue(Queuing { queues: 16, hand_size: 4, queue_length_limit: 50 }),
        },
    };
    FleetPolicy::new(limit, &[level])
}

#[derive(Clone)]
pub struct Net {
    pub delay_min: Nanos,
    pub delay_max: Nanos,
    /// Percent of requests lost on the way to etcd.
    pub loss_request: f64,
    /// Percent of replies lost on the way back.
    pub loss_reply: f64,
    /// The host's timeout: no answer by then, the call is reported failed (status 0).
    pub timeout: Nanos,
}

impl Net {
    pub fn perfect() -> Net {
        Net { delay_min: MS, delay_max: MS, loss_request: 0.0, loss_reply: 0.0, timeout: 500 * MS }
    }
    pub fn lossy() -> Net {
        Net { delay_min: MS, delay_max: 300 * MS, loss_request: 5.0, loss_reply: 5.0, timeout: 400 * MS }
    }
}

pub struct Replica {
    pub slot: usize,
    pub fleet: Fleet,
    pub alive: bool,
    /// Cut off from etcd (its calls are lost).
    pub partitioned: bool,
    /// Desired concurrency per level (closed-loop clients).
    pub demand: Vec<u32>,
    /// End times of executing requests (one seat each), per level.
    pub executing: Vec<Vec<Nanos>>,
    /// The limits the engine admits under, and their generation.
    pub applied: Vec<Option<u32>>,
    pub applied_generation: u64,
    apply_at: Option<Nanos>,
    outstanding: BTreeMap<u64, Nanos>,
    /// The claims last seen in etcd for this replica (the check of a replica whose record is gone).
    pub last_etcd_claims: Option<Vec<u32>>,
    /// The record was seen in etcd at some point.
    pub registered: bool,
    /// The record was seen gone while the replica was alive (its lease expired while it was
    /// cut off from etcd).
    pub lost_record: bool,
    last_demand_push: Nanos,
}

impl Replica {
    pub fn in_use(&self) -> Vec<u32> {
        self.executing.iter().map(|e| e.len() as u32).collect()
    }
}

enum Event {
    /// A request arrives at etcd.
    Arrive { slot: usize, id_str: String, call: EtcdCall },
    /// An answer arrives at a replica.
    Reply { slot: usize, id_str: String, call: u64, status: u16, body: Vec<u8> },
}

pub struct Sim {
    pub now: Nanos,
    pub rng: Rng,
    pub etcd: MemEtcd,
    pub etcd_up: bool,
    pub net: Net,
    pub config: FleetConfig,
    pub policy: FleetPolicy,
    pub replicas: Vec<Replica>,
    events: Vec<(Nanos, u64, Event)>,
    seq: u64,
    incarnations: usize,
    /// Per level, Σ claims in etcd never exceeds this: the fleet CurrentCL of the snapshot the
    /// last checked raise on that level was computed against.
    pub ceiling: Vec<u64>,
    pub stats: Stats,
    /// Σ overshoot seats at the last check.
    pub last_overshoot: u64,
    overshoot_in_step: bool,
    records_cache: Option<(i64, BTreeMap<String, Record>)>,
    /// Maximum extra steps of lag before a replica's engine applies new limits.
    pub apply_lag: Nanos,
    /// After etcd lost its data ([`Sim::wipe_etcd`]): until when, per level, Σ seats in use of
    /// every live replica (in the fleet's accounting or not) stays within the claims etcd held
    /// before the loss.
    pub wipe_bound: Option<(Nanos, Vec<u64>)>,
    pub service_min: Nanos,
    pub service_max: Nanos,
}

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub steps: u64,
    pub writes_ok: u64,
    pub raises_checked: u64,
    pub forced_registrations: u64,
    pub calls: u64,
    pub lost: u64,
    /// Steps with an overshoot: seats in use outside the fleet's accounting (a replica whose
    /// record expired while it was cut off from etcd).
    pub uncovered_steps: u64,
    pub max_overshoot: u64,
    /// Checks that saw a replica without a record in fallback.
    pub fallback_checks: u64,
    pub admitted: u64,
}

impl Sim {
    pub fn new(seed: u64, net: Net) -> Sim {
        let policy = test_policy();
        let mut config = config_with_cluster("etcd");
        config.name = "test".into();
        Sim {
            now: 1_000 * S,
            rng: Rng(seed),
            etcd: MemEtcd::new(),
            etcd_up: true,
            net,
            ceiling: vec![0; policy.levels.len()],
            config,
            policy,
            replicas: Vec::new(),
            events: Vec::new(),
            seq: 0,
            incarnations: 0,
            stats: Stats::default(),
            last_overshoot: 0,
            overshoot_in_step: false,
            records_cache: None,
            apply_lag: 100 * MS,
            wipe_bound: None,
            service_min: 50 * MS,
            service_max: 400 * MS,
        }
    }

    /// A simulation of the fleet `policy` (before any replica starts).
    pub fn with_policy(seed: u64, net: Net, policy: FleetPolicy) -> Sim {
        let mut sim = Sim::new(seed, net);
        sim.ceiling = vec![0; policy.levels.len()];
        sim.policy = policy;
        sim
    }

    /// Σ seats in use of every live replica per level.
    pub fn fleet_in_use(&self) -> Vec<u32> {
        (0..self.policy.levels.len()).map(|i| self.live().map(|r| r.in_use()[i]).sum()).collect()
    }

    /// Adds (or restarts in `slot`) a replica with a fresh id.
    pub fn start_replica(&mut self, slot: Option<usize>, demand: Vec<u32>) -> usize {
        self.incarnations += 1;
        let slot = slot.unwrap_or(self.replicas.len());
        let id = format!("gw-{slot}-{}", self.incarnations);
        let fleet = Fleet::new(self.config.clone(), self.policy.clone(), &id).unwrap();
        let n = self.policy.levels.len();
        let r = Replica {
            slot,
            applied: fleet.limits().to_vec(),
            applied_generation: fleet.generation(),
            fleet,
            alive: true,
            partitioned: false,
            demand,
            executing: vec![Vec::new(); n],
            apply_at: None,
            outstanding: BTreeMap::new(),
            last_etcd_claims: None,
            registered: false,
            lost_record: false,
            last_demand_push: 0,
        };
        if slot < self.replicas.len() {
            self.replicas[slot] = r;
        } else {
            self.replicas.push(r);
        }
        slot
    }

    pub fn crash(&mut self, slot: usize) {
        let r = &mut self.replicas[slot];
        r.alive = false;
        for e in &mut r.executing {
            e.clear();
        }
        r.outstanding.clear();
    }

    /// etcd loses every piece of data (revision back to 1, a new cluster id, keys and leases
    /// gone) while the replicas run. Until `window` from now, [`Sim::check`] asserts per level
    /// that Σ seats in use of every live replica stays within Σ claims in etcd before the loss
    /// (returned), instead of requiring replicas without a record not to be synced (those that
    /// have not noticed yet still are).
    pub fn wipe_etcd(&mut self, window: Nanos) -> Vec<u64> {
        let mut bound = vec![0u64; self.policy.levels.len()];
        for r in self.records().values() {
            for (b, c) in bound.iter_mut().zip(claims_of(r, &self.policy)) {
                *b += u64::from(c);
            }
        }
        self.etcd.wipe();
        self.records_cache = None;
        self.wipe_bound = Some((self.now + window, bound.clone()));
        bound
    }

    /// Writes `value` under the replicas prefix at `<prefix><suffix>` as someone else would
    /// (`lease` 0: none; else a lease granted now with `ttl_secs`).
    pub fn put_foreign(&mut self, suffix: &[u8], value: &[u8], ttl_secs: i64) {
        let lease = if ttl_secs > 0 {
            let (_, b) = self.etcd.handle(etcd::LEASE_GRANT, &[], &etcd::lease_grant_request(ttl_secs), self.now);
            etcd::LeaseResponse::decode_grant(200, &b).unwrap().id
        } else {
            0
        };
        let mut key = self.prefix();
        key.extend_from_slice(suffix);
        let put = etcd::PutRequest { key, value: value.to_vec(), lease };
        let txn = TxnRequest { success: vec![RequestOp::Put(put)], ..Default::default() };
        assert!(self.etcd.txn(&txn).unwrap().succeeded);
    }

    pub fn set_etcd_up(&mut self, up: bool) {
        if up && !self.etcd_up {
            self.etcd.restart(self.now);
        }
        self.etcd_up = up;
    }

    pub fn live(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().filter(|r| r.alive)
    }

    pub fn key(&self, id: &str) -> Vec<u8> {
        self.config.replica_key(id).into_bytes()
    }

    pub fn prefix(&self) -> Vec<u8> {
        self.config.replicas_prefix().into_bytes()
    }

    /// The replicas' records in etcd now (keys a replica ignores left out).
    pub fn records(&self) -> BTreeMap<String, Record> {
        let prefix = self.prefix();
        let s = self.snapshot_of(self.etcd.range(&prefix, &etcd::prefix_range_end(&prefix)), self.etcd.revision());
        s.replicas.into_iter().map(|e| (e.id, e.record.unwrap())).collect()
    }

    /// The allocation of etcd's current state.
    pub fn allocation_now(&self) -> Allocation {
        self.snapshot_of(self.etcd.range(&self.prefix(), &etcd::prefix_range_end(&self.prefix())), self.etcd.revision())
            .allocate(&self.policy)
    }

    fn snapshot_of(&self, kvs: Vec<KeyValue>, revision: i64) -> Snapshot {
        let r = etcd::RangeResponse { header: etcd::Header { revision, ..Default::default() }, count: kvs.len() as i64, kvs, more: false };
        Snapshot::from_range(&self.prefix(), &r).unwrap().checked(&self.policy, "")
    }

    fn push(&mut self, at: Nanos, e: Event) {
        self.seq += 1;
        self.events.push((at, self.seq, e));
    }

    fn delay(&mut self) -> Nanos {
        self.rng.range(self.net.delay_min, self.net.delay_max)
    }

    fn dispatch(&mut self, slot: usize, calls: Vec<EtcdCall>) {
        for call in calls {
            self.stats.calls += 1;
            let r = &mut self.replicas[slot];
            r.outstanding.insert(call.id, self.now + self.net.timeout);
            let id_str = r.fleet.replica_id().to_string();
            if r.partitioned || self.rng.chance(self.net.loss_request) {
                self.stats.lost += 1;
                continue;
            }
            let at = self.now + self.delay();
            self.push(at, Event::Arrive { slot, id_str, call });
        }
    }

    /// Advances model time by `dt`, delivering what is due, running every replica, and checking
    /// the invariant.
    pub fn step(&mut self, dt: Nanos) {
        let end = self.now + dt;
        loop {
            self.events.sort_by_key(|(at, seq, _)| (*at, *seq));
            let Some(pos) = self.events.iter().position(|(at, _, _)| *at <= end) else { break };
            let (at, _, e) = self.events.remove(pos);
            self.now = self.now.max(at);
            if self.etcd_up {
                self.etcd.advance(self.now);
            }
            self.deliver(e);
            self.check();
        }
        self.now = end;
        if self.etcd_up {
            self.etcd.advance(self.now);
        }
        // Between etcd events only a replica's own run changes its seats in use: one check
        // after all of them sees every state a check after each would.
        for slot in 0..self.replicas.len() {
            self.run_replica(slot);
        }
        self.check();
        self.stats.steps += 1;
        if self.overshoot_in_step {
            self.stats.uncovered_steps += 1;
            self.overshoot_in_step = false;
        }
    }

    fn deliver(&mut self, e: Event) {
        match e {
            Event::Arrive { slot, id_str, call } => {
                if !self.etcd_up {
                    self.stats.lost += 1;
                    return;
                }
                let verify = (call.path == etcd::KV_TXN).then(|| TxnRequest::from_body(&call.body).unwrap());
                let before: Option<KeyValue> = self.etcd.get(&self.key(&id_str)).cloned();
                let (status, body) = self.etcd.handle(call.path, &call.headers, &call.body, self.now);
                if let Some(txn) = verify {
                    if status == 200 {
                        let answer = TxnResponse::decode(status, &body).unwrap();
                        if answer.succeeded {
                            self.verify_write(slot, &id_str, &txn, before);
                        }
                    }
                }
                if self.rng.chance(self.net.loss_reply) {
                    self.stats.lost += 1;
                    return;
                }
                let at = self.now + self.delay();
                self.push(at, Event::Reply { slot, id_str, call: call.id, status, body });
            }
            Event::Reply { slot, id_str, call, status, body } => {
                let r = &mut self.replicas[slot];
                if !r.alive || r.fleet.replica_id() != id_str || r.partitioned {
                    return;
                }
                if r.outstanding.remove(&call).is_none() {
                    return; // answered after the host's timeout: dropped
                }
                let calls = r.fleet.on_response(call, status, &body, self.now);
                self.dispatch(slot, calls);
            }
        }
    }

    /// A successful write of `id`'s record: a write that compared the record's own revision
    /// never raises its claim or its granted seats; a write that compared the prefix at revision
    /// R raises the granted seats of a level only so far that the others' claims in the
    /// snapshot at R plus them fit the level's fleet CurrentCL computed from that state with the
    /// new record (and over all levels the Σ of CurrentCLs), and raises a claim above its granted
    /// seats only to cover seats in use admitted before the record was lost (at most the claims
    /// it held then).
    pub fn verify_write(&mut self, slot: usize, id: &str, txn: &TxnRequest, before: Option<KeyValue>) {
        let Some(RequestOp::Put(put)) = txn.success.first() else { panic!("write without a put") };
        let record = Record::decode(&put.value).unwrap();
        let (claims, granted) = (claims_of(&record, &self.policy), granted_of(&record, &self.policy));
        let n = claims.len();
        let old = before.as_ref().map(|kv| Record::decode(&kv.value).unwrap());
        let (old_claims, old_granted) =
            old.as_ref().map_or((vec![0; n], vec![0; n]), |r| (claims_of(r, &self.policy), granted_of(r, &self.policy)));
        self.stats.writes_ok += 1;
        for i in 0..n {
            assert!(granted[i] <= claims[i], "{id}: granted {} above claim {}", granted[i], claims[i]);
        }
        let compare = &txn.compare[0];
        match (&compare.target, compare.range_end.is_empty()) {
            (CompareTarget::Mod(m), true) => {
                assert!(old.is_some(), "{id}: own-revision write {m} applied without a record");
                for i in 0..n {
                    assert!(
                        claims[i] <= old_claims[i] && granted[i] <= old_granted[i],
                        "{id}: level {i} raised without checking the fleet"
                    );
                }
            }
            (CompareTarget::Mod(r1), false) => {
                let r = r1 - 1;
                let prefix = self.prefix();
                let at_r =
                    self.snapshot_of(self.etcd.range_at(&prefix, &etcd::prefix_range_end(&prefix), r), r).with_record(id, record.clone());
                let alloc = at_r.allocate(&self.policy);
                let others = at_r.others_claims(&self.policy, id);
                let legacy = self.replicas[slot].last_etcd_claims.clone().unwrap_or_else(|| vec![0; n]);
                let mut raised = false;
                for (i, l) in self.policy.levels.iter().enumerate() {
                    if l.exempt {
                        assert_eq!(claims[i], 0);
                        continue;
                    }
                    if granted[i] > old_granted[i] {
                        raised = true;
                        self.stats.raises_checked += 1;
                        let (sum, cl) = (others.per_level[i] + u64::from(granted[i]), u64::from(alloc.levels[i].current));
                        assert!(
                            sum <= cl,
                            "{id}: level {} granted {} → {} makes Σ {sum} > fleet CurrentCL {cl}",
                            l.name,
                            old_granted[i],
                            granted[i]
                        );
                        self.ceiling[i] = cl;
                    }
                    if claims[i] > old_claims[i].max(granted[i]) {
                        assert!(
                            claims[i] <= legacy[i],
                            "{id}: level {} claim {} → {} above its grant {} and its last claim {}",
                            l.name,
                            old_claims[i],
                            claims[i],
                            granted[i],
                            legacy[i]
                        );
                        self.stats.forced_registrations += 1;
                    }
                }
                if raised {
                    let total = others.total + granted.iter().map(|&c| u64::from(c)).sum::<u64>();
                    assert!(
                        total <= alloc.limited_total(),
                        "{id}: Σ others' claims + granted {total} > Σ CurrentCL {}",
                        alloc.limited_total()
                    );
                }
            }
            other => panic!("unexpected compare {other:?}"),
        }
        self.replicas[slot].last_etcd_claims = Some(claims);
        self.replicas[slot].registered = true;
    }

    fn run_replica(&mut self, slot: usize) {
        let now = self.now;
        let (lag, smin, smax) = (self.apply_lag, self.service_min, self.service_max);
        if !self.replicas[slot].alive {
            return;
        }
        // Host timeouts.
        let expired: Vec<u64> = self.replicas[slot].outstanding.iter().filter(|(_, d)| **d <= now).map(|(id, _)| *id).collect();
        for id in expired {
            self.replicas[slot].outstanding.remove(&id);
            let calls = self.replicas[slot].fleet.on_response(id, 0, b"", now);
            self.dispatch(slot, calls);
        }
        // Requests finish.
        let r = &mut self.replicas[slot];
        for e in &mut r.executing {
            e.retain(|&end| end > now);
        }
        // Workers pick up new limits after a lag.
        if r.fleet.generation() != r.applied_generation {
            let due = *r.apply_at.get_or_insert(now + (self.rng.next() % (lag as u64 + 1)) as Nanos);
            if due <= now {
                r.applied = r.fleet.limits().to_vec();
                r.applied_generation = r.fleet.generation();
                r.apply_at = None;
            }
        }
        // Admit under the applied limits.
        for (i, e) in r.executing.iter_mut().enumerate() {
            let limit = r.applied[i].unwrap_or(u32::MAX);
            while (e.len() as u32) < r.demand[i].min(limit) {
                e.push(now + self.rng.range(smin, smax));
                self.stats.admitted += 1;
            }
        }
        let in_use = r.in_use();
        r.fleet.set_seats_in_use(&in_use, r.applied_generation);
        if now - r.last_demand_push >= S {
            r.last_demand_push = now;
            let stats: Vec<SeatDemandStats> = r
                .demand
                .iter()
                .map(|&d| {
                    let d = f64::from(d);
                    SeatDemandStats { avg: d, std_dev: 0.0, high_watermark: d as i64, smoothed: d }
                })
                .collect();
            r.fleet.set_local_demand(&stats);
        }
        let calls = r.fleet.tick(now);
        self.dispatch(slot, calls);
    }

    /// The invariant, after every event. A replica's seats in use up to its granted seats are
    /// *covered* (in the fleet's accounting); above them — possible only for a replica whose
    /// record expired while it was cut off from etcd, for requests admitted under its fallback
    /// limits until they drain — they are the overshoot.
    /// - a live replica with a record uses at most its claim;
    /// - a live replica whose record is gone is not synced and uses at most the claims it last
    ///   held; one never registered uses nothing;
    /// - per level, Σ covered seats in use ≤ the fleet CurrentCL the last checked grant on that
    ///   level was computed against; over all levels ≤ `nominalCLSum` + ⌊levels / 2⌋ (the
    ///   largest Σ CurrentCL, `tests/fleet_allocation.rs`).
    pub fn check(&mut self) {
        let revision = self.etcd.revision();
        let records = match self.records_cache.take() {
            Some((r, records)) if r == revision => records,
            _ => self.records(),
        };
        let n = self.policy.levels.len();
        let mut covered = vec![0u64; n];
        let mut overshoot = vec![0u64; n];
        let wiped = self.wipe_bound.as_ref().is_some_and(|(until, _)| self.now < *until);
        if let Some((_, bound)) = self.wipe_bound.as_ref().filter(|_| wiped) {
            for (i, l) in self.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
                let all: u64 = self.replicas.iter().filter(|r| r.alive).map(|r| u64::from(r.in_use()[i])).sum();
                assert!(
                    all <= bound[i],
                    "t={}: etcd lost its data: level {} Σ seats in use {all} > {} claimed before",
                    self.now,
                    l.name,
                    bound[i]
                );
            }
        }
        for r in self.replicas.iter_mut().filter(|r| r.alive) {
            let id = r.fleet.replica_id().to_string();
            let used = r.in_use();
            match records.get(&id) {
                Some(rec) => {
                    let (claims, granted) = (claims_of(rec, &self.policy), granted_of(rec, &self.policy));
                    for (i, l) in self.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
                        assert!(used[i] <= claims[i], "t={} {id}: level {} uses {} > claim {}", self.now, l.name, used[i], claims[i]);
                        let excess = used[i].saturating_sub(granted[i]);
                        assert!(
                            excess == 0 || r.lost_record,
                            "t={} {id}: level {} uses {} > granted {}",
                            self.now,
                            l.name,
                            used[i],
                            granted[i]
                        );
                        covered[i] += u64::from(used[i] - excess);
                        overshoot[i] += u64::from(excess);
                    }
                    r.last_etcd_claims = Some(claims);
                    r.registered = true;
                }
                None => {
                    if r.fleet.mode() == FleetMode::Fallback {
                        self.stats.fallback_checks += 1;
                    }
                    let last = r.last_etcd_claims.clone().unwrap_or_else(|| vec![0; n]);
                    if r.registered {
                        r.lost_record = true;
                        if !wiped {
                            assert_ne!(r.fleet.mode(), FleetMode::Synced, "t={} {id}: synced without a record", self.now);
                        }
                    }
                    for (i, l) in self.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
                        assert!(used[i] <= last[i], "t={} {id}: level {} uses {} > its last claim {}", self.now, l.name, used[i], last[i]);
                        overshoot[i] += u64::from(used[i]);
                    }
                }
            }
        }
        let total_overshoot: u64 = overshoot.iter().sum();
        if total_overshoot > 0 {
            self.overshoot_in_step = true;
            self.stats.max_overshoot = self.stats.max_overshoot.max(total_overshoot);
        }
        self.last_overshoot = total_overshoot;
        for (i, l) in self.policy.levels.iter().enumerate().filter(|(_, l)| !l.exempt) {
            assert!(
                covered[i] <= self.ceiling[i],
                "t={}: level {} Σ covered seats in use {} > ceiling {}",
                self.now,
                l.name,
                covered[i],
                self.ceiling[i]
            );
        }
        let max_total = u64::from(self.policy.nominal_sum()) + self.policy.limited_levels() as u64 / 2;
        let total: u64 = covered.iter().sum();
        assert!(total <= max_total, "t={}: Σ covered seats in use {total} > {max_total}: per level {covered:?}", self.now);
        self.records_cache = Some((revision, records));
    }

    /// Runs `secs` seconds of model time in steps of `dt`.
    pub fn run(&mut self, secs: f64, dt: Nanos) {
        let steps = (secs * S as f64 / dt as f64).round() as u64;
        for _ in 0..steps {
            self.step(dt);
        }
    }

    /// Every live replica synced, its limits equal to its seats in the allocation of etcd's
    /// current state, and its claims equal to them too.
    pub fn converged(&self) -> Result<(), String> {
        let alloc = self.allocation_now();
        let records = self.records();
        for r in self.live() {
            let id = r.fleet.replica_id();
            if r.fleet.mode() != FleetMode::Synced {
                return Err(format!("{id} is {:?}", r.fleet.mode()));
            }
            let seats = alloc.seats_of(id).ok_or_else(|| format!("{id} not in the allocation"))?;
            let want: Vec<Option<u32>> = self.policy.levels.iter().zip(&seats).map(|(l, &s)| (!l.exempt).then_some(s)).collect();
            if r.fleet.limits() != want.as_slice() {
                return Err(format!("{id}: limits {:?}, allocation {want:?}", r.fleet.limits()));
            }
            let claims = claims_of(&records[id], &self.policy);
            let limited: Vec<u32> = want.iter().map(|x| x.unwrap_or(0)).collect();
            if claims != limited {
                return Err(format!("{id}: claims {claims:?}, allocation {limited:?}"));
            }
        }
        Ok(())
    }
}
