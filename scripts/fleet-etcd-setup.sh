#!/usr/bin/env bash
# The fleet's etcd (deploy/overlays/fleet/etcd.yaml): its certificates, the Kubernetes Secrets,
# and etcd's authentication (docs/deployment.md, "Fleet mode").
#
#   scripts/fleet-etcd-setup.sh certs DIR    CA, server, peer and gateway-client certificates, the
#                                            JWT signing key and two passwords, in DIR (openssl;
#                                            files that exist are kept: a re-run reuses the CA)
#   scripts/fleet-etcd-setup.sh secrets DIR  the Secrets the overlay mounts, from DIR (kubectl apply)
#   scripts/fleet-etcd-setup.sh auth DIR     etcd's users and roles, then auth enable (etcdctl):
#                                            root; the role FLEET_USER with readwrite on
#                                            FLEET_PREFIX and nothing else; the user FLEET_USER
#                                            with that role. Idempotent: run it again after an
#                                            etcd lost its data (a new cluster has no users).
#   scripts/fleet-etcd-setup.sh check DIR    as FLEET_USER: a write under the prefix succeeds,
#                                            one outside it is denied
#
# Order: certs; secrets; the etcd members alone
#   kubectl apply -k deploy/overlays/fleet -l app.kubernetes.io/component=etcd
#   kubectl -n apf-gateway rollout status statefulset/apf-gateway-etcd
# then auth and check, then the rest (kubectl apply -k deploy/overlays/fleet). A gateway replica
# that cannot authenticate does not register, and admits nothing on limited levels until it does.
#
# Environment (defaults in brackets):
#   NAMESPACE [apf-gateway]  ETCD_NAME [apf-gateway-etcd]  CLUSTER_DOMAIN [cluster.local]
#   FLEET_PREFIX [/apf-wasm/]  FLEET_USER [apf-gateway]  DAYS [365] (leaf certificates; the CA: 10 y)
#   ETCDCTL: the etcdctl command line `auth` and `check` run (word-split). Default: etcdctl in
#     the first member, over its loopback client URL with the server certificate as client
#     certificate (the server certificate has clientAuth: etcd's JSON gateway needs it too):
#       kubectl -n $NAMESPACE exec -i $ETCD_NAME-0 -c etcd -- etcdctl
#         --endpoints=https://127.0.0.1:2379 --cacert=/etc/etcd/tls/server/ca.crt
#         --cert=/etc/etcd/tls/server/tls.crt --key=/etc/etcd/tls/server/tls.key
#   apfkit/etcdproc.py runs `certs`, `auth` and `check` against a local etcd with its own ETCDCTL.
#
# The passwords are hex (openssl rand -hex): the gateway's init container substitutes the fleet
# password into the plugin configuration (a JSON string) and accepts only [0-9A-Za-z].
# etcdctl gets root's password on its command line (--password): visible to `ps` in the etcd pod
# and on the machine running this script while it runs.
set -euo pipefail

NAMESPACE="${NAMESPACE:-apf-gateway}"
ETCD_NAME="${ETCD_NAME:-apf-gateway-etcd}"
CLUSTER_DOMAIN="${CLUSTER_DOMAIN:-cluster.local}"
FLEET_PREFIX="${FLEET_PREFIX:-/apf-wasm/}"
FLEET_USER="${FLEET_USER:-apf-gateway}"
DAYS="${DAYS:-365}"
TLS_DIR=/etc/etcd/tls/server
ETCDCTL="${ETCDCTL:-kubectl -n $NAMESPACE exec -i $ETCD_NAME-0 -c etcd -- etcdctl --endpoints=https://127.0.0.1:2379 --cacert=$TLS_DIR/ca.crt --cert=$TLS_DIR/tls.crt --key=$TLS_DIR/tls.key}"

as_root=()   # etcdctl's credentials (root's once auth is on)
root_pw=""   # not printed

say() { echo "fleet-etcd-setup: $*" >&2; }
die() { say "$*"; exit 1; }

# --- certs ---------------------------------------------------------------------------------------

# Subject alternative names. Clients reach etcd through the client Service ($ETCD_NAME) or a
# member's own name under the headless peer Service ($ETCD_NAME-peer), and etcdctl inside a
# member through 127.0.0.1; peers reach each other under the headless Service.
server_sans() {
  local s="$ETCD_NAME" p="*.$ETCD_NAME-peer.$NAMESPACE.svc"
  echo "DNS:$s,DNS:$s.$NAMESPACE,DNS:$s.$NAMESPACE.svc,DNS:$s.$NAMESPACE.svc.$CLUSTER_DOMAIN,DNS:$p,DNS:$p.$CLUSTER_DOMAIN,DNS:localhost,IP:127.0.0.1"
}
peer_sans() {
  local p="*.$ETCD_NAME-peer.$NAMESPACE.svc"
  echo "DNS:$p,DNS:$p.$CLUSTER_DOMAIN"
}

