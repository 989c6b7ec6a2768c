#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Identity sources, trust, group completion, header stripping, robustness.
use apf_wasm::digest::identity::{forbidden_status, identify, parse_subject, FrontProxyHeaders, IdentityConfig, IdentityInput, UserInfo};
use std::net::IpAddr;

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

fn cfg(j: &str) -> IdentityConfig {
    serde_json::from_str(j).unwrap()
}
fn h<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a [u8])> {
    pairs.iter().map(|&(n, v)| (n, v.as_bytes())).collect()
}
fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}
fn g(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn no_sources_is_anonymous() {
    let c = IdentityConfig::default();
    let hs = h(&[("x-remote-user", "alice")]);
    let u = identify(&c, &IdentityInput { headers: &hs, ..Default::default() });
    assert_eq!(u, UserInfo { name: "system:anonymous".into(), groups: g(&["system:unauthenticated"]) });
}

#[test]
fn front_proxy() {
    let c = cfg(r#"{"sources":[{"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/8","fd00::/8"]}]}"#);
    let hs = h(&[("x-remote-user", "alice"), ("x-remote-group", "dev"), ("x-remote-group", "ops, qa,"), ("x-remote-extra-scopes", "x")]);
    let inp = IdentityInput { headers: &hs, peer: ip("10.1.2.3"), ..Default::default() };
    let u = identify(&c, &inp);
    assert_eq!(u.name, "alice");
    assert_eq!(u.groups, g(&["dev", "ops", "qa", "system:authenticated"]));
    // untrusted peer → anonymous
    let u = identify(&c, &IdentityInput { headers: &hs, peer: ip("192.168.0.1"), ..Default::default() });
    assert_eq!(u.name, "system:anonymous");
    // no peer known with CIDRs configured → untrusted
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).name, "system:anonymous");
    // IPv6 and IPv4-mapped IPv6
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, peer: ip("fd12::1"), ..Default::default() }).name, "alice");
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, peer: ip("::ffff:10.9.9.9"), ..Default::default() }).name, "alice");
    // custom headers, case-insensitive config
    let c = cfg(r#"{"sources":[{"type":"frontProxy","userHeader":"X-User","groupHeader":"X-Groups"}]}"#);
    let hs = h(&[("x-user", " bob "), ("x-groups", "system:masters")]);
    let u = identify(&c, &IdentityInput { headers: &hs, ..Default::default() });
    assert_eq!(u, UserInfo { name: "bob".into(), groups: g(&["system:masters", "system:authenticated"]) });
    // empty user header → no user from this source
    let hs = h(&[("x-user", ""), ("x-groups", "a")]);
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).name, "system:anonymous");
}

#[test]
fn require_mtls() {
    let c = cfg(r#"{"sources":[{"type":"frontProxy","requireMtls":true}]}"#);
    let hs = h(&[("x-remote-user", "alice")]);
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).name, "system:anonymous");
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, mtls: true, ..Default::default() }).name, "alice");
}

#[test]
fn service_accounts_and_unauthenticated() {
    let c = cfg(r#"{"sources":[{"type":"frontProxy"}]}"#);
    let hs = h(&[("x-remote-user", "system:serviceaccount:kube-system:default")]);
    let u = identify(&c, &IdentityInput { headers: &hs, ..Default::default() });
    assert_eq!(u.groups, g(&["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]));
    // not a valid SA name: no SA groups
    let hs = h(&[("x-remote-user", "system:serviceaccount:ns")]);
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).groups, g(&["system:authenticated"]));
    // already carries system:unauthenticated → nothing added
    let hs = h(&[("x-remote-user", "x"), ("x-remote-group", "system:unauthenticated")]);
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).groups, g(&["system:unauthenticated"]));
    // explicit anonymous
    let hs = h(&[("x-remote-user", "system:anonymous")]);
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).groups, g(&["system:unauthenticated"]));
    assert_eq!(UserInfo::authenticated("u", &g(&["a"])).groups, g(&["a", "system:authenticated"]));
}

