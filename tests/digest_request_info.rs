#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Upstream `requestinfo_test.go` vectors (`TestGetAPIRequestInfo`, `TestGetNonAPIRequestInfo`,
//! `TestSelectorParsing`) for `parse_request_info`, plus the details our digest adds. Arbitrary
//! input is the `request_info` fuzz target's (`fuzz/src/targets.rs`, run by
//! `tests/fuzz_targets.rs`).
use apf_wasm::digest::request_info::{equal_fold_ascii, parse_generic, parse_request_info, RequestInfo};

fn p(m: &str, u: &str) -> RequestInfo {
    parse_request_info(m, u.as_bytes())
}

#[allow(clippy::too_many_arguments)]
fn check(m: &str, u: &str, verb: &str, group: &str, ver: &str, ns: &str, res: &str, sub: &str, name: &str, parts: &[&str]) {
    let i = p(m, u);
    assert!(i.is_resource_request, "{m} {u}");
    assert!(!i.invalid, "{m} {u}");
    let got = (
        i.verb.as_str(),
        i.api_group.as_str(),
        i.api_version.as_str(),
        i.namespace.as_str(),
        i.resource.as_str(),
        i.subresource.as_str(),
        i.name.as_str(),
    );
    assert_eq!(got, (verb, group, ver, ns, res, sub, name), "{m} {u}");
    assert_eq!(i.parts(), parts.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{m} {u}");
    let prefix = if u.starts_with("/apis/") { "apis" } else { "api" };
    assert_eq!(i.api_prefix, prefix);
}

#[test]
fn get_api_request_info_vectors() {
    check("GET", "/api/v1/namespaces", "list", "", "v1", "", "namespaces", "", "", &["namespaces"]);
    check("GET", "/api/v1/namespaces/other", "get", "", "v1", "other", "namespaces", "", "other", &["namespaces", "other"]);
    check("GET", "/api/v1/namespaces/other/pods", "list", "", "v1", "other", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/namespaces/other/pods/foo", "get", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]);
    check("HEAD", "/api/v1/namespaces/other/pods/foo", "get", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]);
    check("GET", "/api/v1/pods", "list", "", "v1", "", "pods", "", "", &["pods"]);
    check("HEAD", "/api/v1/pods", "list", "", "v1", "", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/proxy/namespaces/other/pods/foo", "proxy", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]);
    check(
        "GET",
        "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource",
        "proxy",
        "",
        "v1",
        "other",
        "pods",
        "",
        "foo",
        &["pods", "foo", "subpath", "not", "a", "subresource"],
    );
    check("GET", "/api/v1/watch/pods", "watch", "", "v1", "", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/pods?watch=true", "watch", "", "v1", "", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/pods?watch=false", "list", "", "v1", "", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/watch/namespaces/other/pods", "watch", "", "v1", "other", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/namespaces/other/pods?watch=1", "watch", "", "v1", "other", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/namespaces/other/pods?watch=0", "list", "", "v1", "other", "pods", "", "", &["pods"]);
    check("GET", "/api/v1/namespaces/other/pods/foo/status", "get", "", "v1", "other", "pods", "status", "foo", &["pods", "foo", "status"]);
    check(
        "GET",
        "/api/v1/namespaces/other/pods/foo/proxy/subpath",
        "get",
        "",
        "v1",
        "other",
        "pods",
        "proxy",
        "foo",
        &["pods", "foo", "proxy", "subpath"],
    );
    check(
        "PUT",
        "/api/v1/namespaces/other/finalize",
        "update",
        "",
        "v1",
        "other",
        "namespaces",
        "finalize",
        "other",
        &["namespaces", "other", "finalize"],
    );
    check(
        "PUT",
        "/api/v1/namespaces/other/status",
        "update",
        "",
        "v1",
        "other",
        "namespaces",
        "status",
        "other",
        &["namespaces", "other", "status"],
    );
    check("PATCH", "/api/v1/namespaces/other/pods/foo", "patch", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]);
    check("DELETE", "/api/v1/namespaces/other/pods/foo", "delete", "", "v1", "other", "pods", "", "foo", &["pods", "foo"]);
    check("POST", "/api/v1/namespaces/other/pods", "create", "", "v1", "other", "pods", "", "", &["pods"]);
    check("DELETE", "/api/v1/nodes", "deletecollection", "", "v1", "", "nodes", "", "", &["nodes"]);
    check("DELETE", "/api/v1/namespaces", "deletecollection", "", "v1", "", "namespaces", "", "", &["namespaces"]);
    check("DELETE", "/api/v1/namespaces/other/pods", "deletecollection", "", "v1", "other", "pods", "", "", &["pods"]);
    check(
        "DELETE",
        "/apis/extensions/v1/namespaces/other/pods",
        "deletecollection",
        "extensions",
        "v1",
        "other",
        "pods",
        "",
        "",
        &["pods"],
    );
    check("POST", "/apis/extensions/v1/namespaces/other/pods", "create", "extensions", "v1", "other", "pods", "", "", &["pods"]);
    check("POST", "/apis/extensions/v1beta3/namespaces/other/pods", "create", "extensions", "v1beta3", "other", "pods", "", "", &["pods"]);
}

#[test]
fn non_resource_vectors() {
    for u in ["/", "/api/version/", "/apis/group/version/", "/badprefix/version/resource", "/apis/version/resource"] {
        let i = p("GET", u);
        assert!(!i.is_resource_request, "{u}");
        assert!(!i.invalid, "{u}");
        assert_eq!(i.verb, "get");
        assert_eq!(i.path, u);
    }
    for u in [
        "/api/version/resource",
        "/apis/group/version/resource/name/subresource",
        "/api/version/resource/name/subresource",
        "/apis/batch/v1/job",
        "/apis/batch/v1/job/foo",
        "/apis/batch/v1/job/foo/scale",
    ] {
        assert!(p("GET", u).is_resource_request, "{u}");
    }
    for u in ["/not-api/version/resource", "/apis/extensions/v1beta1", "/apis/extensions/v1beta1/", "/api/version", "/api", "/", ""] {
        assert!(!p("GET", u).is_resource_request, "{u}");
    }
    let i = p("POST", "/openapi/v2");
    assert_eq!(i.verb, "post");
    assert_eq!(p("OPTIONS", "/healthz").verb, "options");
}

fn sel(m: &str, q: &str, name: &str, verb: &str, fs: &str, ls: &str) {
    let i = p(m, &format!("/apis/group/version/{q}"));
    assert_eq!((i.name.as_str(), i.verb.as_str(), i.field_selector.as_str(), i.label_selector.as_str()), (name, verb, fs, ls), "{m} {q}");
}

#[test]
fn selector_parsing_vectors() {
    sel("GET", "resource", "", "list", "", "");
    sel("GET", "resource?fieldSelector=metadata.name=name1", "name1", "list", "metadata.name=name1", "");
    sel("GET", "resource?watch=true&fieldSelector=metadata.name=name1", "name1", "watch", "metadata.name=name1", "");
    sel("GET", "resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "list", "foo=bar", "baz=qux");
    sel("GET", "resource?fieldSelector=metadata.name=name1,foo", "", "list", "metadata.name=name1,foo", "");
    sel("GET", "resource?fieldSelector=metadata.name=name1,foo&watch=true", "", "watch", "metadata.name=name1,foo", "");
    sel("GET", "resource?fieldSelector=metadata.name=name1,foo&watch=false", "", "list", "metadata.name=name1,foo", "");
    sel("DELETE", "resource?fieldSelector=foo=bar&labelSelector=baz=qux", "", "deletecollection", "foo=bar", "baz=qux");
    sel(
        "GET",
        "resource?fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar&labelSelector=foo=bar&labelSelector=foo=baz",
        "foo",
        "list",
        "metadata.name=foo",
        "foo=bar",
    );
    sel("GET", "resource/name?fieldSelector=foo=bar&labelSelector=foo=bar", "name", "get", "", "");
    sel("GET", "watch/resource?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "", "watch", "", "");
    sel("GET", "watch/resource/name?fieldSelector=metadata.name=foo&labelSelector=foo=bar", "name", "watch", "", "");
}

#[test]
fn selector_details() {
    // percent-encoded selector, `==`, invalid path segment name, invalid label selector
    sel("GET", "resource?fieldSelector=metadata.name%3Dtest", "test", "list", "metadata.name=test", "");
    sel("GET", "resource?fieldSelector=metadata.name==x", "x", "list", "metadata.name==x", "");
    sel("GET", "resource?fieldSelector=metadata.name!=x", "", "list", "metadata.name!=x", "");
    sel("GET", "resource?fieldSelector=metadata.name=a%25b", "", "list", "metadata.name=a%b", "");
    sel("GET", "resource?fieldSelector=metadata.name=..", "", "list", "metadata.name=..", "");
    sel("GET", "resource?fieldSelector=metadata.name=x&labelSelector=a%20in%20(b,c)", "x", "list", "metadata.name=x", "a in (b,c)");
    sel("GET", "resource?fieldSelector=metadata.name=x&labelSelector=!!!", "", "list", "metadata.name=x", "!!!");
    sel("GET", "resource?fieldSelector=metadata.name=x&labelSelector=a,!b,c!=d,e>3", "x", "list", "metadata.name=x", "a,!b,c!=d,e>3");
    sel("GET", "resource?fieldSelector=metadata.name=x&labelSelector=e>z", "", "list", "metadata.name=x", "e>z");
    // sorted terms: spec.x before metadata? "metadata.name=b" < "spec.nodeName=a"
    sel("GET", "resource?fieldSelector=spec.nodeName=a,metadata.name=b", "b", "list", "spec.nodeName=a,metadata.name=b", "");
    // limit=invalid makes decoding fail: no name from selector
    sel("GET", "resource?fieldSelector=metadata.name=x&limit=invalid", "", "list", "metadata.name=x", "");
    // lenient bool: empty watch value means true
    sel("GET", "resource?watch=", "", "watch", "", "");
    sel("GET", "resource?watch=FALSE", "", "list", "", "");
}

/// `watch` and `sendInitialEvents` as apimachinery converts them (`conversion.go:
/// Convert_Slice_string_To_bool`: "0" or `strings.EqualFold(v, "false")` is false, anything else
/// true), and `watch` as `requestinfo.go: NewRequestInfo` rereads it when the list options do
/// not decode (`strings.ToLower(v)` is "false" or "0").
#[test]
fn watch_bool_like_go() {
    let verb = |q: &str| p("GET", &format!("/api/v1/pods?{q}")).verb;
    // U+017F LATIN SMALL LETTER LONG S folds to `s`: a LIST upstream, not a WATCH.
    assert_eq!(verb("watch=fal%C5%BFe&resourceVersion=1&resourceVersionMatch=Exact"), "list");
    assert_eq!(verb("watch=FAL%C5%BFE"), "list");
    assert_eq!(verb("watch=fAlSe"), "list");
    // Decoding fails (invalid limit, timeoutSeconds or selector): only ASCII case is ignored.
    assert_eq!(verb("watch=fal%C5%BFe&limit=x"), "watch");
    assert_eq!(verb("watch=fal%C5%BFe&timeoutSeconds=x"), "watch");
    assert_eq!(verb("watch=fal%C5%BFe&fieldSelector=a"), "watch");
    assert_eq!(verb("watch=fal%C5%BFe&labelSelector=!!!"), "watch");
    assert_eq!(verb("watch=FALSE&limit=x"), "list");
    assert_eq!(verb("watch=0&limit=x"), "list");
    assert_eq!(verb("watch=00&limit=x"), "watch");
    // A bad `timeout` is not a list option: decoding succeeds.
    assert_eq!(verb("watch=fal%C5%BFe&timeout=x"), "list");
    // Only "0" itself; any other value, the empty one included, is true.
    assert_eq!(verb("watch=0"), "list");
    assert_eq!(verb("watch=00"), "watch");
    assert_eq!(verb("watch="), "watch");
    assert_eq!(verb("watch"), "watch");
    assert_eq!(verb("watch=f"), "watch");
    assert_eq!(verb("watch=falsee"), "watch");
    assert_eq!(verb("watch=%C5%BF"), "watch");
    // Non-UTF-8 never folds to ASCII.
    assert_eq!(verb("watch=fal%FFe"), "watch");
    assert_eq!(verb("watch=fal%C5e"), "watch");
    // The first value counts.
    assert_eq!(verb("watch=fal%C5%BFe&watch=true"), "list");
    let sie = |q: &str| p("GET", &format!("/api/v1/pods?watch=1&{q}")).query.send_initial_events;
    assert_eq!(sie("sendInitialEvents=fal%C5%BFe"), Some(false));
    assert_eq!(sie("sendInitialEvents=0"), Some(false));
    assert_eq!(sie("sendInitialEvents="), Some(true));
    assert_eq!(sie("sendInitialEvents=00"), Some(true));
    assert_eq!(sie("x=1"), None);
}

/// Go's `strings.EqualFold` against ASCII targets.
#[test]
fn equal_fold_like_go() {
    assert!(equal_fold_ascii("false", "false"));
    assert!(equal_fold_ascii("FaLsE", "false"));
    assert!(equal_fold_ascii("fal\u{17F}e", "FALSE"));
    // U+212A KELVIN SIGN folds to `k` and `K`.
    assert!(equal_fold_ascii("\u{212A}", "k"));
    assert!(equal_fold_ascii("\u{212A}ube", "KUBE"));
    assert!(equal_fold_ascii("\u{212A}\u{17F}", "ks"));
    assert!(!equal_fold_ascii("\u{212A}", "s"));
    assert!(!equal_fold_ascii("\u{17F}", "k"));
    // Turkic dotted / dotless i are not in the simple-fold orbit of `i`.
    assert!(!equal_fold_ascii("\u{130}", "i"));
    assert!(!equal_fold_ascii("\u{131}", "i"));
    // Length counts in characters.
    assert!(!equal_fold_ascii("fals", "false"));
    assert!(!equal_fold_ascii("falsee", "false"));
    assert!(equal_fold_ascii("", ""));
    assert!(!equal_fold_ascii("\u{fffd}", "f"));
}

/// `equal_fold_ascii` on every Unicode scalar value against an oracle built from Rust's case
/// mappings. Oracle: `c` equals the ASCII character `x` under Unicode simple case folding (Go's
/// `unicode.SimpleFold` orbits, which `strings.EqualFold` walks) iff `c == x`, or `c` lowercases
/// to exactly the one character `x.to_ascii_lowercase()`, or uppercases to exactly the one
/// character `x.to_ascii_uppercase()` (an orbit that holds an ASCII letter holds its two cases,
/// and every other member maps to one of them by a one-to-one case mapping) — except U+0130
/// (lowercases to `i`) and U+0131 (uppercases to `I`), whose foldings are Turkic-only
/// (CaseFolding.txt status T), not simple ones.
#[test]
fn equal_fold_matches_std_case_mappings() {
    fn single(mut it: impl Iterator<Item = char>) -> Option<char> {
        let c = it.next()?;
        it.next().is_none().then_some(c)
    }
    // The characters the bool conversion compares (`truefals`, `1`, `0`), `S` for an uppercase
    // target, and `k`, `K` for the Kelvin sign (every target costs ~0.1 s in a debug build).
    let targets = ['t', 'r', 'u', 'e', 'f', 'a', 'l', 's', 'S', 'k', 'K', '1', '0'];
    let mut buf = [0u8; 4];
    let mut matches = Vec::new();
    for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
        let turkic = c == '\u{130}' || c == '\u{131}';
        let (lower, upper) = (single(c.to_lowercase()), single(c.to_uppercase()));
        let s = c.encode_utf8(&mut buf);
        for &x in &targets {
            let oracle = c == x || (!turkic && (lower == Some(x.to_ascii_lowercase()) || upper == Some(x.to_ascii_uppercase())));
            let got = equal_fold_ascii(s, x.encode_utf8(&mut [0u8; 4]));
            assert_eq!(got, oracle, "U+{:04X} vs {x:?}", c as u32);
            if got && !c.is_ascii() {
                matches.push((c, x));
            }
        }
    }
    // The only non-ASCII matches: long s and the Kelvin sign.
    assert_eq!(matches, [('\u{17F}', 's'), ('\u{17F}', 'S'), ('\u{212A}', 'k'), ('\u{212A}', 'K')]);
}

#[test]
fn query_digest() {
    let i = p("GET", "/apis/foo.bar/v1/events?limit=399&resourceVersion=1&resourceVersionMatch=Exact&continue=tok&sendInitialEvents=true&timeout=8s&timeoutSeconds=5");
    assert_eq!(i.query.limit, 399);
    assert_eq!(i.query.resource_version, "1");
    assert_eq!(i.query.resource_version_match, "Exact");
    assert_eq!(i.query.continue_token, "tok");
    assert_eq!(i.query.send_initial_events, Some(true));
    assert_eq!(i.query.timeout, Some(8_000_000_000));
    assert_eq!(i.query.timeout_seconds, Some(5));
    assert!(!i.query.options_error);
    let i = p("GET", "/apis/foo.bar/v1/events?limit=invalid&timeout=bogus");
    assert!(i.query.options_error);
    assert!(i.query.timeout_invalid);
    assert_eq!(i.query.timeout, None);
    assert!(p("GET", "/api/v1/pods?limit=").query.options_error);
    assert_eq!(p("GET", "/api/v1/pods?limit=%2B5").query.limit, 5);
    // semicolons drop the pair, `+` is a space in queries
    let i = p("GET", "/api/v1/pods?watch=true;x=1&labelSelector=a+in+(b)");
    assert_eq!(i.verb, "list");
    assert_eq!(i.label_selector, "a in (b)");
}

#[test]
fn long_running() {
    assert!(p("GET", "/api/v1/pods?watch=true").is_long_running());
    assert!(p("GET", "/api/v1/watch/pods").is_watch());
    assert!(p("GET", "/api/v1/namespaces/a/pods/b/log").is_long_running());
    assert!(p("POST", "/api/v1/namespaces/a/pods/b/exec").is_long_running());
    assert!(p("POST", "/api/v1/namespaces/a/pods/b/attach").is_long_running());
    assert!(p("POST", "/api/v1/namespaces/a/pods/b/portforward").is_long_running());
    assert!(p("GET", "/api/v1/namespaces/a/pods/b/proxy/x").is_long_running());
    assert!(p("GET", "/api/v1/proxy/namespaces/a/pods/b").is_long_running());
    assert!(p("GET", "/debug/pprof/profile").is_long_running());
    assert!(!p("GET", "/debug/pprof").is_long_running());
    assert!(!p("GET", "/api/v1/pods").is_long_running());
    assert!(!p("GET", "/api/v1/namespaces/a/pods/b?watch=true").is_long_running());
    assert!(!p("GET", "/api/v1/namespaces/a/pods/b/status").is_long_running());
}

#[test]
fn decoding_like_go() {
    // %2F decodes to '/' and splits the segment, as Go's URL.Path does
    let i = p("GET", "/api/v1/namespaces/a%2Fb/pods");
    assert_eq!(i.namespace, "a");
    assert_eq!(i.resource, "b");
    assert_eq!(i.name, "pods");
    let i = p("GET", "/api/v1/namespaces/a%20b/pods");
    assert_eq!(i.namespace, "a b");
    // bad escape: flagged, parsed leniently
    let i = p("GET", "/api/v1/namespaces/a%zz/pods");
    assert!(i.invalid);
    assert_eq!(i.namespace, "a%zz");
    // special verb without resource
    let i = p("GET", "/api/v1/watch");
    assert!(i.invalid); // upstream: "unable to determine kind and namespace from url"
    assert!(p("GET", "/api/v1/watch/").invalid);
    assert!(!p("GET", "/api/v1").invalid);
    let i = p("GET", "/apis/g/v1/watch");
    assert!(i.invalid);
    // double slashes produce empty parts
    let i = p("GET", "/api//v1/pods");
    assert!(i.is_resource_request);
    assert_eq!(i.api_version, "");
    let i = p("GET", "//api/v1/pods//");
    assert_eq!(i.resource, "pods");
    // non-UTF-8
    let i = parse_request_info("GET", b"/api/v1/namespaces/\xff\xfe/pods?x=\xff");
    assert_eq!(i.namespace, "\u{fffd}\u{fffd}");
    let i = p("GET", "/api/v1/namespaces/%ff/pods");
    assert_eq!(i.namespace, "\u{fffd}");
    // Methods are case-sensitive (`switch req.Method`): a lowercase one maps to no verb.
    let i = p("get", "/api/v1/pods");
    assert_eq!(i.verb, "");
    assert_eq!(p("delete", "/api/v1/pods").verb, "");
}

#[test]
fn generic_mode() {
    let i = parse_generic("POST", b"/v1/orders?timeout=4s", Some(b" team-a "));
    assert!(!i.is_resource_request);
    assert_eq!(i.verb, "post");
    assert_eq!(i.path, "/v1/orders");
    assert_eq!(i.namespace, "team-a");
    assert_eq!(i.query.timeout, Some(4_000_000_000));
    let i = parse_generic("GET", b"/x", Some(b"\xff"));
    assert_eq!(i.namespace, "\u{fffd}");
    assert_eq!(parse_generic("GET", b"", None).namespace, "");
}
