#!/usr/bin/env bash
# The project's one test command. Stages (stops at the first failure, naming it):
#   1. cargo test --all-targets                      (native unit + integration tests)
#   2. cargo clippy --all-targets -- -D warnings     (native)
#   3. cargo clippy --target wasm32-wasip1 --lib -- -D warnings   (the proxy-wasm glue is wasm-only),
#      also with the benchmark-only features (bench-timing, bench-isolated-levels)
#   4. ./wasm-build.sh                               (release module)
#   5. scripts/envoy-env.sh                          (.venv with Envoy + pytest)
#   6. pytest tests/e2e                              (end-to-end against a real Envoy)
#   7. playground: cargo test + headless-Chromium test of the page (playground/test/run.sh)
# Environment: APF_SKIP_E2E=1 skips stages 4-7; APF_SKIP_PLAYGROUND=1 skips stage 7;
# PYTEST_ARGS adds pytest arguments.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
t_start=$SECONDS

stage() { echo; echo "==> [test.sh] $* ($((SECONDS - t_start))s)"; }
fail() { echo; echo "test.sh: FAILED at stage: $*" >&2; exit 1; }

stage "cargo test --all-targets"
cargo test --all-targets || fail "cargo test --all-targets"

stage "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || fail "cargo clippy (native)"

if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
  rustup target add wasm32-wasip1 || fail "rustup target add wasm32-wasip1"
fi
stage "cargo clippy --target wasm32-wasip1 --lib -- -D warnings"
cargo clippy --target wasm32-wasip1 --lib -- -D warnings || fail "cargo clippy (wasm32-wasip1)"
cargo clippy --target wasm32-wasip1 --lib --features bench-timing,bench-isolated-levels -- -D warnings \
  || fail "cargo clippy (wasm32-wasip1, bench features)"

if [[ "${APF_SKIP_E2E:-}" == 1 ]]; then
  echo "test.sh: APF_SKIP_E2E=1, skipping the end-to-end stages"
  exit 0
fi

stage "./wasm-build.sh"
wasm="$(./wasm-build.sh | tail -n 1)" || fail "./wasm-build.sh"
[[ -f "$wasm" ]] || fail "./wasm-build.sh (no module at '$wasm')"

stage "scripts/envoy-env.sh"
envoy="$(scripts/envoy-env.sh | tail -n 1)" || fail "scripts/envoy-env.sh"

stage "pytest tests/e2e (module $wasm)"
set +e
# shellcheck disable=SC2086
APF_WASM="$wasm" ENVOY_BIN="$envoy" .venv/bin/python -m pytest -q -p no:cacheprovider \
  ${PYTEST_ARGS:-} tests/e2e
rc=$?
set -e
case $rc in
  0) ;;
  5) fail "pytest tests/e2e (no test ran)" ;;
  *) fail "pytest tests/e2e (exit $rc)" ;;
esac

if [[ "${APF_SKIP_PLAYGROUND:-}" != 1 ]]; then
  stage "playground: cargo test"
  (cd playground && cargo test --locked) || fail "playground cargo test"
  stage "playground: headless Chromium test (playground/test/run.sh)"
  playground/test/run.sh || fail "playground/test/run.sh"
fi

echo
echo "test.sh: all stages passed in $((SECONDS - t_start))s"
