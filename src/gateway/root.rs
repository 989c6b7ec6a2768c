//! The gateway's root: one compiled configuration, the timer (expiry, borrowing, leases, the
//! cluster polls, stats) and the mailbox handler.

use super::host::{pairs, Body, HeaderMap, Host};
use super::request::Request;
use super::stats::{Own, M};
use super::worker::{self, Worker, REAP_EVERY};
use crate::digest::metrics_scan::ScrapedCounts;
use crate::engine::object_counts::{SharedCounts, OBJECT_COUNTS_KEY};
use crate::engine::{self, Compiled};
use crate::policy::cluster::ClusterPolicy;
use crate::config::{parse_plugin_config, PluginConfig};
use crate::policy::discovery;
use crate::policy::objects::ApiVersion;
use crate::Nanos;
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

/// The gateway's state of one root context (one plugin configuration).
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
    /// Digest of the last applied policy's meaning (re-reading an unchanged policy changes
    /// nothing: see `cluster::merged_config`).
    applied: Option<u64>,
    /// The read of the group's discovery document under way (without `pathPrefix`).
    discovery: Option<u32>,
    /// The served version discovered last; `None` until discovery first answers (the lists are
    /// read at [`discovery::FALLBACK`]'s path meanwhile).
    version: Option<ApiVersion>,
    /// Policy reads started since discovery last answered.
    reads_since_discovery: u32,
    /// Read the discovery document before the next read (it failed, or a list answered 404).
    rediscover: bool,
    /// The path prefix of the lists under way.
    prefix: String,
}

impl ClusterFetch {
    fn busy(&self) -> bool {
        self.discovery.is_some() || self.tokens.iter().any(Option::is_some)
    }

    fn discovery_due(&self) -> bool {
        self.version.is_none() || self.rediscover || self.reads_since_discovery >= discovery::REDISCOVER_EVERY
    }

    /// Where the lists are read: `pathPrefix`, else the discovered (or fallback) version's.
    fn prefix_of(&self, cp: &ClusterPolicy) -> String {
        cp.path_prefix.clone().unwrap_or_else(|| discovery::path_prefix(self.version.unwrap_or(discovery::FALLBACK)))
    }
}

/// Where a poll goes: an Envoy cluster, the `:authority`, the bearer token (if any) and the
/// call's timeout.
struct PollTarget<'a> {
    cluster: &'a str,
    authority: &'a str,
    token: Option<&'a String>,
    timeout: Duration,
}

