//! A streaming scanner of kube-apiserver's `/metrics` body (Prometheus text format 0.0.4) for the
//! work estimator's inputs: how many objects each resource has in storage, and how big they are.
//!
//! Upstream, `staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go:
//! startObservingCount` polls the storage's stats of every resource and hands them both to the
//! list-cost estimator's tracker
//! (`staging/src/k8s.io/apiserver/pkg/util/flowcontrol/request/object_count_tracker.go:
//! objectCountTracker.Set`, read back by its `Get`) and to three gauges, declared in
//! `staging/src/k8s.io/apiserver/pkg/storage/etcd3/metrics/metrics.go` and set by its
//! `UpdateStoreStats` (`UpdateObjectCount` in releases without the sizes):
//! - `apiserver_resource_objects{group,resource}` (1.34+): the object count (`group` is `""` for
//!   the core group);
//! - `apiserver_resource_size_estimate_bytes{group,resource}` (1.34+, with the
//!   `SizeBasedListCostEstimate` feature): the sum of the last observed sizes of the objects,
//!   i.e. `EstimatedAverageObjectSizeBytes * ObjectCount`;
//! - `apiserver_storage_objects{resource}` (older, stable, deprecated in 1.34): the count only,
//!   labelled with `GroupResource.String()`: `<resource>` for the core group,
//!   `<resource>.<group>` otherwise. Resource names never contain dots and group names do, so
//!   the label splits at its first dot.
//!
//! All three are `-1` when the poll failed. Here, a gateway outside the apiserver reads them
//! back, so every other metric of the body (most of it: request-duration histograms …) is
//! skipped as it streams by.
//!
//! Merge rule, per resource key (`resource` for the core group, `group/resource` otherwise — the
//! keys of the configuration's `workEstimator.objectCounts`):
//! - count: `apiserver_resource_objects` when present, finite and ≥ 0, else
//!   `apiserver_storage_objects` when present, finite and ≥ 0; without a valid count there is no
//!   entry (negative and non-finite values are upstream's error values and are ignored);
//! - average object size: `apiserver_resource_size_estimate_bytes / count` (integer division,
//!   truncating) when the estimate is present, finite and ≥ 0 and the count is > 0; else 0,
//!   "unknown", for which the estimator applies upstream's stand-in (`UpdateStoreStats` itself
//!   publishes -1 when it has a count but no average);
//! - values become integers by truncation, saturating at the `i64` range; when one series
//!   appears twice, the last one wins.
//!
//! The scanner keeps only the partial current line, and only when it starts like one of the
//! three metrics; a kept line longer than [`MAX_LINE`] is dropped and counted as malformed.

use crate::digest::work_estimate::ObjectStats;
use std::collections::BTreeMap;

/// The longest kept line (bytes before its newline, a `\r` included).
pub const MAX_LINE: usize = 64 * 1024;

const RESOURCE_OBJECTS: &[u8] = b"apiserver_resource_objects";
const SIZE_ESTIMATE: &[u8] = b"apiserver_resource_size_estimate_bytes";
const STORAGE_OBJECTS: &[u8] = b"apiserver_storage_objects";
/// The prefix the three names share: most lines are rejected on their first bytes.
const COMMON_PREFIX: &[u8] = b"apiserver_";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Metric {
    ResourceObjects,
    SizeEstimate,
    StorageObjects,
}

const METRICS: [(&[u8], Metric); 3] =
    [(RESOURCE_OBJECTS, Metric::ResourceObjects), (SIZE_ESTIMATE, Metric::SizeEstimate), (STORAGE_OBJECTS, Metric::StorageObjects)];

/// What the first bytes of a line say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// A sample line of this metric (name followed by a byte that cannot continue a name).
    Is(Metric),
    /// Still a prefix of (or exactly) one of the names: more bytes decide.
    Maybe,
    /// Another metric, a comment or garbage.
    No,
}

/// Whether `b` can continue a Prometheus metric name (`[a-zA-Z0-9_:]`).
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

