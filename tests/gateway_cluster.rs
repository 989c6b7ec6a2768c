#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! The cluster polls natively (the e2e suite's cluster-policy and work-estimate tests): the
//! policy read from the protected apiserver (`clusterPolicy`: two list calls with the bearer
//! token, applied like a reload, a failed or bad read changing nothing, an unchanged one not
//! re-applied) and the object counts read from its `/metrics`
//! (`workEstimator.clusterMetrics`: one worker polls for all, LISTs cost what the counts imply,
//! a failed poll keeps the last counts, stale counts cost the level's maximum seats). The
//! mock records every HTTP call; the test answers it on the worker that started it.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::engine::store::Store;
use apf_wasm::gateway::host::Action;
use apf_wasm::gateway::policy_source::SharedPolicy;
use apf_wasm::gateway::Root;
use mock_host::{flow_schema, gateway, header_value, headers, priority_level, Call, Node, Proxy};
use serde_json::{json, Value};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

const FC: &str = "/apis/flowcontrol.apiserver.k8s.io/v1";
const METRICS_1_34: &str = include_str!("fixtures/metrics/kube-apiserver-1.34.txt");

fn calls(proxy: &Proxy) -> Vec<Call> {
    proxy.calls.borrow().clone()
}

/// Answers `call` on the worker that started it.
fn answer(w: &mut [Node], call: &Call, status: Option<u32>, body: &[u8]) {
    w[call.worker].call_response(call.token, status, body);
}

fn pass(proxy: &Proxy, w: &mut [Node], ms: u64) {
    proxy.advance(Duration::from_millis(ms));
    w.iter_mut().for_each(Node::tick);
}

// -- clusterPolicy ----------------------------------------------------------------------------

fn policy_config() -> String {
    json!({
        "identity": {"sources": [{"type": "frontProxy"}]},
        "explainGroups": ["explain"],
        "clusterPolicy": {"cluster": "apiserver", "period": "1s", "token": "s3cret", "authority": "kubernetes.default.svc",
                          "pathPrefix": FC},
        "workEstimator": {"clusterMetrics": false}
    })
    .to_string()
}

/// The two list responses as the apiserver writes them (items without kind and apiVersion).
fn lists(fs_name: &str, precedence: u32) -> (String, String) {
    lists_at("v1", fs_name, precedence)
}

/// [`lists`] as version `version` of the group serves them.
fn lists_at(version: &str, fs_name: &str, precedence: u32) -> (String, String) {
    let mut fs = flow_schema(fs_name, "cluster-level", precedence, &["cluster-team"]);
    let mut pl = priority_level("cluster-level", 10, 8, 2, 10);
    for o in [&mut fs, &mut pl] {
        let m = o.as_object_mut().unwrap();
        m.remove("kind");
        m.remove("apiVersion");
        m["metadata"]["resourceVersion"] = json!("4711");
        m.insert("status".into(), json!({"conditions": [{"type": "Dangling", "status": "False"}]}));
    }
    if version == "v1beta2" || version == "v1beta1" {
        // flowcontrol/v1beta2/types.go: the shares are `assuredConcurrencyShares`.
        let limited = pl["spec"]["limited"].as_object_mut().unwrap();
        let shares = limited.remove("nominalConcurrencyShares").unwrap();
        limited.insert("assuredConcurrencyShares".into(), shares);
    }
    let list = |kind: &str, item: Value| {
        json!({"kind": kind, "apiVersion": format!("flowcontrol.apiserver.k8s.io/{version}"), "metadata": {"resourceVersion": "4711"}, "items": [item]})
            .to_string()
    };
    (list("FlowSchemaList", fs), list("PriorityLevelConfigurationList", pl))
}

/// Answers the two policy calls started last.
fn answer_policy(w: &mut [Node], fs: (Option<u32>, &str), pl: (Option<u32>, &str)) {
    let c = calls(&w[0].host.proxy);
    let [a, b] = &c[c.len() - 2..] else { unreachable!() };
    assert!(a.header(":path").unwrap().ends_with("/flowschemas") && b.header(":path").unwrap().ends_with("/prioritylevelconfigurations"));
    answer(w, a, fs.0, fs.1.as_bytes());
    answer(w, b, pl.0, pl.1.as_bytes());
}

