"""deploy/: the kustomize base and overlays render with `kubectl kustomize`, every manifest
validates against the Kubernetes schemas (kubernetes-validate, which bundles them), the pieces fit
together (mounts, probes, RBAC, selectors), and the Envoy configuration inside loads in
`envoy --mode validate` and, started, answers the kubelet's probe on /ready. The fleet overlay's
etcd is production-shaped (three members on volumes, TLS for clients and peers, auth, PDB,
NetworkPolicy), and scripts/fleet-etcd-setup.sh works: its certificates, Secrets (through a
recording kubectl) and users set up an etcd started with the StatefulSet's own flags; the
overlay's Envoy, its password in the environment as the Deployment sets it, registers in it, and
its preStop hook's leave request, on the loopback listener fleet_leave, removes its record at
once (and is not honoured on the main listener)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from apfkit.envoyproc import REPO, EnvoyProcess, http_get, validate_config, wait_until
from apfkit.etcdproc import Etcd, b64, range_end
from apfkit.pki import have_openssl, self_signed

yaml = pytest.importorskip("yaml", reason="PyYAML (installed with kubernetes-validate by scripts/envoy-env.sh)")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (scripts/envoy-env.sh)")

pytestmark = pytest.mark.harness

DEPLOY = REPO / "deploy"
# Each kustomization and the Kubernetes versions its manifests must validate against: the base
# and the fleet overlay from the oldest schema kubernetes-validate bundles; image volumes exist
# from 1.31 and are on by default from 1.35.
KUSTOMIZATIONS = {
    "base": ("1.25.0", "1.31.0", "1.35.0", "latest"),
    "overlays/fleet": ("1.25.0", "1.35.0", "latest"),
    "overlays/image-volume": ("1.35.0", "latest"),
}
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount/"
# Where the rendered Envoy configuration reads files, and what the test substitutes.
MODULE_PATH = "/etc/apf/plugin.wasm"
ETCD_CLIENT_DIR = "/etc/apf-gateway/etcd/"
CERT_DIRS = ("/etc/apf-gateway/tls/", "/etc/apf-gateway/front-proxy/", ETCD_CLIENT_DIR, SA_DIR)
# Secrets the operator creates before applying (docs/deployment.md says how).
OPERATOR_SECRETS = {"apf-gateway-tls", "apf-gateway-front-proxy"}
# ... and for the fleet overlay (scripts/fleet-etcd-setup.sh secrets): the gateway's, etcd's, and
# root's password, which only the setup script reads.
FLEET_GATEWAY_SECRETS = {"apf-gateway-etcd-client", "apf-gateway-etcd-auth"}
FLEET_ETCD_SECRETS = {"apf-gateway-etcd-server", "apf-gateway-etcd-peer", "apf-gateway-etcd-jwt"}
FLEET_SECRETS = FLEET_GATEWAY_SECRETS | FLEET_ETCD_SECRETS | {"apf-gateway-etcd-root"}
SETUP = REPO / "scripts" / "fleet-etcd-setup.sh"
# The fleet overlay: the variable the etcd password comes in, the listener of the leave request.
PASSWORD_ENV = "FLEET_ETCD_PASSWORD"
LEAVE_LISTENER = "fleet_leave"
# The path the filter answers (src/gateway/fleet.rs: LEAVE_PATH).
LEAVE_PATH = re.search(r'pub const LEAVE_PATH: &str = "([^"]+)"', (REPO / "src/gateway/fleet.rs").read_text())[1]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl not installed (scripts/prereqs.sh e2e)")
    return path


def render(name: str) -> list[dict]:
    p = subprocess.run([kubectl(), "kustomize", str(DEPLOY / name)], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"kubectl kustomize deploy/{name} failed:\n{p.stderr[-3000:]}"
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    assert docs, f"deploy/{name} rendered nothing"
    return docs


def one(docs: list[dict], kind: str, name: str = "apf-gateway", hashed: bool = False) -> dict:
    """The `kind` named `name` (`hashed`: a generated name, `name-<hash>`)."""
    named = (lambda n: n.startswith(f"{name}-")) if hashed else (lambda n: n == name)
    found = [d for d in docs if d["kind"] == kind and named(d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def envoy_config(docs: list[dict]) -> str:
    return one(docs, "ConfigMap", "apf-gateway-envoy", hashed=True)["data"]["envoy.yaml"]


def wasm_filter_config(boot: dict) -> dict:
    for ls in boot["static_resources"]["listeners"]:
        for fc in ls["filter_chains"]:
            for f in fc["filters"]:
                for hf in f["typed_config"].get("http_filters", []):
                    if hf["name"] == "envoy.filters.http.wasm":
                        return hf["typed_config"]["config"]
    raise AssertionError("no wasm filter in the Envoy configuration")


def plugin_config(boot: dict) -> dict:
    return json.loads(wasm_filter_config(boot)["configuration"]["value"])


def gateway_container(deployment: dict) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "envoy")


def secrets_used(pod_spec: dict) -> set[str]:
    """The Secrets a pod mounts or takes environment variables from (any container)."""
    used = {v["secret"]["secretName"] for v in pod_spec["volumes"] if "secret" in v}
    for c in pod_spec["containers"] + pod_spec.get("initContainers", []):
        used |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    return used


def listener(boot: dict, name: str) -> dict:
    return next(ls for ls in boot["static_resources"]["listeners"] if ls["name"] == name)


def hcm(ls: dict) -> dict:
    [chain] = ls["filter_chains"]
    [f] = chain["filters"]
    assert f["name"] == "envoy.filters.network.http_connection_manager"
    return f["typed_config"]


def prestop(docs: list[dict]) -> str:
    """The gateway container's preStop script (`bash -c SCRIPT`)."""
    command = gateway_container(one(docs, "Deployment"))["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["bash", "-c"] and len(command) == 3, command
    return command[2]


def run_prestop(docs: list[dict], port: int, bindir: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Runs the preStop script with its leave request sent to `port` and a `sleep` that returns
    at once and records its arguments: the completed process and the sleeps asked for."""
    script = prestop(docs)
    assert script.count("/dev/tcp/127.0.0.1/9903") == 1, script
    script = script.replace("/dev/tcp/127.0.0.1/9903", f"/dev/tcp/127.0.0.1/{port}")
    bindir.mkdir(parents=True, exist_ok=True)
    log = bindir / "sleeps"
    log.write_text("")
    (bindir / "sleep").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bindir / "sleep").chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    p = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    return p, log.read_text().split()


def certs(d: Path) -> Path:
    """Placeholder files under every name the rendered configuration reads."""
    if not have_openssl():
        pytest.skip("openssl not installed: cannot make placeholder certificates")
    d.mkdir(parents=True, exist_ok=True)
    self_signed(d, "tls", "/CN=apf-deploy-test")
    shutil.copy(d / "tls.crt", d / "ca.crt")
    return d


def localize(text: str, wasm: str, certdir: Path) -> str:
    text = text.replace(MODULE_PATH, wasm)
    for prefix in CERT_DIRS:
        text = text.replace(prefix, f"{certdir}/")
    return text


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_deploy_renders_and_validates_against_the_kubernetes_schemas(name):
    docs = render(name)
    for version in KUSTOMIZATIONS[name]:
        v = kubernetes_validate.latest_version() if version == "latest" else version
        for d in docs:
            try:
                kubernetes_validate.validate(d, v, strict=True)
            except Exception as e:  # noqa: BLE001 - kubernetes_validate's and jsonschema's errors
                where = ".".join(map(str, getattr(e, "path", [])))
                pytest.fail(f"deploy/{name}: {d['kind']} {d['metadata']['name']} invalid for Kubernetes {v}: "
                            f"{getattr(e, 'message', e)} at {where}")


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_deploy_pieces_fit_together(name):
    docs = render(name)
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "ServiceAccount", "Secret", "ClusterRole", "ClusterRoleBinding", "Deployment",
            "Service", "PodDisruptionBudget", "ConfigMap"} <= kinds, kinds
    dep = one(docs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] >= 2
    assert spec["affinity"]["podAntiAffinity"], "replicas spread over nodes"
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    selects = lambda sel: all(pod_labels.get(k) == v for k, v in sel.items())
    assert selects(dep["spec"]["selector"]["matchLabels"])
    assert selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    svc = one(docs, "Service", "apf-gateway")
    assert selects(svc["spec"]["selector"])
    envoy = gateway_container(dep)
    assert envoy["resources"]["requests"]["cpu"] and envoy["resources"]["requests"]["memory"]
    assert envoy["resources"]["limits"]["memory"]
    ports = {p["name"]: p["containerPort"] for p in envoy["ports"]}
    assert svc["spec"]["ports"][0]["targetPort"] in ports

    boot = yaml.safe_load(envoy_config(docs))
    listeners = {ls["name"]: ls for ls in boot["static_resources"]["listeners"]}
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    port_of = lambda ls: ls["address"]["socket_address"]["port_value"]
    assert port_of(listeners["apiserver_gateway"]) == ports["https"]
    # The probes reach Envoy's /ready: the health listener routes exactly /ready to the admin
    # interface, which stays on 127.0.0.1.
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = envoy[probe]["httpGet"]
        assert get["path"] == "/ready" and ports[get["port"]] == port_of(listeners["health"]), probe
    admin = boot["admin"]["address"]["socket_address"]
    assert admin["address"] == "127.0.0.1"
    admin_ep = clusters["envoy_admin"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert admin_ep["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": admin["port_value"]}
    # Every file the configuration reads is mounted into the container, from a volume the pod has.
    mounts = {m["mountPath"].rstrip("/") + "/": m["name"] for m in envoy["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    text = envoy_config(docs)
    files = {w.strip('"') for line in text.splitlines() for w in line.split() if w.startswith(("/etc/", "/var/"))}
    assert MODULE_PATH in files and any(f.startswith(SA_DIR) for f in files), files
    for f in files:
        if f.startswith(SA_DIR):
            assert spec.get("automountServiceAccountToken", True), f
            continue
        mount = [m for m in mounts if f.startswith(m)]
        assert mount and mounts[mount[0]] in volumes, f"{f} is not on a mounted volume"
    # The module volume is filled from the OCI image: by the init container or as an image volume.
    module_volume = volumes[mounts["/etc/apf/"]]
    if "image" in module_volume:
        assert module_volume["image"]["reference"] and not spec.get("initContainers")
    else:
        init = spec["initContainers"][0]
        assert "emptyDir" in module_volume and any(m["name"] == module_volume["name"] for m in init["volumeMounts"])
        assert "plugin.wasm" in " ".join(init["args"]) and any(e["name"] == "APF_WASM_IMAGE" for e in init["env"])
    # Secrets: the token Secret is rendered; the TLS ones the operator creates (documented).
    rendered = {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
    used = secrets_used(spec)
    expected = OPERATOR_SECRETS | (FLEET_GATEWAY_SECRETS if name == "overlays/fleet" else set())
    assert used - rendered == expected, used - rendered
    guide = (REPO / "docs/deployment.md").read_text()
    assert all(s in guide for s in expected)
    token = one(docs, "Secret", "apf-gateway-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    sa = one(docs, "ServiceAccount")
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == sa["metadata"]["name"]
    assert spec["serviceAccountName"] == sa["metadata"]["name"]
    cfg = plugin_config(boot)
    # Open-watch limits on, at the value docs/configuration.md sizes for a reconnecting cluster.
    assert cfg["watchLimits"] == {"perFlow": 12000}
    assert cfg["clusterPolicy"]["tokenEnv"] == "APF_WASM_TOKEN" and "pathPrefix" not in cfg["clusterPolicy"]
    assert cfg["clusterPolicy"]["cluster"] in clusters
    assert any(e["name"] == "APF_WASM_TOKEN" for e in envoy["env"])
    # RBAC: what the polls need, bound to the service account.
    role = one(docs, "ClusterRole")
    rules = role["rules"]
    fc = [r for r in rules if "flowcontrol.apiserver.k8s.io" in r.get("apiGroups", [])]
    assert fc and {"flowschemas", "prioritylevelconfigurations"} <= set(fc[0]["resources"])
    assert {"get", "list", "watch"} <= set(fc[0]["verbs"])
    urls = {u for r in rules for u in r.get("nonResourceURLs", []) if "get" in r["verbs"]}
    assert {"/metrics", "/apis/flowcontrol.apiserver.k8s.io"} <= urls
    assert not any(v in r["verbs"] for r in rules for v in ("create", "update", "patch", "delete", "*")), "read-only"
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    if name == "overlays/fleet":
        assert cfg["fleet"]["etcd"]["cluster"] in clusters
        etcd = one(docs, "Service", "apf-gateway-etcd")
        target = clusters[cfg["fleet"]["etcd"]["cluster"]]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
        addr = target["endpoint"]["address"]["socket_address"]
        assert addr["address"].startswith(f"{etcd['metadata']['name']}.{etcd['metadata']['namespace']}.svc")
        assert addr["port_value"] == etcd["spec"]["ports"][0]["port"]


def test_deploy_fleet_overlay_is_the_base_plus_fleet():
    """The overlay's Envoy configuration is the base's with `fleet`, its password variable in
    host_env_keys, the etcd cluster, the leave listener and the main listener's leave route
    added."""
    base = yaml.safe_load(envoy_config(render("base")))
    fleet = yaml.safe_load(envoy_config(render("overlays/fleet")))
    cfg = plugin_config(fleet)
    etcd_cluster = cfg.pop("fleet")["etcd"]["cluster"]
    assert cfg == plugin_config(base)
    fleet["static_resources"]["clusters"] = [c for c in fleet["static_resources"]["clusters"] if c["name"] != etcd_cluster]
    fleet["static_resources"]["listeners"].remove(listener(fleet, LEAVE_LISTENER))
    [routes] = [vh["routes"] for vh in hcm(listener(fleet, "apiserver_gateway"))["route_config"]["virtual_hosts"]]
    assert routes[0]["match"] == {"path": LEAVE_PATH}
    del routes[0]
    env_keys = wasm_filter_config(fleet)["vm_config"]["environment_variables"]["host_env_keys"]
    env_keys.remove(PASSWORD_ENV)
    for b in (base, fleet):
        wasm_filter_config(b)["configuration"]["value"] = ""
    assert fleet == base


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_deploy_envoy_config_validates(name, envoy_bin, wasm_module, tmp_path):
    docs = render(name)
    text = envoy_config(docs)
    text = localize(text, wasm_module, certs(tmp_path / "certs"))
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    env = {"APF_WASM_TOKEN": "placeholder-token", PASSWORD_ENV: "0123abcdef"}
    p = validate_config(envoy_bin, str(path), env=env)
    assert p.returncode == 0, f"deploy/{name}: Envoy refuses its configuration:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    if name == "overlays/fleet":
        # The plugin really reads the password from the environment (the YAML aliases too).
        p = validate_config(envoy_bin, str(path), env={**env, PASSWORD_ENV: ""})
        out = p.stdout + p.stderr
        assert p.returncode != 0 and f'fleet.etcd.passwordEnv: Invalid value: "{PASSWORD_ENV}"' in out, out[-3000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the fleet overlay's etcd --------------------------------------------------------------------


def etcd_flags(container: dict) -> dict[str, str]:
    """etcd's command line as {flag: value} (a bare flag: "true")."""
    assert container["command"][0] == "etcd"
    flags = {}
    for a in container["command"][1:] + container.get("args", []):
        k, _, v = a.partition("=")
        assert k.startswith("--") and k not in flags, a
        flags[k] = v or "true"
    return flags


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_deploy_fleet_etcd_is_production_shaped():
    """Three members on PersistentVolumes, a headless peer Service and a client Service, a PDB
    (maxUnavailable 1), anti-affinity, resources, probes on /health of the metrics port, TLS for
    clients and peers with certificates from mounted Secrets, JWT auth tokens, and a
    NetworkPolicy: client port from the gateway's pods, peer port from the members, metrics from
    the monitoring namespace."""
    docs = render("overlays/fleet")
    sts = one(docs, "StatefulSet", "apf-gateway-etcd")
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    assert selects(spec["selector"], labels)
    # Storage: one claim per member, mounted where the data directory is.
    [claim] = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["resources"]["requests"]["storage"]
    [etcd] = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in etcd["volumeMounts"]}
    flags = etcd_flags(etcd)
    data_mount = [m for m in mounts if flags["--data-dir"].startswith(m + "/")]
    assert data_mount and mounts[data_mount[0]] == claim["metadata"]["name"], flags["--data-dir"]
    assert not any("emptyDir" in v for v in pod.get("volumes", []))
    # Services: the headless one names the members (published before ready), the other serves clients.
    peer_svc = one(docs, "Service", spec["serviceName"])
    assert peer_svc["spec"]["clusterIP"] == "None" and peer_svc["spec"]["publishNotReadyAddresses"] is True
    client_svc = one(docs, "Service", "apf-gateway-etcd")
    assert client_svc["spec"].get("clusterIP") != "None"
    for svc in (peer_svc, client_svc):
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    ports = {p["name"]: p["containerPort"] for p in etcd["ports"]}
    assert [p["targetPort"] for p in client_svc["spec"]["ports"]] == ["client"]
    pdb = one(docs, "PodDisruptionBudget", "apf-gateway-etcd")
    assert pdb["spec"]["maxUnavailable"] == 1 and selects(pdb["spec"]["selector"], labels)
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"], labels)
    assert etcd["resources"]["requests"]["cpu"] and etcd["resources"]["requests"]["memory"]
    # Listeners: clients and peers over TLS, metrics apart on their own port.
    port_of = lambda url: int(url.rsplit(":", 1)[1])
    assert flags["--listen-client-urls"].startswith("https://") and port_of(flags["--listen-client-urls"]) == ports["client"]
    assert flags["--listen-peer-urls"].startswith("https://") and port_of(flags["--listen-peer-urls"]) == ports["peer"]
    assert flags["--initial-advertise-peer-urls"].startswith("https://")
    assert flags["--advertise-client-urls"].startswith("https://")
    assert port_of(flags["--listen-metrics-urls"]) == ports["metrics"] not in (ports["client"], ports["peer"])
    members = dict(m.split("=", 1) for m in flags["--initial-cluster"].split(","))
    assert sorted(members) == [f"apf-gateway-etcd-{i}" for i in range(3)]
    assert all(u.startswith(f"https://{n}.{peer_svc['metadata']['name']}.") for n, u in members.items())
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = etcd[probe]["httpGet"]
        assert get["path"].startswith("/health") and ports[get["port"]] == ports["metrics"], probe
    assert "serializable=true" in etcd["livenessProbe"]["httpGet"]["path"], "a lost quorum must not restart every member"
    # TLS both ways, from mounted Secrets.
    secret_mounts = {path: next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == vol)
                     for path, vol in mounts.items() if any(v["name"] == vol and "secret" in v for v in pod["volumes"])}
    assert set(secret_mounts.values()) == FLEET_ETCD_SECRETS
    for flag in ("--client-cert-auth", "--peer-client-cert-auth"):
        assert flags[flag] == "true", flag
    files = [flags[f] for f in ("--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file",
                                "--peer-key-file", "--peer-trusted-ca-file")]
    auth_token = dict(kv.split("=", 1) for kv in flags["--auth-token"].split(",")[1:])
    assert flags["--auth-token"].startswith("jwt,") and auth_token["sign-method"].startswith("RS")
    files += [auth_token["pub-key"], auth_token["priv-key"]]
    for f in files:
        assert any(f.startswith(m + "/") for m in secret_mounts), f"{f} is not in a mounted Secret"
    assert flags["--cert-file"].rsplit("/", 1)[0] != flags["--peer-cert-file"].rsplit("/", 1)[0]
    # Every Secret is created by the setup script and named in the guide.
    script, guide = SETUP.read_text(), (REPO / "docs/deployment.md").read_text()
    for name in FLEET_SECRETS:
        assert f'"$ETCD_NAME-{name.removeprefix("apf-gateway-etcd-")}"' in script and name in guide, name
    # The NetworkPolicy: every rule names its peers and ports; each port opened to its own.
    gateway_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    netpol = one(docs, "NetworkPolicy", "apf-gateway-etcd")
    assert netpol["spec"]["policyTypes"] == ["Ingress"] and selects(netpol["spec"]["podSelector"], labels)
    rules = {p["port"]: r["from"] for r in netpol["spec"]["ingress"] for p in r["ports"]}
    assert set(rules) == {ports["client"], ports["peer"], ports["metrics"]}
    assert all(r.get("from") and r.get("ports") for r in netpol["spec"]["ingress"])
    [client_from] = rules[ports["client"]]
    assert selects(client_from["podSelector"], gateway_labels) and not selects(client_from["podSelector"], labels)
    [peer_from] = rules[ports["peer"]]
    assert selects(peer_from["podSelector"], labels) and not selects(peer_from["podSelector"], gateway_labels)
    [metrics_from] = rules[ports["metrics"]]
    assert list(metrics_from) == ["namespaceSelector"] and metrics_from["namespaceSelector"]["matchLabels"]


