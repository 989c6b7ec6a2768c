//! The plugin configuration: the JSON document Envoy / Istio pass to the filter (and `apf check`
//! reads). Top-level keys are checked strictly — an unknown key is an error naming it, so a
//! typo cannot silently disable protection — and every error found is reported.
//!
//! ```json
//! { "serverConcurrencyLimit": 600, "requestTimeout": "60s", "suggestedDefaults": true,
//!   "requestMode": "kubernetes", "namespaceHeader": "x-tenant", "identity": {...},
//!   "workEstimator": {...}, "enforce": true, "dryRunPriorityLevels": [],
//!   "debugGroups": ["system:masters"], "explainGroups": [],
//!   "watchLimits": {"perFlow": 100, "perLevel": {"workload-low": 500}},
//!   "policy": [ FlowSchema / PriorityLevelConfiguration objects, or a List ] }
//! ```
//! `serverConcurrencyLimit` is upstream's `--max-requests-inflight + --max-mutating-requests-inflight`
//! (`pkg/server/config.go`, default 400 + 200 = 600); `requestTimeout` upstream's
//! `--request-timeout` (60 s, `pkg/server/config.go`).
//! Empty input is the same as `{}`: Kubernetes' built-in configuration at 600 seats.
//!
//! The document gathers every part's configuration (the policy and its static limits, identity,
//! work estimator, the cluster's policy and counts, the fleet's `FleetConfig`), each parsed and
//! validated by its own module; the engine compiles the result and the fleet plans its levels
//! from it.

mod error;
pub mod fleet;
pub mod watch_limits;
use serde_json::{Map, Value};

use crate::digest::identity::IdentityConfig;
use crate::digest::work_estimate::WorkEstimatorConfig;
use crate::duration::{format_go_duration, parse_go_duration};
use crate::limits::static_limits::{compute_limits, LevelLimits};
use crate::policy::bootstrap;
use crate::policy::cluster::{self, ClusterMetrics, ClusterPolicy, Env};
use crate::policy::model::Policy;
use crate::{Nanos, NANOS_PER_SEC};
pub use error::ConfigError;
pub use watch_limits::WatchLimits;

pub const DEFAULT_SERVER_CONCURRENCY_LIMIT: u32 = 600;
pub const DEFAULT_REQUEST_TIMEOUT: Nanos = 60 * NANOS_PER_SEC;

/// How requests are turned into a RequestInfo.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RequestMode {
    /// Requests are Kubernetes API requests (paths parsed as kube-apiserver does).
    #[default]
    Kubernetes,
    /// Any HTTP API: every request is a non-resource request, optionally namespaced by a header.
    Generic,
}

impl RequestMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestMode::Kubernetes => "kubernetes",
            RequestMode::Generic => "generic",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    pub server_concurrency_limit: u32,
    pub request_timeout: Nanos,
    pub suggested_defaults: bool,
    pub request_mode: RequestMode,
    /// Lowercase header name (generic mode namespace source).
    pub namespace_header: Option<String>,
    pub identity: IdentityConfig,
    pub work_estimator: WorkEstimatorConfig,
    pub enforce: bool,
    pub dry_run_priority_levels: Vec<String>,
    pub debug_groups: Vec<String>,
    pub explain_groups: Vec<String>,
    pub policy: Policy,
    /// Static limits, same order as `policy.priority_levels`.
    pub limits: Vec<LevelLimits>,
    /// Read the policy from the protected cluster (`clusterPolicy`).
    pub cluster_policy: Option<ClusterPolicy>,
    /// Read LIST/WATCH object counts from the cluster's `/metrics` (`workEstimator.clusterMetrics`).
    pub cluster_metrics: Option<ClusterMetrics>,
    /// The longest a WATCH holds its seats while its initial state streams.
    pub watch_initial_events_max_hold: Nanos,
    /// Fleet mode: `serverConcurrencyLimit` is the limit of every replica together (`fleet`).
    pub fleet: Option<fleet::FleetConfig>,
    /// The most WATCHes a flow or a level may hold open on this process (`watchLimits`; off
    /// when empty).
    pub watch_limits: WatchLimits,
}

/// Default of `workEstimator.watchInitialEventsMaxHold`.
pub const DEFAULT_WATCH_INITIAL_EVENTS_MAX_HOLD: Nanos = 30 * NANOS_PER_SEC;

