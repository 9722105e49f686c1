"""Writes the Hugging Face Llama fixture of tests/import/hf_llama_fixture_test.cpp with
transformers itself: LlamaForCausalLM built from a tiny config, save_pretrained, and the
reference logits of a fixed token sequence computed by transformers on the CPU.

Needs torch, transformers (5.x) and numpy; it is run by hand where transformers is installed
and its output is committed, so CI needs none of them:

    python tests/import/make_hf_llama_fixture.py --out tests/import/fixtures/hf_llama_tiny
    python tests/import/make_hf_llama_fixture.py --tar FILE.tar   # the same folder as a tar

The folder it writes (about 450 KB):
  f32/      config.json and model.safetensors of the untied model, f32
  bf16/     the same model cast to bf16 (each weight rounded to nearest even), one file
  sharded/  the f32 model again, saved with a small max_shard_size: several
            model-0000k-of-0000n.safetensors and model.safetensors.index.json
  tied/     a second model with tie_word_embeddings (its file has no lm_head.weight)
  input_ids.npy                 i64 [2, 8], the token ids every reference runs on
  logits_f32.npy                f32 [2, 8, vocab]: f32/ in f32
  logits_bf16.npy               the bf16 model in bf16 (bf16 activations, transformers'
                                own casts), upcast to f32 for .npy
  logits_bf16_weights_f32.npy   bf16/'s weights upcast to f32, run in f32
  logits_tied.npy               tied/ in f32
  provenance.json               the torch and transformers versions and the settings

Weights: the model's own init draws N(0, 0.02) weights and all-ones norms, which leaves
logits near 0 and would hide a swapped norm weight; every matrix is therefore redrawn from
N(0, 0.2) with a fixed seed and every norm weight from U(0.5, 1.5). Attention is transformers'
eager implementation (the arithmetic the CPU reference graph follows: softmax in f32).
rope_theta is not the default 10000, so a config reader that ignores it fails the test.
"""
import argparse
import inspect
import json
import os
import shutil
import tarfile
import tempfile

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = dict(vocab_size=128, hidden_size=32, intermediate_size=80, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             rms_norm_eps=1e-5)
ROPE_THETA = 500.0
WEIGHT_STD = 0.2
SEED = 20261127
MAX_SHARD_SIZE = "40KB"  # about 120 KB of f32 weights: four shards
INPUT_IDS = [[1, 17, 42, 0, 127, 8, 8, 99], [5, 64, 3, 3, 120, 31, 77, 2]]


def make_config(tied):
    kwargs = dict(SIZES, tie_word_embeddings=tied, hidden_act="silu", attention_bias=False,
                  mlp_bias=False, use_cache=False, attn_implementation="eager")
    # transformers 5 holds rope_theta in rope_parameters; 4.x takes it as an argument.
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": ROPE_THETA}
    else:
        kwargs["rope_theta"] = ROPE_THETA
    return LlamaConfig(**kwargs)


def make_model(tied, seed):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(make_config(tied))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * WEIGHT_STD)
    return model.eval()


def load_pretrained(path, dtype):
    """from_pretrained in `dtype` (transformers 5 names the argument dtype, 4.x torch_dtype)."""
    params = inspect.signature(LlamaForCausalLM.from_pretrained).parameters
    key = "torch_dtype" if "torch_dtype" in params and "dtype" not in params else "dtype"
    model = LlamaForCausalLM.from_pretrained(path, **{key: dtype}, attn_implementation="eager")
    return model.eval()


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.to(torch.float32).numpy()


def write_fixture(out):
    os.makedirs(out, exist_ok=True)
    ids = torch.tensor(INPUT_IDS, dtype=torch.int64)
    np.save(os.path.join(out, "input_ids.npy"), ids.numpy())

    model = make_model(tied=False, seed=SEED)
    model.save_pretrained(os.path.join(out, "f32"))
    model.save_pretrained(os.path.join(out, "sharded"), max_shard_size=MAX_SHARD_SIZE)
    np.save(os.path.join(out, "logits_f32.npy"), logits_of(model, ids))

    bf16_dir = os.path.join(out, "bf16")
    make_model(tied=False, seed=SEED).to(torch.bfloat16).save_pretrained(bf16_dir)
    # The references of the bf16 checkpoint come from loading it, as a user would: a model
    # cast in place with .to() would also round its rotary inv_freq buffer to bf16 (which no
    # checkpoint holds, and loading recomputes in f32), moving the logits by ~1e-2.
    np.save(os.path.join(out, "logits_bf16.npy"),
            logits_of(load_pretrained(bf16_dir, torch.bfloat16), ids))
    np.save(os.path.join(out, "logits_bf16_weights_f32.npy"),
            logits_of(load_pretrained(bf16_dir, torch.float32), ids))

    tied = make_model(tied=True, seed=SEED + 1)
    tied.save_pretrained(os.path.join(out, "tied"))
    np.save(os.path.join(out, "logits_tied.npy"), logits_of(tied, ids))

    shards = [f for f in os.listdir(os.path.join(out, "sharded")) if f.endswith(".safetensors")]
    assert len(shards) >= 2, f"max_shard_size {MAX_SHARD_SIZE} gave {len(shards)} shard(s)"
    with open(os.path.join(out, "provenance.json"), "w") as f:
        json.dump({"generator": "tests/import/make_hf_llama_fixture.py",
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "seed": SEED, "weight_std": WEIGHT_STD, "rope_theta": ROPE_THETA,
                   "max_shard_size": MAX_SHARD_SIZE, "shards": len(shards),
                   "attention": getattr(model.config, "_attn_implementation", "unknown"),
                   "device": "cpu"}, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="folder to write the fixture into")
    parser.add_argument("--tar", help="write the fixture folder as this tar file instead")
    args = parser.parse_args()
    if bool(args.out) == bool(args.tar):
        parser.error("give exactly one of --out and --tar")
    torch.set_num_threads(1)  # one summation order for the CPU references
    if args.out:
        write_fixture(args.out)
        return
    work = tempfile.mkdtemp()
    try:
        folder = os.path.join(work, "hf_llama_tiny")
        write_fixture(folder)
        with tarfile.open(args.tar, "w") as tar:
            tar.add(folder, arcname="hf_llama_tiny")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
