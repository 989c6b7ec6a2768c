#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Watches natively (the e2e suite's work-estimate and watch tests): a WATCH with initial events
//! keeps its seats past its response headers while its initial state streams — up to the
//! initial-events-end bookmark (`sendInitialEvents=true`), until the body goes quiet or reaches
//! the state's estimated size (legacy watches), at most `watchInitialEventsMaxHold` — and then
//! counts as an open watch for the mutating-request estimator until its stream ends.
//!
//! Most tests use a level with one seat: whatever holds it makes the next request wait, so "the
//! next request is resumed" is "the watch let its seat go". Object counts come from the
//! configuration's `objectCounts` table.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::gateway::host::Action;
use apf_wasm::gateway::worker::UNMARKED_QUIET;
use mock_host::{flow_schema, gateway, header_value, headers, level_row, priority_level, Node, Proxy};
use serde_json::{json, Value};
use std::time::Duration;

const GROUP: &str = "watchers";
const PODS: &str = "/api/v1/namespaces/default/pods";
/// What client-go's reflector sends for a WatchList.
const WATCHLIST: &str =
    "/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
const ADDED: &[u8] = b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\",\"resourceVersion\":\"7\"}}}\n";
const BOOKMARK: &[u8] = b"{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"resourceVersion\":\"9\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n";
const JSON: [(&str, &str); 1] = [("content-type", "application/json")];

/// One level "lvl" with `seats` seats (NominalCL = ⌈2·seats·5/(5+5)⌉ next to catch-all's 5
/// shares) and hand size `hand`, for `GROUP`; `estimator` is the `workEstimator` (pods: 10
/// objects of 100 bytes unless it says otherwise).
fn config(seats: u32, hand: u32, estimator: Value) -> String {
    let mut we = json!({"objectCounts": {"pods": {"count": 10, "averageObjectSizeBytes": 100}}});
    we.as_object_mut().unwrap().extend(estimator.as_object().unwrap().clone());
    json!({
        "serverConcurrencyLimit": 2 * seats,
        "suggestedDefaults": false,
        "identity": {"sources": [{"type": "frontProxy"}]},
        "explainGroups": ["explain"],
        "workEstimator": we,
        "policy": [priority_level("lvl", 5, 16, hand, 50), flow_schema("fs", "lvl", 1000, &[GROUP])]
    })
    .to_string()
}

fn one_seat(estimator: Value) -> (std::rc::Rc<Proxy>, Vec<Node>) {
    gateway(1, &config(1, 1, estimator))
}

/// A watch of `path` by `user` with its response headers (200, JSON, `extra`) delivered.
fn watch(node: &mut Node, path: &str, user: &str, extra: &[(&str, &str)]) -> u32 {
    let (ctx, action) = node.request(&headers("GET", path, user, &[GROUP]), &[]);
    assert_eq!(action, Action::Continue);
    let mut h = JSON.to_vec();
    h.extend_from_slice(extra);
    node.response_headers(ctx, 200, &h, false);
    ctx
}

/// A GET that finds the level's seat taken: queued.
fn waiting_get(node: &mut Node) -> u32 {
    let (ctx, action) = node.request(&headers("GET", PODS, "bob", &[GROUP]), &[]);
    assert_eq!(action, Action::Pause, "the watch holds the seat");
    ctx
}

fn levels(node: &mut Node) -> (u32, u32) {
    level_row(&node.dump("dump_priority_levels", &[("x-remote-user", "admin"), ("x-remote-group", "system:masters")], &[]), "lvl")
}

fn pass(proxy: &Proxy, node: &mut Node, ms: u64) {
    proxy.advance(Duration::from_millis(ms));
    node.tick();
}

#[test]
fn an_initial_events_watch_keeps_its_seat_until_the_bookmark() {
    let (proxy, mut w) = one_seat(json!({}));
    let wctx = watch(&mut w[0], WATCHLIST, "alice", &[]);
    let get = waiting_get(&mut w[0]);
    w[0].response_body(wctx, ADDED, false);
    // A marked watch is not released by quiet, only by its bookmark.
    pass(&proxy, &mut w[0], 5_000);
    assert!(!w[0].stream(get).resumed);
    assert_eq!(levels(&mut w[0]), (1, 1));
    w[0].response_body(wctx, BOOKMARK, false);
    assert!(w[0].stream(get).resumed, "released at the bookmark");
    assert_eq!(levels(&mut w[0]), (0, 1));
    // Later events pass through without holding anything.
    w[0].response_body(wctx, ADDED, false);
    w[0].respond(get, 200, &[], &[]);
    assert_eq!(levels(&mut w[0]), (0, 0));
}

