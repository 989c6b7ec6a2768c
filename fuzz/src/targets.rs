//! The fuzz targets, shared by the `cargo fuzz` binaries (`fuzz/fuzz_targets/*.rs`) and the
//! in-repo mutation fuzzer (`tests/fuzz_targets.rs`). Each takes arbitrary bytes, must never
//! panic, and asserts properties beyond "no panic" (a failed assertion is a finding). Each
//! returns whether the input was accepted as valid (the mutation fuzzer keeps accepted mutants).
//!
//! Input formats (seed corpora under `fuzz/corpus/<target>/`):
//! - `plugin_config`: the plugin configuration JSON.
//! - `request_info`: `METHOD SP path?query [LF namespace-header-value]`.
//! - `request_verb`: bytes choosing a method, a path and query parameters (see `verb_case`).
//! - `identity`: first line an `IdentityConfig` JSON (a fixed config with every source kind when
//!   it does not parse), then lines `@peer IP`, `@mtls`, `@subject SUBJECT`, `@jwt JSON` or
//!   `header-name: value` (raw bytes).
//! - `duration`: a Go duration string.
//! - `codec_reader`: a script of `Reader` operations (first byte of each step) over the rest.
//! - `state_*`: bytes as stored in the shared key-value store.
//! - `metrics_scan`: a kube-apiserver `/metrics` body; its first bytes also set the chunk sizes.
//! - `initial_events`: a watch response body, fed in pieces.
//! - `list_size`: a LIST response body, fed in pieces (learned costs).
//! - `state_object_counts`: the shared object counts value.
//! - `host_pairs`: a header map in the host's serialization (what `gateway::host::pairs` reads);
//!   the same bytes, read as lines `name:value`, also give a map to serialize and read back.

use apf_wasm::classify::Classifier;
use apf_wasm::codec::{Reader, Writer};
use apf_wasm::config::parse_plugin_config;
use apf_wasm::digest::identity::{identify, parse_subject, service_account_namespace, IdentityConfig, IdentityInput, UserInfo};
use apf_wasm::digest::initial_events::{MarkerScanner, INITIAL_EVENTS_END};
use apf_wasm::digest::metrics_scan::{scan_metrics, MetricsScanner};
use apf_wasm::digest::request_info::{parse_generic, parse_request_info, RequestInfo};
use apf_wasm::digest::work_estimate::{estimate, WatchTracker, WorkEstimatorConfig};
use apf_wasm::duration::{format_go_duration, parse_go_duration};
use apf_wasm::engine::workers::Registry;
use apf_wasm::engine::{BorrowState, LevelState, Notice};
use apf_wasm::fairqueuing::queueset::{Arrival, QueueSet};
use apf_wasm::fairqueuing::{QueueSetConfig, Receipt, RequestId, RequestTag, WorkEstimate};
use apf_wasm::limits::integrator::Integrator;
use apf_wasm::limits::retry_after::DroppedRequestsTracker;
use apf_wasm::policy::default_policy;
use apf_wasm::policy::model::Policy;
use apf_wasm::simulate::run_scenario;
use std::net::IpAddr;
use std::sync::OnceLock;

