"""The Llama step of bench/torch_llama_qat_bench.py under PyTorch DDP (NCCL), for the data-parallel
comparison: float (bf16) and torchao's 8da4w QAT, each rank with its own batch of
`batch` x `seq` random tokens, so the global batch grows with the ranks.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=<build>/python:<torchao> \
        torchrun --nproc_per_node 2 bench/torch_llama_ddp_bench.py [--layers 12]

Every rank times its own steps with CUDA events; a row reports the slowest rank's ms/step and
the global tokens/s (world x batch x seq per step). With one process (plain `python3`) it
runs without DDP, as the 1-GPU baseline of the same script.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_timing import per_call_us  # noqa: E402
from torch_llama_qat_bench import add_step_args, llama, torchao_8da4w  # noqa: E402


def measure(prepare, args, world, rank):
    model = llama(args.layers)
    if prepare is not None:
        model = prepare(model, args.group_size)
    model.train()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device="cuda").manual_seed(1 + rank)
    ids = torch.randint(0, 32000, (args.batch, args.seq), device="cuda", generator=gen)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    ms = torch.tensor([per_call_us(step, args.steps, args.warmup) / 1000], device="cuda")
    if world > 1:
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    del model, opt
    torch.cuda.empty_cache()
    return ms.item()


def main():
    parser = argparse.ArgumentParser()
    add_step_args(parser)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(rank)
    if world > 1:
        dist.init_process_group("nccl")
    variants = [("float (bf16)", None)]
    if not args.skip_torchao:
        variants.append((f"torchao 8da4w QAT (group {args.group_size})", torchao_8da4w))
    tokens = world * args.batch * args.seq
    if rank == 0:
        print(f"{torch.cuda.get_device_name()} x {world}, PyTorch {torch.__version__}, "
              f"{'DDP' if world > 1 else 'one GPU'}; batch {args.batch} x {args.seq} per GPU")
        print("| step | GPUs | ms/step | global tokens/s |")
        print("|---|---|---|---|")
    for name, prepare in variants:
        ms = measure(prepare, args, world, rank)
        if rank == 0:
            print(f"| torch {name} | {world} | {ms:.1f} | {tokens / ms * 1000:,.0f} |", flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
