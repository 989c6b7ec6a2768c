//! Envoy tag extraction round trip for the APF stat naming scheme
//! (`apf_wasm::observe::metrics`), and the histogram aggregation the filter flushes.
//!
//! A small backtracking regex engine (leftmost-first, like RE2's submatch semantics for the
//! subset used: `^`, literals, `\.`, `.`, classes, groups, `(?:)`, `|`, `* + ?` and lazy
//! variants) applies the generated `stats_tags` the way Envoy does: each regex is searched in
//! the full name; group 1 is removed from the tag-extracted name, group 2 is the tag value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::observe::metrics::*;
use std::collections::BTreeMap;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

#[derive(Debug, Clone)]
enum Node {
    Start,
    End,
    Any,
    Lit(char),
    Class(Vec<(char, char)>, bool),
    Group(Option<usize>, Vec<Vec<Node>>),
    Rep(Box<Node>, usize, usize, bool),
}

type Caps = Vec<Option<(usize, usize)>>;

struct Re {
    alts: Vec<Vec<Node>>,
    ngroups: usize,
}

struct Parser {
    c: Vec<char>,
    p: usize,
    n: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.c.get(self.p).copied()
    }
    fn alt(&mut self) -> Vec<Vec<Node>> {
        let mut alts = vec![self.seq()];
        while self.peek() == Some('|') {
            self.p += 1;
            alts.push(self.seq());
        }
        alts
    }
    fn seq(&mut self) -> Vec<Node> {
        let mut v = Vec::new();
        while let Some(ch) = self.peek() {
            if ch == '|' || ch == ')' {
                break;
            }
            let atom = self.atom();
            let (min, max) = match self.peek() {
                Some('*') => (0, usize::MAX),
                Some('+') => (1, usize::MAX),
                Some('?') => (0, 1),
                _ => {
                    v.push(atom);
                    continue;
                }
            };
            self.p += 1;
            let greedy = if self.peek() == Some('?') {
                self.p += 1;
                false
            } else {
                true
            };
            v.push(Node::Rep(Box::new(atom), min, max, greedy));
        }
        v
    }
    fn atom(&mut self) -> Node {
        let ch = self.peek().unwrap();
        self.p += 1;
        match ch {
            '^' => Node::Start,
            '$' => Node::End,
            '.' => Node::Any,
            '\\' => {
                let e = self.peek().unwrap();
                self.p += 1;
                Node::Lit(e)
            }
            '[' => {
                let neg = self.peek() == Some('^');
                if neg {
                    self.p += 1;
                }
                let mut ranges = Vec::new();
                while self.peek() != Some(']') {
                    let mut a = self.peek().unwrap();
                    self.p += 1;
                    if a == '\\' {
                        a = self.peek().unwrap();
                        self.p += 1;
                    }
                    if self.peek() == Some('-') && self.c.get(self.p + 1) != Some(&']') {
                        let b = *self.c.get(self.p + 1).unwrap();
                        self.p += 2;
                        ranges.push((a, b));
                    } else {
                        ranges.push((a, a));
                    }
                }
                self.p += 1;
                Node::Class(ranges, neg)
            }
            '(' => {
                let idx = if self.c.get(self.p) == Some(&'?') && self.c.get(self.p + 1) == Some(&':') {
                    self.p += 2;
                    None
                } else {
                    self.n += 1;
                    Some(self.n)
                };
                let alts = self.alt();
                assert_eq!(self.peek(), Some(')'));
                self.p += 1;
                Node::Group(idx, alts)
            }
            c => Node::Lit(c),
        }
    }
}

impl Re {
    fn new(pat: &str) -> Re {
        let mut p = Parser { c: pat.chars().collect(), p: 0, n: 0 };
        let alts = p.alt();
        assert_eq!(p.p, p.c.len(), "trailing input in {pat}");
        Re { alts, ngroups: p.n }
    }

    fn one(&self, node: &Node, s: &[char], pos: usize) -> bool {
        let Some(&c) = s.get(pos) else { return false };
        match node {
            Node::Any => true,
            Node::Lit(l) => c == *l,
            Node::Class(r, neg) => r.iter().any(|&(a, b)| a <= c && c <= b) != *neg,
            _ => false,
        }
    }