/// (name, target, dictionary, max input length).
pub type Entry = (&'static str, fn(&[u8]) -> bool, &'static [&'static [u8]], usize);

pub const TARGETS: &[Entry] = &[
    ("plugin_config", plugin_config, CONFIG_DICT, 64 * 1024),
    ("request_info", request_info, PATH_DICT, 8 * 1024),
    ("request_verb", request_verb, &[], 1024),
    ("identity", identity, IDENTITY_DICT, 8 * 1024),
    ("duration", duration, DURATION_DICT, 256),
    // fleet (etcd JSON API responses): see the fleet section at the end of this file.
    ("etcd_response", etcd_response, ETCD_DICT, 16 * 1024),
    ("codec_reader", codec_reader, &[], 4096),
    ("state_integrator", state_integrator, &[], 4096),
    ("state_retry_after", state_retry_after, &[], 4096),
    ("state_queueset", state_queueset, &[], 16 * 1024),
    ("state_level", state_level, &[], 16 * 1024),
    ("state_notice", state_notice, &[], 1024),
    ("state_registry", state_registry, &[], 4096),
    ("state_borrow", state_borrow, &[], 4096),
    ("state_watches", state_watches, &[], 4096),
    ("queueset_ops", queueset_ops, &[], 4096),
    ("simulate", simulate, SIM_DICT, 16 * 1024),
    ("metrics_scan", metrics_scan, METRICS_DICT, 32 * 1024),
    ("initial_events", initial_events, MARKER_DICT, 2048),
    ("list_size", list_size, LIST_DICT, 8 * 1024),
    ("state_object_counts", state_object_counts, &[], 4096),
    ("host_pairs", host_pairs, PAIRS_DICT, 4096),
];

pub const LIST_DICT: &[&[u8]] = &[b"\"resourceVersion\":\"", b"\"continue\":\"", b"\"continue\":\"\"", b"{\"metadata\":{", b"\"items\":["];

pub fn find(name: &str) -> Option<&'static Entry> {
    TARGETS.iter().find(|e| e.0 == name)
}

pub const CONFIG_DICT: &[&[u8]] = &[
    b"\"serverConcurrencyLimit\":",
    b"\"requestTimeout\":",
    b"\"suggestedDefaults\":",
    b"\"requestMode\":",
    b"\"namespaceHeader\":",
    b"\"identity\":",
    b"\"workEstimator\":",
    b"\"enforce\":",
    b"\"dryRunPriorityLevels\":",
    b"\"debugGroups\":",
    b"\"explainGroups\":",
    b"\"policy\":",
    b"\"generic\"",
    b"\"kubernetes\"",
    b"true",
    b"false",
    b"null",
    b"{}",
    b"[]",
    b",",
    b"\"kind\":\"List\"",
    b"\"items\":",
    b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1\"",
    b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1beta1\"",
    b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1beta2\"",
    b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1beta3\"",
    b"\"kind\":\"FlowSchema\"",
    b"\"kind\":\"PriorityLevelConfiguration\"",
    b"\"metadata\":{\"name\":\"x\"}",
    b"\"spec\":",
    b"\"type\":\"Limited\"",
    b"\"type\":\"Exempt\"",
    b"\"type\":\"Queue\"",
    b"\"type\":\"Reject\"",
    b"\"limited\":",
    b"\"exempt\":",
    b"\"nominalConcurrencyShares\":",
    b"\"assuredConcurrencyShares\":",
    b"\"lendablePercent\":",
    b"\"borrowingLimitPercent\":",
    b"\"limitResponse\":",
    b"\"queuing\":",
    b"\"queues\":",
    b"\"handSize\":",
    b"\"queueLengthLimit\":",
    b"\"matchingPrecedence\":",
    b"\"priorityLevelConfiguration\":{\"name\":\"global-default\"}",
    b"\"distinguisherMethod\":{\"type\":\"ByUser\"}",
    b"\"distinguisherMethod\":{\"type\":\"ByNamespace\"}",
    b"\"rules\":",
    b"\"subjects\":",
    b"\"kind\":\"User\"",
    b"\"kind\":\"Group\"",
    b"\"kind\":\"ServiceAccount\"",
    b"\"user\":{\"name\":\"*\"}",
    b"\"group\":{\"name\":\"system:authenticated\"}",
    b"\"serviceAccount\":{\"namespace\":\"*\",\"name\":\"*\"}",
    b"\"resourceRules\":",
    b"\"nonResourceRules\":",
    b"\"verbs\":[\"*\"]",
    b"\"apiGroups\":[\"*\"]",
    b"\"resources\":[\"*\"]",
    b"\"clusterScope\":true",
    b"\"namespaces\":[\"*\"]",
    b"\"nonResourceURLs\":[\"*\"]",
    b"\"/healthz/*\"",
    b"\"catch-all\"",
    b"\"exempt\"",
    b"\"global-default\"",
    b"\"workload-low\"",
    b"\"system\"",
    b"\"leader-election\"",
    b"\"sources\":[{\"type\":\"frontProxy\"}]",
    b"\"trustedSourceCidrs\":[\"10.0.0.0/8\"]",
    b"\"60s\"",
    b"\"1h2m3.5s\"",
    b"\"-1s\"",
    b"\"9223372036s\"",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b"1e999",
];

pub const PATH_DICT: &[&[u8]] = &[
    b"GET ",
    b"LIST ",
    b"POST ",
    b"PUT ",
    b"PATCH ",
    b"DELETE ",
    b"HEAD ",
    b"OPTIONS ",
    b"WATCH ",
    b"/api",
    b"/apis",
    b"/v1",
    b"/namespaces",
    b"/namespaces/",
    b"/watch",
    b"/proxy",
    b"/pods",
    b"/status",
    b"/finalize",
    b"/log",
    b"/exec",
    b"/apps",
    b"/deployments",
    b"/..",
    b"/.",
    b"//",
    b"%2F",
    b"%2f",
    b"%",
    b"%zz",
    b"%00",
    b"%ff",
    b"?",
    b"&",
    b"=",
    b";",
    b"+",
    b"#",
    b"watch=true",
    b"watch=1",
    b"watch=false",
    b"limit=500",
    b"limit=-1",
    b"limit=99999999999999999999",
    b"continue=abc",
    b"resourceVersion=0",
    b"resourceVersionMatch=NotOlderThan",
    b"sendInitialEvents=true",
    b"fieldSelector=metadata.name%3Dfoo",
    b"fieldSelector=metadata.name==foo,a!=b",
    b"labelSelector=app%20in%20(a,b)",
    b"labelSelector=!x",
    b"timeoutSeconds=30",
    b"timeout=1m",
    b"timeout=-1s",
    b"timeout=1e9h",
    b"\xff\xfe",
    b"\xc3",
    b"\n",
    b",",
    b"!",
    b"(",
    b")",
    b"<>",
    b"\\",
    b" ",
    b" /",
    b"get ",
    b"\xef\xbf\xbd ",
    b"/apis/g/v1/",
    b"/debug/pprof/",
    b"/healthz",
    b"/openapi/v2",
];

pub const IDENTITY_DICT: &[&[u8]] = &[
    b"\nx-remote-user: ",
    b"\nx-remote-group: ",
    b"\nx-remote-extra-scopes: ",
    b"\nimpersonate-user: ",
    b"\nimpersonate-group: ",
    b"\nimpersonate-uid: ",
    b"\nimpersonate-extra-foo: ",
    b"\n@peer 10.1.2.3",
    b"\n@peer ::ffff:10.1.2.3",
    b"\n@peer 2001:db8::1",
    b"\n@mtls",
    b"\n@subject CN=alice,O=dev",
    b"\n@jwt {\"sub\":\"x\"}",
    b"system:serviceaccount:",
    b"system:serviceaccount:ns:name",
    b"system:authenticated",
    b"system:unauthenticated",
    b"system:anonymous",
    b"system:masters",
    b",",
    b", ,",
    b"\\,",
    b"CN=",
    b"O=",
    b"+",
    b"\"",
    b"/0",
    b"/32",
    b"/128",
    b"/33",
    b"{\"type\":\"frontProxy\"}",
    b"{\"type\":\"impersonation\"}",
    b"{\"type\":\"clientCertificate\"}",
    b"{\"type\":\"jwt\"}",
    b"\"trustedSourceCidrs\":[\"0.0.0.0/0\"]",
    b"\"requireMtls\":true",
    b"\"stripUntrusted\":true",
    b"\"groups\":[\"a\",1]",
];

pub const SIM_DICT: &[&[u8]] = &[
    b"\"priorityLevel\":",
    b"\"concurrencyLimit\":",
    b"\"queues\":",
    b"\"queueLengthLimit\":",
    b"\"handSize\":",
    b"\"exempt\":true",
    b"\"evalDuration\":",
    b"\"clients\":",
    b"\"hash\":",
    b"\"threads\":",
    b"\"calls\":",
    b"\"exec\":",
    b"\"think\":",
    b"\"initialSeats\":",
    b"\"finalSeats\":",
    b"\"additionalLatency\":",
    b"\"split\":true",
    b"\"requestWaitLimit\":",
    b"\"startTime\":",
    b"\"1s\"",
    b"\"0s\"",
    b"\"-1s\"",
    b"\"1ns\"",
    b"\"2562047h\"",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"{\"hash\":1,\"threads\":1,\"calls\":1,\"exec\":1,\"think\":0},",
];

pub const DURATION_DICT: &[&[u8]] = &[
    b"ns",
    b"us",
    b"\xc2\xb5s",
    b"\xce\xbcs",
    b"ms",
    b"s",
    b"m",
    b"h",
    b".",
    b"-",
    b"+",
    b"0",
    b"9223372036854775807",
    b"9223372036854775808",
    b"2562047h",
    b"47m",
    b"16.854775807s",
    b"1e3s",
    b"d",
];

pub const METRICS_DICT: &[&[u8]] = &[
    b"apiserver_resource_objects",
    b"apiserver_resource_size_estimate_bytes",
    b"apiserver_storage_objects",
    b"apiserver_",
    b"{group=\"\",resource=\"pods\"} ",
    b"{resource=\"pods\",group=\"\"} ",
    b"{group=\"apps\",resource=\"deployments\"} ",
    b"{resource=\"deployments.apps\"} ",
    b"{resource=\"leases.coordination.k8s.io\"} ",
    b"group=\"\"",
    b"resource=\"\"",
    b"le=\"0.005\"",
    b"_bucket{",
    b"\\\"",
    b"\\\\",
    b"\\n",
    b"\\t",
    b"\"",
    b"{",
    b"}",
    b",",
    b"=",
    b" ",
    b"\t",
    b"\n",
    b"\r\n",
    b"\r",
    b"# HELP ",
    b"# TYPE ",
    b" gauge\n",
    b"50000",
    b"2.048e+08",
    b"1.234567e+06",
    b"-1",
    b"NaN",
    b"+Inf",
    b"-Inf",
    b"1e309",
    b"9.3e+18",
    b" 1700000000000",
    b" -5",
];

pub const MARKER_DICT: &[&[u8]] = &[
    b"k8s.io/initial-events-end",
    b"k8s.io/initial-events-en",
    b"k8s.io/",
    b"initial-events",
    b"-end",
    b"k",
    b"8s.io",
    b"\"annotations\":{",
    b"\"true\"",
    b"\x0a\x19",
    b"\x12\x04true",
    b"{\"type\":\"BOOKMARK\",\"object\":",
];

// ---------------------------------------------------------------------------------------------
// plugin configuration

pub fn plugin_config(data: &[u8]) -> bool {
    let first = parse_plugin_config(data);
    let again = parse_plugin_config(data);
    assert!(first == again, "parse_plugin_config is not deterministic");
    match first {
        Ok(cfg) => {
            let levels = &cfg.policy.priority_levels;
            assert_eq!(cfg.limits.len(), levels.len(), "one LevelLimits per priority level");
            assert!(cfg.server_concurrency_limit >= 1);
            assert!(cfg.request_timeout > 0);
            let _ = cfg.describe();
            let _ = cfg.nominal_cl_sum();
            for l in levels {
                let _ = cfg.is_enforced(&l.name);
            }
            // Classify a few requests under the configured policy.
            let c = Classifier::new(&cfg.policy);
            let users = sample_users("system:serviceaccount:ns:sa");
            for (m, t) in [
                ("GET", "/api/v1/namespaces/ns/pods"),
                ("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"),
                ("GET", "/healthz"),
                ("GET", "/x"),
            ] {
                check_classification(&cfg.policy, &c, &parse_request_info(m, t.as_bytes()), &users);
            }
            true
        }
        Err(errs) => {
            assert!(!errs.is_empty(), "an error result must name at least one problem");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------
// request info

fn split_request(data: &[u8]) -> (String, &[u8], Option<&[u8]>) {
    let (line, ns) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (data.get(..i).unwrap_or_default(), data.get(i + 1..)),
        None => (data, None),
    };
    let (method, target) = match line.iter().position(|&b| b == b' ') {
        Some(i) => (line.get(..i).unwrap_or_default(), line.get(i + 1..).unwrap_or_default()),
        None => (&b"GET"[..], line),
    };
    (String::from_utf8_lossy(method).into_owned(), target, ns)
}

/// Set once `parse_request_info` never returns an empty resource for `/api/v1//pods` style paths
/// (`tests/fuzz_regressions.rs::empty_path_segment_gives_empty_resource`).
pub const STRICT_EMPTY_RESOURCE: bool = true;

/// Properties every RequestInfo must have.
pub fn check_request_info(info: &RequestInfo) {
    if info.is_resource_request {
        // An empty resource is only tolerated where upstream fails the request (`invalid`), and
        // (known finding, see tests/fuzz_regressions.rs) for paths with an empty segment, which
        // upstream's `splitPath` keeps too.
        let empty_segment = info.path.trim_matches('/').split('/').any(str::is_empty);
        assert!(
            !info.resource.is_empty() || info.invalid || (empty_segment && !STRICT_EMPTY_RESOURCE),
            "a resource request with an empty resource: {info:?}"
        );
        assert!(info.api_prefix == "api" || info.api_prefix == "apis", "api prefix {:?}", info.api_prefix);
        let parts = info.parts();
        assert!(parts.first() == Some(&info.resource) || parts.is_empty(), "resource is the first part: {info:?}");
    } else {
        assert!(info.resource.is_empty() && info.api_prefix.is_empty(), "non-resource request with resource fields: {info:?}");
    }
    let _ = info.is_long_running();
    let _ = info.is_watch();
    let _ = info.query.decode_failed();
}

/// Input: `METHOD TARGET` (no space: GET), optionally `\n` and a namespace for the generic mode.
/// The target is parsed as it is and under a group-version prefix (`/apis/g/v1/` + target), so
/// that any bytes also reach the resource part of the parser.
pub fn request_info(data: &[u8]) -> bool {
    let (method, target, ns) = split_request(data);
    let info = parse_request_info(&method, target);
    check_request_info(&info);
    assert!(info == parse_request_info(&method, target), "parse_request_info is not deterministic");
    check_request_info(&parse_request_info(&method, &[&b"/apis/g/v1/"[..], target].concat()));
    let generic = parse_generic(&method, target, ns);
    check_request_info(&generic);
    assert!(!generic.is_resource_request);
    assert_eq!(generic.path, info.path, "both modes decode the path the same way");
    let (policy, classifier) = default_classifier();
    let ns = String::from_utf8_lossy(ns.unwrap_or_default()).into_owned();
    let users = sample_users(&ns);
    check_classification(policy, classifier, &info, &users);
    check_classification(policy, classifier, &generic, &users);
    // Work estimate (default estimator config, a level with at most 10 seats).
    let mut watches = WatchTracker::new();
    let key = watches.register(&info);
    let n = watches.interested_count(&info);
    for r in [&info, &generic] {
        let we = estimate(&WorkEstimatorConfig::default(), r, Some(10), n);
        assert!((1..=10).contains(&we.initial_seats), "initial seats {we:?} for {r:?}");
        assert!(we.final_seats <= 10, "final seats {we:?}");
        assert!(we.additional_latency >= 0, "negative latency {we:?}");
    }
    if let Some(k) = key {
        watches.forget(&k);
    }
    assert_eq!(watches.total(), 0, "register/forget leaves watches behind");
    info.is_resource_request && !info.invalid
}

/// The built-in policy and its classifier (built once).
fn default_classifier() -> &'static (Policy, Classifier) {
    static C: OnceLock<(Policy, Classifier)> = OnceLock::new();
    C.get_or_init(|| {
        let p = default_policy();
        let c = Classifier::new(&p);
        (p, c)
    })
}

fn sample_users(extra: &str) -> Vec<UserInfo> {
    vec![
        UserInfo::anonymous(),
        UserInfo::authenticated("alice", &[]),
        UserInfo::authenticated("system:serviceaccount:kube-system:default", &[]),
        UserInfo::authenticated("system:kube-controller-manager", &["system:masters".to_string()]),
        UserInfo::authenticated("system:node:n1", &["system:nodes".to_string()]),
        UserInfo::authenticated(extra, &[extra.to_string()]),
    ]
}

/// Classification of any request returns valid indices, the level of the matched schema, and a
/// flow hash only together with queuing.
pub fn check_classification(policy: &Policy, c: &Classifier, info: &RequestInfo, users: &[UserInfo]) {
    for u in users {
        let cl = c.classify(info, u);
        if policy.flow_schemas.is_empty() {
            continue;
        }
        let fs = policy.flow_schemas.get(cl.flow_schema);
        assert!(fs.is_some(), "flow schema index {} out of range", cl.flow_schema);
        assert!(cl.priority_level < policy.priority_levels.len(), "priority level index {} out of range", cl.priority_level);
        if let Some(fs) = fs {
            assert_eq!(policy.level_index(&fs.priority_level), Some(cl.priority_level), "level of schema {}", fs.name);
        }
        assert_eq!(cl, c.classify(info, u), "classification is not deterministic");
    }
}

// ---------------------------------------------------------------------------------------------
// identity

const DEFAULT_IDENTITY: &str = r#"{"sources":[
 {"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/8","2001:db8::/32"],"stripUntrusted":true},
 {"type":"impersonation","requireMtls":true,"stripUntrusted":true},
 {"type":"clientCertificate"},
 {"type":"jwt","userClaim":"email","groupsClaim":"roles","userPrefix":"oidc:","groupsPrefix":"oidc:"}]}"#;

