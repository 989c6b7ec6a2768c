#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Built-in configuration (`pkg/apis/flowcontrol/bootstrap/default.go`) and effective-policy
//! assembly (`apf_controller.go: digestConfigObjects`, `digestFlowSchemasLocked`).
use apf_wasm::policy::model::{Distinguisher, LimitResponse, PriorityLevelSpec, Subject};
use apf_wasm::policy::{default_policy, effective_policy, policy_from_json};

#[test]
fn priority_levels_table_8_1() {
    let p = default_policy();
    let names: Vec<&str> = p.priority_levels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["catch-all", "exempt", "global-default", "leader-election", "node-high", "system", "workload-high", "workload-low"]);
    // name → (NCS, lendable, queues/hand/qll or None for Reject)
    type Row<'a> = (&'a str, i32, i32, Option<(i32, i32, i32)>);
    let want: [Row; 7] = [
        ("catch-all", 5, 0, None),
        ("system", 30, 33, Some((64, 6, 50))),
        ("node-high", 40, 25, Some((64, 6, 50))),
        ("leader-election", 10, 0, Some((16, 4, 50))),
        ("workload-high", 40, 50, Some((128, 6, 50))),
        ("workload-low", 100, 90, Some((128, 6, 50))),
        ("global-default", 20, 50, Some((128, 6, 50))),
    ];
    for (name, ncs, lend, q) in want {
        let l = &p.priority_levels[p.level_index(name).unwrap()];
        assert!(l.uid.is_empty());
        match &l.spec {
            PriorityLevelSpec::Limited { nominal_concurrency_shares, lendable_percent, borrowing_limit_percent, limit_response } => {
                assert_eq!((*nominal_concurrency_shares, *lendable_percent), (ncs, lend), "{name}");
                assert_eq!(*borrowing_limit_percent, None, "{name}");
                match (limit_response, q) {
                    (LimitResponse::Reject, None) => {}
                    (LimitResponse::Queue(qq), Some((a, b, c))) => {
                        assert_eq!((qq.queues, qq.hand_size, qq.queue_length_limit), (a, b, c), "{name}")
                    }
                    other => panic!("{name}: {other:?}"),
                }
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let e = &p.priority_levels[p.level_index("exempt").unwrap()];
    assert_eq!(e.spec, PriorityLevelSpec::Exempt { nominal_concurrency_shares: 0, lendable_percent: 0 });
    let share_sum: i32 = p.priority_levels.iter().map(|l| l.nominal_concurrency_shares()).sum();
    assert_eq!(share_sum, 245);
}

fn groups(names: &[&str]) -> Vec<Subject> {
    names.iter().map(|n| Subject::Group { name: n.to_string() }).collect()
}

#[test]
fn flow_schemas_table_8_2() {
    let p = default_policy();
    use Distinguisher::*;
    let want: [(i32, &str, &str, Option<Distinguisher>); 11] = [
        (1, "exempt", "exempt", None),
        (2, "probes", "exempt", None),
        (100, "system-leader-election", "leader-election", Some(ByUser)),
        (400, "system-node-high", "node-high", Some(ByUser)),
        (500, "system-nodes", "system", Some(ByUser)),
        (800, "kube-controller-manager", "workload-high", Some(ByNamespace)),
        (800, "kube-scheduler", "workload-high", Some(ByNamespace)),
        (900, "kube-system-service-accounts", "workload-high", Some(ByNamespace)),
        (9000, "service-accounts", "workload-low", Some(ByUser)),
        (9900, "global-default", "global-default", Some(ByUser)),
        (10000, "catch-all", "catch-all", Some(ByUser)),
    ];
    assert_eq!(p.flow_schemas.len(), want.len());
    for (fs, (prec, name, level, d)) in p.flow_schemas.iter().zip(want) {
        assert_eq!((fs.matching_precedence, fs.name.as_str(), fs.priority_level.as_str(), fs.distinguisher), (prec, name, level, d));
        assert_eq!(fs.rules.len(), 1, "{name}");
        assert!(fs.uid.is_empty());
    }
    let by = |n: &str| p.flow_schemas.iter().find(|f| f.name == n).unwrap().rules[0].clone();
    let sa_ks = Subject::ServiceAccount { namespace: "kube-system".into(), name: "*".into() };
    let user = |n: &str| Subject::User { name: n.into() };
    assert_eq!(by("exempt").subjects, groups(&["system:masters"]));
    assert_eq!(by("probes").subjects, groups(&["system:unauthenticated", "system:authenticated"]));
    assert_eq!(by("probes").non_resource_rules[0].verbs, ["get"]);
    assert_eq!(by("probes").non_resource_rules[0].non_resource_urls, ["/healthz", "/readyz", "/livez"]);
    assert!(by("probes").resource_rules.is_empty());
    let le = by("system-leader-election");
    assert_eq!(le.subjects, vec![user("system:kube-controller-manager"), user("system:kube-scheduler"), sa_ks.clone()]);
    assert_eq!(le.resource_rules[0].verbs, ["get", "create", "update"]);
    assert_eq!(le.resource_rules[0].api_groups, ["coordination.k8s.io"]);
    assert_eq!(le.resource_rules[0].resources, ["leases"]);
    assert_eq!(le.resource_rules[0].namespaces, ["*"]);
    assert!(!le.resource_rules[0].cluster_scope);
    let nh = by("system-node-high");
    assert_eq!(nh.subjects, groups(&["system:nodes"]));
    assert_eq!(nh.resource_rules[0].api_groups, [""]);
    assert_eq!(nh.resource_rules[0].resources, ["nodes", "nodes/status"]);
    assert!(nh.resource_rules[0].cluster_scope);
    assert_eq!(nh.resource_rules[1].resources, ["leases"]);
    assert!(!nh.resource_rules[1].cluster_scope);
    assert_eq!(by("system-nodes").subjects, groups(&["system:nodes"]));
    assert_eq!(by("kube-controller-manager").subjects, vec![user("system:kube-controller-manager")]);
    assert_eq!(by("kube-scheduler").subjects, vec![user("system:kube-scheduler")]);
    assert_eq!(by("kube-system-service-accounts").subjects, vec![sa_ks]);
    assert_eq!(by("service-accounts").subjects, groups(&["system:serviceaccounts"]));
    for n in ["global-default", "catch-all"] {
        assert_eq!(by(n).subjects, groups(&["system:unauthenticated", "system:authenticated"]));
    }
    for n in [
        "exempt",
        "system-nodes",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-system-service-accounts",
        "service-accounts",
        "global-default",
        "catch-all",
    ] {
        let r = by(n);
        let rr = &r.resource_rules[0];
        assert_eq!(
            (rr.verbs.clone(), rr.api_groups.clone(), rr.resources.clone(), rr.namespaces.clone(), rr.cluster_scope),
            (vec!["*".to_string()], vec!["*".to_string()], vec!["*".to_string()], vec!["*".to_string()], true),
            "{n}"
        );
        assert_eq!(r.non_resource_rules[0].verbs, ["*"]);
        assert_eq!(r.non_resource_rules[0].non_resource_urls, ["*"]);
    }
}

#[test]
fn suggested_off_leaves_only_mandatory() {
    let p = effective_policy(&[], false).unwrap();
    assert_eq!(p.priority_levels.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["catch-all", "exempt"]);
    assert_eq!(p.flow_schemas.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), ["exempt", "catch-all"]);
    assert!(p.warnings.is_empty());
}

#[test]
fn kubectl_fixture_effective_policy() {
    let bytes = std::fs::read("tests/fixtures/policy/kubectl-get-v1.json").unwrap();
    let p = policy_from_json(&bytes, true).unwrap();
    // user objects added / replacing, uids carried over
    let team = &p.priority_levels[p.level_index("team-a").unwrap()];
    assert_eq!(team.uid, "7a7a7a7a-team-a-pl");
    assert_eq!(team.nominal_concurrency_shares(), 25);
    let batch = &p.priority_levels[p.level_index("batch").unwrap()];
    assert_eq!(batch.nominal_concurrency_shares(), 30, "v1 nil shares → 30");
    assert_eq!(batch.lendable_percent(), 0);
    let exempt = &p.priority_levels[p.level_index("exempt").unwrap()];
    assert_eq!(exempt.uid, "e1e1e1e1-exempt-pl");
    assert_eq!(exempt.spec, PriorityLevelSpec::Exempt { nominal_concurrency_shares: 10, lendable_percent: 0 });
    // sorted by name
    let names: Vec<_> = p.priority_levels.iter().map(|l| l.name.clone()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    // FlowSchemas: team-a at 1500 between system-nodes... order by precedence, catch-all uid from user
    let order: Vec<_> = p.flow_schemas.iter().map(|f| (f.matching_precedence, f.name.as_str())).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]));
    let fs = p.flow_schemas.iter().find(|f| f.name == "team-a").unwrap();
    assert_eq!(fs.uid, "6f1a0b3c-1111-4a2b-9c3d-0123456789ab");
    assert_eq!(fs.distinguisher, Some(Distinguisher::ByNamespace));
    assert_eq!(fs.rules[0].subjects.len(), 3);
    assert_eq!(p.flow_schemas.last().unwrap().uid, "0a6f-catch-all-fs");
    // dangling one dropped with upstream's message
    assert!(p.flow_schemas.iter().all(|f| f.name != "orphan"));
    assert_eq!(
        p.warnings,
        [
            r#"FlowSchema "orphan" ignored: This FlowSchema references the PriorityLevelConfiguration object named "deleted-level" but there is no such object"#
        ]
    );
}

