#!/usr/bin/env bash
# Line coverage of the gateway's request logic (src/gateway) under the native tests that drive it
# over the mock host (tests/gateway_*.rs), with rustc's instrumentation and llvm-cov from rustup's
# llvm-tools component (installed when missing). Usage: scripts/coverage.sh [FILE-REGEX]
# (default: gateway/). Builds into target/coverage; prints llvm-cov's report.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
filter="${1:-gateway/}"
sysroot="$(rustc --print sysroot)"
host="$(rustc -vV | sed -n 's/^host: //p')"
bin="$sysroot/lib/rustlib/$host/bin"
[[ -x "$bin/llvm-cov" ]] || rustup component add llvm-tools >&2
out="$PWD/target/coverage"
rm -rf "$out/profraw" && mkdir -p "$out/profraw"
tests=()
for f in tests/gateway_*.rs; do tests+=(--test "$(basename "$f" .rs)"); done
RUSTFLAGS="-C instrument-coverage" LLVM_PROFILE_FILE="$out/profraw/%p-%m.profraw" CARGO_TARGET_DIR="$out/build" \
  cargo test -q "${tests[@]}" >&2
"$bin/llvm-profdata" merge -sparse "$out"/profraw/*.profraw -o "$out/all.profdata"
objects=()
for f in "$out"/build/debug/deps/gateway_*; do
  [[ -x "$f" && "$f" != *.d ]] && objects+=(--object "$f")
done
"$bin/llvm-cov" report "${objects[@]}" -instr-profile="$out/all.profdata" \
  --ignore-filename-regex='(\.cargo|rustc|tests/)' | grep -E "^Filename|$filter|^TOTAL"
