//! RequestInfo: what kube-apiserver's `RequestInfoFactory` learns from the method and the request
//! target (`requestinfo.go: RequestInfoFactory.NewRequestInfo`), plus the query-derived list
//! options the work estimator (`list_work_estimator.go: estimate`) and the wait limit
//! (`priority-and-fairness.go: getRequestWaitContext`) need, and the long-running check
//! (`longrunning.go: BasicLongRunningRequestCheck`).
//!
//! Parsing follows upstream exactly (APIPrefixes {api, apis}, GrouplessAPIPrefixes {api},
//! special verbs {proxy, watch}, namespace subresources {status, finalize}, `?watch=` with
//! apimachinery's bool conversion (Go `strings.EqualFold`; `strings.ToLower` when the list
//! options do not decode), `metadata.name` field selector → Name, deletecollection). The path
//! is percent-decoded as Go's `url.ParseRequestURI` does (so `%2F` becomes a `/` and splits a
//! segment, exactly as upstream), the query is parsed as Go's `url.ParseQuery` (pairs with `;`
//! or bad escapes are dropped, `+` means space).
//!
//! Deviation: Go keeps arbitrary bytes in strings; here non-UTF-8 bytes (after decoding) become
//! U+FFFD. Go's HTTP server answers 400 to a target with a bad `%` escape or a control character
//! and `RequestInfoFactory` fails (500) on `/api/v1/watch` style paths lacking a resource; we
//! cannot fail the request from here, so such requests are parsed leniently (bad escapes kept
//! literally) and flagged with [`RequestInfo::invalid`].

use super::selectors;
use crate::duration::parse_go_duration;
use crate::Nanos;

/// Query parameters that matter to APF (first value of each, as Go's `Values.Get`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// `limit` (0 when absent or unparsable).
    pub limit: i64,
    pub continue_token: String,
    pub resource_version: String,
    pub resource_version_match: String,
    /// `sendInitialEvents` (apimachinery's bool conversion: only "0" and "false" under Go's
    /// `strings.EqualFold` are false; absent → None).
    pub send_initial_events: Option<bool>,
    /// `watch` as `RequestInfoFactory` reads it: by the bool conversion when the list options
    /// decode, else only "0" and ASCII-case-insensitive "false" are false.
    pub watch: bool,
    /// Raw first `fieldSelector` value ("" when absent).
    pub field_selector: String,
    /// Raw first `labelSelector` value ("" when absent).
    pub label_selector: String,
    /// `timeoutSeconds` list option.
    pub timeout_seconds: Option<i64>,
    /// `?timeout=` (Go duration), used by `WithRequestDeadline`.
    pub timeout: Option<Nanos>,
    /// `?timeout=` present but not a valid Go duration (upstream answers 400).
    pub timeout_invalid: bool,
    /// Converting the query into `metav1.ListOptions` failed (`limit` / `timeoutSeconds` not an
    /// int64). The LIST estimator then returns max seats (`list_work_estimator.go:
    /// estimate`).
    pub options_error: bool,
    /// The field or label selector does not parse (internal ListOptions decoding fails).
    pub selector_error: bool,
}

impl ListQuery {
    /// Back to [`ListQuery::default`], keeping the strings' buffers.
    fn reset(&mut self) {
        let ListQuery {
            limit,
            continue_token,
            resource_version,
            resource_version_match,
            send_initial_events,
            watch,
            field_selector,
            label_selector,
            timeout_seconds,
            timeout,
            timeout_invalid,
            options_error,
            selector_error,
        } = self;
        for s in [continue_token, resource_version, resource_version_match, field_selector, label_selector] {
            s.clear();
        }
        (*limit, *send_initial_events, *watch, *timeout_seconds, *timeout) = (0, None, false, None, None);
        (*timeout_invalid, *options_error, *selector_error) = (false, false, false);
    }

