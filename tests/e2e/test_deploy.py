"""deploy/: the kustomize base and overlays render with `kubectl kustomize`, every manifest
validates against the Kubernetes schemas (kubernetes-validate, which bundles them), the pieces fit
together (mounts, probes, RBAC, selectors), and the Envoy configuration inside loads in
`envoy --mode validate` and, started, answers the kubelet's probe on /ready."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from envoyproc import REPO, EnvoyProcess, http_get, validate_config, wait_until
from pki import have_openssl, self_signed

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
CERT_DIRS = ("/etc/apf-gateway/tls/", "/etc/apf-gateway/front-proxy/", SA_DIR)
# Secrets the operator creates before applying (docs/deployment.md says how).
OPERATOR_SECRETS = {"apf-gateway-tls", "apf-gateway-front-proxy"}


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
    used = {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    used |= {e["valueFrom"]["secretKeyRef"]["name"] for e in envoy["env"] if "valueFrom" in e}
    assert used - rendered == OPERATOR_SECRETS, used - rendered
    guide = (REPO / "docs/deployment.md").read_text()
    assert all(s in guide for s in OPERATOR_SECRETS)
    token = one(docs, "Secret", "apf-gateway-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    sa = one(docs, "ServiceAccount")
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == sa["metadata"]["name"]
    assert spec["serviceAccountName"] == sa["metadata"]["name"]
    cfg = plugin_config(boot)
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
    """The overlay's Envoy configuration is the base's with `fleet` and the etcd cluster added."""
    base = yaml.safe_load(envoy_config(render("base")))
    fleet = yaml.safe_load(envoy_config(render("overlays/fleet")))
    cfg = plugin_config(fleet)
    etcd_cluster = cfg.pop("fleet")["etcd"]["cluster"]
    assert cfg == plugin_config(base)
    fleet["static_resources"]["clusters"] = [c for c in fleet["static_resources"]["clusters"] if c["name"] != etcd_cluster]
    for b in (base, fleet):
        wasm_filter_config(b)["configuration"]["value"] = ""
    assert fleet == base


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_deploy_envoy_config_validates(name, envoy_bin, wasm_module, tmp_path):
    text = localize(envoy_config(render(name)), wasm_module, certs(tmp_path / "certs"))
    path = tmp_path / "envoy.yaml"
    path.write_text(text)
    p = validate_config(envoy_bin, str(path), env={"APF_WASM_TOKEN": "placeholder-token"})
    assert p.returncode == 0, f"deploy/{name}: Envoy refuses its configuration:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    boot = {
        "static_resources": {
            "listeners": [{
                "name": "eg", "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "eg",
                        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                            {"match": {"prefix": "/"}, "route": {"cluster": cfg["clusterPolicy"]["cluster"]}}]}]},
                        "http_filters": [
                            {"name": "envoy.filters.http.wasm", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                                "config": {
                                    "name": wasm["name"], "root_id": wasm["rootID"],
                                    "failure_policy": "FAIL_OPEN" if wasm["failOpen"] else "FAIL_CLOSED",
                                    "vm_config": {"runtime": "envoy.wasm.runtime.v8",
                                                  "environment_variables": {"host_env_keys": wasm["env"]["hostKeys"]},
                                                  "code": {"local": {"filename": wasm_module}}},
                                    "configuration": {"@type": "type.googleapis.com/google.protobuf.StringValue",
                                                      "value": json.dumps(cfg)}}}},
                            {"name": "envoy.filters.http.router", "typed_config": {
                                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
            "clusters": [{"name": cfg["clusterPolicy"]["cluster"], "type": "STATIC", "connect_timeout": "1s",
                          "load_assignment": {"cluster_name": cfg["clusterPolicy"]["cluster"], "endpoints": [{"lb_endpoints": [
                              {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 6443}}}}]}]}}],
        }
    }
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
