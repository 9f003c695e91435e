#!/usr/bin/env bash
# mypy over the installed layout, the tests and the scripts (CI runs it; so should you).
#
# The folders at the top of the repository are packages of the `inferpool.` namespace (the
# package-dir mapping in pyproject.toml), which mypy cannot follow: it checks a tree of links
# under build/typecheck that has the installed shape, made afresh from that mapping on every
# run.  The settings (Python 3.10, the oldest supported) are pyproject.toml's [tool.mypy].
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
rm -rf "$tree"
mkdir -p "$tree"
python - "$tree" <<'EOF'
import os, sys
if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib
tree = sys.argv[1]
with open("pyproject.toml", "rb") as f:
    mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
inner = {folder for name, folder in mapping.items() if name.count(".")}
for name, folder in mapping.items():
    link = os.path.join(tree, *name.split("."))
    if name.count("."):  # a package inside the namespace: one link to its folder
        os.symlink(os.path.abspath(folder), link)
        continue
    os.makedirs(link, exist_ok=True)  # the namespace (or a top-level package): its entries
    for entry in sorted(os.listdir(folder)):
        if entry != "__pycache__" and os.path.join(folder, entry) not in inner:
            os.symlink(os.path.abspath(os.path.join(folder, entry)), os.path.join(link, entry))
for folder in ("tests", "scripts"):
    os.symlink(os.path.abspath(folder), os.path.join(tree, folder))
EOF
cd "$tree"
exec python -m mypy --config-file ../../pyproject.toml $(ls) "$@"