#[test]
fn impersonation() {
    let c = cfg(r#"{"sources":[{"type":"impersonation"}]}"#);
    let hs = h(&[("impersonate-user", "carol"), ("impersonate-group", "g1"), ("impersonate-group", "g2")]);
    let u = identify(&c, &IdentityInput { headers: &hs, ..Default::default() });
    assert_eq!(u, UserInfo { name: "carol".into(), groups: g(&["g1", "g2", "system:authenticated"]) });
    // SA with no groups: SA groups added; with groups: not (as the impersonation filter)
    let hs = h(&[("impersonate-user", "system:serviceaccount:ns1:sa")]);
    assert_eq!(
        identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).groups,
        g(&["system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"])
    );
    let hs = h(&[("impersonate-user", "system:serviceaccount:ns1:sa"), ("impersonate-group", "x")]);
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).groups, g(&["x", "system:authenticated"]));
    // groups without user → nothing
    let hs = h(&[("impersonate-group", "x")]);
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).name, "system:anonymous");
}

#[test]
fn client_certificate() {
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}]}"#);
    let inp = IdentityInput { mtls: true, cert_subject: Some("CN=alice,O=dev,O=ops\\, inc,OU=x"), ..Default::default() };
    assert_eq!(identify(&c, &inp), UserInfo { name: "alice".into(), groups: g(&["dev", "ops, inc", "system:authenticated"]) });
    let inp = IdentityInput { mtls: false, cert_subject: Some("CN=alice"), ..Default::default() };
    assert_eq!(identify(&c, &inp).name, "system:anonymous");
    let inp = IdentityInput { mtls: true, cert_subject: Some("O=dev"), ..Default::default() };
    assert_eq!(identify(&c, &inp).name, "system:anonymous");
    assert_eq!(
        parse_subject("CN=system:node:n1+O=system:nodes"),
        vec![("CN".into(), "system:node:n1".into()), ("O".into(), "system:nodes".into())]
    );
    assert_eq!(parse_subject("CN=a\\2Cb"), vec![("CN".into(), "a,b".into())]);
}

#[test]
fn jwt_and_order() {
    let c = cfg(r#"{"sources":[
        {"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/8"]},
        {"type":"jwt","userClaim":"email","groupsClaim":"roles","userPrefix":"oidc:","groupsPrefix":"oidc:"}]}"#);
    let claims = serde_json::json!({"email":"dave@example.com","roles":["a","b",3]});
    let hs = h(&[("x-remote-user", "mallory")]);
    let inp = IdentityInput { headers: &hs, peer: ip("1.2.3.4"), jwt_claims: Some(&claims), ..Default::default() };
    let u = identify(&c, &inp);
    assert_eq!(u, UserInfo { name: "oidc:dave@example.com".into(), groups: g(&["oidc:a", "oidc:b", "system:authenticated"]) });
    // trusted front proxy wins (first source)
    let inp = IdentityInput { headers: &hs, peer: ip("10.0.0.1"), jwt_claims: Some(&claims), ..Default::default() };
    assert_eq!(identify(&c, &inp).name, "mallory");
    let c = cfg(r#"{"sources":[{"type":"jwt"}]}"#);
    let claims = serde_json::json!({"sub":"system:serviceaccount:default:default","groups":"single"});
    let u = identify(&c, &IdentityInput { jwt_claims: Some(&claims), ..Default::default() });
    assert_eq!(u.groups, g(&["single", "system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"]));
}

