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

use crate::digest::work_estimate::{resource_key, ObjectStats};
use std::collections::BTreeMap;

/// The longest kept line (bytes before its newline, a `\r` included): a longer line of the three
/// metrics is dropped and counted as malformed.
pub const MAX_LINE: usize = 64 * 1024;

/// The three metrics, in the order of the values kept for each resource.
const METRICS: [&[u8]; 3] = [b"apiserver_resource_objects", b"apiserver_resource_size_estimate_bytes", b"apiserver_storage_objects"];
const STORAGE_OBJECTS: usize = 2;
/// Bytes that decide whether a line is one of the three: the longest name and one more.
const HEAD: usize = 39;

/// Which of the three metrics `line` is a sample of (its name, then the line's end or a byte
/// that cannot continue a name), and what follows the name.
fn metric_of(line: &[u8]) -> Option<(usize, &[u8])> {
    METRICS.iter().enumerate().find_map(|(i, name)| {
        let rest = line.strip_prefix(*name)?;
        let continues_name = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':');
        (!rest.first().is_some_and(continues_name)).then_some((i, rest))
    })
}

/// Index of the first `\n` in `s`, eight bytes at a time.
fn find_newline(s: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    // `x` (the word with every byte xor '\n') has a zero byte iff the word has a '\n'.
    let no_newline = |w: &[u8]| {
        let x = u64::from_le_bytes(w.try_into().unwrap_or([b'\n'; 8])) ^ (LO * u64::from(b'\n'));
        x.wrapping_sub(LO) & !x & (LO << 7) == 0
    };
    let skip = s.chunks_exact(8).take_while(|w| no_newline(w)).count() * 8;
    s.get(skip..)?.iter().position(|&b| b == b'\n').map(|i| skip + i)
}

/// Streaming scanner of a kube-apiserver `/metrics` body: [`MetricsScanner::feed`] the body in
/// chunks cut anywhere, then [`MetricsScanner::finish`].
#[derive(Debug, Clone, Default)]
pub struct MetricsScanner {
    /// The current line so far, leading blanks dropped (only its head when of no interest).
    line: Vec<u8>,
    /// The rest of the current line is of no interest (another metric, or an overlong one).
    skip: bool,
    /// Per resource key, the last value of each metric.
    seen: BTreeMap<String, [Option<f64>; 3]>,
    malformed: u64,
    samples: u64,
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
        MetricsScanner::default()
    }

    /// Feeds the next bytes of the body; chunk boundaries may fall anywhere.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while let Some(nl) = find_newline(chunk) {
            self.extend(chunk.get(..nl).unwrap_or_default());
            self.end_line();
            chunk = chunk.get(nl + 1..).unwrap_or_default();
        }
        self.extend(chunk);
    }

    /// Ends the input (a last line without a newline counts) and merges what was seen.
    pub fn finish(mut self) -> ScrapedCounts {
        self.end_line();
        let valid = |v: Option<f64>| v.filter(|v| v.is_finite() && *v >= 0.0);
        let entries = self.seen.into_iter().filter_map(|(key, [objects, size, storage_objects])| {
            // `as` truncates toward zero and saturates at the i64 range.
            let count = valid(objects).or_else(|| valid(storage_objects))? as i64;
            let average_object_size_bytes = match valid(size) {
                Some(size) if count > 0 => (size as i64) / count,
                _ => 0,
            };
            Some((key, ObjectStats { count, average_object_size_bytes }))
        });
        ScrapedCounts { entries: entries.collect(), malformed: self.malformed, samples: self.samples }
    }

    /// Appends a piece of the current line, deciding on its first [`HEAD`] bytes whether to keep
    /// it at all.
    fn extend(&mut self, piece: &[u8]) {
        if self.skip {
            return;
        }
        let piece = if self.line.is_empty() { skip_blanks(piece) } else { piece };
        let (head, rest) = piece.split_at(HEAD.saturating_sub(self.line.len()).min(piece.len()));
        self.line.extend_from_slice(head);
        if self.line.len() < HEAD {
            return;
        }
        if metric_of(&self.line).is_none() {
            self.skip = true;
        } else if self.line.len().saturating_add(rest.len()) > MAX_LINE {
            self.malformed = self.malformed.saturating_add(1);
            self.skip = true;
            self.line = Vec::new();
        } else {
            self.line.extend_from_slice(rest);
        }
    }

    /// At a line's end: parses the kept line, if it is a sample of one of the three metrics.
    fn end_line(&mut self) {
        let line = self.line.strip_suffix(b"\r").unwrap_or(&self.line);
        if let Some((metric, rest)) = metric_of(line).filter(|_| !self.skip) {
            match parse_sample(metric, rest) {
                Some((key, value)) => {
                    self.samples = self.samples.saturating_add(1);
                    if let Some(v) = self.seen.entry(key).or_default().get_mut(metric) {
                        *v = Some(value);
                    }
                }
                None => self.malformed = self.malformed.saturating_add(1),
            }
        }
        self.line.clear();
        self.skip = false;
    }
}