def test_deploy_fleet_gateway_reaches_etcd_over_tls_with_a_password():
    """The gateway's cluster apf_etcd: TLS to the client Service's name, etcd's CA and the
    client certificate from the Secret apf-gateway-etcd-client; the plugin's fleet.etcd has the
    user the setup script creates and its password from the environment variable the Envoy
    container takes from apf-gateway-etcd-auth and the Wasm VM is given (host_env_keys); Envoy
    reads the ConfigMap itself (no init container renders it)."""
    docs = render("overlays/fleet")
    text = envoy_config(docs)
    boot = yaml.safe_load(text)
    etcd_cfg = plugin_config(boot)["fleet"]["etcd"]
    cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == etcd_cfg["cluster"])
    svc = one(docs, "Service", "apf-gateway-etcd")
    fqdn = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    tls = cluster["transport_socket"]
    assert tls["name"] == "envoy.transport_sockets.tls"
    ctx = tls["typed_config"]
    assert ctx["@type"].endswith("UpstreamTlsContext") and ctx["sni"] == fqdn
    common = ctx["common_tls_context"]
    assert common["validation_context"]["trusted_ca"]["filename"] == ETCD_CLIENT_DIR + "ca.crt"
    assert common["validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": fqdn}}]
    [cert] = common["tls_certificates"]
    assert cert["certificate_chain"]["filename"].startswith(ETCD_CLIENT_DIR)
    assert cert["private_key"]["filename"].startswith(ETCD_CLIENT_DIR)
    assert etcd_cfg["authority"] == fqdn
    # The user scripts/fleet-etcd-setup.sh creates (FLEET_USER's default), the password from
    # the environment only.
    user = re.search(r'FLEET_USER="\$\{FLEET_USER:-([^}]+)\}"', SETUP.read_text())[1]
    assert etcd_cfg["username"] == user == "apf-gateway"
    assert etcd_cfg["passwordEnv"] == PASSWORD_ENV and "password" not in etcd_cfg
    assert "@FLEET_ETCD" not in text, "no placeholders left"
    assert PASSWORD_ENV in wasm_filter_config(boot)["vm_config"]["environment_variables"]["host_env_keys"]
    dep = one(docs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    envoy = gateway_container(dep)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in envoy["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs[PASSWORD_ENV] == {"name": "apf-gateway-etcd-auth", "key": "password"}
    assert refs["APF_WASM_TOKEN"]["name"] == "apf-gateway-token", "the base's token is kept"
    volumes = {v["name"]: v for v in spec["volumes"]}
    envoy_mounts = {m["mountPath"]: m["name"] for m in envoy["volumeMounts"]}
    assert volumes[envoy_mounts[ETCD_CLIENT_DIR.rstrip("/")]]["secret"]["secretName"] == "apf-gateway-etcd-client"
    config_volume = volumes[envoy_mounts["/etc/envoy"]]
    assert config_volume["configMap"]["name"].startswith("apf-gateway-envoy-") and "emptyDir" not in config_volume
    assert [i["name"] for i in spec["initContainers"]] == ["fetch-module"], "patches address initContainers/0"
    assert all(v["name"] != "envoy-template" for v in spec["volumes"])
    # The overlay's comments no longer claim a restart is harmless.
    assert "costs a re-registration" not in (DEPLOY / "overlays/fleet/kustomization.yaml").read_text()


def test_deploy_fleet_leave_listener_and_prestop_hook():
    """The stop path: the loopback-only plain listener fleet_leave runs the main listener's wasm
    filter unchanged (same vm_id, same plugin configuration: the leaving flag is in that VM's
    shared data) and routes nothing (404); the main listener answers the leave path 404 with the
    filter off for it; the preStop hook waits as the base's, sends the leave request to
    fleet_leave's port, then waits leaseTtl + one period; the grace period covers the hook."""
    docs = render("overlays/fleet")
    boot = yaml.safe_load(envoy_config(docs))
    leave = listener(boot, LEAVE_LISTENER)
    addr = leave["address"]["socket_address"]
    assert addr["address"] == "127.0.0.1" and addr["port_value"] == 9903
    assert "transport_socket" not in leave["filter_chains"][0]
    ports = {ls["address"]["socket_address"]["port_value"] for ls in boot["static_resources"]["listeners"]}
    assert len(ports) == len(boot["static_resources"]["listeners"]) and boot["admin"]["address"]["socket_address"]["port_value"] not in ports
    leave_hcm, main_hcm = hcm(leave), hcm(listener(boot, "apiserver_gateway"))
    assert leave_hcm["use_remote_address"] is True
    assert leave_hcm["http_filters"][0] == main_hcm["http_filters"][0], "the same wasm filter on both listeners"
    assert [f["name"] for f in leave_hcm["http_filters"]] == ["envoy.filters.http.wasm", "envoy.filters.http.router"]
    [vhost] = leave_hcm["route_config"]["virtual_hosts"]
    assert vhost["routes"] == [{"match": {"prefix": "/"}, "direct_response": {"status": 404}}]
    [main_vhost] = main_hcm["route_config"]["virtual_hosts"]
    first = main_vhost["routes"][0]
    assert first["match"] == {"path": LEAVE_PATH} and first["direct_response"] == {"status": 404}
    assert first["typed_per_filter_config"]["envoy.filters.http.wasm"] == {
        "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}
    # The hook: the base's wait first, the request to fleet_leave, the drain wait last.
    script = prestop(docs)
    base_hook = gateway_container(one(render("base"), "Deployment"))["lifecycle"]["preStop"]["exec"]["command"]
    assert base_hook[0] == "sleep"
    lines = [ln.strip() for ln in script.strip().splitlines()]
    assert lines[0] == f"sleep {base_hook[1]}", lines
    assert f"/dev/tcp/127.0.0.1/{addr['port_value']}" in script and f"POST {LEAVE_PATH} HTTP/1.1" in script
    fleet = plugin_config(boot)["fleet"]
    lease_ttl, period = int(fleet.get("leaseTtl", "5s").rstrip("s")), int(fleet.get("period", "1s").rstrip("s"))
    assert lines[-1] == f"sleep {lease_ttl + period}", lines
    read_timeout = int(re.search(r"read -r -t (\d+)", script)[1])
    hook = int(base_hook[1]) + read_timeout + lease_ttl + period
    grace = one(docs, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= hook + 10, (grace, hook)


class OneAnswer:
    """A loopback TCP server that records the first request and answers it `status_line`."""

    def __init__(self, status_line: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.request = b""
        self.thread = threading.Thread(target=self.serve, args=(status_line,), daemon=True)
        self.thread.start()

    def serve(self, status_line: bytes) -> None:
        self.sock.settimeout(20)
        conn, _ = self.sock.accept()
        with conn:
            while b"\r\n\r\n" not in self.request:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                self.request += chunk
            conn.sendall(status_line + b"\r\ncontent-length: 0\r\n\r\n")

    def close(self) -> None:
        self.thread.join(timeout=20)
        self.sock.close()


def test_deploy_fleet_prestop_script_sends_the_leave_request(tmp_path):
    """The hook's bash script (the envoyproxy/envoy image has bash, not curl) sends a well-formed
    HTTP/1.1 POST of the leave path and waits for the drain only when the answer is 200; a
    refusal or nothing listening fails the hook, saying why, without the drain wait."""
    docs = render("overlays/fleet")
    ok = OneAnswer(b"HTTP/1.1 200 OK")
    p, sleeps = run_prestop(docs, ok.port, tmp_path / "ok")
    ok.close()
    assert p.returncode == 0, p.stderr
    head, _, body = ok.request.partition(b"\r\n\r\n")
    request_line, *headers = head.decode().split("\r\n")
    assert request_line == f"POST {LEAVE_PATH} HTTP/1.1" and body == b""
    headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in headers)}
    assert headers["host"] and headers["content-length"] == "0", headers
    assert sleeps == ["5", "6"], sleeps
    refused = OneAnswer(b"HTTP/1.1 403 Forbidden")
    p, sleeps = run_prestop(docs, refused.port, tmp_path / "refused")
    refused.close()
    assert p.returncode != 0 and "HTTP/1.1 403" in p.stderr and sleeps == ["5"], (p.stderr, sleeps)
    p, sleeps = run_prestop(docs, free_port(), tmp_path / "closed")
    assert p.returncode != 0 and "cannot connect" in p.stderr and sleeps == ["5"], (p.stderr, sleeps)


def test_deploy_envoy_answers_the_probe(envoy_bin, wasm_module, tmp_path):
    """Started (the cluster unreachable, as before its DNS answers), the base's Envoy answers the
    kubelet's GET /ready on the health port with 200 LIVE, and nothing else of the admin API."""
    text = localize(envoy_config(render("base")), wasm_module, certs(tmp_path / "certs"))
    admin = free_port()
    text = text.replace("port_value: 9901", f"port_value: {admin}")
    text = text.replace("port_value: 16443", "port_value: 0").replace("port_value: 9902", "port_value: 0")
    env = EnvoyProcess(text, tmp_path / "run", envoy_bin=envoy_bin, name="deploy",
                       env={"APF_WASM_TOKEN": "placeholder-token"})
    try:
        env.start().wait_ready(timeout=40)
        health = env.ports["health"]
        st, body = wait_until(lambda: (lambda r: r if r[0] == 200 else None)(http_get(health, "/ready", timeout=2)),
                              timeout=20, what="GET /ready on the health listener")
        assert body.strip() == b"LIVE"
        for path in ("/stats", "/config_dump", "/quitquitquit", "/ready/x"):
            assert http_get(health, path, timeout=2)[0] == 404, path
        assert env.fatal_log_lines() == []
    finally:
        env.stop()


# -- Envoy Gateway ------------------------------------------------------------------------------

EG = "gateway.envoyproxy.io/v1alpha1"
GW_API = "gateway.networking.k8s.io"
# EnvoyExtensionPolicy targets (the CRD's x-kubernetes-validations, Envoy Gateway v1.9).
EG_TARGET_KINDS = {"Gateway", "ListenerSet", "HTTPRoute", "GRPCRoute", "TCPRoute", "UDPRoute", "TLSRoute"}


def kind_named(docs: list[dict], api_version: str, kind: str, name: str) -> dict:
    found = [d for d in docs if d["apiVersion"] == api_version and d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name} ({api_version}) is not rendered exactly once"
    return found[0]


def test_envoy_gateway_example_is_consistent():
    """deploy/envoy-gateway renders; its core objects validate against the Kubernetes schemas; the
    EnvoyExtensionPolicy has the fields Envoy Gateway's CRD requires (wasm[].code, the Image
    source's url, targetRefs group/kind/name), keeps failOpen false, and every reference it and the
    other objects make resolves. (The CRD schemas are not vendored: the example was checked
    against Envoy Gateway v1.9.0's CRDs when written.)"""
    docs = render("envoy-gateway")
    for d in docs:
        if d["apiVersion"].startswith((EG.split("/")[0], GW_API)):
            continue
        kubernetes_validate.validate(d, kubernetes_validate.latest_version(), strict=True)
    policy = one(docs, "EnvoyExtensionPolicy", "apf-wasm")
    assert policy["apiVersion"] == EG
    refs = policy["spec"]["targetRefs"]
    assert refs and all(r["group"] == GW_API and r["kind"] in EG_TARGET_KINDS and r["name"] for r in refs)
    route = kind_named(docs, f"{GW_API}/v1", "HTTPRoute", refs[0]["name"])
    [wasm] = policy["spec"]["wasm"]
    code = wasm["code"]
    assert code["type"] == "Image" and code["image"]["url"] and "http" not in code
    assert wasm["failOpen"] is False, "failOpen must stay false: the filter strips client-supplied identity headers"
    assert wasm["rootID"] == ""
    cfg = wasm["config"]
    assert cfg["identity"]["setFrontProxyHeaders"] is True
    assert cfg["clusterPolicy"]["tokenEnv"] in wasm["env"]["hostKeys"]
    ns = route["metadata"]["namespace"]
    assert cfg["clusterPolicy"]["cluster"] == f"httproute/{ns}/{route['metadata']['name']}/rule/0"
    # The route's backend, the Gateway's listener and the proxy's environment resolve.
    [backend_ref] = route["spec"]["rules"][0]["backendRefs"]
    backend = kind_named(docs, EG, backend_ref["kind"], backend_ref["name"])
    assert backend["spec"]["endpoints"][0]["fqdn"] == {"hostname": "kubernetes.default.svc", "port": 443}
    assert backend["spec"]["tls"]["clientCertificateRef"]["name"] in OPERATOR_SECRETS
    gateway = kind_named(docs, f"{GW_API}/v1", "Gateway", route["spec"]["parentRefs"][0]["name"])
    assert {c["name"] for lst in gateway["spec"]["listeners"] for c in lst["tls"]["certificateRefs"]} <= OPERATOR_SECRETS
    proxy = kind_named(docs, EG, "EnvoyProxy", gateway["spec"]["infrastructure"]["parametersRef"]["name"])
    env = proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"]["container"]["env"]
    token = next(e for e in env if e["name"] == cfg["clusterPolicy"]["tokenEnv"])
    one(docs, "Secret", token["valueFrom"]["secretKeyRef"]["name"])
    ctp = one(docs, "ClientTrafficPolicy")
    assert ctp["spec"]["tls"]["clientValidation"]["caCertificateRefs"], "callers must present a client certificate"


def test_envoy_gateway_plugin_config_loads_in_envoy(envoy_bin, wasm_module, tmp_path):
    """The EnvoyExtensionPolicy's config, as Envoy Gateway hands it to the filter (JSON, with the
    policy's rootID, env.hostKeys and failOpen false = FAIL_CLOSED, and a cluster under the name
    Envoy Gateway gives the route's rule), loads in `envoy --mode validate`."""
    docs = render("envoy-gateway")
    wasm = one(docs, "EnvoyExtensionPolicy", "apf-wasm")["spec"]["wasm"][0]
    cfg = wasm["config"]
    wasm_filter = {"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {
            "name": wasm["name"], "root_id": wasm["rootID"],
            "failure_policy": "FAIL_OPEN" if wasm["failOpen"] else "FAIL_CLOSED",
            "vm_config": {"runtime": "envoy.wasm.runtime.v8",
                          "environment_variables": {"host_env_keys": wasm["env"]["hostKeys"]},
                          "code": {"local": {"filename": wasm_module}}},
            "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                              "value": json.dumps(cfg)}}}}
    boot = gateway_bootstrap(wasm_filter, cfg["clusterPolicy"]["cluster"])
    path = tmp_path / "eg.json"
    path.write_text(json.dumps(boot))
    p = validate_config(envoy_bin, str(path), env={"APF_WASM_TOKEN": "placeholder-token"})
    assert p.returncode == 0, f"the EnvoyExtensionPolicy's config is refused:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    # And the filter really checks it: an invalid config is refused, naming the field.
    wasm_cfg = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]
    wasm_cfg["typed_config"]["config"]["configuration"]["value"] = json.dumps({**cfg, "serverConcurrencyLimit": -1})
    path.write_text(json.dumps(boot))
    p = validate_config(envoy_bin, str(path), env={"APF_WASM_TOKEN": "placeholder-token"})
    assert p.returncode != 0 and "serverConcurrencyLimit" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]


# -- Envoy Gateway: the properties of deploy/base, and the native host ----------------------------

EG_EXAMPLES = ("envoy-gateway", "envoy-gateway-native", "overlays/envoy-gateway-native-image-volume")
EG_NATIVE = EG_EXAMPLES[1:]
# The Envoy minor the native module is built for (docs/hosts.md), as Envoy's image tags name it.
NATIVE_ENVOY_IMAGE = re.compile(r"^docker\.io/envoyproxy/envoy:distroless-v1\.40\.\d+$")
# Envoy Gateway v1.8's CRDs (charts/gateway-helm/charts/crds/crds/generated/*.yaml at v1.8.0), when
# a directory of them is given: the examples' Envoy Gateway objects are validated against them.
EG_CRDS = os.environ.get("APF_EG_CRDS")


def base_gateway_hcm() -> dict:
    """deploy/base's HTTP connection manager for kube-apiserver."""
    return hcm(listener(yaml.safe_load(envoy_config(render("base"))), "apiserver_gateway"))


def seconds(d: str) -> float:
    assert re.fullmatch(r"\d+(\.\d+)?s", d), d
    return float(d[:-1])


@pytest.mark.parametrize("name", EG_EXAMPLES)
def test_envoy_gateway_examples_keep_the_base_properties(name):
    """Every Envoy Gateway example gives kube-apiserver's route what deploy/base's Envoy has: the
    same upgrades (kubectl exec/attach/port-forward need spdy/3.1; Envoy Gateway's default is
    websocket only), the same stream idle timeout and HTTP/2 stream limit. (The request-headers
    timeout has no Envoy Gateway v1.8 field: docs/hosts.md.)"""
    base = base_gateway_hcm()
    docs = render(name)
    route = one(docs, "HTTPRoute", "kube-apiserver")
    [btp] = [d for d in docs if d["kind"] == "BackendTrafficPolicy"
             and {"group": GW_API, "kind": "HTTPRoute", "name": route["metadata"]["name"]} in d["spec"]["targetRefs"]]
    upgrades = {u["type"].lower() for u in btp["spec"]["httpUpgrade"]}
    assert upgrades == {u["upgrade_type"].lower() for u in base["upgrade_configs"]}, upgrades
    ctp = one(docs, "ClientTrafficPolicy")
    gateway = one(docs, "Gateway")
    assert {"group": GW_API, "kind": "Gateway", "name": gateway["metadata"]["name"]} in ctp["spec"]["targetRefs"]
    assert seconds(ctp["spec"]["timeout"]["http"]["streamIdleTimeout"]) == seconds(base["stream_idle_timeout"])
    assert ctp["spec"]["http2"]["maxConcurrentStreams"] == base["http2_protocol_options"]["max_concurrent_streams"]
    assert "requestReceivedTimeout" not in ctp["spec"]["timeout"]["http"], \
        "Envoy's request_timeout also counts a request's wait in an APF queue"


def native_proxy_parts(docs: list[dict]) -> tuple[dict, dict, dict]:
    """The native example's EnvoyExtensionPolicy filter, the EnvoyProxy module entry it names, and
    the EnvoyProxy's deployment spec."""
    [dm] = one(docs, "EnvoyExtensionPolicy", "apf-wasm")["spec"]["dynamicModule"]
    proxy = one(docs, "EnvoyProxy")
    [entry] = [m for m in proxy["spec"]["dynamicModules"] if m["name"] == dm["name"]]
    return dm, entry, proxy["spec"]["provider"]["kubernetes"]["envoyDeployment"]


@pytest.mark.parametrize("name", EG_NATIVE)
def test_envoy_gateway_native_example_is_the_wasm_one_with_a_dynamic_module(name):
    """deploy/envoy-gateway-native is deploy/envoy-gateway with the filter as a dynamic module: the
    objects other than the EnvoyExtensionPolicy and the EnvoyProxy are the same; the policy has no
    wasm and one dynamicModule with the wasm example's config, naming a module the EnvoyProxy
    registers (a Local .so at an absolute path in a volume the Envoy container mounts, filled by an
    init container or mounted from an image); the Envoy image is the module's minor."""
    wasm_docs, docs = render("envoy-gateway"), render(name)
    changed = {"EnvoyExtensionPolicy", "EnvoyProxy"}
    key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, wasm_docs)) == sorted(map(key, docs))
    same = lambda ds: sorted((json.dumps(d, sort_keys=True) for d in ds if d["kind"] not in changed))  # noqa: E731
    assert same(docs) == same(wasm_docs)
    policy = one(docs, "EnvoyExtensionPolicy", "apf-wasm")
    assert "wasm" not in policy["spec"]
    assert policy["spec"]["targetRefs"] == one(wasm_docs, "EnvoyExtensionPolicy", "apf-wasm")["spec"]["targetRefs"]
    dm, entry, deployment = native_proxy_parts(docs)
    assert dm["config"] == one(wasm_docs, "EnvoyExtensionPolicy", "apf-wasm")["spec"]["wasm"][0]["config"]
    assert dm["filterName"] == "apf"
    assert re.fullmatch(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?", dm["name"]), "Envoy Gateway's name pattern"
    assert entry["source"]["type"] == "Local" and entry["doNotClose"] is True
    path = Path(entry["source"]["local"]["path"])
    assert path.is_absolute() and path.name == "libapf_wasm.so"
    container = deployment["container"]
    assert NATIVE_ENVOY_IMAGE.match(container["image"]), container["image"]
    [mount] = [m for m in container["volumeMounts"] if path.parent == Path(m["mountPath"])]
    assert mount["readOnly"] is True
    [volume] = [v for v in deployment["pod"]["volumes"] if v["name"] == mount["name"]]
    if "image" in volume:
        assert volume["image"]["reference"] and "initContainers" not in deployment
    else:
        assert "emptyDir" in volume
        [init] = deployment["initContainers"]
        assert init["command"][-1] == str(path)
        assert any(m["name"] == volume["name"] and Path(m["mountPath"]) == path.parent for m in init["volumeMounts"])
    # The token the policy polls with stays in the Envoy container's environment (the native host
    # reads the process environment; the Wasm VM needed env.hostKeys).
    assert dm["config"]["clusterPolicy"]["tokenEnv"] in {e["name"] for e in container["env"]}


def crd_schemas(crd_dir: Path) -> dict[str, dict]:
    """kind → the served v1alpha1 openAPIV3Schema of each CRD in `crd_dir`."""
    out = {}
    for f in sorted(crd_dir.glob("*.yaml")):
        for crd in yaml.safe_load_all(f.read_text()):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                [ver] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
                out[crd["spec"]["names"]["kind"]] = ver["schema"]["openAPIV3Schema"]
    return out


@pytest.mark.parametrize("name", EG_EXAMPLES)
def test_envoy_gateway_examples_validate_against_envoy_gateway_crds(name):
    """With APF_EG_CRDS (a directory of Envoy Gateway's CRD YAML files, e.g. v1.8.0's
    charts/gateway-helm/charts/crds/crds/generated), every gateway.envoyproxy.io object of the
    example validates against its CRD's schema (structure and types; CEL rules are not run)."""
    if not EG_CRDS:
        pytest.skip("APF_EG_CRDS not set: no Envoy Gateway CRDs to validate against")
    jsonschema = pytest.importorskip("jsonschema")
    schemas = crd_schemas(Path(EG_CRDS))
    checked = 0
    for d in render(name):
        if d["apiVersion"] != EG:
            continue
        assert d["kind"] in schemas, f"no CRD for {d['kind']} in {EG_CRDS}"
        body = {k: v for k, v in d.items() if k != "metadata"}
        errors = list(jsonschema.Draft7Validator(schemas[d["kind"]]).iter_errors(body))
        assert not errors, f"{d['kind']} {d['metadata']['name']}: " + "; ".join(
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:5])
        checked += 1
    assert checked >= 4