/// (FlowSchema, priority level UID) of carol's request.
fn carol(node: &mut Node) -> (String, String) {
    let (ctx, action) = node.request(&headers("GET", "/api/v1/namespaces/default/pods", "carol", &["cluster-team", "explain"]), &[]);
    assert_eq!(action, Action::Continue);
    let h = node.respond(ctx, 200, &[], &[]);
    (header_value(&h, "x-apf-flowschema").unwrap(), header_value(&h, "x-kubernetes-pf-prioritylevel-uid").unwrap())
}

fn generation(proxy: &Proxy) -> u64 {
    // The configuration generation counter every applied configuration takes a number from.
    let bytes = proxy.store.get("apf/v3/generation").unwrap().0.unwrap();
    u64::from_le_bytes(bytes[..8].try_into().unwrap())
}

#[test]
fn the_policy_is_read_from_the_cluster_with_the_token_and_applied() {
    let (proxy, mut w) = gateway(1, &policy_config());
    let c = calls(&proxy);
    assert_eq!(c.len(), 2, "the first tick reads both lists: {c:?}");
    for (call, list) in c.iter().zip(["flowschemas", "prioritylevelconfigurations"]) {
        assert_eq!(call.cluster, "apiserver");
        assert_eq!(call.header(":path"), Some(format!("{FC}/{list}").as_str()));
        assert_eq!((call.header(":method"), call.header(":authority")), (Some("GET"), Some("kubernetes.default.svc")));
        assert_eq!(call.header("authorization"), Some("Bearer s3cret"));
        assert_eq!(call.timeout, Duration::from_secs(5));
    }
    assert_eq!(carol(&mut w[0]).0, "global-default");
    let (fs, pl) = lists("from-cluster", 500);
    answer(&mut w, &c[0], Some(200), fs.as_bytes());
    assert_eq!(carol(&mut w[0]).0, "global-default", "applied once both lists are in");
    answer(&mut w, &c[1], Some(200), pl.as_bytes());
    assert_eq!(carol(&mut w[0]), ("from-cluster".into(), "pl-cluster-level".into()));
    // Read again every period.
    pass(&proxy, &mut w, 500);
    assert_eq!(calls(&proxy).len(), 2);
    pass(&proxy, &mut w, 500);
    assert_eq!(calls(&proxy).len(), 4);
}

#[test]
fn a_failed_or_invalid_read_keeps_the_current_policy() {
    let (proxy, mut w) = gateway(1, &policy_config());
    let (fs, pl) = lists("from-cluster", 500);
    answer_policy(&mut w, (Some(200), &fs), (Some(200), &pl));
    let applied = carol(&mut w[0]);
    assert_eq!(applied.0, "from-cluster");
    let (fs2, pl2) = lists("from-cluster-2", 400);
    // (A precedence of 0 would be defaulted to 1000, as upstream does: valid.)
    let (invalid, _) = lists("from-cluster-2", 10_001);
    let failures: [(Option<u32>, &str, &str); 5] = [
        (None, "", "no response"),
        (Some(403), "{\"kind\":\"Status\",\"code\":403}", "forbidden"),
        (Some(200), "{\"kind\":\"FlowSchemaList\",\"items\":[", "malformed JSON"),
        (Some(200), "{\"kind\":\"FlowSchemaList\"}", "no items"),
        (Some(200), &invalid, "matchingPrecedence 10001"),
    ];
    for (status, body, why) in failures {
        pass(&proxy, &mut w, 1_000);
        answer_policy(&mut w, (status, body), (Some(200), &pl2));
        assert_eq!(carol(&mut w[0]), applied, "{why}");
    }
    // A valid new policy is applied.
    pass(&proxy, &mut w, 1_000);
    answer_policy(&mut w, (Some(200), &fs2), (Some(200), &pl2));
    assert_eq!(carol(&mut w[0]).0, "from-cluster-2");
}

