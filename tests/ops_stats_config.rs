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

/// One tag per label key; `le` (a bucket bound such as `0.005`, always the last pair) is the only
/// value that may contain a dot, so its regex is anchored at the end of the name.
#[test]
fn stats_config_tags_cover_every_label() {
    let y = expected();
    for k in apf_wasm::observe::metrics::LABEL_KEYS {
        assert_eq!(y.matches(&format!("  - tag_name: {k}\n")).count(), 1, "{k}");
    }
    let le = y.split("  - tag_name: le\n").nth(1).expect("le tag");
    assert!(le.trim_end().ends_with(r"(\.le\.([^.]+(?:\.[0-9]+)?))$'"), "{le}");
}

/// `observability/apf-wasm-rules.yaml` records upstream's `_sum` (seconds) of every seconds
/// histogram from the microsecond sum the filter exports instead, and nothing else.
#[test]
fn sum_recording_rules_cover_the_seconds_histograms() {
    use apf_wasm::observe::metrics::{sum_is_scaled, sum_series_name, MetricKind, METRICS, PREFIX};
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("observability").join("apf-wasm-rules.yaml");
    let text = std::fs::read_to_string(&path).expect("observability/apf-wasm-rules.yaml exists");
    let mut have: Vec<(String, String)> = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(l) = lines.next() {
        if let Some(record) = l.strip_prefix("- record: ") {
            let expr = lines.next().and_then(|e| e.strip_prefix("expr: ")).expect("expr after record");
            have.push((record.to_string(), expr.to_string()));
        }
    }
    let want: Vec<(String, String)> = METRICS
        .iter()
        .filter(|s| s.kind == MetricKind::Histogram && s.name.ends_with("_seconds"))
        .map(|s| {
            assert!(sum_is_scaled(s) && s.envoy_scale == 1e6, "{}", s.name);
            (format!("{PREFIX}{}_sum", s.name), format!("{PREFIX}{} / 1e6", sum_series_name(s)))
        })
        .collect();
    assert_eq!(have, want, "{}", path.display());
}
