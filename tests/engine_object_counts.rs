#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! The shared object counts: one worker polls the cluster for all (claim, record), upstream's
//! tracker rules (not found, stale after the threshold, pruned after an hour, error values keep
//! the last count), and the estimator taking them with the `objectCounts` table as override.

use apf_wasm::config::parse_plugin_config;
use apf_wasm::digest::identity::IdentityInput;
use apf_wasm::digest::metrics_scan::ScrapedCounts;
use apf_wasm::digest::work_estimate::{ObjectStats, StatsLookup, WatchInit};
use apf_wasm::engine::compiled::RequestLine;
use apf_wasm::engine::object_counts::{
    claim, read, record, ObjectCountTracker, SharedCounts, CLAIM_GRACE, PRUNE_AFTER, RETRY_AFTER_FAILURE,
};
use apf_wasm::engine::store::MemStore;
use apf_wasm::engine::Compiled;
use apf_wasm::NANOS_PER_SEC as S;

fn scraped(entries: &[(&str, i64, i64)]) -> ScrapedCounts {
    let mut s = ScrapedCounts::default();
    for (k, n, avg) in entries {
        s.entries.insert(k.to_string(), ObjectStats { count: *n, average_object_size_bytes: *avg });
        s.samples += 1;
    }
    s
}

#[test]
fn one_worker_claims_each_poll() {
    let store = MemStore::new();
    let period = 60 * S;
    let timeout = 10 * S;
    assert!(claim(&store, 1_000, 1, timeout).unwrap(), "first claim on an empty store");
    assert!(!claim(&store, 1_001, 2, timeout).unwrap(), "a second worker finds the poll taken");
    // The poller dies: after the claim's lease another worker polls.
    assert!(!claim(&store, 1_000 + timeout + CLAIM_GRACE - 1, 2, timeout).unwrap());
    assert!(claim(&store, 1_000 + timeout + CLAIM_GRACE, 2, timeout).unwrap());
    let t = 20 * S;
    let s = record(&store, t, period, Ok(&scraped(&[("pods", 50_000, 4_000)]))).unwrap();
    assert_eq!((s.next_poll, s.last_success, s.poller), (t + period, t, 0));
    assert!(!claim(&store, t + period - 1, 1, timeout).unwrap());
    assert!(claim(&store, t + period, 1, timeout).unwrap());
    // A failure retries sooner and keeps the counts.
    let f = record(&store, t + period + S, period, Err("HTTP status 403")).unwrap();
    assert_eq!(f.next_poll, t + period + S + RETRY_AFTER_FAILURE);
    assert_eq!((f.consecutive_failures, f.last_error.as_str()), (1, "HTTP status 403"));
    assert_eq!(
        f.tracker.get("", "pods", t + period + S, 180 * S),
        StatsLookup::Found(ObjectStats { count: 50_000, average_object_size_bytes: 4_000 })
    );
    let (stored, cas) = read(&store).unwrap();
    assert_eq!(stored.unwrap(), f);
    assert!(cas.is_some());
}