impl<'a> PollTarget<'a> {
    fn policy(cp: &'a ClusterPolicy) -> PollTarget<'a> {
        let timeout = Duration::from_nanos(u64::try_from(cp.timeout).unwrap_or(5_000_000_000));
        PollTarget { cluster: &cp.cluster, authority: &cp.authority, token: cp.token.as_ref(), timeout }
    }

    /// Starts a GET of `path`; the call's token.
    fn get(&self, h: &dyn Host, path: &str, accept: &str) -> Result<u32, String> {
        let bearer = self.token.map(|t| format!("Bearer {t}"));
        let auth = bearer.as_deref().map(|b| ("authorization", b));
        let headers = [(":method", "GET"), (":path", path), (":authority", self.authority), ("accept", accept)];
        let headers: Vec<(&str, &str)> = headers.into_iter().chain(auth).collect();
        h.http_call(self.cluster, &headers, &[], self.timeout)
    }
}

fn next_generation(h: &dyn Host) -> u64 {
    engine::store::update::<u64, engine::EngineError>(h.store(), GENERATION_KEY, engine::MAX_CAS_TRIES, |cur| {
        let n = cur.and_then(|b| b.get(..8)?.try_into().ok()).map_or(0, u64::from_le_bytes).wrapping_add(1);
        Ok((n.to_le_bytes().to_vec(), n))
    })
    .unwrap_or(1)
}

/// The `:status` of the HTTP call response being delivered ("" if none).
fn call_status(h: &dyn Host) -> String {
    let raw = h.header_map_bytes(HeaderMap::CallResponse);
    let status = pairs(&raw).into_iter().find_map(|(k, v)| (k == ":status").then_some(v));
    String::from_utf8_lossy(status.unwrap_or_default()).into_owned()
}

/// Re-reads the shared object counts into this worker's copy when they changed.
fn read_counts(h: &dyn Host, w: &mut Worker, now: Nanos) {
    w.counts_read = now;
    let (bytes, cas) = match h.store().get(OBJECT_COUNTS_KEY) {
        Ok(v) => v,
        Err(e) => return log::warn!("apf: reading the object counts failed: {e}"),
    };
    if w.counts_cas == cas && w.counts.is_some() {
        return;
    }
    let counts = bytes.map(|b| SharedCounts::decode(&b)).transpose();
    let counts = counts.inspect_err(|e| log::warn!("apf: unreadable object counts in shared data: {e}"));
    (w.counts, w.counts_cas) = (counts.ok().flatten().map(Rc::new), cas);
}

impl Root {
    fn apply(&mut self, h: &dyn Host, cfg: PluginConfig, what: &str) {
        for w in &cfg.policy.warnings {
            log::warn!("apf: {w}");
        }
        let generation = next_generation(h);
        let c = Compiled::new(cfg, generation);
        let (levels, schemas, seats) = (c.levels.len(), c.config.policy.flow_schemas.len(), c.config.server_concurrency_limit);
        log::info!("apf: {what} generation {generation} applied: {levels} priority levels, {schemas} flow schemas, {seats} seats");
        self.compiled = Some(Rc::new(c));
    }

    /// Starts reading the cluster's policy when due: the group's discovery document first when
    /// the served version is to be (re)discovered, else the two lists.
    fn maybe_fetch(&mut self, h: &dyn Host, c: &Compiled, now: Nanos) {
        let Some(cp) = c.config.cluster_policy.as_ref() else { return };
        if now < self.fetch.next || self.fetch.busy() {
            return;
        }
        self.fetch.next = now.saturating_add(cp.period);
        if cp.path_prefix.is_none() && self.fetch.discovery_due() {
            let call = PollTarget::policy(cp).get(h, discovery::DISCOVERY_PATH, "application/json");
            match call {
                Ok(t) => return self.fetch.discovery = Some(t),
                Err(e) => {
                    self.fetch.rediscover = true;
                    log::warn!(
                        "apf: cannot read {} from cluster {:?}: {e:?}; reading {} meanwhile",
                        discovery::DISCOVERY_PATH,
                        cp.cluster,
                        self.fetch.prefix_of(cp)
                    );
                }
            }
        }
        self.start_lists(h, cp);
    }

    /// Starts the two list calls.
    fn start_lists(&mut self, h: &dyn Host, cp: &ClusterPolicy) {
        let prefix = self.fetch.prefix_of(cp);
        self.fetch.bodies = [None, None];
        self.fetch.reads_since_discovery = self.fetch.reads_since_discovery.saturating_add(1);
        self.fetch.tokens = ClusterPolicy::paths(&prefix).map(|path| {
            let call = PollTarget::policy(cp).get(h, &path, "application/json");
            call.map_err(|e| log::warn!("apf: cannot read the cluster policy from cluster {:?}: {e:?}", cp.cluster)).ok()
        });
        self.fetch.prefix = prefix;
    }

