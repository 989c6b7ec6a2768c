#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The plugin configuration document.
use apf_wasm::config::{parse_plugin_config, PluginConfig, RequestMode};
use apf_wasm::NANOS_PER_SEC;

#[test]
fn empty_and_braces_are_the_default() {
    let d = PluginConfig::default();
    assert_eq!(parse_plugin_config(b"").unwrap(), d);
    assert_eq!(parse_plugin_config(b"  \n").unwrap(), d);
    assert_eq!(parse_plugin_config(b"{}").unwrap(), d);
    assert_eq!(d.server_concurrency_limit, 600);
    assert_eq!(d.request_timeout, 60 * NANOS_PER_SEC);
    assert!(d.suggested_defaults && d.enforce);
    assert_eq!(d.request_mode, RequestMode::Kubernetes);
    assert_eq!(d.namespace_header, None);
    assert_eq!(d.debug_groups, ["system:masters"]);
    assert!(d.explain_groups.is_empty() && d.dry_run_priority_levels.is_empty());
    assert_eq!(d.policy.priority_levels.len(), 8);
    assert_eq!(d.limits.len(), 8);
    assert_eq!(d.nominal_cl_sum(), 602);
}

#[test]
fn full_document() {
    let cfg = parse_plugin_config(
        br#"{
        "serverConcurrencyLimit": 100, "requestTimeout": "1m30s", "suggestedDefaults": false,
        "requestMode": "generic", "namespaceHeader": "X-Tenant", "identity": {}, "workEstimator": {},
        "enforce": false, "dryRunPriorityLevels": ["catch-all", "nope"], "debugGroups": [], "explainGroups": ["ops"],
        "policy": {"apiVersion": "v1", "kind": "List", "items": [
          {"apiVersion":"flowcontrol.apiserver.k8s.io/v1beta3","kind":"PriorityLevelConfiguration","metadata":{"name":"api"},
           "spec":{"type":"Limited","limited":{"nominalConcurrencyShares":95,"limitResponse":{"type":"Queue","queuing":{}}}}}]}
    }"#,
    )
    .unwrap();
    assert_eq!(cfg.server_concurrency_limit, 100);
    assert_eq!(cfg.request_timeout, 90 * NANOS_PER_SEC);
    assert_eq!(cfg.request_mode, RequestMode::Generic);
    assert_eq!(cfg.namespace_header.as_deref(), Some("x-tenant"));
    assert!(!cfg.enforce && !cfg.suggested_defaults);
    assert!(cfg.debug_groups.is_empty());
    assert_eq!(cfg.explain_groups, ["ops"]);
    let names: Vec<_> = cfg.policy.priority_levels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["api", "catch-all", "exempt"]);
    // shares 95 + 5 + 0 = 100 → NominalCL 95 / 5 / 0
    assert_eq!(cfg.limits.iter().map(|l| l.nominal).collect::<Vec<_>>(), [95, 5, 0]);
    assert_eq!(cfg.limits[0].max_seats, Some(11)); // min(ceil(14.25)=15, 95 div 8 = 11)
    assert!(cfg.policy.warnings.iter().any(|w| w.contains("\"nope\"")));
    assert!(!cfg.is_enforced("api"));
    assert!(cfg.describe().contains("serverConcurrencyLimit 100"));
}

#[test]
fn unknown_keys_and_wrong_types_all_reported() {
    let errs = parse_plugin_config(
        br#"{"serverConcurrencyLimt": 5, "enforce": "yes", "requestTimeout": 60,
        "requestMode": "grpc", "debugGroups": "admins", "explainGroups": [1], "suggestedDefaults": 1,
        "namespaceHeader": "bad header", "identity": 5, "workEstimator": {"bogus": 1}}"#,
    )
    .unwrap_err();
    for want in [
        "serverConcurrencyLimt",
        "enforce: expected a boolean",
        "requestTimeout: expected a duration string",
        "requestMode: Unsupported value: \"grpc\"",
        "debugGroups: expected an array",
        "explainGroups[0]: expected a string",
        "suggestedDefaults: expected a boolean",
        "namespaceHeader:",
        "identity: ",
        "workEstimator: ",
    ] {
        assert!(errs.iter().any(|e| e.contains(want)), "want {want:?} in {errs:#?}");
    }
    assert_eq!(errs.len(), 10, "{errs:#?}");
}