fn classify(head: &[u8]) -> Head {
    let common = head.len().min(COMMON_PREFIX.len());
    if head.get(..common) != COMMON_PREFIX.get(..common) {
        return Head::No;
    }
    if head.len() <= COMMON_PREFIX.len() {
        return Head::Maybe;
    }
    let mut maybe = false;
    for (name, metric) in METRICS {
        match head.get(..name.len()) {
            None => maybe |= name.starts_with(head),
            Some(h) if h == name => match head.get(name.len()) {
                None => maybe = true,
                Some(&b) if !is_name_byte(b) => return Head::Is(metric),
                Some(_) => {}
            },
            Some(_) => {}
        }
    }
    if maybe {
        Head::Maybe
    } else {
        Head::No
    }
}

/// Index of the first `\n` in `s`, eight bytes at a time.
fn find_newline(s: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const NL: u64 = LO * (b'\n' as u64);
    let mut words = s.chunks_exact(8);
    let mut base = 0usize;
    for w in words.by_ref() {
        let mut a = [0u8; 8];
        a.copy_from_slice(w);
        let x = u64::from_le_bytes(a) ^ NL;
        // Nonzero iff some byte of x is zero, i.e. some byte of the word is '\n'.
        if x.wrapping_sub(LO) & !x & HI != 0 {
            return w.iter().position(|&b| b == b'\n').map(|i| base + i);
        }
        base += 8;
    }
    words.remainder().iter().position(|&b| b == b'\n').map(|i| base + i)
}

/// The per-key values seen so far (the last of each series wins).
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    resource_objects: Option<f64>,
    size_estimate: Option<f64>,
    storage_objects: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a line (leading blanks are skipped here).
    LineStart,
    /// Inside a line that may be one of the three metrics, kept in `line`.
    Keep,
    /// Inside a line of no interest: skipping until its newline.
    Skip,
    /// Inside a wanted line longer than `MAX_LINE`: skipping until its newline, then malformed.
    Overlong,
}

/// Streaming scanner of a kube-apiserver `/metrics` body: [`MetricsScanner::feed`] the body in
/// chunks cut anywhere, then [`MetricsScanner::finish`].
#[derive(Debug, Clone)]
pub struct MetricsScanner {
    state: State,
    line: Vec<u8>,
    seen: BTreeMap<String, Seen>,
    malformed: u64,
    samples: u64,
}

impl Default for MetricsScanner {
    fn default() -> Self {
        MetricsScanner::new()
    }
}

/// What a `/metrics` body said about object counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrapedCounts {
    /// Key: "resource" for the core group, "group/resource" otherwise (the same keys as the
    /// configuration's `workEstimator.objectCounts`). Sorted.
    pub entries: BTreeMap<String, ObjectStats>,
    /// Lines of the three metrics that could not be parsed (bad labels, bad value).
    pub malformed: u64,
    /// How many of the three metrics' sample lines were read (parsed OK).
    pub samples: u64,
}

/// Parses a whole body at once (for the CLI and tests): new + feed + finish.
pub fn scan_metrics(body: &[u8]) -> ScrapedCounts {
    let mut s = MetricsScanner::new();
    s.feed(body);
    s.finish()
}

impl MetricsScanner {
    pub fn new() -> MetricsScanner {
        MetricsScanner { state: State::LineStart, line: Vec::new(), seen: BTreeMap::new(), malformed: 0, samples: 0 }
    }

