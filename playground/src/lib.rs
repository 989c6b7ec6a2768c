//! The apf-wasm policy playground: the library core compiled for the browser with
//! `wasm-bindgen` (target `wasm32-unknown-unknown`). Nothing is re-implemented here: every
//! function parses its JSON input, calls the same code as the `apf` CLI and renders JSON.
//!
//! JavaScript sees four functions, each taking and returning JSON strings:
//! - [`validate`]`(config)` → `{ok, errors[], warnings[], levels[], flowSchemas[], summary}`
//! - [`classify`]`(config, request)` → the `apf classify` decision
//! - [`simulate`]`(scenario)` → the `apf simulate` result plus seats-per-client time series
//! - [`default_config`]`()` → the plugin configuration with Kubernetes' built-in objects
//! - [`default_scenario`]`()` → an example scenario with three clients
//!
//! `config` may be a whole plugin configuration (`{"serverConcurrencyLimit": …, "policy": […]}`)
//! or just the policy objects as `kubectl get flowschemas,prioritylevelconfigurations -o json`
//! prints them (a `List`, an array, or a single object); see [`normalize_config`].
//! The functions never panic and never throw: failures are `{"ok": false, "errors": [...]}`.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

use serde_json::{json, Map, Value};
use wasm_bindgen::prelude::wasm_bindgen;

use apf_wasm::policy::bootstrap;
use apf_wasm::config::{parse_plugin_config, PluginConfig};
use apf_wasm::policy::model::{Distinguisher, LimitResponse, PriorityLevelSpec};
use apf_wasm::policy::objects::{FlowSchemaObject, PriorityLevelObject, SubjectObject};

mod run;

pub use run::{classify_value, default_scenario_value, simulate_value};

/// API version the playground writes objects in.
const API_VERSION: &str = "flowcontrol.apiserver.k8s.io/v1";

fn error_value(errors: Vec<String>) -> Value {
    json!({ "ok": false, "errors": errors, "warnings": [] })
}

fn to_string(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| "{\"ok\":false,\"errors\":[\"serialization failed\"]}".into())
}

/// Whether a JSON value is policy objects rather than a plugin configuration: an array, a
/// `List` / `FlowSchemaList` / …, or a single FlowSchema / PriorityLevelConfiguration.
fn is_policy_objects(v: &Value) -> bool {
    match v {
        Value::Array(_) => true,
        Value::Object(m) => {
            let kind = m.get("kind").and_then(Value::as_str).unwrap_or("");
            kind.ends_with("List")
                || kind == "FlowSchema"
                || kind == "PriorityLevelConfiguration"
                || (m.contains_key("items") && !m.contains_key("policy"))
                || m.contains_key("apiVersion")
        }
        _ => false,
    }
}

/// Turns the editor text into plugin-configuration bytes: bare policy objects (a `kubectl get
/// … -o json` List, an array, one object) become `{"policy": <objects>}`; anything else is
/// passed through unchanged so `parse_plugin_config` reports its errors.
pub fn normalize_config(text: &str) -> Vec<u8> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) if is_policy_objects(&v) => {
            let mut m = Map::new();
            m.insert("policy".into(), v);
            serde_json::to_vec(&Value::Object(m)).unwrap_or_default()
        }
        _ => text.as_bytes().to_vec(),
    }
}

/// Parses the editor text as a plugin configuration (see [`normalize_config`]).
pub fn parse_config(text: &str) -> Result<PluginConfig, Vec<String>> {
    parse_plugin_config(&normalize_config(text))
}

fn distinguisher_str(d: Option<Distinguisher>) -> Value {
    match d {
        Some(Distinguisher::ByUser) => json!("ByUser"),
        Some(Distinguisher::ByNamespace) => json!("ByNamespace"),
        None => Value::Null,
    }
}