const KNOWN_KEYS: [&str; 15] = [
    "clusterPolicy",
    "fleet",
    "serverConcurrencyLimit",
    "requestTimeout",
    "suggestedDefaults",
    "requestMode",
    "namespaceHeader",
    "identity",
    "workEstimator",
    "enforce",
    "dryRunPriorityLevels",
    "debugGroups",
    "explainGroups",
    "policy",
    "watchLimits",
];

impl Default for PluginConfig {
    fn default() -> Self {
        from_map(&Map::new(), &|_| None).0
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn expected(what: &str, v: &Value) -> ConfigError {
    ConfigError::new(format!("expected {what}, got {}", type_name(v)))
}

/// `m[key]` converted by `conv`; `default` when absent or null, or (with an error) invalid.
fn field<T>(
    m: &Map<String, Value>,
    key: &str,
    default: T,
    errs: &mut ConfigErrors,
    conv: impl FnOnce(&Value) -> Result<T, ConfigError>,
) -> T {
    let value = m.get(key).filter(|v| !v.is_null()).map(conv).transpose();
    value.map_err(|e| errs.push(e.at(key).to_string())).ok().flatten().unwrap_or(default)
}

fn get_string_list(m: &Map<String, Value>, key: &str, default: &[&str], errs: &mut ConfigErrors) -> Vec<String> {
    let default = default.iter().map(|s| Value::String(s.to_string())).collect();
    let list = field(m, key, default, errs, |v| v.as_array().cloned().ok_or_else(|| expected("an array of strings", v)));
    let list = list.into_iter().enumerate();
    let (strings, others): (Vec<_>, Vec<_>) = list.partition(|(_, v)| v.is_string());
    errs.extend(others.iter().map(|(i, v)| expected("a string", v).at(&format!("{key}[{i}]")).to_string()));
    strings.into_iter().filter_map(|(_, v)| v.as_str().map(str::to_string)).collect()
}

fn is_header_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn deserialize<T: serde::de::DeserializeOwned + Default>(m: &Map<String, Value>, key: &str, errs: &mut ConfigErrors) -> T {
    field(m, key, T::default(), errs, |v| T::deserialize(v).map_err(|e| ConfigError::new(e.to_string())))
}

/// Parses and validates the plugin configuration. Empty input = `{}`. A `tokenEnv` is read from
/// the process environment (in the filter: the Wasm VM's environment, fixed when Envoy starts).
pub fn parse_plugin_config(bytes: &[u8]) -> Result<PluginConfig, ConfigErrors> {
    parse_plugin_config_with_env(bytes, &cluster::process_env)
}

/// [`parse_plugin_config`] with `env` answering the `tokenEnv` and `passwordEnv` look-ups.
pub fn parse_plugin_config_with_env(bytes: &[u8], env: Env) -> Result<PluginConfig, ConfigErrors> {
    let value: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice(bytes).map_err(|e| vec![format!("invalid JSON: {e}")])?
    };
    let Value::Object(m) = value else {
        return Err(vec![format!("configuration must be a JSON object, got {}", type_name(&value))]);
    };
    let (config, errs) = from_map(&m, env);
    errs.is_empty().then_some(config).ok_or(errs)
}

/// Every error found in a configuration document, one message each (the document is refused
/// when there is any).
pub type ConfigErrors = Vec<String>;

/// The configuration of a document's top-level object and every error found (the
/// configuration is only meaningful without errors).
fn from_map(m: &Map<String, Value>, env: Env) -> (PluginConfig, ConfigErrors) {
    let mut errs = unknown_keys(m);
    let found = &mut errs;
    let server_concurrency_limit = field(m, "serverConcurrencyLimit", DEFAULT_SERVER_CONCURRENCY_LIMIT, found, positive_count);
    let request_timeout = field(m, "requestTimeout", DEFAULT_REQUEST_TIMEOUT, found, positive_timeout);
    let boolean = |v: &Value| v.as_bool().ok_or_else(|| expected("a boolean", v));
    let suggested_defaults = field(m, "suggestedDefaults", true, found, boolean);
    let enforce = field(m, "enforce", true, found, boolean);
    let request_mode = field(m, "requestMode", RequestMode::Kubernetes, found, request_mode);
    let namespace_header = field(m, "namespaceHeader", None, found, namespace_header);
    let identity: IdentityConfig = deserialize(m, "identity", found);
    let work_estimator: WorkEstimatorConfig = deserialize(m, "workEstimator", found);
    found.extend(identity.validate().iter().map(ToString::to_string));
    found.extend(work_estimator.validate().iter().map(ToString::to_string));
    let dry_run_priority_levels = get_string_list(m, "dryRunPriorityLevels", &[], found);
    let debug_groups = get_string_list(m, "debugGroups", &["system:masters"], found);
    let explain_groups = get_string_list(m, "explainGroups", &[], found);
    let Sources { fleet, cluster_policy, cluster_metrics } = sources(m, &work_estimator, env, found);
    let watch_initial_events_max_hold = cluster::positive_duration(
        "workEstimator.watchInitialEventsMaxHold",
        work_estimator.watch_initial_events_max_hold.as_deref(),
        DEFAULT_WATCH_INITIAL_EVENTS_MAX_HOLD,
        found,
    );
    let mut policy = policy_of(m, suggested_defaults, found);
    let missing = dry_run_priority_levels.iter().filter(|name| policy.level_index(name).is_none());
    let missing: Vec<_> =
        missing.map(|name| format!("dryRunPriorityLevels: no priority level named {name:?} in the effective policy")).collect();
    policy.warnings.extend(missing);
    let watch_limits = field(m, "watchLimits", WatchLimits::default(), found, watch_limits);
    let unknown = watch_limits.per_level.iter().filter(|(name, _)| policy.level_index(name).is_none());
    let unknown: Vec<_> =
        unknown.map(|(name, _)| format!("watchLimits.perLevel: no priority level named {name:?} in the effective policy")).collect();
    policy.warnings.extend(unknown);
    if namespace_header.is_some() && request_mode == RequestMode::Kubernetes {
        policy.warnings.push("namespaceHeader is only used when requestMode is \"generic\"".to_string());
    }
    let (limits, _) = compute_limits(server_concurrency_limit, &policy.priority_levels);
    let config = PluginConfig {
        server_concurrency_limit,
        request_timeout,
        suggested_defaults,
        request_mode,
        namespace_header,
        identity,
        work_estimator,
        enforce,
        dry_run_priority_levels,
        debug_groups,
        explain_groups,
        policy,
        limits,
        cluster_policy,
        cluster_metrics,
        watch_initial_events_max_hold,
        fleet,
        watch_limits,
    };
    (config, errs)
}

/// An error for every top-level key the configuration does not know.
fn unknown_keys(m: &Map<String, Value>) -> ConfigErrors {
    let unknown = m.keys().filter(|k| !KNOWN_KEYS.contains(&k.as_str()));
    unknown.map(|k| format!("unknown configuration key {k:?} (known keys: {})", KNOWN_KEYS.join(", "))).collect()
}

/// A count (`serverConcurrencyLimit`, a `watchLimits` limit): an integer from 1 to `u32::MAX`.
fn positive_count(v: &Value) -> Result<u32, ConfigError> {
    let n = v.as_number().ok_or_else(|| expected("an integer", v))?;
    match n.as_u64().map(u32::try_from) {
        Some(Ok(x)) if x >= 1 => Ok(x),
        _ => Err(ConfigError::new(format!("must be an integer between 1 and {}, got {n}", u32::MAX))),
    }
}

/// `requestTimeout`: a positive duration string.
fn positive_timeout(v: &Value) -> Result<Nanos, ConfigError> {
    let s = v.as_str().ok_or_else(|| expected("a duration string such as \"60s\"", v))?;
    match parse_go_duration(s).map_err(|e| ConfigError::new(e.to_string()))? {
        d if d > 0 => Ok(d),
        d => Err(ConfigError::new(format!("must be positive, got {}", format_go_duration(d)))),
    }
}

fn request_mode(v: &Value) -> Result<RequestMode, ConfigError> {
    match v.as_str() {
        Some("kubernetes") => Ok(RequestMode::Kubernetes),
        Some("generic") => Ok(RequestMode::Generic),
        Some(s) => Err(ConfigError::new(format!("Unsupported value: {s:?}: supported values: \"generic\", \"kubernetes\""))),
        None => Err(expected("a string", v)),
    }
}

/// `namespaceHeader`: an HTTP header name, kept lowercase.
fn namespace_header(v: &Value) -> Result<Option<String>, ConfigError> {
    match v.as_str() {
        Some(s) if is_header_token(s) => Ok(Some(s.to_ascii_lowercase())),
        Some(s) => Err(ConfigError::new(format!("{s:?} is not a valid HTTP header name"))),
        None => Err(expected("a string", v)),
    }
}

/// `watchLimits`: `{"perFlow": N, "perLevel": {"<level>": N, ...}}`, both optional; every
/// error names its field (`perFlow: ...`, `perLevel.<level>: ...`; the caller adds
/// `watchLimits: `). Levels missing from the policy are warned about by the caller (the
/// cluster's policy may bring them later), as `dryRunPriorityLevels` are.
fn watch_limits(v: &Value) -> Result<WatchLimits, ConfigError> {
    let m = v.as_object().ok_or_else(|| expected("an object with perFlow and/or perLevel", v))?;
    let mut errs = Vec::new();
    if let Some(k) = m.keys().find(|k| !["perFlow", "perLevel"].contains(&k.as_str())) {
        errs.push(format!("unknown key {k:?} (known keys: perFlow, perLevel)"));
    }
    let per_flow = m.get("perFlow").filter(|v| !v.is_null()).map(positive_count).transpose();
    let per_flow = per_flow.map_err(|e| errs.push(e.at("perFlow").to_string())).ok().flatten();
    let mut per_level = Vec::new();
    match m.get("perLevel").filter(|v| !v.is_null()) {
        None => {}
        Some(Value::Object(levels)) => {
            for (name, n) in levels {
                match positive_count(n) {
                    Ok(n) => per_level.push((name.clone(), n)),
                    Err(e) => errs.push(e.at(&format!("perLevel.{name}")).to_string()),
                }
            }
        }
        Some(other) => errs.push(expected("an object of priority level names to counts", other).at("perLevel").to_string()),
    }
    if errs.is_empty() {
        Ok(WatchLimits { per_flow, per_level })
    } else {
        Err(ConfigError::new(errs.join("; ")))
    }
}

/// What the filter reads from outside the document: the fleet's etcd, the cluster's policy and
/// its object counts.
struct Sources {
    fleet: Option<fleet::FleetConfig>,
    cluster_policy: Option<ClusterPolicy>,
    cluster_metrics: Option<ClusterMetrics>,
}

fn sources(m: &Map<String, Value>, work_estimator: &WorkEstimatorConfig, env: Env, errs: &mut ConfigErrors) -> Sources {
    let fleet = m.get("fleet").filter(|v| !v.is_null()).map(|v| fleet::FleetConfig::parse(v, env));
    let fleet = fleet.and_then(|f| f.map_err(|e| errs.extend(e)).ok());
    let cluster_policy = m.get("clusterPolicy").filter(|v| !v.is_null()).map(|v| ClusterPolicy::parse(v, env));
    let cluster_policy = cluster_policy.and_then(|c| c.map_err(|e| errs.extend(e)).ok());
    let metrics = work_estimator.cluster_metrics.as_ref();
    let cluster_metrics = ClusterMetrics::resolve(metrics, cluster_policy.as_ref(), env).unwrap_or_else(|e| {
        errs.extend(e);
        None
    });
    Sources { fleet, cluster_policy, cluster_metrics }
}

/// The effective policy of the document's `policy` objects (the built-in one on errors).
fn policy_of(m: &Map<String, Value>, suggested_defaults: bool, errs: &mut ConfigErrors) -> Policy {
    let no_objects = Value::Array(Vec::new());
    let policy_value = m.get("policy").filter(|v| !v.is_null()).unwrap_or(&no_objects);
    bootstrap::policy_from_value(policy_value, suggested_defaults).unwrap_or_else(|e| {
        errs.extend(e.into_iter().map(|s| format!("policy: {s}")));
        Policy::default()
    })
}

impl PluginConfig {
    /// Whether the named level is enforced (not dry-run and `enforce` is on).
    pub fn is_enforced(&self, level: &str) -> bool {
        self.enforce && !self.dry_run_priority_levels.iter().any(|l| l == level)
    }

    /// `nominalCLSum` (Σ NominalCL; may exceed `server_concurrency_limit` by rounding).
    pub fn nominal_cl_sum(&self) -> u32 {
        self.limits.iter().fold(0u32, |a, l| a.saturating_add(l.nominal))
    }

    /// A one-paragraph human summary.
    pub fn describe(&self) -> String {
        format!(
            "serverConcurrencyLimit {} (nominal sum {}), requestTimeout {}, requestMode {}, enforce {}, suggestedDefaults {}, {} priority levels, {} flow schemas, {} warnings",
            self.server_concurrency_limit,
            self.nominal_cl_sum(),
            format_go_duration(self.request_timeout),
            self.request_mode.as_str(),
            self.enforce,
            self.suggested_defaults,
            self.policy.priority_levels.len(),
            self.policy.flow_schemas.len(),
            self.policy.warnings.len()
        )
    }
}
