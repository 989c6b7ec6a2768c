//! The `fleet` configuration object: exact names, defaults, and errors that name the field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::fleet::config::{Credentials, FleetConfig};
use apf_wasm::NANOS_PER_SEC;
use serde_json::json;

fn errors(v: serde_json::Value) -> Vec<String> {
    FleetConfig::from_json(&v).unwrap_err()
}

#[test]
fn full_object() {
    let c = FleetConfig::from_json(&json!({
        "etcd": {"cluster": "etcd-tls", "authority": "etcd.example", "prefix": "/gw/", "username": "apf", "password": "s3cret"},
        "name": "edge", "period": "500ms", "leaseTtl": "3s"
    }))
    .unwrap();
    assert_eq!(c.etcd.cluster, "etcd-tls");
    assert_eq!(c.etcd.authority, "etcd.example");
    assert_eq!(c.etcd.prefix, "/gw/");
    assert_eq!(c.etcd.credentials, Some(Credentials { username: "apf".into(), password: "s3cret".into() }));
    assert_eq!((c.name.as_str(), c.period, c.lease_ttl), ("edge", NANOS_PER_SEC / 2, 3 * NANOS_PER_SEC));
    assert_eq!(c.replicas_prefix(), "/gw/edge/replicas/");
    assert_eq!(c.replica_key("gw-0"), "/gw/edge/replicas/gw-0");
    assert_eq!(c.lease_ttl_secs(), 3);
    assert!(!format!("{c:?}").contains("s3cret"), "the password is not printed");
}

#[test]
fn only_the_cluster_is_required() {
    let c = FleetConfig::from_json(&json!({"etcd": {"cluster": "etcd"}})).unwrap();
    assert_eq!(c.etcd.authority, "etcd", "authority defaults to the cluster");
    assert_eq!(c.etcd.prefix, "/apf-wasm/");
    assert_eq!(c.etcd.credentials, None);
    assert_eq!((c.name.as_str(), c.period, c.lease_ttl), ("default", NANOS_PER_SEC, 5 * NANOS_PER_SEC));
    assert_eq!(c.replicas_prefix(), "/apf-wasm/default/replicas/");
    assert_eq!(errors(json!({})), vec!["fleet.etcd: Required value"]);
    assert_eq!(errors(json!({"etcd": {}})), vec!["fleet.etcd.cluster: Required value"]);
    assert_eq!(errors(json!({"etcd": {"cluster": ""}})), vec!["fleet.etcd.cluster: Required value"]);
}

#[test]
fn unknown_fields_and_wrong_types_are_errors() {
    let e = errors(json!({"etcd": {"cluster": "e"}, "leaseTTL": "5s"}));
    assert!(e.len() == 1 && e[0].starts_with("fleet: unknown field `leaseTTL`"), "{e:?}");
    let e = errors(json!({"etcd": {"cluster": "e", "endpoints": ["x"]}}));
    assert!(e.len() == 1 && e[0].starts_with("fleet.etcd: unknown field `endpoints`"), "{e:?}");
    let e = errors(json!({"etcd": {"cluster": 1}}));
    assert!(e.len() == 1 && e[0].starts_with("fleet.etcd: invalid type"), "{e:?}");
    let e = errors(json!({"etcd": {"cluster": "e"}, "period": 1}));
    assert!(e.len() == 1 && e[0].starts_with("fleet: invalid type"), "{e:?}");
    let e = errors(json!("etcd"));
    assert!(e.len() == 1 && e[0].starts_with("fleet: invalid type"), "{e:?}");
}

#[test]
fn validation_errors_name_the_field() {
    let base = |extra: serde_json::Value| {
        let mut v = json!({"etcd": {"cluster": "e"}});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        errors(v)
    };
    assert_eq!(base(json!({"leaseTtl": "1s"})), vec!["fleet.leaseTtl: must be at least 2 × period (2s), got 1s"]);
    assert_eq!(
        base(json!({"leaseTtl": "5500ms"})),
        vec!["fleet.leaseTtl: must be a whole number of seconds (etcd lease TTLs are), got 5.5s"]
    );
    assert_eq!(base(json!({"period": "0s"})), vec!["fleet.period: must be positive"]);
    assert_eq!(base(json!({"period": "soon"})), vec!["fleet.period: time: invalid duration \"soon\""]);
    assert_eq!(base(json!({"leaseTtl": "-5s"})), vec!["fleet.leaseTtl: must be positive"]);
    assert_eq!(base(json!({"name": ""})), vec!["fleet.name: must be non-empty and must not contain /, got \"\""]);
    assert_eq!(base(json!({"name": "a/b"})), vec!["fleet.name: must be non-empty and must not contain /, got \"a/b\""]);
    let with_etcd = |etcd: serde_json::Value| errors(json!({ "etcd": etcd }));
    assert_eq!(with_etcd(json!({"cluster": "e", "prefix": "/x"})), vec!["fleet.etcd.prefix: must end with /, got \"/x\""]);
    assert_eq!(
        with_etcd(json!({"cluster": "e", "username": "u"})),
        vec!["fleet.etcd.password: Required value when username is set (or passwordEnv)"]
    );
    assert_eq!(with_etcd(json!({"cluster": "e", "password": "p"})), vec!["fleet.etcd.username: Required value when password is set"]);
    assert_eq!(with_etcd(json!({"cluster": "e", "username": "", "password": "p"})), vec!["fleet.etcd.username: must not be empty"]);
    assert_eq!(
        with_etcd(json!({"cluster": "e", "authority": ""})),
        vec!["fleet.etcd.authority: must not be empty (leave it out to use the cluster name)"]
    );
    // Every error is reported at once.
    let e = errors(json!({"etcd": {"cluster": "", "prefix": "p"}, "name": "", "period": "3s"}));
    assert_eq!(e.len(), 4, "{e:?}");
}