#[test]
fn an_unchanged_policy_is_not_applied_again() {
    let (proxy, mut w) = gateway(1, &policy_config());
    let (fs, pl) = lists("from-cluster", 500);
    answer_policy(&mut w, (Some(200), &fs), (Some(200), &pl));
    let applied = generation(&proxy);
    for _ in 0..3 {
        pass(&proxy, &mut w, 1_000);
        answer_policy(&mut w, (Some(200), &fs), (Some(200), &pl));
    }
    assert_eq!(generation(&proxy), applied);
    pass(&proxy, &mut w, 1_000);
    let (fs2, _) = lists("from-cluster", 400);
    answer_policy(&mut w, (Some(200), &fs2), (Some(200), &pl));
    assert_eq!(generation(&proxy), applied + 1, "a changed policy is");
}

/// A reader root (`w[0]`, a process's main thread) and `followers` roots sharing its policy
/// (the workers of a host whose workers share memory), configured and ticked once.
fn sharing(followers: usize, cfg: &str) -> (Rc<Proxy>, Vec<Node>) {
    let (proxy, source) = (Proxy::new(), Arc::new(SharedPolicy::default()));
    let mut w: Vec<Node> = (0..=followers).map(|i| Node::new(&proxy, i)).collect();
    for (i, node) in w.iter_mut().enumerate() {
        node.root = Root::sharing(source.clone(), i == 0);
        assert!(node.configure(cfg), "configuration refused");
        node.tick();
    }
    (proxy, w)
}

/// Carol's request on a follower, which adopts the newest policy first (as a stream starts).
fn carol_adopting(node: &mut Node) -> (String, String) {
    node.root.adopt_published(&node.host);
    carol(node)
}

#[test]
fn followers_adopt_the_readers_policy_and_never_read_the_cluster() {
    let (proxy, mut w) = sharing(2, &policy_config());
    pass(&proxy, &mut w, 2_500);
    let c = calls(&proxy);
    assert!(c.iter().all(|call| call.worker == 0), "only the reader reads: {c:?}");
    assert_eq!(carol_adopting(&mut w[1]).0, "global-default", "nothing published yet");
    let (fs, pl) = lists("from-cluster", 500);
    answer_policy(&mut w, (Some(200), &fs), (Some(200), &pl));
    let after_reader = generation(&proxy);
    // A follower idle since before the read classifies its next request under the new policy.
    assert_eq!(carol_adopting(&mut w[1]), ("from-cluster".into(), "pl-cluster-level".into()));
    assert_eq!(generation(&proxy), after_reader + 1, "adopted once, under a generation of its own");
    assert_eq!(carol_adopting(&mut w[1]).0, "from-cluster");
    assert_eq!(generation(&proxy), after_reader + 1, "a current follower adopts nothing");
    // An invalid or unchanged read publishes nothing: the followers keep the last valid policy.
    let (invalid, _) = lists("from-cluster-2", 10_001);
    for (fs_body, why) in [(invalid.as_str(), "invalid"), (fs.as_str(), "unchanged")] {
        pass(&proxy, &mut w, 1_000);
        answer_policy(&mut w, (Some(200), fs_body), (Some(200), &pl));
        assert_eq!(carol_adopting(&mut w[2]).0, "from-cluster", "{why}");
        assert_eq!(carol_adopting(&mut w[1]).0, "from-cluster", "{why}");
    }
    let settled = generation(&proxy);
    // A changed policy reaches every follower at its next request.
    pass(&proxy, &mut w, 1_000);
    let (fs2, pl2) = lists("from-cluster-2", 400);
    answer_policy(&mut w, (Some(200), &fs2), (Some(200), &pl2));
    assert_eq!(generation(&proxy), settled + 1, "the reader applied it");
    for (i, follower) in w.iter_mut().enumerate().skip(1) {
        assert_eq!(carol_adopting(follower).0, "from-cluster-2", "follower {i}");
    }
    assert_eq!(carol(&mut w[0]).0, "from-cluster-2", "the reader serves what it applied");
    assert!(calls(&proxy).iter().all(|call| call.worker == 0), "only the reader reads");
}

