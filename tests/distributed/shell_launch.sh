#!/usr/bin/env bash
# A 2-rank CPU run of `qat train` started by a plain shell loop that sets torchrun's variables
# (no launcher of ours), then resumed from its checkpoint by one process with the same global
# batch (another rank count), then the same run through `qat train --nproc 2`.
#   shell_launch.sh <qat> <scratch dir>
set -euo pipefail
qat=$1
out=$2
rm -rf "$out"
mkdir -p "$out"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
args=(train --model mlp --width 16 --device cpu --act-bits 8 --weight-bits 8)
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port QG_NUM_THREADS=1 \
    "$qat" "${args[@]}" --epochs 1 --batch 16 --out "$out/loop" > "$out/loop$r.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
if [ "$status" -ne 0 ]; then
  cat "$out"/loop*.log
  echo "shell_launch: a rank of the shell-loop run failed"
  exit 1
fi
grep -q "test accuracy" "$out/loop0.log"
test -f "$out/loop/checkpoint.qgck"
QG_NUM_THREADS=1 "$qat" "${args[@]}" --epochs 2 --batch 32 --out "$out/one" \
  --resume "$out/loop/checkpoint.qgck" > "$out/one.log" 2>&1 || { cat "$out/one.log"; exit 1; }
grep -q "resumed from .* at epoch 1" "$out/one.log"
QG_NUM_THREADS=1 "$qat" "${args[@]}" --epochs 1 --nproc 2 --batch 16 --out "$out/nproc" > "$out/nproc.log" 2>&1 \
  || { cat "$out/nproc.log"; exit 1; }
grep -q "starting 2 ranks" "$out/nproc.log"
echo "shell_launch: ok"
