#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Parsing of API objects in every version and input form, and defaulting
//! (`flowcontrol/*/types.go`, `pkg/apis/flowcontrol/v1*/defaults.go`).
use apf_wasm::policy::model::{LimitResponse, PriorityLevelSpec, Queuing};
use apf_wasm::policy::objects::{parse_objects, ApiObject, ApiVersion};
use apf_wasm::policy::{policy_from_json, policy_from_value};
use serde_json::{json, Value};

fn pl(version: &str, limited: Value) -> Value {
    json!({"apiVersion": format!("flowcontrol.apiserver.k8s.io/{version}"), "kind":"PriorityLevelConfiguration",
        "metadata":{"name":"p"}, "spec":{"type":"Limited","limited":limited}})
}

fn shares_of(v: Value) -> i32 {
    let (objs, errs) = parse_objects(&v);
    assert!(errs.is_empty(), "{errs:?}");
    match &objs[0] {
        ApiObject::PriorityLevel(p) => p.to_model().nominal_concurrency_shares(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn v1_shares_nil_defaults_zero_kept() {
    assert_eq!(shares_of(pl("v1", json!({"limitResponse":{"type":"Reject"}}))), 30);
    assert_eq!(shares_of(pl("v1", json!({"nominalConcurrencyShares":null,"limitResponse":{"type":"Reject"}}))), 30);
    assert_eq!(shares_of(pl("v1", json!({"nominalConcurrencyShares":0,"limitResponse":{"type":"Reject"}}))), 0);
    assert_eq!(shares_of(pl("v1", json!({"nominalConcurrencyShares":7,"limitResponse":{"type":"Reject"}}))), 7);
}

#[test]
fn v1beta3_zero_quirk_and_annotation() {
    assert_eq!(shares_of(pl("v1beta3", json!({"nominalConcurrencyShares":0,"limitResponse":{"type":"Reject"}}))), 30);
    assert_eq!(shares_of(pl("v1beta3", json!({"limitResponse":{"type":"Reject"}}))), 30);
    assert_eq!(shares_of(pl("v1beta3", json!({"nominalConcurrencyShares":9,"limitResponse":{"type":"Reject"}}))), 9);
    let mut v = pl("v1beta3", json!({"nominalConcurrencyShares":0,"limitResponse":{"type":"Reject"}}));
    v["metadata"]["annotations"] = json!({"flowcontrol.k8s.io/v1beta3-preserve-zero-concurrency-shares": ""});
    assert_eq!(shares_of(v), 0);
    // the annotation does not matter for v1
    let mut v = pl("v1", json!({"limitResponse":{"type":"Reject"}}));
    v["metadata"]["annotations"] = json!({"flowcontrol.k8s.io/v1beta3-preserve-zero-concurrency-shares": "true"});
    assert_eq!(shares_of(v), 30);
}

#[test]
fn v1beta1_v1beta2_assured_shares() {
    for ver in ["v1beta1", "v1beta2"] {
        assert_eq!(shares_of(pl(ver, json!({"assuredConcurrencyShares":0,"limitResponse":{"type":"Reject"}}))), 30);
        assert_eq!(shares_of(pl(ver, json!({"limitResponse":{"type":"Reject"}}))), 30);
        assert_eq!(shares_of(pl(ver, json!({"assuredConcurrencyShares":12,"limitResponse":{"type":"Reject"}}))), 12);
        // the v1 field name is unknown there and ignored
        assert_eq!(shares_of(pl(ver, json!({"nominalConcurrencyShares":12,"limitResponse":{"type":"Reject"}}))), 30);
    }
}

#[test]
fn limited_and_queuing_defaults() {
    let (objs, errs) = parse_objects(&pl("v1", json!({"limitResponse":{"type":"Queue","queuing":{}}})));
    assert!(errs.is_empty());
    let ApiObject::PriorityLevel(p) = &objs[0] else { panic!() };
    assert_eq!(
        p.to_model().spec,
        PriorityLevelSpec::Limited {
            nominal_concurrency_shares: 30,
            lendable_percent: 0,
            borrowing_limit_percent: None,
            limit_response: LimitResponse::Queue(Queuing { queues: 64, hand_size: 8, queue_length_limit: 50 }),
        }
    );
    let (objs, _) = parse_objects(&pl(
        "v1beta2",
        json!({"limitResponse":{"type":"Queue","queuing":{"queues":3,"handSize":0,"queueLengthLimit":7}}, "borrowingLimitPercent": 0}),
    ));
    let ApiObject::PriorityLevel(p) = &objs[0] else { panic!() };
    let m = p.to_model();
    assert_eq!(m.queuing(), Some(Queuing { queues: 3, hand_size: 8, queue_length_limit: 7 }));
    assert!(matches!(m.spec, PriorityLevelSpec::Limited { borrowing_limit_percent: Some(0), .. }));
    // queuing not defaulted when absent: a Queue level without it is invalid
    let errs = policy_from_value(&pl("v1", json!({"limitResponse":{"type":"Queue"}})), true).unwrap_err();
    assert!(errs[0].contains("spec.limited.limitResponse.queuing: Required value"), "{errs:?}");
}

#[test]
fn exempt_section_defaults() {
    for ver in ["v1", "v1beta3", "v1beta2", "v1beta1"] {
        let v = json!({"apiVersion": format!("flowcontrol.apiserver.k8s.io/{ver}"), "kind":"PriorityLevelConfiguration",
            "metadata":{"name":"exempt"}, "spec":{"type":"Exempt"}});
        let (objs, errs) = parse_objects(&v);
        assert!(errs.is_empty());
        let ApiObject::PriorityLevel(p) = &objs[0] else { panic!() };
        assert_eq!(p.to_model().spec, PriorityLevelSpec::Exempt { nominal_concurrency_shares: 0, lendable_percent: 0 });
        assert!(policy_from_value(&v, true).is_ok());
    }
}

#[test]
fn matching_precedence_default() {
    let fs = |mp: Value| {
        json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1beta3","kind":"FlowSchema","metadata":{"name":"f"},
        "spec":{"priorityLevelConfiguration":{"name":"global-default"},"matchingPrecedence":mp,
          "rules":[{"subjects":[{"kind":"User","user":{"name":"u"}}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}})
    };
    for mp in [json!(0), json!(null)] {
        let p = policy_from_value(&fs(mp), true).unwrap();
        assert_eq!(p.flow_schemas.iter().find(|f| f.name == "f").unwrap().matching_precedence, 1000);
    }
}

fn fs_item(name: &str, version: &str) -> Value {
    json!({"apiVersion": format!("flowcontrol.apiserver.k8s.io/{version}"), "kind":"FlowSchema","metadata":{"name":name},
        "spec":{"priorityLevelConfiguration":{"name":"global-default"},
          "rules":[{"subjects":[{"kind":"User","user":{"name":"u"}}],"nonResourceRules":[{"verbs":["*"],"nonResourceURLs":["*"]}]}]}})
}

#[test]
fn input_forms_and_mixed_versions() {
    let single = fs_item("a", "v1");
    let (o, e) = parse_objects(&single);
    assert!(e.is_empty());
    assert_eq!(o.len(), 1);
    assert_eq!(o[0].version(), ApiVersion::V1);

    let arr = json!([
        fs_item("a", "v1"),
        fs_item("b", "v1beta3"),
        fs_item("c", "v1beta2"),
        fs_item("d", "v1beta1"),
        pl("v1beta2", json!({"assuredConcurrencyShares":3,"limitResponse":{"type":"Reject"}}))
    ]);
    let (o, e) = parse_objects(&arr);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(
        o.iter().map(|x| x.version()).collect::<Vec<_>>(),
        [ApiVersion::V1, ApiVersion::V1beta3, ApiVersion::V1beta2, ApiVersion::V1beta1, ApiVersion::V1beta2]
    );

    let list =
        json!({"apiVersion":"v1","kind":"List","metadata":{"resourceVersion":""},"items":[fs_item("a", "v1"), fs_item("b", "v1beta3")]});
    let (o, e) = parse_objects(&list);
    assert!(e.is_empty());
    assert_eq!(o.len(), 2);

    // typed lists: items may omit kind and apiVersion
    let fsl = json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1beta3","kind":"FlowSchemaList","items":[
        {"metadata":{"name":"x"},"spec":{"priorityLevelConfiguration":{"name":"global-default"},
          "rules":[{"subjects":[{"kind":"Group","group":{"name":"g"}}],"nonResourceRules":[{"verbs":["get"],"nonResourceURLs":["/x"]}]}]}}]});
    let (o, e) = parse_objects(&fsl);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!((o[0].name(), o[0].version()), ("x", ApiVersion::V1beta3));
    let pll = json!({"apiVersion":"flowcontrol.apiserver.k8s.io/v1","kind":"PriorityLevelConfigurationList","items":[
        {"metadata":{"name":"q"},"spec":{"type":"Limited","limited":{"limitResponse":{"type":"Reject"}}}}]});
    let (o, e) = parse_objects(&pll);
    assert!(e.is_empty());
    assert!(matches!(o[0], ApiObject::PriorityLevel(_)));

    // an array of lists
    let (o, e) = parse_objects(&json!([list, pll]));
    assert!(e.is_empty());
    assert_eq!(o.len(), 3);
    // empty inputs
    assert_eq!(parse_objects(&json!([])).0.len(), 0);
    assert_eq!(parse_objects(&json!({"kind":"List","apiVersion":"v1","items":null})).0.len(), 0);
}

#[test]
fn kubectl_fixture_parses_ignoring_status_and_managed_fields() {
    let bytes = std::fs::read("tests/fixtures/policy/kubectl-get-v1.json").unwrap();
    let (o, e) = parse_objects(&serde_json::from_slice(&bytes).unwrap());
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(o.len(), 6);
    assert_eq!(o.iter().map(|x| x.name()).collect::<Vec<_>>(), ["team-a", "catch-all", "orphan", "exempt", "team-a", "batch"]);
    let ApiObject::FlowSchema(f) = &o[0] else { panic!() };
    assert_eq!(f.condition_types, ["Dangling"]);
    assert_eq!(f.meta.uid, "6f1a0b3c-1111-4a2b-9c3d-0123456789ab");
    assert_eq!(f.location, "items[0]");
}

#[test]
fn wrong_types_name_the_field() {
    let cases: [(Value, &str); 10] = [
        (json!({"spec":{"matchingPrecedence":"abc"}}), r#"spec.matchingPrecedence: Invalid value: "abc": must be an integer"#),
        (json!({"spec":{"matchingPrecedence":1e30}}), "spec.matchingPrecedence: Invalid value: 1e+30: must be an integer"),
        (
            json!({"spec":{"matchingPrecedence":1099511627776_i64}}),
            "spec.matchingPrecedence: Invalid value: 1099511627776: must fit in a 32-bit signed integer",
        ),
        (json!({"spec":{"matchingPrecedence":18446744073709551615_u64}}), "must fit in a 32-bit signed integer"),
        (json!({"spec":{"matchingPrecedence":2.5}}), "spec.matchingPrecedence: Invalid value: 2.5: must be an integer"),
        (json!({"spec":{"rules":"all"}}), r#"spec.rules: Invalid value: "all": must be a list"#),
        (
            json!({"spec":{"rules":[{"resourceRules":[{"clusterScope":"yes"}]}]}}),
            r#"spec.rules[0].resourceRules[0].clusterScope: Invalid value: "yes": must be a boolean"#,
        ),
        (
            json!({"spec":{"rules":[{"subjects":[{"kind":"User","user":{"name":5}}]}]}}),
            "spec.rules[0].subjects[0].user.name: Invalid value: 5: must be a string",
        ),
        (
            json!({"spec":{"rules":[{"nonResourceRules":[{"verbs":["get", 7]}]}]}}),
            "spec.rules[0].nonResourceRules[0].verbs[1]: Invalid value: 7: must be a string",
        ),
        (json!({"spec":{"priorityLevelConfiguration":"x"}}), r#"spec.priorityLevelConfiguration: Invalid value: "x": must be an object"#),
    ];
    for (patch, want) in cases {
        let mut v = fs_item("w", "v1");
        let spec_patch = patch["spec"].as_object().unwrap();
        for (k, val) in spec_patch {
            v["spec"][k] = val.clone();
        }
        let errs = policy_from_value(&v, true).unwrap_err();
        assert!(errs.iter().any(|e| e.starts_with(r#"FlowSchema "w": "#) && e.contains(want)), "want {want:?} in {errs:?}");
    }
    let mut v = pl(
        "v1",
        json!({"nominalConcurrencyShares": -1, "lendablePercent": 1e300, "limitResponse":{"type":"Queue","queuing":{"queues":4294967296_i64}}}),
    );
    v["metadata"]["annotations"] = json!({"a": 1});
    let errs = policy_from_value(&v, true).unwrap_err();
    assert!(errs.iter().any(|e| e.contains("spec.limited.lendablePercent: Invalid value: 1e+300")), "{errs:?}");
    assert!(errs.iter().any(|e| e.contains("spec.limited.limitResponse.queuing.queues: Invalid value: 4294967296")), "{errs:?}");
    assert!(errs.iter().any(|e| e.contains(r#"metadata.annotations["a"]: Invalid value: 1: must be a string"#)), "{errs:?}");
}

#[test]
fn unknown_kind_version_and_junk() {
    let errs = policy_from_value(&json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}), true).unwrap_err();
    assert!(
        errs[0].contains(r#"kind: Unsupported value: "Pod": supported values: "FlowSchema", "PriorityLevelConfiguration""#),
        "{errs:?}"
    );
    let errs = policy_from_value(
        &json!([{"apiVersion":"flowcontrol.apiserver.k8s.io/v1alpha1","kind":"FlowSchema","metadata":{"name":"old"}}]),
        true,
    )
    .unwrap_err();
    assert!(errs[0].starts_with(r#"FlowSchema "old": apiVersion: Unsupported value: "flowcontrol.apiserver.k8s.io/v1alpha1""#), "{errs:?}");
    let errs = policy_from_value(&json!([{"kind":"FlowSchema"}]), true).unwrap_err();
    assert!(errs.iter().any(|e| e == "FlowSchema at [0]: apiVersion: Required value"), "{errs:?}");
    for junk in [json!("hello"), json!(5), json!(true), json!([1, [2, {"a": null}]])] {
        assert!(policy_from_value(&junk, true).is_err(), "{junk}");
    }
    assert!(policy_from_value(&json!(null), true).is_err());
    // nested too deeply
    let mut v = json!([]);
    for _ in 0..50 {
        v = json!([v, fs_item("z", "v1")]);
    }
    let errs = policy_from_value(&v, true).unwrap_err();
    assert!(errs.iter().any(|e| e.contains("nested too deeply")), "{errs:?}");
}

#[test]
fn malformed_json_never_panics() {
    let errs = policy_from_json(b"{\"kind\": \"List\",\n \"items\": [", true).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert!(errs[0].contains("line 2"), "{errs:?}");
    let deep = "[".repeat(100_000);
    assert!(policy_from_json(deep.as_bytes(), true).is_err());
    let deep_obj = format!("{}{}", "{\"a\":".repeat(100_000), "1");
    assert!(policy_from_json(deep_obj.as_bytes(), true).is_err());
    // deep junk inside an ignored field, within the parser's depth limit
    let mut junk = json!(1);
    for _ in 0..100 {
        junk = json!({"x": [junk]});
    }
    let mut v = fs_item("j", "v1");
    v["status"]["junk"] = junk.clone();
    v["metadata"]["managedFields"] = junk;
    let bytes = serde_json::to_vec(&v).unwrap();
    let _ = policy_from_json(&bytes, true);
    for s in ["", " ", "nul", "\u{0}", "{\"a\":}", "[1,]", "\"\\uD800\""] {
        let _ = policy_from_json(s.as_bytes(), true);
    }
}
