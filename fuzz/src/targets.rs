//! The fuzz targets, shared by the `cargo fuzz` binaries (`fuzz/fuzz_targets/*.rs`) and the
//! in-repo mutation fuzzer (`tests/fuzz_targets.rs`). Each takes arbitrary bytes, must never
//! panic, and asserts properties beyond "no panic" (a failed assertion is a finding). Each
//! returns whether the input was accepted as valid (the mutation fuzzer keeps accepted mutants).
//!
//! Input formats (seed corpora under `fuzz/corpus/<target>/`):
//! - `plugin_config`: the plugin configuration JSON.
//! - `request_info`: `METHOD SP path?query [LF namespace-header-value]`.
//! - `identity`: first line an `IdentityConfig` JSON (a fixed config with every source kind when
//!   it does not parse), then lines `@peer IP`, `@mtls`, `@subject SUBJECT`, `@jwt JSON` or
//!   `header-name: value` (raw bytes).
//! - `duration`: a Go duration string.
//! - `codec_reader`: a script of `Reader` operations (first byte of each step) over the rest.
//! - `state_*`: bytes as stored in the shared key-value store.

use apf_wasm::codec::{Reader, Writer};
use apf_wasm::digest::identity::{identify, parse_subject, service_account_namespace, IdentityConfig, IdentityInput, UserInfo};
use apf_wasm::digest::request_info::{parse_generic, parse_request_info, RequestInfo};
use apf_wasm::duration::{format_go_duration, parse_go_duration};
use apf_wasm::limits::integrator::Integrator;
use apf_wasm::limits::retry_after::DroppedRequestsTracker;
use apf_wasm::policy::parse_plugin_config;
use std::net::IpAddr;

