"""Trusted identity from JWT claims: Envoy's jwt_authn filter verifies the token
and stores its payload in dynamic metadata; the filter classifies by the `sub` and `groups`
claims. A request without a token is anonymous; a forged token never reaches the filter."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest

from apfkit.apf_policy import group_policy

pytestmark = pytest.mark.apf

SECRET = b"apf-e2e-jwt-secret-0123456789abcdef"


def b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def token(claims: dict, secret: bytes = SECRET) -> str:
    head = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64url(json.dumps(claims).encode())
    sig = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(sig)}"


JWT_AUTHN = {
    "name": "envoy.filters.http.jwt_authn",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
        "providers": {"test": {
            "issuer": "apf-e2e",
            "local_jwks": {"inline_string": json.dumps({"keys": [{"kty": "oct", "alg": "HS256", "k": b64url(SECRET)}]})},
            "payload_in_metadata": "jwt_payload",
            "forward": True,
        }},
        "rules": [{"match": {"prefix": "/"}, "requires": {"allow_missing": {}}}],
    },
}

POLICY = group_policy("jwt-level", "jwt-team", level_uid="pl-jwt", schema_uid="fs-jwt")


def test_jwt_claims_identify_the_caller(gateway):
    gw = gateway({"identity": {"sources": [{"type": "jwt", "groupsClaim": "groups"}]},
                  "explainGroups": ["jwt-team"], "policy": POLICY},
                 extra_filters=[JWT_AUTHN])
    good = token({"iss": "apf-e2e", "sub": "jwt-alice", "groups": ["jwt-team"], "exp": int(time.time()) + 3600})
    r = gw.request(headers={"Authorization": f"Bearer {good}"})
    assert r.status == 200, r
    assert r.headers.get("x-kubernetes-pf-flowschema-uid") == "fs-jwt", r.headers
    assert r.headers.get("x-kubernetes-pf-prioritylevel-uid") == "pl-jwt", r.headers
    assert r.headers.get("x-apf-flowschema") == "jwt-team", r.headers
    # No token: anonymous, not the JWT team's FlowSchema.
    r = gw.request()
    assert r.status == 200 and r.headers.get("x-kubernetes-pf-flowschema-uid") != "fs-jwt", r.headers
    # A forged token is refused by jwt_authn before classification.
    bad = token({"iss": "apf-e2e", "sub": "mallory", "groups": ["jwt-team"], "exp": int(time.time()) + 3600}, b"wrong-secret-wrong-secret-000000")
    r = gw.request(headers={"Authorization": f"Bearer {bad}"})
    assert r.status == 401, r
