#!/usr/bin/env bash
# Build (once, cached) Karpenter's kwok cloud provider for the real-cluster Karpenter tests
# (tests/support/karpenter.py), from source through the Go module proxy, like
# scripts/build-helm.sh does helm.
#
# Usage: scripts/build-karpenter.sh [--print-bin-dir]
#   (no argument)    build if missing; the last stdout line is the bin dir
#   --print-bin-dir  print the bin dir of the pinned version and exit 0 if the binary is there;
#                    otherwise one line on stderr saying why, exit 1 (never builds)
#
# Version: scripts/karpenter.versions (not control-plane.versions, whose lines are that cache's key).
# The binary and the CRDs the tests install go to
#   ${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/karpenter/<key>/bin/karpenter-kwok
#   ${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/karpenter/<key>/bin/crds/*.yaml
# where <key> = karpenter-<KARPENTER>-<hash of the versions, the Go version and RECIPE>.
# The CRDs are copied from the same module the binary is built from, so they always match it.
# GOTOOLCHAIN=local: a dependency that needs a newer Go fails instead of downloading one.
# Cold, on 2 cores: about 8 min (487 s, modules downloaded too); -p 1 and nice -n 19 keep it
# off the timing benchmarks.
set -euo pipefail

RECIPE=1 # bump when the build flags below change: it is part of the cache key

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSIONS_FILE=$REPO_ROOT/scripts/karpenter.versions
CACHE_ROOT=${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/karpenter
MODULE=sigs.k8s.io/karpenter

log() { printf '[build-karpenter] %s\n' "$*"; }
die() { printf '[build-karpenter] ERROR: %s\n' "$*" >&2; exit 1; }
built() { [ -x "$1/karpenter-kwok" ] && [ -f "$1/crds/karpenter.kwok.sh_kwoknodeclasses.yaml" ]; }

PRINT_BIN_DIR=0
case "${1:-}" in
    "") ;;
    --print-bin-dir) PRINT_BIN_DIR=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
esac

[ -f "$VERSIONS_FILE" ] || die "versions file not found: $VERSIONS_FILE"
PINS=$(grep -E '^[A-Z_]+=' "$VERSIONS_FILE" | sort)
# shellcheck source=karpenter.versions
. "$VERSIONS_FILE"
[[ ${KARPENTER:-} =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "KARPENTER=${KARPENTER:-} in $VERSIONS_FILE is not a v1.<minor>.<patch> release"

GO=${GO:-$(command -v go || true)}
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

if [ -z "$GO" ] || ! GO_VERSION=$("$GO" version 2>/dev/null); then
    [ "$PRINT_BIN_DIR" = 1 ] || die "go not found (install Go >= 1.26 on PATH, or set GO=/path/to/go)"
    # No Go here: a build made earlier for exactly this pin (by any Go) still serves.
    for d in "$CACHE_ROOT"/*/; do
        if [ "$(cat "$d/pins" 2>/dev/null)" = "$PINS" ] && built "$d/bin"; then
            printf '%s\n' "${d%/}/bin"
            exit 0
        fi
    done
    die "karpenter-kwok not built and go not found (install Go >= 1.26, then run \`make karpenter\`)"
fi

KEY_DIR=$CACHE_ROOT/karpenter-$KARPENTER-$(printf '%s\n' "$PINS" "$GO_VERSION" "recipe=$RECIPE" | sha256sum | cut -c1-12)
BIN_DIR=$KEY_DIR/bin

if built "$BIN_DIR"; then
    [ "$PRINT_BIN_DIR" = 1 ] || log "karpenter-kwok $KARPENTER cached in $KEY_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi
[ "$PRINT_BIN_DIR" = 0 ] || die "karpenter-kwok not built in $BIN_DIR: run \`make karpenter\` (minutes cold)"

SRC_DIR=$KEY_DIR/src
mkdir -p "$BIN_DIR" "$SRC_DIR"
exec 9>"$KEY_DIR/.lock" # two builds of the same key take turns
flock 9
built "$BIN_DIR" && { printf '%s\n' "$BIN_DIR"; exit 0; }
printf '%s\n' "$PINS" >"$KEY_DIR/pins"

T_START=$(date +%s)
log "$GO_VERSION; building karpenter-kwok $KARPENTER into $KEY_DIR"
# A wrapper module, so Karpenter keeps its own dependency versions (its go.mod as resolved).
[ -f "$SRC_DIR/go.mod" ] || (cd "$SRC_DIR" && "$GO" mod init buildkarpenter.local >/dev/null 2>&1) \
    || die "go mod init failed in $SRC_DIR"
(cd "$SRC_DIR" && "$GO" mod edit -require="$MODULE@$KARPENTER")
MOD_DIR=$(cd "$SRC_DIR" && "$GO" mod download -json "$MODULE@$KARPENTER" 2>"$KEY_DIR/build.log" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') || true
[ -d "$MOD_DIR/kwok" ] || die "module not available: $MODULE@$KARPENTER: $(tail -n1 "$KEY_DIR/build.log")"
tmp=$BIN_DIR/.karpenter-kwok.partial.$$
(cd "$SRC_DIR" && nice -n 19 "$GO" build -p 1 -trimpath -ldflags "-s -w" -o "$tmp" "$MODULE/kwok") \
    >"$KEY_DIR/build.log" 2>&1 || { rm -f "$tmp"; die "karpenter-kwok build failed: $(grep -m1 -E '^(go: |# |.*\.go:[0-9]+)' "$KEY_DIR/build.log" || tail -n1 "$KEY_DIR/build.log") (log: $KEY_DIR/build.log)"; }
# NodePool, NodeClaim, NodeOverlay (kwok's copies: they also restrict the karpenter.kwok.sh label
# domain) and KWOKNodeClass, which must come from kwok/apis/crds: its charts/crds entry is a
# symlink, and module zips drop symlinks. Copied before the binary lands (`built` needs both).
mkdir -p "$BIN_DIR/crds"
install -m 0644 "$MOD_DIR"/kwok/charts/crds/*.yaml "$MOD_DIR"/kwok/apis/crds/*.yaml "$BIN_DIR/crds/"
mv -f "$tmp" "$BIN_DIR/karpenter-kwok" # same directory: an interrupted build never leaves a partial binary
total=$(($(date +%s) - T_START))
printf '%s %s recipe %s: karpenter-kwok %s s\n' "$(date -u +%FT%TZ)" "$GO_VERSION" "$RECIPE" "$total" >>"$KEY_DIR/build-runs.txt"
log "karpenter-kwok built in $total s ($(du -h "$BIN_DIR/karpenter-kwok" | cut -f1))"
printf '%s\n' "$BIN_DIR"
