#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The gateway writes each request's digest over the previous one's (its strings' buffers
//! reused): whatever came before, the result is exactly what a fresh digest gives.
use apf_wasm::classify::{Classification, Classifier};
use apf_wasm::digest::identity::{IdentityConfig, IdentityInput, UserInfo};
use apf_wasm::digest::request_info::{parse_generic, parse_generic_into, parse_request_info, parse_request_info_into, RequestInfo};
use apf_wasm::policy::bootstrap::effective_policy;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// Targets and methods covering every branch of the request-info parser: non-resource paths,
/// groupless and grouped APIs, special verbs, namespaces and their subresources, collection
/// verbs, selectors (a pinned name), queries that fail to decode, escapes, bad bytes.
const TARGETS: [&str; 24] = [
    "/api/v1/namespaces/default/pods",
    "/api/v1/namespaces/default/pods/web-0",
    "/api/v1/namespaces/default/pods/web-0/log?follow=true",
    "/apis/apps/v1/namespaces/kube-system/deployments/coredns/scale",
    "/api/v1/pods?watch=true&resourceVersion=12&sendInitialEvents=true",
    "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dweb-1&labelSelector=app%3Dx",
    "/api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dweb-1&limit=x",
    "/api/v1/watch/namespaces/ns/pods?timeout=4s&timeoutSeconds=30&limit=500&continue=abc",
    "/api/v1/proxy/namespaces/ns/pods/p/sub",
    "/api/v1/namespaces/ns",
    "/api/v1/namespaces/ns/status",
    "/api/v1/namespaces/ns/finalize",
    "/api/v1//pods",
    "/api/v1/watch",
    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1",
    "/healthz?verbose",
    "/debug/pprof/profile",
    "/",
    "",
    "/api/v1/namespaces/caf%C3%A9/pods%2Fx?x=%zz",
    "/api/v1/namespaces/\u{e9}/pods",
    "///apis///",
    "/api/v1/namespaces/a/pods?watch=FALSE&fieldSelector=a%3Db%2Cc!%3Dd",
    "/apis/g/v1/things/n?watch=1&timeout=bad",
];
const METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "get"];

#[test]
fn request_info_written_over_any_other_equals_a_fresh_one() {
    let mut rng = Rng(7);
    let mut reused = RequestInfo::default();
    let mut generic = RequestInfo::default();
    for _ in 0..2000 {
        let target = TARGETS[rng.below(TARGETS.len() as u64) as usize].as_bytes();
        let method = METHODS[rng.below(METHODS.len() as u64) as usize];
        parse_request_info_into(&mut reused, method, target);
        assert_eq!(reused, parse_request_info(method, target), "{method} {target:?}");
        assert_eq!(reused.parts(), parse_request_info(method, target).parts());
        let ns: Option<&[u8]> = [None, Some(&b" team-a "[..]), Some(&b"\xff"[..])][rng.below(3) as usize];
        parse_generic_into(&mut generic, method, target, ns);
        assert_eq!(generic, parse_generic(method, target, ns), "{method} {target:?} {ns:?}");
    }
}

#[test]
fn users_written_over_any_other_equal_fresh_ones() {
    let cfg: IdentityConfig = serde_json::from_str(r#"{"sources":[{"type":"frontProxy"},{"type":"impersonation"}]}"#).unwrap();
    let requests: [&[(&str, &[u8])]; 7] = [
        &[("x-remote-user", b"alice"), ("x-remote-group", b"dev, ops,"), ("x-remote-group", b"qa")],
        &[("x-remote-user", b"system:serviceaccount:ns:sa"), ("x-remote-group", b"system:serviceaccounts:ns")],
        &[("x-remote-user", b"bob")],
        &[("x-remote-user", b"system:anonymous"), ("x-remote-group", b"system:unauthenticated,extra")],
        &[("impersonate-user", b"system:serviceaccount:a:b")],
        &[("impersonate-user", b"carol"), ("impersonate-group", b"g1"), ("x-remote-group", b"\xff")],
        &[],
    ];
    let mut rng = Rng(11);
    let mut reused = UserInfo::default();
    for _ in 0..500 {
        let headers = requests[rng.below(requests.len() as u64) as usize];
        let input = IdentityInput { headers, ..Default::default() };
        cfg.identified(&input).user_into(&mut reused);
        assert_eq!(reused, cfg.identified(&input).user(), "{headers:?}");
    }
}

#[test]
fn classification_written_over_any_other_equals_a_fresh_one() {
    let classifier = Classifier::new(&effective_policy(&[], true).unwrap());
    let users = [
        UserInfo::authenticated("alice", &[]),
        UserInfo::authenticated("system:kube-controller-manager", &[]),
        UserInfo::authenticated("system:serviceaccount:kube-system:x", &[]),
        UserInfo::anonymous(),
        UserInfo::authenticated("admin", &["system:masters".to_string()]),
    ];
    let mut rng = Rng(13);
    let mut reused = Classification::default();
    for _ in 0..1000 {
        let info = parse_request_info(METHODS[rng.below(6) as usize], TARGETS[rng.below(TARGETS.len() as u64) as usize].as_bytes());
        let user = &users[rng.below(users.len() as u64) as usize];
        classifier.classify_into(&info, user, &mut reused);
        assert_eq!(reused, classifier.classify(&info, user));
    }
}
