#!/usr/bin/env bash
# Installs the Debian packages qatgraph needs, skipping those already present.
# Idempotent and non-interactive; a no-op on a machine that has everything.
set -euo pipefail

packages=(
  cmake g++ make ccache pkg-config zlib1g-dev
  libeigen3-dev libboost-graph-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev
  python3 python3-numpy python3-torch python3-sklearn python3-matplotlib
  # `qat export` (ONNX 1.12's C++ protobuf classes and checker) and the onnxruntime check's
  # virtual environment (scripts/python_env.sh).
  libonnx-dev libprotobuf-dev
  # The Python module (nanobind, built against the system Python) and its venv.
  python3-dev python3-venv
  # Data-parallel CPU ranks (runtime/distributed/, the Gloo backend).
  libgloo-dev
  # Language-model text data: the Python documentation's reStructuredText sources (the
  # corpus), SentencePiece's library (the tokenizer, data/tokenizer.cpp) and its tools.
  python3.11-doc libsentencepiece-dev sentencepiece
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
