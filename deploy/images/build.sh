#!/usr/bin/env bash
# `make images`: the stand-in images compose.yaml and the Dockerfile need, built from what an
# offline Debian machine reaches (Debian's packages, PyPI) rather than Docker Hub
# (docs/operations.md, "Compose for real"):
#   localhost/shardbus-python:3.11   Debian 12 rootfs (debootstrap) with Python 3.11 and pip: the
#                                    Dockerfile's base (PYTHON_IMAGE)
#   localhost/shardbus-nats:2.15     nats-server from its PyPI wheel (NATS_IMAGE)
#   localhost/shardbus-postgres:15   Debian's PostgreSQL 15, the official POSTGRES_* set-up (POSTGRES_IMAGE)
#   localhost/shardbus-prometheus:2  Debian's Prometheus (PROMETHEUS_IMAGE)
# Idempotent: an image whose recipe (what it is made of, below) is unchanged is kept, so a second
# run takes about a second. ENGINE=podman (default) or docker. At the end it prints the variables that
# point compose at the images (`make images >/dev/null; cat deploy/images/images.env`).
set -euo pipefail
cd "$(dirname "$0")"
ENGINE=${ENGINE:-podman}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/containers.conf}

PYTHON_IMAGE=localhost/shardbus-python:3.11
NATS_IMAGE=localhost/shardbus-nats:2.15
POSTGRES_IMAGE=localhost/shardbus-postgres:15
PROMETHEUS_IMAGE=localhost/shardbus-prometheus:2

command -v "$ENGINE" >/dev/null || { echo "images: no $ENGINE here (apt-get install podman runc)" >&2; exit 1; }

# What each image is made from, kept in its label shardbus.recipe: the base, the suite, its
# packages and this machine's extra CA certificates; every other image, the base's id and its
# own files. An image whose recipe is unchanged is kept.
PACKAGES=python3,python3-pip,python3-venv,ca-certificates,wget
base_recipe=$( { echo "base 1 $SUITE $PACKAGES"; cat /usr/local/share/ca-certificates/*.crt 2>/dev/null; } \
  | sha256sum | cut -c1-16)

current() {  # current IMAGE RECIPE: true when IMAGE exists and was built from RECIPE
  [ "$("$ENGINE" image inspect --format '{{index .Labels "shardbus.recipe"}}' "$1" 2>/dev/null)" = "$2" ]
}

started=$SECONDS
if current "$PYTHON_IMAGE" "$base_recipe"; then
  echo "== $PYTHON_IMAGE: up to date"
else
  command -v debootstrap >/dev/null || { echo "images: no debootstrap here (apt-get install debootstrap)" >&2; exit 1; }
  root=$(mktemp -d /var/tmp/shardbus-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  echo "== $PYTHON_IMAGE: debootstrap $SUITE from $MIRROR (about 2 minutes)"
  debootstrap --variant=minbase --include="$PACKAGES" \
    "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
  rm -f "$root.log"
  # pip inside: Debian marks its Python externally managed (PEP 668), which would refuse the
  # Dockerfile's `pip install`; and this machine's extra CA certificates (a TLS-inspecting
  # egress, for one) must be trusted inside as outside.
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1
  fi
  ln -sf python3 "$root/usr/bin/python"
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
  tar -C "$root" -c . | "$ENGINE" import --quiet --change 'CMD ["python3"]' \
    --change "LABEL shardbus.recipe=$base_recipe" - "$PYTHON_IMAGE" >/dev/null
  rm -rf "$root"
  trap - EXIT
fi

for name in nats postgres prometheus; do
  var=${name^^}_IMAGE
  image=${!var}
  recipe=$( { "$ENGINE" image inspect --format '{{.Id}}' "$PYTHON_IMAGE"; cat "$name".Containerfile; \
    [ "$name" != postgres ] || cat postgres-entrypoint.sh; } | sha256sum | cut -c1-16)
  if current "$image" "$recipe"; then
    echo "== $image: up to date"
    continue
  fi
  echo "== $image: $ENGINE build ($name.Containerfile on $PYTHON_IMAGE)"
  previous=$("$ENGINE" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
  "$ENGINE" build -q --network host -f "$name.Containerfile" --build-arg "BASE=$PYTHON_IMAGE" \
    --label "shardbus.recipe=$recipe" -t "$image" . >/dev/null
  # The replaced image, now untagged (kept while a container still uses it).
  [ -z "$previous" ] || "$ENGINE" rmi "$previous" >/dev/null 2>&1 || true
done

cat > images.env <<ENV
PYTHON_IMAGE=$PYTHON_IMAGE
NATS_IMAGE=$NATS_IMAGE
POSTGRES_IMAGE=$POSTGRES_IMAGE
PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE
ENV
echo "== images ready in $((SECONDS - started)) s; compose uses them with these variables (deploy/images/images.env):"
cat images.env
