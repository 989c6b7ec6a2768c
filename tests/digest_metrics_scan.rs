#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The streaming scanners of response bodies: kube-apiserver's `/metrics` (object counts and
//! sizes for the work estimator) and a WatchList stream's initial-events-end bookmark.

use apf_wasm::digest::initial_events::{MarkerScanner, INITIAL_EVENTS_END};
use apf_wasm::digest::metrics_scan::{scan_metrics, MetricsScanner, ScrapedCounts, MAX_LINE};
use apf_wasm::digest::work_estimate::ObjectStats;
use std::cell::Cell;
use std::collections::BTreeMap;

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
use counting_alloc::{LIVE, PEAK};

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// Runs `f` and returns its result with the peak of live heap it added on this thread.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    (r, PEAK.with(Cell::get).saturating_sub(base))
}

// ---------------------------------------------------------------------------------------------
// helpers

const FIXTURE: &str = include_str!("fixtures/metrics/kube-apiserver-1.34.txt");

fn stats(count: i64, average_object_size_bytes: i64) -> ObjectStats {
    ObjectStats { count, average_object_size_bytes }
}

fn entries(list: &[(&str, i64, i64)]) -> BTreeMap<String, ObjectStats> {
    list.iter().map(|&(k, c, a)| (k.to_string(), stats(c, a))).collect()
}

fn scan_chunks<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> ScrapedCounts {
    let mut s = MetricsScanner::new();
    for c in chunks {
        s.feed(c);
    }
    s.finish()
}

fn scan_random_chunks(body: &[u8], seed: u64, lo: usize, hi: usize) -> ScrapedCounts {
    let mut rng = Rng(seed);
    let mut s = MetricsScanner::default();
    let mut rest = body;
    while !rest.is_empty() {
        let n = rng.range(lo, hi).min(rest.len());
        let (a, b) = rest.split_at(n);
        s.feed(a);
        rest = b;
    }
    s.finish()
}

/// The scan of `body` whole, in 1-byte chunks and in random small chunks, all equal.
fn scan_every_way(body: &[u8]) -> ScrapedCounts {
    let whole = scan_metrics(body);
    assert_eq!(scan_chunks(body.chunks(1)), whole, "1-byte chunks");
    for seed in 1..=8 {
        assert_eq!(scan_random_chunks(body, seed, 1, 64), whole, "random chunks, seed {seed}");
    }
    whole
}

/// What the fixture says: 1.34 counts and sizes (the average is size / count).
fn fixture_expected() -> BTreeMap<String, ObjectStats> {
    entries(&[
        ("configmaps", 412, 3000),
        ("endpoints", 30, 0), // size -1: count known, average unknown
        ("events", 1_234_567, 900),
        ("namespaces", 25, 600),
        ("nodes", 3, 12000),
        ("pods", 50000, 4096),
        ("secrets", 380, 2500),
        // services: -1 everywhere (a failed poll): no entry
        ("apiextensions.k8s.io/customresourcedefinitions", 42, 150_000),
        ("apps/deployments", 12, 7000),
        ("apps/replicasets", 40, 5500),
        ("batch/cronjobs", 0, 0),
        ("coordination.k8s.io/leases", 6, 450),
        ("events.k8s.io/events", 1_234_567, 900),
        ("flowcontrol.apiserver.k8s.io/flowschemas", 13, 1100),
        ("flowcontrol.apiserver.k8s.io/prioritylevelconfigurations", 8, 700),
    ])
}

// ---------------------------------------------------------------------------------------------
// /metrics scanner

#[test]
fn kube_apiserver_1_34_fixture() {
    let got = scan_every_way(FIXTURE.as_bytes());
    assert_eq!(got.entries, fixture_expected());
    // 16 resources × 3 metrics, every one well-formed.
    assert_eq!((got.samples, got.malformed), (48, 0));
    assert_eq!(got.entries.get("pods"), Some(&stats(50000, 4096)), "2.048e+08 / 50000");
}

