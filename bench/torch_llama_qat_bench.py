"""A Llama-architecture language model's training step in PyTorch on CUDA, in one run: the
float (bf16) model, torchao's 8da4w QAT (Int8DynActInt4WeightQATQuantizer) and
qatgraph.torch.prepare_qat(model, "8da4w"), the one-line swap.

    PYTHONPATH=<build>/python:<torchao> python3 bench/torch_llama_qat_bench.py [--layers 12]

The model: transformers' LlamaForCausalLM with random weights, vocab 32000, hidden 1024,
intermediate 2816, 16 heads, 8 KV heads, RMSNorm eps 1e-5, rope_theta 10000, untied lm_head
(12 layers: 207M parameters), bf16 parameters, SDPA attention; batch 8 x 1024 tokens; fused
AdamW. Each variant starts from the same weights and steps on the same random tokens: forward
with the loss, backward, optimizer step. Timed with CUDA events over `steps` steps after
`warmup`; peak memory is torch's max_memory_allocated over the timed and warm-up steps
(`--cuda-graph`: each variant's whole step is captured once and replayed, which takes the
host's per-step work, Python and launches, out of the time; the peak then includes the
capture's warm-up steps and the graph's memory pool, and the first loss is the first
warm-up step's). With
`--repeats R` every variant is measured R times, interleaved, and its median reported. The
losses of the first and last steps show that each variant trains. MFU counts 6 N tokens plus
the causal attention's FLOPs (6 x 2 x layers x batch x seq^2 x hidden / 2) against `--peak`
TFLOP/s of dense bf16.
"""
import argparse
import gc

import torch

from cuda_timing import per_call_us


def llama(layers):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                         num_hidden_layers=layers, num_attention_heads=16,
                         num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                         max_position_embeddings=2048, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)


def torchao_8da4w(model, group_size):
    from torchao.quantization.qat import Int8DynActInt4WeightQATQuantizer
    return Int8DynActInt4WeightQATQuantizer(groupsize=group_size).prepare(model)


def qatgraph_8da4w(model, group_size):
    import qatgraph.torch as qgt  # here, so that the torch-only scripts import this file
    return qgt.prepare_qat(model, "8da4w", inplace=True, group_size=group_size)


def measure(prepare, args):
    model = llama(args.layers)
    if prepare is not None:
        model = prepare(model, args.group_size)
    model.train()
    if args.compile:  # the parameters stay the module's, so the optimizer below updates them
        model = torch.compile(model)
    params = sum(p.numel() for p in model.parameters())
    # capturable: the step count stays on the device, which a captured step needs.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True,
                            capturable=args.cuda_graph)
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, 32000, (args.batch, args.seq), device="cuda", generator=gen)
    losses = []

    def eager_step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=not args.cuda_graph)
        return loss.detach()

    torch.cuda.synchronize()
    # From here: the peak counts the captured step's own memory (its private pool is
    # allocated during the capture and stays allocated while the graph lives).
    torch.cuda.reset_peak_memory_stats()
    if args.cuda_graph:
        step = graphed(eager_step, losses)
    else:
        def step():
            losses.append(eager_step())
    ms = per_call_us(step, args.steps, args.warmup) / 1000
    peak = torch.cuda.max_memory_allocated() / 2**30
    first, last = losses[0].item(), losses[-1].item()
    del model, opt, losses
    gc.collect()
    torch.cuda.empty_cache()
    return params, ms, peak, first, last