/// [`lists`] as a live apiserver returns them on its `n`th read: the resourceVersions are the
/// store's current revision, the managedFields' and conditions' times and reasons move (the APF
/// controller rewrites the conditions), and the items come in another order.
fn live_lists(n: u32) -> (String, String) {
    let (fs, pl) = lists("from-cluster", 500);
    let churn = |body: String| {
        let mut v: Value = serde_json::from_str(&body).unwrap();
        v["metadata"]["resourceVersion"] = json!(format!("{}", 9000 + n));
        let items = v["items"].as_array_mut().unwrap();
        let mut extra = items[0].clone();
        extra["metadata"]["name"] = json!("zz-extra");
        extra["metadata"]["uid"] = json!("u-extra");
        items.push(extra);
        if n % 2 == 1 {
            items.reverse();
        }
        for item in items.iter_mut() {
            item["metadata"]["resourceVersion"] = json!(format!("{}", 9000 + n));
            item["metadata"]["generation"] = json!(1);
            item["metadata"]["managedFields"] = json!([{"manager": "api-priority-and-fairness-config-consumer-v1", "operation": "Update", "time": format!("2026-11-28T06:{:02}:00Z", n % 60)}]);
            item["status"] = json!({"conditions": [{"type": "Dangling", "status": if n.is_multiple_of(2) { "False" } else { "True" },
                "lastTransitionTime": format!("2026-11-28T06:{:02}:00Z", n % 60), "reason": format!("R{n}"), "message": format!("read {n}")}]});
        }
        v.to_string()
    };
    (churn(fs), churn(pl))
}

#[test]
fn a_policy_whose_reads_differ_only_in_what_a_live_apiserver_moves_is_applied_once() {
    let (proxy, mut w) = gateway(1, &policy_config());
    let (fs, pl) = live_lists(0);
    answer_policy(&mut w, (Some(200), &fs), (Some(200), &pl));
    let applied = generation(&proxy);
    assert_eq!(carol(&mut w[0]).0, "from-cluster");
    for n in 1..6 {
        pass(&proxy, &mut w, 1_000);
        let (fs, pl) = live_lists(n);
        answer_policy(&mut w, (Some(200), &fs), (Some(200), &pl));
    }
    assert_eq!(generation(&proxy), applied, "resourceVersion, managedFields, status and order are not the policy");
    // A change of a condition's type is validated, so it is part of the policy's meaning.
    pass(&proxy, &mut w, 1_000);
    let (mut fs, pl) = live_lists(7);
    fs = fs.replace("\"Dangling\"", "\"Other\"");
    answer_policy(&mut w, (Some(200), &fs), (Some(200), &pl));
    assert_eq!(generation(&proxy), applied + 1);
}

// -- clusterPolicy: the served version, discovered ------------------------------------------------

const GROUP_PATH: &str = "/apis/flowcontrol.apiserver.k8s.io";

/// `policy_config` without `pathPrefix`: the version is discovered.
fn discovering_config() -> String {
    let mut cfg: Value = serde_json::from_str(&policy_config()).unwrap();
    cfg["clusterPolicy"].as_object_mut().unwrap().remove("pathPrefix");
    cfg.to_string()
}

/// The group's discovery document (an `APIGroup`) serving `versions`, preferring `preferred`.
fn group(versions: &[&str], preferred: &str) -> String {
    let gv = |v: &str| json!({"groupVersion": format!("flowcontrol.apiserver.k8s.io/{v}"), "version": v});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": "flowcontrol.apiserver.k8s.io",
           "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>(), "preferredVersion": gv(preferred)})
    .to_string()
}

/// The path of the last call started.
fn last_path(proxy: &Proxy) -> String {
    calls(proxy).last().unwrap().header(":path").unwrap().to_string()
}

/// Answers the discovery call started last with `doc`; the list calls follow at once.
fn answer_discovery(w: &mut [Node], status: Option<u32>, doc: &str) {
    let c = calls(&w[0].host.proxy);
    let d = c.last().unwrap();
    assert_eq!(d.header(":path"), Some(GROUP_PATH), "{c:?}");
    assert_eq!(d.header("authorization"), Some("Bearer s3cret"));
    answer(w, d, status, doc.as_bytes());
}

