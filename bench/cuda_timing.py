"""The timing loop the torch benchmarks share: warm-up calls, then `reps` back-to-back calls
between two CUDA events; returns microseconds per call."""
import torch


def per_call_us(fn, reps, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / reps
