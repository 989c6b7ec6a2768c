//! `envoy/stats_config.yaml` is generated from `observe::metrics::envoy_stats_config_yaml()`
//! (the Envoy bootstrap `stats_config` that turns the filter's flat stat names into Prometheus
//! labels). The demo configurations and the e2e tests use the committed file; this test keeps it
//! in sync. Regenerate with
//! `cargo test --test ops_stats_config -- --ignored write_stats_config_yaml`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::observe::metrics::envoy_stats_config_yaml;
use std::path::PathBuf;

const HEADER: &str = "# GENERATED from apf_wasm::observe::metrics::envoy_stats_config_yaml(); do not edit.\n\
# Regenerate: cargo test --test ops_stats_config -- --ignored write_stats_config_yaml\n\
# Merge it into an Envoy bootstrap, e.g. envoy -c envoy.yaml --config-yaml \"$(cat envoy/stats_config.yaml)\"\n";

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("envoy").join("stats_config.yaml")
}

fn expected() -> String {
    format!("{HEADER}{}", envoy_stats_config_yaml())
}

#[test]
fn stats_config_yaml_is_current() {
    let have = std::fs::read_to_string(path()).expect("envoy/stats_config.yaml exists");
    assert_eq!(
        have,
        expected(),
        "envoy/stats_config.yaml is stale: cargo test --test ops_stats_config -- --ignored write_stats_config_yaml"
    );
}

#[test]
#[ignore = "writes envoy/stats_config.yaml"]
fn write_stats_config_yaml() {
    std::fs::write(path(), expected()).unwrap();
}