struct IdentityCase {
    cfg: IdentityConfig,
    cfg_ok: bool,
    headers: Vec<(String, Vec<u8>)>,
    peer: Option<IpAddr>,
    mtls: bool,
    subject: Option<String>,
    claims: Option<serde_json::Value>,
}

fn identity_case(data: &[u8]) -> IdentityCase {
    let mut lines = data.split(|&b| b == b'\n');
    let first = lines.next().unwrap_or_default();
    let (cfg, cfg_ok) = match serde_json::from_slice::<IdentityConfig>(first) {
        Ok(c) => (c, true),
        Err(_) => (serde_json::from_str(DEFAULT_IDENTITY).unwrap_or_default(), false),
    };
    let mut case = IdentityCase { cfg, cfg_ok, headers: Vec::new(), peer: None, mtls: false, subject: None, claims: None };
    for line in lines {
        if let Some(rest) = line.strip_prefix(b"@peer ") {
            case.peer = std::str::from_utf8(rest).ok().and_then(|s| s.trim().parse().ok());
        } else if line == b"@mtls" {
            case.mtls = true;
        } else if let Some(rest) = line.strip_prefix(b"@subject ") {
            case.subject = Some(String::from_utf8_lossy(rest).into_owned());
        } else if let Some(rest) = line.strip_prefix(b"@jwt ") {
            case.claims = serde_json::from_slice(rest).ok();
        } else if let Some(i) = line.iter().position(|&b| b == b':') {
            let name = String::from_utf8_lossy(line.get(..i).unwrap_or_default()).to_ascii_lowercase();
            let mut value = line.get(i + 1..).unwrap_or_default();
            if value.first() == Some(&b' ') {
                value = value.get(1..).unwrap_or_default();
            }
            case.headers.push((name, value.to_vec()));
        }
    }
    case
}

fn check_user(u: &UserInfo) {
    assert!(!u.name.is_empty(), "empty user name: {u:?}");
    let authn = u.groups.iter().any(|g| g == "system:authenticated");
    let unauthn = u.groups.iter().any(|g| g == "system:unauthenticated");
    assert!(authn || unauthn, "neither authenticated nor unauthenticated: {u:?}");
    if u.name == "system:anonymous" {
        assert!(unauthn, "anonymous without system:unauthenticated: {u:?}");
    }
}

pub fn identity(data: &[u8]) -> bool {
    let case = identity_case(data);
    let headers: Vec<(&str, &[u8])> = case.headers.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    let input = IdentityInput {
        headers: &headers,
        peer: case.peer,
        mtls: case.mtls,
        cert_subject: case.subject.as_deref(),
        jwt_claims: case.claims.as_ref(),
    };
    let user = identify(&case.cfg, &input);
    check_user(&user);
    assert_eq!(user, identify(&case.cfg, &input), "identify is not deterministic");
    let strip = case.cfg.headers_to_strip(&input);
    for h in &strip {
        assert_eq!(h, &h.to_ascii_lowercase(), "strip names are lowercase");
        assert!(case.headers.iter().any(|(n, _)| n == h), "strips a header that is not present: {h:?}");
    }
    let _ = case.cfg.header_names();
    let _ = case.cfg.header_prefixes();
    let _ = case.cfg.validate();
    if let Some(s) = &case.subject {
        let _ = parse_subject(s);
    }
    if let Some(ns) = service_account_namespace(&user.name) {
        assert!(!ns.is_empty() && !ns.contains(':'));
        // Impersonating a service account with explicit groups keeps exactly those groups
        // (upstream's impersonation filter adds the service account groups only when none were
        // given); every other source completes them.
        let explicit_groups = case.headers.iter().any(|(n, v)| n == "impersonate-group" && !v.is_empty());
        assert!(explicit_groups || user.groups.iter().any(|g| g == "system:serviceaccounts"), "service account groups: {user:?}");
    }
    let _ = UserInfo::authenticated(&user.name, &user.groups);
    case.cfg_ok && user.name != "system:anonymous"
}

// ---------------------------------------------------------------------------------------------
// Go durations

