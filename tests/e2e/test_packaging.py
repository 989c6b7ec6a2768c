"""The OCI image of the module for Istio's WasmPlugin (packaging/build-oci.sh).

Checks the image layout itself (index.json -> manifest -> config and layers) against what Istio's
image fetcher accepts as the "compat" variant of the Wasm image specification: the last (here the
only) layer has media type application/vnd.oci.image.layer.v1.tar+gzip and its tar holds
plugin.wasm, byte-identical to the module. No Envoy needed: any module works.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from apfkit.envoyproc import REPO

pytestmark = pytest.mark.harness

BUILD = REPO / "packaging" / "build-oci.sh"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
EPOCH = "1700000000"


def _version() -> str:
    m = re.search(r'^\[package\][^\[]*?^version\s*=\s*"([^"]+)"',
                  (REPO / "Cargo.toml").read_text(), re.M | re.S)
    assert m, "no package version in Cargo.toml"
    return m.group(1)


def _sha256(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def _build(module: str, out: Path, **env) -> Path:
    if shutil.which("umoci") is None:
        pytest.skip("umoci is not installed (scripts/prereqs.sh e2e installs it: apt-get install umoci)")
    p = subprocess.run([str(BUILD), module, str(out)], cwd=REPO, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=300,
                       env={**os.environ, "SOURCE_DATE_EPOCH": EPOCH, **env})
    assert p.returncode == 0, f"build-oci.sh failed ({p.returncode}):\n{p.stderr[-4000:]}"
    assert p.stdout.strip().splitlines()[-1] == str(out), p.stdout
    return out


class Layout:
    """An OCI image layout directory, read by hand; every blob is checked against its descriptor."""

    def __init__(self, root: Path):
        self.root = root

    def json(self, name: str):
        return json.loads((self.root / name).read_bytes())

    def blob(self, desc: dict) -> bytes:
        algo, _, hexd = desc["digest"].partition(":")
        assert algo == "sha256" and re.fullmatch(r"[0-9a-f]{64}", hexd), desc
        data = (self.root / "blobs" / "sha256" / hexd).read_bytes()
        assert _sha256(data) == desc["digest"], f"blob content does not match {desc['digest']}"
        assert len(data) == desc["size"], desc
        return data

    def manifest_desc(self, tag: str) -> dict:
        index = self.json("index.json")
        assert index["schemaVersion"] == 2
        assert len(index["manifests"]) == 1, index
        desc = index["manifests"][0]
        assert desc["mediaType"] == OCI_MANIFEST, desc
        assert desc["annotations"]["org.opencontainers.image.ref.name"] == tag, desc
        return desc


@pytest.fixture(scope="module")
def image(wasm_module, tmp_path_factory):
    d = tmp_path_factory.mktemp("oci")
    out = _build(wasm_module, d / "apf-wasm", OCI_ARCHIVE=str(d / "apf-wasm.oci.tar"))
    return out, d / "apf-wasm.oci.tar"


def test_harness_oci_image_is_istio_compat_variant(image, wasm_module):
    out, _ = image
    lay = Layout(out)
    assert lay.json("oci-layout") == {"imageLayoutVersion": "1.0.0"}
    version = _version()
    mdesc = lay.manifest_desc(version)

    manifest = json.loads(lay.blob(mdesc))
    assert manifest["schemaVersion"] == 2
    assert manifest.get("mediaType", OCI_MANIFEST) == OCI_MANIFEST, manifest
    assert manifest["annotations"]["module.wasm.image/variant"] == "compat", manifest
    assert manifest["annotations"]["org.opencontainers.image.version"] == version

    assert manifest["config"]["mediaType"] == OCI_CONFIG, manifest
    config = json.loads(lay.blob(manifest["config"]))
    assert config["os"] and config["architecture"], config
    assert config["rootfs"]["type"] == "layers", config

    # Istio takes the LAST layer; the compat variant has exactly one.
    assert len(manifest["layers"]) == 1, manifest["layers"]
    ldesc = manifest["layers"][0]
    assert ldesc["mediaType"] == OCI_LAYER_GZIP, ldesc
    raw = gzip.decompress(lay.blob(ldesc))
    assert config["rootfs"]["diff_ids"] == [_sha256(raw)], "diff_id is not the uncompressed layer"

    # A well-formed tar (end-of-archive marker included) with exactly one regular file.
    assert len(raw) % 512 == 0 and raw[-1024:] == b"\0" * 1024, "tar is truncated"
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        members = tf.getmembers()
        assert [(m.name, m.isfile()) for m in members] == [("plugin.wasm", True)], members
        got = tf.extractfile(members[0]).read()
    want = Path(wasm_module).read_bytes()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(want).hexdigest(), \
        "plugin.wasm differs from the module"
    assert got[:4] == b"\0asm"

    # Nothing else in the layout: index, manifest, config, layer.
    blobs = {p.name for p in (out / "blobs" / "sha256").iterdir()}
    refs = {d["digest"].split(":")[1] for d in (mdesc, manifest["config"], ldesc)}
    assert blobs == refs, blobs ^ refs


def test_harness_oci_archive_holds_the_layout(image):
    out, archive = image
    with tarfile.open(archive) as tf:
        files = {m.name.removeprefix("./"): tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}
    want = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert files == want


def test_harness_oci_image_is_reproducible(image, wasm_module, tmp_path):
    out, _ = image
    again = _build(wasm_module, tmp_path / "again")
    assert (again / "index.json").read_bytes() == (out / "index.json").read_bytes()


def test_harness_oci_image_readable_by_skopeo(image, tmp_path):
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed (scripts/prereqs.sh e2e installs it: apt-get install skopeo)")
    out, archive = image
    tag = _version()
    manifest = Layout(out).blob(Layout(out).manifest_desc(tag))
    for ref in (f"oci:{out}:{tag}", f"oci-archive:{archive}:{tag}"):
        p = subprocess.run(["skopeo", "inspect", "--raw", ref], capture_output=True, timeout=120,
                           stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr.decode()[-2000:]
        assert p.stdout == manifest, ref
    # A copy (what a push does, to a local directory instead of a registry) verifies every digest.
    p = subprocess.run(["skopeo", "--insecure-policy", "copy", "--quiet", f"oci:{out}:{tag}",
                        f"oci:{tmp_path / 'copy'}:{tag}"], capture_output=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    copy = Layout(tmp_path / "copy")
    copied = json.loads(copy.blob(copy.manifest_desc(tag)))
    assert [d["mediaType"] for d in copied["layers"]] == [OCI_LAYER_GZIP]
    assert copied["layers"] == json.loads(manifest)["layers"]


def test_harness_istio_wasmplugin_example_pulls_the_image():
    text = (REPO / "envoy" / "istio-wasmplugin.yaml").read_text()
    version = _version()
    url = re.search(r"^  url: (\S+)$", text, re.M)
    assert url and url.group(1).startswith("oci://"), "spec.url is not an oci:// image"
    assert url.group(1).endswith(f"/apf-wasm:{version}"), (url.group(1), version)
    pull = re.search(r"^  imagePullPolicy: (\S+)$", text, re.M)
    assert pull and pull.group(1) in ("IfNotPresent", "Always"), pull
    assert "packaging/build-oci.sh" in text
