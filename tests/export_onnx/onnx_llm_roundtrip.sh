#!/usr/bin/env bash
# ctest onnx_llm_roundtrip: for each language-model recipe below, `qat train --model llama` the
# tiny decoder (tests/export_onnx/fixtures/llama_tiny_config.json: the CI model of
# tests/train/fixtures with max_position_embeddings 128 for 8 + 64 positions and an
# intermediate width that groups of 32 divide) on the Python tutorial for a few QAT steps,
# `qat export` it with the reference greedy decode (16 prompts from the validation tokens, 64
# new tokens each), and check the ONNX model with onnxruntime (scripts/onnx_llm_check.py: the
# PyPI checker, every greedy token equal, first-step logits within the documented tolerance).
#   onnx_llm_roundtrip.sh QAT PYTHON WORKDIR
# Exits 77 (ctest: skipped) when PYTHON lacks onnxruntime (scripts/python_env.sh makes it) or
# the tutorial corpus (Debian's python3.11-doc) is missing.
set -euo pipefail
qat=$1 python=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
check="$here/../../scripts/onnx_llm_check.py"
config="$here/fixtures/llama_tiny_config.json"
corpus=/usr/share/doc/python3.11/html/_sources/tutorial
if ! "$python" -c "import onnxruntime, onnx, numpy" 2>/dev/null; then
  echo "skipped: $python cannot import onnxruntime, onnx, numpy (run scripts/python_env.sh)"
  exit 77
fi
if [ ! -d "$corpus" ]; then
  echo "skipped: $corpus is missing (python3.11-doc)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
common=(--model llama --config "$config" --data "$work/data" --corpus "$corpus" --device cpu
        --steps 120 --eval-every 120 --batch 8 --seq 64 --lr 3e-3 --warmup 10 --eval-windows 8
        --group-size 32)
pairs=()
for recipe in 8da4w 8da2w w8a8_dynamic int4_weight_only float; do
  "$qat" train "${common[@]}" --recipe "$recipe" --out "$work/$recipe" > "$work/$recipe.train.log"
  "$qat" export "$work/$recipe/checkpoint.qgck" --onnx "$work/$recipe.onnx" --data "$work/data" \
    --reference "$work/$recipe/ref" > "$work/$recipe.export.log"
  grep -h "^size:" "$work/$recipe.export.log" | sed "s/^/$recipe /"
  pairs+=("$work/$recipe.onnx" "$work/$recipe/ref")
done
# bf16 mixed precision (f32 master weights, bf16 GEMMs and activations): the export rounds
# where qatgraph rounds (a Cast to BFLOAT16 and back), so the same checks apply.
for recipe in 8da4w int4_weight_only float; do
  name=${recipe}_bf16
  "$qat" train "${common[@]}" --recipe "$recipe" --precision bf16-mixed --out "$work/$name" \
    > "$work/$name.train.log"
  "$qat" export "$work/$name/checkpoint.qgck" --onnx "$work/$name.onnx" --data "$work/data" \
    --reference "$work/$name/ref" > "$work/$name.export.log"
  grep -h "^size:" "$work/$name.export.log" | sed "s/^/$name /"
  pairs+=("$work/$name.onnx" "$work/$name/ref")
done
# 8da4w with the token embedding quantized too (--embedding-quant int4: INT4 codes per group of
# 32 along the hidden dim, DequantizeLinear with block_size feeding the Gather).
name=8da4w_embedding_int4
"$qat" train "${common[@]}" --recipe 8da4w --embedding-quant int4 --embedding-group-size 32 \
  --out "$work/$name" > "$work/$name.train.log"
"$qat" export "$work/$name/checkpoint.qgck" --onnx "$work/$name.onnx" --data "$work/data" \
  --reference "$work/$name/ref" > "$work/$name.export.log"
grep -h "^size:" "$work/$name.export.log" | sed "s/^/$name /"
pairs+=("$work/$name.onnx" "$work/$name/ref")
# 8da4w trained with the integer forward (--integer-forward): the same weights and qparams
# export as the fake-quant forward's model, and the reference decode is that model's.
name=8da4w_integer_forward
"$qat" train "${common[@]}" --recipe 8da4w --integer-forward --out "$work/$name" \
  > "$work/$name.train.log"
"$qat" export "$work/$name/checkpoint.qgck" --onnx "$work/$name.onnx" --data "$work/data" \
  --reference "$work/$name/ref" > "$work/$name.export.log"
grep -q "trained with the integer forward" "$work/$name.export.log"
grep -h "^size:" "$work/$name.export.log" | sed "s/^/$name /"
pairs+=("$work/$name.onnx" "$work/$name/ref")
"$python" "$check" "${pairs[@]}" --json "$work/onnx_llm_check.json"
