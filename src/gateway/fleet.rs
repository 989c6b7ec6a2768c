//! Fleet mode in the gateway: one worker per Envoy process drives the fleet's state machine
//! ([`crate::fleet::Fleet`]) — it claims the role in shared data, as the object-count poll is
//! claimed — and the others only serve: the levels' limits it sets live in the shared level
//! states every worker admits under. Nothing on the request path waits on etcd.
//!
//! Every 200 ms the driver samples each level's seat demand (seats in use and waiting) into a
//! per-period integrator; every `period` it hands the fleet the period's demand statistics and
//! the seats in use, sends the etcd calls the fleet asks for through the host, passes their
//! replies back, and applies the fleet's limits to the levels whenever they change. The feeding
//! and applying are [`crate::fleet::FleetFeed`]'s (the simulator runs the same); this module
//! adds the driver role, the replica id and the HTTP calls.
//!
//! A reload with the same `fleet` object re-plans the running fleet's levels in place (same
//! lease and record); `POST /apf-wasm/fleet/leave` on a loopback connection makes the replica
//! leave the fleet gracefully ([`leave_request`]; `docs/fleet.md`, "In the gateway").

use super::host::{call_status, call_timeout, Body, Host};
use super::stats::{Own, Stats};
use crate::engine::{self, Compiled, Notice};
use crate::fleet::{EtcdCall, Fleet, FleetConfig, FleetFeed, FleetPolicy};
use crate::Nanos;
use hashbrown::HashMap;
use serde_json::{json, Value};
use std::time::Duration;

/// Shared-data key of the driver role: (instance, heartbeat).
const DRIVER_KEY: &str = "apf/v3/fleet/driver";
/// Shared-data key of this process's replica id (made once, kept for the process's life).
const REPLICA_KEY: &str = "apf/v3/fleet/replica";
/// Shared-data key of the fleet's state as the driver last saw it (JSON, for `dump_fleet`).
pub const STATUS_KEY: &str = "apf/v3/fleet/status";
/// Shared-data key of the request to leave the fleet gracefully (when it was made).
const LEAVING_KEY: &str = "apf/v3/fleet/leaving";
/// The path of the request that makes this process's replica leave the fleet gracefully.
pub const LEAVE_PATH: &str = "/apf-wasm/fleet/leave";
/// The driver renews its role this often; another worker takes it over after `TAKEOVER`.
const DRIVER_BEAT: Nanos = 500_000_000;
const TAKEOVER: Nanos = 3 * crate::NANOS_PER_SEC;

/// Fleet mode on one worker: the driver role and, on the worker that holds it, the driver (kept
/// in the worker: it outlives configuration reloads).
#[derive(Default)]
pub struct FleetRole {
    driver: Option<FleetDriver>,
    /// When this worker (not driving) last looked whether the role is free.
    checked: Nanos,
    /// The newest configuration generation whose timer ran fleet mode here (an older root
    /// context, still alive during a reload, leaves the fleet alone).
    generation: u64,
}

/// The driver's state.
pub struct FleetDriver {
    /// The fleet, fed from this process's levels.
    feed: FleetFeed,
    /// HTTP call tokens → the fleet's call ids.
    calls: HashMap<u32, u64>,
    last_beat: Nanos,
    /// Failed calls, ignored records and data losses already counted in the stats.
    counted: [u64; 3],
}

/// The driver role's holder and heartbeat in shared data.
fn driver(cur: Option<&[u8]>) -> (u64, Nanos) {
    let field = |r: std::ops::Range<usize>| cur.and_then(|b| b.get(r)?.try_into().ok());
    (field(0..8).map_or(0, u64::from_le_bytes), field(8..16).map_or(0, i64::from_le_bytes))
}