    /// Internal (`metainternalversion.ListOptions`) decoding failed, as seen by RequestInfo.
    pub fn decode_failed(&self) -> bool {
        self.options_error || self.selector_error
    }
}

/// Upstream `RequestInfo` plus the query digest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub is_resource_request: bool,
    /// Decoded URL path.
    pub path: String,
    pub verb: String,
    pub api_prefix: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// Where upstream's `Parts` are in `path`: the byte range (start, end) of the segments left
    /// after the API prefix, group, version, verb and namespace; read them with
    /// [`RequestInfo::parts`] (kept as a range so the request path allocates no vector).
    pub parts_range: (usize, usize),
    /// `RequestInfo.FieldSelector` (only for list/watch/deletecollection not via path prefix).
    pub field_selector: String,
    /// `RequestInfo.LabelSelector` (same condition).
    pub label_selector: String,
    /// Upstream would fail this request before APF (bad escape → 400, missing resource after a
    /// special verb → 500). Parsed leniently here.
    pub invalid: bool,
    pub query: ListQuery,
}

const API_PREFIXES: [&str; 2] = ["api", "apis"];
const GROUPLESS_API_PREFIXES: [&str; 1] = ["api"];
const LONG_RUNNING_VERBS: [&str; 2] = ["watch", "proxy"];
const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["attach", "exec", "proxy", "log", "portforward"];

impl RequestInfo {
    /// Upstream `RequestInfo.Parts`.
    pub fn parts(&self) -> Vec<String> {
        let (start, end) = self.parts_range;
        Segments(self.path.get(start..end).unwrap_or_default()).map(String::from).collect()
    }
    /// kube-apiserver's `LongRunningFunc` (`longrunning.go: BasicLongRunningRequestCheck`): verbs
    /// {watch, proxy}; subresources {attach, exec, proxy, log, portforward} of resource requests;
    /// non-resource paths under `/debug/pprof/`.
    pub fn is_long_running(&self) -> bool {
        LONG_RUNNING_VERBS.contains(&self.verb.as_str())
            || if self.is_resource_request {
                LONG_RUNNING_SUBRESOURCES.contains(&self.subresource.as_str())
            } else {
                self.path.starts_with("/debug/pprof/")
            }
    }

    /// `isWatchRequest` of the APF filter: verb `watch`.
    pub fn is_watch(&self) -> bool {
        self.verb == "watch"
    }
}

/// The byte the two hex digits at the start of `s` spell.
pub(crate) fn hex_byte(s: &[u8]) -> Option<u8> {
    let digit = |i: usize| char::from(*s.get(i)?).to_digit(16);
    u8::try_from(digit(0)? * 16 + digit(1)?).ok()
}

/// Percent-decodes `s`. `plus_is_space` for query components. Returns the bytes and whether a
/// malformed escape was seen (malformed escapes are kept literally).
fn percent_decode(s: &[u8], plus_is_space: bool) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(s.len());
    let mut bad = false;
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        i += 1;
        match b {
            b'%' => {
                let decoded = s.get(i..).and_then(hex_byte);
                bad |= decoded.is_none();
                i += if decoded.is_some() { 2 } else { 0 };
                out.push(decoded.unwrap_or(b));
            }
            b'+' if plus_is_space => out.push(b' '),
            _ => out.push(b),
        }
    }
    (out, bad)
}

