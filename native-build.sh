#!/usr/bin/env bash
# Build apf-wasm's native host: the Envoy dynamic module libapf_wasm.so (release, unwinding
# panics, caught at every hook). Load it with ENVOY_DYNAMIC_MODULES_SEARCH_PATH = the directory of
# the printed path and `dynamic_module_config: {name: apf_wasm}`. Built for Envoy 1.40's ABI.
# Everything goes to stderr except the LAST line of stdout: the absolute path of the .so.
# Honours CARGO_TARGET_DIR. Usage: ./native-build.sh [extra cargo args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
root="$(pwd)"

# -z nodelete: the module owns a timer thread, so it must never be unmapped (Envoy dlcloses a
# module whose last configuration is gone unless `do_not_close` is set); -z now: every Envoy
# symbol is bound at load, so an Envoy without one of them refuses the module with a clear
# "undefined symbol" error instead of crashing at its first call.
echo "native-build: cargo build --release --lib --features dynamic-module" >&2
cargo build --release --lib --features dynamic-module --config 'profile.release.panic="unwind"' \
  --config 'build.rustflags=["-C", "link-arg=-Wl,-z,nodelete", "-C", "link-arg=-Wl,-z,now"]' "$@" >&2

tdir="${CARGO_TARGET_DIR:-$root/target}"
case "$tdir" in /*) ;; *) tdir="$root/$tdir" ;; esac
so="$tdir/release/libapf_wasm.so"
if [[ ! -f "$so" ]]; then
  echo "native-build: expected module not found: $so" >&2
  exit 1
fi
# The module must export Envoy's entry points.
for hook in envoy_dynamic_module_on_program_init envoy_dynamic_module_on_http_filter_config_new \
  envoy_dynamic_module_on_http_filter_request_headers envoy_dynamic_module_on_http_filter_scheduled; do
  if ! nm -D --defined-only "$so" | grep -qw "$hook"; then
    echo "native-build: $so does not export $hook" >&2
    exit 1
  fi
done
if ! readelf -d "$so" | grep -q NODELETE; then
  echo "native-build: $so is not marked NODELETE" >&2
  exit 1
fi
echo "native-build: $(wc -c <"$so") bytes" >&2
echo "$so"
