//! RequestInfo: what kube-apiserver's `RequestInfoFactory` learns from the method and the request
//! target (`requestinfo.go: RequestInfoFactory.NewRequestInfo`), plus the query-derived list
//! options the work estimator (`list_work_estimator.go: estimate`) and the wait limit
//! (`priority-and-fairness.go: getRequestWaitContext`) need, and the long-running check
//! (`longrunning.go: BasicLongRunningRequestCheck`).
//!
//! Parsing follows upstream exactly (APIPrefixes {api, apis}, GrouplessAPIPrefixes {api},
//! special verbs {proxy, watch}, namespace subresources {status, finalize}, `?watch=` with the
//! lenient apimachinery bool conversion, `metadata.name` field selector → Name,
//! deletecollection). The path is percent-decoded as Go's `url.ParseRequestURI` does (so `%2F`
//! becomes a `/` and splits a segment, exactly as upstream), the query is parsed as Go's
//! `url.ParseQuery` (pairs with `;` or bad escapes are dropped, `+` means space).
//!
//! Deviation: Go keeps arbitrary bytes in strings; here non-UTF-8 bytes (after decoding) become
//! U+FFFD. Go's HTTP server answers 400 to a target with a bad `%` escape or a control character
//! and `RequestInfoFactory` fails (500) on `/api/v1/watch` style paths lacking a resource; we
//! cannot fail the request from here, so such requests are parsed leniently (bad escapes kept
//! literally) and flagged with [`RequestInfo::invalid`].

use crate::duration::parse_go_duration;
use crate::Nanos;