fn lossy(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Appends `b` to `out`, non-UTF-8 sequences replaced by U+FFFD (`String::from_utf8_lossy`);
/// valid UTF-8 (the common case) is validated once and copied.
fn push_lossy(out: &mut String, b: &[u8]) {
    match std::str::from_utf8(b) {
        Ok(s) => out.push_str(s),
        Err(_) => out.push_str(&String::from_utf8_lossy(b)),
    }
}

/// `buf` becomes `s`, in the buffer it has.
fn set(buf: &mut String, s: &str) {
    buf.clear();
    buf.push_str(s);
}

/// Go `url.ParseQuery`: ordered (key, value) pairs; malformed pairs are dropped.
pub fn parse_query(raw: &[u8]) -> Vec<(String, String)> {
    let pairs = raw.split(|&b| b == b'&').filter(|pair| !pair.is_empty() && !pair.contains(&b';'));
    pairs
        .filter_map(|pair| {
            let mut kv = pair.splitn(2, |&b| b == b'=');
            let (k, kbad) = percent_decode(kv.next().unwrap_or_default(), true);
            let (v, vbad) = percent_decode(kv.next().unwrap_or_default(), true);
            (!kbad && !vbad).then(|| (lossy(k), lossy(v)))
        })
        .collect()
}

/// Go's `strings.EqualFold(value, target)` for an ASCII `target`: equal under Unicode simple
/// case folding. Go compares rune by rune; the only non-ASCII runes whose simple-fold orbit
/// holds an ASCII letter are U+017F `ſ` (with `s`, `S`) and U+212A KELVIN SIGN (with `k`, `K`),
/// so apart from ASCII case those two are all that can match. A non-ASCII character of `target`
/// matches only itself (the function is meant for ASCII targets).
///
/// Go decodes invalid UTF-8 as U+FFFD per bad byte, here a value was decoded lossily (one U+FFFD
/// per bad sequence); U+FFFD folds to no ASCII character, so either way the value is unequal.
pub fn equal_fold_ascii(value: &str, target: &str) -> bool {
    let folds = |c: char, t: char| {
        c.eq_ignore_ascii_case(&t)
            || match c {
                '\u{17F}' => t.eq_ignore_ascii_case(&'s'),
                '\u{212A}' => t.eq_ignore_ascii_case(&'k'),
                _ => false,
            }
    };
    let mut target = target.chars();
    value.chars().all(|c| target.next().is_some_and(|t| folds(c, t))) && target.next().is_none()
}

/// apimachinery's bool conversion of a query parameter's first value (`conversion.go:
/// Convert_Slice_string_To_bool`, `Convert_Slice_string_To_Pointer_bool`): false for "0" and
/// for what `strings.EqualFold` finds equal to "false" (`FALſE` included); anything else, the
/// empty value included, is true.
fn convert_bool(v: &str) -> bool {
    !(v == "0" || equal_fold_ascii(v, "false"))
}

/// `requestinfo.go: NewRequestInfo`'s reading of `watch` when the list options do not decode:
/// true unless `strings.ToLower(v)` is "false" or "0". Go's `unicode.ToLower` maps no non-ASCII
/// rune to one of those characters, so only ASCII case is ignored (`falſe` is true here).
fn lower_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

/// [`parse_list_query`] into `q`, whose strings' buffers are reused for the common empty query.
fn parse_list_query_into(q: &mut ListQuery, raw_query: &[u8]) {
    if raw_query.is_empty() {
        q.reset();
    } else {
        *q = parse_list_query(raw_query);
    }
}

/// The list options of a raw query. Integers parse as Go's `strconv.ParseInt(s, 10, 64)` does.
fn parse_list_query(raw_query: &[u8]) -> ListQuery {
    if raw_query.is_empty() {
        // Fast path for the common empty query: every option absent, empty selectors parse.
        return ListQuery::default();
    }
    let q = parse_query(raw_query);
    let get = |key: &str| q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let text = |key| get(key).unwrap_or_default().to_string();
    let limit = get("limit").map(str::parse::<i64>).transpose();
    let timeout_seconds = get("timeoutSeconds").map(str::parse::<i64>).transpose();
    let timeout = get("timeout").filter(|t| !t.is_empty()).map(parse_go_duration).transpose();
    let (field_selector, label_selector) = (text("fieldSelector"), text("labelSelector"));
    let options_error = limit.is_err() || timeout_seconds.is_err();
    let selector_error = selectors::parse_field_selector(&field_selector).is_none() || !selectors::label_selector_is_valid(&label_selector);
    // `requestinfo.go: NewRequestInfo`: decoded options give `watch` by the conversion; when
    // decoding fails, the options are reset and only `watch` is read again, lowercased.
    let watch_bool = if options_error || selector_error { lower_bool } else { convert_bool };
    ListQuery {
        options_error,
        limit: limit.ok().flatten().unwrap_or(0),
        timeout_seconds: timeout_seconds.ok().flatten(),
        continue_token: text("continue"),
        resource_version: text("resourceVersion"),
        resource_version_match: text("resourceVersionMatch"),
        send_initial_events: get("sendInitialEvents").map(convert_bool),
        watch: get("watch").is_some_and(watch_bool),
        selector_error,
        field_selector,
        label_selector,
        timeout_invalid: timeout.is_err(),
        timeout: timeout.ok().flatten(),
    }
}

/// Splits a request target: its path decoded into `path` (cleared first), and (raw query,
/// malformed flag).
fn split_target<'t>(path_and_query: &'t [u8], path: &mut String) -> (&'t [u8], bool) {
    let (raw_path, raw_query) = match path_and_query.iter().position(|&b| b == b'?') {
        Some(q) => (path_and_query.get(..q).unwrap_or_default(), path_and_query.get(q + 1..).unwrap_or_default()),
        None => (path_and_query, &[][..]),
    };
    // A fold (no early exit) the compiler vectorizes.
    let ctl = path_and_query.iter().fold(false, |ctl, &b| ctl | (b < 0x20) | (b == 0x7f));
    path.clear();
    if !raw_path.contains(&b'%') {
        // Fast path (the common case): nothing to decode.
        push_lossy(path, raw_path);
        return (raw_query, ctl);
    }
    let (decoded, bad) = percent_decode(raw_path, false);
    push_lossy(path, &decoded);
    (raw_query, bad || ctl)
}

