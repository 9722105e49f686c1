#!/usr/bin/env bash
# ctest onnx_export_roundtrip: for each model kind and QConfig below, `qat train` a small
# model for three epochs, `qat export` it with the reference logits, and check the ONNX model
# with onnxruntime (scripts/onnx_check.py: checker, identical argmax on every test row,
# logits within the documented tolerance).
#   onnx_roundtrip.sh QAT PYTHON WORKDIR
# Exits 77 (ctest: skipped) when PYTHON lacks onnxruntime (scripts/python_env.sh makes it).
set -euo pipefail
qat=$1 python=$2 work=$3
here=$(cd "$(dirname "$0")" && pwd)
check="$here/../../scripts/onnx_check.py"
if ! "$python" -c "import onnxruntime, onnx, numpy" 2>/dev/null; then
  echo "skipped: $python cannot import onnxruntime, onnx, numpy (run scripts/python_env.sh)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
common=(--epochs 3 --batch 16 --device cpu)
mlp=(--model mlp --width 32 --depth 2)
cnn=(--model cnn --channels 4 8 8)
tfm=(--model transformer --d-model 16 --heads 2 --blocks 1)
# name | options (group sizes that leave a shorter tail group in some layers on purpose)
cases=(
  "mlp_w8a8|${mlp[*]} --weight-bits 8 --act-bits 8"
  "mlp_w8a8_tensor|${mlp[*]} --weight-bits 8 --act-bits 8 --scope tensor"
  "mlp_w4a8_group24|${mlp[*]} --weight-bits 4 --act-bits 8 --scope group --group-size 24"
  "mlp_w4a4|${mlp[*]} --weight-bits 4 --act-bits 4"
  "mlp_w2a8|${mlp[*]} --weight-bits 2 --act-bits 8"
  "mlp_nf4a8|${mlp[*]} --weight-bits nf4 --act-bits 8"
  "mlp_8da4w|${mlp[*]} --weight-bits 4 --act-bits dyn8 --scope group --group-size 16"
  "mlp_float|${mlp[*]}"
  "cnn_w8a8|${cnn[*]} --weight-bits 8 --act-bits 8"
  "cnn_w4a8_group16|${cnn[*]} --weight-bits 4 --act-bits 8 --scope group --group-size 16"
  "cnn_8da4w|${cnn[*]} --weight-bits 4 --act-bits dyn8 --scope group --group-size 16"
  "cnn_float|${cnn[*]}"
  "transformer_w8a8|${tfm[*]} --weight-bits 8 --act-bits 8"
  "transformer_w4a8_group8|${tfm[*]} --weight-bits 4 --act-bits 8 --scope group --group-size 8"
  "transformer_8da4w|${tfm[*]} --weight-bits 4 --act-bits dyn8 --scope group --group-size 8"
)
pairs=()
for c in "${cases[@]}"; do
  name=${c%%|*} opts=${c#*|}
  # shellcheck disable=SC2086
  "$qat" train $opts "${common[@]}" --out "$work/$name" > "$work/$name.train.log"
  "$qat" export "$work/$name/checkpoint.qgck" --onnx "$work/$name.onnx" \
    --reference "$work/$name/ref" > "$work/$name.export.log"
  pairs+=("$work/$name.onnx" "$work/$name/ref")
done
"$python" "$check" "${pairs[@]}" --json "$work/onnx_check.json"
