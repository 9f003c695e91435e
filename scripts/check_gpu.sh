#!/usr/bin/env bash
# Every GPU case once, one line each ("works", "fails: <error>", "skipped: <reason>"), then
# "N of M work"; exit status 1 when a case fails, 2 when the check cannot run.
#
#   scripts/check_gpu.sh [--wheels DIR] [--log FILE] [--dry-run] [--list] [-- PYTEST_ARGS]
#
# For a machine with a GPU and no network: what the cases need and the machine lacks comes
# from wheels carried with the checkout (--wheels). It runs with $PYTHON when set, else with
# `python` when that is Python 3.10 or later, else with `python3`. tests/gpu/check.py says
# the rest; docs/operations.md ("The GPU check") says how to prepare the wheels.
set -uo pipefail
here="${BASH_SOURCE[0]%/*}"
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
cd "$here/.." || exit 2

usable() {
  command -v "$1" >/dev/null 2>&1 &&
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1
}

py="${PYTHON:-}"
if [ -n "$py" ]; then
  if ! usable "$py"; then
    echo "check_gpu: PYTHON=$py is not a Python 3.10 or later that runs" >&2
    exit 2
  fi
else
  for candidate in python python3; do
    if usable "$candidate"; then
      py="$candidate"
      break
    fi
  done
  if [ -z "$py" ]; then
    echo "check_gpu: neither python nor python3 on PATH is Python 3.10 or later (set PYTHON)" >&2
    exit 2
  fi
fi
exec "$py" -m tests.gpu.check "$@"