/// `path` without its leading and trailing `/` (upstream's `strings.Trim(path, "/")`), and
/// where that ends in `path`.
fn trim_slashes(path: &str) -> (&str, usize) {
    let b = path.as_bytes();
    let end = b.iter().rposition(|&c| c != b'/').map_or(0, |i| i + 1);
    let start = b.iter().position(|&c| c != b'/').unwrap_or(end);
    (path.get(start..end).unwrap_or_default(), end)
}

/// The segments of a path as upstream's `splitPath` yields them (`strings.Trim(path, "/")`,
/// then `strings.Split(…, "/")`, nothing for an empty path), borrowed: the text of the
/// segments not consumed yet. Copying it peeks without consuming.
#[derive(Clone, Copy)]
struct Segments<'a>(&'a str);

impl<'a> Iterator for Segments<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        if self.0.is_empty() {
            return None;
        }
        // The text never ends with '/' (trimmed), so no trailing empty segment is lost. A byte
        // search: `split_once('/')` goes through the slower char searcher.
        let end = self.0.bytes().position(|b| b == b'/').unwrap_or(self.0.len());
        let seg = self.0.get(..end);
        self.0 = self.0.get(end + 1..).unwrap_or_default();
        seg
    }
}

impl<'a> Segments<'a> {
    fn peek(mut self) -> Option<&'a str> {
        self.next()
    }
    fn peek3(mut self) -> [Option<&'a str>; 3] {
        [self.next(), self.next(), self.next()]
    }
}

/// Generic-mode RequestInfo: a non-resource request with verb = lowercase method; the
/// namespace comes from a header (for ByNamespace distinguishers). Non-UTF-8 header bytes are
/// replaced by U+FFFD.
pub fn parse_generic(method: &str, path_and_query: &[u8], namespace: Option<&[u8]>) -> RequestInfo {
    let mut info = RequestInfo::default();
    parse_generic_into(&mut info, method, path_and_query, namespace);
    info
}