#[test]
fn config_errors() {
    for bad in [
        r#"{"sources":[{"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/33"]}]}"#,
        r#"{"sources":[{"type":"frontProxy","trustedSourceCidrs":["10.0.0/8"]}]}"#,
        r#"{"sources":[{"type":"frontProxy","trustedSourceCidrs":["::/129"]}]}"#,
        r#"{"sources":[{"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/"]}]}"#,
        r#"{"sources":[{"type":"frontProxy","bogus":1}]}"#,
        r#"{"sources":[{"type":"jwt","userHeader":"x"}]}"#,
        r#"{"sources":[{"type":"kerberos"}]}"#,
        r#"{"other":1}"#,
    ] {
        assert!(serde_json::from_str::<IdentityConfig>(bad).is_err(), "{bad}");
    }
    let c = cfg(
        r#"{"sources":[{"type":"frontProxy","userHeader":"bad header","trustedSourceCidrs":["1.2.3.4","::1/128","0.0.0.0/0"]},{"type":"jwt","userClaim":""}]}"#,
    );
    assert_eq!(c.validate().len(), 2);
    assert!(cfg(r#"{"sources":[{"type":"frontProxy"},{"type":"impersonation"}]}"#).validate().is_empty());
}

#[test]
fn header_names_and_stripping() {
    let c = cfg(r#"{"sources":[
        {"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/8"],"stripUntrusted":true},
        {"type":"impersonation","requireMtls":true,"stripUntrusted":true}]}"#);
    assert_eq!(c.header_names(), vec!["x-remote-user", "x-remote-group", "impersonate-user", "impersonate-group", "impersonate-uid"]);
    assert_eq!(c.header_prefixes(), vec!["x-remote-extra-", "impersonate-extra-"]);
    let hs = h(&[
        ("x-remote-user", "a"),
        ("x-remote-group", "system:masters"),
        ("X-Remote-Extra-Foo", "1"),
        ("impersonate-user", "b"),
        ("accept", "x"),
        ("x-remote-group", "y"),
    ]);
    let inp = IdentityInput { headers: &hs, peer: ip("8.8.8.8"), ..Default::default() };
    assert_eq!(c.headers_to_strip(&inp), vec!["x-remote-user", "x-remote-group", "x-remote-extra-foo", "impersonate-user"]);
    let inp = IdentityInput { headers: &hs, peer: ip("10.0.0.8"), mtls: true, ..Default::default() };
    assert!(c.headers_to_strip(&inp).is_empty());
    let inp = IdentityInput { headers: &hs, peer: ip("10.0.0.8"), mtls: false, ..Default::default() };
    assert_eq!(c.headers_to_strip(&inp), vec!["impersonate-user"]);
}

#[test]
fn never_panics() {
    let c = cfg(r#"{"sources":[{"type":"frontProxy"},{"type":"impersonation"},{"type":"clientCertificate"},{"type":"jwt"}]}"#);
    let cf = cfg(
        r#"{"setFrontProxyHeaders":true,"sources":[{"type":"frontProxy","trustedSourceCidrs":["0.0.0.0/0"]},{"type":"clientCertificate"},{"type":"jwt"}]}"#,
    );
    let mut rng = Rng(88172645463325252);
    let mut next = || rng.next();
    let names = [
        "x-remote-user",
        "x-remote-group",
        "impersonate-user",
        "impersonate-group",
        "x-remote-extra-\u{e9}",
        "junk",
        "authorization",
        "sec-websocket-protocol",
    ];
    let claims = serde_json::json!({"sub": 5, "groups": {"a": 1}});
    for _ in 0..5000 {
        let mut hs = Vec::new();
        for _ in 0..(next() % 5) {
            let v: Vec<u8> = (0..(next() % 12)).map(|_| next() as u8).collect();
            hs.push((names[(next() % names.len() as u64) as usize], v));
        }
        let subj_bytes: Vec<u8> = (0..(next() % 16))
            .map(|_| {
                let a = b"CN=O,\\+;2F\xc3\xa9a";
                a[(next() % a.len() as u64) as usize]
            })
            .collect();
        let subj = String::from_utf8_lossy(&subj_bytes).into_owned();
        let hs: Vec<(&str, &[u8])> = hs.iter().map(|(n, v)| (*n, v.as_slice())).collect();
        let inp = IdentityInput { headers: &hs, peer: None, mtls: next() % 2 == 0, cert_subject: Some(&subj), jwt_claims: Some(&claims) };
        let u = identify(&c, &inp);
        assert!(!u.name.is_empty());
        let _ = c.headers_to_strip(&inp);
        let fwd = cf.front_proxy_headers(&inp, hs.iter().copied());
        if fwd.refuse.is_some() {
            assert!(fwd.add.is_empty(), "{fwd:?}");
        }
        for (n, v) in &fwd.add {
            assert!(n.starts_with("x-remote-") || n == "sec-websocket-protocol", "{n}");
            assert!(!v.is_empty() && !v.bytes().any(|b| b < 0x20 || b == 0x7f) && v.trim() == v, "{v:?}");
        }
    }
    let hs: Vec<(&str, &[u8])> = vec![("x-remote-user", &[0xff, 0xfe])];
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).name, "system:anonymous");
}

// --- setFrontProxyHeaders ------------------------------------------------------------------------