/// The effective policy of a valid configuration: levels with static limits (as `apf check`),
/// FlowSchemas in matching order.
pub fn describe_config(cfg: &PluginConfig) -> Value {
    let levels: Vec<Value> = cfg
        .policy
        .priority_levels
        .iter()
        .zip(cfg.limits.iter())
        .map(|(pl, lim)| {
            let (typ, response, borrowing_pct) = match &pl.spec {
                PriorityLevelSpec::Exempt { .. } => ("Exempt", Value::Null, Value::Null),
                PriorityLevelSpec::Limited { borrowing_limit_percent, limit_response, .. } => (
                    "Limited",
                    match limit_response {
                        LimitResponse::Queue(_) => json!("Queue"),
                        LimitResponse::Reject => json!("Reject"),
                    },
                    borrowing_limit_percent.map_or(Value::Null, |b| json!(b)),
                ),
            };
            let q = pl.queuing();
            json!({
                "name": pl.name,
                "type": typ,
                "limitResponse": response,
                "nominalConcurrencyShares": pl.nominal_concurrency_shares(),
                "lendablePercent": pl.lendable_percent(),
                "borrowingLimitPercent": borrowing_pct,
                "nominal": lim.nominal,
                "lendable": lim.lendable,
                "borrowing": lim.borrowing,
                "min": lim.min,
                "max": lim.max,
                "maxSeats": lim.max_seats,
                "queues": q.map(|q| q.queues),
                "handSize": q.map(|q| q.hand_size),
                "queueLengthLimit": q.map(|q| q.queue_length_limit),
                "enforced": cfg.is_enforced(&pl.name),
            })
        })
        .collect();
    let flow_schemas: Vec<Value> = cfg
        .policy
        .flow_schemas
        .iter()
        .map(|fs| {
            json!({
                "name": fs.name,
                "matchingPrecedence": fs.matching_precedence,
                "priorityLevel": fs.priority_level,
                "distinguisher": distinguisher_str(fs.distinguisher),
                "rules": fs.rules.len(),
            })
        })
        .collect();
    json!({
        "ok": true,
        "errors": [],
        "warnings": cfg.policy.warnings,
        "summary": cfg.describe(),
        "serverConcurrencyLimit": cfg.server_concurrency_limit,
        "nominalSum": cfg.nominal_cl_sum(),
        "levels": levels,
        "flowSchemas": flow_schemas,
    })
}

/// [`validate`] as a value.
pub fn validate_value(config: &str) -> Value {
    match parse_config(config) {
        Ok(cfg) => describe_config(&cfg),
        Err(errors) => error_value(errors),
    }
}

fn subject_json(s: &SubjectObject) -> Value {
    let mut m = Map::new();
    m.insert("kind".into(), json!(s.kind));
    if let Some(u) = &s.user {
        m.insert("user".into(), json!({ "name": u }));
    }
    if let Some(g) = &s.group {
        m.insert("group".into(), json!({ "name": g }));
    }
    if let Some(sa) = &s.service_account {
        m.insert("serviceAccount".into(), json!({ "namespace": sa.namespace, "name": sa.name }));
    }
    Value::Object(m)
}

/// A FlowSchema as `flowcontrol.apiserver.k8s.io/v1` JSON.
pub fn flow_schema_json(f: &FlowSchemaObject) -> Value {
    let rules: Vec<Value> = f
        .spec
        .rules
        .iter()
        .map(|r| {
            let mut m = Map::new();
            m.insert("subjects".into(), Value::Array(r.subjects.iter().map(subject_json).collect()));
            if !r.resource_rules.is_empty() {
                let rr: Vec<Value> = r
                    .resource_rules
                    .iter()
                    .map(|rr| {
                        let mut o = json!({
                            "verbs": rr.verbs,
                            "apiGroups": rr.api_groups,
                            "resources": rr.resources,
                        });
                        if let Value::Object(o) = &mut o {
                            if rr.cluster_scope {
                                o.insert("clusterScope".into(), json!(true));
                            }
                            if !rr.namespaces.is_empty() {
                                o.insert("namespaces".into(), json!(rr.namespaces));
                            }
                        }
                        o
                    })
                    .collect();
                m.insert("resourceRules".into(), Value::Array(rr));
            }
            if !r.non_resource_rules.is_empty() {
                let nr: Vec<Value> = r
                    .non_resource_rules
                    .iter()
                    .map(|n| json!({ "verbs": n.verbs, "nonResourceURLs": n.non_resource_urls }))
                    .collect();
                m.insert("nonResourceRules".into(), Value::Array(nr));
            }
            Value::Object(m)
        })
        .collect();
    let mut spec = Map::new();
    spec.insert("priorityLevelConfiguration".into(), json!({ "name": f.spec.priority_level_configuration }));
    spec.insert("matchingPrecedence".into(), json!(f.spec.matching_precedence));
    if let Some(d) = &f.spec.distinguisher_method {
        spec.insert("distinguisherMethod".into(), json!({ "type": d }));
    }
    spec.insert("rules".into(), Value::Array(rules));
    json!({
        "apiVersion": API_VERSION,
        "kind": "FlowSchema",
        "metadata": { "name": f.meta.name },
        "spec": Value::Object(spec),
    })
}