#[test]
fn before_1_34_only_storage_objects_average_unknown() {
    let body: String = FIXTURE.lines().filter(|l| !l.contains("apiserver_resource_")).map(|l| format!("{l}\n")).collect();
    let got = scan_every_way(body.as_bytes());
    let want: BTreeMap<String, ObjectStats> = fixture_expected().into_iter().map(|(k, v)| (k, stats(v.count, 0))).collect();
    assert_eq!(got.entries, want);
    assert_eq!((got.samples, got.malformed), (16, 0));
}

#[test]
fn crlf_line_ends_give_the_same_result() {
    let crlf = FIXTURE.replace('\n', "\r\n");
    assert_eq!(scan_every_way(crlf.as_bytes()), scan_metrics(FIXTURE.as_bytes()));
}

#[test]
fn last_line_without_newline_counts() {
    let got = scan_every_way(b"apiserver_storage_objects{resource=\"pods\"} 7");
    assert_eq!(got.entries, entries(&[("pods", 7, 0)]));
    let got = scan_every_way(b"apiserver_storage_objects{resource=\"pods\"} 7\r");
    assert_eq!(got.entries, entries(&[("pods", 7, 0)]));
    let got = scan_every_way(b"apiserver_storage_objects{resource=\"pods\"} 7 170000000");
    assert_eq!(got.entries, entries(&[("pods", 7, 0)]));
}

#[test]
fn labels_in_any_order_with_others_and_blanks() {
    let body = br#"apiserver_resource_objects{resource="pods",group=""} 7
apiserver_resource_size_estimate_bytes{instance="10.0.0.1:6443",resource="pods",job="apiserver",group=""} 700
apiserver_resource_objects{ resource = "deployments" , group = "apps" , } 4
apiserver_resource_size_estimate_bytes	{group="apps",resource="deployments"}	4e+03	1700000000000
apiserver_resource_objects{resource="leases"} 2
"#;
    let got = scan_every_way(body);
    // A missing `group` label is the empty group, as in Prometheus.
    assert_eq!(got.entries, entries(&[("pods", 7, 100), ("apps/deployments", 4, 1000), ("leases", 2, 0)]));
    assert_eq!((got.samples, got.malformed), (5, 0));
}

