"""Reference steps of torch.optim.AdamW (single-tensor path) with
torch.nn.utils.clip_grad_norm_ before each step, for tests/ops_optim/adamw_torch_test.cpp.

Usage: adamw_reference.py DIR. DIR holds hyper.json ({"params": P, "steps": S, "lr": [S rates],
"weight_decay", "beta1", "beta2", "eps", "max_norm" (0: no clipping)}), p<k>.npy (the initial
f32 parameters, k < P) and g<s>_<k>.npy (the gradient of parameter k at step s). Writes
p<k>_after<s>.npy after every step and, when clipping, norm<s>.npy (clip_grad_norm_'s result).
"""
import json
import os
import sys

import numpy as np
import torch


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "hyper.json")) as f:
        h = json.load(f)
    params = [torch.nn.Parameter(torch.from_numpy(np.load(os.path.join(d, f"p{k}.npy"))))
              for k in range(h["params"])]
    opt = torch.optim.AdamW(params, lr=h["lr"][0], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                            weight_decay=h["weight_decay"], foreach=False)
    for s in range(h["steps"]):
        for k, p in enumerate(params):
            p.grad = torch.from_numpy(np.load(os.path.join(d, f"g{s}_{k}.npy")))
        if h["max_norm"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, h["max_norm"])
            np.save(os.path.join(d, f"norm{s}.npy"), norm.detach().numpy())
        # The rate changes between steps as a scheduler sets it: the group's float.
        opt.param_groups[0]["lr"] = h["lr"][s]
        opt.step()
        for k, p in enumerate(params):
            np.save(os.path.join(d, f"p{k}_after{s}.npy"), p.detach().numpy())


if __name__ == "__main__":
    main()
