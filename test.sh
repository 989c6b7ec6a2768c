#!/usr/bin/env bash
# The project's one test command. Stages (stops at the first failure, naming it):
#   0. scripts/prereqs.sh                            (installs what the stages below need when
#      missing: Rust targets, clippy, Envoy + pytest, kubectl, openssl, promtool, umoci, skopeo,
#      Chromium, node, wasm-bindgen-cli; apt-get only as root, else it says what to install)
#   1. cargo fmt --check                             (the tree is formatted: rustfmt.toml)
#      cargo test --all-targets                      (native unit + integration tests)
#   2. cargo clippy --all-targets -- -D warnings     (native)
#   3. cargo clippy --target wasm32-wasip1 --lib -- -D warnings   (the proxy-wasm glue is wasm-only),
#      and the same for the benchmark control module bench/isolated
#   3b. the native host (feature dynamic-module): clippy and its unit tests; the native floor
#      module bench/native-floor: clippy and its tests
#   4. ./wasm-build.sh                               (release module)
#   5. scripts/envoy-env.sh                          (.venv with Envoy + pytest)
#   6. pytest tests/e2e                              (end-to-end against a real Envoy)
#   6a. ./native-build.sh, then the core e2e subset (tests marked `core`, and the native host's
#      own tests) with the native host (APF_HOST=native)
#   6b. the core e2e subset (CORE_E2E below: limits, fairness, 429 + Retry-After, hot reload,
#      the secure example, cluster policy, shipped and deploy/ configurations) against the
#      oldest supported Envoy (scripts/envoy-env.sh oldest: .venv-envoy-<version>)
#   7. playground: cargo test + headless-Chromium test of the page (playground/test/run.sh)
# Environment: APF_SKIP_E2E=1 skips stages 4-7; APF_SKIP_OLDEST_ENVOY=1 skips stage 6b;
# APF_SKIP_PLAYGROUND=1 skips stage 7 (stage 0
# then installs only what the remaining stages need); APF_SKIP_PREREQS=1 skips stage 0;
# PYTEST_ARGS adds pytest arguments.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
t_start=$SECONDS

stage() { echo; echo "==> [test.sh] $* ($((SECONDS - t_start))s)"; }
fail() { echo; echo "test.sh: FAILED at stage: $*" >&2; exit 1; }

if ! command -v cargo >/dev/null 2>&1 && [[ -f "$HOME/.cargo/env" ]]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

if [[ "${APF_SKIP_PREREQS:-}" != 1 ]]; then
  prereq_groups=(rust)
  if [[ "${APF_SKIP_E2E:-}" != 1 ]]; then
    prereq_groups+=(e2e)
    [[ "${APF_SKIP_PLAYGROUND:-}" == 1 ]] || prereq_groups+=(playground)
  fi
  stage "scripts/prereqs.sh ${prereq_groups[*]}"
  scripts/prereqs.sh "${prereq_groups[@]}" || fail "scripts/prereqs.sh (prerequisites)"
fi

stage "cargo fmt --check"
cargo fmt --check || fail "cargo fmt --check (run cargo fmt)"

stage "cargo test --all-targets"
cargo test --all-targets || fail "cargo test --all-targets"

stage "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings || fail "cargo clippy (native)"

stage "cargo clippy --target wasm32-wasip1 --lib -- -D warnings"
cargo clippy --target wasm32-wasip1 --lib -- -D warnings || fail "cargo clippy (wasm32-wasip1)"
cargo clippy --manifest-path bench/isolated/Cargo.toml --target wasm32-wasip1 --target-dir target/bench-isolated \
  -- -D warnings || fail "cargo clippy (wasm32-wasip1, bench/isolated)"

stage "the native host: clippy and unit tests (feature dynamic-module), bench/native-floor"
cargo clippy --all-targets --features dynamic-module -- -D warnings || fail "cargo clippy (native host)"
cargo clippy --lib --features native-isolated-levels -- -D warnings || fail "cargo clippy (native host, benchmark control)"
cargo test --lib --features dynamic-module native:: || fail "cargo test (native host)"
cargo clippy --manifest-path bench/native-floor/Cargo.toml --all-targets --target-dir target/bench-native-floor \
  -- -D warnings || fail "cargo clippy (bench/native-floor)"
cargo test --manifest-path bench/native-floor/Cargo.toml --target-dir target/bench-native-floor \
  || fail "cargo test (bench/native-floor)"

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

stage "./native-build.sh"
native="$(./native-build.sh | tail -n 1)" || fail "./native-build.sh"
stage "pytest: the core e2e subset on the native host ($native)"
set +e
# shellcheck disable=SC2086
APF_HOST=native APF_NATIVE="$native" APF_WASM="$wasm" ENVOY_BIN="$envoy" .venv/bin/python -m pytest -q \
  -p no:cacheprovider ${PYTEST_ARGS:-} tests/e2e
rc=$?
set -e
[[ $rc == 0 ]] || fail "pytest core e2e subset on the native host (exit $rc)"

# The core subset that must pass on every supported Envoy (about 90 s).
CORE_E2E=(
  tests/e2e/test_apf_limits.py
  tests/e2e/test_apf_fairness.py::test_equal_demand_gets_equal_service
  tests/e2e/test_apf_rejections.py::test_queue_full_rejects_with_429
  tests/e2e/test_ops_reload.py::test_ops_ecds_hot_reload_under_load
  tests/e2e/test_secure_example.py
  tests/e2e/test_cluster_policy.py
  tests/e2e/test_envoy_configs.py
  tests/e2e/test_deploy.py
)
if [[ "${APF_SKIP_OLDEST_ENVOY:-}" != 1 ]]; then
  stage "scripts/envoy-env.sh oldest"
  oldest="$(scripts/envoy-env.sh oldest | tail -n 1)" || fail "scripts/envoy-env.sh oldest"
  stage "pytest: the core e2e subset on $("$oldest" --version | grep -o 'version: [^ ]*' | cut -d/ -f2)"
  set +e
  APF_WASM="$wasm" ENVOY_BIN="$oldest" .venv/bin/python -m pytest -q -p no:cacheprovider "${CORE_E2E[@]}"
  rc=$?
  set -e
  [[ $rc == 0 ]] || fail "pytest core e2e subset on the oldest supported Envoy (exit $rc)"
fi

if [[ "${APF_SKIP_PLAYGROUND:-}" != 1 ]]; then
  stage "playground: cargo test"
  (cd playground && cargo test --locked) || fail "playground cargo test"
  stage "playground: headless Chromium test (playground/test/run.sh)"
  playground/test/run.sh || fail "playground/test/run.sh"
fi

echo
echo "test.sh: all stages passed in $((SECONDS - t_start))s"
