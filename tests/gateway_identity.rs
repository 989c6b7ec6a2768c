#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
//! Who the caller is, natively (the e2e suite's spoofing, client-certificate, JWT and secure
//! example tests): front-proxy headers only from trusted peers (`trustedSourceCidrs`, and
//! `stripUntrusted` removing them otherwise), the verified client certificate's subject, JWT
//! claims from the jwt_authn filter's metadata, and `setFrontProxyHeaders` forwarding exactly the
//! identity the gateway classified. Classification is read from `x-apf-flowschema` (every caller
//! is in an explain group); what the upstream would get, from the stream's request headers after
//! the callback.

#[path = "common/mock_host.rs"]
mod mock_host;

use apf_wasm::gateway::host::{serialize_pairs, Action};
use mock_host::{flow_schema, gateway, header_value, priority_level, Node};
use serde_json::{json, Value};

const PODS: &str = "/api/v1/namespaces/default/pods";
const DUMP: &str = "/debug/api_priority_and_fairness/dump_priority_levels";
const JWT: &str = "metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload";

/// Only the mandatory levels plus "team" with a FlowSchema per team group (`dev`, `jwt-team`,
/// `oidc:jwt-team`); everyone gets the explanation headers.
fn config(identity: Value) -> String {
    json!({
        "serverConcurrencyLimit": 20,
        "suggestedDefaults": false,
        "identity": identity,
        "explainGroups": ["system:authenticated", "system:unauthenticated"],
        "policy": [
            priority_level("team", 10, 8, 2, 10),
            flow_schema("dev", "team", 500, &["dev"]),
            flow_schema("jwt", "team", 500, &["jwt-team"]),
            flow_schema("oidc", "team", 500, &["oidc:jwt-team"]),
        ]
    })
    .to_string()
}

fn front_proxy(cidr: &str, strip: bool) -> String {
    config(json!({"sources": [{"type": "frontProxy", "trustedSourceCidrs": [cidr], "stripUntrusted": strip}]}))
}

/// Request headers: a GET of `path` with `extra` headers.
fn get<'a>(path: &'a str, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![(":method", "GET"), (":path", path), (":authority", "gateway")];
    h.extend_from_slice(extra);
    h
}

const SPOOF: [(&str, &str); 3] = [("x-remote-user", "admin"), ("x-remote-group", "system:masters"), ("x-remote-extra-scopes", "all")];

/// The FlowSchema a request lands in (it must go upstream), and its stream's id.
fn landed(node: &mut Node, headers: &[(&str, &str)], properties: &[(&str, &[u8])]) -> (String, u32) {
    let (ctx, action) = node.request(headers, properties);
    assert_eq!(action, Action::Continue, "{:?}", node.stream(ctx).reply);
    let h = node.respond(ctx, 200, &[], &[]);
    (header_value(&h, "x-apf-flowschema").expect("classified"), ctx)
}

