"""The native host (Envoy dynamic module `libapf_wasm.so`): what only it has. Loading it into an
Envoy of another minor fails at load with a clear message (the module binds every Envoy symbol
it uses when it is loaded, so a missing one is a load error, not a crash later); a configuration
with HTTP calls (clusterPolicy, clusterMetrics, fleet) loads, one with a `jwt` identity source is
refused at configuration time; the module exports Envoy's hooks.
The behaviour both hosts share is the `core` subset, run with `APF_HOST=native`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from apfkit.apf_policy import single_level_config
from apfkit.envoy_template import gateway_config
from apfkit.envoyproc import REPO, validate_config

pytestmark = pytest.mark.native

OLD_ENVOY = REPO / ".venv-envoy-1.36.4" / "lib" / "python3.11" / "site-packages" / "envoy" / "_bin" / "envoy"
HOOKS = ("envoy_dynamic_module_on_program_init", "envoy_dynamic_module_on_http_filter_config_new",
         "envoy_dynamic_module_on_http_filter_new", "envoy_dynamic_module_on_http_filter_request_headers",
         "envoy_dynamic_module_on_http_filter_scheduled", "envoy_dynamic_module_on_http_filter_destroy")


def _validate(envoy_bin: str, module: str, plugin_config: dict, tmp_path: Path):
    cfg = gateway_config(upstream_port=9, plugin_config=plugin_config, http_filter="native")
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(cfg))
    return validate_config(envoy_bin, str(path),
                           env={"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(Path(module).parent)})


def test_module_exports_envoys_hooks_and_binds_now(native_module):
    nm = subprocess.run(["nm", "-D", "--defined-only", native_module], capture_output=True,
                        text=True, check=True).stdout
    missing = [h for h in HOOKS if h not in nm]
    assert not missing, missing
    # NOW: every Envoy symbol is resolved at dlopen (a wrong Envoy fails to load the module);
    # NODELETE: never unmapped while its timer thread runs.
    dyn = subprocess.run(["readelf", "-d", native_module], capture_output=True, text=True,
                         check=True).stdout
    flags = next(ln for ln in dyn.splitlines() if "FLAGS_1" in ln)
    assert "NOW" in flags and "NODELETE" in flags, flags


def test_valid_configuration_loads_in_envoy_1_40(native_module, envoy_bin, tmp_path):
    v = _validate(envoy_bin, native_module, single_level_config(4), tmp_path)
    out = v.stdout + v.stderr
    assert v.returncode == 0, out[-2000:]
    # The module declares 1.40's ABI version (another one loads with a "deprecated" warning).
    assert "is deprecated" not in out, out[-2000:]


def test_configuration_with_http_calls_loads(native_module, envoy_bin, tmp_path):
    cfg = single_level_config(4)
    cfg["clusterPolicy"] = {"cluster": "apiserver"}
    v = _validate(envoy_bin, native_module, cfg, tmp_path)
    out = v.stdout + v.stderr
    assert v.returncode == 0, out[-2000:]


def test_jwt_identity_is_refused(native_module, envoy_bin, tmp_path):
    cfg = single_level_config(4)
    cfg["identity"] = {"sources": [{"type": "jwt", "groupsClaim": "groups"}]}
    v = _validate(envoy_bin, native_module, cfg, tmp_path)
    out = v.stdout + v.stderr
    assert v.returncode != 0, out[-2000:]
    assert "Failed to initialize dynamic module" in out, out[-2000:]
    assert "identity source `jwt`" in out, out[-2000:]


@pytest.mark.skipif(not OLD_ENVOY.exists(), reason="no Envoy 1.36.4 (.venv-envoy-1.36.4)")
def test_other_minor_fails_to_load_with_a_clear_message(native_module, tmp_path):
    v = _validate(str(OLD_ENVOY), native_module, single_level_config(4), tmp_path)
    out = v.stdout + v.stderr
    assert v.returncode != 0, out[-2000:]
    # e.g. "Failed to load dynamic module: …/libapf_wasm.so: undefined symbol:
    # envoy_dynamic_module_callback_http_add_header"
    assert "Failed to load dynamic module" in out and "undefined symbol" in out, out[-2000:]
    assert "Segmentation fault" not in out and "Caught Segmentation" not in out, out[-2000:]