/// Answers a whole read at `version` (two lists), checking the paths.
fn answer_lists_at(w: &mut [Node], version: &str, fs_name: &str) {
    let c = calls(&w[0].host.proxy);
    let [a, b] = &c[c.len() - 2..] else { unreachable!() };
    assert_eq!(a.header(":path").unwrap(), format!("{GROUP_PATH}/{version}/flowschemas"));
    assert_eq!(b.header(":path").unwrap(), format!("{GROUP_PATH}/{version}/prioritylevelconfigurations"));
    let (fs, pl) = lists_at(version, fs_name, 500);
    answer(w, a, Some(200), fs.as_bytes());
    answer(w, b, Some(200), pl.as_bytes());
}

#[test]
fn discovery_picks_the_served_version_and_reads_its_lists() {
    let (proxy, mut w) = gateway(1, &discovering_config());
    assert_eq!(calls(&proxy).len(), 1, "discovery comes first");
    // A 1.24 cluster: v1beta2 preferred, v1beta1 also served.
    answer_discovery(&mut w, Some(200), &group(&["v1beta2", "v1beta1"], "v1beta2"));
    assert_eq!(calls(&proxy).len(), 3, "the lists follow at once");
    answer_lists_at(&mut w, "v1beta2", "from-v1beta2");
    assert_eq!(carol(&mut w[0]).0, "from-v1beta2");
    // The next reads go straight to the lists, at the discovered version.
    pass(&proxy, &mut w, 1_000);
    assert_eq!(calls(&proxy).len(), 5);
    answer_lists_at(&mut w, "v1beta2", "from-v1beta2");
    // A preferred version we do not understand is passed over for the newest we do.
    let (proxy, mut w) = gateway(1, &discovering_config());
    answer_discovery(&mut w, Some(200), &group(&["v2alpha9", "v1beta3"], "v2alpha9"));
    answer_lists_at(&mut w, "v1beta3", "from-v1beta3");
    assert_eq!(calls(&proxy).len(), 3);
    assert_eq!(carol(&mut w[0]).0, "from-v1beta3");
}

#[test]
fn pathprefix_overrides_discovery() {
    let (proxy, mut w) = gateway(1, &policy_config());
    assert!(calls(&proxy).iter().all(|c| c.header(":path").unwrap().starts_with(&format!("{FC}/"))), "no discovery");
    answer_lists_at(&mut w, "v1", "from-cluster");
    for _ in 0..12 {
        pass(&proxy, &mut w, 1_000);
        answer_lists_at(&mut w, "v1", "from-cluster");
    }
    assert!(calls(&proxy).iter().all(|c| c.header(":path") != Some(GROUP_PATH)));
}

#[test]
fn a_changed_served_version_is_followed_on_rediscovery() {
    let (proxy, mut w) = gateway(1, &discovering_config());
    answer_discovery(&mut w, Some(200), &group(&["v1beta3", "v1beta2"], "v1beta3"));
    answer_lists_at(&mut w, "v1beta3", "from-v1beta3");
    // The cluster is upgraded; reads continue at v1beta3 (still served) until discovery is
    // read again, after a bounded number of reads.
    let mut reads = 1;
    loop {
        pass(&proxy, &mut w, 1_000);
        if last_path(&proxy) == GROUP_PATH {
            break;
        }
        answer_lists_at(&mut w, "v1beta3", "from-v1beta3");
        reads += 1;
        assert!(reads <= 10, "discovery is read again within 10 reads");
    }
    answer_discovery(&mut w, Some(200), &group(&["v1", "v1beta3"], "v1"));
    answer_lists_at(&mut w, "v1", "from-v1");
    assert_eq!(carol(&mut w[0]).0, "from-v1");
}

