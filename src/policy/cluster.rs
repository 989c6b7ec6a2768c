//! Policy from the cluster: the gateway periodically reads the protected kube-apiserver's own
//! FlowSchemas and PriorityLevelConfigurations (through an Envoy cluster) and enforces them, so it
//! applies exactly the cluster's policy. This module holds the configuration and the pure merge
//! step; the filter does the HTTP calls.
//!
//! ```json
//! "clusterPolicy": { "cluster": "kube-apiserver", "authority": "kubernetes.default.svc",
//!                    "tokenEnv": "APF_WASM_TOKEN", "period": "30s", "timeout": "5s" }
//! ```
//! Objects fetched from the cluster form the `policy`; objects in the configuration's own
//! `policy` are added and win over fetched objects of the same kind and name.
//!
//! The bearer token is `token` (in the configuration) or read from the environment variable
//! `tokenEnv` names when the configuration is parsed (see [`resolve_token`]).
//!
//! Without `pathPrefix`, the version of `flowcontrol.apiserver.k8s.io` to read is discovered
//! from the cluster ([`super::discovery`]); `pathPrefix` names the lists' location outright.

use super::error::ResponseError;
use crate::duration::parse_go_duration;
use crate::Nanos;
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPolicy {
    /// Envoy cluster name to call.
    pub cluster: String,
    /// `:authority` of the calls.
    pub authority: String,
    /// Bearer token (a ServiceAccount token allowed to list flowcontrol objects).
    pub token: Option<String>,
    pub period: Nanos,
    pub timeout: Nanos,
    /// Where the lists are (`<pathPrefix>/flowschemas`); `None`: discover the served version.
    pub path_prefix: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    cluster: String,
    authority: Option<String>,
    token: Option<String>,
    token_env: Option<String>,
    period: Option<String>,
    timeout: Option<String>,
    path_prefix: Option<String>,
}

/// Looks up an environment variable (`std::env::var` in the filter and the CLI; a table in tests).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment. In the Wasm module (wasm32-wasip1) this is the WASI environment
/// Envoy gives the VM: only the variables `vm_config.environment_variables` names
/// (`host_env_keys` copies them from Envoy's own environment; Istio's `WasmPlugin.vmConfig.env`).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The bearer token of `key` (`clusterPolicy`, `workEstimator.clusterMetrics`): `token` as
/// written, or the value of the environment variable `tokenEnv` names (surrounding whitespace
/// trimmed, so a Secret file's trailing newline does no harm). At most one of the two; neither
/// is `None` (no `Authorization` header). A variable that is unset or empty, or a token with a
/// control character (it travels as a header value), is an error naming the field.
pub fn resolve_token(key: &str, token: Option<String>, token_env: Option<String>, env: Env, errs: &mut Vec<String>) -> Option<String> {
    let (value, field) = match (token, token_env) {
        (Some(_), Some(_)) => {
            errs.push(format!("{key}.tokenEnv: Forbidden: may not be set together with {key}.token"));
            return None;
        }
        (Some(t), None) => (t, "token"),
        (None, Some(name)) => {
            let value = (!name.is_empty()).then(|| env(&name)).flatten();
            match value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty()) {
                Some(v) => (v, "tokenEnv"),
                None => {
                    errs.push(format!("{key}.tokenEnv: Invalid value: {name:?}: the environment variable is unset or empty (Envoy: list it in vm_config.environment_variables.host_env_keys; Istio: WasmPlugin vmConfig.env)"));
                    return None;
                }
            }
        }
        (None, None) => return None,
    };
    if value.bytes().any(|b| b.is_ascii_control()) {
        errs.push(format!("{key}.{field}: Invalid value: the token contains a control character"));
        return None;
    }
    Some(value)
}

/// A positive Go duration under `key` (an error naming the key otherwise), `default` if absent.
pub fn positive_duration(key: &str, s: Option<&str>, default: Nanos, errs: &mut Vec<String>) -> Nanos {
    let positive = |d: Nanos| (d > 0).then_some(d).ok_or_else(|| "must be positive".to_string());
    let d = s.map(|s| parse_go_duration(s).map_err(|e| e.to_string()).and_then(positive)).transpose();
    d.map_err(|e| errs.push(format!("{key}: {e}"))).ok().flatten().unwrap_or(default)
}

