//! The plugin configuration: the JSON document Envoy / Istio pass to the filter (and `apf check`
//! reads). Top-level keys are checked strictly — an unknown key is an error naming it, so a
//! typo cannot silently disable protection — and every error found is reported.
//!
//! ```json
//! { "serverConcurrencyLimit": 600, "requestTimeout": "60s", "suggestedDefaults": true,
//!   "requestMode": "kubernetes", "namespaceHeader": "x-tenant", "identity": {...},
//!   "workEstimator": {...}, "enforce": true, "dryRunPriorityLevels": [],
//!   "debugGroups": ["system:masters"], "explainGroups": [],
//!   "policy": [ FlowSchema / PriorityLevelConfiguration objects, or a List ] }
//! ```
//! `serverConcurrencyLimit` is upstream's `--max-requests-inflight + --max-mutating-requests-inflight`
//! (`pkg/server/config.go`, default 400 + 200 = 600); `requestTimeout` upstream's
//! `--request-timeout` (60 s, `pkg/server/config.go`).
//! Empty input is the same as `{}`: Kubernetes' built-in configuration at 600 seats.
use serde_json::{Map, Value};

use super::bootstrap;
use super::model::Policy;
use crate::digest::identity::IdentityConfig;
use crate::digest::work_estimate::WorkEstimatorConfig;
use crate::duration::{format_go_duration, parse_go_duration};
use crate::limits::static_limits::{compute_limits, LevelLimits};
use crate::{Nanos, NANOS_PER_SEC};

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
    pub cluster_policy: Option<super::cluster::ClusterPolicy>,
    /// Read LIST/WATCH object counts from the cluster's `/metrics` (`workEstimator.clusterMetrics`).
    pub cluster_metrics: Option<super::cluster::ClusterMetrics>,
    /// The longest a WATCH holds its seats while its initial state streams.
    pub watch_initial_events_max_hold: Nanos,
}

/// Default of `workEstimator.watchInitialEventsMaxHold`.
pub const DEFAULT_WATCH_INITIAL_EVENTS_MAX_HOLD: Nanos = 30 * NANOS_PER_SEC;

const KNOWN_KEYS: [&str; 13] = [
    "clusterPolicy",
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
];

impl Default for PluginConfig {
    fn default() -> Self {
        let policy = bootstrap::default_policy();
        let (limits, _) = compute_limits(DEFAULT_SERVER_CONCURRENCY_LIMIT, &policy.priority_levels);
        PluginConfig {
            server_concurrency_limit: DEFAULT_SERVER_CONCURRENCY_LIMIT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            suggested_defaults: true,
            request_mode: RequestMode::Kubernetes,
            namespace_header: None,
            identity: IdentityConfig::default(),
            work_estimator: WorkEstimatorConfig::default(),
            enforce: true,
            dry_run_priority_levels: Vec::new(),
            debug_groups: vec!["system:masters".to_string()],
            explain_groups: Vec::new(),
            policy,
            limits,
            cluster_policy: None,
            cluster_metrics: None,
            watch_initial_events_max_hold: DEFAULT_WATCH_INITIAL_EVENTS_MAX_HOLD,
        }
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

fn get_bool(m: &Map<String, Value>, key: &str, default: bool, errs: &mut Vec<String>) -> bool {
    match m.get(key) {
        None | Some(Value::Null) => default,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            errs.push(format!("{key}: expected a boolean, got {}", type_name(v)));
            default
        }
    }
}

fn get_string_list(m: &Map<String, Value>, key: &str, default: &[&str], errs: &mut Vec<String>) -> Vec<String> {
    match m.get(key) {
        None | Some(Value::Null) => default.iter().map(|s| s.to_string()).collect(),
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for (i, v) in a.iter().enumerate() {
                match v {
                    Value::String(s) => out.push(s.clone()),
                    other => errs.push(format!("{key}[{i}]: expected a string, got {}", type_name(other))),
                }
            }
            out
        }
        Some(v) => {
            errs.push(format!("{key}: expected an array of strings, got {}", type_name(v)));
            default.iter().map(|s| s.to_string()).collect()
        }
    }
}

fn is_header_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn deserialize<T: serde::de::DeserializeOwned + Default>(m: &Map<String, Value>, key: &str, errs: &mut Vec<String>) -> T {
    match m.get(key) {
        None | Some(Value::Null) => T::default(),
        Some(v) => match T::deserialize(v) {
            Ok(t) => t,
            Err(e) => {
                errs.push(format!("{key}: {e}"));
                T::default()
            }
        },
    }
}

