#!/usr/bin/env bash
# Build (once, cached) the binaries of a local Kubernetes control plane for the real-cluster
# tests (tests/support/control_plane.py): kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd, kwok, mpi-operator and training-operator, from source through the Go
# module proxy.
#
# Usage: scripts/build-control-plane.sh [--print-bin-dir]
#   (no argument)    build what is missing; the last stdout line is the bin dir
#   --print-bin-dir  print the bin dir of the pinned versions and exit 0 if every binary is
#                    there; otherwise one line on stderr saying why, exit 1 (never builds)
#
# Versions: scripts/control-plane.versions (the only place they are pinned). Binaries go to
#   ${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/control-plane/<key>/bin/
# where <key> = k8s-<KUBERNETES>-<hash of the versions, the Go version and RECIPE>, so a
# version bump or another Go builds next to the old binaries instead of over them. The
# wrapper Go modules (go.mod/go.sum as resolved) and the build logs stay in <key>/src and
# <key>/logs. GOCACHE and GOMODCACHE are Go's own (outside the clone).
#
# How: one wrapper module per upstream (kubernetes, etcd, kwok, mpi-operator, training-operator),
# so that each keeps its own dependency versions (training-operator v1.9.3 is on client-go
# v0.31 and controller-runtime v0.19, not 1.37's). k8s.io/kubernetes requires its staging
# modules (31 in 1.37) at v0.0.0 with relative replaces, which only work inside its repository:
# the wrapper replaces each one its go.mod requires with the published v0.<minor>.<patch>.
# GOTOOLCHAIN=local: a dependency that needs a newer Go fails instead of downloading one.
# Cold, on 2 cores: about 25 min (docs/testing.md); one binary at a time (-p 2) to bound memory.
set -euo pipefail

RECIPE=1 # bump when the build flags below change: it is part of the cache key

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSIONS_FILE=$REPO_ROOT/scripts/control-plane.versions
CACHE_ROOT=${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/control-plane
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok mpi-operator training-operator)

log() { printf '[build-control-plane] %s\n' "$*"; }
die() { printf '[build-control-plane] ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s; }

PRINT_BIN_DIR=0
case "${1:-}" in
    "") ;;
    --print-bin-dir) PRINT_BIN_DIR=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
esac

# --- versions ----------------------------------------------------------------
[ -f "$VERSIONS_FILE" ] || die "versions file not found: $VERSIONS_FILE"
# Only KEY=VALUE lines count (comments and their wording are not part of the key).
PINS=$(grep -E '^[A-Z_]+=' "$VERSIONS_FILE" | sort)
# shellcheck source=control-plane.versions
. "$VERSIONS_FILE"
for var in KUBERNETES ETCD KWOK MPI_OPERATOR TRAINING_OPERATOR; do
    [ -n "${!var:-}" ] || die "$var is not set in $VERSIONS_FILE"
