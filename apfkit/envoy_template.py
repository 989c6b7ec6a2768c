"""Envoy bootstrap configurations for the e2e tests and the benchmarks (stdlib only).

Configs are built as Python dicts and written as JSON (JSON is YAML, and Envoy reads `.json`).
Listener and admin ports default to 0 (the kernel picks free ports); the real ports are read back
from the admin endpoint (`--admin-address-path` + `/listeners?format=json`), so parallel runs never
clash.

Filter variants (`http_filter=`):
  "wasm"             the module at `wasm_path` with `plugin_config` (dict → JSON StringValue)
  "native"           the native host `libapf_wasm.so` (Envoy dynamic module, found through
                     ENVOY_DYNAMIC_MODULES_SEARCH_PATH) with the same `plugin_config`
  "none"             router only
  "local_ratelimit"  Envoy's native token bucket, sized so that nothing is ever limited
"""

from __future__ import annotations

import json

WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
DYNAMIC_MODULE_TYPE = ("type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3."
                       "DynamicModuleFilter")
# The native host's module name: Envoy loads lib<name>.so from ENVOY_DYNAMIC_MODULES_SEARCH_PATH.
NATIVE_MODULE = "apf_wasm"
# The native host's stats live under Envoy's `dynamicmodulescustom.` namespace; this runtime flag
# strips it from /stats/prometheus (as `wasmcustom.` is), so both hosts export the same names.
NATIVE_RUNTIME = {"layers": [{"name": "apf-native", "static_layer": {
    "envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix": True}}]}
HCM_TYPE = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager")
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
LRL_TYPE = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"


def socket_address(port: int, host: str = "127.0.0.1") -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def wasm_filter(wasm_path: str, plugin_config: dict | str | None, vm_id: str = "apf",
                name: str = "apf", failure_policy: str | None = None) -> dict:
    """`envoy.filters.http.wasm` with the module read from a local file."""
    if plugin_config is None:
        plugin_config = {}
    cfg_text = plugin_config if isinstance(plugin_config, str) else json.dumps(plugin_config)
    config: dict = {
        "name": name,
        "root_id": "",
        "vm_config": {
            "vm_id": vm_id,
            "runtime": "envoy.wasm.runtime.v8",
            "code": {"local": {"filename": wasm_path}},
        },
        "configuration": {"@type": STRING_VALUE, "value": cfg_text},
    }
    if failure_policy:
        config["failure_policy"] = failure_policy
    return {"name": "envoy.filters.http.wasm", "typed_config": {"@type": WASM_TYPE, "config": config}}


def native_filter(plugin_config: dict | str | None, name: str = "apf") -> dict:
    """`envoy.filters.http.dynamic_modules` running the native host with `plugin_config`.
    `do_not_close`: the module owns a timer thread, so it must stay mapped for the process's life."""
    if plugin_config is None:
        plugin_config = {}
    cfg_text = plugin_config if isinstance(plugin_config, str) else json.dumps(plugin_config)
    return {"name": "envoy.filters.http.dynamic_modules", "typed_config": {
        "@type": DYNAMIC_MODULE_TYPE,
        "dynamic_module_config": {"name": NATIVE_MODULE, "do_not_close": True},
        "filter_name": name,
        "filter_config": {"@type": STRING_VALUE, "value": cfg_text},
    }}


def wasm_to_native(cfg: dict) -> dict:
    """`cfg` (an Envoy bootstrap) with every apf wasm filter replaced by the native host's, with
    the same plugin configuration and filter name, and the native host's runtime flag (the
    module's environment is Envoy's own, so a `tokenEnv` variable needs no `host_env_keys`)."""
    def walk(node):
        if isinstance(node, dict):
            if node.get("name") == "envoy.filters.http.wasm":
                wasm = node["typed_config"]["config"]
                return native_filter(wasm["configuration"]["value"], name=wasm.get("name", "apf"))
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    out = walk(cfg)
    out["layered_runtime"] = NATIVE_RUNTIME
    return out


def ecds_filter(resource_path: str, watched_dir: str, name: str = "apf",
                type_url: str = WASM_TYPE) -> dict:
    """An HTTP filter whose configuration comes from ECDS, read from `resource_path` (a file with
    `resources: [TypedExtensionConfig]`); Envoy reloads it when a file is moved into
    `watched_dir`. No default_config: the listener warms until the first config loads."""
    return {
        "name": name,
        "config_discovery": {
            "config_source": {
                "resource_api_version": "V3",
                "path_config_source": {"path": resource_path,
                                       "watched_directory": {"path": watched_dir}},
            },
            "type_urls": [type_url],
        },
    }


def ecds_resource(wasm_path: str | None, plugin_config: dict | str | None, name: str = "apf",
                  native: bool = False) -> dict:
    """The ECDS resource file content for `ecds_filter` (JSON); `native`: the native host's."""
    if native:
        typed = native_filter(plugin_config, name=name)["typed_config"]
    else:
        typed = wasm_filter(wasm_path or "", plugin_config, name=name)["typed_config"]
    return {"resources": [{"@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
                           "name": name, "typed_config": typed}]}


def local_ratelimit_filter() -> dict:
    """Native local rate limit, enabled and enforced, with a bucket too big to ever run dry."""
    pct = {"numerator": 100, "denominator": "HUNDRED"}
    return {
        "name": "envoy.filters.http.local_ratelimit",
        "typed_config": {
            "@type": LRL_TYPE,
            "stat_prefix": "bench_rl",
            "token_bucket": {"max_tokens": 1_000_000_000, "tokens_per_fill": 1_000_000_000,
                             "fill_interval": "1s"},
            "filter_enabled": {"runtime_key": "bench_rl_enabled", "default_value": pct},
            "filter_enforced": {"runtime_key": "bench_rl_enforced", "default_value": pct},
        },
    }


