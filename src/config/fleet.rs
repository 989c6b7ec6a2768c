//! The `fleet` object of the plugin configuration: where the fleet's etcd is and how often the
//! replicas sync.
//!
//! ```json
//! "fleet": { "etcd": { "cluster": "etcd", "authority": "etcd.example", "prefix": "/apf-wasm/",
//!                      "username": "apf", "passwordEnv": "FLEET_ETCD_PASSWORD" },
//!            "name": "default", "period": "1s", "leaseTtl": "5s", "maxReplicas": 3 }
//! ```
//! Only `etcd.cluster` is required. The password is `password` as written or the value of the
//! environment variable `passwordEnv` names, read when the configuration is parsed, as
//! `clusterPolicy.tokenEnv` (`policy::cluster::resolve_token`): it stays out of Envoy's
//! configuration (and its `/config_dump`). Every error names its field (`fleet.leaseTtl: ...`)
//! and every error found is reported, as for the rest of the configuration (`crate::config`).
//! The fleet's records live under `<prefix><name>/replicas/<replica-id>`.

use crate::duration::format_go_duration;
use crate::policy::cluster::{positive_duration, process_env, Env};
use crate::{Nanos, NANOS_PER_SEC};
use serde::Deserialize;
use serde_json::Value;

pub const DEFAULT_PREFIX: &str = "/apf-wasm/";
pub const DEFAULT_NAME: &str = "default";
pub const DEFAULT_PERIOD: Nanos = NANOS_PER_SEC;
pub const DEFAULT_LEASE_TTL: Nanos = 5 * NANOS_PER_SEC;

/// etcd's user name and password (token authentication through `/v3/auth/authenticate`).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// The Envoy cluster the calls go to (TLS is that cluster's business).
    pub cluster: String,
    /// `:authority` of the calls; the cluster name when not set.
    pub authority: String,
    /// Key prefix of everything apf-wasm stores; ends with `/`.
    pub prefix: String,
    pub credentials: Option<Credentials>,
}

/// The validated `fleet` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetConfig {
    pub etcd: EtcdConfig,
    /// The fleet's name: replicas with the same prefix and name share one limit.
    pub name: String,
    /// How often a replica publishes its demand, reads the fleet and renews its lease.
    pub period: Nanos,
    /// TTL of each replica's lease (whole seconds, at least 2 × period).
    pub lease_ttl: Nanos,
    /// The most replicas the fleet may run (the autoscaler's maximum, for instance): the static
    /// share a replica falls back to is the fleet CurrentCL ÷ max(the replicas it last saw,
    /// this), so that replicas started while it is cut off do not make the fleet overshoot by
    /// more than that share. `None`: the replicas it last saw.
    pub max_replicas: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    etcd: Option<Value>,
    name: Option<String>,
    period: Option<String>,
    lease_ttl: Option<String>,
    max_replicas: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcd {
    cluster: Option<String>,
    authority: Option<String>,
    prefix: Option<String>,
    username: Option<String>,
    password: Option<String>,
    #[serde(rename = "passwordEnv")]
    password_env: Option<String>,
}

impl FleetConfig {
    /// [`FleetConfig::parse`] with `passwordEnv` looked up in the process environment (in the
    /// filter: the Wasm VM's environment, fixed when Envoy starts).
    pub fn from_json(v: &Value) -> Result<FleetConfig, Vec<String>> {
        FleetConfig::parse(v, &process_env)
    }

    /// Parses and validates the value of the `fleet` key (`env`: where `passwordEnv` is looked
    /// up); errors are prefixed with the key path.
    pub fn parse(v: &Value, env: Env) -> Result<FleetConfig, Vec<String>> {
        let raw = Raw::deserialize(v).map_err(|e| vec![format!("fleet: {e}")])?;
        let mut errs = Vec::new();
        let etcd = match raw.etcd {
            None | Some(Value::Null) => {
                errs.push("fleet.etcd: Required value".to_string());
                None
            }
            Some(v) => parse_etcd(&v, env, &mut errs),
        };
        let name = raw.name.unwrap_or_else(|| DEFAULT_NAME.to_string());
        if name.is_empty() || name.contains('/') {
            errs.push(format!("fleet.name: must be non-empty and must not contain /, got {name:?}"));
        }
        let period = positive_duration("fleet.period", raw.period.as_deref(), DEFAULT_PERIOD, &mut errs);
        let lease_ttl = positive_duration("fleet.leaseTtl", raw.lease_ttl.as_deref(), DEFAULT_LEASE_TTL, &mut errs);
        if lease_ttl % NANOS_PER_SEC != 0 {
            errs.push(format!(
                "fleet.leaseTtl: must be a whole number of seconds (etcd lease TTLs are), got {}",
                format_go_duration(lease_ttl)
            ));
        }
        if lease_ttl < period.saturating_mul(2) {
            errs.push(format!(
                "fleet.leaseTtl: must be at least 2 × period ({}), got {}",
                format_go_duration(period.saturating_mul(2)),
                format_go_duration(lease_ttl)
            ));
        }
        let max_replicas = raw.max_replicas.as_ref().and_then(|v| parse_max_replicas(v, &mut errs));
        match etcd {
            Some(etcd) if errs.is_empty() => Ok(FleetConfig { etcd, name, period, lease_ttl, max_replicas }),
            _ => Err(errs),
        }
    }

    /// The prefix of every replica record: `<prefix><name>/replicas/`.
    pub fn replicas_prefix(&self) -> String {
        format!("{}{}/replicas/", self.etcd.prefix, self.name)
    }