done
[[ $KUBERNETES =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "KUBERNETES=$KUBERNETES is not a v1.<minor>.<patch> release"
KUBE_MINOR=${BASH_REMATCH[1]}
STAGING_VERSION=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}

# --- go ----------------------------------------------------------------------
GO=${GO:-$(command -v go || true)}
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

complete_bin_dir() { # dir: true when every binary is there
    local b
    for b in "${BINARIES[@]}"; do [ -x "$1/$b" ] || return 1; done
}

if [ -z "$GO" ] || ! GO_VERSION=$("$GO" version 2>/dev/null); then
    if [ "$PRINT_BIN_DIR" = 1 ]; then
        # No Go here: a bin dir built earlier for exactly these pins (by any Go) still serves.
        for d in "$CACHE_ROOT"/*/; do
            if [ "$(cat "$d/pins" 2>/dev/null)" = "$PINS" ] && complete_bin_dir "$d/bin"; then
                printf '%s\n' "${d%/}/bin"
                exit 0
            fi
        done
        die "control-plane binaries not built and go not found (install Go >= 1.26, then run \`make control-plane\`)"
    fi
    die "go not found (install Go >= 1.26 on PATH, or set GO=/path/to/go)"
fi

KEY_HASH=$(printf '%s\n' "$PINS" "$GO_VERSION" "recipe=$RECIPE" | sha256sum | cut -c1-12)
KEY_DIR=$CACHE_ROOT/k8s-$KUBERNETES-$KEY_HASH
BIN_DIR=$KEY_DIR/bin

if [ "$PRINT_BIN_DIR" = 1 ]; then
    complete_bin_dir "$BIN_DIR" \
        || die "control-plane binaries not built in $BIN_DIR: run \`make control-plane\` (~25 min cold)"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi

if complete_bin_dir "$BIN_DIR"; then
    log "all binaries cached ($(du -sh "$BIN_DIR" | cut -f1)) in $KEY_DIR"
    printf '%s\n' "$BIN_DIR"
    exit 0
fi

# --- build -------------------------------------------------------------------
SRC_DIR=$KEY_DIR/src
LOG_DIR=$KEY_DIR/logs
mkdir -p "$BIN_DIR" "$SRC_DIR" "$LOG_DIR"
# Two builds of the same key (two terminals, two test runs) take turns.
exec 9>"$KEY_DIR/.lock"
flock 9
printf '%s\n' "$PINS" >"$KEY_DIR/pins"

T_START=$(now)
GOCACHE_DIR=$("$GO" env GOCACHE)
GOMODCACHE_DIR=$("$GO" env GOMODCACHE)
du_mb() { if [ -d "$1" ]; then du -sm "$1" 2>/dev/null | cut -f1; else echo 0; fi; }
GOCACHE_MB0=$(du_mb "$GOCACHE_DIR")
GOMODCACHE_MB0=$(du_mb "$GOMODCACHE_DIR")
log "$GO_VERSION; building into $KEY_DIR"
log "versions: $(tr '\n' ' ' <<<"$PINS")"

# The first line of a failed go command that names the culprit (a module the proxy refuses,
# a Go version a dependency needs), else its first error line.
culprit() {
    grep -m1 -E 'reading https?://|not available|invalid version|unknown revision|requires go >=|410 Gone|40[34] ' "$1" \
        || grep -m1 -E '^(go: |# |.*\.go:[0-9]+)' "$1" || tail -n1 "$1"
}

# Every module@version the proxy must serve, checked in one call before any build.
check_modules() { # dir module@version...
    local dir=$1 out
    shift
    out=$(cd "$dir" && "$GO" list -m -e -f '{{if .Error}}{{.Error.Err}}{{end}}' "$@" 2>&1) \
        || die "module lookup failed: $(head -n1 <<<"$out")"
    out=$(grep -v '^$' <<<"$out" || true)
    [ -z "$out" ] || die "module not available from GOPROXY=$("$GO" env GOPROXY): $(head -n1 <<<"$out")"
}

new_module() { # name: an empty wrapper module in $SRC_DIR/<name>
    local dir=$SRC_DIR/$1
    mkdir -p "$dir"
    [ -f "$dir/go.mod" ] || (cd "$dir" && "$GO" mod init "controlplane.local/$1" >/dev/null 2>&1) \
        || die "go mod init failed in $dir"
    printf '%s\n' "$dir"
}

declare -A BUILD_SECONDS=()
build() { # name module-dir package extra-ldflags
    local name=$1 dir=$2 pkg=$3 ldflags=$4 t0 rc
    local out=$BIN_DIR/$name tmp=$BIN_DIR/.$name.partial.$$ logf=$LOG_DIR/$name.log
    if [ -x "$out" ]; then
        log "$name: already built"
        return 0
    fi
    log "building $name ($pkg) ..."
    t0=$(now)
    rc=0
    (cd "$dir" && "$GO" build -p 2 -trimpath -ldflags "-s -w $ldflags" -o "$tmp" "$pkg") \
        >"$logf" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        rm -f "$tmp"
        die "$name: build failed: $(culprit "$logf") (log: $logf)"
    fi
    mv -f "$tmp" "$out" # same directory: an interrupted build never leaves a partial binary
    BUILD_SECONDS[$name]=$(($(now) - t0))
    log "$name built in ${BUILD_SECONDS[$name]} s ($(du -h "$out" | cut -f1))"
}

missing() { local b; for b in "$@"; do [ -x "$BIN_DIR/$b" ] || return 0; done; return 1; }
NEED_KUBE=0; NEED_ETCD=0; NEED_KWOK=0; NEED_MPI=0; NEED_TRAINING=0
missing kube-apiserver kube-controller-manager kube-scheduler && NEED_KUBE=1
missing etcd && NEED_ETCD=1
missing kwok && NEED_KWOK=1
missing mpi-operator && NEED_MPI=1
missing training-operator && NEED_TRAINING=1

# --- preflight: every module@version the proxy must serve, before any build ---------
MODULES=()
[ "$NEED_KUBE" = 1 ] && MODULES+=("k8s.io/kubernetes@$KUBERNETES")
[ "$NEED_ETCD" = 1 ] && MODULES+=("go.etcd.io/etcd/server/v3@$ETCD")
[ "$NEED_KWOK" = 1 ] && MODULES+=("sigs.k8s.io/kwok@$KWOK")
[ "$NEED_MPI" = 1 ] && MODULES+=("github.com/kubeflow/mpi-operator@$MPI_OPERATOR")
[ "$NEED_TRAINING" = 1 ] && MODULES+=("github.com/kubeflow/training-operator@$TRAINING_OPERATOR")
PREFLIGHT_DIR=$(new_module preflight)
check_modules "$PREFLIGHT_DIR" "${MODULES[@]}"
if [ "$NEED_KUBE" = 1 ]; then
    KUBE_GOMOD=$(cd "$PREFLIGHT_DIR" && "$GO" list -m -f '{{.GoMod}}' "k8s.io/kubernetes@$KUBERNETES" 2>/dev/null) \
        || die "module not available: k8s.io/kubernetes@$KUBERNETES"
    # The staging modules: its go.mod requires them at v0.0.0 and replaces them with
    # ./staging/src/... (it also replaces sample-cli-plugin and sample-controller, which it
    # does not require: they are never loaded, so they get no replace here).
    mapfile -t STAGING < <(comm -12 \
        <(sed -nE 's#^[[:space:]]*(replace[[:space:]]+)?(k8s\.io/[^[:space:]]+)[[:space:]]+=>[[:space:]]+\./staging/src/.*#\2#p' "$KUBE_GOMOD" | sort -u) \
        <(sed -nE 's#^[[:space:]]*(require[[:space:]]+)?(k8s\.io/[^[:space:]]+)[[:space:]]+v0\.0\.0([[:space:]].*)?$#\2#p' "$KUBE_GOMOD" | sort -u))
    [ "${#STAGING[@]}" -gt 0 ] || die "no staging modules found in $KUBE_GOMOD"
    log "k8s.io/kubernetes@$KUBERNETES: ${#STAGING[@]} staging modules at $STAGING_VERSION"
    check_modules "$PREFLIGHT_DIR" "${STAGING[@]/%/@$STAGING_VERSION}"
fi

# --- builds --------------------------------------------------------------------------
if [ "$NEED_KUBE" = 1 ]; then # kube-apiserver, kube-controller-manager, kube-scheduler
    KUBE_DIR=$(new_module kubernetes)
    edits=(-require="k8s.io/kubernetes@$KUBERNETES")
    for m in "${STAGING[@]}"; do edits+=(-replace="$m=$m@$STAGING_VERSION"); done
    (cd "$KUBE_DIR" && "$GO" mod edit "${edits[@]}")
    kube_ldflags=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        kube_ldflags+=" -X $pkg.gitVersion=$KUBERNETES -X $pkg.gitMajor=1 -X $pkg.gitMinor=$KUBE_MINOR -X $pkg.gitTreeState=clean"
    done
    for b in kube-apiserver kube-controller-manager kube-scheduler; do
        build "$b" "$KUBE_DIR" "k8s.io/kubernetes/cmd/$b" "$kube_ldflags"
    done
fi

if [ "$NEED_ETCD" = 1 ]; then # its server module has relative replaces too, ignored in a dependency
    ETCD_DIR=$(new_module etcd)
    (cd "$ETCD_DIR" && "$GO" mod edit -require="go.etcd.io/etcd/server/v3@$ETCD")
    build etcd "$ETCD_DIR" go.etcd.io/etcd/server/v3 ""
fi

if [ "$NEED_KWOK" = 1 ]; then
    KWOK_DIR=$(new_module kwok)
    (cd "$KWOK_DIR" && "$GO" mod edit -require="sigs.k8s.io/kwok@$KWOK")
    build kwok "$KWOK_DIR" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK#v}"
fi

if [ "$NEED_MPI" = 1 ]; then
    MPI_DIR=$(new_module mpi-operator)
    (cd "$MPI_DIR" && "$GO" mod edit -require="github.com/kubeflow/mpi-operator@$MPI_OPERATOR")
    build mpi-operator "$MPI_DIR" github.com/kubeflow/mpi-operator/cmd/mpi-operator \
        "-X github.com/kubeflow/mpi-operator/pkg/version.Version=$MPI_OPERATOR"
fi

if [ "$NEED_TRAINING" = 1 ]; then # PyTorchJob (kubeflow.org/v1); no version package to stamp
    TRAINING_DIR=$(new_module training-operator)
    (cd "$TRAINING_DIR" && "$GO" mod edit -require="github.com/kubeflow/training-operator@$TRAINING_OPERATOR")
    build training-operator "$TRAINING_DIR" github.com/kubeflow/training-operator/cmd/training-operator.v1 ""
fi

complete_bin_dir "$BIN_DIR" || die "binaries missing after the build in $BIN_DIR"

# --- report ------------------------------------------------------------------
total=$(($(now) - T_START))
times=""
for b in "${BINARIES[@]}"; do
    [ -n "${BUILD_SECONDS[$b]:-}" ] && times+="$b ${BUILD_SECONDS[$b]} s, "
done
# One line per build run (a later run may rebuild only a binary that went missing).
printf '%s %s recipe %s: %stotal %s s\n' "$(date -u +%FT%TZ)" "$GO_VERSION" "$RECIPE" "$times" "$total" \
    >>"$KEY_DIR/build-runs.txt"
log "build times: ${times}total $total s"
log "bin dir: $(du -sh "$BIN_DIR" | cut -f1); GOCACHE $GOCACHE_DIR grew $(($(du_mb "$GOCACHE_DIR") - GOCACHE_MB0)) MB, GOMODCACHE $GOMODCACHE_DIR grew $(($(du_mb "$GOMODCACHE_DIR") - GOMODCACHE_MB0)) MB"
printf '%s\n' "$BIN_DIR"