/// Whether this worker holds (or now takes) the driver role: it is free, ours, or its holder
/// stopped renewing it (a worker VM that died). Only a claim writes.
fn claim_driver(h: &dyn Host, instance: u64, now: Nanos) -> bool {
    let free = |(holder, beat): (u64, Nanos)| holder == instance || holder == 0 || now.saturating_sub(beat) >= TAKEOVER;
    match h.store().get(DRIVER_KEY) {
        Ok((cur, _)) if !free(driver(cur.as_deref())) => return false,
        Ok(_) => {}
        Err(e) => {
            log::warn!("apf: fleet: reading the driver role failed: {e}");
            return false;
        }
    }
    let r = engine::store::update::<bool, engine::EngineError>(h.store(), DRIVER_KEY, engine::MAX_CAS_TRIES, |cur| {
        let mine = free(driver(cur));
        let mut v = instance.to_le_bytes().to_vec();
        v.extend_from_slice(&now.to_le_bytes());
        Ok(if mine { (v, true) } else { (cur.map(<[u8]>::to_vec).unwrap_or_default(), false) })
    });
    r.unwrap_or_else(|e| {
        log::warn!("apf: fleet: claiming the driver role failed: {e}");
        false
    })
}

/// This process's replica id: `r-<16 hex digits>`, made by the first worker that asks.
fn replica_id(h: &dyn Host, instance: u64) -> Option<String> {
    let r = engine::store::update::<String, engine::EngineError>(h.store(), REPLICA_KEY, engine::MAX_CAS_TRIES, |cur| {
        match cur.and_then(|b| std::str::from_utf8(b).ok()).filter(|s| !s.is_empty()) {
            Some(id) => Ok((id.as_bytes().to_vec(), id.to_string())),
            None => {
                let id = format!("r-{instance:016x}");
                Ok((id.as_bytes().to_vec(), id))
            }
        }
    });
    r.map_err(|e| log::warn!("apf: fleet: the replica id: {e}")).ok()
}

impl FleetDriver {
    fn new(h: &dyn Host, instance: u64, c: &Compiled, cfg: &FleetConfig, now: Nanos) -> Option<FleetDriver> {
        let id = replica_id(h, instance)?;
        let fleet = Fleet::new(cfg.clone(), FleetPolicy::from_config(&c.config), &id).map_err(|e| log::error!("apf: fleet: {e}")).ok()?;
        log::info!("apf: fleet: replica {id} drives this process's fleet membership");
        Some(FleetDriver { feed: FleetFeed::new(fleet, c, now), calls: HashMap::new(), last_beat: now, counted: [0; 3] })
    }

    /// Sends the fleet's calls to etcd through the host.
    fn send(&mut self, h: &dyn Host, calls: Vec<EtcdCall>) {
        let cfg = self.feed.fleet().config();
        let (cluster, authority, timeout) = (cfg.etcd.cluster.clone(), cfg.etcd.authority.clone(), cfg.period);
        let timeout = call_timeout(timeout, Duration::from_secs(1));
        for call in calls {
            let mut headers: Vec<(&str, &str)> = vec![(":method", "POST"), (":path", call.path), (":authority", &authority)];
            headers.extend(call.headers.iter().map(|(k, v)| (*k, v.as_str())));
            match h.http_call(&cluster, &headers, &call.body, timeout) {
                Ok(token) => {
                    self.calls.insert(token, call.id);
                }
                Err(e) => {
                    log::warn!("apf: fleet: cannot call etcd through cluster {cluster:?}: {e}");
                    let more = self.feed.on_response(call.id, 0, &[], h.monotonic_nanos());
                    // A failed send is answered at once; its follow-ups wait for the next tick.
                    drop(more);
                }
            }
        }
    }

    /// The fleet, fed from this process's levels.
    pub fn feed(&self) -> &FleetFeed {
        &self.feed
    }

    /// Applies the fleet's limits to the levels when they changed (or the configuration did),
    /// and once a period in any case (a worker with a newer configuration may have created or
    /// reconfigured a level meanwhile); the notices of the requests that changes.
    fn apply(&mut self, h: &dyn Host, c: &Compiled, now: Nanos, force: bool) -> Vec<Notice> {
        let mut notices = Vec::new();
        if let Err(e) = self.feed.apply(c, h.store(), now, force, &mut notices) {
            log::warn!("apf: fleet: applying the allocation failed: {e}");
        }
        notices
    }