    fn m(&self, seq: &[Node], s: &[char], pos: usize, caps: &mut Caps, k: &mut dyn FnMut(usize, &mut Caps) -> bool) -> bool {
        let Some((first, rest)) = seq.split_first() else { return k(pos, caps) };
        match first {
            Node::Start => pos == 0 && self.m(rest, s, pos, caps, k),
            Node::End => pos == s.len() && self.m(rest, s, pos, caps, k),
            Node::Any | Node::Lit(_) | Node::Class(..) => self.one(first, s, pos) && self.m(rest, s, pos + 1, caps, k),
            Node::Group(idx, alts) => {
                let idx = *idx;
                for alt in alts {
                    let ok = self.m(alt, s, pos, caps, &mut |p, caps: &mut Caps| {
                        let old = idx.map(|i| caps[i]);
                        if let Some(i) = idx {
                            caps[i] = Some((pos, p));
                        }
                        if self.m(rest, s, p, caps, k) {
                            return true;
                        }
                        if let (Some(i), Some(o)) = (idx, old) {
                            caps[i] = o;
                        }
                        false
                    });
                    if ok {
                        return true;
                    }
                }
                false
            }
            Node::Rep(node, min, max, greedy) => self.rep(node, *min, *max, *greedy, 0, s, pos, rest, caps, k),
        }
    }

    #[allow(clippy::too_many_arguments, clippy::if_same_then_else)] // order of `||` operands = greedy vs lazy
    fn rep(
        &self,
        node: &Node,
        min: usize,
        max: usize,
        greedy: bool,
        count: usize,
        s: &[char],
        pos: usize,
        rest: &[Node],
        caps: &mut Caps,
        k: &mut dyn FnMut(usize, &mut Caps) -> bool,
    ) -> bool {
        let more = |caps: &mut Caps, k: &mut dyn FnMut(usize, &mut Caps) -> bool| {
            count < max
                && self.m(std::slice::from_ref(node), s, pos, caps, &mut |p, caps: &mut Caps| {
                    p != pos && self.rep(node, min, max, greedy, count + 1, s, p, rest, caps, k)
                })
        };
        if greedy {
            more(caps, k) || (count >= min && self.m(rest, s, pos, caps, k))
        } else {
            (count >= min && self.m(rest, s, pos, caps, k)) || more(caps, k)
        }
    }

    /// Leftmost match anywhere (RE2 PartialMatch); returns the capture spans.
    fn search(&self, text: &str) -> Option<Caps> {
        let s: Vec<char> = text.chars().collect();
        for start in 0..=s.len() {
            let mut caps: Caps = vec![None; self.ngroups + 1];
            let mut found: Option<Caps> = None;
            let top = Node::Group(Some(0), self.alts.clone());
            if self.m(std::slice::from_ref(&top), &s, start, &mut caps, &mut |_, caps: &mut Caps| {
                found = Some(caps.clone());
                true
            }) {
                return found;
            }
        }
        None
    }
}

/// Envoy tag extraction, then Prometheus naming (custom namespace stripped).
fn envoy_extract(full_name: &str) -> (String, BTreeMap<String, String>) {
    let chars: Vec<char> = full_name.chars().collect();
    let mut removed = vec![false; chars.len()];
    let mut tags = BTreeMap::new();
    for (tag, re) in stats_tags() {
        let re = Re::new(&re);
        if let Some(caps) = re.search(full_name) {
            let (rs, re_) = caps[1].unwrap();
            let (vs, ve) = caps.get(2).copied().flatten().unwrap_or((rs, re_));
            tags.insert(tag, chars[vs..ve].iter().collect::<String>());
            for r in removed.iter_mut().take(re_).skip(rs) {
                *r = true;
            }
        }
    }
    let name: String = chars.iter().zip(&removed).filter(|(_, r)| !**r).map(|(c, _)| *c).collect();
    let prom = name.strip_prefix("wasmcustom.").unwrap_or(&name).to_string();
    (prom, tags)
}

fn labels_of(s: &MetricSpec, values: &[&str]) -> BTreeMap<String, String> {
    s.labels.iter().zip(values).map(|(k, v)| (k.to_string(), sanitize_label_value(v))).collect()
}

