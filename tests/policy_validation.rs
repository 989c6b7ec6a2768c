#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One failing case per validation rule of `pkg/apis/flowcontrol/validation/validation.go`,
//! asserting the field path and wording.
use apf_wasm::policy::policy_from_value;
use serde_json::{json, Value};

fn base_fs() -> Value {
    json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{"name":"team-a"},
      "spec":{"priorityLevelConfiguration":{"name":"global-default"},"matchingPrecedence":500,"distinguisherMethod":{"type":"ByUser"},
        "rules":[{"subjects":[{"kind":"User","user":{"name":"alice"}},{"kind":"ServiceAccount","serviceAccount":{"namespace":"team-a","name":"builder"}}],
          "resourceRules":[{"verbs":["get"],"apiGroups":[""],"resources":["pods"],"namespaces":["default"]}],
          "nonResourceRules":[{"verbs":["get"],"nonResourceURLs":["/healthz"]}]}]}})
}

fn base_pl() -> Value {
    json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration","metadata":{"name":"team-a"},
      "spec":{"type":"Limited","limited":{"nominalConcurrencyShares":10,"lendablePercent":10,
        "limitResponse":{"type":"Queue","queuing":{"queues":16,"handSize":4,"queueLengthLimit":20}}}}})
}

/// Sets (or with `Value::Null` as marker `"__remove__"`, removes) the member at a JSON pointer.
fn set(v: &mut Value, ptr: &str, val: Value) {
    let (parent, key) = ptr.rsplit_once('/').unwrap();
    let p = if parent.is_empty() { &mut *v } else { v.pointer_mut(parent).unwrap_or_else(|| panic!("{parent}")) };
    match p {
        Value::Object(m) => {
            if val == json!("__remove__") {
                m.remove(key);
            } else {
                m.insert(key.to_string(), val);
            }
        }
        Value::Array(a) => a[key.parse::<usize>().unwrap()] = val,
        _ => panic!("{ptr}"),
    }
}

fn errors_of(v: Value) -> Vec<String> {
    match policy_from_value(&v, true) {
        Ok(_) => Vec::new(),
        Err(e) => e,
    }
}

fn expect(mut v: Value, edits: &[(&str, Value)], want: &str) {
    for (p, val) in edits {
        set(&mut v, p, val.clone());
    }
    let errs = errors_of(v);
    assert!(errs.iter().any(|e| e.contains(want)), "want {want:?} in {errs:#?}");
}

#[test]
fn bases_are_valid() {
    assert!(errors_of(base_fs()).is_empty(), "{:?}", errors_of(base_fs()));
    assert!(errors_of(base_pl()).is_empty(), "{:?}", errors_of(base_pl()));
}