    /// One tick of the driver: a requested leave, the fleet's calls, its limits applied, and at
    /// the end of a period its state published.
    fn tick(&mut self, h: &dyn Host, stats: &mut Stats, c: &Compiled, now: Nanos) -> Vec<Notice> {
        if leave_requested(h) {
            let calls = self.feed.leave_gracefully(now);
            self.send(h, calls);
        }
        let tick = self.feed.tick(c, h.store(), now);
        self.send(h, tick.calls);
        let notices = self.apply(h, c, now, tick.period_ended);
        if tick.period_ended {
            self.publish(h, stats, c, now);
        }
        notices
    }

    /// Leaves the fleet at once (its lease revoked): the fleet configuration changed or is gone.
    fn quit(&mut self, h: &dyn Host, now: Nanos) {
        let calls = self.feed.leave(now);
        self.send(h, calls);
    }

    /// Once a period: the fleet's state in shared data (any worker serves it as `dump_fleet`),
    /// and the fleet's stats.
    fn publish(&mut self, h: &dyn Host, stats: &mut Stats, c: &Compiled, now: Nanos) {
        let f = self.feed.fleet();
        let names: Vec<&str> = c.levels.iter().map(|l| l.name.as_str()).collect();
        if let Err(e) = h.store().set(STATUS_KEY, status_json(f, &names, now).to_string().as_bytes(), None) {
            log::warn!("apf: fleet: storing its state failed: {e}");
        }
        let counted = [f.sync_failures(), f.ignored_total(), f.data_losses()];
        let own = [Own::FleetSyncFailures, Own::FleetIgnoredRecords, Own::FleetDataLosses];
        for ((m, now_total), before) in own.into_iter().zip(counted).zip(&mut self.counted) {
            stats.add_own(m, now_total.saturating_sub(*before));
            *before = now_total;
        }
        let age = f.last_sync().map(|t| u64::try_from(now.saturating_sub(t) / crate::NANOS_PER_SEC).unwrap_or(0));
        let n = f.snapshot().map_or(0, |s| s.replicas.len() as u64);
        stats.set_fleet_gauges(h, n, age);
        stats.set_fleet_allocation(h, c, f.limits());
    }
}

/// The fleet's state as `dump_fleet` shows it (`names`: the levels, in the fleet's order).
fn status_json(f: &Fleet, names: &[&str], now: Nanos) -> Value {
    let limits: serde_json::Map<String, Value> =
        names.iter().zip(f.limits()).filter_map(|(n, l)| Some(((*n).to_string(), Value::from((*l)?)))).collect();
    let ignored: Vec<Value> =
        f.ignored_records().iter().map(|r| json!({"id": r.id, "modRevision": r.mod_revision.to_string(), "reason": r.reason})).collect();
    json!({
        "replica": f.replica_id(),
        "mode": format!("{:?}", f.mode()),
        "lastSync": f.last_sync(),
        "syncFailures": f.sync_failures(),
        "revision": f.snapshot().map(|s| s.revision.to_string()),
        "limits": limits,
        "replicas": replicas_json(f, names),
        "ignoredRecords": ignored,
        "ignoredRecordsTotal": f.ignored_total(),
        "dataLosses": f.data_losses(),
        "recoveringForSeconds": f.recovering_until().filter(|&t| t > now).map(|t| (t - now) as f64 / 1e9),
    })
}

