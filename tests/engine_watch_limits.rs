#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Open-watch limits in the engine (places in the shared store, under CAS, per worker slot),
//! their configuration (`watchLimits`: shape and errors) and their explanation by `apf classify`.

use apf_wasm::cli::classify::{classify_request, ClassifyRequest};
use apf_wasm::config::parse_plugin_config;
use apf_wasm::engine::store::{MemStore, WorkerStore};
use apf_wasm::engine::watch_limits::{acquire, purge, read, release, Exceeded, Limit, Place};
use apf_wasm::engine::{watches, Compiled};
use serde_json::json;

fn place(level: &str, flow: u64) -> Place {
    Place { level: level.into(), flow_schema: "fs".into(), flow_hash: flow }
}

const FLOW_2: Limit = Limit { per_flow: Some(2), per_level: None };

#[test]
fn a_flow_takes_places_up_to_its_limit_and_gets_them_back() {
    let s = MemStore::new();
    let a = place("l", 1);
    assert_eq!(acquire(&s, 1, &a, FLOW_2).unwrap(), None);
    assert_eq!(acquire(&s, 2, &a, FLOW_2).unwrap(), None, "another worker, same flow");
    assert_eq!(acquire(&s, 1, &a, FLOW_2).unwrap(), Some(Exceeded::Flow { open: 2, limit: 2 }));
    assert_eq!(acquire(&s, 1, &place("l", 2), FLOW_2).unwrap(), None, "another flow");
    release(&s, 2, &a).unwrap();
    assert_eq!(acquire(&s, 1, &a, FLOW_2).unwrap(), None);
    let p = read(&s).unwrap();
    assert_eq!((p.of_flow(1), p.of_flow(2), p.of_level("l")), (2, 1, 3));
    // A release of a place not held changes nothing.
    release(&s, 9, &a).unwrap();
    assert_eq!(read(&s).unwrap().of_flow(1), 2);
}

#[test]
fn a_level_limit_counts_every_flow_of_the_level() {
    let s = MemStore::new();
    let lim = Limit { per_flow: None, per_level: Some(2) };
    acquire(&s, 1, &place("l", 1), lim).unwrap();
    acquire(&s, 1, &place("l", 2), lim).unwrap();
    assert_eq!(acquire(&s, 1, &place("l", 3), lim).unwrap(), Some(Exceeded::Level { open: 2, limit: 2 }));
    assert_eq!(acquire(&s, 1, &place("m", 3), lim).unwrap(), None, "another level");
}

#[test]
fn a_dead_workers_places_go_with_the_purge_of_its_watches() {
    let s = MemStore::new();
    let a = place("l", 1);
    acquire(&s, 1, &a, FLOW_2).unwrap();
    acquire(&s, 2, &a, FLOW_2).unwrap();
    watches::purge(&s, 2).unwrap();
    assert_eq!(read(&s).unwrap().of_flow(1), 1);
    purge(&s, 1).unwrap();
    assert!(read(&s).unwrap().flows().is_empty());
}

#[test]
fn concurrent_workers_never_exceed_the_limit() {
    let s = MemStore::new();
    let limit = Limit { per_flow: Some(50), per_level: None };
    let taken: u32 = std::thread::scope(|t| {
        let handles: Vec<_> = (1..=4)
            .map(|slot| {
                let s = &s;
                t.spawn(move || {
                    let ws = WorkerStore::new(s);
                    (0..40).filter(|_| acquire(&ws, slot, &place("l", 7), limit).unwrap().is_none()).count() as u32
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(taken, 50);
    assert_eq!(read(&s).unwrap().of_flow(7), 50);
}

#[test]
fn the_configuration_shape_and_its_errors() {
    let ok = parse_plugin_config(br#"{"watchLimits": {"perFlow": 100, "perLevel": {"workload-low": 500}}}"#).unwrap();
    assert_eq!(ok.watch_limits.per_flow, Some(100));
    assert_eq!(ok.watch_limits.per_level, vec![("workload-low".to_string(), 500)]);
    assert!(!parse_plugin_config(b"{}").unwrap().watch_limits.is_on(), "off unless configured");
    let cases = [
        (json!({"watchLimits": 5}), "watchLimits: expected an object"),
        (json!({"watchLimits": {"perFlow": 0}}), "watchLimits: perFlow: must be an integer between 1"),
        (json!({"watchLimits": {"perFlow": "10"}}), "watchLimits: perFlow: expected an integer"),
        (json!({"watchLimits": {"perLevel": {"workload-low": -1}}}), "watchLimits: perLevel.workload-low: must be an integer"),
        (json!({"watchLimits": {"perLevel": [1]}}), "watchLimits: perLevel: expected an object"),
        (json!({"watchLimits": {"perflow": 1}}), "watchLimits: unknown key \"perflow\""),
    ];
    for (doc, want) in cases {
        let errs = parse_plugin_config(doc.to_string().as_bytes()).unwrap_err();
        assert!(errs.iter().any(|e| e.starts_with(want)), "{doc}: {errs:?}");
    }
    let both = parse_plugin_config(br#"{"watchLimits": {"perFlow": 0, "perLevel": {"x": 0}}}"#).unwrap_err();
    assert!(both[0].contains("perFlow") && both[0].contains("perLevel.x"), "every error is reported: {both:?}");
    // A level the policy does not have is a warning (the cluster's policy may bring it).
    let warned = parse_plugin_config(br#"{"watchLimits": {"perLevel": {"no-such-level": 5}}}"#).unwrap();
    let w = &warned.policy.warnings;
    assert!(w.iter().any(|w| w.contains("watchLimits.perLevel") && w.contains("no-such-level")), "{w:?}");
}

#[test]
fn apf_classify_explains_the_limits_of_a_watch() {
    let cfg = parse_plugin_config(br#"{"watchLimits": {"perFlow": 100, "perLevel": {"workload-low": 500}}}"#).unwrap();
    let c = Compiled::new(cfg, 0);
    let req = |path: &str, user: &str| ClassifyRequest {
        method: "GET".into(),
        path: path.into(),
        user: Some(user.into()),
        groups: vec!["system:serviceaccounts".into()],
        ..ClassifyRequest::default()
    };
    let sa = "system:serviceaccount:default:ctrl";
    let out = classify_request(&c, &req("/api/v1/pods?watch=true", sa));
    assert_eq!(out["priorityLevel"], "workload-low");
    let wl = &out["watchLimit"];
    assert_eq!((wl["applies"].as_bool(), wl["perFlow"].as_u64(), wl["perLevel"].as_u64()), (Some(true), Some(100), Some(500)), "{out}");
    assert!(wl["flowHash"].as_str().is_some_and(|h| h != "0"));
    let list = classify_request(&c, &req("/api/v1/pods", sa));
    assert_eq!(list["watchLimit"]["applies"], false);
    let plain = classify_request(&Compiled::new(parse_plugin_config(b"{}").unwrap(), 0), &req("/api/v1/pods?watch=true", sa));
    assert!(plain.get("watchLimit").is_none(), "not shown when off");
}
