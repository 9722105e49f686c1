"""The one-line QAT swap on a transformers LlamaForCausalLM: prepare_qat(model, "8da4w") swaps
every nn.Linear (the attention and MLP projections and the lm_head), the model trains (its loss
falls on a fixed batch), and convert() gives the QAT model's logits bit for bit. bf16 on CUDA
where there is a GPU, f32 on the CPU otherwise. Skipped without transformers (the GPU image
has it; Debian's CPU machine does not)."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import qatgraph.torch as qgt  # noqa: E402
from torch import nn  # noqa: E402


def tiny_llama(device, dtype):
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, rms_norm_eps=1e-5,
                                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype)


@pytest.fixture
def where():
    if torch.cuda.is_available():
        return "cuda", torch.bfloat16
    return "cpu", torch.float32


def test_one_line_swap_trains_and_converts_bit_for_bit(where):
    device, dtype = where
    model = tiny_llama(device, dtype)
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert linears == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer; lm_head
    qat = qgt.prepare_qat(model, "8da4w", group_size=32)
    swapped = [m for m in qat.modules() if isinstance(m, nn.Linear) and hasattr(m, "weight_fake_quant")]
    assert len(swapped) == linears
    opt = torch.optim.AdamW(qat.parameters(), lr=3e-3)
    ids = torch.randint(0, 256, (4, 32), device=device, generator=torch.Generator(device).manual_seed(1))
    losses = []
    for _ in range(30):
        loss = qat(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses
    qat.eval()
    with torch.no_grad():
        want = qat(input_ids=ids).logits
        got = qgt.convert(qat)(input_ids=ids).logits
    assert got.dtype == want.dtype
    assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