pub fn duration(data: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(data) else { return false };
    match parse_go_duration(s) {
        Ok(d) => {
            let f = format_go_duration(d);
            assert_eq!(parse_go_duration(&f), Ok(d), "format_go_duration({d}) = {f:?} does not parse back");
            true
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------
// codec and stored state

/// Interprets the input as a script: each step's first byte picks a `Reader` operation on the
/// remaining bytes. Whatever decodes is written again and must read back identically.
pub fn codec_reader(data: &[u8]) -> bool {
    let (ops, body) = data.split_at(data.len().min(16));
    let mut r = Reader::new(body);
    let mut w = Writer::new();
    let mut kinds = Vec::new();
    let mut ok = true;
    for &op in ops {
        let before = r.remaining();
        let res = match op % 14 {
            0 => r.u8().map(|v| w.u8(v)),
            2 => r.u64().map(|v| w.u64(v)),
            3 => r.u32().map(|v| w.u32(v)),
            4 => r.usize().map(|v| w.usize(v)),
            5 => r.i64().map(|v| w.i64(v)),
            6 => r.i32().map(|v| w.i32(v)),
            7 => r.fixed64().map(|v| w.fixed64(v)),
            8 => r.f64().map(|v| w.f64(v)),
            9 => r.bytes().map(|v| w.bytes(v)),
            10 => r.str().map(|v| w.str(v)),
            _ => r.count(usize::from(op >> 4)).map(|n| {
                assert!(n.saturating_mul(usize::from(op >> 4).max(1)) <= before, "count {n} exceeds input");
                w.usize(n)
            }),
        };
        assert!(r.remaining() <= before, "reader moved backwards");
        match res {
            Ok(()) => kinds.push(op % 14),
            Err(_) => {
                ok = false;
                break;
            }
        }
    }
    // Round trip: read back what was written with the same operations.
    let bytes = w.into_bytes();
    let mut r2 = Reader::new(&bytes);
    let mut w2 = Writer::new();
    for k in kinds {
        let res = match k {
            0 => r2.u8().map(|v| w2.u8(v)),
            2 => r2.u64().map(|v| w2.u64(v)),
            3 => r2.u32().map(|v| w2.u32(v)),
            4 => r2.usize().map(|v| w2.usize(v)),
            5 => r2.i64().map(|v| w2.i64(v)),
            6 => r2.i32().map(|v| w2.i32(v)),
            7 => r2.fixed64().map(|v| w2.fixed64(v)),
            8 => r2.f64().map(|v| w2.f64(v)),
            9 => r2.bytes().map(|v| w2.bytes(v)),
            10 => r2.str().map(|v| w2.str(v)),
            // A count re-read against the rewritten (shorter) buffer may legitimately fail.
            _ => r2.usize().map(|v| w2.usize(v)),
        };
        assert!(res.is_ok(), "re-reading written values failed");
    }
    assert!(r2.is_empty(), "re-read left bytes");
    assert_eq!(bytes, w2.into_bytes(), "written values do not round-trip");
    ok
}

/// `decode` then `encode` then `decode` again: the second encoding must equal the first
/// (byte-wise, so NaNs compare equal).
fn round_trip<T>(data: &[u8], decode: fn(&mut Reader<'_>) -> apf_wasm::codec::CodecResult<T>, encode: fn(&T, &mut Writer)) -> bool {
    let mut r = Reader::new(data);
    let Ok(v) = decode(&mut r) else { return false };
    let mut w = Writer::new();
    encode(&v, &mut w);
    let once = w.into_bytes();
    let mut r2 = Reader::new(&once);
    let v2 = decode(&mut r2);
    assert!(v2.is_ok(), "re-decoding an encoded value failed: {:?}", v2.err());
    assert!(r2.is_empty(), "decode left {} bytes of its own encoding", r2.remaining());
    let mut w2 = Writer::new();
    if let Ok(v2) = v2 {
        encode(&v2, &mut w2);
    }
    assert_eq!(once, w2.into_bytes(), "encode(decode(encode(decode(x)))) != encode(decode(x))");
    true
}

pub fn state_integrator(data: &[u8]) -> bool {
    let ok = round_trip(data, Integrator::decode, Integrator::encode);
    if let Ok(mut igr) = Integrator::decode(&mut Reader::new(data)) {
        // Operating on decoded garbage must not panic either.
        let _ = igr.current();
        let _ = igr.get_results(i64::MAX);
        igr.add(i64::MIN, f64::NAN);
        igr.set(0, 1.0);
        let _ = igr.reset(i64::MAX);
    }
    ok
}

pub fn state_retry_after(data: &[u8]) -> bool {
    let ok = round_trip(data, DroppedRequestsTracker::decode, DroppedRequestsTracker::encode);
    if let Ok(mut t) = DroppedRequestsTracker::decode(&mut Reader::new(data)) {
        for now in [i64::MIN, -1, 0, 1, i64::MAX, i64::MAX] {
            t.record_dropped(now);
            let ra = t.retry_after();
            assert!((1..=32).contains(&ra), "retry-after {ra} out of 1..=32");
        }
    }
    ok
}

/// `QueueSet::decode`, then a few operations on the decoded state; the state reached must encode
/// and decode again.
pub fn state_queueset(data: &[u8]) -> bool {
    let ok = round_trip(data, QueueSet::decode, QueueSet::encode);
    if let Ok(mut qs) = QueueSet::decode(&mut Reader::new(data)) {
        let near_max = qs.counters().values().iter().any(|&v| v > u64::MAX / 2);
        if !near_max || STRICT_QUEUESET_COUNTERS {
            exercise(&mut qs);
        }
    }
    ok
}

/// Set once the QueueSet's counters saturate instead of overflowing
/// (`tests/fuzz_regressions.rs::queueset_counter_overflow`).
pub const STRICT_QUEUESET_COUNTERS: bool = true;

fn encode_qs(qs: &QueueSet) -> Vec<u8> {
    let mut w = Writer::new();
    qs.encode(&mut w);
    w.into_bytes()
}

/// Checks the QueueSet's aggregate counters against its snapshot and that it round-trips.
fn check_qs(qs: &QueueSet) {
    let snap = qs.snapshot();
    let waiting: usize = snap.queues.iter().map(|q| q.waiting.len()).sum();
    assert_eq!(qs.requests_waiting() as usize, waiting.min(u32::MAX as usize), "requests_waiting vs snapshot");
    let bytes = encode_qs(qs);
    let back = QueueSet::decode(&mut Reader::new(&bytes));
    assert!(back.is_ok(), "a reachable QueueSet state does not decode: {:?}", back.err());
    if let Ok(b) = back {
        assert_eq!(bytes, encode_qs(&b), "QueueSet encoding does not round-trip");
        assert_eq!(qs.snapshot(), b.snapshot(), "snapshot changed by encode/decode");
    }
}

/// Receipts matching the executing aggregates of a (decoded) state: executing requests are kept
/// by their owners, so a decoded state can only be finished with receipts forged from them.
fn receipts_of(qs: &QueueSet, now: i64) -> Vec<Receipt> {
    let snap = qs.snapshot();
    let rc = |queue: i32, owner: u32, seats: u64| Receipt {
        id: 1,
        queue,
        owner,
        initial_seats: 1,
        max_seats: u32::try_from(seats).unwrap_or(u32::MAX),
        start: now,
        additional_latency: i64::from(owner % 2) * 1_000_000,
    };
    let mut v: Vec<Receipt> = snap.queueless_executing_by_owner.iter().map(|e| rc(-1, e.owner, e.seats)).collect();
    for q in &snap.queues {
        let queue = i32::try_from(q.index).unwrap_or(i32::MAX);
        v.extend(q.executing_by_owner.iter().map(|e| rc(queue, e.owner, e.seats)));
    }
    v
}

fn exercise(qs: &mut QueueSet) {
    let snap = qs.snapshot();
    let now = snap.last_time;
    let mut out = Vec::new();
    let _ = qs.next_event();
    let tag = RequestTag { owner: 1, context: 2, flow_schema: 3, flow_hash: 0xfeed, wait_deadline: now.saturating_add(1_000_000_000) };
    let _ = qs.start_request(now.saturating_add(1_000), WorkEstimate::ONE, tag, &mut out);
    for rc in receipts_of(qs, now).into_iter().take(4) {
        let _ = qs.finish(now.saturating_add(2_000), &rc, &mut out);
    }
    if let Some(t) = qs.next_event() {
        let mut timed = Vec::new();
        qs.expire(t, &mut timed, &mut out);
    }
    let _ = qs.remove_owner(1, now.saturating_add(3_000), &mut out);
    check_qs(qs);
}

/// A random sequence of QueueSet operations (4 bytes each) on a small QueueSet whose config comes
/// from the first 4 bytes. After every step the state must round-trip through the codec.
pub fn queueset_ops(data: &[u8]) -> bool {
    let b = |i: usize| data.get(i).copied().unwrap_or(0);
    let cfg = QueueSetConfig {
        desired_queues: i32::from(b(0) % 20) - 2,
        queue_length_limit: u32::from(b(1) % 8),
        hand_size: u32::from(b(2) % 6),
        concurrency_limit: u32::from(b(3) % 10),
        strict_limit: b(3) >= 128,
    };
    let mut now: i64 = 1_000_000_000;
    let Ok(mut qs) = QueueSet::new(cfg, now) else { return false };
    let mut ids: Vec<RequestId> = Vec::new();
    // Receipts are kept after their finish, so that double finishes are exercised too.
    let mut receipts: Vec<Receipt> = Vec::new();
    let mut out = Vec::new();
    for (n, c) in data.get(4..).unwrap_or_default().chunks(4).enumerate() {
        let c = |i: usize| c.get(i).copied().unwrap_or(0);
        let ms = |v: u8| i64::from(v) * 1_000_000;
        let seats_before = qs.seats_in_use();
        match c(0) % 8 {
            0 | 1 => {
                let work = WorkEstimate {
                    initial_seats: u32::from(c(1) % 5),
                    final_seats: u32::from(c(2) % 5),
                    additional_latency: ms(c(3) % 16),
                };
                let tag = RequestTag {
                    owner: u32::from(c(1) % 3),
                    context: n as u32,
                    flow_schema: u16::from(c(2) % 4),
                    flow_hash: u64::from(c(3)).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    wait_deadline: if c(2) & 0x80 != 0 { i64::MAX } else { now.saturating_add(ms(c(3))) },
                };
                match qs.start_request(now, work, tag, &mut out).arrival {
                    Arrival::Executing(rc) => receipts.push(rc),
                    Arrival::Queued(id) => ids.push(id),
                    Arrival::Rejected(_) => {}
                }
            }
            2 => {
                if let Some(&rc) = receipts.get(usize::from(c(1)) % receipts.len().max(1)) {
                    // Sometimes a receipt of another owner or queue (refused unless it exists).
                    let rc = match c(2) % 8 {
                        0 => Receipt { owner: u32::from(c(3) % 3), ..rc },
                        1 => Receipt { queue: i32::from(c(3) % 20) - 2, ..rc },
                        _ => rc,
                    };
                    let _ = qs.finish(now, &rc, &mut out);
                }
            }
            3 => {
                if let Some(&id) = ids.get(usize::from(c(1)) % ids.len().max(1)) {
                    let _ = qs.cancel(now, id);
                }
            }
            4 => {
                let mut timed = Vec::new();
                let t = qs.next_event().unwrap_or(now).max(now);
                now = t;
                qs.expire(now, &mut timed, &mut out);
            }
            5 => now = now.saturating_add(ms(c(1)).saturating_mul(i64::from(c(2)))),
            6 => {
                // Clocks of different workers may disagree: small steps back.
                now = now.saturating_sub(ms(c(1) % 8));
            }
            _ => {
                if c(1) % 2 == 0 {
                    let _ = qs.remove_owner(u32::from(c(2) % 3), now, &mut out);
                } else {
                    let mut cfg2 = qs.config();
                    cfg2.concurrency_limit = u32::from(c(2) % 10);
                    if c(3) % 4 == 0 {
                        cfg2.desired_queues = i32::from(c(3) % 20) - 2;
                        cfg2.hand_size = u32::from(c(1) % 6);
                    }
                    let _ = qs.reconfigure(cfg2, now);
                }
            }
        }
        // A strict limit is never exceeded by a dispatch (a lowered one drains).
        let cfg = qs.config();
        if cfg.strict_limit && cfg.desired_queues >= 0 && qs.seats_in_use() > seats_before {
            assert!(qs.seats_in_use() <= cfg.concurrency_limit, "strict limit {} exceeded: {}", cfg.concurrency_limit, qs.seats_in_use());
        }
        receipts.extend(out.iter().map(|d| d.receipt));
        out.clear();
        // The check is O(state); checking every step would make long inputs quadratic.
        if n < 32 || n % 32 == 0 {
            check_qs(&qs);
        }
    }
    check_qs(&qs);
    true
}

pub fn state_level(data: &[u8]) -> bool {
    let Ok(st) = LevelState::decode(data) else { return false };
    let once = st.encode();
    let again = LevelState::decode(&once);
    assert!(again.is_ok(), "re-decoding an encoded LevelState failed: {:?}", again.err());
    if let Ok(a) = again {
        assert_eq!(once, a.encode(), "LevelState encoding does not round-trip");
    }
    true
}

pub fn state_notice(data: &[u8]) -> bool {
    let Ok(n) = Notice::decode(data) else { return false };
    let once = n.encode();
    assert_eq!(Notice::decode(&once).as_ref(), Ok(&n), "Notice does not round-trip");
    true
}

pub fn state_registry(data: &[u8]) -> bool {
    let Ok(reg) = Registry::decode(Some(data)) else { return false };
    let once = reg.encode();
    assert_eq!(Registry::decode(Some(&once)).as_ref(), Ok(&reg), "Registry does not round-trip");
    true
}

// ---------------------------------------------------------------------------------------------
// simulator

/// Σ threads × max(calls, 1) of a scenario, when it is JSON of the expected shape.
pub fn scenario_work(data: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(data).ok()?;
    let clients = v.get("clients")?.as_array()?;
    Some(clients.iter().fold(0u64, |acc, c| {
        let t = c.get("threads").and_then(serde_json::Value::as_u64).unwrap_or(0);
        let n = c.get("calls").and_then(serde_json::Value::as_u64).unwrap_or(0).max(1);
        acc.saturating_add(t.saturating_mul(n))
    }))
}

/// Largest scenario (threads × calls) the short in-repo run simulates; bigger ones cost seconds
/// each in a debug build. `APF_FUZZ_SIM_MAX_WORK` raises it (the libFuzzer target has no cap).
pub fn sim_max_work() -> u64 {
    static M: OnceLock<u64> = OnceLock::new();
    *M.get_or_init(|| std::env::var("APF_FUZZ_SIM_MAX_WORK").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000))
}

/// `run_scenario` must not panic, and must be deterministic (same input, same output bytes).
pub fn simulate(data: &[u8]) -> bool {
    simulate_capped(data, sim_max_work())
}

pub fn simulate_capped(data: &[u8], max_work: u64) -> bool {
    if scenario_work(data).is_some_and(|w| w > max_work) {
        return false;
    }
    let a = run_scenario(data);
    let b = run_scenario(data);
    match (a, b) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.to_json(), b.to_json(), "the simulator is not deterministic");
            true
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "the simulator's error is not deterministic");
            false
        }
        (a, b) => panic!("the simulator is not deterministic: {:?} vs {:?}", a.map(|r| r.to_json()), b.map(|r| r.to_json())),
    }
}