# leaf STEM SUBJECT EKU [SANS]: STEM.crt / STEM.key signed by ca.crt, unless STEM.crt exists.
leaf() {
  local stem="$1" subj="$2" eku="$3" sans="${4:-}"
  [[ -s "$stem.crt" && -s "$stem.key" ]] && return 0
  openssl req -new -newkey rsa:2048 -nodes -keyout "$stem.key" -out "$stem.csr" -subj "$subj" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n "$sans" ]] && echo "subjectAltName=$sans"
  } >"$stem.ext"
  openssl x509 -req -in "$stem.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days "$DAYS" \
    -sha256 -extfile "$stem.ext" -out "$stem.crt" 2>/dev/null
  rm -f "$stem.csr" "$stem.ext"
  say "$stem.crt: $subj${sans:+ ($sans)}"
}

cmd_certs() {
  local dir="$1"
  mkdir -p "$dir" && chmod 700 "$dir"
  cd "$dir"
  umask 077
  if [[ ! -s ca.crt ]]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -sha256 \
      -subj "/CN=$ETCD_NAME-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    say "ca.crt: /CN=$ETCD_NAME-ca"
  fi
  # serverAuth for clients, clientAuth because etcd's JSON gateway (/v3/) dials the member's own
  # gRPC server with this certificate when --client-cert-auth is on.
  leaf server "/CN=$ETCD_NAME" serverAuth,clientAuth "$(server_sans)"
  # Peers are servers and clients of each other (--peer-client-cert-auth).
  leaf peer "/CN=$ETCD_NAME-peer" serverAuth,clientAuth "$(peer_sans)"
  # The gateway's client certificate: NO common name. With --client-cert-auth and auth both on,
  # etcd would take a CN as the user name (etcd server/auth/store.go: AuthInfoFromTLS), which its
  # JSON gateway cannot carry; the gateway authenticates with FLEET_USER's password instead, and
  # the certificate only proves it may connect at all.
  leaf client "/O=$FLEET_USER" clientAuth
  # etcd's auth tokens: JWTs signed with this key (--auth-token=jwt,...), valid on every member
  # and across restarts (simple tokens live in one member's memory).
  if [[ ! -s jwt.key ]]; then
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out jwt.key 2>/dev/null
    openssl pkey -in jwt.key -pubout -out jwt.pub
    say "jwt.key, jwt.pub: the token signing key"
  fi
  # No trailing newline: the Secrets take the files as they are.
  [[ -s root.password ]] || openssl rand -hex 24 | tr -d '\n' >root.password
  [[ -s fleet.password ]] || openssl rand -hex 24 | tr -d '\n' >fleet.password
  chmod 600 ./*.key ./*.password
}

# --- secrets -------------------------------------------------------------------------------------

apply_secret() {
  local name="$1"
  shift
  kubectl -n "$NAMESPACE" create secret generic "$name" "$@" --dry-run=client -o yaml | kubectl apply -f -
}

cmd_secrets() {
  local d="$1"
  for f in ca.crt server.crt server.key peer.crt peer.key client.crt client.key jwt.key jwt.pub root.password fleet.password; do
    [[ -s "$d/$f" ]] || die "$d/$f missing: run '$0 certs $d' first"
  done
  kubectl get namespace "$NAMESPACE" >/dev/null 2>&1 || kubectl create namespace "$NAMESPACE"
  # The members' client-facing and peer certificates, and the token signing key.
  apply_secret "$ETCD_NAME-server" --from-file=tls.crt="$d/server.crt" --from-file=tls.key="$d/server.key" --from-file=ca.crt="$d/ca.crt"
  apply_secret "$ETCD_NAME-peer" --from-file=tls.crt="$d/peer.crt" --from-file=tls.key="$d/peer.key" --from-file=ca.crt="$d/ca.crt"
  apply_secret "$ETCD_NAME-jwt" --from-file=jwt.key="$d/jwt.key" --from-file=jwt.pub="$d/jwt.pub"
  # The gateway's: its client certificate and etcd's CA (Envoy's cluster apf_etcd), and the
  # fleet user's password (the Envoy container's FLEET_ETCD_PASSWORD).
  apply_secret "$ETCD_NAME-client" --from-file=tls.crt="$d/client.crt" --from-file=tls.key="$d/client.key" --from-file=ca.crt="$d/ca.crt"
  apply_secret "$ETCD_NAME-auth" --from-literal=username="$FLEET_USER" --from-file=password="$d/fleet.password"
  # root's password, for re-running `auth` (nothing mounts it).
  apply_secret "$ETCD_NAME-root" --from-file=password="$d/root.password"
}

# --- auth ----------------------------------------------------------------------------------------

# ctl ARGS: etcdctl with root's credentials once auth is on.
ctl() { $ETCDCTL "${as_root[@]}" "$@"; }

# tolerate PATTERN ARGS: ctl ARGS; an error whose message contains PATTERN counts as done.
# (Passwords are not printed.)
tolerate() {
  local pattern="$1" out shown
  shift
  shown="$*"
  shown="${shown//$root_pw/<password>}"
  if out="$(ctl "$@" 2>&1)"; then
    say "etcdctl $shown: $out"
  elif [[ "$out" == *"$pattern"* ]]; then
    say "etcdctl $shown: already so ($pattern)"
  else
    die "etcdctl $shown failed: $out"
  fi
}

password() {
  local d="$1" name="$2" secret="$3"
  if [[ -s "$d/$name.password" ]]; then
    tr -d '\n' <"$d/$name.password"
  else
    kubectl -n "$NAMESPACE" get secret "$secret" -o jsonpath='{.data.password}' | base64 -d
  fi
}

cmd_auth() {
  local d="$1" fleet_pw
  root_pw="$(password "$d" root "$ETCD_NAME-root")"
  fleet_pw="$(password "$d" fleet "$ETCD_NAME-auth")"
  [[ -n "$root_pw" && -n "$fleet_pw" ]] || die "no passwords in $d nor in the Secrets"
  as_root=()
  # Auth already on (a re-run)? Then root's credentials work, and are needed.
  if $ETCDCTL --user root --password "$root_pw" user get root >/dev/null 2>&1; then
    as_root=(--user root --password "$root_pw")
    say "auth is on already; continuing as root"
  fi
  tolerate "already exists" user add root --new-user-password "$root_pw"
  tolerate "already" user grant-role root root
  tolerate "already exists" role add "$FLEET_USER"
  # readwrite on [FLEET_PREFIX, FLEET_PREFIX with its last byte + 1): the fleet's keys only.
  tolerate "already" role grant-permission --prefix "$FLEET_USER" readwrite "$FLEET_PREFIX"
  if ! printf '%s\n' "$fleet_pw" | ctl user add "$FLEET_USER" --interactive=false >/dev/null 2>&1; then
    # The user exists: make its password the one in the Secret.
    printf '%s\n' "$fleet_pw" | ctl user passwd "$FLEET_USER" --interactive=false >/dev/null
  fi
  say "user $FLEET_USER: password set"
  tolerate "already" user grant-role "$FLEET_USER" "$FLEET_USER"
  tolerate "already" auth enable
  say "auth on: root and $FLEET_USER (readwrite on the prefix $FLEET_PREFIX only)"
}

cmd_check() {
  local d="$1" fleet_pw key outside out
  fleet_pw="$(password "$d" fleet "$ETCD_NAME-auth")"
  key="${FLEET_PREFIX}.setup-check"
  outside="/apf-wasm-setup-check-outside-the-prefix"
  as_root=(--user "$FLEET_USER" --password "$fleet_pw")
  root_pw="$fleet_pw"
  ctl put "$key" ok >/dev/null || die "$FLEET_USER cannot write $key"
  ctl del "$key" >/dev/null || die "$FLEET_USER cannot delete $key"
  if out="$(ctl put "$outside" x 2>&1)"; then
    die "$FLEET_USER may write outside $FLEET_PREFIX ($outside): the role is too wide"
  fi
  [[ "$out" == *"permission denied"* ]] || die "unexpected answer writing outside the prefix: $out"
  if $ETCDCTL get "$key" >/dev/null 2>&1; then
    die "a read without credentials succeeded: auth is off"
  fi
  say "check: $FLEET_USER writes under $FLEET_PREFIX, is denied outside it; anonymous reads fail"
}

case "${1:-}" in
  certs | secrets | auth | check)
    [[ $# -eq 2 ]] || die "usage: $0 $1 DIR"
    "cmd_$1" "$2"
    ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
