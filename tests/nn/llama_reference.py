"""Reference forward of transformers' LlamaForCausalLM (eager attention, f32) in plain torch,
for tests/nn/llama_test.cpp: transformers itself is not installed next to Debian's torch 1.13,
so this follows its modeling_llama arithmetic step by step (LlamaRMSNorm, the rotary
embedding's f32 inv_freq and cos/sin, rotate_half, repeat_kv, the scaled scores plus the
causal mask, softmax in f32, SwiGLU, the shifted next-token cross-entropy).

Usage: llama_reference.py DIR. DIR holds config.json, input_ids.npy and one <name>.npy per
parameter under transformers' state-dict names; writes DIR/ref_logits.npy [batch, seq, vocab]
and DIR/ref_loss.npy (a scalar).
"""
import json
import os
import sys

import numpy as np
import torch


def rms_norm(x, w, eps):
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    return w * (h * torch.rsqrt(var + eps)).to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_cos_sin(seq, head_dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    positions = torch.arange(seq, dtype=torch.int64)[None, :].float()  # [1, seq]
    freqs = (inv_freq[None, :, None] @ positions[:, None, :]).transpose(1, 2)  # [1, seq, hd/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    b, kv, t, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, hd).reshape(b, kv * n_rep, t, hd)


def forward(cfg, p, ids):
    b, t = ids.shape
    d = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    hd = d // heads
    eps = cfg.get("rms_norm_eps", 1e-6)
    cos, sin = rotary_cos_sin(t, hd, cfg.get("rope_theta", 10000.0))
    cos, sin = cos[:, None], sin[:, None]  # unsqueeze the head axis
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
    lin = torch.nn.functional.linear

    h = torch.nn.functional.embedding(ids, p["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        x = rms_norm(h, p[pre + "input_layernorm.weight"], eps)
        q = lin(x, p[pre + "self_attn.q_proj.weight"]).view(b, t, heads, hd).transpose(1, 2)
        k = lin(x, p[pre + "self_attn.k_proj.weight"]).view(b, t, kv, hd).transpose(1, 2)
        v = lin(x, p[pre + "self_attn.v_proj.weight"]).view(b, t, kv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, heads // kv), repeat_kv(v, heads // kv)
        scores = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, d)
        h = h + lin(ctx, p[pre + "self_attn.o_proj.weight"])
        x = rms_norm(h, p[pre + "post_attention_layernorm.weight"], eps)
        gated = torch.nn.functional.silu(lin(x, p[pre + "mlp.gate_proj.weight"]))
        gated = gated * lin(x, p[pre + "mlp.up_proj.weight"])
        h = h + lin(gated, p[pre + "mlp.down_proj.weight"])
    h = rms_norm(h, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    logits = lin(h, head)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1, :].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return logits, loss


def main():
    folder = sys.argv[1]
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    ids = torch.from_numpy(np.load(os.path.join(folder, "input_ids.npy")))
    params = {}
    for name in os.listdir(folder):
        if name.endswith(".weight.npy"):
            params[name[:-4]] = torch.from_numpy(np.load(os.path.join(folder, name)))
    with torch.no_grad():
        logits, loss = forward(cfg, params, ids)
    np.save(os.path.join(folder, "ref_logits.npy"), logits.numpy())
    np.save(os.path.join(folder, "ref_loss.npy"), loss.numpy())


if __name__ == "__main__":
    main()
