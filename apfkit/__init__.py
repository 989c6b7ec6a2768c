"""The harness that runs apf-wasm in a real Envoy, shared by the end-to-end tests (tests/e2e)
and the benchmarks (bench/). Stdlib only, so the benchmarks run it with any Python 3.

Processes: `envoyproc` (one Envoy), `etcdproc` (a throwaway etcd), `upstream` (a test
kube-apiserver stand-in; also a script for ./run-gateway.sh), `tcpproxy` (a partition on
loopback). Configuration: `envoy_template` (Envoy bootstraps), `apf_policy` (plugin
configurations and seat arithmetic), `work_estimate` (upstream's LIST seats), `pki` (test
certificates). Load and checks: `client` (requests, closed loops), `contract` (the response
contract), `observe` (Prometheus text, debug dumps, log lines), `dashboard` (the Grafana
dashboard's queries), `phases` (a quiet user beside a heavy one), `fleet` (N replicas sharing
one etcd).

Importable from the repository root: pytest puts it on the path (pytest.ini `pythonpath`), the
benchmarks put the repository root on `sys.path` before importing it.
"""