fn fwd(c: &IdentityConfig, inp: &IdentityInput) -> FrontProxyHeaders {
    c.front_proxy_headers(inp, inp.headers.iter().copied())
}
fn adds(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

const SPOOF: &[(&str, &str)] = &[
    ("x-remote-user", "system:admin"),
    ("x-remote-group", "system:masters"),
    ("X-Remote-Group", "other"),
    ("x-remote-extra-scopes", "all"),
    ("x-remote-uid", "0"),
    ("impersonate-user", "system:admin"),
    ("impersonate-group", "system:masters"),
    ("accept", "application/json"),
];

#[test]
fn set_front_proxy_headers_off_changes_nothing() {
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}]}"#);
    assert!(!c.set_front_proxy_headers);
    let hs = h(SPOOF);
    let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some("CN=alice,O=dev"), ..Default::default() };
    assert_eq!(fwd(&c, &inp), FrontProxyHeaders::default());
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}],"setFrontProxyHeaders":false}"#);
    assert_eq!(fwd(&c, &inp), FrontProxyHeaders::default());
}

#[test]
fn set_front_proxy_headers_from_client_certificate() {
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}],"setFrontProxyHeaders":true}"#);
    assert!(c.validate().is_empty());
    let hs = h(SPOOF);
    // Verified certificate: every client-supplied X-Remote-* goes (whatever its case, uid
    // included); the certificate's CN and O are written, one group header per O, in order,
    // duplicates once, without the groups kube-apiserver adds itself (system:authenticated).
    let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some("CN=alice,O=dev,O=ops,O=dev"), ..Default::default() };
    let f = fwd(&c, &inp);
    assert_eq!(f.remove, vec!["x-remote-user", "x-remote-group", "x-remote-extra-scopes", "x-remote-uid"]);
    assert_eq!(f.add, adds(&[("x-remote-user", "alice"), ("x-remote-group", "dev"), ("x-remote-group", "ops")]));
    // Classification agrees on user and groups (plus the completed system:authenticated).
    assert_eq!(identify(&c, &inp), UserInfo { name: "alice".into(), groups: g(&["dev", "ops", "dev", "system:authenticated"]) });
    // Impersonate-* is not touched (kube-apiserver authorizes it for the forwarded user).
    assert!(!f.remove.iter().any(|n| n.starts_with("impersonate-")));
    // A certificate without groups: the user alone.
    let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some("CN=bob"), ..Default::default() };
    assert_eq!(fwd(&c, &inp).add, adds(&[("x-remote-user", "bob")]));
    // system:masters from a verified certificate is forwarded as such.
    let inp = IdentityInput { mtls: true, cert_subject: Some("CN=admin,O=system:masters"), ..Default::default() };
    assert_eq!(
        fwd(&c, &inp),
        FrontProxyHeaders { remove: vec![], add: adds(&[("x-remote-user", "admin"), ("x-remote-group", "system:masters")]), refuse: None }
    );
    // A service-account-looking CN gets no service-account groups (kube-apiserver's x509
    // authenticator gives none; forwarding them would grant more than the certificate does).
    let inp = IdentityInput { mtls: true, cert_subject: Some("CN=system:serviceaccount:kube-system:x"), ..Default::default() };
    assert_eq!(fwd(&c, &inp).add, adds(&[("x-remote-user", "system:serviceaccount:kube-system:x")]));
}

#[test]
fn set_front_proxy_headers_anonymous_forwards_no_identity() {
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}],"setFrontProxyHeaders":true}"#);
    let hs = h(SPOOF);
    for inp in [
        // no certificate
        IdentityInput { headers: &hs, ..Default::default() },
        // a subject without a verified connection is not believed
        IdentityInput { headers: &hs, mtls: false, cert_subject: Some("CN=admin,O=system:masters"), ..Default::default() },
    ] {
        let f = fwd(&c, &inp);
        assert_eq!(f.remove, vec!["x-remote-user", "x-remote-group", "x-remote-extra-scopes", "x-remote-uid"]);
        assert!(f.add.is_empty() && f.refuse.is_none(), "{f:?}");
        assert_eq!(identify(&c, &inp), UserInfo::anonymous());
    }
    // No sources at all: everyone is anonymous, the headers still go.
    let c = cfg(r#"{"setFrontProxyHeaders":true}"#);
    let inp = IdentityInput { headers: &hs, ..Default::default() };
    assert_eq!(fwd(&c, &inp).remove.len(), 4);
    assert!(fwd(&c, &inp).add.is_empty());
    // Nothing to remove, nothing to add.
    let hs = h(&[("accept", "*/*"), ("remote-user", "x"), ("x-remote", "y")]);
    assert_eq!(fwd(&c, &IdentityInput { headers: &hs, ..Default::default() }), FrontProxyHeaders::default());
}