    /// The discovery document's reply: the version to read from now on (a failed or unusable
    /// reply keeps the previous one, and discovery is retried at the next read); then the lists.
    fn discovery_response(&mut self, h: &dyn Host, cp: &ClusterPolicy, body_size: usize) {
        let status = call_status(h);
        let outcome = match status.as_str() {
            "200" => discovery::choose_version(&h.body_bytes(Body::CallResponse, 0, body_size).unwrap_or_default()),
            "" => Err("no response (timeout or connection failure)".to_string()),
            _ => Err(format!("HTTP status {status}")),
        };
        match outcome {
            Ok(d) => {
                if self.fetch.version != Some(d.version) {
                    let preferred = d.preferred.as_deref().unwrap_or("none");
                    log::info!(
                        "apf: the cluster serves {} {:?} (preferred: {preferred}); reading the policy from {}",
                        discovery::GROUP,
                        d.served,
                        discovery::path_prefix(d.version)
                    );
                }
                self.fetch.version = Some(d.version);
                self.fetch.rediscover = false;
                self.fetch.reads_since_discovery = 0;
            }
            Err(why) => {
                self.fetch.rediscover = true;
                let which = if self.fetch.version.is_some() { "the version in use" } else { "the newest version, until discovery answers" };
                log::warn!(
                    "apf: discovering the served {} version ({}) failed: {why}; reading {} ({which})",
                    discovery::GROUP,
                    discovery::DISCOVERY_PATH,
                    self.fetch.prefix_of(cp)
                );
            }
        }
        self.start_lists(h, cp);
    }

    /// A response of the cluster policy read; applies the policy once both are in.
    fn call_response(&mut self, h: &dyn Host, token: u32, body_size: usize) {
        let Some(c) = self.compiled.clone() else { return };
        let Some(cp) = c.config.cluster_policy.as_ref() else { return };
        if self.fetch.discovery.take_if(|t| *t == token).is_some() {
            return self.discovery_response(h, cp, body_size);
        }
        let Some((i, t)) = self.fetch.tokens.iter_mut().enumerate().find(|(_, t)| **t == Some(token)) else { return };
        *t = None;
        let status = call_status(h);
        if status == "404" && cp.path_prefix.is_none() {
            // The version read is no longer served (the cluster was upgraded or downgraded):
            // discover again, at once unless discovery has just named this version.
            log::warn!(
                "apf: reading the cluster policy from {} failed: HTTP status 404; discovering the served version again",
                self.fetch.prefix
            );
            self.fetch.rediscover = true;
            if self.fetch.reads_since_discovery > 1 {
                self.fetch.next = h.monotonic_nanos();
            }
            self.fetch.bodies = [None, None];
            return;
        }
        if status != "200" {
            log::warn!(
                "apf: reading the cluster policy from {} failed: HTTP status {status:?}; keeping the current one",
                self.fetch.prefix
            );
            self.fetch.bodies = [None, None];
            return;
        }
        let body = h.body_bytes(Body::CallResponse, 0, body_size).unwrap_or_default();
        if let Some(b) = self.fetch.bodies.get_mut(i) {
            *b = Some(body);
        }
        let [Some(fs), Some(pl)] = &self.fetch.bodies else { return };
        let Some(base) = self.base.as_ref() else { return };
        let merged = match crate::policy::cluster::merged_config(base, &[fs, pl]) {
            Ok(m) => m,
            Err(e) => return log::error!("apf: cluster policy from {} unusable, keeping the current one: {e}", self.fetch.prefix),
        };
        // The merged configuration holds only what the policy means (not resourceVersions,
        // managedFields or status): a re-read that changed nothing else changes nothing.
        let digest = BuildHasherDefault::<DefaultHasher>::default().hash_one(&merged);
        if self.fetch.applied == Some(digest) {
            return;
        }
        self.fetch.applied = Some(digest);
        match parse_plugin_config(&merged) {
            Ok(cfg) => {
                let what = format!("cluster policy from {}", self.fetch.prefix);
                self.apply(h, cfg, &what)
            }
            Err(errors) => log::error!(
                "apf: invalid cluster policy from {} ({} errors); keeping the current one: {}",
                self.fetch.prefix,
                errors.len(),
                errors.join("; ")
            ),
        }
    }