/// (name, target, dictionary, max input length).
pub type Entry = (&'static str, fn(&[u8]) -> bool, &'static [&'static [u8]], usize);

pub const TARGETS: &[Entry] = &[
    ("plugin_config", plugin_config, CONFIG_DICT, 64 * 1024),
    ("request_info", request_info, PATH_DICT, 8 * 1024),
    ("identity", identity, IDENTITY_DICT, 8 * 1024),
    ("duration", duration, DURATION_DICT, 256),
    ("codec_reader", codec_reader, &[], 4096),
    ("state_integrator", state_integrator, &[], 4096),
    ("state_retry_after", state_retry_after, &[], 4096),
];

pub fn find(name: &str) -> Option<&'static Entry> {
    TARGETS.iter().find(|e| e.0 == name)
}

pub const CONFIG_DICT: &[&[u8]] = &[
    b"\"serverConcurrencyLimit\":", b"\"requestTimeout\":", b"\"suggestedDefaults\":", b"\"requestMode\":",
    b"\"namespaceHeader\":", b"\"identity\":", b"\"workEstimator\":", b"\"enforce\":", b"\"dryRunPriorityLevels\":",
    b"\"debugGroups\":", b"\"explainGroups\":", b"\"policy\":", b"\"generic\"", b"\"kubernetes\"", b"true", b"false",
    b"null", b"{}", b"[]", b",", b"\"kind\":\"List\"", b"\"items\":", b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1\"",
    b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1beta1\"", b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1beta2\"",
    b"\"apiVersion\":\"flowcontrol.apiserver.k8s.io/v1beta3\"", b"\"kind\":\"FlowSchema\"",
    b"\"kind\":\"PriorityLevelConfiguration\"", b"\"metadata\":{\"name\":\"x\"}", b"\"spec\":", b"\"type\":\"Limited\"",
    b"\"type\":\"Exempt\"", b"\"type\":\"Queue\"", b"\"type\":\"Reject\"", b"\"limited\":", b"\"exempt\":",
    b"\"nominalConcurrencyShares\":", b"\"assuredConcurrencyShares\":", b"\"lendablePercent\":",
    b"\"borrowingLimitPercent\":", b"\"limitResponse\":", b"\"queuing\":", b"\"queues\":", b"\"handSize\":",
    b"\"queueLengthLimit\":", b"\"matchingPrecedence\":", b"\"priorityLevelConfiguration\":{\"name\":\"global-default\"}",
    b"\"distinguisherMethod\":{\"type\":\"ByUser\"}", b"\"distinguisherMethod\":{\"type\":\"ByNamespace\"}", b"\"rules\":",
    b"\"subjects\":", b"\"kind\":\"User\"", b"\"kind\":\"Group\"", b"\"kind\":\"ServiceAccount\"", b"\"user\":{\"name\":\"*\"}",
    b"\"group\":{\"name\":\"system:authenticated\"}", b"\"serviceAccount\":{\"namespace\":\"*\",\"name\":\"*\"}",
    b"\"resourceRules\":", b"\"nonResourceRules\":", b"\"verbs\":[\"*\"]", b"\"apiGroups\":[\"*\"]", b"\"resources\":[\"*\"]",
    b"\"clusterScope\":true", b"\"namespaces\":[\"*\"]", b"\"nonResourceURLs\":[\"*\"]", b"\"/healthz/*\"",
    b"\"catch-all\"", b"\"exempt\"", b"\"global-default\"", b"\"workload-low\"", b"\"system\"", b"\"leader-election\"",
    b"\"sources\":[{\"type\":\"frontProxy\"}]", b"\"trustedSourceCidrs\":[\"10.0.0.0/8\"]", b"\"60s\"", b"\"1h2m3.5s\"",
    b"\"-1s\"", b"\"9223372036s\"", b"\"\\u0000\"", b"\"\\ud800\"", b"1e999",
];

pub const PATH_DICT: &[&[u8]] = &[
    b"GET ", b"LIST ", b"POST ", b"PUT ", b"PATCH ", b"DELETE ", b"HEAD ", b"OPTIONS ", b"WATCH ", b"/api", b"/apis", b"/v1",
    b"/namespaces", b"/namespaces/", b"/watch", b"/proxy", b"/pods", b"/status", b"/finalize", b"/log", b"/exec",
    b"/apps", b"/deployments", b"/..", b"/.", b"//", b"%2F", b"%2f", b"%", b"%zz", b"%00", b"%ff", b"?", b"&", b"=", b";",
    b"+", b"#", b"watch=true", b"watch=1", b"watch=false", b"limit=500", b"limit=-1", b"limit=99999999999999999999",
    b"continue=abc", b"resourceVersion=0", b"resourceVersionMatch=NotOlderThan", b"sendInitialEvents=true",
    b"fieldSelector=metadata.name%3Dfoo", b"fieldSelector=metadata.name==foo,a!=b", b"labelSelector=app%20in%20(a,b)",
    b"labelSelector=!x", b"timeoutSeconds=30", b"timeout=1m", b"timeout=-1s", b"timeout=1e9h", b"\xff\xfe", b"\n",
    b"/debug/pprof/", b"/healthz", b"/openapi/v2",
];

pub const IDENTITY_DICT: &[&[u8]] = &[
    b"\nx-remote-user: ", b"\nx-remote-group: ", b"\nx-remote-extra-scopes: ", b"\nimpersonate-user: ",
    b"\nimpersonate-group: ", b"\nimpersonate-uid: ", b"\nimpersonate-extra-foo: ", b"\n@peer 10.1.2.3",
    b"\n@peer ::ffff:10.1.2.3", b"\n@peer 2001:db8::1", b"\n@mtls", b"\n@subject CN=alice,O=dev", b"\n@jwt {\"sub\":\"x\"}",
    b"system:serviceaccount:", b"system:serviceaccount:ns:name", b"system:authenticated", b"system:unauthenticated",
    b"system:anonymous", b"system:masters", b",", b", ,", b"\\,", b"CN=", b"O=", b"+", b"\"", b"/0", b"/32", b"/128", b"/33",
    b"{\"type\":\"frontProxy\"}", b"{\"type\":\"impersonation\"}", b"{\"type\":\"clientCertificate\"}", b"{\"type\":\"jwt\"}",
    b"\"trustedSourceCidrs\":[\"0.0.0.0/0\"]", b"\"requireMtls\":true", b"\"stripUntrusted\":true", b"\"groups\":[\"a\",1]",
];

pub const DURATION_DICT: &[&[u8]] = &[
    b"ns", b"us", b"\xc2\xb5s", b"\xce\xbcs", b"ms", b"s", b"m", b"h", b".", b"-", b"+", b"0", b"9223372036854775807",
    b"9223372036854775808", b"2562047h", b"47m", b"16.854775807s", b"1e3s", b"d",
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
pub const STRICT_EMPTY_RESOURCE: bool = false;

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
        assert!(info.parts.first() == Some(&info.resource) || info.parts.is_empty(), "resource is the first part: {info:?}");
    } else {
        assert!(info.resource.is_empty() && info.api_prefix.is_empty(), "non-resource request with resource fields: {info:?}");
    }
    let _ = info.is_long_running();
    let _ = info.is_watch();
    let _ = info.query.decode_failed();
}

pub fn request_info(data: &[u8]) -> bool {
    let (method, target, ns) = split_request(data);
    let info = parse_request_info(&method, target);
    check_request_info(&info);
    assert!(info == parse_request_info(&method, target), "parse_request_info is not deterministic");
    let generic = parse_generic(&method, target, ns);
    check_request_info(&generic);
    assert!(!generic.is_resource_request);
    assert_eq!(generic.path, info.path, "both modes decode the path the same way");
    info.is_resource_request && !info.invalid
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
    let input = IdentityInput {
        headers: &case.headers,
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
        assert!(user.groups.iter().any(|g| g == "system:serviceaccounts"), "service account groups: {user:?}");
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
            assert!(!e.is_empty());
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
        let res = match op % 12 {
            0 => r.u8().map(|v| w.u8(v)),
            1 => r.bool().map(|v| w.bool(v)),
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
            Ok(()) => kinds.push(op % 12),
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
            1 => r2.bool().map(|v| w2.bool(v)),
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
