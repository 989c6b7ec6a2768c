//! RequestInfo: what kube-apiserver's `RequestInfoFactory` learns from the method and the request
//! target (reference §2), plus the query-derived list options the work estimator (§6.4) and the
//! wait limit (§1 step 6) need, and the long-running check (§1 step 3).
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
    /// int64). The LIST estimator then returns max seats (§6.4 step 3).
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
    pub parts: Vec<String>,
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
    /// kube-apiserver's `LongRunningFunc` (§1 step 3): verbs {watch, proxy}; subresources
    /// {attach, exec, proxy, log, portforward} of resource requests; non-resource paths under
    /// `/debug/pprof/`.
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
    let (path, bad) = percent_decode(raw_path, false);
    (lossy(path), raw_query, bad || ctl)
}

fn split_path(path: &str) -> Vec<String> {
    let t = path.trim_matches('/');
    if t.is_empty() {
        return Vec::new();
    }
    t.split('/').map(str::to_string).collect()
}

/// Generic-mode RequestInfo: a non-resource request with verb = lowercase method; the
/// namespace comes from a header (for ByNamespace distinguishers). Non-UTF-8 header bytes are
/// replaced by U+FFFD.
pub fn parse_generic(method: &str, path_and_query: &[u8], namespace: Option<&[u8]>) -> RequestInfo {
    let (path, raw_query, bad) = split_target(path_and_query);
    let q = parse_query(raw_query);
    RequestInfo {
        is_resource_request: false,
        path,
        verb: method.to_ascii_lowercase(),
        namespace: namespace.map(|n| lossy(n.trim_ascii().to_vec())).unwrap_or_default(),
        invalid: bad,
        query: parse_list_query(&q),
        ..RequestInfo::default()
    }
}

/// kube-apiserver's `RequestInfoFactory.NewRequestInfo` (§2).
pub fn parse_request_info(method: &str, path_and_query: &[u8]) -> RequestInfo {
    let (path, raw_query, bad) = split_target(path_and_query);
    let q = parse_query(raw_query);
    let mut info = RequestInfo {
        is_resource_request: false,
        verb: method.to_ascii_lowercase(),
        invalid: bad,
        query: parse_list_query(&q),
        ..RequestInfo::default()
    };
    let parts = split_path(&path);
    info.path = path;
    if parts.len() < 3 {
        return info;
    }
    let mut cur: &[String] = &parts;
    let Some((prefix, rest)) = cur.split_first() else { return info };
    if !API_PREFIXES.contains(&prefix.as_str()) {
        return info;
    }
    let api_prefix = prefix.clone();
    cur = rest;
    let mut api_group = String::new();
    if !GROUPLESS_API_PREFIXES.contains(&api_prefix.as_str()) {
        if cur.len() < 3 {
            return info;
        }
        let Some((g, rest)) = cur.split_first() else { return info };
        api_group = g.clone();
        cur = rest;
    }
    info.is_resource_request = true;
    info.api_prefix = api_prefix;
    info.api_group = api_group;
    let Some((version, rest)) = cur.split_first() else { return info };
    info.api_version = version.clone();
    cur = rest;

    let mut verb_via_path = false;
    match cur.first().map(String::as_str) {
        Some(v @ ("proxy" | "watch")) => {
            if cur.len() < 2 {
                // upstream: "unable to determine kind and namespace from url" (500)
                info.invalid = true;
                info.verb = v.to_string();
                return info;
            }
            info.verb = v.to_string();
            cur = cur.get(1..).unwrap_or_default();
            verb_via_path = true;
        }
        _ => {
            info.verb = match method.to_ascii_uppercase().as_str() {
                "POST" => "create",
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => "",
            }
            .to_string();
        }
    }

    if cur.first().map(String::as_str) == Some("namespaces") {
        if let Some(ns) = cur.get(1) {
            info.namespace = ns.clone();
            if let Some(third) = cur.get(2) {
                if third != "status" && third != "finalize" {
                    cur = cur.get(2..).unwrap_or_default();
                }
            }
        }
    }

    info.parts = cur.to_vec();
    if info.parts.len() >= 3 && info.verb != "proxy" {
        info.subresource = info.parts.get(2).cloned().unwrap_or_default();
    }
    if let Some(n) = info.parts.get(1) {
        info.name = n.clone();
    }
    if let Some(r) = info.parts.first() {
        info.resource = r.clone();
    }
    // An empty path segment (`/api/v1//pods`) yields an empty resource, as upstream's
    // splitPath does; kube-apiserver then answers 404. Flag it so callers know.
    if info.resource.is_empty() {
        info.invalid = true;
    }

    if info.name.is_empty() && info.verb == "get" {
        let (watch, field) = if info.query.decode_failed() {
            // fallback: only `watch` is read
            (info.query.watch, None)
        } else {
            (info.query.watch, Some(info.query.field_selector.as_str()))
        };
        info.verb = if watch { "watch" } else { "list" }.to_string();
        if let Some(fs) = field {
            if let Some(terms) = selectors::parse_field_selector(fs) {
                if let Some(name) = selectors::requires_exact_match(&terms, "metadata.name") {
                    if is_valid_path_segment_name(name) {
                        info.name = name.to_string();
                    }
                }
            }
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".to_string();
    }
    if !verb_via_path && matches!(info.verb.as_str(), "list" | "watch" | "deletecollection") {
        info.field_selector = info.query.field_selector.clone();
        info.label_selector = info.query.label_selector.clone();
    }
    info
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