/// Query parameters that matter to APF (first value of each, as Go's `Values.Get`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// `limit` (0 when absent or unparsable).
    pub limit: i64,
    /// `continue` token.
    pub continue_token: String,
    pub resource_version: String,
    pub resource_version_match: String,
    /// `sendInitialEvents` (lenient bool: only "0"/"false" are false; absent → None).
    pub send_initial_events: Option<bool>,
    /// `watch` (lenient bool).
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
    /// Where upstream's `Parts` are in `path`: (byte offset, byte length, segment count) of the
    /// segments left after the API prefix, group, version, verb and namespace; read them with
    /// [`RequestInfo::parts`] (kept as a range so the request path allocates no vector).
    pub parts_range: (usize, usize, usize),
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
        let (at, len, count) = self.parts_range;
        let rest = self.path.get(at..at.saturating_add(len)).unwrap_or_default();
        Segments { rest, len: count }.to_vec()
    }
    /// kube-apiserver's `LongRunningFunc` (`longrunning.go: BasicLongRunningRequestCheck`): verbs
    /// {watch, proxy}; subresources {attach, exec, proxy, log, portforward} of resource requests;
    /// non-resource paths under `/debug/pprof/`.
    pub fn is_long_running(&self) -> bool {
        if LONG_RUNNING_VERBS.contains(&self.verb.as_str()) {
            return true;
        }
        if self.is_resource_request {
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

fn unhex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes `s`. `plus_is_space` for query components. Returns the bytes and whether a
/// malformed escape was seen (malformed escapes are kept literally).
fn percent_decode(s: &[u8], plus_is_space: bool) -> (Vec<u8>, bool) {
    let mut out = Vec::with_capacity(s.len());
    let mut bad = false;
    let mut i = 0;
    while let Some(&b) = s.get(i) {
        if b == b'%' {
            let hi = s.get(i + 1).copied().and_then(unhex);
            let lo = s.get(i + 2).copied().and_then(unhex);
            if let (Some(h), Some(l)) = (hi, lo) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
            bad = true;
            out.push(b);
        } else if b == b'+' && plus_is_space {
            out.push(b' ');
        } else {
            out.push(b);
        }
        i += 1;
    }
    (out, bad)
}

fn lossy(b: Vec<u8>) -> String {
    match String::from_utf8(b) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Go `url.ParseQuery`: ordered (key, value) pairs; malformed pairs are dropped.
pub fn parse_query(raw: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for pair in raw.split(|&b| b == b'&') {
        if pair.is_empty() || pair.contains(&b';') {
            continue;
        }
        let (k, v) = match pair.iter().position(|&b| b == b'=') {
            Some(i) => (pair.get(..i).unwrap_or_default(), pair.get(i + 1..).unwrap_or_default()),
            None => (pair, &[][..]),
        };
        let (k, kbad) = percent_decode(k, true);
        let (v, vbad) = percent_decode(v, true);
        if kbad || vbad {
            continue;
        }
        out.push((lossy(k), lossy(v)));
    }
    out
}

fn first<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// apimachinery's lenient bool conversion: only "0" and "false" (any case) are false.
fn lenient_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

/// Go `strconv.ParseInt(s, 10, 64)`.
pub(crate) fn go_parse_i64(s: &str) -> Option<i64> {
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, s.get(1..)?),
        Some(b'+') => (false, s.get(1..)?),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut v: i128 = 0;
    for b in digits.bytes() {
        v = v.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
        if v > i128::from(i64::MAX) + 1 {
            return None;
        }
    }
    let v = if neg { -v } else { v };
    i64::try_from(v).ok()
}

fn parse_list_query(q: &[(String, String)]) -> ListQuery {
    let mut lq = ListQuery::default();
    if let Some(v) = first(q, "limit") {
        match go_parse_i64(v) {
            Some(n) => lq.limit = n,
            None => lq.options_error = true,
        }
    }
    if let Some(v) = first(q, "timeoutSeconds") {
        match go_parse_i64(v) {
            Some(n) => lq.timeout_seconds = Some(n),
            None => lq.options_error = true,
        }
    }
    lq.continue_token = first(q, "continue").unwrap_or_default().to_string();
    lq.resource_version = first(q, "resourceVersion").unwrap_or_default().to_string();
    lq.resource_version_match = first(q, "resourceVersionMatch").unwrap_or_default().to_string();
    lq.send_initial_events = first(q, "sendInitialEvents").map(lenient_bool);
    lq.watch = first(q, "watch").map(lenient_bool).unwrap_or(false);
    lq.field_selector = first(q, "fieldSelector").unwrap_or_default().to_string();
    lq.label_selector = first(q, "labelSelector").unwrap_or_default().to_string();
    if selectors::parse_field_selector(&lq.field_selector).is_none()
        || !selectors::label_selector_is_valid(&lq.label_selector)
    {
        lq.selector_error = true;
    }
    if let Some(t) = first(q, "timeout") {
        if !t.is_empty() {
            match parse_go_duration(t) {
                Ok(d) => lq.timeout = Some(d),
                Err(_) => lq.timeout_invalid = true,
            }
        }
    }
    lq
}

/// Splits a request target into (decoded path, raw query, malformed flag).
fn split_target(path_and_query: &[u8]) -> (String, &[u8], bool) {
    let (raw_path, raw_query) = match path_and_query.iter().position(|&b| b == b'?') {
        Some(i) => (
            path_and_query.get(..i).unwrap_or_default(),
            path_and_query.get(i + 1..).unwrap_or_default(),
        ),
        None => (path_and_query, &[][..]),
    };
    let ctl = path_and_query.iter().any(|&b| b < 0x20 || b == 0x7f);
    if !raw_path.contains(&b'%') {
        // Nothing to decode: one allocation for the path.
        return (String::from_utf8_lossy(raw_path).into_owned(), raw_query, ctl);
    }
    let (path, bad) = percent_decode(raw_path, false);
    (lossy(path), raw_query, bad || ctl)
}

/// The list options of a raw query (no parsing at all for the common empty query).
fn list_query_of(raw_query: &[u8]) -> ListQuery {
    if raw_query.is_empty() {
        // `parse_list_query(&[])`: every option absent, empty selectors parse.
        return ListQuery::default();
    }
    parse_list_query(&parse_query(raw_query))
}

/// The segments of a path split as upstream's `splitPath` does (`strings.Trim(path, "/")`,
/// then `strings.Split(…, "/")`, nothing for an empty path), borrowed, with the remaining
/// count known up front.
#[derive(Clone, Copy)]
struct Segments<'a> {
    rest: &'a str,
    len: usize,
}

impl<'a> Segments<'a> {
    fn new(path: &'a str) -> Self {
        // `strings.Trim(path, "/")` on bytes ('/' is ASCII, so the cuts are char boundaries).
        let b = path.as_bytes();
        let start = b.iter().position(|&c| c != b'/').unwrap_or(b.len());
        let end = b.iter().rposition(|&c| c != b'/').map_or(start, |i| i + 1);
        let t = path.get(start..end.max(start)).unwrap_or_default();
        let len = if t.is_empty() { 0 } else { t.bytes().filter(|&c| c == b'/').count() + 1 };
        Segments { rest: t, len }
    }
    fn len(&self) -> usize {
        self.len
    }
    fn advance(&mut self) -> Option<&'a str> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        match self.rest.bytes().position(|c| c == b'/') {
            Some(i) => {
                let seg = self.rest.get(..i).unwrap_or_default();
                self.rest = self.rest.get(i + 1..).unwrap_or_default();
                Some(seg)
            }
            None => {
                let seg = self.rest;
                self.rest = "";
                Some(seg)
            }
        }
    }
    /// The first three segments (without consuming them).
    fn peek3(&self) -> [Option<&'a str>; 3] {
        let mut c = *self;
        [c.advance(), c.advance(), c.advance()]
    }
    fn first(&self) -> Option<&'a str> {
        let mut c = *self;
        c.advance()
    }
    fn to_vec(mut self) -> Vec<String> {
        let mut out = Vec::with_capacity(self.len);
        while let Some(s) = self.advance() {
            out.push(s.to_string());
        }
        out
    }
}

