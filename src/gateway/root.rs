//! The gateway's root: one applied configuration and the timer (expiry, borrowing, leases, the
//! polls, stats), the mailbox handler, and the dispatch of HTTP call replies to the fleet, the
//! object-count poll ([`super::counts_poll`]) or the cluster policy read
//! ([`super::cluster_policy`]).

use super::cluster_policy::{ClusterFetch, Fetched};
use super::counts_poll::CountsPoll;
use super::host::Host;
use super::policy_source::{PolicyRole, Published, SharedPolicy};
use super::request::Request;
use super::stats::M;
use super::worker::{self, Timer, Worker, REAP_EVERY};
use crate::config::{parse_plugin_config, PluginConfig};
use crate::engine::{self, Compiled};
use crate::Nanos;
use std::rc::Rc;
use std::sync::Arc;

pub const TICK_MS: u32 = 50;
const METRICS_EVERY: Nanos = 1_000_000_000;
const GENERATION_KEY: &str = "apf/v3/generation";

/// The gateway's state of one root context (one plugin configuration).
#[derive(Default)]
pub struct Root {
    compiled: Option<Rc<Compiled>>,
    /// The read of the policy from the cluster (`clusterPolicy`).
    fetch: ClusterFetch,
    /// The poll of the cluster's `/metrics` this root has under way.
    counts: CountsPoll,
    /// The policy shared with the configuration's other roots of the process (`None`: this
    /// root reads the cluster for itself alone).
    shared: Option<PolicyRole>,
}

fn next_generation(h: &dyn Host) -> u64 {
    engine::store::update::<u64, engine::EngineError>(h.store(), GENERATION_KEY, engine::MAX_CAS_TRIES, |cur| {
        let n = cur.and_then(|b| b.get(..8)?.try_into().ok()).map_or(0, u64::from_le_bytes).wrapping_add(1);
        Ok((n.to_le_bytes().to_vec(), n))
    })
    .unwrap_or(1)
}

/// Pushes the metrics, and the limits of every level.
fn flush_metrics(h: &dyn Host, w: &mut Worker, c: &Compiled, now: Nanos) {
    if let Some(cm) = c.config.cluster_metrics.as_ref() {
        let (stale, age) = match w.counts() {
            Some(s) => (
                s.tracker.stale(now, cm.stale_after) as u64,
                (s.last_success > 0).then(|| u64::try_from(now.saturating_sub(s.last_success) / crate::NANOS_PER_SEC).unwrap_or(0)),
            ),
            None => (0, None),
        };
        w.stats().set_own_gauges(h, stale, age);
    }
    w.export_open_watches(h, c);
    let stats = w.stats();
    stats.flush(h);
    for (i, l) in c.levels.iter().enumerate() {
        stats.set(h, c, M::NominalLimit, i, u64::from(l.nominal));
        stats.set(h, c, M::LowerLimit, i, u64::from(l.min_limit));
        stats.set(h, c, M::UpperLimit, i, u64::from(l.max_limit));
        if let Ok(Some(st)) = engine::read_level(h.store(), &l.key) {
            stats.set(h, c, M::CurrentLimit, i, u64::from(st.qs.config().concurrency_limit));
        }
    }
}

impl Root {
    /// A root sharing the cluster's policy with the configuration's other roots of the process
    /// through `source`: the `reader` reads the cluster and publishes; the others adopt
    /// ([`Root::adopt_published`]) and never read the cluster's policy themselves.
    pub fn sharing(source: Arc<SharedPolicy>, reader: bool) -> Root {
        let shared = if reader { PolicyRole::Reader(source) } else { PolicyRole::Follower { source, adopted: 0 } };
        Root { shared: Some(shared), ..Root::default() }
    }

    fn apply(&mut self, h: &dyn Host, cfg: PluginConfig, what: &str) {
        for w in &cfg.policy.warnings {
            log::warn!("apf: {w}");
        }
        let generation = self.install(h, cfg);
        let (levels, schemas, seats) = self
            .compiled
            .as_deref()
            .map_or((0, 0, 0), |c| (c.levels.len(), c.config.policy.flow_schemas.len(), c.config.server_concurrency_limit));
        log::info!("apf: {what} generation {generation} applied: {levels} priority levels, {schemas} flow schemas, {seats} seats");
    }

    /// Compiles `cfg` under a new generation and serves it: its generation.
    fn install(&mut self, h: &dyn Host, cfg: PluginConfig) -> u64 {
        let generation = next_generation(h);
        self.compiled = Some(Rc::new(Compiled::new(cfg, generation)));
        generation
    }

    /// Whether this root reads the cluster's policy (a follower adopts its reader's instead).
    fn reads_policy(&self) -> bool {
        !matches!(self.shared, Some(PolicyRole::Follower { .. }))
    }

    /// A follower adopts the newest policy its reader published, if it runs an older one (one
    /// atomic load when it is current). The reader logged the policy and its warnings: the
    /// adoption is logged at debug level.
    pub fn adopt_published(&mut self, h: &dyn Host) {
        let Some(PolicyRole::Follower { source, adopted }) = &self.shared else { return };
        if source.published() == *adopted {
            return;
        }
        let Some((n, p)) = source.newest() else { return };
        if let Some(PolicyRole::Follower { adopted, .. }) = self.shared.as_mut() {
            *adopted = n;
        }
        let generation = self.install(h, p.config.clone());
        log::debug!("apf: {} adopted as generation {generation}", p.what);
    }