#[test]
fn the_bookmark_is_found_across_chunk_boundaries() {
    let (_, mut w) = one_seat(json!({}));
    let wctx = watch(&mut w[0], WATCHLIST, "alice", &[]);
    let get = waiting_get(&mut w[0]);
    let cut = BOOKMARK.windows(6).position(|x| x == b"events").unwrap();
    let (a, b) = BOOKMARK.split_at(cut);
    w[0].response_body(wctx, &[ADDED, a].concat(), false);
    assert!(!w[0].stream(get).resumed);
    w[0].response_body(wctx, b, false);
    assert!(w[0].stream(get).resumed);
}

#[test]
fn a_legacy_watch_is_released_after_its_body_went_quiet() {
    for path in [format!("{PODS}?watch=true"), format!("{PODS}?watch=true&resourceVersion=0")] {
        let (proxy, mut w) = one_seat(json!({"objectCounts": {}}));
        let quiet = u64::try_from(UNMARKED_QUIET / 1_000_000).unwrap();
        let wctx = watch(&mut w[0], &path, "alice", &[]);
        let get = waiting_get(&mut w[0]);
        pass(&proxy, &mut w[0], quiet - 50);
        w[0].response_body(wctx, ADDED, false);
        pass(&proxy, &mut w[0], quiet - 50);
        assert!(!w[0].stream(get).resumed, "{path}: each chunk restarts the quiet time");
        pass(&proxy, &mut w[0], 60);
        assert!(w[0].stream(get).resumed, "{path}: quiet for {quiet} ms");
    }
}

#[test]
fn a_legacy_watch_is_released_when_its_bytes_reach_count_times_size() {
    // 10 pods of 100 bytes: the initial state is 1000 bytes.
    let (_, mut w) = one_seat(json!({}));
    let wctx = watch(&mut w[0], &format!("{PODS}?watch=true"), "alice", &[]);
    let get = waiting_get(&mut w[0]);
    w[0].response_body(wctx, &[b'x'; 999], false);
    assert!(!w[0].stream(get).resumed);
    w[0].response_body(wctx, b"x", false);
    assert!(w[0].stream(get).resumed, "1000 bytes streamed");
}

#[test]
fn a_compressed_watch_hides_its_bookmark_and_is_held_by_the_legacy_rule() {
    let (proxy, mut w) = one_seat(json!({"objectCounts": {}}));
    let wctx = watch(&mut w[0], WATCHLIST, "alice", &[("content-encoding", "gzip")]);
    let get = waiting_get(&mut w[0]);
    w[0].response_body(wctx, BOOKMARK, false);
    assert!(!w[0].stream(get).resumed, "the bookmark's bytes are not looked for");
    pass(&proxy, &mut w[0], u64::try_from(UNMARKED_QUIET / 1_000_000).unwrap() + 10);
    assert!(w[0].stream(get).resumed);
}

#[test]
fn max_hold_releases_a_watch_that_never_sends_its_bookmark() {
    let (proxy, mut w) = one_seat(json!({"watchInitialEventsMaxHold": "2s"}));
    let timeouts = "apf_wasm_watch_initial_hold_timeouts_total";
    let wctx = watch(&mut w[0], WATCHLIST, "alice", &[]);
    let get = waiting_get(&mut w[0]);
    for _ in 0..3 {
        pass(&proxy, &mut w[0], 600);
        w[0].response_body(wctx, ADDED, false);
    }
    pass(&proxy, &mut w[0], 150);
    assert!(!w[0].stream(get).resumed, "1.95 s < 2 s");
    pass(&proxy, &mut w[0], 100);
    assert!(w[0].stream(get).resumed, "released at watchInitialEventsMaxHold");
    let s = w[0].stream(wctx);
    assert!(s.reply.is_none() && !s.gone, "the watch itself goes on");
    pass(&proxy, &mut w[0], 1_000);
    assert_eq!(proxy.stat(timeouts), 1);
}

