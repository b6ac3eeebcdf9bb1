#!/usr/bin/env bash
# Create the side-by-side benchmark's own environment with hetu-galvatron 2.4.0
# (the reference implementation of Galvatron-BMW), used only by benchmarks/.
#
# hetu-galvatron is never a dependency of gbmw: it lives in its own venv,
# by default <repo>/.venv-hetu (override with GBMW_HETU_VENV=/some/path).
# Python: $GBMW_HETU_PYTHON, else python3.11, else python3.
#
# Order matters on a CPU machine: torch==2.13.0 first (so no CUDA build is
# pulled in), then the pinned search-time dependencies, then the hetu sdist
# installed with --no-deps --no-build-isolation (compiles its C++ DP core).
# `wheel` is added to NOTES.md's list: without build isolation, setuptools<70 needs
# it for bdist_wheel (a fresh Python 3.11 venv does not have it).
# Idempotent: does nothing when the venv already imports galvatron's DP core.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${GBMW_HETU_VENV:-$REPO_ROOT/.venv-hetu}"
HETU_VERSION="2.4.0"
TORCH_VERSION="2.13.0"

if [ -z "${GBMW_HETU_PYTHON:-}" ]; then
    if command -v python3.11 >/dev/null 2>&1; then
        GBMW_HETU_PYTHON=python3.11
    else
        GBMW_HETU_PYTHON=python3
    fi
fi

PY="$VENV/bin/python"

installed() {
    [ -x "$PY" ] || return 1
    "$PY" - "$HETU_VERSION" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("hetu-galvatron") == sys.argv[1]
import galvatron_dp_core  # noqa: F401  (the compiled DP core)
EOF
}

if installed; then
    echo "hetu-galvatron $HETU_VERSION already installed in $VENV"
    exit 0
fi

if [ ! -x "$PY" ]; then
    echo "creating venv $VENV with $GBMW_HETU_PYTHON"
    "$GBMW_HETU_PYTHON" -m venv "$VENV"
fi

PIP=("$PY" -m pip --disable-pip-version-check)

if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    "${PIP[@]}" install "torch==$TORCH_VERSION"
fi

"${PIP[@]}" install "numpy<2.0.0" pybind11 scipy einops tqdm transformers==4.49.0 six \
    sentencepiece h5py attrs yacs "setuptools<70" wheel

DL="$VENV/hetu-dl"
mkdir -p "$DL"
SDIST="$DL/hetu_galvatron-$HETU_VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    "${PIP[@]}" download "hetu-galvatron==$HETU_VERSION" --no-deps --no-binary :all: -d "$DL"
fi
"${PIP[@]}" install --no-deps --no-build-isolation "$SDIST"

if installed; then
    echo "hetu-galvatron $HETU_VERSION installed in $VENV"
else
    echo "hetu-galvatron installation in $VENV failed the import check" >&2
    exit 1
fi
