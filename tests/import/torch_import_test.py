#!/usr/bin/python3
"""ctest: float weights trained in PyTorch, imported with `qat train --init`.

1. train_torch_digits.py trains the float MLP and CNN in torch and writes their state_dicts
   (safetensors; the CNN also as .npz) with torch's test-split logits.
2. qatgraph evaluates each imported model (`--epochs 0`, float QConfig, CPU) and must agree
   with torch: the same test accuracy, the same argmax on every row, and
       relative logit difference  max|ours - torch| / max|torch|  <= 1e-5
   over all test rows and classes. Normalising by the largest logit rather than per element
   keeps near-zero logits (where a per-element ratio is meaningless) from dominating. Why
   1e-5 holds: both sides compute in f32 (unit roundoff u = 2^-24 = 6e-8) but sum in another
   order (Eigen vs torch's oneDNN/MKL kernels); each logit is a chain of 2 (MLP) to 4 (CNN)
   dot products of length <= 288 (conv3: 32 channels x 3 x 3), whose rounding error grows
   like sqrt(n) u = 1e-6 relative to the sum of |terms|, itself within a small factor of the
   logit scale here. We measure 2e-7 (MLP) and 4e-7 (CNN). A real difference in semantics
   is far above it: in torch, the same CNN with batch-norm eps 1e-3 instead of 1e-5 moves
   its logits by 2e-2 of their scale, and batch statistics instead of running ones by 0.12.
   The CNN's .npz copy must give bit-identical logits to its safetensors copy.
3. PTQ and QAT from the imported weights: `qat train --compare --init` (MLP, one seed), and
   single runs (`--epochs 0` = PTQ, default epochs = QAT fine-tuning) for both models. The
   single MLP runs must equal the --compare rows of the same recipe (same seed, same
   schedule); W8A8 and W4A8 after QAT must stay within 2 and 3 points of the float model,
   and QAT W2A8 must beat PTQ W2A8 (where post-training quantization visibly fails).

    /usr/bin/python3 tests/import/torch_import_test.py --qat build/apps/qat [--work DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from train_torch_digits import read_safetensors  # noqa: E402

LOGIT_TOLERANCE = 1e-5
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def qat_train(args, name, *flags):
    out = os.path.join(args.work, name)
    text = run([args.qat, "train", "--device", "cpu", "--out", out, *flags])
    with open(os.path.join(out, "metrics.json")) as f:
        return json.load(f), text


def same_accuracy(a, b, rows):
    """metrics.json holds accuracies to 9 digits: compare them as counts of correct rows."""
    return round(a * rows) == round(b * rows)


def pct(a):
    return f"{100 * a:.2f}%"


def float_model_against_torch(args, model):
    """Part 2 for one model: returns (torch accuracy, our logits, test rows)."""
    w = args.path
    with open(w(f"{model}_torch.json")) as f:
        torch_acc = json.load(f)["test_accuracy"]
    theirs = np.load(w(f"{model}_torch_logits.npy")).astype(np.float64)
    metrics, _ = qat_train(args, f"{model}_float", "--model", model,
                           "--init", w(f"{model}.safetensors"), "--epochs", "0",
                           "--save-logits", w(f"{model}_qg.safetensors"))
    saved = read_safetensors(w(f"{model}_qg.safetensors"))
    ours, labels = saved["logits"].astype(np.float64), saved["labels"]
    check(ours.shape == theirs.shape,
          f"{model}: logits shape {ours.shape} vs torch {theirs.shape}")
    # The split: torch's logits scored against qatgraph's test labels.
    check(np.mean(theirs.argmax(1) == labels) == torch_acc,
          f"{model}: torch's logits on qatgraph's test labels give torch's accuracy (same split)")
    rel = np.abs(ours - theirs).max() / np.abs(theirs).max()
    check(rel <= LOGIT_TOLERANCE,
          f"{model}: max|ours - torch| / max|torch| = {rel:.3g} <= {LOGIT_TOLERANCE:g}")
    check((ours.argmax(1) == theirs.argmax(1)).all(),
          f"{model}: same argmax on all {len(labels)} rows")
    check(same_accuracy(metrics["test_accuracy"], torch_acc, len(labels)),
          f"{model}: test accuracy {pct(metrics['test_accuracy'])} (qatgraph) vs "
          f"{pct(torch_acc)} (torch)")
    return torch_acc, ours, len(labels)


def mlp_ptq_and_qat(args, float_acc, n):
    """Part 3, MLP: --compare from the imported weights, and single runs against its rows."""
    init = ("--model", "mlp", "--init", args.path("mlp.safetensors"))
    metrics, text = qat_train(args, "mlp_compare", *init, "--compare", "--seeds", "1")
    print(text[text.index("\nmodel ") + 1:] if "\nmodel " in text else text, end="")
    rows = {r["model"]: r["test_accuracy_mean"] for r in metrics["compare"]}
    fl = rows["float32"]
    check(same_accuracy(fl, float_acc, n),
          f"mlp --compare: float32 row {pct(fl)} is the imported model")
    for recipe, points in (("W8A8", 2), ("W4A8", 3)):
        acc = rows[f"QAT {recipe}"]
        check(acc >= fl - points / 100,
              f"mlp --compare: QAT {recipe} {pct(acc)} within {points} points of float")
    check(rows["QAT W2A8"] > rows["PTQ W2A8"],
          f"mlp --compare: QAT W2A8 {pct(rows['QAT W2A8'])} beats PTQ W2A8 "
          f"{pct(rows['PTQ W2A8'])}")
    for kind, epochs in (("PTQ", ("--epochs", "0")), ("QAT", ())):
        single, _ = qat_train(args, f"mlp_{kind}_w4a8", *init, *W4A8, *epochs)
        check(same_accuracy(single["test_accuracy"], rows[f"{kind} W4A8"], n),
              f"mlp single-run {kind} W4A8 {pct(single['test_accuracy'])} equals the --compare "
              f"row {pct(rows[f'{kind} W4A8'])}")


def cnn_ptq_and_qat(args, float_acc):
    """Part 3, CNN: single runs only (its whole --compare takes several seconds)."""
    init = ("--model", "cnn", "--init", args.path("cnn.safetensors"))
    for recipe, bits, points in (("W8A8", W8A8, 2), ("W4A8", W4A8, 3)):
        ptq, _ = qat_train(args, f"cnn_ptq_{recipe}", *init, "--epochs", "0", *bits)
        qat, _ = qat_train(args, f"cnn_qat_{recipe}", *init, "--epochs", "2", *bits)
        print(f"      cnn {recipe}: float {pct(float_acc)}, PTQ {pct(ptq['test_accuracy'])} "
              f"(integer {pct(ptq['integer_test_accuracy'])}), QAT 2 epochs "
              f"{pct(qat['test_accuracy'])} (integer {pct(qat['integer_test_accuracy'])})")
        check(qat["test_accuracy"] >= float_acc - points / 100,
              f"cnn QAT {recipe} {pct(qat['test_accuracy'])} within {points} points of float")


W8A8 = ("--weight-bits", "8", "--act-bits", "8")
W4A8 = ("--weight-bits", "4", "--act-bits", "8")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qat", required=True)
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    args = ap.parse_args()
    args.work = args.work or tempfile.mkdtemp(prefix="qg_torch_import_")
    os.makedirs(args.work, exist_ok=True)
    args.path = lambda name: os.path.join(args.work, name)
    print(run([sys.executable, os.path.join(HERE, "train_torch_digits.py"), "--out", args.work]),
          end="")

    mlp_acc, _, n = float_model_against_torch(args, "mlp")
    cnn_acc, cnn_logits, _ = float_model_against_torch(args, "cnn")
    run([args.qat, "train", "--device", "cpu", "--out", args.path("cnn_npz"), "--model", "cnn",
         "--init", args.path("cnn.npz"), "--epochs", "0",
         "--save-logits", args.path("cnn_npz.safetensors")])
    npz_logits = read_safetensors(args.path("cnn_npz.safetensors"))["logits"]
    check(np.array_equal(npz_logits.astype(np.float64), cnn_logits),
          "cnn: the .npz import gives the safetensors import's logits bit for bit")
    mlp_ptq_and_qat(args, mlp_acc, n)
    cnn_ptq_and_qat(args, cnn_acc)
    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("all checks passed")


if __name__ == "__main__":
    main()
