#!/usr/bin/env bash
# Build the native floor dynamic module (release). Everything goes to stderr except the LAST
# line of stdout: the absolute path of libapf_native_floor.so (its directory goes in
# ENVOY_DYNAMIC_MODULES_SEARCH_PATH; the module's name in Envoy's config is apf_native_floor).
# Honours CARGO_TARGET_DIR (default: target/ in this folder).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cargo build --release --manifest-path "$here/Cargo.toml" "$@" >&2
tdir="${CARGO_TARGET_DIR:-$here/target}"
case "$tdir" in /*) ;; *) tdir="$(pwd)/$tdir" ;; esac
so="$tdir/release/libapf_native_floor.so"
if [[ ! -f "$so" ]]; then
  echo "native-floor: expected module not found: $so" >&2
  exit 1
fi
echo "$so"
