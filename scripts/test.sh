#!/usr/bin/env bash
# The whole test suite: install what is missing, build, and run ctest.
#   scripts/test.sh             normal build (CUDA code compiled when nvcc is present), with
#                               the Python module (nanobind from the project venv .venv,
#                               scripts/python_env.sh) and its pytest suite as ctest
#                               python_pytest; the installed-package test package_consumer
#   scripts/test.sh --sanitize  CPU-only build with AddressSanitizer + UBSan
# The normal run ends with a short libFuzzer run of every file reader (scripts/fuzz.sh: a
# clang build of the readers only, under ASan + UBSan, a few seconds of fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
# The project venv (.venv: nanobind, pytest, onnxruntime, onnx from PyPI; Debian's numpy and
# torch through --system-site-packages) for the Python module and the ONNX round trip.
python=$(scripts/python_env.sh | tail -n 1)
jobs=$(nproc 2>/dev/null || echo 2)
if [ "${1:-}" = "--sanitize" ]; then
  scripts/build.sh build-sanitize -DQG_SANITIZE=ON -DQG_ENABLE_CUDA=OFF -DQG_BUILD_BENCH=OFF
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  ctest --test-dir build-sanitize --output-on-failure -j "$jobs"
else
  scripts/build.sh build -DPython_EXECUTABLE="$python"
  ctest --test-dir build --output-on-failure -j "$jobs"
  scripts/fuzz.sh --runs 10000
fi
