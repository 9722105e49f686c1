"""qatgraph.torch's fused QAT linear of the dynamic recipes (dynamic_qat_linear: both fake
quantizations, the GEMM, and the STE of each gradient in one autograd node, its kernels
called through a prepared plan) against the same computation composed of separate ops:
outputs and gradients bit for bit, on the CPU and, where there is one, the GPU."""
import pytest
import torch
import torch.nn.functional as F

import qatgraph as qg
from qatgraph.torch import functional as qf

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and qg._core.build_info["cuda"]
                     else [])


def bits(t):
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
            torch.float64: torch.int64}[t.dtype]
    return t.detach().contiguous().view(view).cpu()


def assert_same(got, want, what):
    assert got.shape == want.shape and got.dtype == want.dtype, what
    diff = (bits(got) != bits(want)).nonzero()
    assert diff.numel() == 0, f"{what}: {diff.shape[0]} elements differ"


def composed(x, w, b, group_size):
    """linear(fq(x), fq(w), b) from three autograd nodes: the reference."""
    xq = qf.dynamic_fake_quantize(x, -128, 127)[0]
    wq = qf.dynamic_fake_quantize(w, -8, 7, group_size=group_size, symmetric=True,
                                  eps=torch.finfo(w.dtype).smallest_normal)[0]
    return F.linear(xq, wq, b)


def fused(x, w, b, group_size):
    x_attrs = qf._dynamic_attrs(0, False, -128, 127, torch.finfo(torch.float32).eps)
    w_attrs = qf._dynamic_attrs(group_size, True, -8, 7, torch.finfo(w.dtype).smallest_normal)
    return qf.dynamic_qat_linear(x, w, b, x_attrs, w_attrs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 0])
def test_fused_dynamic_linear_equals_its_composition(device, dtype, group_size):
    g = torch.Generator().manual_seed(3)
    x0 = (torch.randn(3, 5, 64, generator=g) * 2).to(dtype).to(device)
    w0 = (torch.randn(48, 64, generator=g) * 0.1).to(dtype).to(device)
    b0 = torch.randn(48, generator=g).to(dtype).to(device)
    dy = torch.randn(3, 5, 48, generator=g).to(dtype).to(device)
    # Twice: the second call runs the plan the first one prepared.
    for call in range(2):
        results = []
        for fn in (fused, composed):
            x, w, b = (t.clone().requires_grad_(True) for t in (x0, w0, b0))
            y = fn(x, w, b, group_size)
            y.backward(dy)
            results.append((y, x.grad, w.grad, b.grad))
        for name, got, want in zip(("y", "dx", "dw", "db"), *results):
            assert_same(got, want, f"{name} (call {call}, {device}, {dtype}, group {group_size})")
        # The STE zeroes some weight-gradient elements (a group's largest positive weight
        # rounds to 8, past int4's 7): otherwise this test could not see a wrong mask.
        assert (results[0][2] == 0).any()


@pytest.mark.parametrize("device", DEVICES)
def test_fused_dynamic_linear_takes_a_strided_input(device):
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(64, 6, generator=g).to(device).t()  # [6, 64], not contiguous
    w0 = (torch.randn(16, 64, generator=g) * 0.1).to(device)
    dy = torch.randn(6, 16, generator=g).to(device)
    results = []
    for fn in (fused, composed):
        x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
        x_in = x if fn is composed else x0.detach().requires_grad_(True)
        y = fn(x_in, w, None, 32)
        y.backward(dy)
        results.append((y, x_in.grad, w.grad))
    for name, got, want in zip(("y", "dx", "dw"), *results):
        assert_same(got, want, f"{name} ({device}, strided input)")


def test_double_backward_through_the_fused_linear():
    """create_graph=True: the backward takes the STE's autograd form rather than the in-place
    kernel, with the same values."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 64, generator=g, requires_grad=True)
    w = (torch.randn(8, 64, generator=g) * 0.1).requires_grad_(True)
    y = fused(x, w, None, 32)
    (dx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (dx_ref,) = torch.autograd.grad(composed(x, w, None, 32).sum(), x, create_graph=True)
    assert_same(dx, dx_ref, "dx with create_graph")