#[test]
fn set_front_proxy_headers_from_jwt() {
    let c = cfg(
        r#"{"setFrontProxyHeaders":true,"sources":[{"type":"clientCertificate"},{"type":"jwt","userPrefix":"oidc:","groupsPrefix":"oidc:"}]}"#,
    );
    assert!(c.validate().is_empty());
    let claims = serde_json::json!({"sub":"carol","groups":["a","b"]});
    let hs = h(SPOOF);
    let inp = IdentityInput { headers: &hs, jwt_claims: Some(&claims), ..Default::default() };
    let f = fwd(&c, &inp);
    assert_eq!(f.add, adds(&[("x-remote-user", "oidc:carol"), ("x-remote-group", "oidc:a"), ("x-remote-group", "oidc:b")]));
    assert_eq!(f.remove.len(), 4);
    // The certificate (first source) wins when both are present, as in identify().
    let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some("CN=alice"), jwt_claims: Some(&claims), ..Default::default() };
    assert_eq!(fwd(&c, &inp).add, adds(&[("x-remote-user", "alice")]));
    assert_eq!(identify(&c, &inp).name, "alice");
}

#[test]
fn set_front_proxy_headers_from_a_trusted_front_proxy() {
    // A chained authenticating proxy at 10.0.0.0/8 (custom header names) in front of the
    // gateway; everyone else by certificate.
    let c = cfg(r#"{"setFrontProxyHeaders":true,"sources":[
        {"type":"frontProxy","userHeader":"X-Auth-User","groupHeader":"X-Auth-Group","extraHeaderPrefix":"X-Auth-Extra-","trustedSourceCidrs":["10.0.0.0/8"]},
        {"type":"clientCertificate"}]}"#);
    assert!(c.validate().is_empty());
    let hs = h(&[
        ("x-auth-user", "dave"),
        ("x-auth-group", "g1, g2"),
        ("x-auth-group", "g3"),
        ("x-auth-extra-scopes", "openid"),
        ("x-auth-extra-scopes", "email"),
        ("x-auth-extra-bad%20key", " padded"),
        ("x-remote-user", "system:admin"),
        ("x-remote-group", "system:masters"),
    ]);
    let inp = IdentityInput { headers: &hs, peer: ip("10.1.1.1"), ..Default::default() };
    let f = fwd(&c, &inp);
    // The proxy's own headers go too (the upstream must only see the x-remote-* written here).
    assert_eq!(
        f.remove,
        vec!["x-auth-user", "x-auth-group", "x-auth-extra-scopes", "x-auth-extra-bad%20key", "x-remote-user", "x-remote-group"]
    );
    assert_eq!(
        f.add,
        adds(&[
            ("x-remote-user", "dave"),
            ("x-remote-group", "g1"),
            ("x-remote-group", "g2"),
            ("x-remote-group", "g3"),
            ("x-remote-extra-scopes", "openid"),
            ("x-remote-extra-scopes", "email"),
        ])
    );
    // From an untrusted peer the proxy's headers are not believed: next source, the certificate.
    let inp = IdentityInput { headers: &hs, peer: ip("192.168.1.1"), mtls: true, cert_subject: Some("CN=eve,O=dev"), ..Default::default() };
    let f = fwd(&c, &inp);
    assert_eq!(f.remove.len(), 6);
    assert_eq!(f.add, adds(&[("x-remote-user", "eve"), ("x-remote-group", "dev")]));
    // Untrusted and no certificate: anonymous, nothing written.
    let inp = IdentityInput { headers: &hs, peer: ip("192.168.1.1"), ..Default::default() };
    assert!(fwd(&c, &inp).add.is_empty());
}

