"""(e) kubectl through the gateway: `kubectl get --raw` and `kubectl get pods` (discovery + list).

Works with any forwarding module (so it is also a harness test). Skipped with a clear message only
when kubectl is not installed locally; CI (.ci/run) installs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from apfkit.apf_policy import plugin_config

pytestmark = pytest.mark.harness

KUBECTL = shutil.which("kubectl")


def kubectl(port: int, tmp_path, *args: str) -> subprocess.CompletedProcess:
    if KUBECTL is None:
        pytest.skip("kubectl is not installed (apt-get install kubectl); CI installs it")
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "no-kubeconfig"), HOME=str(tmp_path))
    return subprocess.run([KUBECTL, "--server", f"http://127.0.0.1:{port}", "--request-timeout=20s",
                           *args], capture_output=True, text=True, timeout=60, env=env,
                          stdin=subprocess.DEVNULL)


def test_harness_kubectl_get_raw_pods_through_gateway(gateway, tmp_path):
    gw = gateway(plugin_config())
    p = kubectl(gw.port, tmp_path, "get", "--raw", "/api/v1/namespaces/default/pods")
    assert p.returncode == 0, gw.fail_msg(f"kubectl failed: {p.stderr}")
    doc = json.loads(p.stdout)
    assert doc["kind"] == "PodList" and doc["items"][0]["metadata"]["name"] == "demo-pod"
    assert gw.upstream.snapshot()["total"] >= 1


def test_harness_kubectl_get_pods_through_gateway(gateway, tmp_path):
    gw = gateway(plugin_config())
    p = kubectl(gw.port, tmp_path, "get", "pods", "-n", "default", "-o", "name")
    assert p.returncode == 0, gw.fail_msg(f"kubectl failed: {p.stderr}")
    assert p.stdout.strip() == "pod/demo-pod"