    /// Keeps this worker's copy of the cluster's object counts fresh and, when the next poll of
    /// the cluster's `/metrics` is due, claims it (one worker polls for all) and starts it.
    fn poll_counts(&mut self, h: &dyn Host, w: &mut Worker, c: &Compiled, now: Nanos) {
        let learn = c.config.work_estimator.learn_from_responses;
        if (learn || c.config.cluster_metrics.is_some()) && now.saturating_sub(w.counts_read) >= COUNTS_READ_EVERY {
            read_counts(h, w, now);
        }
        let Some(cm) = c.config.cluster_metrics.as_ref() else { return };
        if self.counts_call.is_some() || w.counts.as_ref().is_some_and(|s| now < s.next_poll) {
            return;
        }
        match engine::object_counts::claim(h.store(), now, w.instance, cm.timeout) {
            Ok(true) => {}
            Ok(false) => return read_counts(h, w, now),
            Err(e) => return log::warn!("apf: claiming the object counts poll failed: {e}"),
        }
        let timeout = Duration::from_nanos(u64::try_from(cm.timeout).unwrap_or(10_000_000_000));
        let target = PollTarget { cluster: &cm.cluster, authority: &cm.authority, token: cm.token.as_ref(), timeout };
        match target.get(h, &cm.path, "text/plain") {
            Ok(t) => self.counts_call = Some(t),
            Err(e) => self.record_counts(h, w, Err(format!("cannot call cluster {:?}: {e}", cm.cluster))),
        }
    }

    /// The `/metrics` response: scanned in pieces (only the three metrics' lines are kept).
    fn counts_response(&mut self, h: &dyn Host, w: &mut Worker, body_size: usize) {
        let status = call_status(h);
        if status != "200" {
            let why =
                if status.is_empty() { "no response (timeout or connection failure)".to_string() } else { format!("HTTP status {status}") };
            return self.record_counts(h, w, Err(why));
        }
        let mut scanner = crate::digest::metrics_scan::MetricsScanner::new();
        for at in (0..body_size).step_by(METRICS_READ_CHUNK) {
            let chunk = h.body_bytes(Body::CallResponse, at, METRICS_READ_CHUNK.min(body_size.saturating_sub(at)));
            let Some(chunk) = chunk.filter(|c| !c.is_empty()) else { break };
            scanner.feed(&chunk);
        }
        let scraped = scanner.finish();
        if scraped.samples == 0 {
            return self.record_counts(
                h,
                w,
                Err("no apiserver_resource_objects or apiserver_storage_objects sample in the response".to_string()),
            );
        }
        if scraped.malformed > 0 {
            log::warn!("apf: {} malformed object count lines in the cluster's metrics", scraped.malformed);
        }
        self.record_counts(h, w, Ok(scraped));
    }

    fn record_counts(&mut self, h: &dyn Host, w: &mut Worker, outcome: Result<ScrapedCounts, String>) {
        let Some(c) = self.compiled.clone() else { return };
        let Some(cm) = c.config.cluster_metrics.as_ref() else { return };
        let now = h.monotonic_nanos();
        match &outcome {
            Ok(s) => {
                log::debug!("apf: object counts of {} resources read from the cluster", s.entries.len());
                w.stats.count_own(Own::CountsRefreshes);
            }
            Err(why) => {
                log::warn!(
                    "apf: reading object counts from the cluster's {} failed: {why}; the last counts stay in use (stale after {})",
                    cm.path,
                    crate::duration::format_go_duration(cm.stale_after)
                );
                w.stats.count_own(Own::CountsRefreshFailures);
            }
        }
        match engine::object_counts::record(h.store(), now, cm.period, outcome.as_ref().map_err(String::as_str)) {
            Ok(_) => read_counts(h, w, now),
            Err(e) => log::warn!("apf: storing the object counts failed: {e}"),
        }
    }
}

/// Pushes the metrics, and the limits of every level.
fn flush_metrics(h: &dyn Host, w: &mut Worker, c: &Compiled, now: Nanos) {
    if let Some(cm) = c.config.cluster_metrics.as_ref() {
        let (stale, age) = match w.counts.as_ref() {
            Some(s) => (
                s.tracker.stale(now, cm.stale_after) as u64,
                (s.last_success > 0).then(|| u64::try_from(now.saturating_sub(s.last_success) / crate::NANOS_PER_SEC).unwrap_or(0)),
            ),
            None => (0, None),
        };
        w.stats.set_own_gauges(h, stale, age);
    }
    w.stats.flush(h);
    for (i, l) in c.levels.iter().enumerate() {
        w.stats.set(h, c, M::NominalLimit, i, u64::from(l.nominal));
        w.stats.set(h, c, M::LowerLimit, i, u64::from(l.min_limit));
        w.stats.set(h, c, M::UpperLimit, i, u64::from(l.max_limit));
        if let Ok(Some(st)) = engine::read_level(h.store(), &l.key) {
            w.stats.set(h, c, M::CurrentLimit, i, u64::from(st.qs.config().concurrency_limit));
        }
    }
}

impl Root {
    /// The reply of an HTTP call this root started.
    pub fn on_http_call_response(&mut self, h: &dyn Host, w: &mut Worker, token: u32, body_size: usize) {
        if super::fleet::on_call_response(h, w, self.compiled.as_deref(), token, body_size) {
            return;
        }
        if self.counts_call.take_if(|t| *t == token).is_some() {
            self.counts_response(h, w, body_size);
        } else {
            self.call_response(h, token, body_size);
        }
    }

