//! A plugin configuration compiled for the request path: the effective policy, its classifier,
//! the per-level queuing parameters and shared-state keys, and the request digest pipeline
//! (request info → identity → classification → work estimate → wait limit) that the filter, the
//! CLI and tests all run.

use crate::classify::{Classification, Classifier};
use crate::config::{PluginConfig, RequestMode};
use crate::digest::identity::{identify, IdentityInput, UserInfo};
use crate::digest::request_info::{parse_generic_into, parse_request_info_into, RequestInfo};
use crate::digest::work_estimate::{estimate_with, watch_init, ClusterStats, StatsLookup, WatchInit};
use crate::fairqueuing::{QueueSetConfig, WorkEstimate};
use crate::policy::model::PriorityLevelSpec;
use crate::Nanos;

/// Upstream caps the queue wait at one minute whatever the request deadline.
pub const MAX_WAIT_LIMIT: Nanos = 60 * crate::NANOS_PER_SEC;

#[derive(Debug, Clone)]
pub struct LevelRuntime {
    pub name: String,
    pub uid: String,
    /// Shared-store key of the level's state (shared with the requests that hold it; `Arc` because a configuration may be shared across threads natively).
    pub key: std::sync::Arc<str>,
    pub qs_config: QueueSetConfig,
    pub exempt: bool,
    pub max_seats: Option<u32>,
    pub nominal: u32,
    pub min_limit: u32,
    pub max_limit: u32,
    /// False when the configuration runs this level in dry-run mode.
    pub enforce: bool,
}

/// What the digest reads of a request besides its identity.
#[derive(Debug, Clone, Copy)]
pub struct RequestLine<'a> {
    pub method: &'a [u8],
    pub path: &'a [u8],
    /// The value of the configured namespace header (`namespace_header`, generic mode).
    pub namespace_header: Option<&'a [u8]>,
}

pub struct Compiled {
    pub config: PluginConfig,
    pub classifier: Classifier,
    /// Increases with every configuration a process applies; newer wins in shared state.
    pub generation: u64,
    pub levels: Vec<LevelRuntime>,
    /// Lowercase request header names the identity sources read.
    pub identity_headers: Vec<String>,
    /// Lowercase header-name prefixes the identity sources read (`x-remote-extra-`, …).
    pub identity_prefixes: Vec<String>,
    /// Which connection facts the identity sources need from the host.
    pub needs: IdentityNeeds,
}

/// Connection facts to fetch from the host for identity (each costs a host call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IdentityNeeds {
    pub peer: bool,
    pub mtls: bool,
    pub cert_subject: bool,
    pub jwt: bool,
    pub strip: bool,
}

impl IdentityNeeds {
    pub fn of(cfg: &crate::digest::identity::IdentityConfig) -> IdentityNeeds {
        use crate::digest::identity::IdentitySource as S;
        let mut n = IdentityNeeds::default();
        for s in &cfg.sources {
            let (cidrs, mtls, strip) = s.trust();
            let cert = matches!(s, S::ClientCertificate { .. });
            n.peer |= !cidrs.is_empty();
            n.mtls |= mtls || cert;
            n.strip |= strip;
            n.cert_subject |= cert;
            n.jwt |= matches!(s, S::Jwt { .. });
        }
        n
    }
}

/// Everything APF needs to know about one request.
#[derive(Debug, Clone, Default)]
pub struct Digest {
    pub info: RequestInfo,
    pub user: UserInfo,
    pub class: Classification,
    pub work: WorkEstimate,
    pub long_running: bool,
    pub is_watch: bool,
    /// How long the request may wait in a queue (deadline / 4, at most one minute).
    pub wait_limit: Nanos,
    /// The object counts a LIST or WATCH was costed with.
    pub stats: Option<StatsLookup>,
    /// How a WATCH's initial phase ends (its seats are held until then).
    pub watch_init: WatchInit,
}