def graphed(eager_step, losses):
    """The whole training step (forward, backward, AdamW) captured as one CUDA graph, as
    PyTorch's whole-network capture does it: three warm-up steps on a side stream (which also
    make every lazily built state: the optimizer's, qatgraph's prepared kernels), then one
    capture; each call replays it. The gradients stay allocated (zeroed, not freed), so the
    captured step reads and writes fixed addresses."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            losses.append(eager_step())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = eager_step()

    def replay():
        graph.replay()
        losses.append(static_loss.clone())
    return replay


def profile(args):
    """Where the qatgraph variant's step goes: the GPU kernels by total time, and the host time
    per step against the device time."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    model = qatgraph_8da4w(llama(args.layers), args.group_size).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 32000, (args.batch, args.seq), device="cuda")

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    print(averages.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    print(averages.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    # Only the device's own events (the kernels and copies): an operator's row repeats the
    # time of the kernels it launched, so summing every row counts each kernel twice.
    from torch.autograd import DeviceType
    events = prof.events()
    device_us = sum(getattr(e, "self_device_time_total", 0) for e in events
                    if e.device_type == DeviceType.CUDA) / 3
    host_us = sum(e.self_cpu_time_total for e in events if e.device_type == DeviceType.CPU) / 3
    print(f"GPU kernel time per step: {device_us / 1000:.1f} ms; host (CPU) time per step: "
          f"{host_us / 1000:.1f} ms")


def add_step_args(parser):
    """The model and step options this script shares with torch_llama_ddp_bench.py."""
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-torchao", action="store_true")


def main():
    parser = argparse.ArgumentParser()
    add_step_args(parser)
    parser.add_argument("--peak", type=float, default=989.0, help="dense bf16 TFLOP/s")
    parser.add_argument("--repeats", type=int, default=1,
                        help="measure the variants this many times, interleaved, and report "
                             "the median ms (with the range): the float step itself moves "
                             "between calls")
    parser.add_argument("--profile", action="store_true",
                        help="profile 3 steps of the qatgraph variant; print the top kernels")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each variant's model (default mode) before timing: "
                             "the float row is then torch.compile's step")
    parser.add_argument("--float-only", action="store_true",
                        help="time the float step only (with --compile: torch.compile's float "
                             "step, the issue's comparison for qatgraph's own engine)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="capture each variant's whole step as one CUDA graph and replay "
                             "it (no host work per step: what is left is the GPU's time)")
    args = parser.parse_args()
    if args.profile:
        profile(args)
        return
    variants = [("float (bf16)", None)]
    if not args.float_only:
        if not args.skip_torchao:
            variants.append((f"torchao 8da4w QAT (group {args.group_size})", torchao_8da4w))
        variants.append((f"qatgraph.torch 8da4w QAT (group {args.group_size})", qatgraph_8da4w))
    tokens = args.batch * args.seq
    print(f"{torch.cuda.get_device_name()}, PyTorch {torch.__version__}; LlamaForCausalLM "
          f"{args.layers} layers, batch {args.batch} x {args.seq}, bf16, SDPA, fused AdamW"
          f"{'; each step one CUDA graph replay' if args.cuda_graph else ''}"
          f"{'; torch.compile' if args.compile else ''}\n")
    print("| step | ms/step | / float | tokens/s | MFU | peak GiB | loss first -> last |")
    print("|---|---|---|---|---|---|---|")
    # Interleaved: repeat r measures every variant once, so a drift of the GPU's speed over the
    # call reaches all of them alike.
    runs = {name: [] for name, _ in variants}
    failed = {}
    for _ in range(args.repeats):
        for name, prepare in variants:
            if name in failed:
                continue
            try:
                runs[name].append(measure(prepare, args))
            except Exception as e:  # a variant that cannot run is a row saying why
                failed[name] = f"{type(e).__name__}: {str(e)[:160]}"
    float_ms = None
    for name, _ in variants:
        if name in failed:
            print(f"| {name} | failed: {failed[name]} | | | | | |")
            continue
        times = sorted(r[1] for r in runs[name])
        ms = times[len(times) // 2]
        params, _, peak, first, last = runs[name][0]
        peak = max(r[2] for r in runs[name])
        float_ms = float_ms or ms
        flops = 6 * params * tokens + 6 * args.layers * args.batch * args.seq**2 * 1024
        mfu = flops / (ms / 1000) / (args.peak * 1e12)
        spread = f" ({times[0]:.1f}-{times[-1]:.1f})" if len(times) > 1 else ""
        print(f"| {name} | {ms:.1f}{spread} | {ms / float_ms:.2f}x | {tokens / ms * 1000:,.0f} | "
              f"{100 * mfu:.0f}% | {peak:.1f} | {first:.3f} -> {last:.3f} |", flush=True)
    print(f"\n{params / 1e6:.0f}M parameters")


if __name__ == "__main__":
    main()
