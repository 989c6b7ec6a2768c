//! Root context: one compiled configuration, the timer and the mailbox handler.

use super::host;
use super::http::Http;
use super::metrics::{self, M};
use super::worker::{self, Worker, REAP_EVERY};
use crate::digest::object_counts::ScrapedCounts;
use crate::engine::object_counts::{SharedCounts, OBJECT_COUNTS_KEY};
use crate::engine::store::Store;
use crate::engine::{self, Compiled};
use crate::policy::config::{parse_plugin_config, PluginConfig};
use crate::Nanos;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, MapType, Status};
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::rc::Rc;
use std::time::Duration;

pub const TICK_MS: u32 = 50;
const METRICS_EVERY: Nanos = 1_000_000_000;
const GENERATION_KEY: &str = "apf/v3/generation";
/// How often a worker re-reads the shared object counts.
const COUNTS_READ_EVERY: Nanos = 250_000_000;
/// The `/metrics` response is read from the host in pieces of this size.
const METRICS_READ_CHUNK: usize = 1 << 20;

#[derive(Default)]
pub struct Root {
    compiled: Option<Rc<Compiled>>,
    /// The configuration document, kept when the policy comes from the cluster.
    base: Option<serde_json::Value>,
    fetch: ClusterFetch,
    /// The poll of the cluster's `/metrics` this root has under way.
    counts_call: Option<u32>,
}

/// State of the periodic policy read from the cluster (`clusterPolicy`).
#[derive(Default)]
struct ClusterFetch {
    next: Nanos,
    tokens: [Option<u32>; 2],
    /// The responses read so far (both cleared when one fails).
    bodies: [Option<Vec<u8>>; 2],
    /// Digest of the last applied responses (re-reading an unchanged policy changes nothing).
    applied: Option<u64>,
}

/// Whether `every` has passed since the time `last` picks, which then becomes `now`.
fn due(now: Nanos, every: Nanos, last: fn(&mut Worker) -> &mut Nanos) -> bool {
    worker::with(|w| {
        let last = last(w);
        let due = now.saturating_sub(*last) >= every;
        *last = if due { now } else { *last };
        due
    })
}

fn next_generation() -> u64 {
    engine::store::update::<u64, engine::EngineError>(host::store(), GENERATION_KEY, engine::MAX_CAS_TRIES, |cur| {
        let n = cur.and_then(|b| b.get(..8)?.try_into().ok()).map_or(0, u64::from_le_bytes).wrapping_add(1);
        Ok((n.to_le_bytes().to_vec(), n))
    })
    .unwrap_or(1)
}

/// The `:status` of the HTTP call response being delivered ("" if none).
fn call_status() -> String {
    let raw = host::header_map_bytes(MapType::HttpCallResponseHeaders);
    let status = host::borrowed_pairs(&raw).into_iter().find_map(|(k, v)| (k == ":status").then_some(v));
    String::from_utf8_lossy(status.unwrap_or_default()).into_owned()
}

/// Re-reads the shared object counts into this worker's copy when they changed.
fn read_counts(now: Nanos) {
    worker::with(|w| w.counts_read = now);
    let (bytes, cas) = match host::store().get(OBJECT_COUNTS_KEY) {
        Ok(v) => v,
        Err(e) => return log::warn!("apf: reading the object counts failed: {e}"),
    };
    if worker::with(|w| w.counts_cas == cas && w.counts.is_some()) {
        return;
    }
    let counts = bytes.map(|b| SharedCounts::decode(&b)).transpose();
    let counts = counts.inspect_err(|e| log::warn!("apf: unreadable object counts in shared data: {e}"));
    worker::with(|w| (w.counts, w.counts_cas) = (counts.ok().flatten().map(Rc::new), cas));
}

impl Root {
    fn apply(&mut self, cfg: PluginConfig, what: &str) {
        for w in &cfg.policy.warnings {
            log::warn!("apf: {w}");
        }
        let generation = next_generation();
        let c = Compiled::new(cfg, generation);
        let (levels, schemas, seats) = (c.levels.len(), c.config.policy.flow_schemas.len(), c.config.server_concurrency_limit);
        log::info!("apf: {what} generation {generation} applied: {levels} priority levels, {schemas} flow schemas, {seats} seats");
        self.compiled = Some(Rc::new(c));
    }

    /// Starts a GET on `cluster` (with `token` as bearer token, if any); the call's token.
    fn get(&self, cluster: &str, authority: &str, path: &str, accept: &str, token: Option<&String>, timeout: Duration) -> Result<u32, Status> {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let auth = bearer.as_deref().map(|b| ("authorization", b));
        let headers = [(":method", "GET"), (":path", path), (":authority", authority), ("accept", accept)];
        self.dispatch_http_call(cluster, headers.into_iter().chain(auth).collect(), None, vec![], timeout)
    }

