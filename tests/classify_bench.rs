#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Benchmark (not a test): `cargo test --release --test classify_bench -- --ignored --nocapture`.
use apf_wasm::classify::Classifier;
use apf_wasm::digest::identity::UserInfo;
use apf_wasm::digest::request_info::{parse_request_info, RequestInfo};
use apf_wasm::policy::bootstrap::default_policy;
use apf_wasm::policy::model::*;
use std::hint::black_box;
use std::time::Instant;

fn requests() -> Vec<(RequestInfo, UserInfo)> {
    let au = |n: &str, g: &[&str]| UserInfo::authenticated(n, &g.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    vec![
        (parse_request_info("GET", b"/api/v1/namespaces/default/pods"), au("alice", &["dev"])),
        (parse_request_info("GET", b"/api/v1/namespaces/default/pods/x"), au("system:serviceaccount:default:default", &[])),
        (
            parse_request_info("PUT", b"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kcm"),
            au("system:kube-controller-manager", &[]),
        ),
        (parse_request_info("PATCH", b"/api/v1/nodes/n1/status"), au("system:node:n1", &["system:nodes"])),
        (parse_request_info("GET", b"/healthz"), UserInfo::anonymous()),
        (parse_request_info("GET", b"/api/v1/pods?watch=true"), au("bob", &[])),
    ]
}

fn bench(name: &str, c: &Classifier, reqs: &[(RequestInfo, UserInfo)], iters: usize) {
    let start = Instant::now();
    let mut acc = 0u64;
    for i in 0..iters {
        let (info, user) = &reqs[i % reqs.len()];
        acc = acc.wrapping_add(black_box(c.classify(info, user)).flow_hash);
    }
    let ns = start.elapsed().as_nanos() as f64 / iters as f64;
    println!("{name}: {ns:.0} ns/request (acc {acc})");
}

#[test]
#[ignore]
fn bench_classify() {
    let p = default_policy();
    let reqs = requests();
    bench("default policy", &Classifier::new(&p), &reqs, 2_000_000);
    // 1,000 extra FlowSchemas that never match (users u0..u999) before the defaults
    let mut big = p.clone();
    let extra: Vec<FlowSchema> = (0..1000)
        .map(|i| FlowSchema {
            name: format!("fs-{i:04}"),
            uid: String::new(),
            matching_precedence: 200,
            priority_level: "global-default".into(),
            distinguisher: Some(Distinguisher::ByUser),
            rules: vec![PolicyRulesWithSubjects {
                subjects: vec![Subject::User { name: format!("u{i}") }],
                resource_rules: vec![ResourcePolicyRule {
                    verbs: vec!["*".into()],
                    api_groups: vec!["*".into()],
                    resources: vec!["*".into()],
                    cluster_scope: true,
                    namespaces: vec!["*".into()],
                }],
                non_resource_rules: vec![],
            }],
        })
        .collect();
    big.flow_schemas.splice(2..2, extra);
    bench("1000 extra FlowSchemas", &Classifier::new(&big), &reqs, 200_000);
}
