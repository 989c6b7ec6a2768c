"""Assertions for the filter's response contract (kubernetes-apf.md §1 step 9, §9.1, §9.2)."""

from __future__ import annotations

from .client import Result

REJECT_BODY = b"Too many requests, please try again later.\n"
REJECT_CONTENT_TYPE = "text/plain; charset=utf-8"
FS_UID = "x-kubernetes-pf-flowschema-uid"
PL_UID = "x-kubernetes-pf-prioritylevel-uid"


def assert_classified(r: Result, fs_uid: str | None = None, pl_uid: str | None = None) -> None:
    """Every classified response (served or 429) names its FlowSchema and PriorityLevel UIDs."""
    assert r.h(FS_UID) is not None, f"{r!r}: missing {FS_UID}: {r.headers}"
    assert r.h(PL_UID) is not None, f"{r!r}: missing {PL_UID}: {r.headers}"
    if fs_uid is not None:
        assert r.h(FS_UID) == fs_uid, f"{r!r}: {FS_UID}={r.h(FS_UID)} want {fs_uid}"
    if pl_uid is not None:
        assert r.h(PL_UID) == pl_uid, f"{r!r}: {PL_UID}={r.h(PL_UID)} want {pl_uid}"


def assert_rejection(r: Result, fs_uid: str | None = None, pl_uid: str | None = None,
                     reason: str | None = None) -> None:
    """An APF rejection: 429, integer Retry-After in 1..32, plain-text body, PF headers; with an
    explain-group caller, `x-apf-reject-reason`."""
    assert r.status == 429, f"{r!r}: want 429"
    ra = r.h("retry-after")
    assert ra is not None and ra.strip().isdigit(), f"{r!r}: Retry-After={ra!r}"
    assert 1 <= int(ra) <= 32, f"{r!r}: Retry-After={ra}"
    assert r.h("content-type") == REJECT_CONTENT_TYPE, f"{r!r}: content-type={r.h('content-type')!r}"
    assert r.body == REJECT_BODY, f"{r!r}: body={r.body!r}"
    assert_classified(r, fs_uid, pl_uid)
    if reason is not None:
        assert r.h("x-apf-reject-reason") == reason, \
            f"{r!r}: x-apf-reject-reason={r.h('x-apf-reject-reason')!r} want {reason!r}"


def assert_all_200_or_429(results: list[Result]) -> None:
    bad = [r for r in results if r.status not in (200, 429)]
    assert not bad, f"{len(bad)} responses neither 200 nor 429, e.g. {bad[:5]}"
    for r in results:
        if r.status == 429:
            assert_rejection(r)
