//! Root context: one compiled configuration, the timer and the mailbox handler.

use super::host::{self, HostStore};
use super::http::Http;
use super::metrics::{self, M};
use super::worker::{self, Phase, REAP_EVERY};
use crate::engine::{self, Compiled, Notice, NoticeKind};
use crate::policy::config::parse_plugin_config;
use crate::Nanos;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;

pub const TICK_MS: u32 = 50;
const METRICS_EVERY: Nanos = 1_000_000_000;
const GENERATION_KEY: &str = "apf/v1/generation";

pub struct Root {
    compiled: Option<Rc<Compiled>>,
    /// The configuration document, kept when the policy comes from the cluster.
    base: Option<serde_json::Value>,
    fetch: ClusterFetch,
}

/// State of the periodic policy read from the cluster (`clusterPolicy`).
#[derive(Default)]
struct ClusterFetch {
    next: Nanos,
    tokens: [Option<u32>; 2],
    bodies: [Option<Vec<u8>>; 2],
    failed: bool,
    /// Digest of the last applied responses (re-reading an unchanged policy changes nothing).
    applied: Option<u64>,
}

impl Root {
    pub fn new() -> Root {
        Root { compiled: None, base: None, fetch: ClusterFetch::default() }
    }

    fn apply(&mut self, cfg: crate::policy::config::PluginConfig, what: &str) {
        for w in &cfg.policy.warnings {
            log::warn!("apf: {w}");
        }
        let generation = next_generation();
        let c = Compiled::new(cfg, generation);
        log::info!(
            "apf: {what} generation {generation} applied: {} priority levels, {} flow schemas, {} seats",
            c.levels.len(),
            c.config.policy.flow_schemas.len(),
            c.config.server_concurrency_limit
        );
        self.compiled = Some(Rc::new(c));
    }

    /// Starts reading the cluster's policy when due.
    fn maybe_fetch(&mut self, c: &Compiled, now: Nanos) {
        let Some(cp) = c.config.cluster_policy.as_ref() else { return };
        if now < self.fetch.next || self.fetch.tokens.iter().any(Option::is_some) {
            return;
        }
        self.fetch.next = now.saturating_add(cp.period);
        self.fetch.bodies = [None, None];
        self.fetch.failed = false;
        let bearer = cp.token.as_ref().map(|t| format!("Bearer {t}"));
        let timeout = std::time::Duration::from_nanos(u64::try_from(cp.timeout).unwrap_or(5_000_000_000));
        for (i, path) in cp.paths().iter().enumerate() {
            let mut headers = vec![(":method", "GET"), (":path", path.as_str()), (":authority", cp.authority.as_str()), ("accept", "application/json")];
            if let Some(b) = &bearer {
                headers.push(("authorization", b.as_str()));
            }
            match self.dispatch_http_call(&cp.cluster, headers, None, vec![], timeout) {
                Ok(t) => {
                    if let Some(slot) = self.fetch.tokens.get_mut(i) {
                        *slot = Some(t);
                    }
                }
                Err(e) => log::warn!("apf: cannot read the cluster policy from cluster {:?}: {e:?}", cp.cluster),
            }
        }
    }

    fn fetched(&mut self) {
        if self.fetch.tokens.iter().any(Option::is_some) || self.fetch.failed {
            return;
        }
        let [Some(fs), Some(pl)] = &self.fetch.bodies else { return };
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            fs.hash(&mut h);
            pl.hash(&mut h);
            h.finish()
        };
        if self.fetch.applied == Some(digest) {
            return;
        }
        let Some(base) = self.base.as_ref() else { return };
        let merged = match crate::policy::cluster::merged_config(base, &[fs, pl]) {
            Ok(m) => m,
            Err(e) => {
                log::error!("apf: cluster policy unusable, keeping the current one: {e}");
                return;
            }
        };
        match parse_plugin_config(&merged) {
            Ok(cfg) => {
                self.fetch.applied = Some(digest);
                self.apply(cfg, "cluster policy");
            }
            Err(errors) => {
                self.fetch.applied = Some(digest);
                log::error!("apf: invalid cluster policy ({} errors); keeping the current one: {}", errors.len(), errors.join("; "));
            }
        }
    }
}

fn next_generation() -> u64 {
    engine::store::update::<u64, engine::EngineError>(&HostStore, GENERATION_KEY, engine::MAX_CAS_TRIES, |cur| {
        let g = cur.and_then(|b| b.get(..8)).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        });
        let n = g.unwrap_or(0).wrapping_add(1);
        Ok((n.to_le_bytes().to_vec(), n))
    })
    .unwrap_or(1)
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body_size: usize, trailers: usize) {
        let _ = (headers, trailers);
        self.call_response(token, body_size)
    }
}