/// Set once `BorrowState::decode` accepts every state `encode` writes
/// (`tests/fuzz_regressions.rs::borrow_state_with_short_level_names_round_trips`).
pub const STRICT_BORROW_COUNT: bool = true;

pub fn state_borrow(data: &[u8]) -> bool {
    let Ok(st) = BorrowState::decode(Some(data)) else { return false };
    let once = st.encode();
    let again = BorrowState::decode(Some(&once));
    let short_names = st.levels.iter().map(|l| l.0.len()).sum::<usize>() < 3 * st.levels.len();
    if again.is_err() && short_names && !STRICT_BORROW_COUNT {
        return true;
    }
    assert!(again.is_ok(), "re-decoding an encoded BorrowState failed: {:?}", again.err());
    if let Ok(a) = again {
        assert_eq!(once, a.encode(), "BorrowState encoding does not round-trip");
    }
    true
}

pub fn state_watches(data: &[u8]) -> bool {
    round_trip(data, WatchTracker::decode, WatchTracker::encode)
}

// ---------------------------------------------------------------------------------------------
// streaming scanners of response bodies

/// Feeds `data` to a fresh `MetricsScanner` in chunks of the given sizes (cycling; 0 → 1).
fn scan_in_chunks(data: &[u8], sizes: &[usize]) -> apf_wasm::digest::metrics_scan::ScrapedCounts {
    let mut s = MetricsScanner::new();
    let mut rest = data;
    let mut i = 0usize;
    while !rest.is_empty() {
        let n = sizes.get(i % sizes.len().max(1)).copied().unwrap_or(1).clamp(1, rest.len());
        let (a, b) = rest.split_at(n);
        s.feed(a);
        s.feed(&[]);
        rest = b;
        i += 1;
    }
    s.finish()
}