#[test]
fn set_front_proxy_headers_refuses_values_a_header_cannot_carry() {
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}],"setFrontProxyHeaders":true}"#);
    let hs = h(&[("x-remote-user", "x")]);
    // A user name with a line break (RFC 2253 hex escape), a control character, or edge
    // whitespace forwards no identity at all (never a header injection, never a trimmed name).
    for subject in ["CN=ali\\0Ace,O=dev", "CN=a\\00b", "CN=\\20admin,O=dev", "CN=admin\\20,O=dev", "CN=a\\7Fb", "CN=\\20"] {
        let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some(subject), ..Default::default() };
        let f = fwd(&c, &inp);
        assert!(f.add.is_empty(), "{subject}: {f:?}");
        assert_eq!(f.refuse.as_deref(), Some("client certificate identity cannot be forwarded: empty or invalid common name"), "{subject}");
    }
    // Such a group is dropped (" system:masters" must not become "system:masters"); the rest stays.
    let inp = IdentityInput {
        mtls: true,
        cert_subject: Some("CN=alice,O=\\20system:masters,O=a\\0D\\0Ab,O=\\09x,O=dev,O="),
        ..Default::default()
    };
    assert_eq!(fwd(&c, &inp).add, adds(&[("x-remote-user", "alice"), ("x-remote-group", "dev")]));
    // Inner spaces and non-ASCII are fine.
    let inp = IdentityInput { mtls: true, cert_subject: Some("CN=J\\C3\\A9r\\C3\\B4me Dupont,O=team a"), ..Default::default() };
    assert_eq!(fwd(&c, &inp).add, adds(&[("x-remote-user", "Jérôme Dupont"), ("x-remote-group", "team a")]));
}

#[test]
fn set_front_proxy_headers_config_errors() {
    // Forwarding an identity nobody verified is refused.
    let c = cfg(r#"{"setFrontProxyHeaders":true,"sources":[{"type":"impersonation","trustedSourceCidrs":["10.0.0.0/8"]}]}"#);
    let e = c.validate();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].to_string().contains("identity.sources[0]") && e[0].to_string().contains("impersonation"), "{e:?}");
    let c = cfg(r#"{"setFrontProxyHeaders":true,"sources":[{"type":"clientCertificate"},{"type":"frontProxy","requireMtls":true}]}"#);
    let e = c.validate();
    assert_eq!(e.len(), 1, "{e:?}");
    assert!(e[0].to_string().contains("identity.sources[1]") && e[0].to_string().contains("trustedSourceCidrs"), "{e:?}");
    // Without the option the same sources are valid (as before).
    assert!(cfg(r#"{"sources":[{"type":"impersonation"},{"type":"frontProxy"}]}"#).validate().is_empty());
    // Type errors.
    for bad in [r#"{"setFrontProxyHeaders":"yes"}"#, r#"{"setFrontProxyHeaders":1}"#, r#"{"setFrontproxyHeaders":true}"#] {
        assert!(serde_json::from_str::<IdentityConfig>(bad).is_err(), "{bad}");
    }
}

#[test]
fn set_front_proxy_headers_refuses_a_verified_credential_without_a_forwardable_user() {
    // A verified certificate with an empty or missing CN (kube-apiserver's x509 authenticator
    // would skip it and authenticate the request's bearer token instead): refused, whatever else
    // the request carries; the classification is anonymous but the request never goes upstream.
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}],"setFrontProxyHeaders":true}"#);
    let hs = h(&[("authorization", "Bearer t0ken"), ("x-remote-user", "system:admin")]);
    for subject in ["O=system:masters", "CN=,O=dev", "", "OU=x"] {
        let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some(subject), ..Default::default() };
        let f = fwd(&c, &inp);
        assert_eq!(
            f.refuse.as_deref(),
            Some("client certificate identity cannot be forwarded: empty or invalid common name"),
            "{subject:?}"
        );
        assert!(f.add.is_empty(), "{subject:?}: {f:?}");
        assert_eq!(identify(&c, &inp), UserInfo::anonymous());
    }
    // Verified JWT claims without a usable user claim: refused too.
    let c = cfg(r#"{"sources":[{"type":"jwt","userClaim":"email"}],"setFrontProxyHeaders":true}"#);
    for claims in [serde_json::json!({"email": ""}), serde_json::json!({"sub": "x"}), serde_json::json!({"email": " root"})] {
        let inp = IdentityInput { headers: &hs, jwt_claims: Some(&claims), ..Default::default() };
        assert_eq!(
            fwd(&c, &inp).refuse.as_deref(),
            Some("JWT identity cannot be forwarded: empty or invalid user claim \"email\""),
            "{claims}"
        );
    }
    // A trusted front proxy stating a user a header cannot carry on.
    let c = cfg(r#"{"sources":[{"type":"frontProxy","trustedSourceCidrs":["10.0.0.0/8"]}],"setFrontProxyHeaders":true}"#);
    let bad = h(&[("x-remote-user", "a\u{1}b")]);
    let inp = IdentityInput { headers: &bad, peer: ip("10.0.0.1"), ..Default::default() };
    assert_eq!(fwd(&c, &inp).refuse.as_deref(), Some("front-proxy identity cannot be forwarded: invalid X-Remote-User value"));
    // The first source yielding a user still wins: a certificate without a CN, then a JWT.
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"},{"type":"jwt"}],"setFrontProxyHeaders":true}"#);
    let claims = serde_json::json!({"sub": "carol"});
    let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some("O=dev"), jwt_claims: Some(&claims), ..Default::default() };
    let f = fwd(&c, &inp);
    assert_eq!((f.add, f.refuse), (adds(&[("x-remote-user", "carol")]), None));
    assert_eq!(identify(&c, &inp).name, "carol");
    // Without setFrontProxyHeaders nothing is refused (nothing is forwarded as an identity).
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}]}"#);
    let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some("O=dev"), ..Default::default() };
    assert_eq!(fwd(&c, &inp), FrontProxyHeaders::default());
    // The body is kube-apiserver's Status for a 403.
    let body: serde_json::Value = serde_json::from_str(&forbidden_status("no \"way\"")).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "no \"way\"", "reason": "Forbidden", "details": {}, "code": 403})
    );
}