/// [`parse_generic`] into `info` (every field rewritten; its strings' buffers reused).
pub fn parse_generic_into(info: &mut RequestInfo, method: &str, path_and_query: &[u8], namespace: Option<&[u8]>) {
    let (raw_query, bad) = split_target(path_and_query, &mut info.path);
    parse_list_query_into(&mut info.query, raw_query);
    non_resource(info, method, bad);
    if let Some(n) = namespace {
        push_lossy(&mut info.namespace, n.trim_ascii());
    }
}

/// The verb of a resource request not named by the path (`POST` → create, …), by method:
/// case-sensitive, as `requestinfo.go: NewRequestInfo`'s `switch req.Method` (`get` → "").
fn method_verb(method: &str) -> &'static str {
    const VERBS: [(&str, &str); 6] =
        [("POST", "create"), ("GET", "get"), ("HEAD", "get"), ("PUT", "update"), ("PATCH", "patch"), ("DELETE", "delete")];
    VERBS.iter().find(|(m, _)| *m == method).map_or("", |(_, verb)| verb)
}

/// kube-apiserver's `RequestInfoFactory.NewRequestInfo` (`requestinfo.go`).
pub fn parse_request_info(method: &str, path_and_query: &[u8]) -> RequestInfo {
    let mut info = RequestInfo::default();
    parse_request_info_into(&mut info, method, path_and_query);
    info
}

/// [`parse_request_info`] into `info`: every field rewritten, its strings' buffers reused, so
/// that a request like the previous one allocates nothing. Works on borrowed path segments.
pub fn parse_request_info_into(info: &mut RequestInfo, method: &str, path_and_query: &[u8]) {
    let (raw_query, bad) = split_target(path_and_query, &mut info.path);
    parse_list_query_into(&mut info.query, raw_query);
    let (trimmed, parts_end) = trim_slashes(&info.path);
    let mut cur = Segments(trimmed);
    let Some((api_prefix, api_group, api_version)) = take_api_version(&mut cur) else {
        return non_resource(info, method, bad);
    };
    let mut invalid = bad;
    let (verb, verb_via_path) = take_verb(&mut cur, method);
    let namespace = take_namespace(&mut cur);

    // `cur` now holds upstream's `Parts`: resource/name/subresource/...
    let [resource, name, subresource] = cur.peek3();
    let subresource = subresource.filter(|_| verb != "proxy").unwrap_or_default();
    let resource = resource.unwrap_or_default();
    // An empty path segment (`/api/v1//pods`) yields an empty resource, as upstream's
    // splitPath does; kube-apiserver then answers 404. Flag it so callers know.
    if resource.is_empty() {
        invalid = true;
    }
    let (verb, pinned) = collection_verb(verb, name.unwrap_or_default(), &info.query);
    let keep_selectors = !verb_via_path && matches!(verb, "list" | "watch" | "deletecollection");
    // `cur` is a suffix of the trimmed path: its range in `path`.
    info.parts_range = (parts_end.saturating_sub(cur.0.len()), parts_end);
    let fields = [
        (&mut info.verb, verb),
        (&mut info.api_prefix, api_prefix),
        (&mut info.api_group, api_group),
        (&mut info.api_version, api_version),
        (&mut info.namespace, namespace),
        (&mut info.resource, resource),
        (&mut info.subresource, subresource),
        (&mut info.name, pinned.as_deref().unwrap_or_else(|| name.unwrap_or_default())),
    ];
    for (buf, s) in fields {
        set(buf, s);
    }
    info.field_selector.clear();
    info.label_selector.clear();
    if keep_selectors {
        info.field_selector.push_str(&info.query.field_selector);
        info.label_selector.push_str(&info.query.label_selector);
    }
    (info.is_resource_request, info.invalid) = (true, invalid);
}