#[test]
fn user_replaces_suggested_by_name() {
    let json = br#"[{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration",
        "metadata":{"name":"global-default","uid":"u1"},
        "spec":{"type":"Limited","limited":{"nominalConcurrencyShares":7,"limitResponse":{"type":"Reject"}}}},
      {"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{"name":"global-default"},
        "spec":{"priorityLevelConfiguration":{"name":"global-default"},"matchingPrecedence":50,
        "rules":[{"subjects":[{"kind":"Group","group":{"name":"*"}}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}}]"#;
    let p = policy_from_json(json, true).unwrap();
    let gd = &p.priority_levels[p.level_index("global-default").unwrap()];
    assert_eq!(gd.uid, "u1");
    assert_eq!(gd.nominal_concurrency_shares(), 7);
    assert_eq!(p.priority_levels.len(), 8);
    assert_eq!(p.flow_schemas.len(), 11);
    assert_eq!(p.flow_schemas[2].name, "global-default");
    assert_eq!(p.flow_schemas[2].matching_precedence, 50);
    assert!(p.flow_schemas[2].uid.is_empty());
}

#[test]
fn dangling_when_suggested_levels_off() {
    let json = br#"{"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{"name":"x"},
        "spec":{"priorityLevelConfiguration":{"name":"workload-low"},
        "rules":[{"subjects":[{"kind":"User","user":{"name":"u"}}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}}"#;
    let p = policy_from_json(json, false).unwrap();
    assert_eq!(p.flow_schemas.len(), 2);
    assert_eq!(p.warnings.len(), 1);
    assert!(p.warnings[0].contains(r#"named "workload-low" but there is no such object"#));
    let p = policy_from_json(json, true).unwrap();
    assert!(p.warnings.is_empty());
    assert_eq!(p.flow_schemas.iter().find(|f| f.name == "x").unwrap().matching_precedence, 1000);
}