#[test]
fn set_front_proxy_headers_anonymous_carries_no_other_credential() {
    // No certificate: the apiserver must serve the request as anonymous, as classified, so the
    // credentials it would authenticate instead go: the Authorization header (any scheme, any
    // case) and the WebSocket bearer-token subprotocol; the other subprotocols are written back.
    let c = cfg(r#"{"sources":[{"type":"clientCertificate"}],"setFrontProxyHeaders":true}"#);
    let hs = h(&[
        ("Authorization", "Bearer t0ken"),
        ("sec-websocket-protocol", "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.dDBrZW4"),
        ("Sec-WebSocket-Protocol", "v4.channel.k8s.io"),
        ("accept", "*/*"),
    ]);
    let inp = IdentityInput { headers: &hs, ..Default::default() };
    let f = fwd(&c, &inp);
    assert_eq!(f.remove, vec!["authorization", "sec-websocket-protocol"]);
    assert_eq!(f.add, adds(&[("sec-websocket-protocol", "v5.channel.k8s.io, v4.channel.k8s.io")]));
    assert_eq!(f.refuse, None);
    assert_eq!(identify(&c, &inp), UserInfo::anonymous());
    // Only the token subprotocol: the header goes entirely.
    let hs = h(&[("sec-websocket-protocol", "base64url.bearer.authorization.k8s.io.dDBrZW4")]);
    let f = fwd(&c, &IdentityInput { headers: &hs, ..Default::default() });
    assert_eq!((f.remove, f.add), (vec!["sec-websocket-protocol".to_string()], vec![]));
    // Subprotocols without a token are left alone; so is everything when an identity is forwarded
    // (kube-apiserver's request-header authenticator runs first and wins).
    let hs = h(&[("sec-websocket-protocol", "v5.channel.k8s.io"), ("authorization", "Bearer t0ken")]);
    assert_eq!(fwd(&c, &IdentityInput { headers: &hs, ..Default::default() }).remove, vec!["authorization"]);
    let hs = h(&[
        ("sec-websocket-protocol", "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.dDBrZW4"),
        ("authorization", "Bearer t0ken"),
    ]);
    let inp = IdentityInput { headers: &hs, mtls: true, cert_subject: Some("CN=alice"), ..Default::default() };
    assert_eq!(fwd(&c, &inp), FrontProxyHeaders { remove: vec![], add: adds(&[("x-remote-user", "alice")]), refuse: None });
}