#[test]
fn a_list_answering_404_triggers_rediscovery() {
    let (proxy, mut w) = gateway(1, &discovering_config());
    answer_discovery(&mut w, Some(200), &group(&["v1beta3", "v1beta2"], "v1beta3"));
    answer_lists_at(&mut w, "v1beta3", "from-v1beta3");
    pass(&proxy, &mut w, 1_000);
    answer_lists_at(&mut w, "v1beta3", "from-v1beta3");
    // The cluster stopped serving v1beta3: the lists answer 404.
    pass(&proxy, &mut w, 1_000);
    answer_policy(&mut w, (Some(404), "{\"kind\":\"Status\",\"code\":404}"), (Some(404), "{\"kind\":\"Status\",\"code\":404}"));
    assert_eq!(carol(&mut w[0]).0, "from-v1beta3", "the current policy keeps serving");
    // Discovery is read again on the next tick, not a period later.
    pass(&proxy, &mut w, 50);
    assert_eq!(last_path(&proxy), GROUP_PATH);
    answer_discovery(&mut w, Some(200), &group(&["v1"], "v1"));
    answer_lists_at(&mut w, "v1", "from-v1");
    assert_eq!(carol(&mut w[0]).0, "from-v1");
    // A version that 404s right after discovery named it does not make discovery spin.
    pass(&proxy, &mut w, 1_000);
    answer_policy(&mut w, (Some(404), "{}"), (Some(404), "{}"));
    pass(&proxy, &mut w, 50);
    assert_eq!(last_path(&proxy), GROUP_PATH, "404 after a few reads: rediscovered at once");
    answer_discovery(&mut w, Some(200), &group(&["v1"], "v1"));
    answer_policy(&mut w, (Some(404), "{}"), (Some(404), "{}"));
    let n = calls(&proxy).len();
    pass(&proxy, &mut w, 500);
    assert_eq!(calls(&proxy).len(), n, "404 right after discovery: discovery waits for the period");
    pass(&proxy, &mut w, 500);
    assert_eq!(last_path(&proxy), GROUP_PATH);
}

#[test]
fn a_failed_or_malformed_discovery_keeps_the_version_and_policy() {
    let (proxy, mut w) = gateway(1, &discovering_config());
    // Discovery that never answered usefully: the lists are read at v1 meanwhile.
    answer_discovery(&mut w, Some(200), "{\"kind\":\"Status\",\"code\":404}");
    answer_lists_at(&mut w, "v1", "from-v1");
    assert_eq!(carol(&mut w[0]).0, "from-v1");
    pass(&proxy, &mut w, 1_000);
    answer_discovery(&mut w, Some(200), &group(&["v1beta2"], "v1beta2"));
    answer_lists_at(&mut w, "v1beta2", "from-v1beta2");
    assert_eq!(carol(&mut w[0]).0, "from-v1beta2");
    let garbage: [(Option<u32>, &str, &str); 5] = [
        (None, "", "no response"),
        (Some(403), "{\"kind\":\"Status\",\"code\":403}", "forbidden"),
        (Some(200), "{\"kind\":\"APIGroup\",\"versions\":[", "malformed JSON"),
        (Some(200), "{\"kind\":\"APIGroupList\",\"groups\":[]}", "another kind"),
        (Some(200), &group(&["v9"], "v9"), "no version we understand"),
    ];
    // Force discovery: a 404 on the lists after a few reads.
    for _ in 0..2 {
        pass(&proxy, &mut w, 1_000);
        answer_lists_at(&mut w, "v1beta2", "from-v1beta2");
    }
    pass(&proxy, &mut w, 1_000);
    answer_policy(&mut w, (Some(404), "{}"), (Some(404), "{}"));
    pass(&proxy, &mut w, 50);
    for (status, body, why) in garbage {
        answer_discovery(&mut w, status, body);
        // The previous version is read, the previous policy keeps serving, and discovery is
        // retried at the next read.
        answer_lists_at(&mut w, "v1beta2", "from-v1beta2");
        assert_eq!(carol(&mut w[0]).0, "from-v1beta2", "{why}");
        pass(&proxy, &mut w, 1_000);
        assert_eq!(last_path(&proxy), GROUP_PATH, "{why}: retried");
    }
    answer_discovery(&mut w, Some(200), &group(&["v1", "v1beta3"], "v1"));
    answer_lists_at(&mut w, "v1", "from-v1");
    assert_eq!(carol(&mut w[0]).0, "from-v1");
}

// -- workEstimator.clusterMetrics ---------------------------------------------------------------

