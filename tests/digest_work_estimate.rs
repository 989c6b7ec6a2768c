#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Upstream vectors of `width_test.go: TestWorkEstimator`, `list_work_estimator_test.go:
//! TestListWorkEstimator` and `watch_tracker_test.go` (`TestRegisterWatch`,
//! `TestGetInterestedWatchCount`, `TestGetInterestedWatchCountWithIndex`).
use apf_wasm::codec::{Reader, Writer};
use apf_wasm::digest::request_info::{parse_request_info, RequestInfo};
use apf_wasm::digest::work_estimate::*;
use apf_wasm::fairqueuing::WorkEstimate;

fn found(n: i64, avg: i64) -> StatsLookup {
    StatsLookup::Found(ObjectStats { count: n, average_object_size_bytes: avg })
}

fn list(uri: &str) -> RequestInfo {
    let i = parse_request_info("GET", uri.as_bytes());
    assert_eq!(i.resource, "events", "{uri}");
    i
}

/// `width_test.go: TestWorkEstimator`, LIST / WATCH cases (the first case, RequestInfo absent,
/// cannot occur here: we always parse one).
#[test]
fn width_test_list_rows() {
    let cfg = WorkEstimatorConfig::default();
    let b = "/apis/foo.bar/v1/events";
    let rows: Vec<(u32, String, StatsLookup, u32, u32)> = vec![
        (3, format!("{b}?limit=invalid"), found(799, 10_000), 100, 100),
        (4, format!("{b}?limit=399&resourceVersion=1"), found(699, 10_000), 100, 40),
        (5, format!("{b}?resourceVersion=1"), found(699, 10_000), 100, 10),
        (6, format!("{b}?resourceVersion=1"), found(69, 10_000), 100, 7),
        (7, format!("{b}?limit=399"), found(699, 10_000), 100, 40),
        (8, b.to_string(), found(399, 10_000), 100, 40),
        (9, b.to_string(), StatsLookup::NotFound, 100, 1),
        (10, format!("{b}?continue=token&limit=399"), found(699, 10_000), 100, 40),
        (11, format!("{b}?limit=299&resourceVersion=0"), found(399, 10_000), 100, 10),
        (12, format!("{b}?limit=20&resourceVersion=0"), found(399, 10_000), 100, 2),
        (13, format!("{b}?resourceVersion=0"), found(799, 10_000), 100, 10),
        (14, format!("{b}?resourceVersion=0"), found(79, 10_000), 100, 8),
        (15, format!("{b}?resourceVersion=1&resourceVersionMatch=Exact&limit=399"), found(699, 10_000), 100, 40),
        (16, format!("{b}?resourceVersion=1&resourceVersionMatch=NotOlderThan"), found(799, 10_000), 100, 10),
        (17, format!("{b}?resourceVersion=1&resourceVersionMatch=NotOlderThan"), found(79, 10_000), 100, 8),
        (18, format!("{b}?resourceVersion=1&resourceVersionMatch=Exact"), found(5000, 10_000), 20, 20),
        (19, format!("{b}?resourceVersionMatch=foo"), found(200, 10_000), 100, 20),
        (20, format!("{b}?resourceVersion=foo&resourceVersionMatch=Exact&limit=399"), found(699, 10_000), 100, 40),
        (21, format!("{b}?resourceVersion=1&resourceVersionMatch=Exact"), found(5000, 10_000), 20, 20),
        (22, format!("{b}?resourceVersion=0"), StatsLookup::NotFound, 100, 1),
        (23, b.to_string(), StatsLookup::Stale, 100, 100),
        (24, b.to_string(), found(1, 0), 100, 15),
        (25, b.to_string(), StatsLookup::NotFound, 100, 1),
        (26, b.to_string(), StatsLookup::OtherError, 100, 100),
        (27, format!("{b}?resourceVersion=0&limit=1"), StatsLookup::NotFound, 100, 1),
        (28, format!("{b}?limit=1"), StatsLookup::Stale, 100, 15),
        (30, format!("{b}?limit=1"), StatsLookup::NotFound, 100, 1),
        (31, format!("{b}?limit=1"), StatsLookup::OtherError, 100, 15),
        (32, format!("{b}?resourceVersion=0&limit=499"), StatsLookup::NotFound, 100, 1),
        (33, format!("{b}?limit=499"), StatsLookup::Stale, 100, 100),
        (34, format!("{b}?limit=499"), found(1, 0), 100, 15),
        (35, format!("{b}?resourceVersion=0&limit=499"), found(1, 0), 100, 10),
        (36, format!("{b}?limit=499"), StatsLookup::NotFound, 100, 1),
        (37, format!("{b}?limit=499"), StatsLookup::OtherError, 100, 100),
        (38, format!("{b}?fieldSelector=metadata.name%3Dtest"), found(799, 200_000), 100, 2),
        (39, format!("{b}?fieldSelector=metadata.name%3Dtest"), found(799, 1_500_000), 100, 15),
        (40, format!("{b}?fieldSelector=metadata.name%3Dtest&limit=500&resourceVersion=0"), found(799, 200_000), 100, 2),
        (41, format!("{b}?fieldSelector=metadata.name%3Dtest&limit=500&resourceVersion=0"), found(799, 1_500_000), 100, 10),
        (42, format!("{b}?labelSelector=app%3Dtest"), found(799, 10_000), 100, 80),
        (43, format!("{b}?labelSelector=app%3Dtest&limit=49"), found(799, 10_000), 100, 40),
        (44, format!("{b}?labelSelector=app%3Dtest&limit=699"), found(799, 10_000), 100, 70),
        (45, format!("{b}?resourceVersion=0&labelSelector=app%3Dtest"), found(799, 10_000), 100, 10),
        (46, format!("{b}?resourceVersion=0&labelSelector=app%3Dtest&limit=29"), found(799, 10_000), 100, 3),
        (47, format!("{b}?watch=true"), found(799, 1_000), 100, 8),
        (48, format!("{b}?watch=true&resourceVersion=0"), found(799, 1_000), 100, 8),
        (49, format!("{b}?watch=true&resourceVersion=1"), found(799, 1_000), 100, 1),
        (50, format!("{b}?watch=true&sendInitialEvents=false"), found(799, 1_000), 100, 8),
        (51, format!("{b}?watch=true&sendInitialEvents=false&resourceVersion=0"), found(799, 1_000), 100, 8),
        (52, format!("{b}?watch=true&sendInitialEvents=false&resourceVersion=1"), found(799, 1_000), 100, 1),
        (53, format!("{b}?watch=true&sendInitialEvents=true"), found(799, 1_000), 100, 8),
        (54, format!("{b}?watch=true&sendInitialEvents=true&resourceVersion=0"), found(799, 1_000), 100, 8),
    ];
    for (row, uri, stats, max, want) in rows {
        let info = list(&uri);
        if (38..=41).contains(&row) {
            assert_eq!(info.name, "test");
        }
        let got = estimate_list_with_stats(&cfg, &info, Some(max), stats);
        assert_eq!(got, WorkEstimate { initial_seats: want, final_seats: 0, additional_latency: 0 }, "row {row}: {uri}");
    }
    // row 29: RequestInfo injected for a URI without '?': list events with an empty query
    let mut info = parse_request_info("GET", b"/apis/foo.bar/v1/events&limit=1");
    info.resource = "events".into();
    assert_eq!(estimate_list_with_stats(&cfg, &info, Some(100), found(1, 0)).initial_seats, 15);
}