impl Root {
    fn call_response(&mut self, token: u32, body_size: usize) {
        let Some(i) = self.fetch.tokens.iter().position(|t| *t == Some(token)) else { return };
        if let Some(t) = self.fetch.tokens.get_mut(i) {
            *t = None;
        }
        let status = host::header_pairs(host::HTTP_CALL_RESPONSE_HEADERS)
            .into_iter()
            .find(|(k, _)| k == ":status")
            .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        if status != "200" {
            log::warn!("apf: reading the cluster policy failed: HTTP status {status:?}; keeping the current one");
            self.fetch.failed = true;
            return;
        }
        let body = host::http_call_body(body_size);
        if let Some(b) = self.fetch.bodies.get_mut(i) {
            *b = Some(body);
        }
        self.fetched();
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = host::plugin_configuration();
        match parse_plugin_config(&bytes) {
            Ok(cfg) => {
                self.base = if cfg.cluster_policy.is_some() {
                    serde_json::from_slice(if bytes.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &bytes }).ok()
                } else {
                    None
                };
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
        let due = worker::with(|w| {
            if now.saturating_sub(w.last_tick) < Nanos::from(TICK_MS) * 800_000 {
                false
            } else {
                w.last_tick = now;
                true
            }
        });
        if !due {
            return;
        }
        worker::ensure_registered(now);
        worker::drain_mailbox(now, 10_000);
        let mut keys = c.level_keys();
        worker::with(|w| {
            for k in &w.known_levels {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
        });
        let mut notices = Vec::new();
        for k in &keys {
            if let Err(e) = engine::expire_level(&HostStore, now, k, &mut notices) {
                log::warn!("apf: expiry on {k} failed: {e}");
            }
        }
        worker::route(std::mem::take(&mut notices), now);
        enforce_local_deadlines(now);
        match engine::adjust_borrowing(&c, &HostStore, now, &mut notices) {
            Ok(true) => log::debug!("apf: borrowing adjusted"),
            Ok(false) => {}
            Err(e) => log::warn!("apf: borrowing adjustment failed: {e}"),
        }
        worker::route(std::mem::take(&mut notices), now);
        let flush = worker::with(|w| {
            if now.saturating_sub(w.last_flush) >= METRICS_EVERY {
                w.last_flush = now;
                true
            } else {
                false
            }
        });
        if flush {
            metrics::flush();
            for (i, l) in c.levels.iter().enumerate() {
                metrics::set(&c, M::NominalLimit, i, u64::from(l.nominal));
                metrics::set(&c, M::LowerLimit, i, u64::from(l.min_limit));
                metrics::set(&c, M::UpperLimit, i, u64::from(l.max_limit));
                if let Ok(Some(st)) = engine::read_level(&HostStore, &l.key) {
                    metrics::set(&c, M::CurrentLimit, i, u64::from(st.qs.config().concurrency_limit));
                }
            }
        }
        let reap = worker::with(|w| {
            if now.saturating_sub(w.last_reap) >= REAP_EVERY {
                w.last_reap = now;
                true
            } else {
                false
            }
        });
        if reap {
            match engine::reap_dead_workers(&HostStore, now, worker::LEASE_TTL, &keys, &mut notices) {
                Ok(dead) => {
                    for d in dead {
                        log::warn!("apf: reaped worker slot {} (lease expired); its seats were released", d.slot);
                    }
                }
                Err(e) => log::warn!("apf: reaping failed: {e}"),
            }
            worker::route(notices, now);
        }
    }

    fn on_queue_ready(&mut self, _queue_id: u32) {
        let _t = super::timing::span(super::timing::Span::QueueReady);
        worker::drain_mailbox(host::monotonic_nanos(), 1);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http::new(context_id, self.compiled.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Backstop for the wait limit: a queued request of ours whose deadline passed (and that no
/// worker's expiry has answered yet) is timed out here.
fn enforce_local_deadlines(now: Nanos) {
    const GRACE: Nanos = 100_000_000;
    let overdue: Vec<(u32, worker::Local)> = worker::with(|w| {
        w.requests
            .iter()
            .filter(|(_, l)| l.phase == Phase::Waiting && l.wait_deadline.saturating_add(GRACE) <= now)
            .map(|(c, l)| (*c, l.clone()))
            .collect()
    });
    for (ctx, l) in overdue {
        match engine::time_out(&HostStore, now, &l.level_key, l.id) {
            Ok(Some(retry_after)) => worker::handle(
                Notice { owner: 0, context: ctx, level_key: l.level_key.to_string(), id: l.id, kind: NoticeKind::Reject { reason: crate::fairqueuing::RejectReason::TimeOut, retry_after } },
                now,
            ),
            // Dispatched meanwhile: its wake-up notice (with the receipt) is on its way.
            Ok(None) => {}
            Err(e) => log::warn!("apf: time-out of request {} failed: {e}", l.id),
        }
    }
}