/// A PriorityLevelConfiguration as `flowcontrol.apiserver.k8s.io/v1` JSON.
pub fn priority_level_json(p: &PriorityLevelObject) -> Value {
    let mut spec = Map::new();
    spec.insert("type".into(), json!(p.spec.type_));
    if let Some(l) = &p.spec.limited {
        let mut lim = Map::new();
        lim.insert("nominalConcurrencyShares".into(), json!(l.nominal_concurrency_shares));
        lim.insert("lendablePercent".into(), json!(l.lendable_percent));
        if let Some(x) = l.borrowing_limit_percent {
            lim.insert("borrowingLimitPercent".into(), json!(x));
        }
        let mut lr = Map::new();
        lr.insert("type".into(), json!(l.limit_response.type_));
        if let Some(q) = &l.limit_response.queuing {
            lr.insert(
                "queuing".into(),
                json!({ "queues": q.queues, "handSize": q.hand_size, "queueLengthLimit": q.queue_length_limit }),
            );
        }
        lim.insert("limitResponse".into(), Value::Object(lr));
        spec.insert("limited".into(), Value::Object(lim));
    }
    if let Some(e) = &p.spec.exempt {
        spec.insert(
            "exempt".into(),
            json!({
                "nominalConcurrencyShares": e.nominal_concurrency_shares,
                "lendablePercent": e.lendable_percent
            }),
        );
    }
    json!({
        "apiVersion": API_VERSION,
        "kind": "PriorityLevelConfiguration",
        "metadata": { "name": p.meta.name },
        "spec": Value::Object(spec),
    })
}

/// [`default_config`] as a value: the default plugin configuration with Kubernetes' built-in
/// (mandatory + suggested) objects written out as a `List`, as `kubectl get` prints them.
pub fn default_config_value() -> Value {
    let mut items: Vec<Value> = Vec::new();
    let mut levels = bootstrap::mandatory_priority_levels();
    levels.extend(bootstrap::suggested_priority_levels());
    levels.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
    items.extend(levels.iter().map(priority_level_json));
    let mut schemas = bootstrap::mandatory_flow_schemas();
    schemas.extend(bootstrap::suggested_flow_schemas());
    schemas.sort_by(|a, b| {
        a.spec.matching_precedence.cmp(&b.spec.matching_precedence).then_with(|| a.meta.name.cmp(&b.meta.name))
    });
    items.extend(schemas.iter().map(flow_schema_json));
    let d = PluginConfig::default();
    json!({
        "serverConcurrencyLimit": d.server_concurrency_limit,
        "requestTimeout": apf_wasm::duration::format_go_duration(d.request_timeout),
        "suggestedDefaults": d.suggested_defaults,
        "requestMode": d.request_mode.as_str(),
        "enforce": d.enforce,
        "policy": { "apiVersion": "v1", "kind": "List", "items": items },
    })
}

/// Validates a plugin configuration (or bare policy objects) and describes the effective
/// policy: `{ok, errors[], warnings[], levels[], flowSchemas[], summary}`. Errors name the
/// object and the field (`policy: FlowSchema "x": spec.matchingPrecedence: Invalid value: …`).
#[wasm_bindgen]
pub fn validate(config: &str) -> String {
    to_string(&validate_value(config))
}

/// Classifies one request (`{"method","path","user","groups":[],"headers":{}}`) under a
/// configuration, returning the same JSON as `apf classify` (or `{ok:false, errors}`).
#[wasm_bindgen]
pub fn classify(config: &str, request: &str) -> String {
    to_string(&classify_value(config, request))
}

/// Runs a simulator scenario; the `apf simulate` result plus `series` (seats per client over time).
#[wasm_bindgen]
pub fn simulate(scenario: &str) -> String {
    to_string(&simulate_value(scenario))
}