def native_module() -> Path:
    """The native host's .so ($APF_NATIVE, as bench/run.py takes it), else skip."""
    so = os.environ.get("APF_NATIVE")
    if not so:
        pytest.skip("APF_NATIVE not set: no native module (./native-build.sh prints its path)")
    assert Path(so).is_file(), so
    return Path(so)


def test_envoy_gateway_native_plugin_config_loads_in_envoy(envoy_bin, tmp_path):
    """The native EnvoyExtensionPolicy as Envoy Gateway translates it (internal/xds/translator/
    dynamicmodule.go: dynamicModuleConfig: the module by local filename, do_not_close, filter_name,
    the config as a StringValue of its JSON) loads in `envoy --mode validate`, and an invalid
    config is refused."""
    so = native_module()
    docs = render("envoy-gateway-native")
    dm, entry, _ = native_proxy_parts(docs)
    cfg = dm["config"]

    def boot(plugin: dict) -> dict:
        flt = {"name": "envoy.filters.http.dynamic_modules", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"module": {"local": {"filename": str(so)}},
                                      "do_not_close": entry["doNotClose"]},
            "filter_name": dm["filterName"],
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                              "value": json.dumps(plugin)}}}
        return gateway_bootstrap(flt, cfg["clusterPolicy"]["cluster"])

    path = tmp_path / "eg-native.json"
    path.write_text(json.dumps(boot(cfg)))
    p = validate_config(envoy_bin, str(path), env={"APF_WASM_TOKEN": "placeholder-token"})
    assert p.returncode == 0, f"the native EnvoyExtensionPolicy's config is refused:\n{(p.stdout + p.stderr)[-3000:]}"
    path.write_text(json.dumps(boot({**cfg, "serverConcurrencyLimit": -1})))
    p = validate_config(envoy_bin, str(path), env={"APF_WASM_TOKEN": "placeholder-token"})
    assert p.returncode != 0, "an invalid plugin config must be refused"