    /// The key of one replica's record.
    pub fn replica_key(&self, replica_id: &str) -> String {
        format!("{}{replica_id}", self.replicas_prefix())
    }

    /// The lease TTL in whole seconds (as granted by etcd).
    pub fn lease_ttl_secs(&self) -> i64 {
        (self.lease_ttl / NANOS_PER_SEC).max(1)
    }
}

/// `maxReplicas`: an integer ≥ 1 (null: not set).
fn parse_max_replicas(v: &Value, errs: &mut Vec<String>) -> Option<u32> {
    if v.is_null() {
        return None;
    }
    match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
        Some(n) if n >= 1 => Some(n),
        _ => {
            errs.push(format!("fleet.maxReplicas: must be an integer from 1 to {}, got {v}", u32::MAX));
            None
        }
    }
}

fn parse_etcd(v: &Value, env: Env, errs: &mut Vec<String>) -> Option<EtcdConfig> {
    let raw = RawEtcd::deserialize(v).map_err(|e| errs.push(format!("fleet.etcd: {e}"))).ok()?;
    let cluster = raw.cluster.unwrap_or_default();
    if cluster.is_empty() {
        errs.push("fleet.etcd.cluster: Required value".to_string());
    }
    if raw.authority.as_deref() == Some("") {
        errs.push("fleet.etcd.authority: must not be empty (leave it out to use the cluster name)".to_string());
    }
    let prefix = raw.prefix.unwrap_or_else(|| DEFAULT_PREFIX.to_string());
    if !prefix.ends_with('/') {
        errs.push(format!("fleet.etcd.prefix: must end with /, got {prefix:?}"));
    }
    let credentials = credentials(raw.username, raw.password, raw.password_env, env, errs);
    let authority = raw.authority.unwrap_or_else(|| cluster.clone());
    Some(EtcdConfig { cluster, authority, prefix, credentials })
}

/// `username` with `password` or `passwordEnv` (one of the two), or none of the three.
fn credentials(
    username: Option<String>,
    password: Option<String>,
    password_env: Option<String>,
    env: Env,
    errs: &mut Vec<String>,
) -> Option<Credentials> {
    let which = if password_env.is_some() { "passwordEnv" } else { "password" };
    let set = password.is_some() || password_env.is_some();
    let password = resolve_password(password, password_env, env, errs);
    match username {
        Some(u) if u.is_empty() => errs.push("fleet.etcd.username: must not be empty".to_string()),
        Some(_) if !set => errs.push("fleet.etcd.password: Required value when username is set (or passwordEnv)".to_string()),
        Some(username) => return password.map(|password| Credentials { username, password }),
        None if set => errs.push(format!("fleet.etcd.username: Required value when {which} is set")),
        None => {}
    }
    None
}

/// The password: `password` as written, or the value of the environment variable `passwordEnv`
/// names, surrounding whitespace trimmed (a Secret file's trailing newline does no harm) — as
/// `policy::cluster::resolve_token` reads `tokenEnv`. Both set, or a variable unset or empty, is
/// an error naming the field. `None` when neither is set or on an error.
fn resolve_password(password: Option<String>, password_env: Option<String>, env: Env, errs: &mut Vec<String>) -> Option<String> {
    let name = match (password, password_env) {
        (Some(_), Some(_)) => {
            errs.push("fleet.etcd.passwordEnv: Forbidden: may not be set together with fleet.etcd.password".to_string());
            return None;
        }
        (Some(p), None) => return Some(p),
        (None, Some(name)) => name,
        (None, None) => return None,
    };
    let value = (!name.is_empty()).then(|| env(&name)).flatten();
    let value = value.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if value.is_none() {
        errs.push(format!("fleet.etcd.passwordEnv: Invalid value: {name:?}: the environment variable is unset or empty (Envoy: list it in vm_config.environment_variables.host_env_keys; Istio: WasmPlugin vmConfig.env)"));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults() {
        let c = FleetConfig::from_json(&json!({"etcd": {"cluster": "etcd"}})).unwrap();
        let etcd = EtcdConfig { cluster: "etcd".into(), authority: "etcd".into(), prefix: DEFAULT_PREFIX.into(), credentials: None };
        let defaults =
            FleetConfig { etcd, name: DEFAULT_NAME.into(), period: DEFAULT_PERIOD, lease_ttl: DEFAULT_LEASE_TTL, max_replicas: None };
        assert_eq!(c, defaults);
        assert_eq!(c.replica_key("gw-1"), "/apf-wasm/default/replicas/gw-1");
        assert_eq!(c.lease_ttl_secs(), 5);
    }

    #[test]
    fn errors_name_the_field() {
        let e = FleetConfig::from_json(&json!({"etcd": {"cluster": "etcd"}, "period": "3s"})).unwrap_err();
        assert_eq!(e, vec!["fleet.leaseTtl: must be at least 2 × period (6s), got 5s"]);
        let e = FleetConfig::from_json(&json!({"etcd": {"cluster": "etcd", "bogus": 1}})).unwrap_err();
        assert!(e[0].starts_with("fleet.etcd: unknown field `bogus`"), "{e:?}");
        for bad in [json!(0), json!(-1), json!(2.5), json!("3"), json!(5_000_000_000u64)] {
            let e = FleetConfig::from_json(&json!({"etcd": {"cluster": "etcd"}, "maxReplicas": bad})).unwrap_err();
            assert!(e[0].starts_with("fleet.maxReplicas: must be an integer from 1 to "), "{e:?}");
        }
        let c = FleetConfig::from_json(&json!({"etcd": {"cluster": "etcd"}, "maxReplicas": 3})).unwrap();
        assert_eq!(c.max_replicas, Some(3));
    }
}
