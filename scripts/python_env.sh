#!/usr/bin/env bash
# Creates (or completes) the project's Python virtual environment .venv for the ONNX checks
# (scripts/onnx_check.py): onnxruntime, onnx and numpy from PyPI, on top of the system
# Python's packages (--system-site-packages). Idempotent: a no-op once they import.
#   scripts/python_env.sh          prints the venv's python on success
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
# Versions known to work with the ONNX 1.12 / opset 17 models qat export writes.
packages=(onnxruntime==1.32.0 onnx==1.23.2 "numpy>=1.24,<3")
if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import onnxruntime, onnx, numpy" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
python3 -m venv --system-site-packages "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}" >&2
"$venv/bin/python" -c "import onnxruntime, onnx, numpy" >&2
echo "$venv/bin/python"
