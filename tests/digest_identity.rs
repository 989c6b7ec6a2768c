#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Identity sources, trust, group completion, header stripping, robustness.
use apf_wasm::digest::identity::{identify, parse_subject, IdentityConfig, IdentityInput, UserInfo};
use std::net::IpAddr;

fn cfg(j: &str) -> IdentityConfig {
    serde_json::from_str(j).unwrap()
}
fn h(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    pairs.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect()
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
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).groups, g(&["system:serviceaccounts", "system:serviceaccounts:ns1", "system:authenticated"]));
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
    assert_eq!(parse_subject("CN=system:node:n1+O=system:nodes"), vec![("CN".into(), "system:node:n1".into()), ("O".into(), "system:nodes".into())]);
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
    let c = cfg(r#"{"sources":[{"type":"frontProxy","userHeader":"bad header","trustedSourceCidrs":["1.2.3.4","::1/128","0.0.0.0/0"]},{"type":"jwt","userClaim":""}]}"#);
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
    let hs = h(&[("x-remote-user", "a"), ("x-remote-group", "system:masters"), ("X-Remote-Extra-Foo", "1"), ("impersonate-user", "b"), ("accept", "x"), ("x-remote-group", "y")]);
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
    let mut s: u64 = 88172645463325252;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let names = ["x-remote-user", "x-remote-group", "impersonate-user", "impersonate-group", "x-remote-extra-\u{e9}", "junk"];
    let claims = serde_json::json!({"sub": 5, "groups": {"a": 1}});
    for _ in 0..5000 {
        let mut hs = Vec::new();
        for _ in 0..(next() % 5) {
            let v: Vec<u8> = (0..(next() % 12)).map(|_| next() as u8).collect();
            hs.push((names[(next() % names.len() as u64) as usize].to_string(), v));
        }
        let subj_bytes: Vec<u8> = (0..(next() % 16)).map(|_| { let a = b"CN=O,\\+;2F\xc3\xa9a"; a[(next() % a.len() as u64) as usize] }).collect();
        let subj = String::from_utf8_lossy(&subj_bytes).into_owned();
        let inp = IdentityInput { headers: &hs, peer: None, mtls: next() % 2 == 0, cert_subject: Some(&subj), jwt_claims: Some(&claims) };
        let u = identify(&c, &inp);
        assert!(!u.name.is_empty());
        let _ = c.headers_to_strip(&inp);
    }
    let hs = vec![("x-remote-user".to_string(), vec![0xff, 0xfe])];
    assert_eq!(identify(&c, &IdentityInput { headers: &hs, ..Default::default() }).name, "system:anonymous");
}