impl ClusterPolicy {
    /// Parses the `clusterPolicy` value (`env`: where `tokenEnv` is looked up); errors are
    /// prefixed with the key path.
    pub fn parse(v: &Value, env: Env) -> Result<ClusterPolicy, Vec<String>> {
        let raw = Raw::deserialize(v).map_err(|e| vec![format!("clusterPolicy: {e}")])?;
        let mut errs = Vec::new();
        let token = resolve_token("clusterPolicy", raw.token, raw.token_env, env, &mut errs);
        let period = positive_duration("clusterPolicy.period", raw.period.as_deref(), 30 * crate::NANOS_PER_SEC, &mut errs);
        let timeout = positive_duration("clusterPolicy.timeout", raw.timeout.as_deref(), 5 * crate::NANOS_PER_SEC, &mut errs);
        if raw.cluster.is_empty() {
            errs.push("clusterPolicy.cluster: Required value".to_string());
        }
        if raw.path_prefix.as_ref().is_some_and(|p| !p.starts_with('/')) {
            errs.push("clusterPolicy.pathPrefix: must start with /".to_string());
        }
        let policy = ClusterPolicy {
            cluster: raw.cluster,
            authority: raw.authority.unwrap_or_else(|| "kubernetes.default.svc".to_string()),
            token,
            period,
            timeout,
            path_prefix: raw.path_prefix.map(|p| p.trim_end_matches('/').to_string()),
        };
        errs.is_empty().then_some(policy).ok_or(errs)
    }

    /// The two list paths under `prefix` (`pathPrefix` or the discovered version's).
    pub fn paths(prefix: &str) -> [String; 2] {
        [format!("{prefix}/flowschemas"), format!("{prefix}/prioritylevelconfigurations")]
    }
}

/// Where the work estimator's object counts and sizes come from: the protected kube-apiserver's
/// own `/metrics` (`apiserver_resource_objects`, `apiserver_resource_size_estimate_bytes`,
/// `apiserver_storage_objects`), polled through an Envoy cluster by one worker for all.
///
/// ```json
/// "workEstimator": {"clusterMetrics": {"cluster": "kube-apiserver", "tokenEnv": "APF_WASM_TOKEN",
///                   "path": "/metrics", "period": "60s", "timeout": "10s", "staleAfter": "3m"}}
/// ```
/// `token` or `tokenEnv` as for `clusterPolicy` ([`resolve_token`]). With `clusterPolicy` set,
/// `cluster`, `authority` and the token default to its values and the polling is on unless
/// `"clusterMetrics": false`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMetrics {
    pub cluster: String,
    pub authority: String,
    pub token: Option<String>,
    pub path: String,
    pub period: Nanos,
    pub timeout: Nanos,
    /// Upstream's `staleTolerationThreshold` (`object_count_tracker.go`): 3 minutes.
    pub stale_after: Nanos,
}

pub const DEFAULT_METRICS_PERIOD: Nanos = 60 * crate::NANOS_PER_SEC;
pub const DEFAULT_METRICS_TIMEOUT: Nanos = 10 * crate::NANOS_PER_SEC;
pub const DEFAULT_STALE_AFTER: Nanos = 180 * crate::NANOS_PER_SEC;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMetrics {
    cluster: Option<String>,
    authority: Option<String>,
    token: Option<String>,
    token_env: Option<String>,
    path: Option<String>,
    period: Option<String>,
    timeout: Option<String>,
    stale_after: Option<String>,
}

