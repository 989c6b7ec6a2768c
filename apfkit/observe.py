"""Reading what a gateway exposes: Prometheus text, the debug dumps, ECDS stats and the filter's
log lines."""

from __future__ import annotations

import re

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# The filter's log line when a VM applies a policy read from the cluster: (thread id, flow schemas).
APPLIED = re.compile(r"^\[[^]]*\]\[(\d+)\]\[\w+\]\[(?:wasm|dynamic_modules)\].*cluster policy from \S+ generation \d+ applied: "
                     r"\d+ priority levels, (\d+) flow schemas")


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(metric name, labels, value) for every sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line.strip())
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            v = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), labels, v))
    return out


def prom_sum(samples, name: str, **labels: str) -> float:
    """Sum of `name` samples whose labels include `labels`."""
    return sum(v for n, ls, v in samples
               if n == name and all(ls.get(k) == want for k, want in labels.items()))


def prom_series(samples, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [(ls, v) for n, ls, v in samples
            if n == name and all(ls.get(k) == want for k, want in labels.items())]


def parse_dump(body: bytes) -> list[dict[str, str]]:
    """A debug dump (comma + tab separated, first line = column names) as a list of rows."""
    lines = [ln for ln in body.decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return []
    cols = [c.strip() for c in lines[0].split(",")]
    return [dict(zip(cols, (c.strip() for c in ln.split(",")))) for ln in lines[1:]]


def level_rows(gw) -> dict[str, dict[str, str]]:
    """dump_priority_levels as {level name: row}."""
    r = gw.debug_dump("priority_levels")
    assert r.status == 200, gw.fail_msg(f"dump_priority_levels: {r!r}")
    return {row["PriorityLevelName"]: row for row in parse_dump(r.body)}


def ecds_stat(gw, name: str) -> int:
    """extension_config_discovery.http_filter.apf.<name> (config_reload, config_fail,
    update_success, update_rejected, ...)."""
    key = f"extension_config_discovery.http_filter.apf.{name}"
    return gw.stats("extension_config_discovery").get(key, 0)