/// The API prefix, group ("" under a groupless prefix) and version, consumed from `cur`; `None`
/// for a non-resource request (upstream: an unknown prefix, or too few segments after it).
#[inline]
fn take_api_version<'a>(cur: &mut Segments<'a>) -> Option<(&'a str, &'a str, &'a str)> {
    let api_prefix = match cur.peek3() {
        [Some(p), Some(_), Some(_)] if API_PREFIXES.contains(&p) => p,
        _ => return None,
    };
    cur.next();
    let mut api_group = "";
    if !GROUPLESS_API_PREFIXES.contains(&api_prefix) {
        let [Some(group), Some(_), Some(_)] = cur.peek3() else {
            return None;
        };
        api_group = group;
        cur.next();
    }
    // At least two segments remain here (checked above), so the version is always present.
    let api_version = cur.next().unwrap_or_default();
    Some((api_prefix, api_group, api_version))
}

/// The verb: a special verb of the path (`proxy`, `watch`; consumed, and `true`), else the
/// method's.
#[inline]
fn take_verb<'a>(cur: &mut Segments<'a>, method: &str) -> (&'a str, bool) {
    match cur.peek() {
        // Nothing after the verb: upstream fails with "unable to determine kind and namespace
        // from url" (500); here the resource stays empty, which flags the request invalid.
        Some(v @ ("proxy" | "watch")) => {
            cur.next();
            (v, true)
        }
        _ => (method_verb(method), false),
    }
}

/// The namespace of `namespaces/{ns}/…` ("" otherwise), both segments consumed unless nothing
/// or a namespace subresource (`status`, `finalize`) follows: then the parts name the namespace
/// object itself (resource `namespaces`, name `{ns}`).
#[inline]
fn take_namespace<'a>(cur: &mut Segments<'a>) -> &'a str {
    // Each segment is scanned once here: peeking only as far as needed is measurably faster.
    let mut namespace = "";
    let mut after = *cur;
    if after.next() == Some("namespaces") {
        if let Some(ns) = after.next() {
            namespace = ns;
            if after.peek().is_some_and(|t| t != "status" && t != "finalize") {
                *cur = after;
            }
        }
    }
    namespace
}

/// The collection verbs of a request without a name: `get` becomes `list` or `watch` (the name
/// then pinned by a `metadata.name` field selector, if any: returned), `delete` becomes
/// `deletecollection`.
#[inline]
fn collection_verb<'a>(mut verb: &'a str, name: &str, query: &ListQuery) -> (&'a str, Option<String>) {
    let mut pinned = None;
    if name.is_empty() && verb == "get" {
        verb = if query.watch { "watch" } else { "list" };
        // When decoding the list options fails, only `watch` is read. (An absent selector pins
        // nothing: not parsed.)
        if !query.field_selector.is_empty() && !query.decode_failed() {
            let terms = selectors::parse_field_selector(&query.field_selector).unwrap_or_default();
            let n = selectors::requires_exact_match(&terms, "metadata.name");
            pinned = n.filter(|n| is_valid_path_segment_name(n)).map(str::to_string);
        }
    }
    if name.is_empty() && verb == "delete" {
        verb = "deletecollection";
    }
    (verb, pinned)
}

/// A request that is not a resource request: verb = lowercase method, every resource field
/// empty (`path` and `query` already set).
fn non_resource(info: &mut RequestInfo, method: &str, invalid: bool) {
    (info.is_resource_request, info.parts_range, info.invalid) = (false, (0, 0), invalid);
    info.verb.clear();
    info.verb.extend(method.chars().map(|c| c.to_ascii_lowercase()));
    let empty = [
        &mut info.api_prefix,
        &mut info.api_group,
        &mut info.api_version,
        &mut info.namespace,
        &mut info.resource,
        &mut info.subresource,
        &mut info.name,
        &mut info.field_selector,
        &mut info.label_selector,
    ];
    for s in empty {
        s.clear();
    }
}

/// `path.IsValidPathSegmentName`: not "." or "..", and no "/" or "%".
fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}
