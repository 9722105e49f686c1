"""The one-line QAT swap on a torchvision ResNet-18: prepare_qat(model) with torch.ao's default
QAT recipe swaps every nn.Conv2d (20: the stem, two per basic block, three 1x1 downsamples) and
the fc layer, fuses each downsample's Conv2d + BatchNorm2d (an nn.Sequential, as
torch.ao.quantization.fuse_modules would), observes the other batch norms' outputs, trains (the
loss falls on a fixed batch), keeps torch.ao's state_dict keys, and convert() gives the
prepared model's eval-mode logits (observers off) bit for bit. On CUDA where there is a GPU, on
the CPU otherwise. Skipped without torchvision (the GPU image has it; Debian's CPU machine
does not)."""
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import qatgraph.torch as qgt  # noqa: E402
from torch import nn  # noqa: E402
from torch.ao import quantization as tq  # noqa: E402


@pytest.fixture
def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def resnet18(device):
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).to(device)


def test_one_line_swap_of_a_torchvision_resnet_trains_and_converts(device):
    model = resnet18(device)
    convs = sum(isinstance(m, nn.Conv2d) for m in model.modules())
    assert convs == 20
    qat = qgt.prepare_qat(model)
    fake_quantized = [name for name, m in qat.named_modules() if hasattr(m, "weight_fake_quant")]
    # 17 plain convs, 3 downsample conv + batch norm pairs, fc.
    assert len(fake_quantized) == 21, fake_quantized
    keys = qat.state_dict().keys()
    assert "conv1.weight_fake_quant.scale" in keys
    assert "fc.activation_post_process.scale" in keys
    gen = torch.Generator(device).manual_seed(1)
    x = torch.randn(16, 3, 32, 32, device=device, generator=gen)
    y = torch.randint(0, 10, (16,), device=device, generator=gen)
    opt = torch.optim.SGD(qat.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(25):
        loss = nn.functional.cross_entropy(qat(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses
    qat.apply(tq.disable_observer)
    qat.eval()
    with torch.no_grad():
        want = qat(x)
        got = qgt.convert(qat)(x)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