fn check(name: &str, want_prom: &str, want_tags: &BTreeMap<String, String>) {
    for full in [format!("wasmcustom.{name}"), name.to_string()] {
        let (prom, tags) = envoy_extract(&full);
        assert_eq!(prom, want_prom, "{full}");
        assert_eq!(&tags, want_tags, "{full}");
    }
}

/// A counter's or gauge's stat name comes back as its exported name and labels; a histogram's
/// series come back as upstream's `_bucket{…, le}` and `_count`, and its sum series.
fn roundtrip(metric: &str, values: &[&str]) {
    let s = spec(metric).unwrap();
    let labels = labels_of(s, values);
    if s.kind != MetricKind::Histogram {
        let name = stat_name(s, values).unwrap();
        check(&name, &format!("apiserver_flowcontrol_{}", s.envoy_name), &labels);
        return;
    }
    let h = histogram_stat_names(s, values).unwrap();
    assert_eq!(h.buckets.len(), s.buckets.len() + 1);
    for (name, bound) in h.buckets.iter().zip(s.buckets.iter().copied().chain([f64::INFINITY])) {
        let mut want = labels.clone();
        want.insert("le".into(), le_label(bound));
        check(name, &format!("apiserver_flowcontrol_{}_bucket", s.name), &want);
    }
    check(&h.count, &format!("apiserver_flowcontrol_{}_count", s.name), &labels);
    check(&h.sum, &format!("apiserver_flowcontrol_{}", sum_series_name(s)), &labels);
}

#[test]
fn mini_regex_sanity() {
    let re = Re::new(r"^cluster\.((.+?)\.)");
    let caps = re.search("cluster.foo_cluster.upstream_rq_timeout").unwrap();
    assert_eq!(caps[1], Some((8, 20)));
    assert_eq!(caps[2], Some((8, 19)));
    assert!(Re::new(r"^a(b|c)*?d$").search("abcbd").is_some());
    assert!(Re::new(r"^a[^.]+$").search("ab.c").is_none());
}

#[test]
fn tag_extraction_roundtrip() {
    roundtrip("rejected_requests_total", &["workload-low", "service-accounts", "queue-full"]);
    roundtrip("dispatched_requests_total", &["global-default", "global-default"]);
    roundtrip("request_wait_duration_seconds", &["exempt", "system-nodes", "true"]);
    roundtrip("request_execution_seconds", &["leader-election", "kube-scheduler", "watch"]);
    roundtrip("epoch_advance_total", &["catch-all", "false"]);
    roundtrip("next_s_bounds", &["system", "min"]);
    roundtrip("priority_level_request_utilization", &["waiting", "workload-high"]);
    roundtrip("read_vs_write_current_requests", &["executing", "readOnly"]);
    roundtrip("current_limit_seats", &["node-high"]);
    roundtrip("seat_fair_frac", &[]);
    roundtrip("request_queue_length_after_enqueue", &["workload-low", "service-accounts"]);
    roundtrip("work_estimated_seats", &["global-default", "global-default"]);
    roundtrip("priority_level_seat_utilization", &["system", "executing"]);
    // Values equal to label keys, dotted names and empty values.
    roundtrip("rejected_requests_total", &["priority_level", "flow_schema", "reason"]);
    roundtrip("rejected_requests_total", &["my.level", "", "time-out"]);
    // Histogram label values that look like keys, numbers or bounds.
    roundtrip("request_wait_duration_seconds", &["le", "0", "false"]);
    roundtrip("request_execution_seconds", &["0.5", "le", "regular"]);
    // Every metric, every label set of one value each.
    for s in METRICS {
        let values: Vec<&str> = s.labels.iter().map(|_| "v").collect();
        roundtrip(s.name, &values);
    }
}

