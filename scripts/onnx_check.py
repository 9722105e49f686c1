#!/usr/bin/env python3
"""Checks an ONNX model written by `qat export` against qatgraph's own integer-weight graph.

    .venv/bin/python scripts/onnx_check.py MODEL.onnx REFDIR [MODEL2.onnx REFDIR2 ...]

REFDIR holds what `qat export --reference REFDIR` wrote: inputs.npy (the digits test split),
labels.npy, and logits.npy (qatgraph's converted integer-weight graph on those inputs).
For each model:
  1. onnx.checker.check_model(full_check=True) must pass;
  2. onnxruntime with graph optimizations off (ORT_DISABLE_ALL: every QuantizeLinear,
     DequantizeLinear and float op runs as written) on the whole test split in one batch must
     give the same argmax as qatgraph on every row, and logits within the tolerance below;
  3. onnxruntime with all optimizations (ORT_ENABLE_ALL: QDQ groups fused into integer
     kernels where it can) is reported for information (argmax agreement, max difference).

Tolerance. The logits differ where the runtimes' float arithmetic differs: summation order
in GEMM, conv, layer norm, softmax and means, and libm's erf (relative differences around
1e-6 of the values), and QuantizeLinear's x / scale against qatgraph's x * (1 / scale).
Those are far below an activation quantization step, but a value that sits within such a
difference of a rounding boundary lands on the neighbouring code, and one code changes the
next layer's output by one step times the weights that read it. So a row either agrees to
float precision (|d| <= 1e-4 * (1 + |logit|)) or carries such code flips. The check asks for
  * identical argmax on every row;
  * at least 90% of the rows within float precision;
  * every logit within --flip-tolerance (default 0.1 * the logits' range over the test set,
    i.e. a code flip may move a logit by a tenth of the spread between classes, not more).
Exit status 1 when a model fails, with a line saying which rule and by how much.
"""
import argparse
import json
import sys

import numpy as np
import onnx
import onnxruntime as ort


def run(model_path, x, level):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return sess.run(None, {name: x})[0]


def compare(ours, ref, labels):
    diff = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    float_ok = (diff <= 1e-4 * (1.0 + np.abs(ref))).all(axis=1)
    return {
        "rows": int(ref.shape[0]),
        "argmax_equal": int((ours.argmax(1) == ref.argmax(1)).sum()),
        "rows_float_precision": int(float_ok.sum()),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "accuracy": float((ours.argmax(1) == labels).mean()),
    }


def check(model_path, ref_dir, flip_fraction):
    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    x = np.load(f"{ref_dir}/inputs.npy").astype(np.float32)
    labels = np.load(f"{ref_dir}/labels.npy")
    ref = np.load(f"{ref_dir}/logits.npy")
    plain = compare(run(model_path, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), ref, labels)
    fused = compare(run(model_path, x, ort.GraphOptimizationLevel.ORT_ENABLE_ALL), ref, labels)
    # The batch axis is dynamic: one row must run too.
    run(model_path, x[:1], ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    logit_range = float(ref.max() - ref.min())
    flip_tol = flip_fraction * logit_range
    failures = []
    if plain["argmax_equal"] != plain["rows"]:
        failures.append(f"argmax differs on {plain['rows'] - plain['argmax_equal']} rows")
    if plain["rows_float_precision"] < 0.9 * plain["rows"]:
        failures.append(f"only {plain['rows_float_precision']}/{plain['rows']} rows agree to "
                        "float precision (90% required)")
    if plain["max_abs_diff"] > flip_tol:
        failures.append(f"max |logit difference| {plain['max_abs_diff']:.4g} > {flip_tol:.4g}")
    return {
        "model": model_path,
        "opset": model.opset_import[0].version,
        "qconfig": {p.key: p.value for p in model.metadata_props}.get("qatgraph.qconfig", ""),
        "reference_accuracy": float((ref.argmax(1) == labels).mean()),
        "logit_range": logit_range,
        "tolerance": flip_tol,
        "ort_plain": plain,
        "ort_optimized": fused,
        "failures": failures,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pairs", nargs="+", help="MODEL.onnx REFDIR, repeated")
    p.add_argument("--flip-tolerance", type=float, default=0.1,
                   help="largest |logit difference| as a fraction of the logits' range")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    if len(a.pairs) % 2:
        p.error("give MODEL.onnx REFDIR pairs")
    results, failed = [], False
    for model_path, ref_dir in zip(a.pairs[0::2], a.pairs[1::2]):
        r = check(model_path, ref_dir, a.flip_tolerance)
        results.append(r)
        pl, op = r["ort_plain"], r["ort_optimized"]
        print(f"{model_path}: {r['qconfig']}\n"
              f"  onnxruntime (no graph optimization): argmax {pl['argmax_equal']}/{pl['rows']}, "
              f"{pl['rows_float_precision']} rows to float precision, max |d| "
              f"{pl['max_abs_diff']:.3g} (tolerance {r['tolerance']:.3g}), mean |d| "
              f"{pl['mean_abs_diff']:.3g}, accuracy {100 * pl['accuracy']:.2f}% "
              f"(qatgraph {100 * r['reference_accuracy']:.2f}%)\n"
              f"  onnxruntime (all optimizations):    argmax {op['argmax_equal']}/{op['rows']}, "
              f"max |d| {op['max_abs_diff']:.3g}, accuracy {100 * op['accuracy']:.2f}%")
        for f in r["failures"]:
            print(f"  FAIL: {f}")
            failed = True
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    print("onnx_check: " + ("FAILED" if failed else f"all {len(results)} models agree"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