impl ClusterMetrics {
    /// Resolves `workEstimator.clusterMetrics` (`v`: absent, `false`, `true` or an object) with
    /// `clusterPolicy`'s connection as the default (`env`: where `tokenEnv` is looked up).
    pub fn resolve(v: Option<&Value>, policy: Option<&ClusterPolicy>, env: Env) -> Result<Option<ClusterMetrics>, Vec<String>> {
        const KEY: &str = "workEstimator.clusterMetrics";
        let raw = match v {
            None | Some(Value::Null) | Some(Value::Bool(true)) => RawMetrics::default(),
            Some(Value::Bool(false)) => return Ok(None),
            Some(v @ Value::Object(_)) => RawMetrics::deserialize(v).map_err(|e| vec![format!("{KEY}: {e}")])?,
            Some(_) => return Err(vec![format!("{KEY}: expected an object or a boolean")]),
        };
        let explicit = matches!(v, Some(Value::Object(_)) | Some(Value::Bool(true)));
        let cluster = match (raw.cluster, policy) {
            (Some(c), _) => c,
            (None, Some(p)) => p.cluster.clone(),
            (None, None) if explicit => return Err(vec![format!("{KEY}.cluster: Required value (or set clusterPolicy)")]),
            (None, None) => return Ok(None),
        };
        let mut errs = Vec::new();
        if cluster.is_empty() {
            errs.push(format!("{KEY}.cluster: Required value"));
        }
        let path = raw.path.unwrap_or_else(|| "/metrics".to_string());
        if !path.starts_with('/') {
            errs.push(format!("{KEY}.path: must start with /"));
        }
        let period = positive_duration(&format!("{KEY}.period"), raw.period.as_deref(), DEFAULT_METRICS_PERIOD, &mut errs);
        let timeout = positive_duration(&format!("{KEY}.timeout"), raw.timeout.as_deref(), DEFAULT_METRICS_TIMEOUT, &mut errs);
        let stale_after = positive_duration(&format!("{KEY}.staleAfter"), raw.stale_after.as_deref(), DEFAULT_STALE_AFTER, &mut errs);
        let own_token = raw.token.is_some() || raw.token_env.is_some();
        let token = resolve_token(KEY, raw.token, raw.token_env, env, &mut errs);
        let metrics = ClusterMetrics {
            cluster,
            authority: raw
                .authority
                .or_else(|| policy.map(|p| p.authority.clone()))
                .unwrap_or_else(|| "kubernetes.default.svc".to_string()),
            token: if own_token { token } else { policy.and_then(|p| p.token.clone()) },
            path,
            period,
            timeout,
            stale_after,
        };
        errs.is_empty().then_some(Some(metrics)).ok_or(errs)
    }
}

fn key_of(o: &Value) -> Option<(&str, &str)> {
    Some((o.get("kind")?.as_str()?, o.get("metadata")?.get("name")?.as_str()?))
}

/// Items of an API list response; API servers omit `kind`/`apiVersion` on list items, so they
/// are filled in from the list (`FlowSchemaList` → `FlowSchema`).
fn list_items(list: &Value) -> Result<Vec<Value>, ResponseError> {
    let kind = list.get("kind").and_then(Value::as_str).unwrap_or("");
    let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
    let api_version = list.get("apiVersion").and_then(Value::as_str).unwrap_or("flowcontrol.apiserver.k8s.io/v1");
    let items =
        list.get("items").and_then(Value::as_array).ok_or_else(|| ResponseError::policy_list(format!("{kind:?} response has no items")))?;
    let mut items = items.clone();
    for m in items.iter_mut().filter_map(Value::as_object_mut) {
        if let Some(k) = item_kind {
            m.entry("kind").or_insert_with(|| k.into());
        }
        m.entry("apiVersion").or_insert_with(|| api_version.into());
    }
    Ok(items)
}

/// What of a fetched object the gateway uses: `kind`, `apiVersion`, the name, UID, namespace
/// and annotations, the `spec`, and the types of the status conditions (validated as upstream
/// does). What a live apiserver changes on every read — `resourceVersion`, `managedFields`,
/// `generation`, the conditions' status, reason and times — is dropped, so that re-reading an
/// unchanged policy gives the same bytes.
fn meaning_of(item: &Value) -> Value {
    let mut out = Map::new();
    for k in ["apiVersion", "kind", "spec"] {
        if let Some(v) = item.get(k) {
            out.insert(k.to_string(), v.clone());
        }
    }
    if let Some(m) = item.get("metadata").and_then(Value::as_object) {
        let kept = ["name", "uid", "namespace", "annotations"].into_iter().filter_map(|k| Some((k.to_string(), m.get(k)?.clone())));
        out.insert("metadata".to_string(), Value::Object(kept.collect()));
    }
    if let Some(c) = item.get("status").and_then(|s| s.get("conditions")).and_then(Value::as_array) {
        let types = c.iter().map(|c| serde_json::json!({"type": c.get("type").cloned().unwrap_or(Value::Null)})).collect();
        out.insert("status".to_string(), serde_json::json!({"conditions": Value::Array(types)}));
    }
    Value::Object(out)
}

