#!/usr/bin/env bash
# Build apf-wasm's native host: the Envoy dynamic module libapf_wasm.so (release, unwinding
# panics, caught at every hook). Load it with ENVOY_DYNAMIC_MODULES_SEARCH_PATH = the directory of
# the printed path and `dynamic_module_config: {name: apf_wasm}`. Built for Envoy 1.40's ABI.
# Everything goes to stderr except the LAST line of stdout: the absolute path of the .so.
# Honours CARGO_TARGET_DIR. Usage: ./native-build.sh [extra cargo args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
root="$(pwd)"

tdir="${CARGO_TARGET_DIR:-$root/target}"
case "$tdir" in /*) ;; *) tdir="$root/$tdir" ;; esac

# -z nodelete: the module owns a timer thread, so it must never be unmapped (Envoy dlcloses a
# module whose last configuration is gone unless `do_not_close` is set); -z now: every Envoy
# symbol is bound at load, so an Envoy without one of them refuses the module with a clear
# "undefined symbol" error instead of crashing at its first call.
link='"-C", "link-arg=-Wl,-z,nodelete", "-C", "link-arg=-Wl,-z,now"'
# build EXTRA_RUSTFLAGS [cargo args]: EXTRA_RUSTFLAGS continues the TOML list (", "-C", "…"").
build() {
  local extra="$1"
  shift
  cargo build --release --lib --features dynamic-module --config 'profile.release.panic="unwind"' \
    --config "build.rustflags=[$link$extra]" "$@" >&2
}

# Profile-guided optimisation: an instrumented build runs scripts/pgo-train.py in a real Envoy,
# and the module is built again with that profile (LLVM lays out and inlines the request path as
# it runs: ~6 % less Envoy CPU per request, docs/hosts.md). Retrained only when the instrumented
# build changed. Needs rustup's llvm-tools (added here), Python and Envoy (the e2e .venv, or
# ENVOY_BIN); without them, or with APF_NATIVE_PGO=0, the module is built without a profile.
pgo_profile() {
  [[ "${APF_NATIVE_PGO:-1}" != 0 ]] || { echo "native-build: APF_NATIVE_PGO=0: no profile" >&2; return 1; }
  local host profdata py train inst prof
  host="$(rustc -vV | sed -n 's/^host: //p')"
  profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
  if [[ ! -x "$profdata" ]] && command -v rustup >/dev/null 2>&1; then
    rustup component add llvm-tools >&2 || true
  fi
  [[ -x "$profdata" ]] || { echo "native-build: no llvm-profdata (rustup component llvm-tools): no profile" >&2; return 1; }
  py="$root/.venv/bin/python"
  [[ -x "$py" ]] || py="$(command -v python3 || true)"
  [[ -n "$py" ]] || { echo "native-build: no Python for the training run: no profile" >&2; return 1; }
  train="$tdir/pgo"
  inst="$train/build/release/libapf_wasm.so"
  prof="$train/apf.profdata"
  echo "native-build: instrumented build for the training run" >&2
  CARGO_TARGET_DIR="$train/build" build ", \"-C\", \"profile-generate=$train/raw\"" "$@" || return 1
  if [[ ! -f "$prof" || "$inst" -nt "$prof" ]]; then
    rm -rf "$train/raw" "$prof"
    echo "native-build: training run (scripts/pgo-train.py)" >&2
    if ! "$py" "$root/scripts/pgo-train.py" --module "$inst" >&2; then
      echo "native-build: the training run failed: no profile" >&2
      return 1
    fi
    "$profdata" merge -o "$prof" "$train"/raw/*.profraw >&2 || return 1
  fi
  echo "$prof"
}

if profile="$(pgo_profile "$@")"; then
  echo "native-build: cargo build --release --lib --features dynamic-module, profile $profile" >&2
  build ", \"-C\", \"profile-use=$profile\"" "$@"
else
  echo "native-build: WARNING: built without profile-guided optimisation" >&2
  echo "native-build: cargo build --release --lib --features dynamic-module" >&2
  build "" "$@"
fi

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