/// The scan does not depend on how the body is cut into chunks, and its entries are sane.
pub fn metrics_scan(data: &[u8]) -> bool {
    let whole = scan_metrics(data);
    assert_eq!(whole, scan_metrics(data), "scan_metrics is not deterministic");
    let sizes: Vec<usize> = data.iter().take(8).map(|&b| usize::from(b % 97) + 1).collect();
    assert_eq!(scan_in_chunks(data, &sizes), whole, "chunks of sizes {sizes:?} give another result");
    assert_eq!(scan_in_chunks(data, &[1]), whole, "1-byte chunks give another result");
    let lines = data.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    assert!(whole.samples.saturating_add(whole.malformed) <= lines, "more samples than lines: {whole:?}");
    assert!(whole.entries.len() as u64 <= whole.samples, "more entries than samples: {whole:?}");
    for (k, v) in &whole.entries {
        let mut parts = k.split('/');
        let (first, second, third) = (parts.next(), parts.next(), parts.next());
        assert!(first.is_some_and(|p| !p.is_empty()) && second != Some("") && third.is_none(), "bad key {k:?}");
        assert!(v.count >= 0 && v.average_object_size_bytes >= 0, "negative stats for {k}: {v:?}");
        assert!(v.count > 0 || v.average_object_size_bytes == 0, "an average without objects for {k}: {v:?}");
    }
    whole.samples > 0
}

/// Where the first marker of `d` ends, if any: a prefix `d[..n]` contains it iff `n >= end`.
fn marker_end(d: &[u8]) -> Option<usize> {
    d.windows(INITIAL_EVENTS_END.len()).position(|w| w == INITIAL_EVENTS_END).map(|p| p + INITIAL_EVENTS_END.len())
}

/// Fed in pieces, the scanner finds the marker iff the whole input contains it, and reports it
/// from the first piece that completes it on.
pub fn initial_events(data: &[u8]) -> bool {
    let end = marker_end(data);
    let has_marker = |n: usize| end.is_some_and(|e| n >= e);
    let want = end.is_some();
    let mut s = MarkerScanner::new();
    assert_eq!(s.feed(data), want);
    assert_eq!((s.found(), s.bytes()), (want, data.len() as u64));
    // Two pieces: at every position of short inputs, else around the first `k`s and at
    // input-derived positions.
    let mut cuts: Vec<usize> = if data.len() <= 300 {
        (0..=data.len()).collect()
    } else {
        let ks = data.iter().enumerate().filter(|(_, &b)| b == b'k').take(4).map(|(i, _)| i);
        let near = ks.flat_map(|i| i.saturating_sub(2)..i + INITIAL_EVENTS_END.len() + 2);
        near.chain(data.iter().take(32).map(|&b| usize::from(b) * data.len() / 256)).filter(|&c| c <= data.len()).collect()
    };
    cuts.push(data.len());
    for at in cuts {
        let (a, b) = data.split_at(at);
        let mut s = MarkerScanner::new();
        assert_eq!(s.feed(a), has_marker(a.len()), "first piece of a cut at {at}");
        assert_eq!(s.feed(b), want, "cut at {at}");
        assert_eq!((s.found(), s.bytes()), (want, data.len() as u64));
    }
    // Small pieces: the scanner turns true exactly with the piece that completes the marker.
    for step in [1usize, 2, 3, 7, 24, 25, 26] {
        let mut s = MarkerScanner::new();
        for (i, piece) in data.chunks(step).enumerate() {
            assert_eq!(s.feed(piece), has_marker(i * step + piece.len()), "pieces of {step}, piece {i}");
        }
        assert_eq!(s.found(), want);
    }
    want
}

/// A LIST body scanned in pieces gives what it gives whole; an observation, when there is one,
/// has items and their average size consistent with the bytes.
pub fn list_size(data: &[u8]) -> bool {
    use apf_wasm::digest::list_size::ListBodyScanner;
    let mut whole = ListBodyScanner::new();
    whole.feed(data);
    let want = whole.finish();
    let cuts: Vec<usize> = if data.len() <= 200 {
        (0..=data.len()).collect()
    } else {
        data.iter().take(24).map(|&b| usize::from(b) * data.len() / 256).collect()
    };
    for at in cuts {
        let (a, b) = data.split_at(at);
        let mut s = ListBodyScanner::new();
        s.feed(a);
        s.feed(b);
        assert_eq!(s.finish(), want, "cut at {at}");
    }
    for step in [1usize, 2, 5, 13, 19, 20] {
        let mut s = ListBodyScanner::new();
        data.chunks(step).for_each(|c| s.feed(c));
        assert_eq!(s.finish(), want, "pieces of {step}");
    }
    if let Some(o) = want {
        let st = o.stats();
        assert!(o.items > 0 && st.count == o.items && st.average_object_size_bytes * o.items <= o.bytes);
    }
    want.is_some()
}

