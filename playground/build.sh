#!/usr/bin/env bash
# Build the policy playground: the apf-wasm core compiled for the browser with wasm-bindgen.
#   playground/build.sh            (or ./wasm-build.sh --playground from the repository root)
# Produces playground/web/pkg/ (apf_playground_bg.wasm + apf_playground.js, `--target web`),
# which index.html loads; serve playground/web/ with any static server, e.g.
#   python3 -m http.server -d playground/web 8000
# Installs the Rust target wasm32-unknown-unknown and wasm-bindgen-cli (pinned below; it must
# equal the wasm-bindgen crate version in playground/Cargo.toml) when missing.
# Everything goes to stderr except the LAST line of stdout: the absolute path of pkg/.
# Honours CARGO_TARGET_DIR. Extra arguments go to cargo build (e.g. --release is the default;
# PLAYGROUND_PROFILE=dev for a faster, bigger debug build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
here="$(pwd)"
target=wasm32-unknown-unknown
WASM_BINDGEN_VERSION=0.2.129
profile="${PLAYGROUND_PROFILE:-release}"

if ! grep -q "^wasm-bindgen = \"=$WASM_BINDGEN_VERSION\"" Cargo.toml; then
  echo "playground/build.sh: Cargo.toml's wasm-bindgen is not =$WASM_BINDGEN_VERSION; update both together" >&2
  exit 1
fi

if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  echo "playground: installing Rust target $target" >&2
  rustup target add "$target" >&2
fi

if [[ "$(wasm-bindgen --version 2>/dev/null || true)" != "wasm-bindgen $WASM_BINDGEN_VERSION" ]]; then
  echo "playground: installing wasm-bindgen-cli $WASM_BINDGEN_VERSION (compiles for a few minutes)" >&2
  cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --locked >&2
fi

if [[ "$profile" == release ]]; then
  echo "playground: cargo build --release --target $target" >&2
  cargo build --locked --release --target "$target" "$@" >&2
  outdir=release
else
  echo "playground: cargo build --target $target" >&2
  cargo build --locked --target "$target" "$@" >&2
  outdir=debug
fi

tdir="${CARGO_TARGET_DIR:-$here/target}"
case "$tdir" in /*) ;; *) tdir="$here/$tdir" ;; esac
wasm="$tdir/$target/$outdir/apf_playground.wasm"
if [[ ! -f "$wasm" ]]; then
  echo "playground: expected module not found: $wasm" >&2
  exit 1
fi
rm -rf web/pkg
wasm-bindgen --target web --no-typescript --out-dir web/pkg "$wasm" >&2
echo "playground: $(wc -c <web/pkg/apf_playground_bg.wasm) bytes of wasm in web/pkg" >&2
echo "$here/web/pkg"
