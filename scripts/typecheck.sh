#!/usr/bin/env bash
# mypy over the installed layout: the folders at the top of the repository are packages of the
# `inferpool.` namespace (a package-dir mapping), which mypy cannot follow, so it checks a tree
# of links that has the installed shape.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree/inferpool"
for f in inferpool/*.py inferpool/*/; do
  [ "$(basename "$f")" = __pycache__ ] || ln -s "$PWD/${f%/}" "$tree/inferpool/"
done
for pkg in wire broker workers shm backends client examples; do ln -s "$PWD/$pkg" "$tree/inferpool/$pkg"; done
ln -s "$PWD/triton_python_backend_utils" "$tree/triton_python_backend_utils"
cd "$tree"
exec python -m mypy --config-file ../../pyproject.toml -p inferpool -p triton_python_backend_utils "$@"