#[test]
fn escaped_label_values() {
    let body = br#"apiserver_resource_objects{group="",resource="we\"ird"} 3
apiserver_resource_objects{group="",resource="pods"} 9
apiserver_resource_objects{group="",instance="a\\b\"c\nd } 1",resource="configmaps"} 5
apiserver_storage_objects{resource="back\\slash.x"} 2
apiserver_storage_objects{resource="a\"} 1
apiserver_storage_objects{resource="secrets"} 8
apiserver_storage_objects{resource="tab\tbad"} 1
apiserver_storage_objects{resource="nodes"} 4
"#;
    let got = scan_every_way(body);
    assert_eq!(
        got.entries,
        entries(&[("we\"ird", 3, 0), ("pods", 9, 0), ("configmaps", 5, 0), ("x/back\\slash", 2, 0), ("secrets", 8, 0), ("nodes", 4, 0)])
    );
    // `resource="a\"} 1` never closes its quote; `\t` is not an escape of the format.
    assert_eq!((got.samples, got.malformed), (6, 2));
}

#[test]
fn storage_objects_label_splits_at_the_first_dot() {
    let body = b"apiserver_storage_objects{resource=\"customresourcedefinitions.apiextensions.k8s.io\"} 42
apiserver_storage_objects{resource=\"events.events.k8s.io\"} 5
apiserver_storage_objects{resource=\"events\"} 6
apiserver_storage_objects{resource=\"deployments.apps\"} 12
apiserver_storage_objects{resource=\"pods.\"} 1
apiserver_storage_objects{resource=\".apps\"} 1
apiserver_storage_objects{resource=\"\"} 1
apiserver_storage_objects{resource=\"deployments/scale.apps\"} 1
apiserver_resource_objects{group=\"\",resource=\"apps/deployments\"} 1
apiserver_resource_objects{group=\"a/b\",resource=\"c\"} 1
";
    let got = scan_every_way(body);
    assert_eq!(
        got.entries,
        entries(&[
            ("apiextensions.k8s.io/customresourcedefinitions", 42, 0),
            ("events.k8s.io/events", 5, 0),
            ("events", 6, 0),
            ("apps/deployments", 12, 0)
        ])
    );
    // An empty part, or a `/` that would make the key ambiguous.
    assert_eq!((got.samples, got.malformed), (4, 6));
}

#[test]
fn comments_and_other_metrics_are_skipped() {
    let body = b"# HELP apiserver_storage_objects [STABLE] Number of stored objects.\n# TYPE apiserver_storage_objects gauge
#apiserver_storage_objects{resource=\"pods\"} 1
apiserver_storage_objects_total{resource=\"pods\"} 2
apiserver_storage_object{resource=\"pods\"} 3
apiserver_resource_objects:sum{resource=\"pods\"} 4
xapiserver_storage_objects{resource=\"pods\"} 5
apiserver_storage_list_fetched_objects_total{group=\"\",resource=\"pods\"} 6
apiserver_request_duration_seconds_bucket{group=\"\",resource=\"pods\",verb=\"LIST\",le=\"0.005\"} 7
apiserver_storage_objects{resource=\"pods\"} 8
apiser
apiserver_
apiserver_storage_objects_
";
    let got = scan_every_way(body);
    assert_eq!(got.entries, entries(&[("pods", 8, 0)]));
    assert_eq!((got.samples, got.malformed), (1, 0));
}

#[test]
fn malformed_samples_are_counted_and_do_not_disturb_others() {
    let body = b"apiserver_storage_objects 5
apiserver_storage_objects
apiserver_storage_objects{} 5
apiserver_storage_objects{resource=\"pods\"}
apiserver_storage_objects{resource=\"pods\"} five
apiserver_storage_objects{resource=\"pods\"} 5 later
apiserver_storage_objects{resource=\"pods\"} 5 1 2
apiserver_storage_objects{resource=\"pods\" 5
apiserver_storage_objects{resource=pods} 5
apiserver_storage_objects{resource=\"pods\",resource=\"nodes\"} 5
apiserver_storage_objects{9resource=\"pods\"} 5
apiserver_storage_objects{resource=\"pods\"}} 5
apiserver_storage_objects{resource=\"pods\"} 0x10
apiserver_storage_objects{resource=\"\xff\"} 5
apiserver_storage_objects{resource=\"secrets\"} 1
";
    let got = scan_every_way(body);
    assert_eq!(got.entries, entries(&[("secrets", 1, 0)]));
    assert_eq!((got.samples, got.malformed), (1, 14));
}

#[test]
fn values_floats_errors_and_saturation() {
    let body = b"apiserver_resource_objects{group=\"\",resource=\"a\"} 1.9
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"a\"} 7.9
apiserver_resource_objects{group=\"\",resource=\"b\"} 1.2345e+06
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"b\"} 2.469e+09
apiserver_resource_objects{group=\"\",resource=\"c\"} 1e300
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"c\"} 1e301
apiserver_resource_objects{group=\"\",resource=\"d\"} 4
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"d\"} +Inf
apiserver_resource_objects{group=\"\",resource=\"e\"} 4
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"e\"} NaN
apiserver_resource_objects{group=\"\",resource=\"f\"} 0
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"f\"} 100
apiserver_resource_objects{group=\"\",resource=\"g\"} -0
apiserver_resource_objects{group=\"\",resource=\"h\"} NaN
apiserver_resource_objects{group=\"\",resource=\"i\"} +Inf
apiserver_resource_objects{group=\"\",resource=\"j\"} -1
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"j\"} 100
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"k\"} 100
apiserver_resource_objects{group=\"\",resource=\"l\"} 0.5
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"l\"} 100
";
    let got = scan_every_way(body);
    assert_eq!(
        got.entries,
        entries(&[
            ("a", 1, 7),            // truncated, then 7 / 1
            ("b", 1_234_500, 2000), // exponent notation
            ("c", i64::MAX, 1),     // saturated: i64::MAX / i64::MAX
            ("d", 4, 0),            // infinite size: unknown
            ("e", 4, 0),            // NaN size: unknown
            ("f", 0, 0),            // no objects: no average
            ("g", 0, 0),
            // h, i, j: error counts; k: a size without a count
            ("l", 0, 0), // truncated to 0 objects
        ])
    );
    assert_eq!((got.samples, got.malformed), (20, 0));
}

#[test]
fn count_falls_back_to_storage_objects() {
    let body = b"apiserver_resource_objects{group=\"\",resource=\"pods\"} -1
apiserver_resource_size_estimate_bytes{group=\"\",resource=\"pods\"} 9000
apiserver_storage_objects{resource=\"pods\"} 3
apiserver_resource_objects{group=\"apps\",resource=\"deployments\"} 10
apiserver_storage_objects{resource=\"deployments.apps\"} 99
apiserver_storage_objects{resource=\"secrets\"} NaN
apiserver_resource_objects{group=\"\",resource=\"nodes\"} NaN
apiserver_storage_objects{resource=\"nodes\"} -1
";
    let got = scan_every_way(body);
    // The 1.34 count wins over the old one; without it, the old count (and the size still applies).
    assert_eq!(got.entries, entries(&[("pods", 3, 3000), ("apps/deployments", 10, 0)]));
}

#[test]
fn the_last_of_a_series_wins() {
    let body = b"apiserver_resource_objects{group=\"\",resource=\"pods\"} 5
apiserver_resource_objects{group=\"\",resource=\"pods\"} 6
apiserver_storage_objects{resource=\"nodes\"} 2
apiserver_storage_objects{resource=\"nodes\"} -1
";
    let got = scan_every_way(body);
    assert_eq!(got.entries, entries(&[("pods", 6, 0)]));
    assert_eq!(got.samples, 4);
}

#[test]
fn leading_blanks_and_empty_lines() {
    let body =
        b"\n\n  \t apiserver_storage_objects{resource=\"pods\"} 5\n   \n\t\r\n  # comment\napiserver_storage_objects{resource=\"nodes\"} 6";
    let got = scan_every_way(body);
    assert_eq!(got.entries, entries(&[("pods", 5, 0), ("nodes", 6, 0)]));
    assert_eq!((got.samples, got.malformed), (2, 0));
}

#[test]
fn overlong_wanted_line_is_malformed_and_later_lines_still_parse() {
    let line_of = |len: usize| {
        let head = "apiserver_resource_objects{group=\"\",resource=\"pods\",pad=\"";
        let tail = "\"} 5";
        format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
    };
    assert_eq!(line_of(MAX_LINE).len(), MAX_LINE);
    // Exactly at the cap: kept.
    let body = format!("{}\n", line_of(MAX_LINE));
    let got = scan_metrics(body.as_bytes());
    assert_eq!((got.entries, got.samples, got.malformed), (entries(&[("pods", 5, 0)]), 1, 0));
    // One byte over (also through a `\r`), or far over: dropped, counted, the next line is fine.
    for (long, end) in [(line_of(MAX_LINE + 1), "\n"), (line_of(MAX_LINE), "\r\n"), (line_of(5 * MAX_LINE), "\n")] {
        for last in [true, false] {
            let mut body = format!(
                "apiserver_storage_objects{{resource=\"nodes\"}} 3\n{long}{end}apiserver_storage_objects{{resource=\"secrets\"}} 4\n"
            );
            if last {
                body.push_str(&line_of(MAX_LINE + 1));
            }
            let body = body.as_bytes();
            let whole = scan_metrics(body);
            assert_eq!(whole.entries, entries(&[("nodes", 3, 0), ("secrets", 4, 0)]));
            assert_eq!((whole.samples, whole.malformed), (2, 1 + u64::from(last)));
            assert_eq!(scan_chunks(body.chunks(1)), whole);
            for seed in 1..=4 {
                assert_eq!(scan_random_chunks(body, seed, 1, 5000), whole, "seed {seed}");
            }
        }
    }
    // A long line of another metric or a comment is not malformed.
    let body = format!(
        "# HELP {}\nother{{a=\"{}\"}} 1\napiserver_storage_objects{{resource=\"pods\"}} 1\n",
        "y".repeat(3 * MAX_LINE),
        "z".repeat(2 * MAX_LINE)
    );
    let got = scan_every_way(body.as_bytes());
    assert_eq!((got.entries, got.samples, got.malformed), (entries(&[("pods", 1, 0)]), 1, 0));
}

/// About 30 MB of histogram lines with the wanted lines at the start, middle and end.
fn huge_body() -> Vec<u8> {
    let mut body = Vec::with_capacity(31 << 20);
    let wanted = |b: &mut Vec<u8>, i: usize| {
        b.extend_from_slice(
            format!("# TYPE apiserver_resource_objects gauge\napiserver_resource_objects{{group=\"g{i}\",resource=\"r\"}} {i}\n")
                .as_bytes(),
        );
        b.extend_from_slice(format!("apiserver_resource_size_estimate_bytes{{group=\"g{i}\",resource=\"r\"}} {}\n", i * 1000).as_bytes());
        b.extend_from_slice(format!("apiserver_storage_objects{{resource=\"s{i}\"}} {i}\r\n").as_bytes());
    };
    wanted(&mut body, 1);
    let les = [
        "0.005", "0.025", "0.05", "0.1", "0.2", "0.4", "0.6", "0.8", "1", "1.25", "1.5", "2", "3", "4", "5", "6", "8", "10", "15", "20",
        "30", "45", "60", "+Inf",
    ];
    let mut i = 0usize;
    while body.len() < 30_000_000 {
        if i == 60_000 {
            wanted(&mut body, 2);
        }
        let le = les[i % les.len()];
        body.extend_from_slice(
            format!("apiserver_request_duration_seconds_bucket{{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"pods{}\",scope=\"namespace\",subresource=\"\",verb=\"LIST\",version=\"v1\",le=\"{le}\"}} {i}\n", i / 24).as_bytes(),
        );
        if i % 24 == 23 {
            body.extend_from_slice(b"# HELP apiserver_storage_objects not a sample\n");
        }
        i += 1;
    }
    wanted(&mut body, 3);
    body.truncate(body.len() - 1); // the last line without its newline
    body
}

#[test]
fn huge_body_in_random_chunks() {
    let body = huge_body();
    assert!(body.len() > 30_000_000);
    let want = entries(&[("g1/r", 1, 1000), ("g2/r", 2, 1000), ("g3/r", 3, 1000), ("s1", 1, 0), ("s2", 2, 0), ("s3", 3, 0)]);
    let start = std::time::Instant::now();
    let whole = scan_metrics(&body);
    eprintln!("scanned {} bytes in {:?}", body.len(), start.elapsed());
    assert_eq!(whole.entries, want);
    assert_eq!((whole.samples, whole.malformed), (9, 0));
    for seed in 1..=3 {
        let (got, peak) = peak_heap(|| scan_random_chunks(&body, seed, 1, 100_000));
        assert_eq!(got, whole, "seed {seed}");
        // Only the partial current line is kept (the result's own map is a few hundred bytes).
        assert!(peak < 16 * 1024, "seed {seed}: peak heap {peak} bytes");
    }
    // A line split just after the common prefix, and a skipped line split anywhere.
    let (got, peak) = peak_heap(|| scan_random_chunks(&body, 99, 1, 16));
    assert_eq!(got, whole);
    assert!(peak < 16 * 1024, "small chunks: peak heap {peak} bytes");
}

#[test]
fn huge_skipped_line_is_not_buffered() {
    // A 20 MB line of no interest fed in 64 KiB chunks.
    let mut body = b"apiserver_request_total{a=\"".to_vec();
    body.resize(20 << 20, b'a');
    body.extend_from_slice(b"\"} 1\napiserver_storage_objects{resource=\"pods\"} 2\n");
    let (got, peak) = peak_heap(|| scan_chunks(body.chunks(64 * 1024)));
    assert_eq!(got.entries, entries(&[("pods", 2, 0)]));
    assert!(peak < 16 * 1024, "peak heap {peak} bytes");
}

#[test]
fn fixture_in_every_two_piece_split() {
    let body = FIXTURE.as_bytes();
    let whole = scan_metrics(body);
    // Every split point (a line, a name, an escape or a `\r\n` cut anywhere).
    for at in (0..=body.len()).step_by(37) {
        let (a, b) = body.split_at(at);
        assert_eq!(scan_chunks([a, b]), whole, "split at {at}");
    }
    let tricky = b"apiserver_resource_objects{group=\"\",instance=\"a\\\\b\\\"c\\nd\",resource=\"pods\"} 9\r\napiserver_storage_objects{resource=\"nodes\"} 2\r\n";
    let whole = scan_metrics(tricky);
    assert_eq!(whole.entries, entries(&[("pods", 9, 0), ("nodes", 2, 0)]));
    for at in 0..=tricky.len() {
        for at2 in at..=tricky.len() {
            assert_eq!(scan_chunks([&tricky[..at], &[][..], &tricky[at..at2], &tricky[at2..]]), whole, "split at {at}, {at2}");
        }
    }
}

#[test]
fn scanner_is_default_and_empty() {
    let got = MetricsScanner::default().finish();
    assert_eq!(got, ScrapedCounts::default());
    assert_eq!(scan_metrics(b""), ScrapedCounts::default());
    assert_eq!(scan_metrics(b"\n\n\r\n"), ScrapedCounts::default());
}

// ---------------------------------------------------------------------------------------------
// initial-events-end marker

fn contains(hay: &[u8]) -> bool {
    hay.windows(INITIAL_EVENTS_END.len()).any(|w| w == INITIAL_EVENTS_END)
}

const JSON_STREAM: &[u8] = b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"a\",\"namespace\":\"default\",\"resourceVersion\":\"41\"}}}\n\
{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"42\",\"creationTimestamp\":null,\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n";

/// A protobuf watch event: a 4-byte length frame, then `WatchEvent{type, object}` with the
/// annotation as a map entry `{1: key, 2: value}` of length-prefixed strings.
fn protobuf_stream() -> Vec<u8> {
    let mut entry = vec![0x0a, INITIAL_EVENTS_END.len() as u8];
    entry.extend_from_slice(INITIAL_EVENTS_END);
    entry.extend_from_slice(b"\x12\x04true");
    let mut meta = b"\x2a\x0242\x62".to_vec();
    meta.push(entry.len() as u8);
    meta.extend_from_slice(&entry);
    let mut obj = b"k8s\x00\x0a\x0c\x0a\x02v1\x12\x06Secret\x12".to_vec();
    obj.push(meta.len() as u8 + 2);
    obj.push(0x0a);
    obj.push(meta.len() as u8);
    obj.extend_from_slice(&meta);
    let mut ev = b"\x0a\x08BOOKMARK\x12".to_vec();
    ev.push(obj.len() as u8 + 2);
    ev.push(0x0a);
    ev.push(obj.len() as u8);
    ev.extend_from_slice(&obj);
    let mut framed = (ev.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&ev);
    framed
}

#[test]
fn marker_in_one_chunk_json_and_protobuf() {
    for body in [JSON_STREAM.to_vec(), protobuf_stream(), INITIAL_EVENTS_END.to_vec()] {
        let mut s = MarkerScanner::new();
        assert!(!s.found());
        assert!(s.feed(&body));
        assert!(s.found());
        assert_eq!(s.bytes(), body.len() as u64);
    }
    assert_eq!(INITIAL_EVENTS_END, b"k8s.io/initial-events-end");
}

#[test]
fn marker_split_at_every_position_across_two_chunks() {
    for body in [JSON_STREAM.to_vec(), protobuf_stream(), INITIAL_EVENTS_END.to_vec()] {
        for at in 0..=body.len() {
            let (a, b) = body.split_at(at);
            let mut s = MarkerScanner::new();
            assert_eq!(s.feed(a), contains(a), "first chunk of a split at {at}");
            assert!(s.feed(b), "split at {at}");
            assert!(s.found());
            assert_eq!(s.bytes(), body.len() as u64);
        }
    }
}

#[test]
fn marker_in_one_byte_chunks_turns_true_on_its_last_byte() {
    for body in [JSON_STREAM.to_vec(), protobuf_stream()] {
        let end = body.windows(INITIAL_EVENTS_END.len()).position(|w| w == INITIAL_EVENTS_END).unwrap() + INITIAL_EVENTS_END.len();
        let mut s = MarkerScanner::new();
        for (i, b) in body.iter().enumerate() {
            assert_eq!(s.feed(std::slice::from_ref(b)), i + 1 >= end, "byte {i}");
        }
        assert_eq!(s.bytes(), body.len() as u64);
    }
}

#[test]
fn marker_across_several_tiny_chunks_and_empty_ones() {
    let body = b"xx\"k8s.io/initial-events-end\":\"true\"";
    for sizes in [&[3usize, 1, 2, 0, 5, 1, 1, 1, 9, 100][..], &[1, 0, 24, 0, 100], &[27, 1, 100], &[2; 20]] {
        let mut s = MarkerScanner::new();
        let mut rest = &body[..];
        let mut fed = 0;
        for &n in sizes {
            let n = n.min(rest.len());
            let (a, b) = rest.split_at(n);
            fed += n;
            assert_eq!(s.feed(a), contains(&body[..fed]), "{sizes:?} after {fed} bytes");
            rest = b;
        }
        assert!(rest.is_empty() && s.found(), "{sizes:?}");
    }
}

#[test]
fn near_misses_do_not_match() {
    let near = [
        &b"k8s.io/initial-events-en"[..],
        b"k8s.io/initial-events-en\"",
        b"k8s.io/initial-events-enD",
        b"k8s.io/initial_events-end",
        b"K8s.io/initial-events-end",
        b"k8s.io/initial-events-ennd",
        b"k8s.io/initial-event-end",
        b"k8s.io/initial-events-e\nnd",
        b"k8s.io/initial-events",
    ];
    for n in near {
        let mut body = b"{\"annotations\":{\"".to_vec();
        for _ in 0..3 {
            body.extend_from_slice(n);
            body.extend_from_slice(b"\":\"true\",\"");
        }
        for step in [1, 2, 5, 24, 25, 26, 1000] {
            let mut s = MarkerScanner::new();
            for c in body.chunks(step) {
                assert!(!s.feed(c), "{:?} in chunks of {step}", String::from_utf8_lossy(n));
            }
            assert!(!s.found());
            assert_eq!(s.bytes(), body.len() as u64);
        }
    }
    // An almost-marker directly followed by the marker: still found (overlapping restart).
    for at in 0..40 {
        let body = b"k8s.io/initial-events-enk8s.io/initial-events-end";
        let mut s = MarkerScanner::new();
        let (a, b) = body.split_at(at.min(body.len()));
        s.feed(a);
        assert!(s.feed(b), "split at {at}");
    }
}

#[test]
fn marker_found_stays_true_and_bytes_keep_counting() {
    let mut s = MarkerScanner::default();
    assert_eq!(s.bytes(), 0);
    assert!(!s.feed(b""));
    assert!(!s.feed(b"k8s.io/initial-"));
    assert_eq!(s.bytes(), 15);
    assert!(s.feed(b"events-end"));
    assert!(s.feed(b""));
    assert!(s.feed(b"anything else"));
    assert!(s.found());
    assert_eq!(s.bytes(), 15 + 10 + 13);
    // The carry is small and fixed: a clone is independent.
    let t = MarkerScanner::new();
    let mut u = t.clone();
    assert!(!u.feed(b"k8s.io/initial-events-"));
    assert!(!t.found() && t.bytes() == 0);
}

#[test]
fn marker_matches_a_naive_search_on_random_bodies() {
    let alphabet: &[u8] = b"k8s.io/initial-events-endk8s\"";
    let mut rng = Rng(0x5eed);
    for round in 0..3000 {
        let len = rng.range(0, 120);
        let mut body: Vec<u8> = (0..len).map(|_| alphabet[rng.range(0, alphabet.len() - 1)]).collect();
        if round % 3 == 0 {
            // Plant (a piece of) the marker somewhere.
            let at = rng.range(0, body.len());
            let cut = rng.range(INITIAL_EVENTS_END.len() - 2, INITIAL_EVENTS_END.len());
            body.splice(at..at, INITIAL_EVENTS_END[..cut].iter().copied());
        }
        let mut s = MarkerScanner::new();
        let mut fed = 0;
        while fed < body.len() {
            let n = rng.range(0, 30).min(body.len() - fed);
            assert_eq!(s.feed(&body[fed..fed + n]), contains(&body[..fed + n]), "round {round}");
            fed += n;
        }
        assert_eq!(s.found(), contains(&body), "round {round}");
        assert_eq!(s.bytes(), body.len() as u64);
    }
}
