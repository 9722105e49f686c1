#!/usr/bin/env python3
"""Checks a Llama ONNX model written by `qat export` against qatgraph's converted model.

    .venv/bin/python scripts/onnx_llm_check.py MODEL.onnx REFDIR [MODEL2.onnx REFDIR2 ...]

REFDIR holds what `qat export LLAMA_CHECKPOINT --reference REFDIR` wrote: prompts.npy (i64
[B, L]), tokens.npy (i64 [B, N]: qatgraph's greedy decode of its converted integer-weight
model) and logits.npy (f32 [B, L, vocab]: that model's logits at the prompt positions on the
first step). For each model:
  1. onnx.checker.check_model(full_check=True) must pass (the model is opset 21, past what
     the exporter's own ONNX 1.12 checker knows);
  2. onnxruntime with graph optimizations off (ORT_DISABLE_ALL: every DequantizeLinear and
     float op as written) runs the same greedy loop as qatgraph: the input_ids window of the
     model's fixed length holds the prompt and then token 0; each step runs the whole window
     and appends the argmax (first index of the largest logit) at the last real position.
     The model is causal, so the padding does not reach the positions read. Every one of the
     B x N tokens must equal qatgraph's, except after a near-tie (below);
  3. the first step's logits at the prompt positions must agree within the tolerance below;
  4. with all optimizations on (ORT_ENABLE_ALL), the decode is reported for information.

Tolerance of the logits. The runtimes sum GEMMs, attention and softmax rows in other orders
and their exp differs in the last bits, so values differ by float rounding (relative 1e-6).
A per-token int8 activation code sits far from that unless a value lies within such a
difference of a rounding boundary; then it lands on the neighbouring code and the logits of
that position move by one activation step times the weights reading it. The check asks for
  * at least 90% of the positions with every logit within float precision
    (|d| <= 1e-4 * (1 + |logit|));
  * every logit within --flip-tolerance (default 0.05 * the logits' range).

Near-ties. The same flips can move the first and second logit of a step past each other when
qatgraph's margin between them (margins.npy, f32 [B, N]) is within that size. A prompt whose
decode departs from qatgraph's at such a step is counted apart (its later tokens continue
another text, so they are not compared); a departure where qatgraph's margin exceeds
--tie-tolerance (default: twice the largest first-step |logit difference|, the size of a flip
measured on this model) fails. Without margins.npy every token must match.
Exit status 1 when a model fails, with a line saying which rule and by how much.
"""
import argparse
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort


def session(model_path, level):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = level
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])


def greedy(sess, prompts, steps):
    """The greedy decode of qatgraph's reference, with onnxruntime; also the first step's
    logits at the prompt positions."""
    inp = sess.get_inputs()[0]
    seq = inp.shape[1]
    b, l = prompts.shape
    assert l + steps == seq, f"the model's window {seq} is not prompt {l} + {steps} steps"
    window = np.zeros((b, seq), dtype=np.int64)
    window[:, :l] = prompts
    tokens = np.zeros((b, steps), dtype=np.int64)
    first = None
    for step in range(steps):
        logits = sess.run(None, {inp.name: window})[0]
        if step == 0:
            first = logits[:, :l, :]
        at = l - 1 + step
        best = logits[:, at, :].argmax(axis=1)
        tokens[:, step] = best
        if at + 1 < seq:
            window[:, at + 1] = best
    return tokens, first


def token_report(ours, ref):
    same = ours == ref
    diverged = [int(np.argmin(row)) for row in same if not row.all()]
    return {
        "tokens": int(ref.size),
        "tokens_equal": int(same.sum()),
        "prompts_equal": int(same.all(axis=1).sum()),
        "first_divergence_steps": diverged,
    }


