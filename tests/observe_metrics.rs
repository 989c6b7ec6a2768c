//! Envoy tag extraction round trip for the APF stat naming scheme (reference §9.3).
//!
//! A small backtracking regex engine (leftmost-first, like RE2's submatch semantics for the
//! subset used: `^`, literals, `\.`, `.`, classes, groups, `(?:)`, `|`, `* + ?` and lazy
//! variants) applies the generated `stats_tags` the way Envoy does: each regex is searched in
//! the full name; group 1 is removed from the tag-extracted name, group 2 is the tag value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use apf_wasm::observe::metrics::*;
use std::collections::BTreeMap;

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

fn roundtrip(metric: &str, values: &[&str]) {
    let s = spec(metric).unwrap();
    let name = stat_name(s, values).unwrap();
    for full in [format!("wasmcustom.{name}"), name.clone()] {
        let (prom, tags) = envoy_extract(&full);
        assert_eq!(prom, format!("apiserver_flowcontrol_{}", s.envoy_name), "{full}");
        let expected: BTreeMap<String, String> =
            s.labels.iter().zip(values).map(|(k, v)| (k.to_string(), sanitize_label_value(v))).collect();
        assert_eq!(tags, expected, "{full}");
    }
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
    // Values equal to label keys, dotted names and empty values.
    roundtrip("rejected_requests_total", &["priority_level", "flow_schema", "reason"]);
    roundtrip("rejected_requests_total", &["my.level", "", "time-out"]);
}

#[test]
fn foreign_stats_untouched() {
    let (name, tags) = envoy_extract("cluster.outbound.priority_level.x.upstream_rq_total");
    assert_eq!(name, "cluster.outbound.priority_level.x.upstream_rq_total");
    assert!(tags.is_empty());
}
