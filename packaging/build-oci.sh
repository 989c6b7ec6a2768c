#!/usr/bin/env bash
# Package the apf-wasm module as an OCI image for Istio's WasmPlugin (url: oci://...), in the
# "compat" variant of the Wasm image specification that Istio's image fetcher accepts: one layer,
# media type application/vnd.oci.image.layer.v1.tar+gzip, a tar holding only plugin.wasm; the
# manifest is annotated module.wasm.image/variant=compat.
#
#   packaging/build-oci.sh [MODULE] [OUT_DIR]
#     MODULE   the .wasm module (default: build it with ./wasm-build.sh)
#     OUT_DIR  the OCI image layout directory to (re)create (default: target/oci/apf-wasm)
#   Environment:
#     OCI_TAG=0.1.0          tag in the layout (default: the version in Cargo.toml)
#     OCI_ARCHIVE=FILE.tar   also write the image as an oci-archive (a tar of the layout)
#     SOURCE_DATE_EPOCH=...  timestamps (default: the commit time of HEAD, else now); the same
#                            module and timestamp give the same image digest
#
# Tools: umoci (builds the layout) and GNU tar; scripts/prereqs.sh e2e installs umoci (and
# skopeo). Everything goes to stderr except the LAST line of stdout: the absolute path of
# OUT_DIR. Push the image to a registry with skopeo, e.g.
#   skopeo copy oci:target/oci/apf-wasm:0.1.0 docker://registry.example.com/apf-wasm:0.1.0
# (or an oci-archive: skopeo copy oci-archive:FILE.tar:0.1.0 docker://...), then reference it
# as url: oci://registry.example.com/apf-wasm:0.1.0 in envoy/istio-wasmplugin.yaml.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

abspath() { case "$1" in /*) echo "$1" ;; *) echo "$(pwd)/$1" ;; esac; }

if [[ -n "${1:-}" ]]; then
  module="$(abspath "$1")"
else
  module="$("$root/wasm-build.sh" | tail -n 1)"
fi
out="$(abspath "${2:-$root/target/oci/apf-wasm}")"
[[ -f "$module" ]] || { echo "build-oci: module not found: $module" >&2; exit 1; }
if [[ "$(head -c 4 "$module" | od -An -tx1 | tr -d ' \n')" != 0061736d ]]; then
  echo "build-oci: not a WebAssembly module (no wasm magic number): $module" >&2
  exit 1
fi
command -v umoci >/dev/null 2>&1 || {
  echo "build-oci: umoci not found (scripts/prereqs.sh e2e, or apt-get install umoci)" >&2
  exit 1
}

version="$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml" | head -n 1)"
[[ -n "$version" ]] || { echo "build-oci: no package version in Cargo.toml" >&2; exit 1; }
tag="${OCI_TAG:-$version}"
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"

mkdir -p "$(dirname "$out")"
work="$(mktemp -d "$(dirname "$out")/.build-oci.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# The layer: a tar with the single entry plugin.wasm (no directory entries), fixed owner and time.
mkdir "$work/stage"
cp "$module" "$work/stage/plugin.wasm"
tar --create --file "$work/layer.tar" --format=ustar --owner=0 --group=0 --numeric-owner \
  --mode=0644 --mtime="@$epoch" -C "$work/stage" plugin.wasm

layout="$work/layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
# umoci gzips the layer (application/vnd.oci.image.layer.v1.tar+gzip) and records its diff_id.
umoci raw add-layer --image "$layout:$tag" \
  --history.created "$created" --history.created_by "packaging/build-oci.sh" \
  --history.comment "plugin.wasm: apf-wasm $version" "$work/layer.tar"
umoci config --image "$layout:$tag" --no-history --created "$created" \
  --config.label "org.opencontainers.image.title=apf-wasm" \
  --config.label "org.opencontainers.image.version=$version" \
  --manifest.annotation "module.wasm.image/variant=compat" \
  --manifest.annotation "org.opencontainers.image.title=apf-wasm" \
  --manifest.annotation "org.opencontainers.image.version=$version" \
  --manifest.annotation "org.opencontainers.image.created=$created"
umoci gc --layout "$layout"  # drop the intermediate manifests and configs
chmod -R u+rwX,go+rX "$layout"

rm -rf "$out"
mv "$layout" "$out"
if [[ -n "${OCI_ARCHIVE:-}" ]]; then
  archive="$(abspath "$OCI_ARCHIVE")"
  tar --create --file "$work/archive.tar" --format=ustar --owner=0 --group=0 --numeric-owner \
    --mtime="@$epoch" --sort=name -C "$out" oci-layout index.json blobs
  mv "$work/archive.tar" "$archive"
  echo "build-oci: oci-archive $archive" >&2
fi

echo "build-oci: image oci:$out:$tag ($(wc -c <"$module") bytes of plugin.wasm); push with" >&2
echo "  skopeo copy oci:$out:$tag docker://REGISTRY/apf-wasm:$tag" >&2
echo "$out"