    /// Starts reading the cluster's policy when due.
    fn maybe_fetch(&mut self, c: &Compiled, now: Nanos) {
        let Some(cp) = c.config.cluster_policy.as_ref() else { return };
        if now < self.fetch.next || self.fetch.tokens.iter().any(Option::is_some) {
            return;
        }
        self.fetch.next = now.saturating_add(cp.period);
        self.fetch.bodies = [None, None];
        let timeout = Duration::from_nanos(u64::try_from(cp.timeout).unwrap_or(5_000_000_000));
        self.fetch.tokens = cp.paths().map(|path| {
            let call = self.get(&cp.cluster, &cp.authority, &path, "application/json", cp.token.as_ref(), timeout);
            call.map_err(|e| log::warn!("apf: cannot read the cluster policy from cluster {:?}: {e:?}", cp.cluster)).ok()
        });
    }

    /// A response of the cluster policy read; applies the policy once both are in.
    fn call_response(&mut self, token: u32, body_size: usize) {
        let Some((i, t)) = self.fetch.tokens.iter_mut().enumerate().find(|(_, t)| **t == Some(token)) else { return };
        *t = None;
        let status = call_status();
        if status != "200" {
            log::warn!("apf: reading the cluster policy failed: HTTP status {status:?}; keeping the current one");
            self.fetch.bodies = [None, None];
            return;
        }
        let body = host::buffer_bytes(BufferType::HttpCallResponseBody, 0, body_size).unwrap_or_default();
        if let Some(b) = self.fetch.bodies.get_mut(i) {
            *b = Some(body);
        }
        let [Some(fs), Some(pl)] = &self.fetch.bodies else { return };
        let digest = BuildHasherDefault::<DefaultHasher>::default().hash_one((fs, pl));
        if self.fetch.applied == Some(digest) {
            return;
        }
        let Some(base) = self.base.as_ref() else { return };
        let merged = match crate::policy::cluster::merged_config(base, &[fs, pl]) {
            Ok(m) => m,
            Err(e) => return log::error!("apf: cluster policy unusable, keeping the current one: {e}"),
        };
        self.fetch.applied = Some(digest);
        match parse_plugin_config(&merged) {
            Ok(cfg) => self.apply(cfg, "cluster policy"),
            Err(errors) => log::error!("apf: invalid cluster policy ({} errors); keeping the current one: {}", errors.len(), errors.join("; ")),
        }
    }

    /// Keeps this worker's copy of the cluster's object counts fresh and, when the next poll of
    /// the cluster's `/metrics` is due, claims it (one worker polls for all) and starts it.
    fn poll_counts(&mut self, c: &Compiled, now: Nanos) {
        let learn = c.config.work_estimator.learn_from_responses;
        if (learn || c.config.cluster_metrics.is_some()) && worker::with(|w| now.saturating_sub(w.counts_read) >= COUNTS_READ_EVERY) {
            read_counts(now);
        }
        let Some(cm) = c.config.cluster_metrics.as_ref() else { return };
        if self.counts_call.is_some() || worker::with(|w| w.counts.as_ref().is_some_and(|s| now < s.next_poll)) {
            return;
        }
        match engine::object_counts::claim(host::store(), now, worker::with(|w| w.instance), cm.timeout) {
            Ok(true) => {}
            Ok(false) => return read_counts(now),
            Err(e) => return log::warn!("apf: claiming the object counts poll failed: {e}"),
        }
        let timeout = Duration::from_nanos(u64::try_from(cm.timeout).unwrap_or(10_000_000_000));
        match self.get(&cm.cluster, &cm.authority, &cm.path, "text/plain", cm.token.as_ref(), timeout) {
            Ok(t) => self.counts_call = Some(t),
            Err(e) => self.record_counts(Err(format!("cannot call cluster {:?}: {e:?}", cm.cluster))),
        }
    }

    /// The `/metrics` response: scanned in pieces (only the three metrics' lines are kept).
    fn counts_response(&mut self, body_size: usize) {
        let status = call_status();
        if status != "200" {
            let why = if status.is_empty() { "no response (timeout or connection failure)".to_string() } else { format!("HTTP status {status}") };
            return self.record_counts(Err(why));
        }
        let mut scanner = crate::digest::object_counts::MetricsScanner::new();
        for at in (0..body_size).step_by(METRICS_READ_CHUNK) {
            let chunk = host::buffer_bytes(BufferType::HttpCallResponseBody, at, METRICS_READ_CHUNK.min(body_size - at));
            let Some(chunk) = chunk.filter(|c| !c.is_empty()) else { break };
            scanner.feed(&chunk);
        }
        let scraped = scanner.finish();
        if scraped.samples == 0 {
            return self.record_counts(Err("no apiserver_resource_objects or apiserver_storage_objects sample in the response".to_string()));
        }
        if scraped.malformed > 0 {
            log::warn!("apf: {} malformed object count lines in the cluster's metrics", scraped.malformed);
        }
        self.record_counts(Ok(scraped));
    }