#[test]
fn flow_schema_meta_and_spec() {
    let fs = base_fs;
    expect(
        fs(),
        &[("/metadata/name", json!("Team_A"))],
        r#"FlowSchema "Team_A": metadata.name: Invalid value: "Team_A": a lowercase RFC 1123 subdomain"#,
    );
    expect(
        fs(),
        &[("/metadata/name", json!("__remove__"))],
        "FlowSchema (unnamed): metadata.name: Required value: name or generateName is required",
    );
    expect(fs(), &[("/metadata/namespace", json!("default"))], r#"FlowSchema "team-a": metadata.namespace: Forbidden"#);
    expect(
        fs(),
        &[("/spec/matchingPrecedence", json!(-5))],
        r#"FlowSchema "team-a": spec.matchingPrecedence: Invalid value: -5: must be a positive value"#,
    );
    expect(
        fs(),
        &[("/spec/matchingPrecedence", json!(10001))],
        "spec.matchingPrecedence: Invalid value: 10001: must not be greater than 10000",
    );
    expect(
        fs(),
        &[("/spec/matchingPrecedence", json!(1))],
        "spec.matchingPrecedence: Invalid value: 1: only the schema named 'exempt' may have matchingPrecedence 1",
    );
    expect(
        fs(),
        &[("/spec/distinguisherMethod/type", json!("ByGroup"))],
        r#"spec.distinguisherMethod.type: Unsupported value: {"type":"ByGroup"}: supported values: "ByNamespace", "ByUser""#,
    );
    expect(
        fs(),
        &[("/spec/priorityLevelConfiguration/name", json!(""))],
        "spec.priorityLevelConfiguration.name: Required value: must reference a priority level",
    );
    expect(
        fs(),
        &[("/spec/priorityLevelConfiguration/name", json!("Bad!"))],
        r#"spec.priorityLevelConfiguration.name: Invalid value: "Bad!""#,
    );
    expect(
        fs(),
        &[("/spec/rules/0/subjects", json!([]))],
        "spec.rules[0].subjects: Required value: subjects must contain at least one value",
    );
    expect(
        fs(),
        &[("/spec/rules/0/resourceRules", json!([])), ("/spec/rules/0/nonResourceRules", json!(null))],
        "spec.rules[0]: Required value: at least one of resourceRules and nonResourceRules has to be non-empty",
    );
    expect(
        fs(),
        &[("/status", json!({"conditions":[{"type":"Dangling"},{"type":"Dangling"}]}))],
        r#"status.conditions[1].type: Duplicate value: "Dangling""#,
    );
    expect(fs(), &[("/status", json!({"conditions":[{"status":"True"}]}))], "status.conditions[0].type: Required value: must not be empty");
}

#[test]
fn flow_schema_subjects() {
    let s = "/spec/rules/0/subjects/0";
    let fs = base_fs;
    expect(
        fs(),
        &[(s, json!({"kind":"Robot"}))],
        r#"spec.rules[0].subjects[0].kind: Unsupported value: "Robot": supported values: "Group", "ServiceAccount", "User""#,
    );
    expect(
        fs(),
        &[(s, json!({"kind":"User"}))],
        "spec.rules[0].subjects[0].user: Required value: user is required when subject kind is 'User'",
    );
    expect(fs(), &[(s, json!({"kind":"User","user":{}}))], "spec.rules[0].subjects[0].user.name: Required value");
    expect(
        fs(),
        &[(s, json!({"kind":"User","user":{"name":"a"},"group":{"name":"g"}}))],
        "spec.rules[0].subjects[0].group: Forbidden: group is forbidden when subject kind is not 'Group'",
    );
    expect(
        fs(),
        &[(s, json!({"kind":"User","user":{"name":"a"},"serviceAccount":{"namespace":"a","name":"b"}}))],
        "spec.rules[0].subjects[0].serviceAccount: Forbidden: serviceAccount is forbidden when subject kind is not 'ServiceAccount'",
    );
    expect(
        fs(),
        &[(s, json!({"kind":"Group"}))],
        "spec.rules[0].subjects[0].group: Required value: group is required when subject kind is 'Group'",
    );
    expect(fs(), &[(s, json!({"kind":"Group","group":{"name":""}}))], "spec.rules[0].subjects[0].group.name: Required value");
    expect(
        fs(),
        &[(s, json!({"kind":"Group","group":{"name":"g"},"user":{"name":"u"}}))],
        "spec.rules[0].subjects[0].user: Forbidden: user is forbidden when subject kind is not 'User'",
    );
    expect(
        fs(),
        &[(s, json!({"kind":"ServiceAccount"}))],
        "spec.rules[0].subjects[0].serviceAccount: Required value: serviceAccount is required when subject kind is 'ServiceAccount'",
    );
    let sa = "/spec/rules/0/subjects/1/serviceAccount";
    expect(
        fs(),
        &[(sa, json!({"name":"x"}))],
        "spec.rules[0].subjects[1].serviceAccount.namespace: Required value: must specify namespace for service account",
    );
    expect(
        fs(),
        &[(sa, json!({"name":"x","namespace":"Bad.NS"}))],
        r#"spec.rules[0].subjects[1].serviceAccount.namespace: Invalid value: "Bad.NS""#,
    );
    expect(fs(), &[(sa, json!({"namespace":"ns"}))], "spec.rules[0].subjects[1].serviceAccount.name: Required value");
    expect(
        fs(),
        &[(sa, json!({"namespace":"ns","name":"Bad_Name"}))],
        r#"spec.rules[0].subjects[1].serviceAccount.name: Invalid value: "Bad_Name""#,
    );
    expect(fs(), &[("/spec/rules/0/subjects/1/group", json!({"name":"g"}))], "spec.rules[0].subjects[1].group: Forbidden");
    // SA name "*" is fine
    let mut v = fs();
    set(&mut v, sa, json!({"namespace":"ns","name":"*"}));
    assert!(errors_of(v).is_empty());
}

#[test]
fn flow_schema_resource_rules() {
    let r = "/spec/rules/0/resourceRules/0";
    let fs = base_fs;
    expect(
        fs(),
        &[(&format!("{r}/verbs"), json!([]))],
        "spec.rules[0].resourceRules[0].verbs: Required value: verbs must contain at least one value",
    );
    expect(
        fs(),
        &[(&format!("{r}/verbs"), json!(["*", "get"]))],
        r#"spec.rules[0].resourceRules[0].verbs: Invalid value: ["*","get"]: if '*' is present, must not specify other verbs"#,
    );
    expect(
        fs(),
        &[(&format!("{r}/verbs"), json!(["get", "fetch"]))],
        r#"spec.rules[0].resourceRules[0].verbs: Unsupported value: ["get","fetch"]: supported values: "create", "delete", "deletecollection", "get", "list", "patch", "proxy", "update", "watch""#,
    );
    expect(
        fs(),
        &[(&format!("{r}/apiGroups"), json!([]))],
        "spec.rules[0].resourceRules[0].apiGroups: Required value: resource rules must supply at least one api group",
    );
    expect(
        fs(),
        &[(&format!("{r}/apiGroups"), json!(["*", ""]))],
        "spec.rules[0].resourceRules[0].apiGroups: Invalid value: [\"*\",\"\"]: if '*' is present, must not specify other api groups",
    );
    expect(
        fs(),
        &[(&format!("{r}/resources"), json!([]))],
        "spec.rules[0].resourceRules[0].resources: Required value: resource rules must supply at least one resource",
    );
    expect(
        fs(),
        &[(&format!("{r}/resources"), json!(["*", "pods"]))],
        "spec.rules[0].resourceRules[0].resources: Invalid value: [\"*\",\"pods\"]: if '*' is present, must not specify other resources",
    );
    expect(fs(), &[(&format!("{r}/namespaces"), json!([]))], "spec.rules[0].resourceRules[0].namespaces: Required value: resource rules that are not cluster scoped must supply at least one namespace");
    expect(
        fs(),
        &[(&format!("{r}/namespaces"), json!(["*", "a"]))],
        "spec.rules[0].resourceRules[0].namespaces: Invalid value: [\"*\",\"a\"]: if '*' is present, must not specify other namespaces",
    );
    expect(
        fs(),
        &[(&format!("{r}/namespaces"), json!(["ok", "Bad_NS"]))],
        r#"spec.rules[0].resourceRules[0].namespaces[1]: Invalid value: "Bad_NS": each member of this list must be '*' or a DNS-1123 label; a lowercase RFC 1123 label"#,
    );
    // clusterScope without namespaces is fine
    let mut v = fs();
    set(&mut v, &format!("{r}/namespaces"), json!([]));
    set(&mut v, &format!("{r}/clusterScope"), json!(true));
    assert!(errors_of(v).is_empty());
}

#[test]
fn flow_schema_non_resource_rules() {
    let n = "/spec/rules/0/nonResourceRules/0";
    let fs = base_fs;
    expect(fs(), &[(&format!("{n}/verbs"), json!([]))], "spec.rules[0].nonResourceRules[0].verbs: Required value");
    expect(fs(), &[(&format!("{n}/verbs"), json!(["post"]))], r#"spec.rules[0].nonResourceRules[0].verbs: Unsupported value: ["post"]"#);
    expect(
        fs(),
        &[(&format!("{n}/nonResourceURLs"), json!([]))],
        "spec.rules[0].nonResourceRules[0].nonResourceURLs: Required value: nonResourceURLs must contain at least one value",
    );
    expect(fs(), &[(&format!("{n}/nonResourceURLs"), json!(["*","/a"]))], "spec.rules[0].nonResourceRules[0].nonResourceURLs: Invalid value: [\"*\",\"/a\"]: if '*' is present, must not specify other non-resource URLs");
    for (url, msg) in [
        ("", "must not be empty"),
        ("healthz", "must start with slash"),
        ("/a b", "must not contain white-space"),
        ("/a//b", "must not contain double slash"),
        ("/a*", "wildcard can only do suffix matching"),
        ("/a/*/b/*", "wildcard can only do suffix matching"),
    ] {
        expect(
            fs(),
            &[(&format!("{n}/nonResourceURLs"), json!(["/ok", url]))],
            &format!("spec.rules[0].nonResourceRules[0].nonResourceURLs[1]: Invalid value: {}: {msg}", serde_json::to_string(url).unwrap()),
        );
    }
    for ok in ["/", "/healthz/*", "/apis"] {
        let mut v = fs();
        set(&mut v, &format!("{n}/nonResourceURLs"), json!([ok]));
        assert!(errors_of(v).is_empty(), "{ok}");
    }
}

#[test]
fn priority_level_rules() {
    let pl = base_pl;
    let q = "/spec/limited/limitResponse/queuing";
    expect(
        pl(),
        &[("/spec/type", json!("Exempt"))],
        r#"PriorityLevelConfiguration "team-a": spec.type: Invalid value: "Exempt": type must be 'Exempt' if and only if name is 'exempt'"#,
    );
    expect(pl(), &[("/spec/type", json!("Exempt"))], "spec.limited: Forbidden: must be nil if the type is not Limited");
    expect(
        pl(),
        &[("/spec/type", json!("Unlimited"))],
        r#"spec.type: Unsupported value: "Unlimited": supported values: "Exempt", "Limited""#,
    );
    expect(pl(), &[("/spec/exempt", json!({}))], "spec.exempt: Forbidden: must be nil if the type is Limited");
    expect(pl(), &[("/spec/limited", json!(null))], "spec.limited: Required value: must not be empty when type is Limited");
    expect(
        pl(),
        &[("/spec/limited/nominalConcurrencyShares", json!(-1))],
        "spec.limited.nominalConcurrencyShares: Invalid value: -1: must be a non-negative integer",
    );
    expect(
        pl(),
        &[("/spec/limited/lendablePercent", json!(101))],
        "spec.limited.lendablePercent: Invalid value: 101: must be between 0 and 100, inclusive",
    );
    expect(
        pl(),
        &[("/spec/limited/lendablePercent", json!(-1))],
        "spec.limited.lendablePercent: Invalid value: -1: must be between 0 and 100, inclusive",
    );
    expect(
        pl(),
        &[("/spec/limited/borrowingLimitPercent", json!(-1))],
        "spec.limited.borrowingLimitPercent: Invalid value: -1: if specified, must be a non-negative integer",
    );
    expect(
        pl(),
        &[("/spec/limited/limitResponse/type", json!("Drop"))],
        r#"spec.limited.limitResponse.type: Unsupported value: "Drop": supported values: "Queue", "Reject""#,
    );
    expect(
        pl(),
        &[("/spec/limited/limitResponse/type", json!("Reject"))],
        "spec.limited.limitResponse.queuing: Forbidden: must be nil if limited.limitResponse.type is not Limited",
    );
    expect(
        pl(),
        &[(q, json!(null))],
        "spec.limited.limitResponse.queuing: Required value: must not be empty if limited.limitResponse.type is Limited",
    );
    expect(
        pl(),
        &[(&format!("{q}/queueLengthLimit"), json!(-1))],
        "spec.limited.limitResponse.queuing.queueLengthLimit: Invalid value: -1: must be positive",
    );
    expect(pl(), &[(&format!("{q}/queues"), json!(-1))], "spec.limited.limitResponse.queuing.queues: Invalid value: -1: must be positive");
    expect(
        pl(),
        &[(&format!("{q}/queues"), json!(10_000_001))],
        "spec.limited.limitResponse.queuing.queues: Invalid value: 10000001: must not be greater than 10000000",
    );
    expect(
        pl(),
        &[(&format!("{q}/handSize"), json!(-2))],
        "spec.limited.limitResponse.queuing.handSize: Invalid value: -2: must be positive",
    );
    expect(
        pl(),
        &[(&format!("{q}/handSize"), json!(20))],
        "spec.limited.limitResponse.queuing.handSize: Invalid value: 20: should not be greater than queues (16)",
    );
    expect(pl(), &[(&format!("{q}/queues"), json!(10_000_000)), (&format!("{q}/handSize"), json!(8))],
        "spec.limited.limitResponse.queuing.handSize: Invalid value: 8: required entropy bits of deckSize 10000000 and handSize 8 should not be greater than 60");
    // entropy edge: 2^20 queues × handSize 3 = 60 bits is allowed, 4 is not
    let mut v = pl();
    set(&mut v, &format!("{q}/queues"), json!(1 << 20));
    set(&mut v, &format!("{q}/handSize"), json!(3));
    assert!(errors_of(v).is_empty());
    expect(
        pl(),
        &[(&format!("{q}/queues"), json!(1 << 20)), (&format!("{q}/handSize"), json!(4))],
        "required entropy bits of deckSize 1048576 and handSize 4",
    );
    expect(pl(), &[("/status", json!({"conditions":[{"type":"X"},{"type":"X"}]}))], r#"status.conditions[1].type: Duplicate value: "X""#);
}

#[test]
fn v1beta2_names_assured_shares() {
    let mut v = json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1beta2","kind":"PriorityLevelConfiguration","metadata":{"name":"old"},
      "spec":{"type":"Limited","limited":{"assuredConcurrencyShares":-3,"limitResponse":{"type":"Reject"}}}});
    expect(
        v.clone(),
        &[],
        r#"PriorityLevelConfiguration "old": spec.limited.assuredConcurrencyShares: Invalid value: -3: must be a non-negative integer"#,
    );
    set(&mut v, "/apiVersion", json!("flowcontrol.apiserver.k8s.io/v1beta1"));
    expect(v, &[], "spec.limited.assuredConcurrencyShares: Invalid value: -3");
}

#[test]
fn exempt_level_rules() {
    let ex = || {
        json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration","metadata":{"name":"exempt"},
        "spec":{"type":"Exempt","exempt":{"nominalConcurrencyShares":50,"lendablePercent":20}}})
    };
    assert!(errors_of(ex()).is_empty(), "exempt may change spec.exempt");
    expect(
        ex(),
        &[("/spec/exempt/nominalConcurrencyShares", json!(-1))],
        "spec.exempt.nominalConcurrencyShares: Invalid value: -1: must be a non-negative integer",
    );
    expect(
        ex(),
        &[("/spec/exempt/lendablePercent", json!(200))],
        "spec.exempt.lendablePercent: Invalid value: 200: must be between 0 and 100, inclusive",
    );
    expect(
        ex(),
        &[("/spec/type", json!("Limited"))],
        r#"spec.type: Invalid value: "Limited": type must be 'Exempt' if and only if name is 'exempt'"#,
    );
    expect(
        ex(),
        &[("/spec/limited", json!({"limitResponse":{"type":"Reject"}}))],
        "spec of 'exempt' except the 'spec.exempt' field must equal the fixed value",
    );
}