/// Level "counter": 100 of 105 seats, hand 4 → its max seats are
/// max(1, min(⌈100·0.15⌉, 100 div 4)) = 15.
fn metrics_config(stale_after: &str) -> String {
    json!({
        "serverConcurrencyLimit": 105,
        "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "explainGroups": ["explain"],
        "workEstimator": {"clusterMetrics": {"cluster": "apiserver", "authority": "kubernetes.default.svc", "token": "s3cret",
                                             "period": "2s", "timeout": "1s", "staleAfter": stale_after}},
        "policy": [priority_level("counter", 100, 16, 4, 50), flow_schema("counter", "counter", 500, &["counters"])]
    })
    .to_string()
}

#[test]
fn a_worker_without_ticks_reads_fresh_counts_as_its_stream_starts() {
    // Worker 1 gets no timer while idle (the native host): only worker 0 ticks and polls.
    let (proxy, mut w) = gateway(2, &metrics_config("4s"));
    let good = metrics_text(&[("configmaps", 500, 2_000)]);
    for i in 0..4 {
        let call = metrics_call(&proxy, i);
        assert_eq!(call.worker, 0);
        answer(&mut w, &call, Some(200), good.as_bytes());
        proxy.advance(Duration::from_millis(2_000));
        w[0].tick();
    }
    let node = &mut w[1];
    node.root.on_stream_start(&node.host, &mut node.worker);
    assert_eq!(list_seats(&mut w[1], CONFIGMAPS), 10, "not the copy worker 1 read at its last tick, before any poll answered");
}

/// kube-apiserver 1.34's `/metrics` object counts (as apfkit/upstream.py writes them):
/// `(group/resource, count, average size)`.
fn metrics_text(counts: &[(&str, i64, i64)]) -> String {
    let mut out =
        String::from("# HELP apiserver_resource_objects [ALPHA] Number of stored objects\n# TYPE apiserver_resource_objects gauge\n");
    let split = |k: &str| k.rsplit_once('/').map_or((String::new(), k.to_string()), |(g, r)| (g.to_string(), r.to_string()));
    for (k, c, _) in counts {
        let (g, r) = split(k);
        out += &format!("apiserver_resource_objects{{group=\"{g}\",resource=\"{r}\"}} {c}\n");
    }
    out += "# TYPE apiserver_resource_size_estimate_bytes gauge\n";
    for (k, c, a) in counts {
        let (g, r) = split(k);
        out += &format!("apiserver_resource_size_estimate_bytes{{group=\"{g}\",resource=\"{r}\"}} {}\n", c * a);
    }
    out
}

/// The seats a LIST of `path` is charged on `node`.
fn list_seats(node: &mut Node, path: &str) -> u32 {
    let (ctx, action) = node.request(&headers("GET", path, "cara", &["counters", "explain"]), &[]);
    assert_eq!(action, Action::Continue);
    header_value(&node.respond(ctx, 200, &[], &[]), "x-apf-seats").unwrap().parse().unwrap()
}

const CONFIGMAPS: &str = "/api/v1/configmaps";

/// The `/metrics` call started last; asserts that it is new (`seen` calls before).
fn metrics_call(proxy: &Proxy, seen: usize) -> Call {
    let c = calls(proxy);
    assert_eq!(c.len(), seen + 1, "one new poll: {c:?}");
    c[seen].clone()
}

#[test]
fn one_worker_polls_the_metrics_for_all_and_lists_cost_what_the_counts_imply() {
    let (proxy, mut w) = gateway(2, &metrics_config("3m"));
    let call = metrics_call(&proxy, 0);
    assert_eq!((call.worker, call.cluster.as_str(), call.header(":path")), (0, "apiserver", Some("/metrics")));
    assert_eq!((call.header("authorization"), call.header(":authority")), (Some("Bearer s3cret"), Some("kubernetes.default.svc")));
    assert_eq!(call.timeout, Duration::from_secs(1));
    assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 1, "no counts yet");
    answer(&mut w, &call, Some(200), METRICS_1_34.as_bytes());
    // configmaps: 412 objects, 1.236e6 bytes: ⌈1 236 000 / 100 000⌉ = 13 seats from storage,
    // ⌈min(1 236 000, 1 000 000) / 100 000⌉ = 10 from the watch cache.
    assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 13);
    assert_eq!(list_seats(&mut w[0], &format!("{CONFIGMAPS}?resourceVersion=0")), 10);
    assert_eq!(list_seats(&mut w[0], "/api/v1/pods"), 15, "50 000 pods of 4 kB: the level's max seats");
    assert_eq!(list_seats(&mut w[0], "/apis/apps/v1/deployments"), 1, "12 × 7 kB");
    assert_eq!(list_seats(&mut w[0], "/apis/example.com/v1/widgets"), 1, "not reported by the cluster");
    // The other worker reads the shared counts on its timer.
    pass(&proxy, &mut w, 300);
    assert_eq!(list_seats(&mut w[1], CONFIGMAPS), 13);
    assert_eq!(calls(&proxy).len(), 1, "nobody polls again before the period");
    pass(&proxy, &mut w, 1_000);
    assert_eq!(proxy.stat("apf_wasm_object_counts_refreshes_total"), 1);
}

