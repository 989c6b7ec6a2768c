#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Upstream `match_test.go: TestLiterals` vectors, `apf_controller.go: hashFlowID` vectors
//! (derived), default-policy classification.
use apf_wasm::classify::{flow_hash, matches, Classifier};
use apf_wasm::digest::identity::UserInfo;
use apf_wasm::digest::request_info::{parse_generic, parse_request_info, RequestInfo};
use apf_wasm::policy::bootstrap::default_policy;
use apf_wasm::policy::model::*;

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn fs(subjects: Vec<Subject>, rr: Vec<ResourcePolicyRule>, nr: Vec<NonResourcePolicyRule>) -> FlowSchema {
    FlowSchema {
        name: "test".into(),
        uid: String::new(),
        matching_precedence: 1000,
        priority_level: "global-default".into(),
        distinguisher: None,
        rules: vec![PolicyRulesWithSubjects { subjects, resource_rules: rr, non_resource_rules: nr }],
    }
}

fn goodu() -> UserInfo {
    UserInfo { name: "goodu".into(), groups: s(&["goodg1", "goodg2"]) }
}

fn rule(verbs: &[&str], groups: &[&str], res: &[&str], cluster: bool, ns: &[&str]) -> ResourcePolicyRule {
    ResourcePolicyRule { verbs: s(verbs), api_groups: s(groups), resources: s(res), cluster_scope: cluster, namespaces: s(ns) }
}

fn ri(ns: &str) -> RequestInfo {
    RequestInfo {
        is_resource_request: true,
        path: if ns.is_empty() { "/apis/goodapig/v1/goodrscs".into() } else { "/apis/goodapig/v1/namespaces/goodns/goodrscs".into() },
        verb: "goodverb".into(),
        api_prefix: "apis".into(),
        api_group: "goodapig".into(),
        api_version: "v1".into(),
        namespace: ns.into(),
        resource: "goodrscs".into(),
        name: "eman".into(),
        ..Default::default()
    }
}

fn user(n: &str) -> Subject {
    Subject::User { name: n.into() }
}
fn group(n: &str) -> Subject {
    Subject::Group { name: n.into() }
}

#[test]
fn literals() {
    let good = rule(&["goodverb"], &["goodapig"], &["goodrscs"], false, &["goodns"]);
    let info = ri("goodns");
    let u = goodu();
    for (subj, want) in [
        (user("goodu"), true),
        (group("goodg1"), true),
        (user("*"), true),
        (group("*"), true),
        (user("badu"), false),
        (group("badg"), false),
    ] {
        assert_eq!(matches(&fs(vec![subj.clone()], vec![good.clone()], vec![]), &info, &u), want, "{subj:?}");
    }
    let subj = || vec![user("goodu")];
    let cases = [
        (rule(&["*"], &["goodapig"], &["goodrscs"], false, &["goodns"]), true),
        (rule(&["goodverb"], &["*"], &["goodrscs"], false, &["goodns"]), true),
        (rule(&["goodverb"], &["goodapig"], &["*"], false, &["goodns"]), true),
        (rule(&["goodverb"], &["goodapig"], &["goodrscs"], false, &["*"]), true),
        (rule(&["badverb"], &["goodapig"], &["goodrscs"], false, &["goodns"]), false),
        (rule(&["goodverb"], &["badapig"], &["goodrscs"], false, &["goodns"]), false),
        (rule(&["goodverb"], &["goodapig"], &["badrscs"], false, &["goodns"]), false),
        (rule(&["goodverb"], &["goodapig"], &["goodrscs"], false, &["badns"]), false),
    ];
    for (r, want) in cases {
        assert_eq!(matches(&fs(subj(), vec![r.clone()], vec![]), &info, &u), want, "{r:?}");
    }
    // cluster-scoped variant
    let info = ri("");
    for (r, want) in [
        (rule(&["goodverb"], &["goodapig"], &["goodrscs"], true, &[]), true),
        (rule(&["*"], &["goodapig"], &["goodrscs"], true, &[]), true),
        (rule(&["goodverb"], &["*"], &["goodrscs"], true, &[]), true),
        (rule(&["goodverb"], &["goodapig"], &["*"], true, &[]), true),
        (rule(&["goodverb"], &["goodapig"], &["goodrscs"], false, &["*"]), false),
        (rule(&["goodverb"], &["goodapig"], &["goodrscs"], false, &[]), false),
    ] {
        assert_eq!(matches(&fs(subj(), vec![r.clone()], vec![]), &info, &u), want, "cluster {r:?}");
    }
    // non-resource /openapi/v2
    let info = RequestInfo { path: "/openapi/v2".into(), verb: "goodverb".into(), ..Default::default() };
    let nr = |v: &[&str], urls: &[&str]| NonResourcePolicyRule { verbs: s(v), non_resource_urls: s(urls) };
    for (r, want) in [
        (nr(&["goodverb"], &["/openapi/v2"]), true),
        (nr(&["*"], &["/openapi/v2"]), true),
        (nr(&["goodverb"], &["*"]), true),
        (nr(&["badverb"], &["/openapi/v2"]), false),
        (nr(&["goodverb"], &["/closedapi/v2"]), false),
    ] {
        assert_eq!(matches(&fs(subj(), vec![], vec![r.clone()]), &info, &u), want, "{r:?}");
    }
    // a resource request never matches non-resource rules and vice versa
    assert!(!matches(&fs(subj(), vec![], vec![nr(&["*"], &["*"])]), &ri("goodns"), &u));
    assert!(!matches(&fs(subj(), vec![rule(&["*"], &["*"], &["*"], true, &["*"])], vec![]), &info, &u));
    // empty rules never match
    let mut empty = fs(subj(), vec![], vec![]);
    empty.rules.clear();
    assert!(!matches(&empty, &ri("goodns"), &u));
}

