#!/bin/sh
# Trial certificates for compose.tls.yaml and compose.cluster-tls.yaml (docs/operations.md,
# "Compose with TLS"; docs/security.md, "TLS"): a private CA made for the occasion and one
# certificate per server, written with the file names those files mount.
#
#   deploy/tls-certs.sh [DIR]          (default ./tls; `make tls-certs`, `make tls-certs TLS_DIR=…`)
#
# DIR/nats/ is mounted on the NATS nodes only (/etc/nats/tls), DIR/shardbus/ on the services only
# (/etc/shardbus/tls), so no service can read a NATS key (with the route key it could join the
# cluster and read every subject, whatever its permissions):
#   nats/ca.pem, shardbus/ca.pem   the CA (the same file twice): give it to shards and websites
#   nats/server.pem, .key          NATS's client port and WebSocket listener: nats, nats-1..3
#   nats/route.pem, .key           the routes between cluster nodes (serves and dials): nats-1..3
#   shardbus/gateway.pem, .key     the shard listener: gateway
#   shardbus/web.pem, .key         the web door (HTTPS, wss://): web
# every certificate but the route's also naming localhost and 127.0.0.1 (a shard, a website or
# an operator on this host dials the published ports), and TLS_EXTRA_NAMES when set
# (e.g. TLS_EXTRA_NAMES=DNS:shards.example.net,IP:203.0.113.7: the names others dial).
#
# For a trial only. The CA's key is thrown away once the certificates are signed (nothing else
# can be signed with it; run again into an empty DIR for a new set), the certificates last
# TLS_DAYS days (30), and the keys are readable by every user (0644): the services run as user
# 10001 in the image and read them through a bind mount. In production use your own CA and keys
# readable by that user alone (docs/security.md, "TLS"). An existing set is never overwritten.
set -eu

dir=${1:-tls}
days=${TLS_DAYS:-30}
extra=${TLS_EXTRA_NAMES:-}
local_names="DNS:localhost,IP:127.0.0.1"

if [ -e "$dir/nats" ] || [ -e "$dir/shardbus" ]; then
    echo "$dir holds certificates already (remove $dir/nats and $dir/shardbus for a new set)" >&2
    exit 1
fi
command -v openssl >/dev/null || { echo "openssl not found: apt-get install openssl" >&2; exit 1; }
mkdir -p "$dir/nats" "$dir/shardbus"
chmod 0755 "$dir" "$dir/nats" "$dir/shardbus"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/ca.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
x509_extensions = ca
[dn]
CN = shardbus trial CA
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
EOF
openssl req -x509 -config "$work/ca.cnf" -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -days "$days" -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
cp "$work/ca.pem" "$dir/nats/ca.pem"
cp "$work/ca.pem" "$dir/shardbus/ca.pem"
chmod 0644 "$dir/nats/ca.pem" "$dir/shardbus/ca.pem"

# leaf SUBDIR NAME USAGES SUBJECT_ALT_NAMES: DIR/SUBDIR/NAME.pem and .key, signed by the CA.
leaf() {
    out=$dir/$1
    shift
    names=$3${extra:+,$extra}
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$1" \
        -keyout "$out/$1.key" -out "$work/$1.csr" 2>/dev/null
    printf '%s\n' "basicConstraints = critical,CA:FALSE" "keyUsage = critical,digitalSignature" \
        "extendedKeyUsage = $2" "subjectAltName = $names" \
        "subjectKeyIdentifier = hash" "authorityKeyIdentifier = keyid" >"$work/$1.ext"
    openssl x509 -req -in "$work/$1.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
        -set_serial "0x$(openssl rand -hex 12)" -days "$days" -extfile "$work/$1.ext" \
        -out "$out/$1.pem" 2>/dev/null
    chmod 0644 "$out/$1.key" "$out/$1.pem"
}

leaf nats server serverAuth "DNS:nats,DNS:nats-1,DNS:nats-2,DNS:nats-3,$local_names"
leaf nats route serverAuth,clientAuth "DNS:nats-1,DNS:nats-2,DNS:nats-3"
leaf shardbus gateway serverAuth "DNS:gateway,$local_names"
leaf shardbus web serverAuth "DNS:web,$local_names"

echo "trial certificates in $dir (valid $days days; the CA's key is gone):"
echo "  $dir/nats: ca.pem server.pem server.key route.pem route.key (the NATS nodes)"
echo "  $dir/shardbus: ca.pem gateway.pem gateway.key web.pem web.key (the services)"
echo "  docker compose -f compose.yaml -f compose.tls.yaml up -d            # one NATS node"
echo "  docker compose -f compose.yaml -f compose.cluster.yaml -f compose.cluster-tls.yaml up -d"