#[test]
fn mandatory_objects_must_equal_builtin() {
    let catch_all_pl = json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfiguration","metadata":{"name":"catch-all"},
        "spec":{"type":"Limited","limited":{"nominalConcurrencyShares":5,"limitResponse":{"type":"Reject"}}}});
    assert!(errors_of(catch_all_pl.clone()).is_empty());
    expect(
        catch_all_pl,
        &[("/spec/limited/nominalConcurrencyShares", json!(50))],
        r#"PriorityLevelConfiguration "catch-all": spec: Invalid value: {"limited":{"limitResponse":{"type":"Reject"},"nominalConcurrencyShares":50},"type":"Limited"}: spec of 'catch-all' must equal the fixed value"#,
    );
    let exempt_fs = json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"FlowSchema","metadata":{"name":"exempt"},
        "spec":{"priorityLevelConfiguration":{"name":"exempt"},"matchingPrecedence":1,
          "rules":[{"subjects":[{"kind":"Group","group":{"name":"system:masters"}}],
            "resourceRules":[{"verbs":["*"],"apiGroups":["*"],"resources":["*"],"clusterScope":true,"namespaces":["*"]}],
            "nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}});
    assert!(errors_of(exempt_fs.clone()).is_empty(), "{:?}", errors_of(exempt_fs));
    expect(exempt_fs.clone(), &[("/spec/matchingPrecedence", json!(2))], r#"FlowSchema "exempt": spec: Invalid value: "#);
    expect(exempt_fs, &[("/spec/rules/0/subjects/0/group/name", json!("admins"))], "spec of 'exempt' must equal the fixed value");
    let mut catch_all_fs = base_fs();
    set(&mut catch_all_fs, "/metadata/name", json!("catch-all"));
    expect(catch_all_fs, &[], "spec of 'catch-all' must equal the fixed value");
}

#[test]
fn duplicate_names_per_kind() {
    let v = json!([base_fs(), base_pl(), base_fs()]);
    let errs = errors_of(v);
    assert_eq!(errs, [r#"FlowSchema "team-a": metadata.name: Duplicate value: "team-a""#]);
}

#[test]
fn all_errors_at_once() {
    let mut fs = base_fs();
    set(&mut fs, "/spec/matchingPrecedence", json!(20000));
    set(&mut fs, "/spec/rules/0/subjects/0/kind", json!("Robot"));
    set(&mut fs, "/spec/rules/0/resourceRules/0/verbs", json!([]));
    let mut pl = base_pl();
    set(&mut pl, "/spec/limited/lendablePercent", json!(300));
    set(&mut pl, "/spec/limited/limitResponse/queuing/handSize", json!(99));
    let mut typo = base_pl();
    set(&mut typo, "/metadata/name", json!("other"));
    set(&mut typo, "/spec/limited/limitResponse/queuing/queues", json!("many"));
    let errs = errors_of(json!({"apiVersion":"v1","kind":"List","items":[fs, pl, typo]}));
    assert_eq!(errs.len(), 6, "{errs:#?}");
    for want in [
        r#"FlowSchema "team-a": spec.matchingPrecedence: Invalid value: 20000"#,
        r#"FlowSchema "team-a": spec.rules[0].subjects[0].kind: Unsupported value: "Robot""#,
        r#"FlowSchema "team-a": spec.rules[0].resourceRules[0].verbs: Required value"#,
        r#"PriorityLevelConfiguration "team-a": spec.limited.lendablePercent: Invalid value: 300"#,
        r#"PriorityLevelConfiguration "team-a": spec.limited.limitResponse.queuing.handSize: Invalid value: 99"#,
        r#"PriorityLevelConfiguration "other": spec.limited.limitResponse.queuing.queues: Invalid value: "many": must be an integer"#,
    ] {
        assert!(errs.iter().any(|e| e.starts_with(want)), "want {want:?} in {errs:#?}");
    }
}
