#!/usr/bin/env bash
# On a GPU machine with PyTorch, one call for causal_attention's cuDNN path: configure with the
# cuDNN of torch's nvidia-cudnn wheel and the cuDNN frontend headers carried in
# .gpudeps/cudnn/frontend (scripts/pack_gpu_deps.sh puts them there), build the attention tests
# and the Python module, run test_ops_attention (cuDNN against the CPU reference and the
# project's kernels, strided views, named errors; the "[cudnn attention]" lines are the
# measured errors) and bench/torch_attention_bench.py: ours (kernel, cudnn, cudnn-nd) against
# torch's SDPA and torch's cuDNN SDPA, forward and forward+backward, on Llama's anchor shape
# and at head dim 128. Logs go to $OUT (or ./out); a summary is printed last.
# Environment: REPS (bench repetitions, 50), BUILD_DIR (build-gpu), T_BENCH (120 s), T_TESTS
# (200 s). The build, benchmark and tests fit one 600 s call.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${BUILD_DIR:-build-gpu}
summary=()
note() { summary+=("$1"); echo "$1"; }
if [ -d .gpudeps/root ] && [ ! -f /usr/include/eigen3/Eigen/Core ]; then cp -rn .gpudeps/root/. /; fi
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(python3 -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1)"

t0=$(date +%s)
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DQG_BUILD_BENCH=OFF -DQG_ENABLE_ONNX=OFF \
  -DPython_EXECUTABLE="$(command -v python3)" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; echo "SUMMARY: configure failed"; exit 1; }
while read -r line; do note "$line"; done < <(grep -E "qatgraph: (cuDNN|Python)" "$out/configure.log")
cmake --build "$build" -j "$(nproc)" --target test_ops_attention _core qatgraph_python_files \
  >"$out/build.log" 2>&1 ||
  { grep -E "error" -A4 "$out/build.log" | head -60; echo "SUMMARY: build failed"; exit 1; }
note "build: $(($(date +%s) - t0)) s"

# The benchmark first: its numbers are what this run is for, and the tests build many more
# cuDNN graphs (each a few hundred ms to seconds on first use).
PYTHONPATH="$build/python" timeout "${T_BENCH:-120}" python3 bench/torch_attention_bench.py \
  --reps "${REPS:-50}" --json "$out/attention.json" >"$out/attention_bench.txt" 2>&1
note "attention bench: rc=$?"
cat "$out/attention_bench.txt"

timeout "${T_TESTS:-200}" "$build"/tests/test_ops_attention >"$out/test_ops_attention.log" 2>&1
rc_tests=$?
note "test_ops_attention: rc=$rc_tests; $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/test_ops_attention.log" | grep -v '\]  *[A-Z][a-zA-Z]*\.' | tr '\n' ' ')"
grep -E '^\[  (FAILED|SKIPPED) +\] [A-Za-z]' "$out/test_ops_attention.log" | head -20
grep -E '^\[ +OK +\] CudnnAttention' "$out/test_ops_attention.log"
grep -E "^\[cudnn attention\]" "$out/test_ops_attention.log" >"$out/cudnn_errors.txt"
note "cuDNN errors (max over cases, relative to the tensor's max): $(awk '{k = $3 "-" $7; v = $11 + 0; if (v > m[k]) m[k] = v} END {for (k in m) printf "%s %.2e, ", k, m[k]}' "$out/cudnn_errors.txt")"

echo "==== SUMMARY ===="
printf '%s\n' "${summary[@]}"
[ "$rc_tests" -eq 0 ]