#[test]
fn a_watch_whose_response_ends_releases_at_once() {
    let (_, mut w) = one_seat(json!({}));
    // The body's last chunk.
    let wctx = watch(&mut w[0], WATCHLIST, "alice", &[]);
    let get = waiting_get(&mut w[0]);
    w[0].response_body(wctx, ADDED, false);
    w[0].response_body(wctx, b"", true);
    assert!(w[0].stream(get).resumed);
    w[0].respond(get, 200, &[], &[]);
    // A response without a body, and one that is not a 200.
    for (status, end) in [(200, true), (410, false)] {
        let (wctx, _) = w[0].request(&headers("GET", WATCHLIST, "alice", &[GROUP]), &[]);
        let get = waiting_get(&mut w[0]);
        w[0].response_headers(wctx, status, &JSON, end);
        assert!(w[0].stream(get).resumed, "status {status}, end {end}");
        w[0].respond(get, 200, &[], &[]);
    }
    assert_eq!(levels(&mut w[0]), (0, 0));
}

#[test]
fn a_watch_without_initial_events_releases_at_its_response_headers() {
    let (_, mut w) = one_seat(json!({}));
    let (wctx, _) = w[0].request(&headers("GET", &format!("{PODS}?watch=true&resourceVersion=12345"), "alice", &[GROUP]), &[]);
    let get = waiting_get(&mut w[0]);
    w[0].response_headers(wctx, 200, &JSON, false);
    assert!(w[0].stream(get).resumed);
}

/// The seats a POST of a pod is charged (`x-apf-seats`).
fn create_seats(node: &mut Node) -> String {
    let (ctx, action) = node.request(&headers("POST", PODS, "carol", &[GROUP, "explain"]), &[]);
    assert_eq!(action, Action::Continue);
    header_value(&node.respond(ctx, 201, &[], &[]), "x-apf-seats").unwrap()
}

#[test]
fn open_watches_raise_a_mutating_requests_cost_until_they_end() {
    // 100 seats, hand 4: the level's max seats are 15, a mutating request's at most 10. Every
    // 10 watches a create will notify cost one more seat (upstream's mutating estimator).
    let (_, mut w) = gateway(2, &config(100, 4, json!({})));
    let rv = format!("{PODS}?watch=true&resourceVersion=5");
    let open: Vec<u32> = (0..10).map(|i| watch(&mut w[0], &rv, &format!("u{i}"), &[])).collect();
    assert_eq!(create_seats(&mut w[1]), "1", "10 watches: one seat");
    // A watch still in its initial phase does not count yet.
    let init = watch(&mut w[0], WATCHLIST, "u-init", &[]);
    assert_eq!(create_seats(&mut w[1]), "1");
    w[0].response_body(init, BOOKMARK, false);
    assert_eq!(create_seats(&mut w[1]), "2", "11 open watches, seen from the other worker");
    // Ended streams are forgotten: closed by the client, or a response that ended.
    w[0].close(open[0]);
    assert_eq!(create_seats(&mut w[1]), "1");
    let more = watch(&mut w[0], &rv, "u10", &[]);
    assert_eq!(create_seats(&mut w[1]), "2");
    w[0].response_body(more, b"", true);
    assert_eq!(create_seats(&mut w[1]), "1");
}

#[test]
fn a_watch_with_initial_events_costs_like_a_list_from_the_cache() {
    // 799 pods of 1000 bytes: ⌈799 000 / 100 000⌉ = 8 seats; without initial events, 1.
    let (_, mut w) = gateway(1, &config(100, 4, json!({"objectCounts": {"pods": {"count": 799, "averageObjectSizeBytes": 1000}}})));
    for (path, seats) in
        [(WATCHLIST.to_string(), "8"), (format!("{PODS}?watch=true"), "8"), (format!("{PODS}?watch=true&resourceVersion=5"), "1")]
    {
        let (ctx, _) = w[0].request(&headers("GET", &path, "alice", &[GROUP, "explain"]), &[]);
        w[0].response_headers(ctx, 200, &JSON, false);
        assert_eq!(w[0].stream(ctx).response_header("x-apf-seats").as_deref(), Some(seats), "{path}");
    }
}