fn peer(addr: &str) -> [(&'static str, Vec<u8>); 1] {
    [("source.address", addr.as_bytes().to_vec())]
}

fn props<'a>(p: &'a [(&'static str, Vec<u8>)]) -> Vec<(&'static str, &'a [u8])> {
    p.iter().map(|(k, v)| (*k, v.as_slice())).collect()
}

fn cert(subject: &str) -> Vec<(&'static str, Vec<u8>)> {
    vec![("connection.mtls", vec![1]), ("connection.subject_peer_certificate", subject.as_bytes().to_vec())]
}

#[test]
fn a_trusted_front_proxy_peer_is_believed() {
    let (_, mut w) = gateway(1, &front_proxy("10.0.0.0/8", true));
    let (fs, ctx) = landed(&mut w[0], &get(PODS, &SPOOF), &props(&peer("10.0.0.1:5555")));
    assert_eq!(fs, "exempt");
    assert_eq!(w[0].stream(ctx).request_header("x-remote-user"), ["admin"]);
    // And a member of system:masters by its headers gets the dumps.
    let (ctx, action) = w[0].request(&get(DUMP, &SPOOF), &props(&peer("10.0.0.1:5555")));
    assert_eq!(action, Action::Pause);
    assert!(w[0].stream(ctx).reply.unwrap().body.starts_with("PriorityLevelName"));
}

#[test]
fn an_untrusted_peer_is_anonymous_and_its_identity_headers_are_stripped() {
    let (_, mut w) = gateway(1, &front_proxy("10.0.0.0/8", true));
    for p in [&props(&peer("192.168.1.7:5555"))[..], &[]] {
        let (fs, ctx) = landed(&mut w[0], &get(PODS, &SPOOF), p);
        assert_eq!(fs, "catch-all", "peer {p:?}");
        let s = w[0].stream(ctx);
        for name in ["x-remote-user", "x-remote-group", "x-remote-extra-scopes"] {
            assert!(s.request_header(name).is_empty(), "{name} reaches the upstream from {p:?}");
        }
    }
}

#[test]
fn without_strip_untrusted_the_headers_travel_on_but_are_not_believed() {
    let (_, mut w) = gateway(1, &front_proxy("10.0.0.0/8", false));
    let (fs, ctx) = landed(&mut w[0], &get(PODS, &SPOOF), &props(&peer("192.168.1.7:5555")));
    assert_eq!(fs, "catch-all");
    let s = w[0].stream(ctx);
    assert_eq!(
        (s.request_header("x-remote-user"), s.request_header("x-remote-group")),
        (vec!["admin".into()], vec!["system:masters".into()])
    );
}

#[test]
fn an_untrusted_spoofer_gets_no_debug_dump() {
    let (_, mut w) = gateway(1, &front_proxy("10.0.0.0/8", true));
    let (ctx, action) = w[0].request(&get(DUMP, &SPOOF), &props(&peer("192.168.1.7:5555")));
    assert_eq!(action, Action::Continue, "the dump path goes to the upstream");
    assert!(w[0].stream(ctx).reply.is_none());
}

#[test]
fn an_ipv6_peer_inside_a_trusted_cidr_is_believed() {
    let (_, mut w) = gateway(1, &front_proxy("fd00::/8", true));
    assert_eq!(landed(&mut w[0], &get(PODS, &SPOOF), &props(&peer("[fd00::7]:443"))).0, "exempt");
    assert_eq!(landed(&mut w[0], &get(PODS, &SPOOF), &props(&peer("[2001:db8::1]:443"))).0, "catch-all");
}

#[test]
fn a_verified_client_certificate_names_the_user_and_groups() {
    let (_, mut w) = gateway(1, &config(json!({"sources": [{"type": "clientCertificate"}]})));
    assert_eq!(landed(&mut w[0], &get(PODS, &[]), &props(&cert("CN=alice,O=dev"))).0, "dev");
    // Identity headers are not a source here: a client without a certificate is anonymous.
    assert_eq!(landed(&mut w[0], &get(PODS, &[("x-remote-user", "alice"), ("x-remote-group", "dev")]), &[]).0, "catch-all");
    // A subject without a verified connection counts for nothing.
    let unverified = [("connection.mtls", vec![0]), ("connection.subject_peer_certificate", b"CN=alice,O=dev".to_vec())];
    assert_eq!(landed(&mut w[0], &get(PODS, &[]), &props(&unverified)).0, "catch-all");
}

#[test]
fn jwt_claims_name_the_user_and_groups() {
    let (_, mut w) = gateway(1, &config(json!({"sources": [{"type": "jwt"}]})));
    // A list claim arrives in the host's pair serialization (values empty), as Envoy writes it.
    let list = serialize_pairs(&[("other", b""), ("jwt-team", b"")]);
    let claims = [(format!("{JWT}.sub"), b"jwt-alice".to_vec()), (format!("{JWT}.groups"), list)];
    let p: Vec<(&str, &[u8])> = claims.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    assert_eq!(landed(&mut w[0], &get(PODS, &[]), &p).0, "jwt");
    // Or as a comma-separated string.
    let claims = [(format!("{JWT}.sub"), b"jwt-alice".to_vec()), (format!("{JWT}.groups"), b"qa, jwt-team".to_vec())];
    let p: Vec<(&str, &[u8])> = claims.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    assert_eq!(landed(&mut w[0], &get(PODS, &[]), &p).0, "jwt");
    // No verified token: anonymous.
    assert_eq!(landed(&mut w[0], &get(PODS, &[("authorization", "Bearer forged")]), &[]).0, "catch-all");
}

#[test]
fn jwt_prefixes_and_claim_names_come_from_the_source() {
    let source = json!({"type": "jwt", "metadataKey": "payload", "userClaim": "email", "groupsClaim": "roles", "groupsPrefix": "oidc:"});
    let (_, mut w) = gateway(1, &config(json!({"sources": [source]})));
    let base = "metadata.filter_metadata.envoy.filters.http.jwt_authn.payload";
    let claims = [(format!("{base}.email"), b"a@example.com".to_vec()), (format!("{base}.roles"), serialize_pairs(&[("jwt-team", b"")]))];
    let p: Vec<(&str, &[u8])> = claims.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    assert_eq!(landed(&mut w[0], &get(PODS, &[]), &p).0, "oidc");
}

/// A JWT claim `groups: []` is serialized by Envoy as an empty pair list (just the count, 0):
/// the caller has no groups beyond `system:authenticated` (not a group made of those 4 bytes).
#[test]
fn an_empty_jwt_groups_list_gives_no_group() {
    let mut cfg: Value = serde_json::from_str(&config(json!({"sources": [{"type": "jwt"}]}))).unwrap();
    let policy = cfg["policy"].as_array_mut().unwrap();
    policy.push(flow_schema("nul", "team", 400, &["\0\0\0\0"]));
    let (_, mut w) = gateway(1, &cfg.to_string());
    let claims = [(format!("{JWT}.sub"), b"jwt-alice".to_vec()), (format!("{JWT}.groups"), serialize_pairs(&[]))];
    let p: Vec<(&str, &[u8])> = claims.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    assert_eq!(landed(&mut w[0], &get(PODS, &[]), &p).0, "catch-all");
}

// -- setFrontProxyHeaders ---------------------------------------------------------------------

fn forwarding(sources: Value) -> String {
    config(json!({"sources": sources, "setFrontProxyHeaders": true}))
}

#[test]
fn forwarding_replaces_client_identity_headers_with_the_verified_identity() {
    let (_, mut w) = gateway(1, &forwarding(json!([{"type": "clientCertificate"}])));
    let client = [
        ("x-remote-user", "admin"),
        ("x-remote-group", "system:masters"),
        ("x-remote-extra-scopes", "all"),
        ("x-remote-uid", "0"),
        ("impersonate-user", "bob"),
    ];
    let (fs, ctx) = landed(&mut w[0], &get(PODS, &client), &props(&cert("CN=alice,O=dev,O=qa")));
    assert_eq!(fs, "dev");
    let s = w[0].stream(ctx);
    assert_eq!(s.request_header("x-remote-user"), ["alice"]);
    assert_eq!(s.request_header("x-remote-group"), ["dev", "qa"], "as the certificate says, without system:authenticated");
    assert!(s.request_header("x-remote-extra-scopes").is_empty() && s.request_header("x-remote-uid").is_empty());
    assert_eq!(s.request_header("impersonate-user"), ["bob"], "kube-apiserver authorizes impersonation itself");
}

#[test]
fn a_certificate_without_a_common_name_is_refused_with_403() {
    let (proxy, mut w) = gateway(1, &forwarding(json!([{"type": "clientCertificate"}])));
    for subject in ["O=system:masters", "CN=,O=dev"] {
        let (ctx, action) = w[0].request(&get(PODS, &[("authorization", "Bearer sa-token")]), &props(&cert(subject)));
        assert_eq!(action, Action::Pause, "{subject}");
        let reply = w[0].stream(ctx).reply.expect("403");
        assert_eq!(reply.status, 403);
        let body: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!((&body["kind"], &body["code"], &body["reason"]), (&json!("Status"), &json!(403), &json!("Forbidden")), "{body}");
        // Never forwarded: not now, not later.
        proxy.advance(std::time::Duration::from_secs(1));
        w[0].tick();
        assert!(!w[0].stream(ctx).resumed, "{subject}");
        w[0].close(ctx);
    }
}

#[test]
fn an_anonymous_request_loses_its_bearer_credentials() {
    let (_, mut w) = gateway(1, &forwarding(json!([{"type": "clientCertificate"}])));
    let client = [
        ("authorization", "Bearer sa-token"),
        ("sec-websocket-protocol", "base64url.bearer.authorization.k8s.io.c2E, v5.channel.k8s.io"),
        ("x-remote-user", "admin"),
    ];
    let (fs, ctx) = landed(&mut w[0], &get(PODS, &client), &[]);
    assert_eq!(fs, "catch-all");
    let s = w[0].stream(ctx);
    assert!(s.request_header("authorization").is_empty());
    assert_eq!(s.request_header("sec-websocket-protocol"), ["v5.channel.k8s.io"], "other subprotocols stay");
    assert!(s.request_header("x-remote-user").is_empty() && s.request_header("x-remote-group").is_empty());
}

#[test]
fn a_trusted_front_proxy_forwards_its_user_groups_and_extras() {
    let (_, mut w) = gateway(1, &forwarding(json!([{"type": "frontProxy", "trustedSourceCidrs": ["10.0.0.0/8"]}])));
    let client = [("x-remote-user", "alice"), ("x-remote-group", "dev"), ("x-remote-extra-scopes", "read")];
    let (fs, ctx) = landed(&mut w[0], &get(PODS, &client), &props(&peer("10.1.2.3:4000")));
    assert_eq!(fs, "dev");
    let s = w[0].stream(ctx);
    let got = ["x-remote-user", "x-remote-group", "x-remote-extra-scopes"].map(|n| s.request_header(n));
    assert_eq!(got, [vec!["alice".to_string()], vec!["dev".into()], vec!["read".into()]]);
    // The same headers from elsewhere: anonymous, nothing forwarded.
    let (fs, ctx) = landed(&mut w[0], &get(PODS, &client), &props(&peer("192.168.0.1:4000")));
    assert_eq!(fs, "catch-all");
    assert!(w[0].stream(ctx).request_headers.iter().all(|(k, _)| !k.starts_with("x-remote-")));
}

#[test]
fn long_running_requests_forward_the_verified_identity_too() {
    let (_, mut w) = gateway(1, &forwarding(json!([{"type": "clientCertificate"}])));
    let exec = "/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true";
    let (ctx, action) =
        w[0].request(&get(exec, &[("x-remote-user", "admin"), ("x-remote-group", "system:masters")]), &props(&cert("CN=alice,O=dev")));
    assert_eq!(action, Action::Continue);
    let s = w[0].stream(ctx);
    assert_eq!((s.request_header("x-remote-user"), s.request_header("x-remote-group")), (vec!["alice".into()], vec!["dev".into()]));
}

#[test]
fn a_later_source_wins_over_a_certificate_without_a_common_name() {
    let (_, mut w) = gateway(1, &forwarding(json!([{"type": "clientCertificate"}, {"type": "jwt"}])));
    let mut p = cert("O=system:masters");
    p.push(("metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.sub", b"jwt-alice".to_vec()));
    p.push(("metadata.filter_metadata.envoy.filters.http.jwt_authn.jwt_payload.groups", serialize_pairs(&[("jwt-team", b"")])));
    let (fs, ctx) = landed(&mut w[0], &get(PODS, &[]), &props(&p));
    assert_eq!(fs, "jwt");
    assert_eq!(w[0].stream(ctx).request_header("x-remote-user"), ["jwt-alice"]);
}