    /// A new configuration (`bytes`): applied, or refused with every error logged (the previous
    /// one keeps serving).
    pub fn on_configure(&mut self, h: &dyn Host, bytes: &[u8]) -> bool {
        match parse_plugin_config(bytes) {
            Ok(cfg) => {
                self.base = cfg.cluster_policy.is_some().then(|| serde_json::from_slice(bytes).ok()).flatten();
                self.fetch = ClusterFetch::default();
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
        self.maybe_fetch(h, &c, now);
        if !w.due(now, Nanos::from(TICK_MS) * 800_000, |w| &mut w.last_tick) {
            return;
        }
        w.ensure_registered(h, now);
        w.drain_mailbox(h, now, 10_000);
        let mut keys = c.level_keys();
        let removed: Vec<String> = w.known_levels.iter().filter(|k| !keys.contains(k)).cloned().collect();
        keys.extend(removed);
        let mut notices = Vec::new();
        for k in &keys {
            if let Err(e) = engine::expire_level(h.store(), now, k, &mut notices) {
                log::warn!("apf: expiry on {k} failed: {e}");
            }
        }
        w.route(h, std::mem::take(&mut notices), now);
        w.enforce_local_deadlines(h, now);
        w.check_watch_holds(h, now);
        self.poll_counts(h, w, &c, now);
        super::fleet::on_tick(h, w, &c, now);
        match engine::adjust_borrowing(&c, h.store(), now, &mut notices) {
            Ok(true) => log::debug!("apf: borrowing adjusted"),
            Ok(false) => {}
            Err(e) => log::warn!("apf: borrowing adjustment failed: {e}"),
        }
        w.route(h, std::mem::take(&mut notices), now);
        if w.due(now, METRICS_EVERY, |w| &mut w.last_flush) {
            flush_metrics(h, w, &c, now);
        }
        if w.due(now, REAP_EVERY, |w| &mut w.last_reap) {
            match engine::reap_dead_workers(h.store(), now, worker::LEASE_TTL, &keys, &mut notices) {
                Ok(dead) => {
                    dead.iter().for_each(|d| log::warn!("apf: reaped worker slot {} (lease expired); its seats were released", d.slot))
                }
                Err(e) => log::warn!("apf: reaping failed: {e}"),
            }
            w.route(h, notices, now);
        }
    }

    /// A message arrived in this worker's mailbox.
    pub fn on_queue_ready(&mut self, h: &dyn Host, w: &mut Worker) {
        w.drain_mailbox(h, h.monotonic_nanos(), 1);
    }

    /// The state of a new stream `context`, under the current configuration.
    pub fn new_request(&self, context: u32) -> Request {
        Request::new(context, self.compiled.clone())
    }
}