#[test]
fn histogram_names_and_units_are_upstreams() {
    let w = spec("request_wait_duration_seconds").unwrap();
    // Upstream's bounds, printed as Go's strconv.FormatFloat(b, 'g', -1, 64) prints them.
    let les: Vec<String> = w.buckets.iter().map(|b| le_label(*b)).collect();
    assert_eq!(les, ["0", "0.005", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10", "15", "30"]);
    assert_eq!(le_label(f64::INFINITY), "+Inf");
    let q = spec("request_queue_length_after_enqueue").unwrap();
    let les: Vec<String> = q.buckets.iter().map(|b| le_label(*b)).collect();
    assert_eq!(les, ["0", "10", "25", "50", "100", "250", "500", "1000"]);
    // Fractional samples: the sum is exported in microseconds under its own name, never as a
    // `_sum` in the wrong unit under upstream's name; integer samples keep upstream's `_sum`.
    for s in METRICS.iter().filter(|s| s.kind == MetricKind::Histogram) {
        let sum = sum_series_name(s);
        if s.name.ends_with("_seconds") {
            assert!(sum_is_scaled(s), "{}", s.name);
            assert_eq!(sum, format!("{}_sum", s.name.replace("_seconds", "_microseconds")));
            assert_eq!(s.envoy_scale, 1e6);
        }
        if sum_is_scaled(s) {
            assert_ne!(sum, format!("{}_sum", s.name));
        } else {
            assert_eq!(sum, format!("{}_sum", s.name));
        }
        // No series of one metric is a series of another.
        let h = histogram_stat_names(s, &vec!["v"; s.labels.len()]).unwrap();
        for o in METRICS.iter().filter(|o| o.name != s.name) {
            let base = format!("{PREFIX}{}.", o.envoy_name);
            assert!(h.all().all(|n| !n.starts_with(&base)), "{} vs {}", s.name, o.name);
        }
    }
}

/// Exact sum of the samples in nanoseconds (the unit callers measure in).
fn micros_of(ns: &[u64]) -> u64 {
    ns.iter().sum::<u64>() / 1000
}

#[test]
fn histogram_accumulator_buckets_and_exact_sum() {
    let w = spec("request_wait_duration_seconds").unwrap();
    let n = w.buckets.len();
    let mut acc = HistogramAcc::new(w);
    assert_eq!(acc.take(), None, "nothing observed: nothing to flush");
    // A sample equal to a bound lands in that bound's bucket (Prometheus: value <= le).
    for x in [0.0, 0.005, 0.0050001, 30.0, 30.000001, f64::NAN, -1.0] {
        acc.observe(x);
    }
    let d = acc.take().unwrap();
    assert_eq!(d.len(), n + 3);
    let (buckets, rest) = d.split_at(n + 1);
    assert_eq!(buckets, [2, 3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 7], "-1 and 0 in le=0; NaN and 30.000001 only in +Inf");
    assert_eq!(rest, [60_010_001, 7], "sum in µs (NaN and negatives add 0), count");
    // Deltas, not totals: a second flush carries only what came since.
    acc.observe(0.1);
    let d = acc.take().unwrap();
    assert_eq!(d[..n + 1], [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    assert_eq!(d[n + 1..], [100_000, 1]);

    // The exported sum never drifts: over many flushes of sub-microsecond-heavy samples (as
    // callers pass them: nanoseconds / 1e9) it stays within 1 µs below the exact sum.
    let mut acc = HistogramAcc::new(w);
    let mut exported = 0u64;
    let mut all_ns = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for flush in 0..2000 {
        for _ in 0..(flush % 7) {
            let ns = rng.below(3_000_000); // up to 3 ms, mostly not whole microseconds
            all_ns.push(ns);
            acc.observe(ns as f64 / 1e9);
        }
        if let Some(d) = acc.take() {
            exported += d[n + 1];
        }
        let exact = micros_of(&all_ns);
        assert!(exported == exact, "after flush {flush}: exported {exported} µs, exact {exact} µs");
    }
    assert_eq!(exported, micros_of(&all_ns));

    // Integer samples: `_sum` in upstream's unit, exact.
    let s = spec("work_estimated_seats").unwrap();
    let mut acc = HistogramAcc::new(s);
    for seats in [1.0, 1.0, 3.0, 100.0, 101.0] {
        acc.observe(seats);
    }
    let d = acc.take().unwrap();
    assert_eq!(d, vec![2, 2, 3, 3, 3, 3, 3, 4, 5, 206, 5]);
}

#[test]
fn foreign_stats_untouched() {
    let (name, tags) = envoy_extract("cluster.outbound.priority_level.x.upstream_rq_total");
    assert_eq!(name, "cluster.outbound.priority_level.x.upstream_rq_total");
    assert!(tags.is_empty());
}