/// The shared object counts decode without panicking and re-encode to what they decoded from.
pub fn state_object_counts(data: &[u8]) -> bool {
    use apf_wasm::engine::object_counts::SharedCounts;
    match SharedCounts::decode(data) {
        Ok(s) => {
            let again = SharedCounts::decode(&s.encode()).expect("re-decode");
            assert_eq!(again, s);
            true
        }
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------------------------
// request verb against a reference model

/// Request paths by what upstream's `NewRequestInfo` makes of them (collections first: most
/// inputs exercise the `watch` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathKind {
    /// A resource request with no name: GET and HEAD are list or watch.
    Collection,
    /// A resource request with a name: GET and HEAD are get.
    Named,
    /// `…/watch/…`: the verb is watch whatever the method.
    WatchPrefix,
    /// Not a resource request: the verb is the lowercase method.
    NonResource,
}

const VERB_PATHS: &[(&str, PathKind)] = &[
    ("/api/v1/pods", PathKind::Collection),
    ("/api/v1/pods", PathKind::Collection),
    ("/api/v1/pods", PathKind::Collection),
    ("/api/v1/namespaces/ns/pods", PathKind::Collection),
    ("/apis/apps/v1/deployments", PathKind::Collection),
    ("/apis/apps/v1/namespaces/ns/deployments", PathKind::Collection),
    ("/api/v1/namespaces", PathKind::Collection),
    ("/api/v1/pods/foo", PathKind::Named),
    ("/api/v1/namespaces/ns/pods/foo", PathKind::Named),
    ("/api/v1/namespaces/ns", PathKind::Named),
    ("/api/v1/namespaces/ns/pods/foo/status", PathKind::Named),
    ("/api/v1/watch/pods", PathKind::WatchPrefix),
    ("/apis/apps/v1/watch/namespaces/ns/deployments", PathKind::WatchPrefix),
    ("/healthz", PathKind::NonResource),
    ("/api/v1", PathKind::NonResource),
    ("/apis/apps/v1", PathKind::NonResource),
];

const VERB_METHODS: &[&str] = &["GET", "GET", "GET", "GET", "GET", "GET", "HEAD", "DELETE", "POST", "PUT", "PATCH", "OPTIONS"];

/// Query keys (the low 4 bits of a key byte pick one).
const VERB_KEYS: &[&str] = &[
    "watch",
    "watch",
    "watch",
    "watch",
    "sendInitialEvents",
    "sendInitialEvents",
    "limit",
    "timeoutSeconds",
    "fieldSelector",
    "labelSelector",
    "resourceVersion",
    "resourceVersionMatch",
    "timeout",
    "allowWatchBookmarks",
    "continue",
    "x",
];

/// Decoded query values for the bool and integer parameters.
const VERB_VALUES: &[&[u8]] = &[
    b"false",
    b"FALSE",
    b"False",
    "fal\u{17F}e".as_bytes(),
    "FAL\u{17F}E".as_bytes(),
    "\u{17F}".as_bytes(),
    b"0",
    b"00",
    b"1",
    b"true",
    b"TRUE",
    b"t",
    b"f",
    b"",
    "\u{212A}".as_bytes(),
    "fal\u{212A}e".as_bytes(),
    b"falsee",
    b"fals",
    b"fal\xffe",
    b"fal\xc5e",
    b"false ",
    b" false",
    "\u{130}".as_bytes(),
    "\u{131}".as_bytes(),
    "FALSE\u{17F}".as_bytes(),
    b"500",
    b"-1",
    b"+5",
    b"x",
    b"99999999999999999999",
    b"9223372036854775807",
    b"9223372036854775808",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"1_000",
    b"0x10",
    b" 1",
    b"+",
    b"-",
    b"1m",
    b"bogus",
];

/// Field selectors and whether `fields.ParseSelector` accepts them.
const VERB_FIELD_SELECTORS: &[(&str, bool)] = &[
    ("", true),
    ("metadata.name=foo", true),
    ("metadata.name==foo,a!=b", true),
    ("spec.nodeName=n1", true),
    ("a", false),
    ("metadata.name=name1,foo", false),
    ("a=b=c", false),
];

/// Label selectors and whether `labels.Parse` accepts them.
const VERB_LABEL_SELECTORS: &[(&str, bool)] =
    &[("", true), ("app=a", true), ("a in (b,c)", true), ("!x", true), ("a,b", true), ("!!!", false), ("a in (", false), ("e>z", false)];

/// One generated request: what goes on the wire and what the reference model reads.
struct VerbCase {
    method: &'static str,
    kind: PathKind,
    target: Vec<u8>,
    /// The decoded (key, value) pairs, in order.
    params: Vec<(&'static str, Vec<u8>)>,
}

/// Percent-encodes `raw` for a query: ASCII letters and digits stay literal unless
/// `encode_all`, spaces become `+` when `plus`, every other byte is `%XX`.
fn encode_query_part(raw: &[u8], encode_all: bool, plus: bool, out: &mut Vec<u8>) {
    for &b in raw {
        if b.is_ascii_alphanumeric() && !encode_all {
            out.push(b);
        } else if b == b' ' && plus {
            out.push(b'+');
        } else {
            let hex = |n: u8| b"0123456789ABCDEF".get(usize::from(n)).copied().unwrap_or(b'0');
            out.extend_from_slice(&[b'%', hex(b >> 4), hex(b & 0x0F)]);
        }
    }
}

/// Input: a method byte, a path byte, then parameters: a key byte (low 4 bits: the key; bit 4:
/// percent-encode the key; bit 5: percent-encode letters and digits of the value; bit 6: spaces
/// as `+`) and a value byte (selectors: an entry of their table; otherwise below 0xC0 an entry of
/// `VERB_VALUES`, else the next `byte & 0x3F` input bytes verbatim).
fn verb_case(data: &[u8]) -> VerbCase {
    let mut it = data.iter().copied();
    let pick = |b: Option<u8>, n: usize| usize::from(b.unwrap_or(0)) % n;
    let method = VERB_METHODS.get(pick(it.next(), VERB_METHODS.len())).copied().unwrap_or("GET");
    let (path, kind) = VERB_PATHS.get(pick(it.next(), VERB_PATHS.len())).copied().unwrap_or(("/api/v1/pods", PathKind::Collection));
    let mut target = path.as_bytes().to_vec();
    let mut params = Vec::new();
    while let Some(kb) = it.next() {
        let key = VERB_KEYS.get(usize::from(kb & 0x0F)).copied().unwrap_or("x");
        let vb = it.next().unwrap_or(0);
        let table = match key {
            "fieldSelector" => Some(VERB_FIELD_SELECTORS),
            "labelSelector" => Some(VERB_LABEL_SELECTORS),
            _ => None,
        };
        let value: Vec<u8> = match table {
            Some(t) => t.get(usize::from(vb) % t.len()).map(|s| s.0.as_bytes().to_vec()).unwrap_or_default(),
            None if vb < 0xC0 => VERB_VALUES.get(usize::from(vb) % VERB_VALUES.len()).map(|v| v.to_vec()).unwrap_or_default(),
            None => it.by_ref().take(usize::from(vb & 0x3F)).collect(),
        };
        target.push(if params.is_empty() { b'?' } else { b'&' });
        encode_query_part(key.as_bytes(), kb & 0x10 != 0, false, &mut target);
        target.push(b'=');
        encode_query_part(&value, kb & 0x20 != 0, kb & 0x40 != 0, &mut target);
        params.push((key, value));
    }
    VerbCase { method, kind, target, params }
}

/// Reference: `c` equals the ASCII `x` under Unicode simple case folding iff it is `x`, or its
/// case mapping is exactly the other case of `x`, Turkic-only mappings (U+0130, U+0131) aside.
fn ref_fold_eq(c: char, x: char) -> bool {
    fn single(mut cs: impl Iterator<Item = char>) -> Option<char> {
        cs.next().filter(|_| cs.next().is_none())
    }
    c == x
        || (c != '\u{130}'
            && c != '\u{131}'
            && (single(c.to_lowercase()) == Some(x.to_ascii_lowercase()) || single(c.to_uppercase()) == Some(x.to_ascii_uppercase())))
}

/// Reference: Go's `strings.EqualFold(v, target)` for an ASCII target; invalid UTF-8 decodes to
/// U+FFFD, which equals no ASCII character.
fn ref_equal_fold(v: &[u8], target: &str) -> bool {
    let Ok(v) = std::str::from_utf8(v) else { return false };
    v.chars().count() == target.chars().count() && v.chars().zip(target.chars()).all(|(c, x)| ref_fold_eq(c, x))
}

/// Reference: apimachinery's `Convert_Slice_string_To_bool` on one value.
fn ref_convert_bool(v: &[u8]) -> bool {
    !(v == b"0" || ref_equal_fold(v, "false"))
}

/// Reference: Go's `strconv.ParseInt(v, 10, 64)` succeeds.
fn ref_parses_int64(v: &[u8]) -> bool {
    let (negative, digits) = match v.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, v),
    };
    let limit: u128 = if negative { 1 << 63 } else { (1 << 63) - 1 };
    let mut n: u128 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return false;
        }
        n = n * 10 + u128::from(d - b'0');
        if n > limit {
            return false;
        }
    }
    !digits.is_empty()
}

/// Reference: the verb upstream's `NewRequestInfo` gives the case.
fn reference_verb(case: &VerbCase) -> String {
    let first = |key: &str| case.params.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_slice());
    let valid_in = |key: &str, table: &[(&str, bool)]| first(key).is_none_or(|v| table.iter().any(|(s, ok)| s.as_bytes() == v && *ok));
    let by_method = |get: &str| match case.method {
        "GET" | "HEAD" => get.to_string(),
        "POST" => "create".into(),
        "PUT" => "update".into(),
        "PATCH" => "patch".into(),
        "DELETE" if case.kind == PathKind::Collection => "deletecollection".into(),
        "DELETE" => "delete".into(),
        _ => String::new(),
    };
    match case.kind {
        PathKind::NonResource => case.method.to_ascii_lowercase(),
        PathKind::WatchPrefix => "watch".into(),
        PathKind::Named => by_method("get"),
        PathKind::Collection => {
            let decodes = first("limit").is_none_or(ref_parses_int64)
                && first("timeoutSeconds").is_none_or(ref_parses_int64)
                && valid_in("fieldSelector", VERB_FIELD_SELECTORS)
                && valid_in("labelSelector", VERB_LABEL_SELECTORS);
            let watch = first("watch").is_some_and(|v| {
                if decodes {
                    ref_convert_bool(v)
                } else {
                    // `strings.ToLower(v)` is "false" or "0": no non-ASCII rune lowercases to
                    // a character of either.
                    !(v == b"0" || v.eq_ignore_ascii_case(b"false"))
                }
            });
            by_method(if watch { "watch" } else { "list" })
        }
    }
}

/// `parse_request_info` gives the verb a small reference model of upstream's rules gives (the
/// `watch` query parameter converted by `strings.EqualFold`, or lowercased when the list options
/// do not decode), and `sendInitialEvents` converted as upstream converts it.
pub fn request_verb(data: &[u8]) -> bool {
    let case = verb_case(data);
    let info = parse_request_info(case.method, &case.target);
    let shown = String::from_utf8_lossy(&case.target).into_owned();
    assert_eq!(info.verb, reference_verb(&case), "{} {shown}", case.method);
    let initial_events = case.params.iter().find(|(k, _)| *k == "sendInitialEvents").map(|(_, v)| ref_convert_bool(v));
    assert_eq!(info.query.send_initial_events, initial_events, "{} {shown}", case.method);
    case.kind == PathKind::Collection && !case.params.is_empty()
}

// ---------------------------------------------------------------------------------------------
// the host's header-map serialization

pub const PAIRS_DICT: &[&[u8]] = &[
    b"\x00\x00\x00\x00",
    b"\x01\x00\x00\x00",
    b"\x02\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\x00",
    b"\n",
    b":",
    b":status",
    b":path",
    b"x-remote-group",
    b"\xc3\xa9",
    b"\xff",
];

