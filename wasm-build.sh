#!/usr/bin/env bash
# Build the apf-wasm proxy-wasm module (wasm32-wasip1, release).
# Everything goes to stderr except the LAST line of stdout: the absolute path of the module.
# Honours CARGO_TARGET_DIR. Usage: ./wasm-build.sh [extra cargo args]
# ./wasm-build.sh --playground [cargo args]: build the browser playground instead (playground/build.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
if [[ "${1:-}" == "--playground" ]]; then
  shift
  exec ./playground/build.sh "$@"
fi
root="$(pwd)"
target=wasm32-wasip1

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "wasm-build: installing Rust target $target" >&2
  rustup target add "$target" >&2
fi

# panic = "abort" for the module only (wasm32's default; set here rather than in Cargo.toml's
# release profile, which native `cargo test --release` builds share with their unwinding test
# harness: there it made the library's two builds collide).
echo "wasm-build: cargo build --release --target $target --lib" >&2
cargo build --release --target "$target" --lib --config 'profile.release.panic="abort"' "$@" >&2

tdir="${CARGO_TARGET_DIR:-$root/target}"
case "$tdir" in /*) ;; *) tdir="$root/$tdir" ;; esac
wasm="$tdir/$target/release/apf_wasm.wasm"
if [[ ! -f "$wasm" ]]; then
  echo "wasm-build: expected module not found: $wasm" >&2
  exit 1
fi
echo "wasm-build: $(wc -c <"$wasm") bytes" >&2
echo "$wasm"