/// Generic-mode RequestInfo: a non-resource request with verb = lowercase method; the
/// namespace comes from a header (for ByNamespace distinguishers). Non-UTF-8 header bytes are
/// replaced by U+FFFD.
pub fn parse_generic(method: &str, path_and_query: &[u8], namespace: Option<&[u8]>) -> RequestInfo {
    let (path, raw_query, bad) = split_target(path_and_query);
    RequestInfo {
        is_resource_request: false,
        path,
        verb: method.to_ascii_lowercase(),
        namespace: namespace.map(|n| String::from_utf8_lossy(n.trim_ascii()).into_owned()).unwrap_or_default(),
        invalid: bad,
        query: list_query_of(raw_query),
        ..RequestInfo::default()
    }
}

/// The verb of a resource request not named by the path (`POST` → create, …), by method.
fn method_verb(method: &str) -> &'static str {
    let is = |m: &str| method.eq_ignore_ascii_case(m);
    if is("POST") {
        "create"
    } else if is("GET") || is("HEAD") {
        "get"
    } else if is("PUT") {
        "update"
    } else if is("PATCH") {
        "patch"
    } else if is("DELETE") {
        "delete"
    } else {
        ""
    }
}

/// kube-apiserver's `RequestInfoFactory.NewRequestInfo` (`requestinfo.go`).
///
/// Works on borrowed path segments and allocates only the final fields.
pub fn parse_request_info(method: &str, path_and_query: &[u8]) -> RequestInfo {
    let (path, raw_query, bad) = split_target(path_and_query);
    let query = list_query_of(raw_query);
    let mut cur = Segments::new(&path);
    let api_prefix = match cur.first() {
        Some(p) if cur.len() >= 3 && API_PREFIXES.contains(&p) => p,
        _ => return non_resource(method, path, bad, query),
    };
    cur.advance();
    let mut api_group = "";
    if !GROUPLESS_API_PREFIXES.contains(&api_prefix) {
        if cur.len() < 3 {
            return non_resource(method, path, bad, query);
        }
        api_group = cur.advance().unwrap_or_default();
    }
    let mut invalid = bad;
    // At least two segments remain here (checked above), so the version is always present.
    let api_version = cur.advance().unwrap_or_default();

    let mut verb_via_path = false;
    let mut verb: &str = match cur.first() {
        Some(v @ ("proxy" | "watch")) => {
            if cur.len() < 2 {
                // upstream: "unable to determine kind and namespace from url" (500)
                return RequestInfo {
                    is_resource_request: true,
                    verb: v.to_string(),
                    api_prefix: api_prefix.to_string(),
                    api_group: api_group.to_string(),
                    api_version: api_version.to_string(),
                    invalid: true,
                    query,
                    path,
                    ..RequestInfo::default()
                };
            }
            cur.advance();
            verb_via_path = true;
            v
        }
        _ => method_verb(method),
    };

    let mut namespace = "";
    if let [Some("namespaces"), Some(ns), third] = cur.peek3() {
        namespace = ns;
        if let Some(third) = third {
            if third != "status" && third != "finalize" {
                cur.advance();
                cur.advance();
            }
        }
    }

    let parts = cur;
    let [p0, p1, p2] = parts.peek3();
    let subresource = if parts.len() >= 3 && verb != "proxy" { p2.unwrap_or_default() } else { "" };
    let mut name = p1.unwrap_or_default();
    let resource = p0.unwrap_or_default();
    // An empty path segment (`/api/v1//pods`) yields an empty resource, as upstream's
    // splitPath does; kube-apiserver then answers 404. Flag it so callers know.
    if resource.is_empty() {
        invalid = true;
    }

    let mut selected_name: Option<String> = None;
    if name.is_empty() && verb == "get" {
        verb = if query.watch { "watch" } else { "list" };
        // When decoding the list options fails, only `watch` is read.
        if !query.decode_failed() && !query.field_selector.is_empty() {
            if let Some(terms) = selectors::parse_field_selector(&query.field_selector) {
                if let Some(n) = selectors::requires_exact_match(&terms, "metadata.name") {
                    if is_valid_path_segment_name(n) {
                        selected_name = Some(n.to_string());
                    }
                }
            }
        }
        if let Some(n) = &selected_name {
            name = n;
        }
    }
    if name.is_empty() && verb == "delete" {
        verb = "deletecollection";
    }
    let (field_selector, label_selector) =
        if !verb_via_path && matches!(verb, "list" | "watch" | "deletecollection") {
            (query.field_selector.clone(), query.label_selector.clone())
        } else {
            (String::new(), String::new())
        };
    RequestInfo {
        is_resource_request: true,
        verb: verb.to_string(),
        api_prefix: api_prefix.to_string(),
        api_group: api_group.to_string(),
        api_version: api_version.to_string(),
        namespace: namespace.to_string(),
        resource: resource.to_string(),
        subresource: subresource.to_string(),
        name: name.to_string(),
        parts_range: parts_range(&path, parts),
        field_selector,
        label_selector,
        invalid,
        query,
        path,
    }
}

