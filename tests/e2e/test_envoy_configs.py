"""(f) Every Envoy configuration shipped in envoy/ validates with `envoy --mode validate`, and the
ECDS example really serves traffic and hot-reloads its filter configuration from the file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from apfkit.envoyproc import REPO, EnvoyProcess, validate_config, wait_until
from apfkit.upstream import Upstream

pytestmark = pytest.mark.harness

ENVOY_DIR = REPO / "envoy"
MODULE_PATHS = ("target/wasm32-wasip1/release/apf_wasm.wasm", "/etc/envoy/apf_wasm.wasm")
CERT_DIRS = ("/etc/kubernetes/pki/", "/etc/envoy/tls/")
# The shipped kube-apiserver example reads its cluster token from Envoy's environment.
TOKEN_ENV = {"APF_WASM_TOKEN": "placeholder-token"}


def bootstrap_files() -> list[Path]:
    """Envoy bootstraps (files with static_resources), not Istio manifests or ECDS resources, nor
    the native host's (native*.yaml: they load a dynamic module; tests/e2e/test_deploy.py)."""
    return sorted(p for p in ENVOY_DIR.rglob("*.yaml")
                  if "static_resources:" in p.read_text() and not p.name.startswith("native"))


def _certs(dirpath: Path) -> None:
    """Self-signed placeholder certificates under every name the examples reference."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: cannot make placeholder certificates")
    dirpath.mkdir(parents=True, exist_ok=True)
    key, crt = dirpath / "tls.key", dirpath / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=apf-e2e", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True, timeout=60)
    for stem in ("ca", "front-proxy-client", "gateway"):
        shutil.copy(crt, dirpath / f"{stem}.crt")
        shutil.copy(key, dirpath / f"{stem}.key")


def localize(text: str, wasm: str, certs: Path) -> str:
    for m in MODULE_PATHS:
        text = text.replace(m, wasm)
    for d in CERT_DIRS:
        text = text.replace(d, str(certs) + "/")
    return text


def copy_tree(dst: Path, wasm: str, certs: Path) -> Path:
    out = dst / "envoy"
    for p in ENVOY_DIR.rglob("*"):
        if p.is_file():
            q = out / p.relative_to(ENVOY_DIR)
            q.parent.mkdir(parents=True, exist_ok=True)
            q.write_text(localize(p.read_text(), wasm, certs))
    return dst


def test_harness_envoy_dir_has_the_examples():
    names = {p.relative_to(ENVOY_DIR).as_posix() for p in ENVOY_DIR.rglob("*.yaml")}
    assert {"demo.yaml", "kube-apiserver.yaml", "istio-wasmplugin.yaml", "ecds/envoy.yaml",
            "ecds/apf-filter.yaml"} <= names
    istio = (ENVOY_DIR / "istio-wasmplugin.yaml").read_text()
    for key in ("kind: WasmPlugin", "phase: AUTHZ", "failStrategy:", "pluginConfig:"):
        assert key in istio


@pytest.mark.parametrize("name", [p.relative_to(ENVOY_DIR).as_posix() for p in bootstrap_files()])
def test_harness_envoy_config_validates(name, envoy_bin, wasm_module, tmp_path):
    root = copy_tree(tmp_path, wasm_module, tmp_path / "certs")
    if name == "kube-apiserver.yaml":
        _certs(tmp_path / "certs")
    # Relative paths in the examples are relative to the repo root.
    p = validate_config(envoy_bin, str(root / "envoy" / name), cwd=root, env=TOKEN_ENV)
    assert p.returncode == 0, f"{name} invalid:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def test_kube_apiserver_example_refuses_to_start_without_its_token(envoy_bin, wasm_module, tmp_path):
    """Without APF_WASM_TOKEN in Envoy's environment the filter's configuration is invalid, the
    error names the field, and (FAIL_CLOSED) Envoy does not start with it."""
    root = copy_tree(tmp_path, wasm_module, tmp_path / "certs")
    _certs(tmp_path / "certs")
    env = {k: v for k, v in os.environ.items() if k != "APF_WASM_TOKEN"}
    p = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(root / "envoy/kube-apiserver.yaml"),
                        "-l", "warning", "--disable-hot-restart"], cwd=root, env=env, capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert 'workEstimator.clusterMetrics.tokenEnv: Invalid value: "APF_WASM_TOKEN"' in out, out[-3000:]


def test_harness_ecds_example_serves_and_hot_reloads(envoy_bin, wasm_module, tmp_path):
    up = Upstream().start()
    root = copy_tree(tmp_path, wasm_module, tmp_path / "certs")
    boot = (root / "envoy/ecds/envoy.yaml").read_text()
    boot = re.sub(r"port_value: (9902|10001)", "port_value: 0", boot)
    boot = boot.replace("port_value: 8080", f"port_value: {up.port}")
    env = EnvoyProcess(boot, tmp_path / "run", envoy_bin=envoy_bin, name="ecds", cwd=root)
    try:
        env.start().wait_ready(timeout=40)
        port = env.ports["gateway"]
        from apfkit.client import request

        r = wait_until(lambda: (lambda x: x if x.status == 200 else None)(
            request(port, path="/healthz", user="u", groups=("system:authenticated",), timeout=5)),
            timeout=20, what="traffic through the ECDS-configured filter")
        assert r.status == 200
        # Hot reload: replace the resource with a different plugin configuration (mv into place).
        filt = root / "envoy/ecds/apf-filter.yaml"
        new = filt.read_text().replace('"serverConcurrencyLimit":600', '"serverConcurrencyLimit":601')
        assert new != filt.read_text()
        tmp = root / "envoy/ecds/.apf-filter.yaml.new"
        tmp.write_text(new)
        before = env.stats("extension_config_discovery").get(
            "extension_config_discovery.http_filter.apf.config_reload", 0)
        os.replace(tmp, filt)
        wait_until(lambda: env.stats("extension_config_discovery").get(
            "extension_config_discovery.http_filter.apf.config_reload", 0) > before,
            timeout=20, what="ECDS config_reload counter to increase")
        assert request(port, path="/healthz", user="u", groups=("system:authenticated",)).status == 200
    except Exception:
        print(env.log_tail(60))
        raise
    finally:
        env.stop()
        up.stop()
