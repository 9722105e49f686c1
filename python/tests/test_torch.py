"""qatgraph.torch against PyTorch 1.13's own fake quantization: the same outputs and the same
gradients, bit for bit, per tensor and per channel; DLPack exchange without copies."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import qatgraph as qg  # noqa: E402
import qatgraph.torch as qgt  # noqa: E402

RANGES = [(0, 255), (-128, 127), (0, 15), (-8, 7), (-127, 127), (3, 200)]


def inputs(shape, scale, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * 3 * scale * 40
    # Exact rounding ties (k + 0.5) * scale and values far outside the range.
    flat = x.view(-1)
    flat[: flat.numel() // 4] = (torch.arange(flat.numel() // 4, dtype=torch.float64) - 20.5) * scale
    flat[-3:] = torch.tensor([1e6, -1e6, 0.0])
    return x.to(dtype).requires_grad_(True)


def forward_backward(fn, x, seed):
    y = fn(x)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    (y * w).sum().backward()
    return y.detach(), x.grad.detach()


@pytest.mark.parametrize("qmin,qmax", RANGES)
def test_per_tensor_matches_torch(qmin, qmax):
    dtype = torch.float32
    for seed, (scale, zp) in enumerate([(0.1, (qmin + qmax) // 2), (0.0173, qmin), (2.5, qmax)]):
        x1 = inputs((6, 33), scale, seed, dtype)
        x2 = x1.detach().clone().requires_grad_(True)
        want_y, want_dx = forward_backward(
            lambda x: torch.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax), x1, seed)
        got_y, got_dx = forward_backward(
            lambda x: qgt.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax), x2, seed)
        assert got_y.dtype == dtype
        assert torch.equal(got_y, want_y), (qmin, qmax, scale, zp)
        assert torch.equal(got_dx, want_dx), (qmin, qmax, scale, zp)


def test_float64_follows_semantics_md():
    # f64 runs its math in f64 (SEMANTICS.md), where PyTorch takes the reciprocal of the
    # scale in f32; so f64 is checked against the SEMANTICS.md formula, ties included.
    scale, zp, qmin, qmax = 0.1, 3, -128, 127
    x = inputs((6, 33), scale, 0, torch.float64)
    y, dx = forward_backward(
        lambda v: qgt.fake_quantize_per_tensor_affine(v, scale, zp, qmin, qmax), x, 0)
    s = float(np.float32(scale))  # the scale tensor is f32
    q = np.rint(x.detach().numpy() * (1.0 / s)) + zp
    want = (np.clip(q, qmin, qmax) - zp) * s
    assert np.array_equal(y.numpy(), want)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(0), dtype=y.dtype).numpy()
    assert np.array_equal(dx.numpy(), w * ((q >= qmin) & (q <= qmax)))


@pytest.mark.parametrize("qmin,qmax", RANGES)
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_per_channel_matches_torch(qmin, qmax, axis):
    shape = (4, 5, 6)
    channels = shape[axis]
    g = torch.Generator().manual_seed(axis + 10)
    scale = (torch.rand(channels, generator=g, dtype=torch.float64) * 0.2 + 0.01).float()
    zp = torch.randint(qmin, qmax + 1, (channels,), generator=g, dtype=torch.int32)
    x1 = inputs(shape, float(scale.mean()), axis + 3)
    x2 = x1.detach().clone().requires_grad_(True)
    want_y, want_dx = forward_backward(
        lambda x: torch.fake_quantize_per_channel_affine(x, scale, zp, axis % 3, qmin, qmax), x1, 7)
    got_y, got_dx = forward_backward(
        lambda x: qgt.fake_quantize_per_channel_affine(x, scale, zp, axis, qmin, qmax), x2, 7)
    assert torch.equal(got_y, want_y)
    assert torch.equal(got_dx, want_dx)


def test_non_contiguous_and_expanded_gradients():
    x = inputs((8, 10), 0.05, 5).detach()
    xt = x.t().requires_grad_(True)  # a transposed (non-contiguous) view
    y = qgt.fake_quantize_per_tensor_affine(xt, 0.05, 0, -128, 127)
    y.sum().backward()  # the gradient arrives as an expanded (stride 0) tensor
    want = torch.fake_quantize_per_tensor_affine(xt.detach(), 0.05, 0, -128, 127)
    assert torch.equal(y.detach(), want)
    in_range = (torch.round(xt.detach() / 0.05) >= -128) & (torch.round(xt.detach() / 0.05) <= 127)
    assert torch.equal(xt.grad, in_range.float())


def test_bad_arguments_raise():
    x = torch.randn(4, 4)
    with pytest.raises(qg.Error, match=r"quant_min"):
        qgt.fake_quantize_per_tensor_affine(x, 0.1, 0, 5, 5)
    with pytest.raises(qg.Error, match=r"expected 4 qparams, got 3"):
        qgt.fake_quantize_per_channel_affine(x, torch.ones(3), torch.zeros(3), 0, 0, 255)
    with pytest.raises(qg.Error, match=r"scale"):
        qgt.fake_quantize_per_tensor_affine(x, -1.0, 0, 0, 255)


@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quantize_module_matches_torch_ao(per_channel):
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver
    from torch.ao.quantization import MovingAveragePerChannelMinMaxObserver
    if per_channel:
        kwargs = dict(observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                      quant_max=127, dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                      ch_axis=1, averaging_constant=0.1)
    else:
        kwargs = dict(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                      averaging_constant=0.1)
    ref, mine = FakeQuantize(**kwargs), qgt.FakeQuantize(**kwargs)
    for step in range(4):
        x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step)) * (step + 1)
        want_y, want_dx = forward_backward(ref, x.clone().requires_grad_(True), step)
        got_y, got_dx = forward_backward(mine, x.clone().requires_grad_(True), step)
        assert torch.equal(mine.scale, ref.scale.float()), step
        assert torch.equal(mine.zero_point.long(), ref.zero_point.long()), step
        assert torch.equal(got_y, want_y), step
        assert torch.equal(got_dx, want_dx), step
    # A frozen observer keeps the qparams; disabled fake quantization is the identity.
    ref.disable_observer()
    mine.disable_observer()
    x = torch.randn(16, 8) * 100
    assert torch.equal(mine(x), ref(x))
    assert torch.equal(mine.scale, ref.scale.float())
    ref.disable_fake_quant()
    mine.disable_fake_quant()
    assert torch.equal(mine(x), x) and torch.equal(ref(x), x)


def test_dlpack_exchange_without_copies():
    g = qg.Graph()
    x = g.input("x", "f32", [32])
    y = g.apply1("neg", [x])
    g.mark_output(x)
    t = torch.arange(32, dtype=torch.float32)
    back, out = qg.Executor(g).run({"x": t}, [x, y], framework="torch")
    assert isinstance(out, torch.Tensor) and torch.equal(out, -t)
    assert back.data_ptr() == t.data_ptr()  # fed and fetched through DLPack, no copy
    arr = qg.Executor(g).run({"x": t}, [y], framework="dlpack")[0]
    assert torch.equal(torch.utils.dlpack.from_dlpack(arr), -t)
    assert np.array_equal(np.asarray(arr), -t.numpy())  # buffer protocol on the same object


def test_torch_half_types_round_trip():
    for dtype in [torch.float16, torch.bfloat16, torch.bool, torch.int64]:
        g = qg.Graph()
        value = torch.tensor([1, 0, 1]).to(dtype)
        c = g.constant(value if dtype != torch.bool else value.numpy())
        (out,) = qg.Executor(g).run({}, [c], framework="torch")
        assert out.dtype == dtype and torch.equal(out, value)


def test_ste_gradient_zero_signs_match_torch_bit_for_bit():
    # Clamped elements get dy * 0: -0.0 where dy < 0, NaN where dy is infinite, as torch's.
    x = torch.tensor([-100.0, -100.0, 0.3, 100.0, 100.0, 0.0, -100.0, 7.0])
    dy = torch.tensor([-1.0, 2.0, -3.0, -4.0, float("inf"), -0.0, float("nan"), 1.0])
    grads = []
    for fn in (torch.fake_quantize_per_tensor_affine, qgt.fake_quantize_per_tensor_affine):
        xr = x.clone().requires_grad_(True)
        fn(xr, 0.1, 0, -128, 127).backward(dy)
        grads.append(xr.grad)
    want, got = grads
    assert torch.signbit(want[3]) and torch.isnan(want[4])
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (got, want)


def test_scale_with_requires_grad_raises_like_torch():
    x = torch.randn(4, 4, requires_grad=True)
    s = torch.tensor([0.1], requires_grad=True)
    z = torch.tensor([0], dtype=torch.int32)
    with pytest.raises(RuntimeError):
        torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255)
    with pytest.raises(qg.Error, match=r"not differentiable with respect to .scale"):
        qgt.fake_quantize_per_tensor_affine(x, s, z, 0, 255)
    with pytest.raises(qg.Error, match=r"not differentiable with respect to .scale"):
        qgt.fake_quantize_per_channel_affine(x, torch.ones(4, requires_grad=True), torch.zeros(4),
                                             0, 0, 255)
    with torch.no_grad():  # no graph is recorded: nothing to refuse
        qgt.fake_quantize_per_tensor_affine(x, s, z, 0, 255)


def test_create_graph_gives_torchs_second_derivative():
    x0 = inputs((5, 7), 0.1, 3)
    results = []
    for fn in (torch.fake_quantize_per_tensor_affine, qgt.fake_quantize_per_tensor_affine):
        x = x0.detach().clone().requires_grad_(True)
        y = fn(x, 0.1, 0, -128, 127)
        (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
        assert g.requires_grad
        (gg,) = torch.autograd.grad((g * g).sum(), x)
        results.append((g.detach(), gg))
    (g1, gg1), (g2, gg2) = results
    assert torch.equal(g2.view(torch.int32), g1.view(torch.int32))
    assert torch.equal(gg2.view(torch.int32), gg1.view(torch.int32))