/// `gateway::host::pairs` (the host's header maps, HTTP call headers and list properties) never
/// panics and never returns more pairs than the count field announces, or than the bytes can
/// hold; what it returns serializes and reads back unchanged; and a map built from the input
/// (lines `name:value`, names made valid UTF-8) read back from `serialize_pairs` is exactly that
/// map. Cut anywhere, that serialization gives a prefix of the map's pairs.
pub fn host_pairs(data: &[u8]) -> bool {
    use apf_wasm::gateway::host::{pairs, serialize_pairs};
    let got = pairs(data);
    let count = data.get(..4).and_then(|b| b.try_into().ok()).map_or(0, u32::from_le_bytes);
    assert!(got.len() as u64 <= u64::from(count), "{} pairs, count field {count}", got.len());
    // Each pair took its two sizes and its bytes, NUL-terminated (the last NUL may be missing).
    let used: usize = got.iter().map(|(k, v)| 8 + k.len() + v.len() + 2).sum();
    assert!(got.is_empty() || 4 + used <= data.len() + 1, "{} pairs of {used} bytes from {} bytes", got.len(), data.len());
    assert_eq!(pairs(&serialize_pairs(&got)), got, "the decoded pairs do not round-trip");

    let lines: Vec<(String, &[u8])> = data
        .split(|&b| b == b'\n')
        .map(|l| {
            let (k, v) = l.iter().position(|&b| b == b':').map_or((l, &l[l.len()..]), |i| (&l[..i], &l[i + 1..]));
            (String::from_utf8_lossy(k).into_owned(), v)
        })
        .collect();
    let map: Vec<(&str, &[u8])> = lines.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let bytes = serialize_pairs(&map);
    assert_eq!(pairs(&bytes), map, "serialize_pairs then pairs changed the map");
    let cuts: Vec<usize> = if bytes.len() <= 256 {
        (0..bytes.len()).collect()
    } else {
        data.iter().take(16).map(|&b| usize::from(b) * bytes.len() / 256).collect()
    };
    for at in cuts {
        let part = pairs(&bytes[..at]);
        assert!(map.starts_with(&part), "cut at {at}: {part:?} is not a prefix of the map");
    }
    !got.is_empty()
}

// ---------------------------------------------------------------------------------------------
// fleet: etcd JSON API responses
//
// `etcd_response`: the first byte's low 3 bits pick what reads the rest of the input (an
// answer's body): a range, a txn, a lease grant, a keepalive, an authenticate answer, a
// header-only answer, a replica record, or a replica's state machine (`fleet::Fleet`) given that
// answer to every call it makes; the next 3 bits pick the HTTP status (0: no answer).

pub const ETCD_DICT: &[&[u8]] = &[
    b"{\"header\":{\"revision\":\"",
    b"\"kvs\":[",
    b"{\"key\":\"",
    b"\"value\":\"",
    b"\"mod_revision\":\"",
    b"\"create_revision\":\"",
    b"\"version\":\"",
    b"\"lease\":\"",
    b"\"count\":\"",
    b"\"more\":true",
    b"\"succeeded\":true",
    b"\"responses\":[",
    b"{\"response_range\":{",
    b"{\"response_put\":{",
    b"{\"result\":{",
    b"\"ID\":\"",
    b"\"TTL\":\"",
    b"\"token\":\"",
    b"{\"error\":",
    b"\"code\":16",
    b"\"message\":\"etcdserver: requested lease not found\"",
    b"\"etcdserver: invalid auth token\"",
    b"L2FwZi13YXNtL2RlZmF1bHQvcmVwbGljYXMv",
    b"L2FwZi13YXNtL2RlZmF1bHQvcmVwbGljYXMvZnV6eg==",
    b"{\"format\":1",
    b"\"levels\":{",
    b"\"global-default\":{",
    b"\"claim\":",
    b"\"granted\":",
    b"\"inUse\":",
    b"\"avg\":",
    b"\"stdDev\":",
    b"\"highWatermark\":",
    b"\"smoothed\":",
    b"9223372036854775807",
    b"18446744073709551616",
    b"-1",
    b"1e308",
    b"\"\"",
    b"==",
    b"=",
    b"\n",
];

/// Decodes twice (deterministic) and, when accepted, re-encodes and decodes again to the same.
fn decode_again<T: PartialEq + std::fmt::Debug, E: PartialEq + std::fmt::Debug>(
    decode: impl Fn() -> Result<T, E>,
    again: impl Fn(&T) -> Result<T, E>,
) -> Option<T> {
    let first = decode();
    assert_eq!(first, decode(), "decoding is not deterministic");
    let v = first.ok()?;
    assert_eq!(again(&v).as_ref().ok(), Some(&v), "re-encoded answer decodes differently");
    Some(v)
}

pub fn etcd_response(data: &[u8]) -> bool {
    use apf_wasm::etcd::{self, AuthenticateResponse, LeaseResponse, RangeResponse, TxnResponse};
    use apf_wasm::fleet::record::Record;
    use apf_wasm::fleet::snapshot::Snapshot;
    let Some((&sel, body)) = data.split_first() else { return false };
    let status = [200u16, 200, 200, 0, 400, 401, 404, 503][usize::from((sel >> 3) & 7)];
    let json = |v: serde_json::Value| serde_json::to_vec(&v).unwrap_or_default();
    match sel & 7 {
        0 => {
            let Some(r) = decode_again(|| RangeResponse::decode(status, body), |r| RangeResponse::decode(200, &json(r.to_json()))) else {
                return false;
            };
            if let Ok(snapshot) = Snapshot::from_range(b"/apf-wasm/default/replicas/", &r) {
                assert!(snapshot.replicas.windows(2).all(|w| w[0].id < w[1].id));
                for record in snapshot.replicas.iter().filter_map(|e| e.record.as_ref().ok()) {
                    assert_eq!(Record::decode(&record.encode()).as_ref(), Ok(record));
                }
            }
            true
        }
        1 => decode_again(|| TxnResponse::decode(status, body), |t| TxnResponse::decode(200, &json(t.to_json()))).is_some(),
        2 => decode_again(|| LeaseResponse::decode_grant(status, body), |l| LeaseResponse::decode_grant(200, &json(l.to_json()))).is_some(),
        3 => decode_again(|| LeaseResponse::decode_keepalive(status, body), |l| LeaseResponse::decode_keepalive(200, &l.keepalive_body()))
            .is_some(),
        4 => {
            decode_again(|| AuthenticateResponse::decode(status, body), |a| AuthenticateResponse::decode(200, &json(a.to_json()))).is_some()
        }
        5 => {
            let h = etcd::decode_header_only(status, body);
            assert_eq!(h, etcd::decode_header_only(status, body));
            h.is_ok()
        }
        6 => decode_again(|| Record::decode(body), |r| Record::decode(&r.encode())).is_some(),
        _ => fleet_given(status, body),
    }
}

/// A registered replica whose every call from then on gets this answer: no panic, and its
/// limits keep their shape (exempt levels unlimited; nothing while joining).
fn fleet_given(status: u16, body: &[u8]) -> bool {
    use apf_wasm::fleet::{Fleet, FleetConfig, FleetMode, FleetPolicy};
    use apf_wasm::simulate::memetcd::MemEtcd;
    let policy = FleetPolicy::new(100, &default_policy().priority_levels);
    let exempt: Vec<bool> = policy.levels.iter().map(|l| l.exempt).collect();
    let Ok(config) = FleetConfig::from_json(&serde_json::json!({"etcd": {"cluster": "etcd"}})) else { return false };
    let Ok(mut fleet) = Fleet::new(config, policy, "fuzz") else { return false };
    let mut etcd = MemEtcd::new();
    let mut now: i64 = 1_000_000_000_000;
    let mut calls = fleet.tick(now);
    while let Some(c) = calls.pop() {
        let (s, b) = etcd.handle(c.path, &c.headers, &c.body, now);
        calls.extend(fleet.on_response(c.id, s, &b, now));
    }
    let mut generation = fleet.generation();
    for _ in 0..6 {
        now += 700_000_000;
        let mut calls = fleet.tick(now);
        let mut answered = 0;
        while let Some(c) = calls.pop() {
            answered += 1;
            assert!(answered < 64, "a replica keeps calling on one answer");
            calls.extend(fleet.on_response(c.id, status, body, now));
        }
        let limits = fleet.limits();
        assert_eq!(limits.len(), exempt.len());
        for (l, &e) in limits.iter().zip(&exempt) {
            assert_eq!(l.is_none(), e, "exempt levels and only they are unlimited");
            if fleet.mode() == FleetMode::Joining {
                assert!(l.unwrap_or(0) == 0, "seats while joining");
            }
        }
        assert!(fleet.generation() >= generation);
        generation = fleet.generation();
    }
    fleet.mode() == FleetMode::Synced
}