    /// Feeds the next bytes of the body; chunk boundaries may fall anywhere.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while !rest.is_empty() {
            rest = match self.state {
                State::LineStart => self.line_start(rest),
                State::Keep => self.keep(rest),
                State::Skip | State::Overlong => match find_newline(rest) {
                    Some(nl) => {
                        if self.state == State::Overlong {
                            self.malformed = self.malformed.saturating_add(1);
                        }
                        self.state = State::LineStart;
                        rest.get(nl + 1..).unwrap_or_default()
                    }
                    None => &[],
                },
            };
        }
    }

    /// Ends the input (a last line without a newline counts) and merges what was seen.
    pub fn finish(mut self) -> ScrapedCounts {
        match self.state {
            State::Keep => {
                let line = std::mem::take(&mut self.line);
                self.complete_line(&line);
            }
            State::Overlong => self.malformed = self.malformed.saturating_add(1),
            State::LineStart | State::Skip => {}
        }
        let mut entries = BTreeMap::new();
        for (key, seen) in self.seen {
            let valid = |v: Option<f64>| v.filter(|v| v.is_finite() && *v >= 0.0);
            let Some(count) = valid(seen.resource_objects).or_else(|| valid(seen.storage_objects)) else {
                continue;
            };
            // `as` truncates toward zero and saturates at the i64 range.
            let count = count as i64;
            let average_object_size_bytes = match valid(seen.size_estimate) {
                Some(size) if count > 0 => (size as i64) / count,
                _ => 0,
            };
            entries.insert(key, ObjectStats { count, average_object_size_bytes });
        }
        ScrapedCounts { entries, malformed: self.malformed, samples: self.samples }
    }

    /// At a line start: skips blanks and empty lines; a whole line in this chunk is handled in
    /// place, without copying.
    fn line_start<'a>(&mut self, rest: &'a [u8]) -> &'a [u8] {
        let lead = rest.iter().position(|&b| !matches!(b, b' ' | b'\t' | b'\n')).unwrap_or(rest.len());
        let rest = rest.get(lead..).unwrap_or_default();
        if rest.is_empty() {
            return rest;
        }
        match find_newline(rest) {
            Some(nl) => {
                let line = rest.get(..nl).unwrap_or_default();
                if line.len() > MAX_LINE {
                    if classify(line) != Head::No {
                        self.malformed = self.malformed.saturating_add(1);
                    }
                } else {
                    self.complete_line(line);
                }
                rest.get(nl + 1..).unwrap_or_default()
            }
            None => {
                self.line.clear();
                self.state = State::Keep;
                self.keep(rest)
            }
        }
    }

    /// Inside a kept line: appends up to its newline, deciding as early as possible whether to
    /// keep it at all.
    fn keep<'a>(&mut self, rest: &'a [u8]) -> &'a [u8] {
        let (segment, after, ended) = match find_newline(rest) {
            Some(nl) => (rest.get(..nl).unwrap_or_default(), rest.get(nl + 1..).unwrap_or_default(), true),
            None => (rest, &[][..], false),
        };
        // Decide on the line's first bytes (a name is at most 38 bytes, plus one).
        let known = self.line.len();
        let want = (SIZE_ESTIMATE.len() + 1).saturating_sub(known).min(segment.len());
        let head = match classify(&self.line) {
            Head::Maybe if want > 0 => {
                let mut h = [0u8; 40];
                let mut n = 0;
                for (d, s) in h.iter_mut().zip(self.line.iter().chain(segment.get(..want).unwrap_or_default())) {
                    *d = *s;
                    n += 1;
                }
                classify(h.get(..n).unwrap_or_default())
            }
            h => h,
        };
        if head == Head::No {
            self.line.clear();
            self.state = if ended { State::LineStart } else { State::Skip };
            return after;
        }
        if known.saturating_add(segment.len()) > MAX_LINE {
            self.line = Vec::new();
            if ended {
                self.malformed = self.malformed.saturating_add(1);
                self.state = State::LineStart;
            } else {
                self.state = State::Overlong;
            }
            return after;
        }
        self.line.extend_from_slice(segment);
        if ended {
            let line = std::mem::take(&mut self.line);
            self.complete_line(&line);
            // Reuse the allocation for the next kept line.
            self.line = line;
            self.line.clear();
            self.state = State::LineStart;
        }
        after
    }

    /// One whole line (without its `\n`, leading blanks skipped).
    fn complete_line(&mut self, line: &[u8]) {
        let metric = match classify(line) {
            Head::Is(m) => m,
            // Exactly a name and nothing else: a sample without a value.
            Head::Maybe if METRICS.iter().any(|(n, _)| *n == line) => {
                self.malformed = self.malformed.saturating_add(1);
                return;
            }
            Head::Maybe | Head::No => return,
        };
        let name_len = match metric {
            Metric::ResourceObjects => RESOURCE_OBJECTS.len(),
            Metric::SizeEstimate => SIZE_ESTIMATE.len(),
            Metric::StorageObjects => STORAGE_OBJECTS.len(),
        };
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match parse_sample(metric, line.get(name_len..).unwrap_or_default()) {
            Some((key, value)) => {
                self.samples = self.samples.saturating_add(1);
                let seen = self.seen.entry(key).or_default();
                match metric {
                    Metric::ResourceObjects => seen.resource_objects = Some(value),
                    Metric::SizeEstimate => seen.size_estimate = Some(value),
                    Metric::StorageObjects => seen.storage_objects = Some(value),
                }
            }
            None => self.malformed = self.malformed.saturating_add(1),
        }
    }
}

