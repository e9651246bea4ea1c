#!/usr/bin/env bash
# Build (once, cached) the helm binary the chart tests use (tests/test_helm*.py), from source
# through the Go module proxy, like scripts/build-control-plane.sh does the control plane.
#
# Usage: scripts/build-helm.sh [--print-bin-dir]
#   (no argument)    build helm if missing; the last stdout line is the bin dir
#   --print-bin-dir  print the bin dir of the pinned version and exit 0 if helm is there;
#                    otherwise one line on stderr saying why, exit 1 (never builds)
#
# Version: scripts/helm.versions (not control-plane.versions, whose lines are that cache's key).
# The binary goes to
#   ${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/helm/<key>/bin/helm
# where <key> = helm-<HELM>-<hash of the versions, the Go version and RECIPE>.
# GOTOOLCHAIN=local: a dependency that needs a newer Go fails instead of downloading one.
# Cold, on 2 cores: about 4 min (242 s, modules downloaded too); -p 1 bounds memory.
set -euo pipefail

RECIPE=1 # bump when the build flags below change: it is part of the cache key

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSIONS_FILE=$REPO_ROOT/scripts/helm.versions
CACHE_ROOT=${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/helm

log() { printf '[build-helm] %s\n' "$*"; }
die() { printf '[build-helm] ERROR: %s\n' "$*" >&2; exit 1; }

PRINT_BIN_DIR=0
case "${1:-}" in
    "") ;;
    --print-bin-dir) PRINT_BIN_DIR=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
esac

[ -f "$VERSIONS_FILE" ] || die "versions file not found: $VERSIONS_FILE"
PINS=$(grep -E '^[A-Z_]+=' "$VERSIONS_FILE" | sort)
# shellcheck source=helm.versions
. "$VERSIONS_FILE"
[[ ${HELM:-} =~ ^v3\.[0-9]+\.[0-9]+$ ]] || die "HELM=${HELM:-} in $VERSIONS_FILE is not a v3.<minor>.<patch> release"

GO=${GO:-$(command -v go || true)}
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

if [ -z "$GO" ] || ! GO_VERSION=$("$GO" version 2>/dev/null); then
    if [ "$PRINT_BIN_DIR" = 1 ]; then
        # No Go here: a helm built earlier for exactly this pin (by any Go) still serves.
        for d in "$CACHE_ROOT"/*/; do
            if [ "$(cat "$d/pins" 2>/dev/null)" = "$PINS" ] && [ -x "$d/bin/helm" ]; then
                printf '%s\n' "${d%/}/bin"
                exit 0
            fi
        done
        die "helm not built and go not found (install Go >= 1.26, then run \`make helm\`)"
    fi
    die "go not found (install Go >= 1.26 on PATH, or set GO=/path/to/go)"
fi

KEY_DIR=$CACHE_ROOT/helm-$HELM-$(printf '%s\n' "$PINS" "$GO_VERSION" "recipe=$RECIPE" | sha256sum | cut -c1-12)
BIN_DIR=$KEY_DIR/bin

if [ -x "$BIN_DIR/helm" ]; then
    [ "$PRINT_BIN_DIR" = 1 ] || log "helm $HELM cached in $KEY_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi
[ "$PRINT_BIN_DIR" = 0 ] || die "helm not built in $BIN_DIR: run \`make helm\` (a few minutes cold)"

SRC_DIR=$KEY_DIR/src
mkdir -p "$BIN_DIR" "$SRC_DIR"
exec 9>"$KEY_DIR/.lock" # two builds of the same key take turns
flock 9
[ -x "$BIN_DIR/helm" ] && { printf '%s\n' "$BIN_DIR"; exit 0; }
printf '%s\n' "$PINS" >"$KEY_DIR/pins"

T_START=$(date +%s)
log "$GO_VERSION; building helm $HELM into $KEY_DIR"
# A wrapper module, so helm keeps its own dependency versions (its go.mod as resolved).
[ -f "$SRC_DIR/go.mod" ] || (cd "$SRC_DIR" && "$GO" mod init buildhelm.local >/dev/null 2>&1) \
    || die "go mod init failed in $SRC_DIR"
(cd "$SRC_DIR" && "$GO" mod edit -require="helm.sh/helm/v3@$HELM")
# helm's own Makefile stamps its version and the Kubernetes version `helm template` assumes
# (client-go v0.<minor> is Kubernetes 1.<minor>).
CLIENT_GO=$(cd "$SRC_DIR" && "$GO" list -m -f '{{.Version}}' k8s.io/client-go 2>"$KEY_DIR/build.log") \
    || die "module not available: helm.sh/helm/v3@$HELM: $(tail -n1 "$KEY_DIR/build.log")"
[[ $CLIENT_GO =~ ^v0\.([0-9]+)\. ]] || die "unexpected client-go version $CLIENT_GO"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=${BASH_REMATCH[1]}"
done
tmp=$BIN_DIR/.helm.partial.$$
(cd "$SRC_DIR" && "$GO" build -p 1 -trimpath -ldflags "$ldflags" -o "$tmp" helm.sh/helm/v3/cmd/helm) \
    >"$KEY_DIR/build.log" 2>&1 || { rm -f "$tmp"; die "helm build failed: $(grep -m1 -E '^(go: |# |.*\.go:[0-9]+)' "$KEY_DIR/build.log" || tail -n1 "$KEY_DIR/build.log") (log: $KEY_DIR/build.log)"; }
mv -f "$tmp" "$BIN_DIR/helm" # same directory: an interrupted build never leaves a partial binary
total=$(($(date +%s) - T_START))
printf '%s %s recipe %s: helm %s s\n' "$(date -u +%FT%TZ)" "$GO_VERSION" "$RECIPE" "$total" >>"$KEY_DIR/build-runs.txt"
log "helm built in $total s ($(du -h "$BIN_DIR/helm" | cut -f1))"
printf '%s\n' "$BIN_DIR"