/// Every replica of the fleet's last snapshot: its lease and record, and per level its claim,
/// grant, use, demand and the seats the allocation gives it.
fn replicas_json(f: &Fleet, names: &[&str]) -> Vec<Value> {
    let allocation = f.allocation();
    let Some(snapshot) = f.snapshot() else { return Vec::new() };
    let replicas = snapshot.replicas.iter().map(|r| {
        let seats = allocation.and_then(|a| a.seats_of(&r.id)).unwrap_or_default();
        let levels: serde_json::Map<String, Value> = match &r.record {
            Ok(rec) => rec
                .levels
                .iter()
                .map(|(name, l)| {
                    let allocated = names.iter().position(|n| n == name).and_then(|i| seats.get(i).copied());
                    let v = json!({"allocated": allocated, "claim": l.claim, "granted": l.granted, "inUse": l.in_use,
                        "demandAvg": l.demand.avg, "demandStdDev": l.demand.std_dev, "demandHighWatermark": l.demand.high_watermark,
                        "wide": l.wide, "wideSince": l.wide_since.to_string()});
                    (name.clone(), v)
                })
                .collect(),
            Err(_) => serde_json::Map::new(),
        };
        json!({"id": r.id, "lease": r.lease.to_string(), "modRevision": r.mod_revision.to_string(),
            "record": if r.record.is_ok() { "ok" } else { "undecodable" }, "levels": levels})
    });
    replicas.collect()
}

/// `dump_fleet`: the fleet's state as its driver last published it (JSON, a top-level
/// `replicas` array; `lastSyncAgeSeconds` instead of the driver's clock).
pub fn render_dump(store: &dyn crate::engine::store::Store, now: Nanos) -> String {
    let status = store.get(STATUS_KEY).ok().and_then(|(v, _)| v).and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let Some(mut status) = status else {
        return "{\"replicas\": [], \"error\": \"no fleet state: fleet mode is off, or no worker has synced with etcd yet\"}\n".to_string();
    };
    if let Some(obj) = status.as_object_mut() {
        let age = obj.remove("lastSync").and_then(|v| v.as_i64()).map(|t| now.saturating_sub(t) as f64 / 1e9);
        obj.insert("lastSyncAgeSeconds".to_string(), serde_json::json!(age));
    }
    let mut out = serde_json::to_string_pretty(&status).unwrap_or_default();
    out.push('\n');
    out
}

impl FleetRole {
    /// The fleet's driver, on the worker that holds the role.
    pub fn driver(&self) -> Option<&FleetDriver> {
        self.driver.as_ref()
    }

    /// The timer's part of fleet mode (every tick, every worker); the notices of the requests
    /// the fleet's limits changed.
    ///
    /// Configuration generations come from one counter and only grow; during a reload two root
    /// contexts tick on a worker, and only the newest one seen drives. A newer configuration
    /// with the same `fleet` object re-plans the running fleet's levels in place (same lease,
    /// same record, no seat dropped on the levels it keeps); a different `fleet` object (or
    /// none) makes the running membership leave (its lease revoked) before a new one registers.
    pub fn on_tick(&mut self, h: &dyn Host, stats: &mut Stats, instance: u64, c: &Compiled, now: Nanos) -> Vec<Notice> {
        if c.generation < self.generation {
            return Vec::new();
        }
        self.generation = c.generation;
        let Some(cfg) = c.config.fleet.as_ref() else {
            if let Some(mut d) = self.driver.take() {
                d.quit(h, now);
            }
            return Vec::new();
        };
        if !self.holds_role(h, instance, now) {
            return Vec::new();
        }
        match self.driver_for(h, instance, c, cfg, now) {
            Some(d) => d.tick(h, stats, c, now),
            None => Vec::new(),
        }
    }

    /// Whether this worker holds the driver role: the driver renews it, the others look whether
    /// it is free, every `DRIVER_BEAT`.
    fn holds_role(&mut self, h: &dyn Host, instance: u64, now: Nanos) -> bool {
        let last = self.driver.as_ref().map_or(self.checked, |d| d.last_beat);
        if now.saturating_sub(last) < DRIVER_BEAT {
            return self.driver.is_some();
        }
        self.checked = now;
        if !claim_driver(h, instance, now) {
            self.driver = None;
            return false;
        }
        if let Some(d) = self.driver.as_mut() {
            d.last_beat = now;
        }
        true
    }