#[test]
fn threads_racing_to_poll_claim_once() {
    // (Once the value exists: its very first creation is not atomic on the host, see
    // `store::update`, which at worst polls twice once.)
    let store = std::sync::Arc::new(MemStore::new());
    record(&*store, 0, 60 * S, Err("not yet")).unwrap();
    let wins: usize = std::thread::scope(|sc| {
        let hs: Vec<_> = (1..=8u64)
            .map(|i| {
                let store = store.clone();
                sc.spawn(move || usize::from(claim(&*store, RETRY_AFTER_FAILURE, i, 10 * S).unwrap()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(wins, 1);
}

#[test]
fn tracker_follows_upstream_rules() {
    let stale_after = 180 * S;
    let mut t = ObjectCountTracker::default();
    assert_eq!(t.get("", "pods", 0, stale_after), StatsLookup::NotFound);
    t.set("pods", ObjectStats { count: 10, average_object_size_bytes: 100 }, 0);
    t.set("apps/deployments", ObjectStats { count: 3, average_object_size_bytes: 0 }, 0);
    // An error value (-1) is ignored: the last count stays (and ages).
    t.set("pods", ObjectStats { count: -1, average_object_size_bytes: -1 }, 10 * S);
    assert_eq!(t.get("", "pods", stale_after, stale_after), StatsLookup::Found(ObjectStats { count: 10, average_object_size_bytes: 100 }));
    assert_eq!(t.get("", "pods", stale_after + 1, stale_after), StatsLookup::Stale);
    assert_eq!(t.get("apps", "deployments", 0, stale_after), StatsLookup::Found(ObjectStats { count: 3, average_object_size_bytes: 0 }));
    assert_eq!(t.get("", "deployments", 0, stale_after), StatsLookup::NotFound);
    assert_eq!(t.stale(stale_after + 1, stale_after), 2);
    t.set("pods", ObjectStats { count: 11, average_object_size_bytes: 100 }, PRUNE_AFTER);
    t.prune(PRUNE_AFTER + 1);
    assert_eq!(t.entries().count(), 1, "deployments not refreshed within an hour are pruned");
    assert_eq!(t.get("apps", "deployments", PRUNE_AFTER + 1, stale_after), StatsLookup::NotFound);
}

#[test]
fn shared_value_round_trips_and_rejects_garbage() {
    let store = MemStore::new();
    record(&store, S, 60 * S, Ok(&scraped(&[("pods", 5, 50), ("apps/deployments", 7, 0)]))).unwrap();
    let (s, _) = read(&store).unwrap();
    let s = s.unwrap();
    assert_eq!(SharedCounts::decode(&s.encode()).unwrap(), s);
    assert!(SharedCounts::decode(&[9, 1, 2]).is_err());
    let enc = s.encode();
    for cut in 0..enc.len() {
        assert!(SharedCounts::decode(&enc[..cut]).is_err(), "truncated at {cut}");
    }
}

fn digest_seats(c: &Compiled, path: &str, counts: &ObjectCountTracker, now: i64) -> (u32, Option<StatsLookup>, WatchInit) {
    let input = IdentityInput { headers: &[], peer: None, mtls: false, cert_subject: None, jwt_claims: None };
    let cluster = |g: &str, r: &str| counts.get(g, r, now, 180 * S);
    let line = RequestLine { method: b"GET", path: path.as_bytes(), namespace_header: None };
    let d = c.digest(line, &input, |_| 0, &cluster);
    (d.work.max_seats(), d.stats, d.watch_init)
}

#[test]
fn digest_costs_lists_and_watches_from_the_cluster_counts() {
    // catch-all is a Reject level: no per-level max seats, so the LIST estimator's 100 applies.
    let cfg = parse_plugin_config(
        br#"{"suggestedDefaults": false, "workEstimator": {"objectCounts": {"secrets": {"count": 10, "averageObjectSizeBytes": 1000}}}}"#,
    )
    .unwrap();
    let c = Compiled::new(cfg, 1);
    let mut t = ObjectCountTracker::default();
    t.set("pods", ObjectStats { count: 50_000, average_object_size_bytes: 4_000 }, 0);
    t.set("secrets", ObjectStats { count: 1_000_000, average_object_size_bytes: 4_000 }, 0);
    t.set("configmaps", ObjectStats { count: 500, average_object_size_bytes: 2_000 }, 0);
    // Consistent LIST from storage: 50,000 × 4 KB = 200 MB → 2000 seats, clamped to 100.
    assert_eq!(digest_seats(&c, "/api/v1/pods", &t, 0).0, 100);
    // 500 × 2 KB = 1 MB → 10 seats; from the watch cache (rv=0) the same; limit=100 → 2.
    assert_eq!(digest_seats(&c, "/api/v1/configmaps", &t, 0).0, 10);
    assert_eq!(digest_seats(&c, "/api/v1/configmaps?limit=100&resourceVersion=5", &t, 0).0, 2);
    // The table overrides the cluster: 10 × 1000 B → 1 seat.
    assert_eq!(digest_seats(&c, "/api/v1/secrets", &t, 0).0, 1);
    // Not reported: 1 seat. Stale: upstream's 10⁹ × 1.5 MB → the maximum.
    assert_eq!(digest_seats(&c, "/apis/example.com/v1/widgets", &t, 0).0, 1);
    let (seats, stats, _) = digest_seats(&c, "/api/v1/configmaps", &t, 181 * S);
    assert_eq!((seats, stats), (100, Some(StatsLookup::Stale)));
    // Watches with initial events cost like a LIST from cache (capped at 1 MB → 10 seats).
    let (seats, _, init) = digest_seats(
        &c,
        "/api/v1/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan",
        &t,
        0,
    );
    assert_eq!((seats, init), (10, WatchInit::Bookmark));
    let (seats, _, init) = digest_seats(&c, "/api/v1/pods?watch=true&resourceVersion=0", &t, 0);
    assert_eq!((seats, init), (10, WatchInit::Unmarked));
    let (seats, _, init) = digest_seats(&c, "/api/v1/pods?watch=true&resourceVersion=123", &t, 0);
    assert_eq!((seats, init), (1, WatchInit::None));
    let (_, _, init) = digest_seats(&c, "/api/v1/pods?watch=true&sendInitialEvents=false", &t, 0);
    assert_eq!(init, WatchInit::None);
    // Not a LIST or WATCH: the counts are not consulted.
    let (seats, stats, init) = digest_seats(&c, "/api/v1/namespaces/a/pods/p", &t, 0);
    assert_eq!((seats, stats, init), (1, None, WatchInit::None));
}

#[test]
fn cluster_metrics_configuration() {
    let cfg = parse_plugin_config(br#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "period": "5s", "staleAfter": "1m"}, "watchInitialEventsMaxHold": "3s"}}"#).unwrap();
    let m = cfg.cluster_metrics.unwrap();
    assert_eq!((m.cluster.as_str(), m.path.as_str(), m.period, m.stale_after, m.timeout), ("kube", "/metrics", 5 * S, 60 * S, 10 * S));
    assert_eq!(cfg.watch_initial_events_max_hold, 3 * S);
    // clusterPolicy implies polling its cluster with its token; `false` turns it off.
    let cfg = parse_plugin_config(br#"{"clusterPolicy": {"cluster": "api", "token": "t"}}"#).unwrap();
    let m = cfg.cluster_metrics.unwrap();
    assert_eq!((m.cluster.as_str(), m.token.as_deref(), m.period), ("api", Some("t"), 60 * S));
    let cfg = parse_plugin_config(br#"{"clusterPolicy": {"cluster": "api"}, "workEstimator": {"clusterMetrics": false}}"#).unwrap();
    assert!(cfg.cluster_metrics.is_none());
    assert!(parse_plugin_config(b"{}").unwrap().cluster_metrics.is_none());
    // Errors name the field.
    let errs = parse_plugin_config(br#"{"workEstimator": {"clusterMetrics": {"period": "soon"}}}"#).unwrap_err();
    assert!(errs.iter().any(|e| e.contains("workEstimator.clusterMetrics.cluster")), "{errs:?}");
    let errs = parse_plugin_config(
        br#"{"workEstimator": {"clusterMetrics": {"cluster": "k", "period": "soon", "staleAfter": "-1s", "bogus": 1}}}"#,
    )
    .unwrap_err();
    assert!(errs.iter().any(|e| e.contains("workEstimator.clusterMetrics") && e.contains("bogus")), "{errs:?}");
    let errs = parse_plugin_config(br#"{"workEstimator": {"clusterMetrics": {"cluster": "k", "period": "soon", "staleAfter": "-1s"}}}"#)
        .unwrap_err();
    assert!(errs.iter().any(|e| e.starts_with("workEstimator.clusterMetrics.period")), "{errs:?}");
    assert!(errs.iter().any(|e| e.starts_with("workEstimator.clusterMetrics.staleAfter")), "{errs:?}");
    let errs = parse_plugin_config(br#"{"workEstimator": {"watchInitialEventsMaxHold": "0s"}}"#).unwrap_err();
    assert!(errs.iter().any(|e| e.starts_with("workEstimator.watchInitialEventsMaxHold")), "{errs:?}");
}

#[test]
fn tokens_from_the_environment() {
    use apf_wasm::config::parse_plugin_config_with_env;
    let env = |name: &str| match name {
        "APF_WASM_TOKEN" => Some("s3cret\n".to_string()),
        "OTHER_TOKEN" => Some("other".to_string()),
        "EMPTY" => Some(" \n".to_string()),
        "BAD" => Some("a\r\nx-remote-user: admin".to_string()),
        _ => None,
    };
    let parse = |doc: &str| parse_plugin_config_with_env(doc.as_bytes(), &env);
    // Read when the configuration is parsed; a trailing newline (a Secret file) is trimmed.
    let cfg = parse(r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "tokenEnv": "APF_WASM_TOKEN"}}}"#).unwrap();
    assert_eq!(cfg.cluster_metrics.unwrap().token.as_deref(), Some("s3cret"));
    let cfg = parse(r#"{"clusterPolicy": {"cluster": "api", "tokenEnv": "APF_WASM_TOKEN"}}"#).unwrap();
    assert_eq!(cfg.cluster_policy.unwrap().token.as_deref(), Some("s3cret"));
    // clusterMetrics inherits clusterPolicy's token unless it names its own.
    assert_eq!(cfg.cluster_metrics.unwrap().token.as_deref(), Some("s3cret"));
    let cfg = parse(
        r#"{"clusterPolicy": {"cluster": "api", "tokenEnv": "APF_WASM_TOKEN"},
                        "workEstimator": {"clusterMetrics": {"tokenEnv": "OTHER_TOKEN"}}}"#,
    )
    .unwrap();
    assert_eq!(cfg.cluster_metrics.unwrap().token.as_deref(), Some("other"));
    // Neither: no token (no Authorization header).
    assert_eq!(parse(r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube"}}}"#).unwrap().cluster_metrics.unwrap().token, None);
    // Errors name the field: unset, empty, both set, a control character.
    for (doc, field) in [
        (r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "tokenEnv": "UNSET"}}}"#, "workEstimator.clusterMetrics.tokenEnv"),
        (r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "tokenEnv": "EMPTY"}}}"#, "workEstimator.clusterMetrics.tokenEnv"),
        (r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "tokenEnv": ""}}}"#, "workEstimator.clusterMetrics.tokenEnv"),
        (r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "tokenEnv": "BAD"}}}"#, "workEstimator.clusterMetrics.tokenEnv"),
        (
            r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "token": "t", "tokenEnv": "APF_WASM_TOKEN"}}}"#,
            "workEstimator.clusterMetrics.tokenEnv",
        ),
        (r#"{"clusterPolicy": {"cluster": "api", "tokenEnv": "UNSET"}}"#, "clusterPolicy.tokenEnv"),
        (r#"{"clusterPolicy": {"cluster": "api", "token": "t", "tokenEnv": "APF_WASM_TOKEN"}}"#, "clusterPolicy.tokenEnv"),
        (r#"{"clusterPolicy": {"cluster": "api", "token": "a\nb"}}"#, "clusterPolicy.token"),
    ] {
        let errs = parse(doc).unwrap_err();
        assert!(errs.iter().any(|e| e.starts_with(&format!("{field}:"))), "{doc}: {errs:?}");
        assert!(!errs.iter().any(|e| e.contains("s3cret") || e.contains("x-remote-user")), "a token never appears in an error: {errs:?}");
    }
    let errs = parse(r#"{"workEstimator": {"clusterMetrics": {"cluster": "kube", "tokenEnv": "UNSET"}}}"#).unwrap_err();
    assert!(errs.iter().any(|e| e.contains("\"UNSET\"") && e.contains("unset or empty")), "{errs:?}");
}

#[test]
fn learned_counts_come_after_the_clusters_and_are_forgotten_not_stale() {
    use apf_wasm::engine::object_counts::learn;
    let store = MemStore::new();
    let stale_after = 180 * S;
    record(&store, 0, 60 * S, Ok(&scraped(&[("pods", 10, 100)]))).unwrap();
    learn(&store, S, "example.com/widgets", ObjectStats { count: 40, average_object_size_bytes: 5_000 }).unwrap();
    learn(&store, S, "pods", ObjectStats { count: 1, average_object_size_bytes: 1 }).unwrap();
    let s = read(&store).unwrap().0.unwrap();
    assert_eq!(
        s.lookup("example.com", "widgets", 2 * S, stale_after),
        StatsLookup::Found(ObjectStats { count: 40, average_object_size_bytes: 5_000 })
    );
    assert_eq!(
        s.lookup("", "pods", 2 * S, stale_after),
        StatsLookup::Found(ObjectStats { count: 10, average_object_size_bytes: 100 }),
        "the cluster's count wins"
    );
    assert_eq!(s.lookup("", "pods", 200 * S, stale_after), StatsLookup::Stale, "a stale cluster count stays stale");
    assert_eq!(
        s.lookup("example.com", "widgets", S + PRUNE_AFTER + 1, stale_after),
        StatsLookup::NotFound,
        "an old learned count is forgotten, never stale"
    );
    assert_eq!(SharedCounts::decode(&s.encode()).unwrap(), s);
}
