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
}

impl Root {
    pub fn new() -> Root {
        Root { compiled: None }
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

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = host::plugin_configuration();
        match parse_plugin_config(&bytes) {
            Ok(cfg) => {
                for w in &cfg.policy.warnings {
                    log::warn!("apf: {w}");
                }
                let generation = next_generation();
                let c = Compiled::new(cfg, generation);
                log::info!(
                    "apf: configuration generation {generation} applied: {} priority levels, {} flow schemas, {} seats",
                    c.levels.len(),
                    c.config.policy.flow_schemas.len(),
                    c.config.server_concurrency_limit
                );
                self.compiled = Some(Rc::new(c));
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
        worker::drain_mailbox(now);
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
        worker::drain_mailbox(host::monotonic_nanos());
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
            Ok(None) => worker::handle(Notice { owner: 0, context: ctx, level_key: l.level_key.to_string(), id: l.id, kind: NoticeKind::Run { waited: now - l.arrived } }, now),
            Err(e) => log::warn!("apf: time-out of request {} failed: {e}", l.id),
        }
    }
}