def gateway_bootstrap(http_filter: dict, cluster: str) -> dict:
    """A listener with `http_filter` before the router, routing to `cluster` on 127.0.0.1:6443."""
    return {"static_resources": {
        "listeners": [{
            "name": "eg", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "eg",
                    "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]},
                    "http_filters": [http_filter, {"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
        "clusters": [{"name": cluster, "type": "STATIC", "connect_timeout": "1s",
                      "load_assignment": {"cluster_name": cluster, "endpoints": [{"lb_endpoints": [
                          {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 6443}}}}]}]}}],
    }}


def test_envoy_native_example_is_the_demo_with_a_dynamic_module(envoy_bin, tmp_path):
    """envoy/native.yaml is envoy/demo.yaml with the wasm filter replaced by the dynamic-module
    filter (same listener, routes, cluster and plugin JSON), and with the native module in
    ENVOY_DYNAMIC_MODULES_SEARCH_PATH it loads in `envoy --mode validate`."""
    demo = yaml.safe_load((REPO / "envoy/demo.yaml").read_text())
    native = yaml.safe_load((REPO / "envoy/native.yaml").read_text())
    d_hcm, n_hcm = hcm(listener(demo, "gateway")), hcm(listener(native, "gateway"))
    [d_wasm, d_router], [n_dm, n_router] = d_hcm["http_filters"], n_hcm["http_filters"]
    assert d_router == n_router and n_dm["name"] == "envoy.filters.http.dynamic_modules"
    assert {k: v for k, v in d_hcm.items() if k != "http_filters"} == {k: v for k, v in n_hcm.items() if k != "http_filters"}
    assert demo["static_resources"]["clusters"] == native["static_resources"]["clusters"]
    tc = n_dm["typed_config"]
    assert json.loads(tc["filter_config"]["value"]) == json.loads(d_wasm["typed_config"]["config"]["configuration"]["value"])
    assert tc["dynamic_module_config"]["name"] == "apf_wasm" and tc["filter_name"] == "apf"
    so = native_module()
    assert so.name == f"lib{tc['dynamic_module_config']['name']}.so"
    p = validate_config(envoy_bin, str(REPO / "envoy/native.yaml"),
                        env={"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(so.parent)})
    assert p.returncode == 0, f"envoy/native.yaml invalid:\n{(p.stdout + p.stderr)[-3000:]}"


# A kubectl that records `create secret generic NAME --from-file=K=PATH --from-literal=K=V` as
# files OUT/NAME/K (what the pod would see in a Secret volume) and accepts the script's other calls.
FAKE_KUBECTL = """
import pathlib, sys
out, a = pathlib.Path(sys.argv[0]).parent / "secrets", sys.argv[1:]
if "create" in a and "secret" in a:
    name = a[a.index("generic") + 1]
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    for x in a:
        for kind in ("--from-file=", "--from-literal="):
            if x.startswith(kind):
                k, v = x[len(kind):].split("=", 1)
                (d / k).write_bytes(pathlib.Path(v).read_bytes() if kind == "--from-file=" else v.encode())
    print("apiVersion: v1\\nkind: Secret\\nmetadata: {name: %s}" % name)
elif a[:2] == ["apply", "-f"]:
    sys.stdin.read()
elif not ("get" in a and "namespace" in a):
    sys.exit("fake kubectl: unexpected %r" % a)
"""


class OverlayEtcd(Etcd):
    """The StatefulSet's etcd as one member on loopback: its flags as rendered (TLS, client
    certificates, JWT tokens...), the files of its Secret mounts taken from `secrets` (DIR/NAME/
    KEY), the URLs and cluster flags local."""

    def __init__(self, workdir: Path, sts: dict, secrets: Path) -> None:
        super().__init__(workdir, name="apf-gateway-etcd-0")
        pod = sts["spec"]["template"]["spec"]
        [container] = pod["containers"]
        by_volume = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        self.mounts = {m["mountPath"].rstrip("/") + "/": f"{secrets}/{by_volume[m['name']]}/"
                       for m in container["volumeMounts"] if m["name"] in by_volume}
        self.flags = etcd_flags(container)

    def args(self) -> list[str]:
        p = f"https://127.0.0.1:{self.peer_port}"
        local = {"--name": self.name, "--data-dir": str(self.dir), "--listen-client-urls": self.url,
                 "--advertise-client-urls": self.url, "--listen-peer-urls": p, "--initial-advertise-peer-urls": p,
                 "--initial-cluster": f"{self.name}={p}", "--listen-metrics-urls": f"http://127.0.0.1:{self.metrics_port}"}
        out = []
        for k, v in {**self.flags, **local}.items():
            for mount, path in self.mounts.items():
                v = v.replace(mount, path)
            out.append(f"{k}={v}")
        return ["etcd", *out]


def replica_ids(etcd: Etcd, prefix: bytes = b"/apf-wasm/default/replicas/") -> list[str] | None:
    """The ids of the replicas registered in etcd (None: etcd did not answer)."""
    r = etcd.call("/v3/kv/range", {"key": b64(prefix), "range_end": b64(range_end(prefix)), "keys_only": True})
    if r is None:
        return None
    return [base64.b64decode(kv["key"])[len(prefix):].decode() for kv in r.get("kvs", [])]


def test_deploy_fleet_setup_script_secures_the_overlays_etcd(envoy_bin, wasm_module, tmp_path):
    """scripts/fleet-etcd-setup.sh end to end, on loopback: `certs`; `secrets` (into a recording
    kubectl); an etcd started with the StatefulSet's flags and those Secrets' files; `auth` and
    `check`. Then: no certificate, no connection; a certificate with a CN is refused by the JSON
    gateway (why the gateway's has none); the fleet user writes only under its prefix. And the
    overlay's Envoy (its configuration as rendered, the password in its environment from the
    auth Secret's file as the Deployment sets it, the cluster apf_etcd with the client Secret's
    files, only addresses and ports made local) registers in that etcd; /config_dump does not
    show the password. Then the stop path: the leave request on the main listener (from
    loopback, with a valid client certificate, as through a port-forward) is answered 404 and
    not honoured; on the loopback listener fleet_leave it is, the preStop hook's script is
    answered too, and the replica's record leaves etcd within 3 s — a lease left to expire would
    take leaseTtl (5 s) after the last keep-alive."""
    if shutil.which("etcd") is None or shutil.which("etcdctl") is None or not have_openssl():
        pytest.skip("etcd, etcdctl or openssl missing (scripts/prereqs.sh e2e)")
    docs = render("overlays/fleet")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "kubectl").write_text(f"#!{sys.executable}\n{FAKE_KUBECTL}")
    (bindir / "kubectl").chmod(0o755)
    secrets = bindir / "secrets"
    etcd = OverlayEtcd(tmp_path, one(docs, "StatefulSet", "apf-gateway-etcd"), secrets)
    p = subprocess.run(["bash", str(SETUP), "secrets", str(etcd.pki)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    assert {d.name for d in secrets.iterdir()} == FLEET_SECRETS
    assert {f.name for f in (secrets / "apf-gateway-etcd-client").iterdir()} == {"tls.crt", "tls.key", "ca.crt"}
    envoy = None
    try:
        etcd.start()
        assert "check:" in etcd.setup("check")
        # The auth step again (as after a restore): nothing to do, nothing fails.
        assert "auth is on already" in etcd.setup("auth")
        range_body = json.dumps({"key": b64(b"/apf-wasm/")}).encode()

        def post(ctx: ssl.SSLContext, token: str | None = None) -> tuple[int, str]:
            req = urllib.request.Request(f"{etcd.url}/v3/kv/range", data=range_body, method="POST",
                                         headers={"Authorization": token} if token else {})
            try:
                with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()
        no_cert = ssl.create_default_context(cafile=str(etcd.pki / "ca.crt"))
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            post(no_cert)
        with_cn = ssl.create_default_context(cafile=str(etcd.pki / "ca.crt"))
        with_cn.load_cert_chain(str(etcd.pki / "server.crt"), str(etcd.pki / "server.key"))
        token = etcd.authenticate("apf-gateway", etcd.password)
        assert token
        status, body = post(with_cn, token)
        assert status == 400 and "CommonName" in body, (status, body)
        assert post(etcd.tls_context(), token)[0] == 200
        assert post(etcd.tls_context())[0] in (400, 401, 403), "anonymous reads must fail"
        outside = etcd.post("/v3/kv/put", {"key": b64(b"/apf-wasm0"), "value": b64(b"x")}, token)
        assert outside and outside[0] == 403, outside

        # The overlay's Envoy against it.
        auth = secrets / "apf-gateway-etcd-auth"
        text = envoy_config(docs).replace(ETCD_CLIENT_DIR, f"{secrets}/apf-gateway-etcd-client/")
        assert plugin_config(yaml.safe_load(text))["fleet"]["etcd"]["username"] == (auth / "username").read_text()
        certdir = certs(tmp_path / "certs")
        text = localize(text, wasm_module, certdir)
        svc = "address: apf-gateway-etcd.apf-gateway.svc, port_value: 2379"
        assert text.count(svc) == 1
        text = text.replace(svc, f"address: 127.0.0.1, port_value: {etcd.client_port}")
        text = text.replace("port_value: 9901", f"port_value: {free_port()}")
        for port in (16443, 9902, 9903):
            assert text.count(f"port_value: {port}") == 1, port
            text = text.replace(f"port_value: {port}", "port_value: 0")
        password = (auth / "password").read_text()
        envoy = EnvoyProcess(text, tmp_path / "envoy", envoy_bin=envoy_bin, name="fleet",
                             env={"APF_WASM_TOKEN": "placeholder-token", PASSWORD_ENV: password})
        envoy.start().wait_ready(timeout=40)
        [replica] = wait_until(lambda: replica_ids(etcd) or None, timeout=20, what="the overlay's Envoy registered in etcd")
        handshakes = envoy.stats(r"cluster\.apf_etcd\.ssl\.handshake")
        assert sum(handshakes.values()) >= 1, handshakes
        status, dump = envoy.admin_get("/config_dump")
        assert status == 200 and password.strip().encode() not in dump and PASSWORD_ENV.encode() in dump

        # fleet_leave routes nothing but the filter's leave path (the filter admits, then 404).
        assert http_get(envoy.ports[LEAVE_LISTENER], "/version", timeout=10)[0] == 404
        # The stop path. The main listener: from loopback, with a client certificate it
        # accepts, the leave path is answered 404 by the route, the filter off for it.
        tls = ssl.create_default_context(cafile=str(certdir / "ca.crt"))
        tls.check_hostname = False
        tls.load_cert_chain(str(certdir / "tls.crt"), str(certdir / "tls.key"))
        conn = http.client.HTTPSConnection("127.0.0.1", envoy.ports["apiserver_gateway"], timeout=10, context=tls)
        conn.request("POST", LEAVE_PATH, body=b"")
        main = conn.getresponse()
        assert main.status == 404, (main.status, main.read())
        conn.close()
        # fleet_leave: honoured, and for the first time (the main listener's did nothing).
        conn = http.client.HTTPConnection("127.0.0.1", envoy.ports[LEAVE_LISTENER], timeout=10)
        conn.request("POST", LEAVE_PATH, body=b"")
        r = conn.getresponse()
        answer = json.loads(r.read())
        conn.close()
        left_at = time.monotonic()
        assert r.status == 200 and answer == {"replica": replica, "leaving": True, "alreadyLeaving": False}, answer
        # The preStop hook's own request (idempotent), its sleeps not slept.
        p, sleeps = run_prestop(docs, envoy.ports[LEAVE_LISTENER], tmp_path / "prestop")
        assert p.returncode == 0 and sleeps == ["5", "6"], (p.stdout, p.stderr, sleeps)
        wait_until(lambda: replica_ids(etcd) == [], timeout=3, what="the leaving replica's record gone from etcd")
        print(f"record gone {time.monotonic() - left_at:.2f} s after the leave request")
        assert envoy.fatal_log_lines() == []
    finally:
        if envoy is not None:
            envoy.stop()
        etcd.stop()