    fn record_counts(&mut self, outcome: Result<ScrapedCounts, String>) {
        let Some(c) = self.compiled.clone() else { return };
        let Some(cm) = c.config.cluster_metrics.as_ref() else { return };
        let now = host::monotonic_nanos();
        match &outcome {
            Ok(s) => {
                log::debug!("apf: object counts of {} resources read from the cluster", s.entries.len());
                metrics::count_own(metrics::Own::CountsRefreshes);
            }
            Err(why) => {
                log::warn!("apf: reading object counts from the cluster's {} failed: {why}; the last counts stay in use (stale after {})", cm.path, crate::duration::format_go_duration(cm.stale_after));
                metrics::count_own(metrics::Own::CountsRefreshFailures);
            }
        }
        match engine::object_counts::record(host::store(), now, cm.period, outcome.as_ref().map_err(String::as_str)) {
            Ok(_) => read_counts(now),
            Err(e) => log::warn!("apf: storing the object counts failed: {e}"),
        }
    }
}

/// Pushes the metrics, and the limits of every level.
fn flush_metrics(c: &Compiled, now: Nanos) {
    if let Some(cm) = c.config.cluster_metrics.as_ref() {
        let (stale, age) = worker::with(|w| match w.counts.as_ref() {
            Some(s) => (s.tracker.stale(now, cm.stale_after) as u64, (s.last_success > 0).then(|| u64::try_from(now.saturating_sub(s.last_success) / crate::NANOS_PER_SEC).unwrap_or(0))),
            None => (0, None),
        });
        metrics::set_own_gauges(stale, age);
    }
    metrics::flush();
    for (i, l) in c.levels.iter().enumerate() {
        metrics::set(c, M::NominalLimit, i, u64::from(l.nominal));
        metrics::set(c, M::LowerLimit, i, u64::from(l.min_limit));
        metrics::set(c, M::UpperLimit, i, u64::from(l.max_limit));
        if let Ok(Some(st)) = engine::read_level(host::store(), &l.key) {
            metrics::set(c, M::CurrentLimit, i, u64::from(st.qs.config().concurrency_limit));
        }
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        if self.counts_call.take_if(|t| *t == token).is_some() {
            self.counts_response(body_size);
        } else {
            self.call_response(token, body_size);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = host::buffer_bytes(BufferType::PluginConfiguration, 0, usize::MAX).unwrap_or_default();
        match parse_plugin_config(&bytes) {
            Ok(cfg) => {
                self.base = cfg.cluster_policy.is_some().then(|| serde_json::from_slice(&bytes).ok()).flatten();
                self.fetch = ClusterFetch::default();
                self.apply(cfg, "configuration");
                host::set_tick_period_ms(TICK_MS);
                true
            }
            Err(errors) => {
                log::error!("apf: invalid configuration ({} errors); keeping the previous one: {}", errors.len(), errors.join("; "));
                false
            }
        }
    }

    fn on_tick(&mut self) {
        let Some(c) = self.compiled.clone() else { return };
        let now = host::monotonic_nanos();
        self.maybe_fetch(&c, now);
        if !due(now, Nanos::from(TICK_MS) * 800_000, |w| &mut w.last_tick) {
            return;
        }
        worker::ensure_registered(now);
        worker::drain_mailbox(now, 10_000);
        let mut keys = c.level_keys();
        let removed: Vec<String> = worker::with(|w| w.known_levels.iter().filter(|k| !keys.contains(k)).cloned().collect());
        keys.extend(removed);
        let mut notices = Vec::new();
        for k in &keys {
            if let Err(e) = engine::expire_level(host::store(), now, k, &mut notices) {
                log::warn!("apf: expiry on {k} failed: {e}");
            }
        }
        worker::route(std::mem::take(&mut notices), now);
        worker::enforce_local_deadlines(now);
        worker::check_watch_holds(now);
        self.poll_counts(&c, now);
        match engine::adjust_borrowing(&c, host::store(), now, &mut notices) {
            Ok(true) => log::debug!("apf: borrowing adjusted"),
            Ok(false) => {}
            Err(e) => log::warn!("apf: borrowing adjustment failed: {e}"),
        }
        worker::route(std::mem::take(&mut notices), now);
        if due(now, METRICS_EVERY, |w| &mut w.last_flush) {
            flush_metrics(&c, now);
        }
        if due(now, REAP_EVERY, |w| &mut w.last_reap) {
            match engine::reap_dead_workers(host::store(), now, worker::LEASE_TTL, &keys, &mut notices) {
                Ok(dead) => dead.iter().for_each(|d| {
                    log::warn!("apf: reaped worker slot {} (lease expired); its seats were released", d.slot)
                }),
                Err(e) => log::warn!("apf: reaping failed: {e}"),
            }
            worker::route(notices, now);
        }
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        worker::drain_mailbox(host::monotonic_nanos(), 1);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let mut http = Http::default();
        (http.ctx, http.compiled) = (context_id, self.compiled.clone());
        Some(Box::new(http))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