fn skip_blanks(s: &[u8]) -> &[u8] {
    let n = s.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(s.len());
    s.get(n..).unwrap_or_default()
}

/// Parses what follows the metric name: `[{labels}] value [timestamp]`, as
/// `github.com/prometheus/common/expfmt`'s text parser reads it. Returns the resource key and
/// the value.
fn parse_sample(metric: Metric, s: &[u8]) -> Option<(String, f64)> {
    let mut group: Option<Vec<u8>> = None;
    let mut resource: Option<Vec<u8>> = None;
    let after_name = s;
    let mut s = skip_blanks(s);
    if let Some(labels) = s.strip_prefix(b"{") {
        s = labels;
        loop {
            s = skip_blanks(s);
            if let Some(r) = s.strip_prefix(b"}") {
                s = r;
                break;
            }
            let name_len = s.iter().position(|&b| !(b.is_ascii_alphanumeric() || b == b'_')).unwrap_or(s.len());
            let (name, r) = s.split_at(name_len);
            if name.is_empty() || name.first().is_some_and(u8::is_ascii_digit) {
                return None;
            }
            let r = skip_blanks(r).strip_prefix(b"=")?;
            let r = skip_blanks(r).strip_prefix(b"\"")?;
            let wanted = match name {
                b"group" => Some(&mut group),
                b"resource" => Some(&mut resource),
                _ => None,
            };
            let (value, r) = label_value(r, wanted.is_some())?;
            if let Some(slot) = wanted {
                if slot.is_some() {
                    // A label twice in one sample is an error to expfmt too.
                    return None;
                }
                *slot = Some(value);
            }
            s = skip_blanks(r);
            if let Some(r) = s.strip_prefix(b",") {
                s = r;
            } else if s.first() != Some(&b'}') {
                return None;
            }
        }
        // expfmt needs no blank between `}` and the value.
    } else if s.len() == after_name.len() {
        // Without labels, a blank separates the name from the value.
        return None;
    }
    let s = skip_blanks(s);
    let end = s.iter().position(|&b| b == b' ' || b == b'\t').unwrap_or(s.len());
    let (value, s) = s.split_at(end);
    let value = parse_value(value)?;
    let s = skip_blanks(s);
    let end = s.iter().position(|&b| b == b' ' || b == b'\t').unwrap_or(s.len());
    let (timestamp, s) = s.split_at(end);
    if !timestamp.is_empty() {
        let digits = timestamp.strip_prefix(b"-").unwrap_or(timestamp);
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
    }
    if !skip_blanks(s).is_empty() {
        return None;
    }
    let key = match metric {
        Metric::ResourceObjects | Metric::SizeEstimate => resource_key(group.unwrap_or_default(), resource?)?,
        Metric::StorageObjects => {
            // Its only label is `resource` (a `group` label, if any, is not upstream's).
            let label = resource?;
            match label.iter().position(|&b| b == b'.') {
                None => resource_key(Vec::new(), label)?,
                Some(dot) => {
                    let g = label.get(dot + 1..).unwrap_or_default().to_vec();
                    if g.is_empty() {
                        return None;
                    }
                    resource_key(g, label.get(..dot).unwrap_or_default().to_vec())?
                }
            }
        }
    };
    Some((key, value))
}

