#!/usr/bin/env bash
# Every GPU path once, one line each: "works", "fails: <error>" or "skipped: <reason>".
#
# Run it on a machine with a GPU from a checkout installed with a gpu extra (or with cupy
# already present), e.g.  pip install -e '.[dev,gpu]'  (CUDA 12; '.[dev,gpu-cuda13]' for
# CUDA 13, never both); it takes a few minutes. The tests are those marked gpu
# (pytest -m gpu); pytest's own output goes to build/check_gpu.log. Extra arguments go to
# pytest (e.g. -x). Exit status 1 when a path fails.
set -uo pipefail
cd "$(dirname "$0")/.."
exec python -m tests.gpu.paths "$@"
