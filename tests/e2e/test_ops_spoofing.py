"""Operations — identity spoofing: front-proxy headers from a peer outside
`trustedSourceCidrs` are ignored (the caller is anonymous: no exemption, no debug dumps) and, with
`stripUntrusted`, removed before the request goes upstream. From a trusted peer the same request
is exempt and gets the dumps. The test client connects from 127.0.0.1."""

from __future__ import annotations

import pytest

from apfkit import client
from apfkit.apf_policy import plugin_config
from apfkit.observe import parse_dump

pytestmark = pytest.mark.apf

PODS = "/api/v1/namespaces/default/pods"
DUMP = "/debug/api_priority_and_fairness/dump_priority_levels"
SPOOF = {"user": "admin", "groups": ("system:masters",)}


def spoof_config(cidr: str, strip: bool = True) -> dict:
    # suggestedDefaults off, no policy: only the mandatory levels. With 2 server seats,
    # catch-all (shares 5, limitResponse Reject) has ceil(2*5/5) = 2 seats; exempt is unlimited.
    return plugin_config(
        identity={"sources": [{"type": "frontProxy", "trustedSourceCidrs": [cidr],
                               "stripUntrusted": strip}]},
        serverConcurrencyLimit=2, suggestedDefaults=False, policy=[],
        explainGroups=["system:unauthenticated", "system:masters"])


def _burst(gw, n: int, seconds: float) -> list:
    return gw.concurrent(n, n, [SPOOF["user"]], path=f"{PODS}?sleep={seconds}",
                         groups=SPOOF["groups"], timeout=15)


def test_ops_untrusted_peer_cannot_claim_system_masters(gateway):
    gw = gateway(spoof_config("10.0.0.0/8", strip=True))
    r = gw.request(PODS, **SPOOF)
    assert r.status == 200, gw.fail_msg(repr(r))
    # Classified as the anonymous caller it really is: catch-all, not exempt.
    assert r.h("x-apf-prioritylevel") == "catch-all", r.headers
    assert r.h("x-apf-flowschema") == "catch-all", r.headers
    # stripUntrusted: the upstream never sees the spoofed identity headers.
    got = gw.upstream.received(PODS)
    assert len(got) == 1, got
    hdrs = got[0][1]
    assert "x-remote-user" not in hdrs and "x-remote-group" not in hdrs, hdrs

    # Not exempt: a burst beyond catch-all's 2 seats is rejected (catch-all rejects, no queues).
    gw.upstream.reset()
    res = _burst(gw, 6, 0.8)
    counts = client.status_counts(res)
    assert set(counts) == {200, 429} and counts[429] >= 1, gw.fail_msg(str(counts))
    assert gw.upstream.snapshot()["max_in_flight"] <= 2, gw.upstream.snapshot()
    for x in res:
        if x.status == 429:
            assert x.h("x-apf-prioritylevel") == "catch-all", x.headers
            assert x.h("x-apf-reject-reason") == "concurrency-limit", x.headers

    # No debug dump for the spoofer: the request goes to the upstream like any other.
    gw.upstream.reset()
    d = gw.request(DUMP, **SPOOF)
    assert d.status == 200 and b'"kind": "Status"' in d.body, gw.fail_msg(f"{d!r} {d.body[:300]!r}")
    assert b"PriorityLevelName" not in d.body
    assert [p for p, _ in gw.upstream.received("/debug/")] == [DUMP]


def test_ops_untrusted_headers_forwarded_without_strip(gateway):
    """Without stripUntrusted the headers travel on (the upstream decides), still not trusted."""
    gw = gateway(spoof_config("10.0.0.0/8", strip=False))
    r = gw.request(PODS, **SPOOF)
    assert r.status == 200 and r.h("x-apf-prioritylevel") == "catch-all", r.headers
    hdrs = gw.upstream.received(PODS)[0][1]
    assert hdrs.get("x-remote-user") == ["admin"] and hdrs.get("x-remote-group") == ["system:masters"], hdrs


def test_ops_trusted_peer_is_exempt(gateway):
    gw = gateway(spoof_config("127.0.0.0/8", strip=True))
    r = gw.request(PODS, **SPOOF)
    assert r.status == 200, gw.fail_msg(repr(r))
    assert r.h("x-apf-prioritylevel") == "exempt" and r.h("x-apf-flowschema") == "exempt", r.headers
    hdrs = gw.upstream.received(PODS)[0][1]
    assert hdrs.get("x-remote-user") == ["admin"] and hdrs.get("x-remote-group") == ["system:masters"], hdrs
    # Exempt: the same burst is never limited.
    gw.upstream.reset()
    res = _burst(gw, 6, 0.5)
    assert client.status_counts(res) == {200: 6}, gw.fail_msg(str(client.status_counts(res)))
    assert gw.upstream.snapshot()["max_in_flight"] == 6, gw.upstream.snapshot()
    # And the dump is answered by the filter.
    gw.upstream.reset()
    d = gw.request(DUMP, **SPOOF)
    assert d.status == 200, gw.fail_msg(repr(d))
    names = {row["PriorityLevelName"] for row in parse_dump(d.body)}
    assert {"exempt", "catch-all"} <= names, d.body.decode()
    assert not gw.upstream.received("/debug/")