#[test]
fn wildcard_only_when_sole() {
    let u = goodu();
    let info = ri("goodns");
    let subj = vec![user("goodu")];
    assert!(!matches(&fs(subj.clone(), vec![rule(&["get", "*"], &["goodapig"], &["goodrscs"], false, &["goodns"])], vec![]), &info, &u));
    assert!(!matches(&fs(subj.clone(), vec![rule(&["goodverb"], &["goodapig"], &["x", "*"], false, &["goodns"])], vec![]), &info, &u));
    assert!(!matches(&fs(subj.clone(), vec![rule(&["goodverb"], &["goodapig"], &["goodrscs"], false, &["*", "x"])], vec![]), &info, &u));
    // subresources: literal "pods/log" only; "pods/*" is a literal
    let log = parse_request_info("GET", b"/api/v1/namespaces/a/pods/b/log");
    let r = |res: &[&str]| fs(vec![group("*")], vec![rule(&["*"], &[""], res, false, &["*"])], vec![]);
    assert!(matches(&r(&["pods/log"]), &log, &u));
    assert!(!matches(&r(&["pods"]), &log, &u));
    assert!(!matches(&r(&["pods/*"]), &log, &u));
    assert!(!matches(&r(&["pods/logs"]), &log, &u));
    assert!(!matches(&r(&["podsXlog"]), &log, &u));
    assert!(matches(&r(&["*"]), &log, &u));
}

#[test]
fn subjects() {
    let sa = UserInfo { name: "system:serviceaccount:kube-system:default".into(), groups: vec![] };
    let info = RequestInfo { path: "/x".into(), verb: "get".into(), ..Default::default() };
    let nr = vec![NonResourcePolicyRule { verbs: s(&["*"]), non_resource_urls: s(&["*"]) }];
    let sa_subj = |ns: &str, n: &str| Subject::ServiceAccount { namespace: ns.into(), name: n.into() };
    assert!(matches(&fs(vec![sa_subj("kube-system", "*")], vec![], nr.clone()), &info, &sa));
    assert!(matches(&fs(vec![sa_subj("kube-system", "default")], vec![], nr.clone()), &info, &sa));
    assert!(!matches(&fs(vec![sa_subj("kube-system", "other")], vec![], nr.clone()), &info, &sa));
    assert!(!matches(&fs(vec![sa_subj("kube", "*")], vec![], nr.clone()), &info, &sa));
    assert!(!matches(&fs(vec![sa_subj("*", "*")], vec![], nr.clone()), &info, &sa));
    assert!(!matches(&fs(vec![Subject::Invalid], vec![], nr.clone()), &info, &sa));
    // Group * matches a user without groups
    assert!(matches(&fs(vec![group("*")], vec![], nr.clone()), &info, &sa));
    assert!(!matches(&fs(vec![group("system:masters")], vec![], nr), &info, &sa));
}

#[test]
fn non_resource_sub_paths() {
    let u = goodu();
    let m = |url: &str, path: &str| {
        let info = RequestInfo { path: path.into(), verb: "get".into(), ..Default::default() };
        matches(&fs(vec![user("*")], vec![], vec![NonResourcePolicyRule { verbs: s(&["get"]), non_resource_urls: s(&[url]) }]), &info, &u)
    };
    assert!(m("/healthz", "/healthz"));
    assert!(m("/healthz", "/healthz/etcd"));
    assert!(m("/healthz", "/healthz/anything/more"));
    assert!(m("/healthz/*", "/healthz/"));
    assert!(m("/healthz/*", "/healthz/etcd"));
    assert!(!m("/healthz/*", "/healthz"));
    assert!(!m("/hea", "/healthz"));
    assert!(!m("/hea", "/healthz/x"));
    assert!(m("/", "/anything"));
    assert!(m("/", "/"));
    assert!(!m("/healthz", "/healthzx"));
}