/// Builds the plugin configuration to apply: `base` (the configuration document) with its
/// `policy` replaced by the fetched objects plus the base's own objects (which win on
/// kind+name), and without `clusterPolicy`'s effect on parsing changed. The fetched objects
/// are reduced to what the gateway uses ([`meaning_of`]) and sorted by kind and name: the
/// result is the same for two reads of one policy, whatever the order of the lists' items and
/// whatever moved in their metadata and status (the caller compares it to skip re-applying).
pub fn merged_config(base: &Value, lists: &[&[u8]]) -> Result<Vec<u8>, ResponseError> {
    let mut fetched = Vec::new();
    for body in lists {
        let v: Value = serde_json::from_slice(body).map_err(|e| ResponseError::policy_list(format!("cluster policy response: {e}")))?;
        fetched.extend(list_items(&v)?.iter().map(meaning_of));
    }
    fetched.sort_by(|a, b| key_of(a).cmp(&key_of(b)));
    let mut obj: Map<String, Value> = base.as_object().cloned().unwrap_or_default();
    let local: Vec<Value> = match obj.get("policy") {
        Some(Value::Array(a)) => a.clone(),
        Some(v @ Value::Object(_)) if v.get("items").is_some() => list_items(v).unwrap_or_default(),
        Some(v @ Value::Object(_)) => vec![v.clone()],
        _ => Vec::new(),
    };
    let local_keys: Vec<_> = local.iter().filter_map(key_of).collect();
    let mut policy: Vec<Value> = fetched.into_iter().filter(|o| key_of(o).is_none_or(|k| !local_keys.contains(&k))).collect();
    policy.extend(local);
    obj.insert("policy".to_string(), Value::Array(policy));
    serde_json::to_vec(&Value::Object(obj)).map_err(|e| ResponseError::policy_list(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_plugin_config;

    #[test]
    fn parses_and_validates() {
        let none = |_: &str| None;
        let c = ClusterPolicy::parse(&serde_json::json!({"cluster": "kube", "period": "10s"}), &none).unwrap();
        assert_eq!(c.period, 10 * crate::NANOS_PER_SEC);
        assert_eq!(c.path_prefix, None, "discovered");
        let c =
            ClusterPolicy::parse(&serde_json::json!({"cluster": "k", "pathPrefix": "/apis/flowcontrol.apiserver.k8s.io/v1beta3/"}), &none);
        assert_eq!(c.unwrap().path_prefix.as_deref(), Some("/apis/flowcontrol.apiserver.k8s.io/v1beta3"));
        assert_eq!(ClusterPolicy::paths("/p")[1], "/p/prioritylevelconfigurations");
        assert!(ClusterPolicy::parse(&serde_json::json!({"cluster": "k", "pathPrefix": "apis"}), &none).is_err());
        assert!(ClusterPolicy::parse(&serde_json::json!({"cluster": ""}), &none).is_err());
        assert!(ClusterPolicy::parse(&serde_json::json!({"cluster": "k", "bogus": 1}), &none).is_err());
        assert!(ClusterPolicy::parse(&serde_json::json!({"cluster": "k", "period": "-1s"}), &none).is_err());
    }

    #[test]
    fn merges_api_lists_with_local_objects() {
        let fs_list = br#"{"kind":"FlowSchemaList","apiVersion":"flowcontrol.apiserver.k8s.io/v1","items":[
            {"metadata":{"name":"team-a","uid":"u-fs-a"},"spec":{"priorityLevelConfiguration":{"name":"team"},"matchingPrecedence":500,
             "rules":[{"subjects":[{"kind":"Group","group":{"name":"team-a"}}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}}]}"#;
        let pl_list = br#"{"kind":"PriorityLevelConfigurationList","apiVersion":"flowcontrol.apiserver.k8s.io/v1","items":[
            {"metadata":{"name":"team","uid":"u-pl-team"},"spec":{"type":"Limited","limited":{"nominalConcurrencyShares":10,
             "limitResponse":{"type":"Reject"}}}}]}"#;
        let base = serde_json::json!({"clusterPolicy": {"cluster": "kube"}, "policy": []});
        let merged = merged_config(&base, &[fs_list, pl_list]).unwrap();
        let cfg = parse_plugin_config(&merged).unwrap();
        assert!(cfg.policy.flow_schemas.iter().any(|f| f.name == "team-a" && f.uid == "u-fs-a"));
        assert!(cfg.policy.priority_levels.iter().any(|p| p.name == "team" && p.uid == "u-pl-team"));
        // A local object of the same kind and name wins.
        let base = serde_json::json!({"policy": [{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration",
            "metadata":{"name":"team","uid":"local"},"spec":{"type":"Limited","limited":{"nominalConcurrencyShares":20,"limitResponse":{"type":"Reject"}}}}]});
        let cfg = parse_plugin_config(&merged_config(&base, &[fs_list, pl_list]).unwrap()).unwrap();
        assert!(cfg.policy.priority_levels.iter().any(|p| p.name == "team" && p.uid == "local"));
        assert!(merged_config(&base, &[b"not json"]).is_err());
    }
}