#[test]
fn server_concurrency_limit_bounds() {
    for bad in ["0", "-1", "1e30", "1099511627776", "4294967296", "2.5", "\"600\"", "[]"] {
        let doc = format!("{{\"serverConcurrencyLimit\": {bad}}}");
        let errs = parse_plugin_config(doc.as_bytes()).unwrap_err();
        assert!(errs[0].starts_with("serverConcurrencyLimit:"), "{bad}: {errs:?}");
    }
    assert_eq!(parse_plugin_config(b"{\"serverConcurrencyLimit\": 1}").unwrap().server_concurrency_limit, 1);
    let big = parse_plugin_config(b"{\"serverConcurrencyLimit\": 4294967295}").unwrap();
    assert_eq!(big.server_concurrency_limit, u32::MAX);
}

#[test]
fn request_timeout_must_be_positive_duration() {
    for bad in ["\"0s\"", "\"-5s\"", "\"abc\"", "\"\"", "\"10\""] {
        let doc = format!("{{\"requestTimeout\": {bad}}}");
        let errs = parse_plugin_config(doc.as_bytes()).unwrap_err();
        assert!(errs[0].starts_with("requestTimeout:"), "{bad}: {errs:?}");
    }
    assert_eq!(parse_plugin_config(br#"{"requestTimeout":"250ms"}"#).unwrap().request_timeout, 250_000_000);
}

#[test]
fn policy_errors_are_prefixed_and_combined() {
    let errs = parse_plugin_config(
        br#"{"enforce": 0, "policy": [{"apiVersion":"flowcontrol.apiserver.k8s.io/v1",
        "kind":"FlowSchema","metadata":{"name":"x"},"spec":{"matchingPrecedence":-1}}]}"#,
    )
    .unwrap_err();
    assert!(errs.iter().any(|e| e.starts_with("enforce:")));
    assert!(
        errs.iter()
            .any(|e| e.starts_with(r#"policy: FlowSchema "x": spec.matchingPrecedence: Invalid value: -1: must be a positive value"#)),
        "{errs:#?}"
    );
    assert!(
        errs.iter().any(|e| e.starts_with(r#"policy: FlowSchema "x": spec.priorityLevelConfiguration.name: Required value"#)),
        "{errs:#?}"
    );
}

#[test]
fn syntax_errors_and_junk() {
    let errs = parse_plugin_config(b"{\n  \"enforce\": true,\n  oops\n}").unwrap_err();
    assert_eq!(errs.len(), 1);
    assert!(errs[0].contains("line 3"), "{errs:?}");
    for junk in ["[]", "5", "\"x\"", "null", "{\"policy\": 5}", "{\"policy\": {\"kind\": \"Nope\"}}"] {
        assert!(parse_plugin_config(junk.as_bytes()).is_err(), "{junk}");
    }
    let deep = format!("{{\"policy\": {}", "[".repeat(10_000));
    assert!(parse_plugin_config(deep.as_bytes()).is_err());
    let _ = parse_plugin_config(&[0xff, 0xfe, 0x00]);
}

#[test]
fn kubectl_fixture_as_policy() {
    let fixture = std::fs::read_to_string("tests/fixtures/policy/kubectl-get-v1.json").unwrap();
    let doc = format!("{{\"serverConcurrencyLimit\": 1000, \"policy\": {fixture}}}");
    let cfg = parse_plugin_config(doc.as_bytes()).unwrap();
    assert_eq!(cfg.policy.priority_levels.len(), 10);
    assert_eq!(cfg.limits.len(), 10);
    assert_eq!(cfg.policy.warnings.len(), 1);
    // exempt now has 10 shares → a non-zero NominalCL
    let i = cfg.policy.level_index("exempt").unwrap();
    assert!(cfg.limits[i].nominal > 0);
}