#[test]
fn max_replicas() {
    let c = FleetConfig::from_json(&json!({"etcd": {"cluster": "e"}, "maxReplicas": 12})).unwrap();
    assert_eq!(c.max_replicas, Some(12));
    assert_eq!(FleetConfig::from_json(&json!({"etcd": {"cluster": "e"}})).unwrap().max_replicas, None);
    assert_eq!(FleetConfig::from_json(&json!({"etcd": {"cluster": "e"}, "maxReplicas": null})).unwrap().max_replicas, None);
    for bad in [json!(0), json!(-3), json!(1.5), json!("3"), json!(true), json!(4_294_967_296u64)] {
        assert_eq!(
            errors(json!({"etcd": {"cluster": "e"}, "maxReplicas": bad})),
            vec![format!("fleet.maxReplicas: must be an integer from 1 to 4294967295, got {bad}")]
        );
    }
    // Reported with the other errors.
    let e = errors(json!({"etcd": {"cluster": "e"}, "maxReplicas": 0, "name": ""}));
    assert_eq!(e.len(), 2, "{e:?}");
}

/// An environment of `pairs` (the filter's is the Wasm VM's, `host_env_keys`).
fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
}

fn etcd_with(etcd: serde_json::Value, env: &dyn Fn(&str) -> Option<String>) -> Result<FleetConfig, Vec<String>> {
    FleetConfig::parse(&json!({ "etcd": etcd }), env)
}

#[test]
fn password_env_reads_the_password_from_the_environment() {
    let env = env_of(&[("FLEET_ETCD_PASSWORD", "  0123abcd\n"), ("OTHER", "x")]);
    let c = etcd_with(json!({"cluster": "e", "username": "apf-gateway", "passwordEnv": "FLEET_ETCD_PASSWORD"}), &env).unwrap();
    let want = Credentials { username: "apf-gateway".into(), password: "0123abcd".into() };
    assert_eq!(c.etcd.credentials, Some(want), "surrounding whitespace trimmed");
    assert!(!format!("{c:?}").contains("0123abcd"), "the password is not printed");
    // A literal password does not look at the environment.
    let c = etcd_with(json!({"cluster": "e", "username": "u", "password": " p "}), &env_of(&[])).unwrap();
    assert_eq!(c.etcd.credentials, Some(Credentials { username: "u".into(), password: " p ".into() }));
}

#[test]
fn password_env_errors_name_the_field() {
    let env = env_of(&[("EMPTY", " \n"), ("PW", "secret")]);
    let unset = |name: &str| {
        vec![format!(
            "fleet.etcd.passwordEnv: Invalid value: {name:?}: the environment variable is unset or empty \
             (Envoy: list it in vm_config.environment_variables.host_env_keys; Istio: WasmPlugin vmConfig.env)"
        )]
    };
    for name in ["MISSING", "EMPTY", ""] {
        let e = etcd_with(json!({"cluster": "e", "username": "u", "passwordEnv": name}), &env).unwrap_err();
        assert_eq!(e, unset(name));
    }
    let e = etcd_with(json!({"cluster": "e", "username": "u", "password": "p", "passwordEnv": "PW"}), &env).unwrap_err();
    assert_eq!(e, vec!["fleet.etcd.passwordEnv: Forbidden: may not be set together with fleet.etcd.password"]);
    let e = etcd_with(json!({"cluster": "e", "passwordEnv": "PW"}), &env).unwrap_err();
    assert_eq!(e, vec!["fleet.etcd.username: Required value when passwordEnv is set"]);
    let e = etcd_with(json!({"cluster": "e", "username": "", "passwordEnv": "PW"}), &env).unwrap_err();
    assert_eq!(e, vec!["fleet.etcd.username: must not be empty"]);
    // Reported with the other errors, each once.
    let e = etcd_with(json!({"cluster": "", "passwordEnv": "MISSING"}), &env).unwrap_err();
    assert_eq!(e.len(), 3, "{e:?}");
    let e = etcd_with(json!({"cluster": "e", "username": "u", "passwordEnv": 1}), &env).unwrap_err();
    assert!(e.len() == 1 && e[0].starts_with("fleet.etcd: invalid type"), "{e:?}");
}

#[test]
fn password_env_through_the_plugin_configuration() {
    use apf_wasm::config::parse_plugin_config_with_env;
    let doc = br#"{"fleet": {"etcd": {"cluster": "etcd", "username": "apf-gateway", "passwordEnv": "FLEET_ETCD_PASSWORD"}}}"#;
    let env = env_of(&[("FLEET_ETCD_PASSWORD", "pw\n")]);
    let c = parse_plugin_config_with_env(doc, &env).unwrap();
    let creds = c.fleet.unwrap().etcd.credentials.unwrap();
    assert_eq!((creds.username.as_str(), creds.password.as_str()), ("apf-gateway", "pw"));
    let e = parse_plugin_config_with_env(doc, &env_of(&[])).unwrap_err();
    assert!(e.iter().any(|e| e.starts_with("fleet.etcd.passwordEnv: Invalid value: \"FLEET_ETCD_PASSWORD\"")), "{e:?}");
}
