#!/usr/bin/env bash
# Build (once, cached) and install Horovod 0.28.1 with PyTorch (CPU) + Gloo.
#
# Usage: scripts/build-horovod.sh [PYTHON]
#   PYTHON  interpreter of the target environment (default: <repo>/.venv/bin/python)
#
# Horovod is deliberately NOT part of the main dependency install: it only ships
# an sdist, needs a native build (~2-3 min on 2 cores) and a patch to compile
# against torch >= 2.1. This script:
#   1. installs torch==2.13.0 into PYTHON if absent (a CPU wheel where one is on disk, else
#      PyPI's CUDA build, which runs on CPU);
#   2. reuses a cached wheel from $SPOT_AUTOSCALER_CACHE/wheels (default
#      ~/.cache/spot-autoscaler/wheels), or else downloads the sdist, patches
#      it for C++17, builds a wheel and stores it in the cache;
#   3. installs that wheel plus horovod's pure-python dependencies;
#   4. runs `horovodrun --check-build` and fails unless PyTorch and Gloo are built.
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${1:-$REPO_ROOT/.venv/bin/python}
CACHE_DIR=${SPOT_AUTOSCALER_CACHE:-$HOME/.cache/spot-autoscaler}/wheels

log() { printf '[build-horovod] %s\n' "$*"; }
die() { printf '[build-horovod] ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s; }

T_START=$(now)

case "$PYTHON" in */*) ;; *) PYTHON=$(command -v "$PYTHON") || die "python not found: ${1:-}" ;; esac
[ -x "$PYTHON" ] || die "python interpreter not found or not executable: $PYTHON"
# Absolute, but without resolving symlinks (a venv's python is a symlink).
PYTHON_BIN_DIR=$(cd "$(dirname "$PYTHON")" && pwd)
PYTHON="$PYTHON_BIN_DIR/$(basename "$PYTHON")"
pip_() { "$PYTHON" -m pip --disable-pip-version-check "$@"; }
log "target python: $PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"

# --- 1. torch ---------------------------------------------------------------
torch_probe() { "$PYTHON" -W ignore -c 'import torch; print(torch.__version__, torch.version.cuda or "cpu")' 2>/dev/null; }
if ! probe=$(torch_probe); then
    log "installing torch==$TORCH_VERSION ..."
    # Pinned: the cached horovod wheel is built against this exact version.
    pip_ install -q "torch==$TORCH_VERSION"
    probe=$(torch_probe) || die "torch does not import after installing it"
fi
read -r installed_torch torch_cuda <<<"$probe"
case "$installed_torch" in
    "$TORCH_VERSION"|"$TORCH_VERSION"+*) ;;
    *) die "torch $installed_torch is installed, expected $TORCH_VERSION (the cached horovod wheel is built against it)" ;;
esac
# PyPI's torch for Linux is a CUDA build; it runs on CPU, and horovod builds CPU-only against it
# while torch finds no CUDA toolkit: horovod's cmake/Modules/FindPytorch.cmake sets Pytorch_CUDA
# only when torch.version.cuda and torch.utils.cpp_extension.CUDA_HOME (CUDA_HOME/CUDA_PATH, nvcc
# on PATH or /usr/local/cuda) are both set. With a toolkit it would make a GPU build we neither
# want nor test, so that case stays an error.
cuda_home=$("$PYTHON" -W ignore -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)
if [ "$torch_cuda" = cpu ]; then
    log "torch $installed_torch present (CPU build)"
elif [ -z "$cuda_home" ]; then
    log "torch $installed_torch present (CUDA $torch_cuda build, run on CPU: no CUDA toolkit here)"
else
    die "torch $installed_torch is a CUDA $torch_cuda build and torch finds a CUDA toolkit at $cuda_home; hide it (CUDA_HOME, nvcc on PATH) for the CPU-only build"
fi

# --- 2. wheel: cached or built ----------------------------------------------
PY_TAG=$("$PYTHON" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
mkdir -p "$CACHE_DIR"
find_cached_wheel() {
    local w
    for w in "$CACHE_DIR"/horovod-"$HOROVOD_VERSION"-"$PY_TAG"-*.whl; do
        [ -f "$w" ] && { printf '%s\n' "$w"; return 0; }
    done
    return 1
}

if WHEEL=$(find_cached_wheel); then
    log "using cached wheel $WHEEL"
else
    log "no cached wheel in $CACHE_DIR: building horovod $HOROVOD_VERSION from sdist"
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/build-horovod.XXXXXX")
    # Keep the build tree when something fails, for inspection.
    cleanup() {
        local rc=$?
        if [ "$rc" = 0 ]; then rm -rf "$WORK"; else log "build tree kept for inspection: $WORK"; fi
    }
    trap cleanup EXIT

    # Build tools needed with --no-build-isolation (setuptools 65 has no
    # bdist_wheel of its own; setup.py imports packaging; cmake >= 3.13 is
    # taken from the system).
    command -v cmake >/dev/null || die "cmake not found (apt-get install cmake)"
    command -v g++ >/dev/null || die "g++ not found (apt-get install g++)"
    "$PYTHON" -c 'import setuptools, wheel, packaging' 2>/dev/null \
        || { log "installing build tools (setuptools, wheel, packaging) ..."; pip_ install -q setuptools wheel packaging; }

    log "downloading sdist ..."
    pip_ download -q --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$WORK/dl"
    tar -xzf "$WORK"/dl/horovod-"$HOROVOD_VERSION".tar.gz -C "$WORK"
    SRC="$WORK/horovod-$HOROVOD_VERSION"

    # --- C++17 patch ---------------------------------------------------------
    # torch >= 2.1 headers '#error' unless compiled as C++17, but horovod 0.28.1
    # pins C++14 (horovod issues #3996/#4014; fixed on master, never released).
    # The torch extension (mpi_lib_v2, which also compiles horovod/common) and
    # the Gloo static library linked into it must use the same language level
    # and the same _GLIBCXX_USE_CXX11_ABI as torch (the ABI flag is already
    # derived from torch by FindPytorch.cmake / the gloo vs compatible_gloo
    # choice; only the standard needs fixing):
    #  a) top-level CMakeLists.txt: CMAKE_CXX_STANDARD 14 -> 17 (inherited by the
    #     gloo / compatible_gloo subprojects and horovod/common sources);
    #  b) horovod/torch/CMakeLists.txt re-pins 14 for torch >= 1.5 -> 17;
    #  c) third_party/gloo/CMakeLists.txt appends -std=c++11 to CMAKE_CXX_FLAGS
    #     -> -std=c++17, so gloo never sees a conflicting older -std flag.
    log "patching CMake files for C++17 ..."
    patch_sed() { # file, sed expression, string that must be present afterwards
        sed -i "$2" "$SRC/$1"
        grep -qF -- "$3" "$SRC/$1" || die "C++17 patch did not apply to $1 (sources changed?)"
    }
    patch_sed CMakeLists.txt                's/^set(CMAKE_CXX_STANDARD 14)$/set(CMAKE_CXX_STANDARD 17)/' 'set(CMAKE_CXX_STANDARD 17)'
    patch_sed horovod/torch/CMakeLists.txt  's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/'   'set(CMAKE_CXX_STANDARD 17)'
    patch_sed third_party/gloo/CMakeLists.txt 's/-std=c++11 -fPIC/-std=c++17 -fPIC/'                       '-std=c++17 -fPIC'
    if grep -rn --include=CMakeLists.txt -e 'CMAKE_CXX_STANDARD 14' "$SRC/CMakeLists.txt" "$SRC/horovod/torch" >/dev/null; then
        die "C++14 pin still present after patch"
    fi

    log "building wheel (~2-3 min on 2 cores; log: $WORK/build.log) ..."
    t0=$(now)
    # PATH: target env first, so any python/pip spawned by the build is its own.
    # LDFLAGS: setup.py forces CMAKE_BUILD_TYPE=RelWithDebInfo (-g); strip the
    # debug info at link time to keep the cached wheel ~1 MB (symbols stay).
    if ! env PATH="$PYTHON_BIN_DIR:$PATH" \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_CPU_OPERATIONS=GLOO \
        MAKEFLAGS="${MAKEFLAGS:--j2}" \
        LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,--strip-debug" \
        "$PYTHON" -m pip --disable-pip-version-check wheel -v --no-deps --no-build-isolation \
            --no-cache-dir -w "$WORK/wheel" "$SRC" >"$WORK/build.log" 2>&1; then
        tail -n 60 "$WORK/build.log" >&2
        die "horovod build failed (last 60 log lines above)"
    fi
    log "wheel built in $(( $(now) - t0 )) s"

    # Sanity: the torch extension and gloo really were compiled as C++17 with
    # torch's ABI flag (guards against the patch silently not taking effect).
    abi=$("$PYTHON" -W ignore -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))' 2>/dev/null)
    # With a pre-cxx11-ABI torch horovod links "compatible_gloo" instead of "gloo".
    if [ "$abi" = 1 ]; then gloo_target=gloo; else gloo_target=compatible_gloo; fi
    for target in pytorch "$gloo_target"; do
        flags=$(find "$SRC" -path "*/CMakeFiles/${target}.dir/flags.make" -print -quit)
        [ -n "$flags" ] || die "no flags.make found for target $target"
        # horovod sets CMAKE_CXX_EXTENSIONS OFF, so the flag is -std=c++17; every
        # -std= on the compile line must be 17 (the last one would win).
        stds=$(grep '^CXX_FLAGS' "$flags" | grep -o -- '-std=[^ ]*' | sort -u | tr '\n' ' ')
        [ "$stds" = "-std=c++17 " ] || die "$target not compiled as (only) C++17: '${stds}' in $flags"
        grep -q -- "-D_GLIBCXX_USE_CXX11_ABI=$abi" "$flags" || die "$target ABI flag differs from torch's ($abi)"
    done
    log "verified: torch extension and $gloo_target built with -std=c++17 and _GLIBCXX_USE_CXX11_ABI=$abi"

    built=("$WORK"/wheel/horovod-"$HOROVOD_VERSION"-*.whl)
    [ -f "${built[0]}" ] || die "pip wheel produced no horovod wheel"
    # Copy under a temporary name then rename, so an interrupted copy never
    # leaves a truncated wheel that a later run would pick up.
    cp "${built[0]}" "$CACHE_DIR/.partial.$$"
    mv "$CACHE_DIR/.partial.$$" "$CACHE_DIR/$(basename "${built[0]}")"
    WHEEL="$CACHE_DIR/$(basename "${built[0]}")"
    log "cached $WHEEL ($(du -h "$WHEEL" | cut -f1))"
fi

# --- 3. install -------------------------------------------------------------
# Installed already = right version and the torch extension present (cheap:
# no torch import; the import itself is verified at the end).
if "$PYTHON" - "$HOROVOD_VERSION" 2>/dev/null <<'PYEOF'
import glob, importlib.metadata as md, importlib.util, os, sys
assert md.version("horovod") == sys.argv[1]
pkg = importlib.util.find_spec("horovod").submodule_search_locations[0]
assert glob.glob(os.path.join(pkg, "torch", "mpi_lib_v2*.so"))
PYEOF
then
    log "horovod $HOROVOD_VERSION already installed"
else
    log "installing $WHEEL (--no-deps) ..."
    pip_ install -q --no-deps --force-reinstall "$WHEEL"
fi
# horovod's own runtime requirements come from the wheel's metadata
# (cloudpickle, psutil, pyyaml, packaging, cffi); torch is excluded so pip can
# never swap it (or pull a CUDA build) on our behalf. numpy is added although
# horovod does not declare it: horovod.torch.broadcast_object (used by
# hvd.elastic.TorchState.sync) calls tensor.numpy() and fails with
# "RuntimeError: Numpy is not available" without it.
missing=$("$PYTHON" - <<'PYEOF'
import importlib.metadata as md
try:
    from packaging.requirements import Requirement
except ImportError:  # packaging itself may be one of the missing deps
    from pip._vendor.packaging.requirements import Requirement
out = []
for spec in (md.requires("horovod") or []) + ["numpy"]:
    req = Requirement(spec)
    if req.name.lower() == "torch" or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    try:
        if req.specifier.contains(md.version(req.name), prereleases=True):
            continue
    except md.PackageNotFoundError:
        pass
    out.append(str(req))
print("\n".join(out))
PYEOF
)
if [ -n "$missing" ]; then
    mapfile -t missing_reqs <<<"$missing"
    log "installing horovod runtime deps: ${missing_reqs[*]} ..."
    pip_ install -q "${missing_reqs[@]}"
fi

# --- 4. check-build ---------------------------------------------------------
horovodrun_() {
    if [ -x "$PYTHON_BIN_DIR/horovodrun" ]; then
        "$PYTHON_BIN_DIR/horovodrun" "$@"
    else  # e.g. a system python whose scripts went elsewhere
        "$PYTHON" -c 'import sys; from horovod.runner.launch import run_commandline; sys.argv[0] = "horovodrun"; run_commandline()' "$@"
    fi
}
log "horovodrun --check-build:"
check=$(horovodrun_ --check-build 2>&1) || { printf '%s\n' "$check"; die "horovodrun --check-build failed"; }
printf '%s\n' "$check"
grep -Eq '^\s*\[X\] PyTorch' <<<"$check" || die "horovod was built without PyTorch support"
grep -Eq '^\s*\[X\] Gloo' <<<"$check" || die "horovod was built without Gloo support"
"$PYTHON" -c 'import horovod.torch as hvd; hvd.init(); assert hvd.size() == 1 and hvd.gloo_built(); hvd.broadcast_object(0); hvd.shutdown()' \
    || die "import/init of horovod.torch failed"
log "OK: horovod $HOROVOD_VERSION with PyTorch + Gloo ready ($(( $(now) - T_START )) s total)"
