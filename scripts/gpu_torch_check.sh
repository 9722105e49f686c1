#!/usr/bin/env bash
# On a GPU machine with PyTorch 2.x, one call: build the Python module, run the torch test
# files (the CUDA ops, prepare_qat with every recipe, torchao's QAT quantizers bit for bit,
# the one-line Llama swap), then the torch benchmarks: the per-op table, the CNN step against
# torch.ao, and the Llama step (float, torchao 8da4w, ours). torchao's wheel
# (.gpudeps/wheels, `pip download torchao==0.18.0 --no-deps`) is unzipped onto PYTHONPATH,
# not installed. Logs go to $OUT (or ./out); a summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${BUILD_DIR:-build-gpu}
summary=()
note() { summary+=("$1"); echo "$1"; }
if [ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ]; then cp -rn .gpudeps/root/. /; fi
torchao=.gpudeps/torchao
if [ ! -d "$torchao" ] && ls .gpudeps/wheels/torchao-*.whl >/dev/null 2>&1; then
  python3 -m zipfile -e .gpudeps/wheels/torchao-*.whl "$torchao"
fi
note "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1)"
t0=$(date +%s)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE="$(command -v python3)" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target _core qatgraph_python_files qat ${EXTRA_TARGETS:-} >"$out/build.log" 2>&1 ||
  { grep -E "error" -A4 "$out/build.log" | head -40; echo "SUMMARY: build failed"; exit 1; }
note "build of the Python module and qat: $(($(date +%s) - t0)) s"
# The C++ checks of the ops the torch recipes run on: each CHECK_OPS op's crosscheck cases,
# and each EXTRA_TARGETS test binary.
for op in ${CHECK_OPS:-}; do
  note "qat crosscheck --op $op: $("$build"/apps/qat crosscheck --op "$op" 2>&1 | tail -1)"
done
for t in ${EXTRA_TARGETS:-}; do
  timeout 120 "$build/tests/$t" >"$out/$t.log" 2>&1
  note "$t: rc=$?; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
done
export PYTHONPATH="$build/python:$torchao"
timeout "${T_PYTEST:-200}" python3 -m pytest -q -rs -p no:cacheprovider \
  python/tests/test_torch_cuda.py python/tests/test_torch_recipes.py python/tests/test_torch_prepare.py \
  python/tests/test_torch_torchao_conformance.py python/tests/test_torch_llama.py python/tests/test_torch_module.py python/tests/test_torch_dynamic_linear.py \
  python/tests/test_torch_observer_sync.py \
  >"$out/pytest.log" 2>&1
note "pytest (torch files): rc=$?; $(tail -1 "$out/pytest.log")"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -20
timeout 150 python3 bench/torch_llama_qat_bench.py ${LLAMA_ARGS:-} >"$out/llama.md" 2>&1
note "llama step: rc=$?"
grep -E "^\||parameters|Error" "$out/llama.md" | head -12
if [ -z "${SKIP_OPS:-}" ]; then
  timeout 60 python3 bench/torch_prepare_step_bench.py >"$out/cnn_step.md" 2>&1
  grep "^|" "$out/cnn_step.md"
fi
echo "==== SUMMARY ===="
printf '%s\n' "${summary[@]}"