#[test]
fn new_counts_are_charged_after_the_next_poll() {
    let (proxy, mut w) = gateway(2, &metrics_config("3m"));
    answer(&mut w, &metrics_call(&proxy, 0), Some(200), metrics_text(&[("configmaps", 100, 1_000)]).as_bytes());
    assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 1);
    pass(&proxy, &mut w, 2_000);
    let call = metrics_call(&proxy, 1);
    answer(&mut w, &call, Some(200), metrics_text(&[("configmaps", 500, 2_000), ("apps/deployments", 200, 6_000)]).as_bytes());
    pass(&proxy, &mut w, 300);
    for node in w.iter_mut() {
        assert_eq!(list_seats(node, CONFIGMAPS), 10);
        assert_eq!(list_seats(node, "/apis/apps/v1/deployments"), 12);
    }
}

#[test]
fn a_failed_or_malformed_poll_keeps_the_last_counts_and_is_counted() {
    let failures = "apf_wasm_object_counts_refresh_failures_total";
    let (proxy, mut w) = gateway(2, &metrics_config("3m"));
    answer(&mut w, &metrics_call(&proxy, 0), Some(200), METRICS_1_34.as_bytes());
    let bad: [(Option<u32>, &[u8]); 3] = [(None, b""), (Some(500), b"internal error"), (Some(200), b"# nothing we read\nup 1\n")];
    for (i, (status, body)) in bad.into_iter().enumerate() {
        pass(&proxy, &mut w, 2_000);
        answer(&mut w, &metrics_call(&proxy, 1 + i), status, body);
        pass(&proxy, &mut w, 300);
        assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 13, "{status:?}: the last counts stay");
        assert_eq!(list_seats(&mut w[1], CONFIGMAPS), 13);
    }
    pass(&proxy, &mut w, 1_000);
    assert_eq!(proxy.stat(failures), 3);
    assert_eq!(proxy.stat("apf_wasm_object_counts_refreshes_total"), 1);
}

#[test]
fn stale_counts_make_lists_cost_the_levels_max_seats_until_a_poll_succeeds() {
    let (proxy, mut w) = gateway(1, &metrics_config("4s"));
    answer(&mut w, &metrics_call(&proxy, 0), Some(200), metrics_text(&[("configmaps", 500, 2_000)]).as_bytes());
    assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 10);
    // /metrics fails from now on (retried every period).
    for i in 1..=2 {
        pass(&proxy, &mut w, 2_000);
        answer(&mut w, &metrics_call(&proxy, i), Some(500), b"");
    }
    assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 10, "4 s after the last good poll: not stale yet");
    pass(&proxy, &mut w, 100);
    assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 15, "stale: 10⁹ objects of 1.5 MB, clamped to the level's max");
    pass(&proxy, &mut w, 1_000);
    assert_eq!(proxy.stat("apf_wasm_object_counts_stale_resources"), 1);
    // The cluster answers again: fresh counts, the formula's cost.
    pass(&proxy, &mut w, 1_000);
    answer(&mut w, &metrics_call(&proxy, 3), Some(200), metrics_text(&[("configmaps", 500, 2_000)]).as_bytes());
    assert_eq!(list_seats(&mut w[0], CONFIGMAPS), 10);
}