def check(model_path, ref_dir, flip_fraction, tie_factor):
    model = onnx.load(model_path)
    onnx.checker.check_model(model, full_check=True)
    prompts = np.load(f"{ref_dir}/prompts.npy")
    ref_tokens = np.load(f"{ref_dir}/tokens.npy")
    ref_logits = np.load(f"{ref_dir}/logits.npy")
    steps = ref_tokens.shape[1]
    plain_sess = session(model_path, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    tokens, first = greedy(plain_sess, prompts, steps)
    plain = token_report(tokens, ref_tokens)
    diff = np.abs(first.astype(np.float64) - ref_logits.astype(np.float64))
    float_ok = (diff <= 1e-4 * (1.0 + np.abs(ref_logits))).all(axis=2)
    logit_range = float(ref_logits.max() - ref_logits.min())
    flip_tol = flip_fraction * logit_range
    opt_tokens, _ = greedy(session(model_path, ort.GraphOptimizationLevel.ORT_ENABLE_ALL), prompts,
                           steps)
    optimized = token_report(opt_tokens, ref_tokens)
    # The batch axis is dynamic: one prompt runs too.
    one = np.zeros((1, plain_sess.get_inputs()[0].shape[1]), dtype=np.int64)
    plain_sess.run(None, {plain_sess.get_inputs()[0].name: one})
    failures = []
    margins_path = f"{ref_dir}/margins.npy"
    margins = np.load(margins_path) if os.path.exists(margins_path) else None
    tie_tol = tie_factor * float(diff.max())
    ties = []  # (prompt, step, qatgraph's margin) of each departure at a near-tie
    for i, row in enumerate(tokens == ref_tokens):
        if row.all():
            continue
        step = int(np.argmin(row))
        margin = float(margins[i, step]) if margins is not None else float("inf")
        if margin <= tie_tol:
            ties.append((i, step, margin))
        else:
            failures.append(f"prompt {i} departs at step {step} where qatgraph's margin "
                            f"{margin:.4g} exceeds the tie tolerance {tie_tol:.4g}")
    plain["near_ties"] = [{"prompt": i, "step": s, "margin": m} for i, s, m in ties]
    plain["tie_tolerance"] = tie_tol
    positions = float_ok.size
    if float_ok.sum() < 0.9 * positions:
        failures.append(f"only {int(float_ok.sum())}/{positions} positions agree to float "
                        "precision (90% required)")
    if diff.max() > flip_tol:
        failures.append(f"max |logit difference| {diff.max():.4g} > {flip_tol:.4g}")
    meta = {p.key: p.value for p in model.metadata_props}
    return {
        "model": model_path,
        "opset": model.opset_import[0].version,
        "recipe": meta.get("qatgraph.recipe", ""),
        "file_bytes": len(model.SerializeToString()),
        "prompts": list(prompts.shape),
        "steps": steps,
        "ort_plain": plain,
        "ort_optimized": optimized,
        "logits": {
            "positions": positions,
            "positions_float_precision": int(float_ok.sum()),
            "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()),
            "logit_range": logit_range,
            "tolerance": flip_tol,
        },
        "failures": failures,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("pairs", nargs="+", help="MODEL.onnx REFDIR, repeated")
    p.add_argument("--flip-tolerance", type=float, default=0.05,
                   help="largest |logit difference| as a fraction of the logits' range")
    p.add_argument("--tie-factor", type=float, default=2.0,
                   help="a departure is a near-tie when qatgraph's margin at it is at most this "
                        "times the largest first-step |logit difference|")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args()
    if len(a.pairs) % 2:
        p.error("give MODEL.onnx REFDIR pairs")
    results, failed = [], False
    for model_path, ref_dir in zip(a.pairs[0::2], a.pairs[1::2]):
        r = check(model_path, ref_dir, a.flip_tolerance, a.tie_factor)
        results.append(r)
        pl, op, lg = r["ort_plain"], r["ort_optimized"], r["logits"]
        print(f"{model_path}: {r['recipe']}, opset {r['opset']}, {r['file_bytes']} bytes\n"
              f"  onnxruntime (no graph optimization): greedy tokens {pl['tokens_equal']}/"
              f"{pl['tokens']} equal ({pl['prompts_equal']}/{r['prompts'][0]} prompts x "
              f"{r['steps']} steps); first-step logits: {lg['positions_float_precision']}/"
              f"{lg['positions']} positions to float precision, max |d| "
              f"{lg['max_abs_diff']:.3g} (tolerance {lg['tolerance']:.3g}), mean |d| "
              f"{lg['mean_abs_diff']:.3g}\n"
              f"  onnxruntime (all optimizations):    greedy tokens {op['tokens_equal']}/"
              f"{op['tokens']} equal ({op['prompts_equal']} prompts)")
        for t in pl["near_ties"]:
            print(f"  prompt {t['prompt']} departs at step {t['step']}, a near-tie: qatgraph's "
                  f"margin {t['margin']:.3g} <= {pl['tie_tolerance']:.3g}")
        for f in r["failures"]:
            print(f"  FAIL: {f}")
            failed = True
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)
    print("onnx_llm_check: " + ("FAILED" if failed else f"all {len(results)} models agree"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
