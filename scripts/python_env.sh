#!/usr/bin/env bash
# Creates (once) the project's Python virtual environment .venv and installs the PyPI
# packages of scripts/python_requirements.txt into it. The venv sees Debian's site packages
# (numpy, python3-torch 1.13), so tests run against the system PyTorch.
#   scripts/python_env.sh        prints the venv's python on the last line
# Idempotent: pip runs only when the requirements changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
requirements=scripts/python_requirements.txt
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  echo "$want" > "$stamp"
fi
echo "$PWD/$venv/bin/python"
