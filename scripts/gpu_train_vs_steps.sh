#!/usr/bin/env bash
# On a GPU machine: `qat train --time-steps` against `qat steps --wall` for each digits model
# and variant, each timed in its own process, ROUNDS times, alternating which runs first, so
# that the spread between processes is measured rather than mistaken for a difference between
# the two paths. Prints one line per process and then the medians and their ratio. Expects a
# build with qat in $BUILD_DIR (default build-gpu); logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-gpu}
rounds=${ROUNDS:-5}
reps=${REPS:-500}
out=${OUT:-out}
mkdir -p "$out"
# The digits data: the GPU image's sklearn ships the same CSV.
if [ -z "${QG_DIGITS_CSV:-}" ] && [ ! -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
  QG_DIGITS_CSV=$(python3 -c "import os, sklearn; print(os.path.join(os.path.dirname(sklearn.__file__), 'datasets', 'data', 'digits.csv.gz'))" 2>/dev/null) && export QG_DIGITS_CSV
fi
median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
steps_us() {  # model variant
  "$build"/apps/qat steps --device cuda --model "digits-$1" --variant "$2" --no-trainer --wall \
    --reps "$reps" | awk -v v="$2" '$3 == (v == "qat" ? "qat" : "float") {print $6 * 1000}'
}
train_us() {  # model variant
  local bits=32
  [ "$2" = qat ] && bits=8
  "$build"/apps/qat train --device cuda --model "$1" --weight-bits "$bits" --act-bits "$bits" \
    --time-steps "$reps" --out "$out/ts" 2>&1 | grep -oE '[0-9.]+ us' | head -1 | awk '{print $1}'
}
printf "%-24s %-38s %-38s %s\n" "digits model" "qat steps --wall (us, per process)" \
  "qat train --time-steps (us, per process)" "train/steps (medians)"
for model in mlp cnn transformer; do
  for variant in float qat; do
    s=() t=()
    for ((r = 0; r < rounds; ++r)); do
      if ((r % 2 == 0)); then
        s+=("$(steps_us "$model" "$variant")") t+=("$(train_us "$model" "$variant")")
      else
        t+=("$(train_us "$model" "$variant")") s+=("$(steps_us "$model" "$variant")")
      fi
    done
    ms=$(printf "%s\n" "${s[@]}" | median) mt=$(printf "%s\n" "${t[@]}" | median)
    printf "%-24s %-38s %-38s %s\n" "$model $variant" "${s[*]}" "${t[*]}" \
      "$(awk -v a="$mt" -v b="$ms" 'BEGIN {printf "%.1f / %.1f = %.3f", a, b, a / b}')"
  done
done