/// The range of `parts` (a suffix of `path`'s segments) within `path`.
fn parts_range(path: &str, parts: Segments) -> (usize, usize, usize) {
    if parts.len == 0 || parts.rest.is_empty() {
        return (0, 0, 0);
    }
    match (parts.rest.as_ptr() as usize).checked_sub(path.as_ptr() as usize) {
        Some(at) if at.saturating_add(parts.rest.len()) <= path.len() => (at, parts.rest.len(), parts.len),
        _ => (0, 0, 0),
    }
}

/// A request that is not a resource request: verb = lowercase method.
fn non_resource(method: &str, path: String, invalid: bool, query: ListQuery) -> RequestInfo {
    RequestInfo { is_resource_request: false, path, verb: method.to_ascii_lowercase(), invalid, query, ..RequestInfo::default() }
}

/// `path.IsValidPathSegmentName`: not "." or "..", and no "/" or "%".
fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

/// Field and label selector parsing (apimachinery `fields.ParseSelector`, `labels.Parse`), only
/// as far as needed to know whether they parse and which `metadata.name` they pin.
pub mod selectors {
    /// One parsed field-selector term.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct FieldTerm {
        pub field: String,
        /// `=` / `==` (true) or `!=` (false).
        pub equals: bool,
        pub value: String,
    }

    /// Splits on `,` not escaped with a backslash (`splitTerms`).
    fn split_terms(s: &str) -> Vec<&str> {
        if s.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut start = 0;
        let mut escaped = false;
        for (i, c) in s.char_indices() {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == ',' {
                out.push(s.get(start..i).unwrap_or_default());
                start = i + 1;
            }
        }
        out.push(s.get(start..).unwrap_or_default());
        out
    }

    fn unescape_value(s: &str) -> Option<String> {
        let mut out = String::with_capacity(s.len());
        let mut in_slash = false;
        for c in s.chars() {
            if in_slash {
                match c {
                    '\\' | ',' | '=' => out.push(c),
                    _ => return None,
                }
                in_slash = false;
                continue;
            }
            match c {
                '\\' => in_slash = true,
                ',' | '=' => return None,
                _ => out.push(c),
            }
        }
        if in_slash {
            return None;
        }
        Some(out)
    }

    /// `fields.ParseSelector` (None = parse error): terms sorted as upstream sorts them.
    pub fn parse_field_selector(s: &str) -> Option<Vec<FieldTerm>> {
        let mut parts = split_terms(s);
        parts.sort_unstable();
        let mut out = Vec::new();
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let mut found = None;
            for (i, _) in part.char_indices() {
                let rest = part.get(i..).unwrap_or_default();
                if rest.starts_with("!=") {
                    found = Some((i, 2, false));
                } else if rest.starts_with("==") {
                    found = Some((i, 2, true));
                } else if rest.starts_with('=') {
                    found = Some((i, 1, true));
                }
                if found.is_some() {
                    break;
                }
            }
            let (i, oplen, equals) = found?;
            let field = part.get(..i).unwrap_or_default().to_string();
            let value = unescape_value(part.get(i + oplen..).unwrap_or_default())?;
            out.push(FieldTerm { field, equals, value });
        }
        Some(out)
    }

    /// `Selector.RequiresExactMatch(field)`.
    pub fn requires_exact_match<'a>(terms: &'a [FieldTerm], field: &str) -> Option<&'a str> {
        terms.iter().find(|t| t.equals && t.field == field).map(|t| t.value.as_str())
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Tok<'a> {
        Ident(&'a str),
        In,
        NotIn,
        Not,
        NotEq,
        Eq,
        DoubleEq,
        Gt,
        Lt,
        Open,
        Close,
        Comma,
    }

    fn lex(s: &str) -> Vec<Tok<'_>> {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        let special = |c: u8| matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<');
        let ws = |c: u8| matches!(c, b' ' | b'\t' | b'\r' | b'\n');
        while let Some(&c) = b.get(i) {
            if ws(c) {
                i += 1;
                continue;
            }
            if special(c) {
                let next = b.get(i + 1).copied();
                let (t, n) = match (c, next) {
                    (b'!', Some(b'=')) => (Tok::NotEq, 2),
                    (b'!', _) => (Tok::Not, 1),
                    (b'=', Some(b'=')) => (Tok::DoubleEq, 2),
                    (b'=', _) => (Tok::Eq, 1),
                    (b'>', _) => (Tok::Gt, 1),
                    (b'<', _) => (Tok::Lt, 1),
                    (b'(', _) => (Tok::Open, 1),
                    (b')', _) => (Tok::Close, 1),
                    _ => (Tok::Comma, 1),
                };
                out.push(t);
                i += n;
                continue;
            }
            let start = i;
            while let Some(&c) = b.get(i) {
                if ws(c) || special(c) {
                    break;
                }
                i += 1;
            }
            let id = s.get(start..i).unwrap_or_default();
            out.push(match id {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Ident(id),
            });
        }
        out
    }

    fn is_alnum(c: u8) -> bool {
        c.is_ascii_alphanumeric()
    }

    /// Label value / qualified-name part: ≤63, `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
    fn is_name_part(s: &str, allow_empty: bool) -> bool {
        let b = s.as_bytes();
        if b.is_empty() {
            return allow_empty;
        }
        b.len() <= 63
            && b.first().copied().is_some_and(is_alnum)
            && b.last().copied().is_some_and(is_alnum)
            && b.iter().all(|&c| is_alnum(c) || matches!(c, b'-' | b'_' | b'.'))
    }

    fn is_dns1123_subdomain(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|l| {
                let b = l.as_bytes();
                !b.is_empty()
                    && b.iter().all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && b.first().is_some_and(|&c| c != b'-')
                    && b.last().is_some_and(|&c| c != b'-')
            })
    }

    fn is_qualified_name(s: &str) -> bool {
        match s.split_once('/') {
            Some((p, n)) => is_dns1123_subdomain(p) && is_name_part(n, false),
            None => is_name_part(s, false),
        }
    }

    /// Whether `labels.Parse(s)` succeeds.
    pub fn label_selector_is_valid(s: &str) -> bool {
        parse_labels(&lex(s)).is_some()
    }

    fn parse_labels(toks: &[Tok<'_>]) -> Option<()> {
        let mut i = 0;
        // In value context `in`/`notin` are identifiers.
        let value_ident = |t: Option<&Tok<'_>>| -> Option<String> {
            match t {
                Some(Tok::Ident(s)) => Some((*s).to_string()),
                Some(Tok::In) => Some("in".to_string()),
                Some(Tok::NotIn) => Some("notin".to_string()),
                _ => None,
            }
        };
        loop {
            match toks.get(i) {
                None => return Some(()),
                Some(Tok::Ident(_) | Tok::Not | Tok::In | Tok::NotIn) => {}
                _ => return None,
            }
            // requirement
            let mut not = false;
            if toks.get(i) == Some(&Tok::Not) {
                not = true;
                i += 1;
            }
            let key = value_ident(toks.get(i))?;
            i += 1;
            if !is_qualified_name(&key) {
                return None;
            }
            let at_end = matches!(toks.get(i), None | Some(Tok::Comma));
            if not || at_end {
                if !at_end {
                    return None;
                }
            } else {
                let op = toks.get(i)?.clone();
                i += 1;
                match op {
                    Tok::In | Tok::NotIn => {
                        if toks.get(i) != Some(&Tok::Open) {
                            return None;
                        }
                        i += 1;
                        let mut values = Vec::new();
                        if toks.get(i) == Some(&Tok::Close) {
                            values.push(String::new());
                            i += 1;
                        } else {
                            loop {
                                match toks.get(i) {
                                    Some(Tok::Comma) => {
                                        values.push(String::new());
                                        i += 1;
                                    }
                                    t => {
                                        let v = value_ident(t)?;
                                        values.push(v);
                                        i += 1;
                                        match toks.get(i) {
                                            Some(Tok::Comma) => {
                                                i += 1;
                                                if toks.get(i) == Some(&Tok::Close) {
                                                    values.push(String::new());
                                                    i += 1;
                                                    break;
                                                }
                                            }
                                            Some(Tok::Close) => {
                                                i += 1;
                                                break;
                                            }
                                            _ => return None,
                                        }
                                    }
                                }
                            }
                        }
                        if !values.iter().all(|v| is_name_part(v, true)) {
                            return None;
                        }
                    }
                    Tok::Eq | Tok::DoubleEq | Tok::NotEq | Tok::Gt | Tok::Lt => {
                        let v = if matches!(toks.get(i), None | Some(Tok::Comma)) {
                            String::new()
                        } else {
                            let v = value_ident(toks.get(i))?;
                            i += 1;
                            v
                        };
                        if matches!(op, Tok::Gt | Tok::Lt) {
                            super::go_parse_i64(&v)?;
                        } else if !is_name_part(&v, true) {
                            return None;
                        }
                    }
                    _ => return None,
                }
            }
            match toks.get(i) {
                None => return Some(()),
                Some(Tok::Comma) => {
                    i += 1;
                    if !matches!(toks.get(i), Some(Tok::Ident(_) | Tok::Not | Tok::In | Tok::NotIn)) {
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }
}
