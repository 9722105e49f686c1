"""PyTorch side of the PERF.md comparison: the same cases as `qat bench`, timed the same way
(median of per-launch times; CUDA events on the GPU; inputs rotated when they would fit in
cache), each next to a clone() of the same input, in the same run.

    python3 bench/torch_bench.py --device cuda --json torch.json     (GPU machine, torch 2.x)
    /usr/bin/python3 bench/torch_bench.py --device cpu --json t.json (Debian torch 1.13, 1 thread)

Labels match ours: "<case> <dtype>[<shape>]".
"""
import argparse
import json
import re
import statistics
import time

import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def timer(device, fn, reps, warmup=5):
    for i in range(warmup):
        fn(i)
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for i, (a, b) in enumerate(ev):
            a.record()
            fn(i)
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) * 1000.0 for a, b in ev]
    else:
        for i in range(reps):
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def inputs(shape, dtype, device, n_bytes_cache):
    numel = 1
    for d in shape:
        numel *= d
    size = numel * torch.tensor([], dtype=dtype).element_size()
    copies = max(1, min(8, n_bytes_cache // max(size, 1)))
    g = torch.Generator().manual_seed(7)
    return [torch.randn(shape, generator=g).to(dtype).to(device) for _ in range(copies)]


def per_token_int8(x):
    s = x.abs().amax(dim=-1, keepdim=True).float() / 127.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    return torch.clamp(torch.round(x.float() / s), -127, 127).to(torch.int8), s


def dynamic_fq_token(x):
    """torchao's 8da4w activation fake quantization in torch ops: per-token asymmetric int8
    qparams from the row's range, then fake quantization with the in-range mask its STE keeps."""
    mn = x.amin(dim=-1, keepdim=True).clamp(max=0)
    mx = x.amax(dim=-1, keepdim=True).clamp(min=0)
    s = ((mx - mn) / 255.0).clamp(min=torch.finfo(torch.float32).eps)
    zp = (-128 - torch.round(mn / s)).clamp(-128, 127)
    q = torch.round(x / s) + zp
    mask = (q >= -128) & (q <= 127)
    return (q.clamp(-128, 127) - zp) * s, mask


def dynamic_fq_group32(x):
    """torchao's 8da4w weight fake quantization in torch ops: symmetric int4 in groups of 32."""
    g = x.reshape(-1, 32)
    s = (g.abs().amax(dim=-1, keepdim=True) / 7.5).clamp(min=torch.finfo(torch.float32).eps)
    q = torch.round(g / s)
    mask = (q >= -8) & (q <= 7)
    return (q.clamp(-8, 7) * s).reshape(x.shape), mask


def int4_pack(x):
    g = x.float().reshape(-1, 128)
    s = g.abs().amax(dim=-1, keepdim=True) / 7.0
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = (torch.clamp(torch.round(g / s), -8, 7) + 8).to(torch.uint8).reshape(-1, 2)
    return (q[:, 0] | (q[:, 1] << 4)), s


def cases(device, quick):
    shapes = [(1024, 4096)] if device == "cpu" else [(8192, 4096), (2048, 2048), (64, 768)]
    if quick:
        shapes = [(64, 768)]
    for shape in shapes:
        for dname in ("f32", "bf16") if device == "cpu" else ("f32", "bf16", "f16"):
            yield shape, dname


def run(device, reps, quick, compile_too, keep=None):
    cache = (64 << 20) if device == "cpu" else (128 << 20)
    results = {}
    for shape, dname in cases(device, quick):
        dtype = DTYPES[dname]
        xs = inputs(shape, dtype, device, cache)
        label = lambda name: f"{name} {dname}[{shape[0]}, {shape[1]}]"
        copy = timer(device, lambda i: xs[i % len(xs)].clone(), reps)
        f32 = [x.float() for x in xs] if dname == "f32" else None
        xin = xs if dname == "f32" else [x for x in xs]
        C = shape[0]
        dev = xs[0].device

        def add(name, eager_fn, compiled=None):
            if keep is not None and not keep.search(label(name)):
                return
            try:
                r = {"copy_us": copy, "eager_us": timer(device, eager_fn, reps)}
                if compiled is not None:
                    r["compile_us"] = timer(device, compiled, reps, warmup=10)
                results[label(name)] = r
            except Exception as e:  # an op PyTorch lacks for this dtype/device
                results[label(name)] = {"copy_us": copy, "error": str(e).splitlines()[0][:120]}

        # Observer + fake-quant (PyTorch's fused moving-average op), per tensor and per channel.
        for per_channel, axis, name in ((False, 0, "obs+fq per-tensor"), (True, 0, "obs+fq per-channel"),
                                        (True, 1, "obs+fq per-channel last axis")):
            n = shape[axis] if per_channel else 1
            state = dict(on=torch.ones(1, dtype=torch.long, device=dev),
                         rmin=torch.full((n,), float("inf"), device=dev),
                         rmax=torch.full((n,), float("-inf"), device=dev),
                         scale=torch.ones(n, device=dev), zp=torch.zeros(n, dtype=torch.int32, device=dev))
            add(name, lambda i, s=state, pc=per_channel, ax=axis: torch.fused_moving_avg_obs_fake_quant(
                xin[i % len(xin)], s["on"], s["on"], s["rmin"], s["rmax"], s["scale"], s["zp"],
                0.01, 0, 255, ax, pc, False))
        scale1 = torch.tensor([0.02], device=dev)
        zp1 = torch.tensor([128], dtype=torch.int32, device=dev)
        scalec = torch.full((C,), 0.02, device=dev)
        zpc = torch.full((C,), 128, dtype=torch.int32, device=dev)
        add("fq fwd per-tensor", lambda i: torch.fake_quantize_per_tensor_affine(xin[i % len(xin)], scale1, zp1, 0, 255))
        if dname == "f32":
            add("fq fwd per-channel", lambda i: torch.fake_quantize_per_channel_affine(xin[i % len(xin)], scalec, zpc, 0, 0, 255))
        dys = [torch.randn_like(x) for x in xin[:2]]

        def fwd_bwd(i, fn):
            x = xin[i % len(xin)].detach().requires_grad_(True)
            fn(x).backward(dys[i % len(dys)])

        add("fq fwd+bwd per-tensor", lambda i: fwd_bwd(i, lambda x: torch.fake_quantize_per_tensor_affine(x, scale1, zp1, 0, 255)))
        if dname == "f32":
            add("fq fwd+bwd per-channel", lambda i: fwd_bwd(i, lambda x: torch.fake_quantize_per_channel_affine(x, scalec, zpc, 0, 0, 255)))
            s_l = torch.tensor([0.02], device=dev, requires_grad=True)
            z_l = torch.tensor([3.0], device=dev, requires_grad=True)
            gf = 1.0 / (shape[0] * shape[1] * 127) ** 0.5
            add("lsq fwd+bwd per-tensor", lambda i: fwd_bwd(
                i, lambda x: torch._fake_quantize_learnable_per_tensor_affine(x, s_l, z_l, -128, 127, gf)))
        comp_tok = torch.compile(per_token_int8) if compile_too else None
        comp_i4 = torch.compile(int4_pack) if compile_too else None
        add("dynamic int8 per-token", lambda i: per_token_int8(xin[i % len(xin)]),
            (lambda i: comp_tok(xin[i % len(xin)])) if compile_too else None)
        add("dynamic fq per-token s8", lambda i: dynamic_fq_token(xin[i % len(xin)]))
        add("dynamic fq g32 s4 symmetric", lambda i: dynamic_fq_group32(xin[i % len(xin)]))
        add("int4 g128 pack", lambda i: int4_pack(xin[i % len(xin)]),
            (lambda i: comp_i4(xin[i % len(xin)])) if compile_too else None)
        print(f"done {dname}{list(shape)}", flush=True)
    # Channels on a middle axis (NCHW activations, axis 1): the same shapes as ours.
    nchw = [(64, 64, 32, 32)] if device == "cpu" else [(128, 64, 64, 64), (32, 64, 32, 32)]
    if quick:
        nchw = [(4, 64, 8, 8)]
    for shape in nchw:
        for dname in ("f32", "bf16") if device == "cpu" else ("f32", "bf16", "f16"):
            xs = inputs(shape, DTYPES[dname], device, cache)
            dev = xs[0].device
            label = f"obs+fq per-channel axis 1 {dname}[{', '.join(map(str, shape))}]"
            if keep is not None and not keep.search(label):
                continue
            copy = timer(device, lambda i: xs[i % len(xs)].clone(), reps)
            # fused_moving_avg_obs_fake_quant takes channels of 2-D inputs only ("dimensions of
            # scale and zero-point are not consistent" for axis 1 of NCHW), so PyTorch's side is
            # its eager QAT module for this layout: FakeQuantize with a per-channel moving-average
            # observer on axis 1.
            try:
                fq = torch.ao.quantization.FakeQuantize(
                    observer=torch.ao.quantization.MovingAveragePerChannelMinMaxObserver,
                    quant_min=0, quant_max=255, dtype=torch.quint8, qscheme=torch.per_channel_affine,
                    ch_axis=1).to(dev)
                t = timer(device, lambda i: fq(xs[i % len(xs)]), reps)
                results[label] = {"copy_us": copy, "eager_us": t}
            except Exception as e:  # an op PyTorch lacks for this dtype/device
                results[label] = {"copy_us": copy, "error": str(e).splitlines()[0][:120]}
    return results


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", required=True)
    p.add_argument("--filter", help="'|'-separated texts: time only the cases whose label contains one "
                   "(the same rule as `qat bench --filter`)")
    a = p.parse_args()
    if a.device == "cpu":
        torch.set_num_threads(1)
    keep = re.compile("|".join(re.escape(t) for t in a.filter.split("|"))) if a.filter else None
    res = run(a.device, a.reps, a.quick, compile_too=(a.device == "cuda" and not a.no_compile), keep=keep)
    with open(a.json, "w") as f:
        json.dump({"torch": torch.__version__, "device": a.device, "results": res}, f, indent=1)


if __name__ == "__main__":
    main()