#[test]
fn width_test_dispatch_and_config_stats() {
    let cfg: WorkEstimatorConfig =
        serde_json::from_str(r#"{"objectCounts":{"foo.bar/events":{"count":699,"averageObjectSizeBytes":10000},"pods":5000}}"#).unwrap();
    // row 2: get → 1
    let get = parse_request_info("GET", b"/apis/");
    assert_eq!(estimate(&cfg, &get, Some(10), 0), WorkEstimate::ONE);
    // row 7 through the configuration table
    let i = list("/apis/foo.bar/v1/events?limit=399");
    assert_eq!(estimate(&cfg, &i, Some(100), 0).initial_seats, 40);
    // unknown resource → NotFound → 1 (row 9)
    let i = parse_request_info("GET", b"/apis/other/v1/things");
    assert_eq!(estimate(&cfg, &i, Some(100), 0).initial_seats, 1);
    // bare count: average 1.5 MB stand-in → capped at max
    let i = parse_request_info("GET", b"/api/v1/pods");
    assert_eq!(estimate(&cfg, &i, None, 0).initial_seats, 100);
    assert_eq!(estimate(&cfg, &i, Some(7), 0).initial_seats, 7);
    assert_eq!(estimate(&cfg, &i, Some(0), 0).initial_seats, 100);
    assert_eq!(estimate(&cfg, &i, Some(1000), 0).initial_seats, 100);
    // deletecollection, proxy, non-resource → 1
    for (m, u) in [("DELETE", "/api/v1/pods"), ("GET", "/api/v1/proxy/namespaces/a/pods/b"), ("POST", "/openapi/v2"), ("GET", "/healthz")] {
        assert_eq!(estimate(&cfg, &parse_request_info(m, u.as_bytes()), Some(100), 1000), WorkEstimate::ONE, "{m} {u}");
    }
    // WatchList gate off → watch costs 1
    let off = WorkEstimatorConfig { watch_list: false, ..cfg.clone() };
    let w = list("/apis/foo.bar/v1/events?watch=true");
    assert_eq!(estimate(&off, &w, Some(100), 0).initial_seats, 1);
    assert_eq!(estimate(&cfg, &w, Some(100), 0).initial_seats, 10);
    // count-based gate: limit 10
    let cb = WorkEstimatorConfig { size_based_list_cost: false, ..cfg.clone() };
    let i = list("/apis/foo.bar/v1/events");
    assert_eq!(estimate(&cb, &i, None, 0).initial_seats, 10);
    // consistent reads from cache knob: row 8 becomes cache-served → min(3.99 MB, 1 MB) → 10
    let cc = WorkEstimatorConfig { consistent_reads_from_cache: true, ..cfg.clone() };
    assert_eq!(estimate(&cc, &i, None, 0).initial_seats, 10);
    assert!(serde_json::from_str::<WorkEstimatorConfig>(r#"{"bogus":1}"#).is_err());
    assert!(serde_json::from_str::<WorkEstimatorConfig>(r#"{"objectCounts":{"a":{"count":1,"x":2}}}"#).is_err());
    let bad: WorkEstimatorConfig = serde_json::from_str(r#"{"objectCounts":{"a/b/c":1,"x":-1}}"#).unwrap();
    assert_eq!(bad.validate().len(), 2);
    assert!(cfg.validate().is_empty());
}

/// `width_test.go: TestWorkEstimator`, mutating cases (create / update / patch / delete).
#[test]
fn width_test_mutating_rows() {
    let cfg = WorkEstimatorConfig::default();
    let ms = 1_000_000;
    let rows: Vec<(u32, &str, &str, u32, u32, u32, i64)> = vec![
        (56, "POST", "/apis/foo.bar/v1/foos", 0, 10, 0, 0),
        (57, "POST", "/apis/foo.bar/v1/foos", 29, 10, 3, 5 * ms),
        (58, "POST", "/apis/foo.bar/v1/foos", 5, 10, 0, 0),
        (59, "POST", "/apis/foo.bar/v1/foos", 199, 10, 10, 10 * ms),
        (60, "PUT", "/apis/foo.bar/v1/foos/myfoo", 0, 10, 0, 0),
        (61, "PUT", "/apis/foor.bar/v1/foos/myfoo", 29, 10, 3, 5 * ms),
        (62, "PATCH", "/apis/foo.bar/v1/foos/myfoo", 0, 10, 0, 0),
        (63, "PATCH", "/apis/foo.bar/v1/foos/myfoo", 29, 10, 3, 5 * ms),
        (64, "PATCH", "/apis/foo.bar/v1/foos/myfoo", 100, 5, 5, 10 * ms),
        (65, "DELETE", "/apis/foo.bar/v1/foos/myfoo", 0, 10, 0, 0),
        (66, "DELETE", "/apis/foo.bar/v1/foos/myfoo", 29, 10, 3, 5 * ms),
        (67, "POST", "/api/v1/namespaces/foo/serviceaccounts/default/token", 5777, 10, 0, 0),
        (68, "POST", "/api/v1/namespaces/foo/serviceaccounts", 1000, 20, 10, 50 * ms),
    ];
    for (row, m, u, w, max, fin, lat) in rows {
        let info = parse_request_info(m, u.as_bytes());
        let got = estimate(&cfg, &info, Some(max), w);
        assert_eq!(got, WorkEstimate { initial_seats: 1, final_seats: fin, additional_latency: lat }, "row {row}");
    }
    // non-divisible latency truncates like Go: 7 seats × 5 ms over 3 seats
    let info = parse_request_info("POST", b"/api/v1/namespaces/a/pods");
    assert_eq!(estimate(&cfg, &info, Some(3), 70).additional_latency, 11_666_666);
    let off = WorkEstimatorConfig { mutating_enabled: false, ..cfg };
    assert_eq!(estimate(&off, &info, Some(3), 70), WorkEstimate::ONE);
}

/// `list_work_estimator_test.go: TestListWorkEstimator`: the raw `seatsBasedOnObjectCount` /
/// `seatsBasedOnObjectSize` formulas.
#[test]
fn list_work_estimator_raw_formulas() {
    // (total, count, limit, selector, fromCache, single, count-based, size-based)
    type Row = (i64, i64, i64, bool, bool, bool, u64, u64);
    let rows: [Row; 28] = [
        (99_999, 99, 0, false, false, false, 2, 1),
        (99_999, 10, 0, false, false, false, 1, 1),
        (99_999, 99, 0, false, true, false, 1, 1),
        (99_999, 10, 0, false, true, false, 1, 1),
        (999_999, 1000, 0, false, false, false, 20, 10),
        (999_999, 1000, 100, false, false, false, 2, 1),
        (999_999, 1000, 100, true, false, false, 11, 5),
        (999_999, 1000, 0, false, true, false, 10, 10),
        (999_999, 1000, 100, false, true, false, 10, 1),
        (999_999, 1000, 100, true, true, false, 10, 1),
        (999_999, 99, 0, false, false, false, 2, 10),
        (999_999, 99, 10, false, false, false, 1, 2),
        (999_999, 99, 10, true, false, false, 2, 5),
        (999_999, 99, 0, false, true, false, 1, 10),
        (9_999_999, 1000, 0, false, false, false, 20, 100),
        (9_999_999, 1000, 100, false, false, false, 2, 10),
        (9_999_999, 1000, 100, true, false, false, 11, 50),
        (9_999_999, 1000, 0, false, true, false, 10, 10),
        (9_999_999, 1000, 100, false, true, false, 10, 10),
        (9_999_999, 1000, 100, true, true, false, 10, 10),
        (9_999_999, 99, 0, false, false, false, 2, 100),
        (9_999_999, 99, 10, false, false, false, 1, 11),
        (9_999_999, 99, 10, true, false, false, 2, 50),
        (9_999_999, 99, 0, false, true, false, 1, 10),
        (9_999_999, 99, 10, false, true, false, 1, 10),
        (9_999_999, 99, 10, true, true, false, 1, 10),
        (999_999_999, 1000, 0, false, false, true, 1, 10),
        (999_999_999, 1000, 0, false, true, true, 1, 10),
    ];
    for (n, (total, count, limit, sel, cache, single, cb, sb)) in rows.into_iter().enumerate() {
        let st = ObjectStats { count, average_object_size_bytes: total / count };
        assert_eq!(seats_based_on_object_count(st, limit, sel, cache, single), cb, "row {} count-based", n + 1);
        assert_eq!(seats_based_on_object_size(st, limit, sel, cache, single), sb, "row {} size-based", n + 1);
    }
}

fn reg(t: &mut WatchTracker, u: &str) -> Option<WatchKey> {
    t.register(&parse_request_info("GET", u.as_bytes()))
}
fn count(t: &WatchTracker, m: &str, u: &str) -> u32 {
    t.interested_count(&parse_request_info(m, u.as_bytes()))
}

#[test]
fn watch_tracker_interested_count() {
    let mut t = WatchTracker::new();
    for u in [
        "/api/v1/pods?watch=true",
        "/api/v1/namespaces/foo/pods?watch=true",
        "/api/v1/namespaces/foo/pods?watch=true&fieldSelector=metadata.name=mypod",
        "/api/v1/namespaces/bar/pods?watch=true&fieldSelector=metadata.name=mypod",
        "/apis/group/v1/namespaces/foo/pods?watch=true",
        "/apis/group/v1/namespaces/bar/pods?watch=true&fieldSelector=metadata.name=mypod",
    ] {
        assert!(reg(&mut t, u).is_some(), "{u}");
    }
    let cases = [
        ("POST", "/api/v1/namespaces/foo/pods", 2),
        ("PUT", "/api/v1/namespaces/foo/pods/mypod", 3),
        ("PATCH", "/api/v1/namespaces/foo/pods/mypod", 3),
        ("DELETE", "/api/v1/namespaces/foo/pods/mypod", 3),
        ("PUT", "/api/v1/namespaces/foo/pods/otherpod", 2),
        ("GET", "/api/v1/namespaces/foo/pods/mypod", 0),
        ("GET", "/api/v1/namespaces/foo/pods", 0),
        ("GET", "/api/v1/namespaces/foo/pods?watch=true", 0),
        ("GET", "/api/v1/proxy/namespaces/foo/pods/mypod", 0),
        ("POST", "/api/v1/namespaces/bar/pods", 1),
        ("PUT", "/api/v1/namespaces/bar/pods/mypod", 2),
        ("PUT", "/apis/group/v1/namespaces/foo/pods/mypod", 1),
        ("PUT", "/apis/group/v1/namespaces/foo/pods/otherpod", 1),
        ("PUT", "/apis/group/v1/namespaces/bar/pods/mypod", 1),
        ("PUT", "/apis/group/v1/namespaces/bar/pods/otherpod", 0),
    ];
    for (m, u, want) in cases {
        assert_eq!(count(&t, m, u), want, "{m} {u}");
    }
}

#[test]
fn watch_tracker_with_index() {
    let mut t = WatchTracker::new();
    for u in [
        "/api/v1/pods?watch=true",
        "/api/v1/namespaces/foo/pods?watch=true",
        "/api/v1/namespaces/foo/pods?watch=true&fieldSelector=metadata.name=mypod",
        "/api/v1/namespaces/foo/pods?watch=true&fieldSelector=spec.nodeName=",
    ] {
        assert!(reg(&mut t, u).is_some(), "{u}");
    }
    assert!(reg(&mut t, "/api/v1/namespaces/foo/pods?watch=true&fieldSelector=spec.nodeName=node1").is_none());
    assert!(reg(&mut t, "/api/v1/namespaces/foo/pods?watch=true&fieldSelector=spec.nodeName=node2").is_none());
    assert_eq!(count(&t, "POST", "/api/v1/namespaces/foo/pods"), 3);
    for m in ["PUT", "PATCH", "DELETE"] {
        assert_eq!(count(&t, m, "/api/v1/namespaces/foo/pods/mypod"), 4);
    }
}

#[test]
fn register_watch_keys_and_forget() {
    let mut t = WatchTracker::new();
    let k = reg(&mut t, "/api/v1/namespaces/foo/pods?watch=true&fieldSelector=metadata.name=mypod").unwrap();
    assert_eq!(k, WatchKey { api_group: "".into(), resource: "pods".into(), namespace: "foo".into(), name: "mypod".into() });
    let k2 = reg(&mut t, "/api/v1/namespaces?watch=true&fieldSelector=metadata.name=myns").unwrap();
    assert_eq!(k2, WatchKey { api_group: "".into(), resource: "namespaces".into(), namespace: "".into(), name: "myns".into() });
    assert!(reg(&mut t, "/api/v1/pods").is_none());
    assert!(reg(&mut t, "/api/v1/watch/pods").is_some());
    assert_eq!(t.total(), 3);
    // codec round trip, deterministic
    let mut w = Writer::new();
    t.encode(&mut w);
    let bytes = w.into_bytes();
    let back = WatchTracker::decode(&mut Reader::new(&bytes)).unwrap();
    assert_eq!(back, t);
    let mut w2 = Writer::new();
    back.encode(&mut w2);
    assert_eq!(w2.into_bytes(), bytes);
    for cut in 0..bytes.len() {
        assert!(WatchTracker::decode(&mut Reader::new(&bytes[..cut])).is_err() || cut == 0 && bytes.is_empty());
    }
    assert!(WatchTracker::decode(&mut Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x0f])).is_err());
    t.forget(&k);
    t.forget(&k);
    t.forget(&k2);
    assert_eq!(t.total(), 1);
    assert_eq!(count(&t, "PUT", "/api/v1/namespaces/foo/pods/mypod"), 1);
}