/// Parses and validates the plugin configuration. Empty input = `{}`.
pub fn parse_plugin_config(bytes: &[u8]) -> Result<PluginConfig, Vec<String>> {
    let value: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Map::new())
    } else {
        serde_json::from_slice(bytes).map_err(|e| vec![format!("invalid JSON: {e}")])?
    };
    let Value::Object(m) = value else {
        return Err(vec![format!("configuration must be a JSON object, got {}", type_name(&value))]);
    };
    let mut errs: Vec<String> = Vec::new();
    for k in m.keys() {
        if !KNOWN_KEYS.contains(&k.as_str()) {
            errs.push(format!(
                "unknown configuration key {k:?} (known keys: {})",
                KNOWN_KEYS.join(", ")
            ));
        }
    }

    let server_concurrency_limit = match m.get("serverConcurrencyLimit") {
        None | Some(Value::Null) => DEFAULT_SERVER_CONCURRENCY_LIMIT,
        Some(Value::Number(n)) => match n.as_u64().map(u32::try_from) {
            Some(Ok(x)) if x >= 1 => x,
            _ => {
                errs.push(format!("serverConcurrencyLimit: must be an integer between 1 and {}, got {n}", u32::MAX));
                DEFAULT_SERVER_CONCURRENCY_LIMIT
            }
        },
        Some(v) => {
            errs.push(format!("serverConcurrencyLimit: expected an integer, got {}", type_name(v)));
            DEFAULT_SERVER_CONCURRENCY_LIMIT
        }
    };

    let request_timeout = match m.get("requestTimeout") {
        None | Some(Value::Null) => DEFAULT_REQUEST_TIMEOUT,
        Some(Value::String(s)) => match parse_go_duration(s) {
            Ok(d) if d > 0 => d,
            Ok(d) => {
                errs.push(format!("requestTimeout: must be positive, got {}", format_go_duration(d)));
                DEFAULT_REQUEST_TIMEOUT
            }
            Err(e) => {
                errs.push(format!("requestTimeout: {e}"));
                DEFAULT_REQUEST_TIMEOUT
            }
        },
        Some(v) => {
            errs.push(format!(
                "requestTimeout: expected a duration string such as \"60s\", got {}",
                type_name(v)
            ));
            DEFAULT_REQUEST_TIMEOUT
        }
    };

    let suggested_defaults = get_bool(&m, "suggestedDefaults", true, &mut errs);
    let enforce = get_bool(&m, "enforce", true, &mut errs);

    let request_mode = match m.get("requestMode") {
        None | Some(Value::Null) => RequestMode::Kubernetes,
        Some(Value::String(s)) if s == "kubernetes" => RequestMode::Kubernetes,
        Some(Value::String(s)) if s == "generic" => RequestMode::Generic,
        Some(Value::String(s)) => {
            errs.push(format!(
                "requestMode: Unsupported value: {s:?}: supported values: \"generic\", \"kubernetes\""
            ));
            RequestMode::Kubernetes
        }
        Some(v) => {
            errs.push(format!("requestMode: expected a string, got {}", type_name(v)));
            RequestMode::Kubernetes
        }
    };

    let namespace_header = match m.get("namespaceHeader") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if is_header_token(s) => Some(s.to_ascii_lowercase()),
        Some(Value::String(s)) => {
            errs.push(format!("namespaceHeader: {s:?} is not a valid HTTP header name"));
            None
        }
        Some(v) => {
            errs.push(format!("namespaceHeader: expected a string, got {}", type_name(v)));
            None
        }
    };

    let identity: IdentityConfig = deserialize(&m, "identity", &mut errs);
    let work_estimator: WorkEstimatorConfig = deserialize(&m, "workEstimator", &mut errs);
    errs.extend(identity.validate());
    errs.extend(work_estimator.validate());
    let dry_run_priority_levels = get_string_list(&m, "dryRunPriorityLevels", &[], &mut errs);
    let debug_groups = get_string_list(&m, "debugGroups", &["system:masters"], &mut errs);
    let explain_groups = get_string_list(&m, "explainGroups", &[], &mut errs);
    let cluster_policy = match m.get("clusterPolicy") {
        None | Some(Value::Null) => None,
        Some(v) => match super::cluster::ClusterPolicy::parse(v) {
            Ok(c) => Some(c),
            Err(e) => {
                errs.extend(e);
                None
            }
        },
    };

    let cluster_metrics = match super::cluster::ClusterMetrics::resolve(work_estimator.cluster_metrics.as_ref(), cluster_policy.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            errs.extend(e);
            None
        }
    };
    let watch_initial_events_max_hold = super::cluster::positive_duration(
        "workEstimator.watchInitialEventsMaxHold",
        work_estimator.watch_initial_events_max_hold.as_deref(),
        DEFAULT_WATCH_INITIAL_EVENTS_MAX_HOLD,
        &mut errs,
    );

    let policy_value = match m.get("policy") {
        None | Some(Value::Null) => Value::Array(Vec::new()),
        Some(v) => v.clone(),
    };
    let policy = match bootstrap::policy_from_value(&policy_value, suggested_defaults) {
        Ok(p) => Some(p),
        Err(e) => {
            errs.extend(e.into_iter().map(|s| format!("policy: {s}")));
            None
        }
    };

    if !errs.is_empty() {
        return Err(errs);
    }
    let mut policy = policy.unwrap_or_default();
    for name in &dry_run_priority_levels {
        if policy.level_index(name).is_none() {
            policy
                .warnings
                .push(format!("dryRunPriorityLevels: no priority level named {name:?} in the effective policy"));
        }
    }
    if namespace_header.is_some() && request_mode == RequestMode::Kubernetes {
        policy
            .warnings
            .push("namespaceHeader is only used when requestMode is \"generic\"".to_string());
    }
    let (limits, _) = compute_limits(server_concurrency_limit, &policy.priority_levels);
    Ok(PluginConfig {
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