    /// The reply of an HTTP call this root started.
    pub fn on_http_call_response(&mut self, h: &dyn Host, w: &mut Worker, token: u32, body_size: usize) {
        let c = self.compiled.clone();
        if w.fleet_call_response(h, c.as_deref(), token, body_size) {
            return;
        }
        if self.counts.on_response(h, w, c.as_deref().map(|c| &c.config), token, body_size) {
            return;
        }
        let Some(cp) = c.as_deref().and_then(|c| c.config.cluster_policy.as_ref()) else { return };
        if let Some(Fetched { config, what }) = self.fetch.on_response(h, cp, token, body_size) {
            if let Some(PolicyRole::Reader(source)) = &self.shared {
                source.publish(Published { config: config.clone(), what: what.clone() });
            }
            self.apply(h, config, &what);
        }
    }

    /// A new configuration (`bytes`): applied, or refused with every error logged (the previous
    /// one keeps serving).
    pub fn on_configure(&mut self, h: &dyn Host, bytes: &[u8]) -> bool {
        match parse_plugin_config(bytes) {
            Ok(cfg) => {
                // The document the cluster's policy is merged into, when there is one to read.
                let base = cfg.cluster_policy.is_some().then(|| serde_json::from_slice(bytes).ok()).flatten();
                self.fetch = ClusterFetch::new(base);
                self.apply(h, cfg, "configuration");
                h.set_tick_period_ms(TICK_MS);
                true
            }
            Err(errors) => {
                log::error!("apf: invalid configuration ({} errors); keeping the previous one: {}", errors.len(), errors.join("; "));
                false
            }
        }
    }

    /// The timer.
    pub fn on_tick(&mut self, h: &dyn Host, w: &mut Worker) {
        let Some(c) = self.compiled.clone() else { return };
        let now = h.monotonic_nanos();
        if let Some(cp) = c.config.cluster_policy.as_ref().filter(|_| self.reads_policy()) {
            self.fetch.maybe_start(h, cp, now);
        }
        if !w.due(now, Nanos::from(TICK_MS) * 800_000, Timer::Tick) {
            return;
        }
        w.ensure_registered(h, now);
        w.drain_mailbox(h, now, 10_000);
        let keys = w.level_keys(&c);
        let mut notices = Vec::new();
        for k in &keys {
            if let Err(e) = engine::expire_level(h.store(), now, k, &mut notices) {
                log::warn!("apf: expiry on {k} failed: {e}");
            }
        }
        w.route(h, std::mem::take(&mut notices), now);
        w.enforce_local_deadlines(h, now);
        w.check_watch_holds(h, now);
        self.counts.maybe_start(h, w, &c.config, now);
        w.fleet_tick(h, &c, now);
        match engine::adjust_borrowing(&c, h.store(), now, &mut notices) {
            Ok(true) => log::debug!("apf: borrowing adjusted"),
            Ok(false) => {}
            Err(e) => log::warn!("apf: borrowing adjustment failed: {e}"),
        }
        w.route(h, notices, now);
        if w.due(now, METRICS_EVERY, Timer::Flush) {
            flush_metrics(h, w, &c, now);
        }
        if w.due(now, REAP_EVERY, Timer::Reap) {
            reap(h, w, &keys, now);
        }
    }

    /// A message arrived in this worker's mailbox.
    pub fn on_queue_ready(&mut self, h: &dyn Host, w: &mut Worker) {
        w.drain_mailbox(h, h.monotonic_nanos(), 1);
    }

    /// A stream starts on a worker whose timer may not have run for a while (the native host
    /// ticks a worker only while one of its streams waits or holds seats): the newest published
    /// policy is adopted and the object counts re-read when due, before the request is
    /// classified and its work estimated.
    pub fn on_stream_start(&mut self, h: &dyn Host, w: &mut Worker) {
        self.adopt_published(h);
        // The clock is read only when the counts are used.
        if let Some(c) = self.compiled.as_deref().filter(|c| super::counts_poll::uses_counts(&c.config)) {
            super::counts_poll::refresh_if_due(h, w, &c.config, h.monotonic_nanos());
        }
    }

    /// The state of a new stream `context`, under the current configuration.
    pub fn new_request(&self, context: u32) -> Request {
        Request::new(context, self.compiled.clone())
    }
}

/// Reclaims the seats of workers whose lease expired (on the levels `keys`).
fn reap(h: &dyn Host, w: &mut Worker, keys: &[String], now: Nanos) {
    let mut notices = Vec::new();
    match engine::reap_dead_workers(h.store(), now, worker::LEASE_TTL, keys, &mut notices) {
        Ok(dead) => dead.iter().for_each(|d| log::warn!("apf: reaped worker slot {} (lease expired); its seats were released", d.slot)),
        Err(e) => log::warn!("apf: reaping failed: {e}"),
    }
    w.route(h, notices, now);
}