    /// The driver of the configuration `c`: the running one (re-planned for a newer
    /// configuration), or a new one — after the running one left, when the `fleet` object
    /// changed.
    fn driver_for(&mut self, h: &dyn Host, instance: u64, c: &Compiled, cfg: &FleetConfig, now: Nanos) -> Option<&mut FleetDriver> {
        if let Some(d) = self.driver.as_mut() {
            if d.feed.fleet().config() != cfg {
                log::info!("apf: fleet: the fleet configuration changed: leaving, then joining again");
                d.quit(h, now);
                self.driver = None;
            } else if d.feed.generation() < c.generation {
                d.feed.reconfigure(c, now);
            }
        }
        if self.driver.is_none() {
            self.driver = FleetDriver::new(h, instance, c, cfg, now);
        }
        self.driver.as_mut()
    }

    /// An HTTP call's reply at `now`: `None` if it was not the fleet's, else the notices of the
    /// requests the fleet's limits changed (applied only under the configuration the feed runs:
    /// an older root's levels differ).
    pub fn on_call_response(
        &mut self,
        h: &dyn Host,
        c: Option<&Compiled>,
        token: u32,
        body_size: usize,
        now: Nanos,
    ) -> Option<Vec<Notice>> {
        let d = self.driver.as_mut()?;
        let id = d.calls.remove(&token)?;
        // 0: no response (a timeout or a connection failure), as the fleet expects.
        let status = call_status(h).unwrap_or(0);
        let body = h.body_bytes(Body::CallResponse, 0, body_size).unwrap_or_default();
        let calls = d.feed.on_response(id, status, &body, now);
        d.send(h, calls);
        Some(match c.filter(|c| c.generation == d.feed.generation()) {
            Some(c) => d.apply(h, c, now, false),
            None => Vec::new(),
        })
    }
}

/// Whether this process was asked to leave the fleet.
fn leave_requested(h: &dyn Host) -> bool {
    h.store().get(LEAVING_KEY).is_ok_and(|(v, _)| v.is_some_and(|b| !b.is_empty()))
}

/// `POST /apf-wasm/fleet/leave` (fleet mode on) on a connection whose two ends (`source` and
/// `destination` addresses) are loopback: this process's replica leaves the fleet gracefully
/// (the driver, whichever worker holds the role, acts on its next tick). Anything else is
/// refused: the destination cannot be spoofed by a remote client, the source can be with
/// `X-Forwarded-For` when the listener does not set `use_remote_address`. Idempotent. The
/// status and JSON body.
pub fn leave_request(h: &dyn Host, ends: [Option<std::net::IpAddr>; 2], now: Nanos) -> (u32, String) {
    if !ends.iter().all(|a| a.is_some_and(|a| a.to_canonical().is_loopback())) {
        log::warn!("apf: fleet: a leave request on a connection {ends:?} refused (loopback only)");
        return (403, "{\"error\": \"the fleet leave request is accepted from loopback only\"}\n".to_string());
    }
    let r = engine::store::update::<bool, engine::EngineError>(h.store(), LEAVING_KEY, engine::MAX_CAS_TRIES, |cur| match cur {
        Some(b) if !b.is_empty() => Ok((b.to_vec(), false)),
        _ => Ok((now.to_le_bytes().to_vec(), true)),
    });
    let first = match r {
        Ok(first) => first,
        Err(e) => {
            log::warn!("apf: fleet: recording the leave request failed: {e}");
            return (503, "{\"error\": \"the leave request could not be recorded; try again\"}\n".to_string());
        }
    };
    if first {
        log::info!("apf: fleet: asked to leave the fleet gracefully");
    }
    let replica = h.store().get(REPLICA_KEY).ok().and_then(|(v, _)| v).and_then(|b| String::from_utf8(b).ok());
    let body = serde_json::json!({"replica": replica, "leaving": true, "alreadyLeaving": !first});
    (200, format!("{body}\n"))
}