/// The default plugin configuration with Kubernetes' built-in policy objects (pretty JSON,
/// settings first and `policy` last so the editor opens on the settings).
#[wasm_bindgen]
pub fn default_config() -> String {
    let v = default_config_value();
    let Value::Object(m) = &v else { return to_string(&v) };
    let mut keys: Vec<&String> = m.keys().filter(|k| k.as_str() != "policy").collect();
    keys.sort_by_key(|k| CONFIG_KEY_ORDER.iter().position(|o| o == k).unwrap_or(usize::MAX));
    let mut out = String::from("{\n");
    for k in keys.into_iter().chain(m.get_key_value("policy").map(|(k, _)| k)) {
        let val = m.get(k).map(to_string).unwrap_or_default().replace('\n', "\n  ");
        out.push_str(&format!("  {}: {val},\n", Value::String(k.clone())));
    }
    if out.ends_with(",\n") {
        out.truncate(out.len() - 2);
        out.push('\n');
    }
    out.push('}');
    out
}

const CONFIG_KEY_ORDER: [&str; 5] =
    ["serverConcurrencyLimit", "requestTimeout", "suggestedDefaults", "requestMode", "enforce"];

/// The example scenario the scenario editor is pre-filled with (pretty JSON).
#[wasm_bindgen]
pub fn default_scenario() -> String {
    to_string(&default_scenario_value())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_round_trips_to_the_default_policy() {
        let text = default_config();
        assert!(text.starts_with("{\n  \"serverConcurrencyLimit\": 600,\n"), "{text}");
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), default_config_value());
        let cfg = parse_config(&text).unwrap();
        let d = PluginConfig::default();
        assert_eq!(cfg.policy, d.policy);
        assert_eq!(cfg.limits, d.limits);
        // Without built-ins the objects alone still give the same policy.
        let mut v: Value = serde_json::from_str(&text).unwrap();
        v["suggestedDefaults"] = json!(false);
        let cfg = parse_plugin_config(v.to_string().as_bytes()).unwrap();
        assert_eq!(cfg.policy, d.policy);
    }

    #[test]
    fn validate_lists_levels_with_limits_and_flow_schemas_in_order() {
        let v = validate_value(&default_config());
        assert_eq!(v["ok"], json!(true));
        let levels = v["levels"].as_array().unwrap();
        let wl = levels.iter().find(|l| l["name"] == "workload-low").unwrap();
        assert_eq!((wl["nominal"].clone(), wl["lendable"].clone()), (json!(245), json!(221)));
        assert_eq!((wl["min"].clone(), wl["max"].clone(), wl["maxSeats"].clone()), (json!(24), json!(845), json!(37)));
        assert_eq!(wl["queues"], json!(128));
        let names: Vec<&str> = v["flowSchemas"].as_array().unwrap().iter().filter_map(|f| f["name"].as_str()).collect();
        assert_eq!(names.first(), Some(&"exempt"));
        assert_eq!(names.get(3), Some(&"system-node-high"));
        assert_eq!(names.last(), Some(&"catch-all"));
    }

    #[test]
    fn bare_kubectl_list_and_array_are_accepted() {
        let list = r#"{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"flowcontrol.apiserver.k8s.io/v1",
            "kind":"PriorityLevelConfiguration","metadata":{"name":"team"},
            "spec":{"type":"Limited","limited":{"nominalConcurrencyShares":50,"limitResponse":{"type":"Reject"}}}}]}"#;
        let v = validate_value(list);
        assert_eq!(v["ok"], json!(true), "{v}");
        assert!(v["levels"].as_array().unwrap().iter().any(|l| l["name"] == "team"));
        let arr = format!("[{}]", serde_json::from_str::<Value>(list).unwrap()["items"][0]);
        assert_eq!(validate_value(&arr)["ok"], json!(true));
        // An empty editor is the default configuration.
        assert_eq!(validate_value("")["ok"], json!(true));
    }

    #[test]
    fn errors_name_the_object_and_the_field() {
        let bad = r#"[{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{"name":"team-a"},
            "spec":{"priorityLevelConfiguration":{"name":"global-default"},"matchingPrecedence":20000,"rules":[]}}]"#;
        let v = validate_value(bad);
        assert_eq!(v["ok"], json!(false));
        let errs = v["errors"].as_array().unwrap();
        assert!(
            errs.iter().any(|e| {
                let e = e.as_str().unwrap_or("");
                e.contains("FlowSchema \"team-a\"") && e.contains("spec.matchingPrecedence")
            }),
            "{v}"
        );
        let v = validate_value("{not json");
        assert_eq!(v["ok"], json!(false));
        let v = validate_value(r#"{"serverConcurrencyLimt": 5}"#);
        assert!(v["errors"][0].as_str().unwrap().contains("serverConcurrencyLimt"));
    }
}