fn skip_blanks(s: &[u8]) -> &[u8] {
    let n = s.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(s.len());
    s.get(n..).unwrap_or_default()
}

/// Parses what follows the metric name: `[{labels}] value [timestamp]`, as
/// `github.com/prometheus/common/expfmt`'s text parser reads it. Returns the resource key and
/// the value.
fn parse_sample(metric: usize, after_name: &[u8]) -> Option<(String, f64)> {
    let (mut group, mut resource) = (None, None);
    let mut s = skip_blanks(after_name);
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
            if name.first().is_none_or(u8::is_ascii_digit) {
                return None;
            }
            let r = skip_blanks(r).strip_prefix(b"=")?;
            let (value, r) = label_value(skip_blanks(r).strip_prefix(b"\"")?)?;
            let slot = match name {
                b"group" => &mut group,
                b"resource" => &mut resource,
                _ => &mut None,
            };
            // A label twice in one sample is an error to expfmt too.
            if slot.replace(value).is_some() {
                return None;
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
    let mut fields = s.split(|&b| b == b' ' || b == b'\t').filter(|f| !f.is_empty());
    // A Go `strconv.ParseFloat` float (`50000`, `2e+08`, `1.5`, `NaN`, `+Inf` …).
    let value: f64 = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    // Then, optionally, an integer timestamp.
    let timestamp = |t: &[u8]| {
        let digits = t.strip_prefix(b"-").unwrap_or(t);
        !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
    };
    if !fields.next().is_none_or(timestamp) || fields.next().is_some() {
        return None;
    }
    let resource = resource?;
    let (group, resource) = if metric == STORAGE_OBJECTS {
        // Its only label is `resource` (a `group` label, if any, is not upstream's).
        let mut parts = resource.splitn(2, |&b| b == b'.');
        let r = parts.next().unwrap_or_default();
        match parts.next() {
            Some([]) => return None,
            g => (g.unwrap_or_default(), r),
        }
    } else {
        (group.as_deref().unwrap_or_default(), resource.as_slice())
    };
    // None for an empty resource, a `/` in either part (the key would be ambiguous; upstream's
    // names never have one) or bytes that are not UTF-8.
    if resource.is_empty() || resource.contains(&b'/') || group.contains(&b'/') {
        return None;
    }
    Some((resource_key(std::str::from_utf8(group).ok()?, std::str::from_utf8(resource).ok()?), value))
}

/// A quoted label value after its opening quote: returns it unescaped and what follows the
/// closing quote. Escapes are `\\`, `\"` and `\n`; any other is an error.
fn label_value(mut s: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::new();
    loop {
        let n = s.iter().position(|&b| b == b'"' || b == b'\\')?;
        let (plain, r) = s.split_at(n);
        out.extend_from_slice(plain);
        let (unescaped, r) = match r {
            [b'"', r @ ..] => return Some((out, r)),
            [_, e @ (b'\\' | b'"'), r @ ..] => (*e, r),
            [_, b'n', r @ ..] => (b'\n', r),
            _ => return None,
        };
        out.push(unescaped);
        s = r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_of_heads() {
        for no in [&b""[..], b"apis", b"apiserver_", b"apiserver_resource_", b"apiserver_resource_objectsx"] {
            assert_eq!(metric_of(no), None);
        }
        // Exactly a name: a sample without a value, which the parser rejects.
        assert_eq!(metric_of(b"apiserver_resource_objects"), Some((0, &b""[..])));
        assert_eq!(metric_of(b"apiserver_resource_objects{"), Some((0, &b"{"[..])));
        assert_eq!(metric_of(b"apiserver_resource_objects "), Some((0, &b" "[..])));
        assert_eq!(metric_of(b"apiserver_resource_size_estimate_bytes{"), Some((1, &b"{"[..])));
        assert_eq!(metric_of(b"apiserver_storage_objects{"), Some((STORAGE_OBJECTS, &b"{"[..])));
        assert_eq!(metric_of(b"apiserver_request_total{"), None);
        assert_eq!(metric_of(b"# HELP apiserver_storage_objects"), None);
        assert_eq!(metric_of(b"etcd_request"), None);
        assert!(METRICS.iter().all(|m| m.len() < HEAD));
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
        assert_eq!(label_value(br#"a\\b\"c\nd" x"#), Some((b"a\\b\"c\nd".to_vec(), &b" x"[..])));
        assert_eq!(label_value(br#"a\tb""#), None);
        assert_eq!(label_value(br#"abc"#), None);
        assert_eq!(label_value(br#"abc\"#), None);
    }
}