impl Compiled {
    pub fn new(mut config: PluginConfig, generation: u64) -> Compiled {
        // Built-in objects that were not supplied as API objects have no `metadata.uid`; give
        // them a stable synthetic one so the PF headers are never empty.
        for pl in config.policy.priority_levels.iter_mut().filter(|pl| pl.uid.is_empty()) {
            pl.uid = synthetic_uid("PriorityLevelConfiguration", &pl.name);
        }
        for fs in config.policy.flow_schemas.iter_mut().filter(|fs| fs.uid.is_empty()) {
            fs.uid = synthetic_uid("FlowSchema", &fs.name);
        }
        let classifier = Classifier::new(&config.policy);
        let levels: Vec<_> = config
            .policy
            .priority_levels
            .iter()
            .enumerate()
            .map(|(i, pl)| {
                let lim = config.limits.get(i).cloned().unwrap_or_default();
                // Fleet mode: a limited level admits nothing until the fleet's allocation sets its
                // seats (the fleet limit is every replica's together).
                let initial = if config.fleet.is_some() { 0 } else { lim.initial_current };
                let qs_config = match (&pl.spec, pl.queuing()) {
                    (PriorityLevelSpec::Exempt { .. }, _) => QueueSetConfig {
                        desired_queues: -1,
                        queue_length_limit: 0,
                        hand_size: 0,
                        concurrency_limit: lim.nominal,
                        strict_limit: false,
                    },
                    (_, Some(q)) => QueueSetConfig {
                        desired_queues: q.queues,
                        queue_length_limit: u32::try_from(q.queue_length_limit).unwrap_or(0),
                        hand_size: u32::try_from(q.hand_size).unwrap_or(1),
                        concurrency_limit: initial,
                        strict_limit: config.fleet.is_some(),
                    },
                    (_, None) => QueueSetConfig {
                        desired_queues: 0,
                        queue_length_limit: 0,
                        hand_size: 0,
                        concurrency_limit: initial,
                        strict_limit: config.fleet.is_some(),
                    },
                };
                LevelRuntime {
                    name: pl.name.clone(),
                    uid: pl.uid.clone(),
                    key: super::level_key(&pl.name).into(),
                    qs_config,
                    exempt: pl.is_exempt(),
                    max_seats: lim.max_seats,
                    nominal: lim.nominal,
                    // Fleet mode: this replica's share may be anything from none to the level's
                    // fleet-wide maximum (the fleet's allocation sets it).
                    min_limit: if config.fleet.is_some() { 0 } else { lim.min },
                    max_limit: lim.max,
                    enforce: config.enforce && !config.dry_run_priority_levels.contains(&pl.name),
                }
            })
            .collect();
        let identity_headers = config.identity.header_names();
        let identity_prefixes = config.identity.header_prefixes();
        let needs = IdentityNeeds::of(&config.identity);
        Compiled { config, classifier, generation, levels, identity_headers, identity_prefixes, needs }
    }

    /// Runs the digest pipeline. `watch_count` gives the number of open watches a mutating
    /// request would notify (0 if unknown); `cluster` the cluster's object counts (consulted for
    /// LIST and WATCH only).
    pub fn digest(
        &self,
        line: RequestLine<'_>,
        identity: &IdentityInput,
        watch_count: impl FnOnce(&RequestInfo) -> u32,
        cluster: ClusterStats,
    ) -> Digest {
        let user = identify(&self.config.identity, identity);
        self.digest_for(line, user, watch_count, cluster)
    }

    /// [`Compiled::digest`] for a caller already identified (`apf classify --user`).
    pub fn digest_for(
        &self,
        line: RequestLine<'_>,
        user: UserInfo,
        watch_count: impl FnOnce(&RequestInfo) -> u32,
        cluster: ClusterStats,
    ) -> Digest {
        let mut d = Digest { user, ..Digest::default() };
        self.digest_into(line, watch_count, cluster, &mut d);
        d
    }

    /// [`Compiled::digest_for`] in place: `d.user` is the caller, already identified; every
    /// other field is rewritten, in the strings' buffers `d` has (a request like the previous
    /// one allocates nothing).
    pub fn digest_into(&self, line: RequestLine<'_>, watch_count: impl FnOnce(&RequestInfo) -> u32, cluster: ClusterStats, d: &mut Digest) {
        let RequestLine { method, path, namespace_header } = line;
        let method_s = std::str::from_utf8(method).unwrap_or("");
        let info = &mut d.info;
        match self.config.request_mode {
            RequestMode::Kubernetes => parse_request_info_into(info, method_s, path),
            RequestMode::Generic => parse_generic_into(info, method_s, path, namespace_header),
        }
        let info = &d.info;
        self.classifier.classify_into(info, &d.user, &mut d.class);
        let long_running = info.is_long_running();
        let is_watch = info.is_watch();
        let max_seats = self.levels.get(d.class.priority_level).and_then(|l| l.max_seats);
        let is_mutating = matches!(info.verb.as_str(), "create" | "update" | "patch" | "delete");
        let watches = if is_mutating { watch_count(info) } else { 0 };
        (d.work, d.stats) = estimate_with(&self.config.work_estimator, info, max_seats, watches, cluster);
        d.wait_limit = self.wait_limit(info, is_watch || long_running);
        d.watch_init = if self.config.work_estimator.watch_list { watch_init(info) } else { WatchInit::None };
        (d.long_running, d.is_watch) = (long_running, is_watch);
    }

    /// Upstream `getRequestWaitContext`: a quarter of the request deadline, where the deadline is
    /// `min(?timeout=, requestTimeout)` for ordinary requests and `requestTimeout` for
    /// long-running ones; capped at one minute.
    pub fn wait_limit(&self, info: &RequestInfo, long_running: bool) -> Nanos {
        let deadline = match info.query.timeout {
            Some(t) if !long_running && t > 0 => t.min(self.config.request_timeout),
            _ => self.config.request_timeout,
        };
        (deadline / 4).clamp(0, MAX_WAIT_LIMIT)
    }

    pub fn level_keys(&self) -> Vec<String> {
        self.levels.iter().map(|l| l.key.to_string()).collect()
    }
}

/// A deterministic UUID-shaped identifier for a built-in object (SHA-256 of kind and name,
/// formatted as a version-5-style UUID).
pub fn synthetic_uid(kind: &str, name: &str) -> String {
    use sha2::{Digest as _, Sha256};
    let mut b: [u8; 32] = Sha256::digest(format!("apf-wasm/builtin/{kind}/{name}")).into();
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().take(16).map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}