/// "resource" for the core group, "group/resource" otherwise; none for an empty resource, a `/`
/// in either part (the key would be ambiguous; upstream's names never have one) or bytes that
/// are not UTF-8.
fn resource_key(group: Vec<u8>, resource: Vec<u8>) -> Option<String> {
    if resource.is_empty() || resource.contains(&b'/') || group.contains(&b'/') {
        return None;
    }
    let resource = String::from_utf8(resource).ok()?;
    if group.is_empty() {
        return Some(resource);
    }
    let mut key = String::from_utf8(group).ok()?;
    key.push('/');
    key.push_str(&resource);
    Some(key)
}

/// A quoted label value after its opening quote: returns it unescaped (when `keep`; else empty)
/// and what follows the closing quote. Escapes are `\\`, `\"` and `\n`; any other is an error.
fn label_value(s: &[u8], keep: bool) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        let rest = s.get(i..)?;
        let n = rest.iter().position(|&b| b == b'"' || b == b'\\')?;
        if keep {
            out.extend_from_slice(rest.get(..n).unwrap_or_default());
        }
        match rest.get(n) {
            Some(b'"') => return Some((out, rest.get(n + 1..).unwrap_or_default())),
            _ => {
                let unescaped = match rest.get(n + 1)? {
                    b'\\' => b'\\',
                    b'"' => b'"',
                    b'n' => b'\n',
                    _ => return None,
                };
                if keep {
                    out.push(unescaped);
                }
                i = i.checked_add(n + 2)?;
            }
        }
    }
}

/// A sample value: a Go `strconv.ParseFloat` float (`50000`, `2e+08`, `1.5`, `NaN`, `+Inf` …).
fn parse_value(v: &[u8]) -> Option<f64> {
    if v.is_empty() || !v.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_heads() {
        assert_eq!(classify(b""), Head::Maybe);
        assert_eq!(classify(b"apis"), Head::Maybe);
        assert_eq!(classify(b"apiserver_"), Head::Maybe);
        assert_eq!(classify(b"apiserver_resource_"), Head::Maybe);
        assert_eq!(classify(b"apiserver_resource_objects"), Head::Maybe);
        assert_eq!(classify(b"apiserver_resource_objects{"), Head::Is(Metric::ResourceObjects));
        assert_eq!(classify(b"apiserver_resource_objects "), Head::Is(Metric::ResourceObjects));
        assert_eq!(classify(b"apiserver_resource_objectsx"), Head::No);
        assert_eq!(classify(b"apiserver_resource_size_estimate_bytes{"), Head::Is(Metric::SizeEstimate));
        assert_eq!(classify(b"apiserver_storage_objects{"), Head::Is(Metric::StorageObjects));
        assert_eq!(classify(b"apiserver_request_total{"), Head::No);
        assert_eq!(classify(b"# HELP apiserver_storage_objects"), Head::No);
        assert_eq!(classify(b"etcd_request"), Head::No);
    }

    #[test]
    fn find_newline_matches_naive() {
        let mut s = vec![b'a'; 40];
        assert_eq!(find_newline(&s), None);
        for i in 0..s.len() {
            s[i] = b'\n';
            assert_eq!(find_newline(&s), Some(i));
            assert_eq!(find_newline(&s[..i]), None);
            s[i] = 0x8a;
            assert_eq!(find_newline(&s), None);
            s[i] = b'\n' ^ 0x01;
            assert_eq!(find_newline(&s), None);
        }
        assert_eq!(find_newline(b"\x0b\x0a"), Some(1));
        assert_eq!(find_newline(b"\x09\x09\x09\x09\x09\x09\x09\x0b\n"), Some(8));
    }

    #[test]
    fn label_values_unescape() {
        assert_eq!(label_value(br#"a\\b\"c\nd" x"#, true), Some((b"a\\b\"c\nd".to_vec(), &b" x"[..])));
        assert_eq!(label_value(br#"a\tb""#, true), None);
        assert_eq!(label_value(br#"abc"#, true), None);
        assert_eq!(label_value(br#"abc\"#, true), None);
    }
}