#[test]
fn flow_hash_vectors() {
    assert_eq!(flow_hash("global-default", "alice"), 17644606172554983095);
    assert_eq!(flow_hash("global-default", ""), 5449774753716172163);
    assert_eq!(flow_hash("catch-all", "system:anonymous"), 10492374483539041965);
    assert_eq!(flow_hash("catch-all", ""), 7733929212674924205);
    assert_eq!(flow_hash("service-accounts", "system:serviceaccount:default:default"), 13424615363282033023);
    assert_eq!(flow_hash("kube-system-service-accounts", "kube-system"), 5788695476672829020);
    assert_eq!(flow_hash("system-nodes", "system:node:node-1"), 11909065898299811039);
}

fn classify(c: &Classifier, p: &Policy, m: &str, path: &str, u: &UserInfo) -> (String, String, String, u64) {
    let info = parse_request_info(m, path.as_bytes());
    let cl = c.classify(&info, u);
    (p.flow_schemas[cl.flow_schema].name.clone(), p.priority_levels[cl.priority_level].name.clone(), cl.distinguisher, cl.flow_hash)
}

#[test]
fn default_policy_classification() {
    let p = default_policy();
    let c = Classifier::new(&p);
    let au = |n: &str, g: &[&str]| UserInfo::authenticated(n, &s(g));
    let t = |m: &str, path: &str, u: &UserInfo| classify(&c, &p, m, path, u);
    let r = |fs: &str, pl: &str, d: &str, h: u64| (fs.to_string(), pl.to_string(), d.to_string(), h);

    // system:masters → exempt, no distinguisher
    assert_eq!(t("GET", "/api/v1/pods", &au("admin", &["system:masters"])), r("exempt", "exempt", "", 0));
    // probes (sub-path too), also for anonymous
    let anon = UserInfo::anonymous();
    assert_eq!(t("GET", "/healthz", &anon), r("probes", "exempt", "", 0));
    assert_eq!(t("GET", "/readyz/etcd", &anon), r("probes", "exempt", "", 0));
    assert_eq!(t("POST", "/healthz", &anon).0, "global-default");
    // leader election
    let kcm = au("system:kube-controller-manager", &[]);
    let le = t("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/kube-controller-manager", &kcm);
    assert_eq!(
        (le.0.as_str(), le.1.as_str(), le.2.as_str()),
        ("system-leader-election", "leader-election", "system:kube-controller-manager")
    );
    assert_eq!(le.3, flow_hash("system-leader-election", "system:kube-controller-manager"));
    // leases LIST is not a leader-election verb → kube-controller-manager ByNamespace
    let l = t("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", &kcm);
    assert_eq!((l.0.as_str(), l.1.as_str(), l.2.as_str()), ("kube-controller-manager", "workload-high", "kube-system"));
    // nodes
    let node = au("system:node:node-1", &["system:nodes"]);
    assert_eq!(t("PATCH", "/api/v1/nodes/node-1/status", &node).0, "system-node-high");
    assert_eq!(t("PUT", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-1", &node).1, "node-high");
    assert_eq!(
        t("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1", &node),
        r("system-nodes", "system", "system:node:node-1", 11909065898299811039)
    );
    // scheduler by namespace: cluster-scoped → ""
    let sch = au("system:kube-scheduler", &[]);
    assert_eq!(t("GET", "/api/v1/nodes", &sch), r("kube-scheduler", "workload-high", "", flow_hash("kube-scheduler", "")));
    // kube-system service accounts, ByNamespace
    let ksa = au("system:serviceaccount:kube-system:coredns", &[]);
    assert_eq!(
        t("GET", "/api/v1/namespaces/kube-system/configmaps", &ksa),
        r("kube-system-service-accounts", "workload-high", "kube-system", 5788695476672829020)
    );
    // other service accounts, ByUser
    let sa = au("system:serviceaccount:default:default", &[]);
    assert_eq!(
        t("GET", "/api/v1/namespaces/default/pods", &sa),
        r("service-accounts", "workload-low", "system:serviceaccount:default:default", 13424615363282033023)
    );
    // ordinary users → global-default
    let alice = au("alice", &["dev"]);
    assert_eq!(t("GET", "/api/v1/namespaces/default/pods", &alice), r("global-default", "global-default", "alice", 17644606172554983095));
    assert_eq!(t("GET", "/version", &alice).0, "global-default");
    assert_eq!(t("GET", "/api/v1/pods", &anon).2, "system:anonymous");
    // no groups at all → nothing matches → catch-all (Reject level: no hash)
    let nobody = UserInfo { name: "x".into(), groups: vec![] };
    assert_eq!(t("GET", "/api/v1/pods", &nobody), r("catch-all", "catch-all", "", 0));
    // generic mode namespace distinguisher through ByNamespace
    let g = parse_generic("GET", b"/v1/orders", Some(b"kube-system"));
    let cl = c.classify(&g, &ksa);
    assert_eq!((p.flow_schemas[cl.flow_schema].name.as_str(), cl.distinguisher.as_str()), ("kube-system-service-accounts", "kube-system"));
}

#[test]
fn empty_policy_does_not_panic() {
    let c = Classifier::new(&Policy::default());
    let cl = c.classify(&parse_request_info("GET", b"/"), &UserInfo::anonymous());
    assert_eq!((cl.flow_schema, cl.priority_level, cl.flow_hash), (0, 0, 0));
}

#[test]
fn prefilter_is_exact_with_many_groups() {
    let p = default_policy();
    let c = Classifier::new(&p);
    let mut groups: Vec<String> = (0..40).map(|i| format!("g{i}")).collect();
    groups.push("system:masters".into());
    let u = UserInfo::authenticated("many", &groups);
    assert_eq!(classify(&c, &p, "GET", "/api/v1/pods", &u).0, "exempt");
    let mut groups: Vec<String> = (0..5).map(|i| format!("g{i}")).collect();
    groups.push("system:nodes".into());
    let u = UserInfo::authenticated("system:node:n", &groups);
    assert_eq!(classify(&c, &p, "GET", "/api/v1/pods", &u).0, "system-nodes");
}

/// The compiled classifier (subject prefilter, request-shape skip) answers what the first
/// FlowSchema `matches` accepts, for service accounts and other users, resource and
/// non-resource requests, over the default policy and ServiceAccount / non-resource-only
/// FlowSchemas.
#[test]
fn compiled_classifier_agrees_with_the_rules() {
    let mut policy = default_policy();
    let sa = |ns: &str, name: &str| Subject::ServiceAccount { namespace: ns.into(), name: name.into() };
    let everything =
        (vec![rule(&["*"], &["*"], &["*"], true, &["*"])], vec![NonResourcePolicyRule { verbs: s(&["*"]), non_resource_urls: s(&["*"]) }]);
    let extra = [
        ("sa-only", fs(vec![sa("team", "*")], everything.0.clone(), vec![])),
        ("sa-and-user", fs(vec![sa("apps", "builder"), user("carol")], everything.0.clone(), everything.1.clone())),
        ("non-resource-only", fs(vec![group("probers")], vec![], everything.1.clone())),
    ];
    for (i, (name, mut f)) in extra.into_iter().enumerate() {
        f.name = name.into();
        policy.flow_schemas.insert(1 + i, f);
    }
    let classifier = Classifier::new(&policy);
    let users = [
        UserInfo { name: "system:serviceaccount:team:bot".into(), groups: s(&["system:serviceaccounts", "system:authenticated"]) },
        UserInfo { name: "system:serviceaccount:apps:builder".into(), groups: s(&["system:authenticated"]) },
        UserInfo { name: "system:serviceaccount:kube-system:x".into(), groups: s(&["system:authenticated"]) },
        UserInfo { name: "carol".into(), groups: s(&["probers", "system:authenticated"]) },
        UserInfo { name: "system:kube-scheduler".into(), groups: s(&["system:authenticated"]) },
        UserInfo { name: "dave".into(), groups: s(&["system:nodes", "system:authenticated"]) },
        UserInfo { name: "system:anonymous".into(), groups: s(&["system:unauthenticated"]) },
    ];
    let requests = [
        parse_request_info("GET", b"/api/v1/namespaces/default/pods"),
        parse_request_info("PUT", b"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"),
        parse_request_info("GET", b"/api/v1/nodes/n1"),
        parse_request_info("GET", b"/healthz"),
        parse_request_info("GET", b"/metrics"),
        parse_generic("GET", b"/anything", None),
    ];
    for u in &users {
        for info in &requests {
            let want = policy.flow_schemas.iter().position(|f| matches(f, info, u)).expect("catch-all matches everyone");
            assert_eq!(classifier.classify(info, u).flow_schema, want, "{} {}", u.name, info.path);
        }
    }
}
