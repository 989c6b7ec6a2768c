"""The native (Envoy dynamic module) variants of bench/run.py: building or finding the modules,
and the filter that loads one.

A dynamic module is `lib<name>.so`, found by Envoy in the directory named by the environment
variable ENVOY_DYNAMIC_MODULES_SEARCH_PATH (`source/extensions/dynamic_modules/dynamic_modules.cc:
newDynamicModuleByName`); the filter passes it our JSON as a `google.protobuf.StringValue`, which
Envoy hands over without the wrapper (`api/envoy/extensions/filters/http/dynamic_modules/v3/
dynamic_modules.proto: DynamicModuleFilter.filter_config`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"
SEARCH_PATH = "ENVOY_DYNAMIC_MODULES_SEARCH_PATH"


def module_name(so: Path) -> str:
    """`libapf_wasm.so` → `apf_wasm`: the name Envoy's config gives the module."""
    stem = so.name.removesuffix(".so")
    return stem.removeprefix("lib")


def dynamic_module_filter(so: Path, plugin_config: dict | str | None, filter_name: str = "apf") -> dict:
    """`envoy.filters.http.dynamic_modules` loading `so` (by name, from its directory: see
    `module_env`) with `plugin_config` (the JSON apf-wasm's wasm module takes)."""
    cfg = plugin_config if isinstance(plugin_config, str) else json.dumps(plugin_config or {})
    return {"name": "envoy.filters.http.dynamic_modules", "typed_config": {
        "@type": FILTER_TYPE,
        "dynamic_module_config": {"name": module_name(so)},
        "filter_name": filter_name,
        "filter_config": {"@type": STRING_VALUE, "value": cfg},
    }}


def module_env(so: Path | None) -> dict[str, str] | None:
    """The environment an Envoy loading `so` needs (None: no dynamic module)."""
    return {SEARCH_PATH: str(so.resolve().parent)} if so else None


def last_line_path(cmd: list[str], env: dict | None = None) -> Path:
    out = subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE, cwd=REPO,
                         env=env).stdout
    return Path(out.strip().splitlines()[-1])


def build_native_floor(tdir: Path) -> Path:
    """bench/native-floor/build.sh into `tdir`: libapf_native_floor.so."""
    return last_line_path([str(REPO / "bench/native-floor/build.sh")],
                          dict(os.environ, CARGO_TARGET_DIR=str(tdir)))


def build_native_isolated(tdir: Path) -> Path:
    """The native no-sharing control: ./native-build.sh with the feature native-isolated-levels
    (each worker keys its levels apart) into `tdir` (its own directory: Envoy finds a module by
    name, and both are libapf_wasm.so)."""
    return last_line_path([str(REPO / "native-build.sh"), "--features", "native-isolated-levels"],
                          dict(os.environ, CARGO_TARGET_DIR=str(tdir)))


def find_apf_native(arg: str | None, what: str = "apf-native") -> Path | None:
    """The native apf-wasm module: `arg` (--apf-native), else $APF_NATIVE, else what
    ./native-build.sh prints last; None (the caller skips its variants) when none of them
    gives an existing file."""
    given = arg or os.environ.get("APF_NATIVE")
    if given:
        p = Path(given)
        if not p.is_file():
            raise SystemExit(f"{what}: {p} does not exist")
        return p
    script = REPO / "native-build.sh"
    if not script.exists():
        print(f"[bench] {what}: skipped: no --apf-native, no APF_NATIVE and no ./native-build.sh "
              "(the native host is not built in this checkout)", file=sys.stderr)
        return None
    p = last_line_path([str(script)])
    if not p.is_file():
        raise SystemExit(f"{what}: ./native-build.sh printed {p}, which does not exist")
    return p
