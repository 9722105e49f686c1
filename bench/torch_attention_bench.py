"""Causal attention on CUDA: qatgraph's fused causal_attention (forward, and backward from the
saved lse) against PyTorch's scaled_dot_product_attention(is_causal=True) on the same GPU and
the same bf16 tensors, in one run. Our kernels are called on torch's tensors and stream
through qatgraph.torch's kernel layer (_kernels.run), as qatgraph.torch's ops call them.

    PYTHONPATH=<build>/python python3 bench/torch_attention_bench.py [--reps 50] [--json out.json]

Shapes: Llama's anchor, batch 8, 16 query heads over 8 KV heads, T = 1024, head dim 64; and
head dim 128 with 8 query heads (4 KV heads). GQA for torch: enable_gqa=True where its SDPA
has it (PyTorch >= 2.5), else k and v repeated to the query heads first (repeat_kv) and that
copy timed with it. Each case is timed with CUDA events (bench/cuda_timing.py); TFLOP/s
counts the causal half of the scores: forward 2 GEMMs, backward 5 (4 T^2 hd and 10 T^2 hd per
head, halved). Before timing, our o, dq, dk, dv are compared with torch's (max error as a
fraction of max |torch|; both are bf16 results of f32 sums, so about 1e-2 is expected).

Our op runs two ways in one process, chosen per call by QG_ATTENTION_BACKEND
(ops/attention/attention_backend.h): `kernel`, the project's own kernels, and `cudnn`, cuDNN's
fused SDPA through the cuDNN frontend (deterministic backward; `cudnn-nd` is the backward with
QG_ATTENTION_DETERMINISTIC=0). A build without the cuDNN frontend prints n/a for those.
`torch-cudnn` is torch's own SDPA restricted to its cuDNN backend, where torch offers it.
"""
import argparse
import contextlib
import json
import os

import torch
import torch.nn.functional as F

from qatgraph.torch import _kernels
from cuda_timing import per_call_us

SHAPES = [  # (batch, heads, kv_heads, seq, head_dim)
    (8, 16, 8, 1024, 64),
    (8, 8, 4, 1024, 128),
]


def has_enable_gqa():
    """Whether this torch's SDPA takes enable_gqa (PyTorch >= 2.5). Tried on a tiny call: SDPA
    is a builtin, whose signature inspect cannot read."""
    q = torch.zeros(1, 2, 2, 8)
    k = torch.zeros(1, 1, 2, 8)
    try:
        F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        return True
    except TypeError:
        return False


def torch_attention(q, k, v, gqa):
    if gqa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# Our backends: (label, QG_ATTENTION_BACKEND, QG_ATTENTION_DETERMINISTIC).
OURS = [("kernel", "kernel", "1"), ("cudnn", "cudnn", "1"), ("cudnn-nd", "cudnn", "0")]


@contextlib.contextmanager
def backend(name, deterministic):
    """Our op's backend for the calls inside (read by the kernels at every call)."""
    saved = {k: os.environ.get(k) for k in ("QG_ATTENTION_BACKEND", "QG_ATTENTION_DETERMINISTIC")}
    os.environ["QG_ATTENTION_BACKEND"] = name
    os.environ["QG_ATTENTION_DETERMINISTIC"] = deterministic
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ours_forward(q, k, v):
    return _kernels.run("causal_attention", {}, [q, k, v])


def ours_backward(q, k, v, o, lse, do):
    return _kernels.run("causal_attention_backward", {}, [q, k, v, o, lse, do])


def torch_cudnn_context():
    """A context that restricts torch's SDPA to its cuDNN backend, or None where torch lacks it."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)
    except (ImportError, AttributeError):
        return None


def rel_err(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args()
    gqa = has_enable_gqa()
    torch_cudnn = torch_cudnn_context()
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}, "
          f"torch GQA by {'enable_gqa' if gqa else 'repeat_kv'}; ms per call, bf16\n")
    labels = [label for label, _, _ in OURS] + ["torch", "torch-cudnn"]
    print(f"{'shape [N,H,KV,T,hd]':22s} {'what':8s} " + " ".join(f"{x:>11s}" for x in labels) +
          "   (ms; TF/s below)")
    rows = []
    torch.manual_seed(0)
    for n, h, kv, t, hd in SHAPES:
        dt = torch.bfloat16
        q = torch.randn(n, h, t, hd, device="cuda", dtype=dt)
        k = torch.randn(n, kv, t, hd, device="cuda", dtype=dt)
        v = torch.randn(n, kv, t, hd, device="cuda", dtype=dt)
        do = torch.randn(n, h, t, hd, device="cuda", dtype=dt)
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        shape = f"[{n},{h},{kv},{t},{hd}]"

        o_ref = torch_attention(qr, kr, vr, gqa)
        dq_ref, dk_ref, dv_ref = torch.autograd.grad(o_ref, (qr, kr, vr), do)
        available = {}
        for label, name, det in OURS:
            try:
                with backend(name, det):
                    o, lse = ours_forward(q, k, v)
                    dq, dk, dv = ours_backward(q, k, v, o, lse, do)
                    torch.cuda.synchronize()
            except Exception as e:  # a build without cuDNN, or cuDNN refusing the shape
                print(f"{shape:22s} {label}: n/a ({str(e).splitlines()[0][:160]})")
                continue
            available[label] = (name, det)
            errs = {"o": rel_err(o, o_ref), "dq": rel_err(dq, dq_ref), "dk": rel_err(dk, dk_ref),
                    "dv": rel_err(dv, dv_ref)}
            print(f"{shape:22s} {label:8s} max error vs torch: " +
                  ", ".join(f"{key} {val:.2e}" for key, val in errs.items()))

        def torch_fwd():
            with torch.no_grad():
                torch_attention(q, k, v, gqa)

        def torch_fwd_bwd():
            out = torch_attention(qr, kr, vr, gqa)
            torch.autograd.grad(out, (qr, kr, vr), do)

        def in_torch_cudnn(fn):
            def run():
                with torch_cudnn():
                    fn()
            return run

        def ours_fwd():
            ours_forward(q, k, v)

        def ours_fwd_bwd():
            o2, lse2 = ours_forward(q, k, v)
            ours_backward(q, k, v, o2, lse2, do)

        fwd_flops = 4.0 * n * h * t * t * hd / 2
        for what, ours, theirs, flops in [("forward", ours_fwd, torch_fwd, fwd_flops),
                                          ("fwd+bwd", ours_fwd_bwd, torch_fwd_bwd,
                                           3.5 * fwd_flops)]:
            ms = {}
            for label, (name, det) in available.items():
                with backend(name, det):
                    ms[label] = per_call_us(ours, args.reps) / 1000
            ms["torch"] = per_call_us(theirs, args.reps) / 1000
            if torch_cudnn is not None:
                try:
                    ms["torch-cudnn"] = per_call_us(in_torch_cudnn(theirs), args.reps) / 1000
                except RuntimeError as e:  # torch has no cuDNN attention for this case
                    print(f"{shape:22s} torch-cudnn: n/a ({str(e).splitlines()[0][:160]})")
            cell = lambda x, f: f"{f(ms[x]):11.3f}" if x in ms else f"{'n/a':>11s}"
            print(f"{shape:22s} {what:8s} " + " ".join(cell(x, lambda m: m) for x in labels))
            print(f"{'':22s} {'TF/s':8s} " +
                  " ".join(cell(x, lambda m: flops / m / 1e9) for x in labels))
            rows.append({"shape": shape, "case": what, "ms": ms,
                         "tflops": {x: flops / m / 1e9 for x, m in ms.items()}})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