def gateway_config(*, upstream_port: int, wasm_path: str | None = None,
                   plugin_config: dict | str | None = None, http_filter: str = "wasm",
                   listener_port: int = 0, admin_port: int = 0, route_timeout: str = "60s",
                   access_log_path: str | None = None, extra_filters: list | None = None,
                   ecds_dir: str | None = None, downstream_tls: dict | None = None,
                   ecds_native: bool = False) -> dict:
    """An Envoy in front of one HTTP/1.1 upstream on 127.0.0.1:`upstream_port`.
    http_filter "ecds": the wasm filter's config is read from `ecds_dir`/apf.json (see
    `ecds_resource`; `ecds_native`: the native host's filter type); the caller writes that file
    before starting Envoy. http_filter "native": the native host (Envoy needs
    ENVOY_DYNAMIC_MODULES_SEARCH_PATH in its environment).
    downstream_tls: {"cert", "key", "ca", "require_client_cert"}: the listener speaks TLS with
    that server certificate and verifies client certificates against `ca` (optional ones unless
    `require_client_cert`)."""
    filters: list = list(extra_filters or [])
    if http_filter == "ecds":
        if not ecds_dir:
            raise ValueError("http_filter='ecds' needs ecds_dir")
        filters.append(ecds_filter(f"{ecds_dir}/apf.json", ecds_dir,
                                   type_url=DYNAMIC_MODULE_TYPE if ecds_native else WASM_TYPE))
    elif http_filter == "native":
        filters.append(native_filter(plugin_config))
    elif http_filter == "wasm":
        if not wasm_path:
            raise ValueError("http_filter='wasm' needs wasm_path")
        filters.append(wasm_filter(wasm_path, plugin_config))
    elif http_filter == "local_ratelimit":
        filters.append(local_ratelimit_filter())
    elif http_filter != "none":
        raise ValueError(f"unknown http_filter {http_filter!r}")
    filters.append({"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}})

    hcm: dict = {
        "@type": HCM_TYPE,
        "stat_prefix": "apf_gateway",
        "codec_type": "AUTO",
        "route_config": {
            "name": "local",
            "virtual_hosts": [{
                "name": "apiserver",
                "domains": ["*"],
                "routes": [{"match": {"prefix": "/"},
                            "route": {"cluster": "apiserver", "timeout": route_timeout}}],
            }],
        },
        "http_filters": filters,
    }
    if access_log_path:
        hcm["access_log"] = [{
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": access_log_path,
            },
        }]
    big = 1_000_000
    cfg: dict = {
        "admin": {"address": socket_address(admin_port)},
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": socket_address(listener_port),
                "filter_chains": [dict({"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm,
                }]}, **({"transport_socket": downstream_tls_socket(downstream_tls)}
                        if downstream_tls else {}))],
            }],
            "clusters": [{
                "name": "apiserver",
                "type": "STATIC",
                "connect_timeout": "2s",
                "circuit_breakers": {"thresholds": [{
                    "max_connections": big, "max_pending_requests": big,
                    "max_requests": big, "max_retries": 3,
                }]},
                "load_assignment": {
                    "cluster_name": "apiserver",
                    "endpoints": [{"lb_endpoints": [{"endpoint": {
                        "address": socket_address(upstream_port)}}]}],
                },
            }],
        },
    }
    if http_filter == "ecds":
        cfg["node"] = {"id": "apf-e2e", "cluster": "apf-e2e"}
    if http_filter == "native" or ecds_native:
        cfg["layered_runtime"] = NATIVE_RUNTIME
    return cfg


def downstream_tls_socket(t: dict) -> dict:
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "require_client_certificate": bool(t.get("require_client_cert", False)),
            "common_tls_context": {
                "tls_certificates": [{"certificate_chain": {"filename": t["cert"]},
                                      "private_key": {"filename": t["key"]}}],
                "validation_context": {"trusted_ca": {"filename": t["ca"]}},
            },
        },
    }


def direct_response_config(*, listener_port: int = 0, admin_port: int = 0,
                           body: str = '{"kind":"Status","status":"Success"}',
                           delay_ms: float = 0.0) -> dict:
    """A fast upstream: Envoy answering 200 JSON itself (benchmark upstream). With `delay_ms`,
    every response is held that long first (Envoy's fault filter: a timer, no CPU while held),
    like an apiserver that takes milliseconds to answer."""
    filters = [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}}]
    if delay_ms > 0:
        filters.insert(0, {"name": "envoy.filters.http.fault", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault",
            "delay": {"fixed_delay": f"{delay_ms / 1000:.6f}s",
                      "percentage": {"numerator": 100, "denominator": "HUNDRED"}}}})
    hcm = {
        "@type": HCM_TYPE,
        "stat_prefix": "direct",
        "route_config": {
            "name": "direct",
            "virtual_hosts": [{
                "name": "direct",
                "domains": ["*"],
                "routes": [{
                    "match": {"prefix": "/"},
                    "direct_response": {"status": 200, "body": {"inline_string": body}},
                    "response_headers_to_add": [{"header": {
                        "key": "content-type", "value": "application/json"}}],
                }],
            }],
        },
        "http_filters": filters,
    }
    return {
        "admin": {"address": socket_address(admin_port)},
        "static_resources": {"listeners": [{
            "name": "direct",
            "address": socket_address(listener_port),
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
        }]},
    }


def dumps(cfg: dict) -> str:
    return json.dumps(cfg, indent=1)
