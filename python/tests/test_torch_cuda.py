"""qatgraph.torch on CUDA tensors (skipped without a GPU build and device): PyTorch's results
and gradients bit for bit, CPU = GPU for the ops torch lacks, torch's current stream, CUDA-graph
capture, torch.compile(fullgraph=True), torch-allocated outputs, and the errors."""
import pytest
import torch

import qatgraph as qg
import qatgraph.torch as qgt

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and qg._core.build_info["cuda"]),
    reason="needs a CUDA device and a CUDA build of qatgraph")

DEV = "cuda"


def bits(t):
    """The bit patterns (signed zeros and NaN payloads included) as integers."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
            torch.float64: torch.int64}[t.dtype]
    return t.detach().contiguous().view(view).cpu()


def assert_bits_equal(got, want, what):
    assert got.shape == want.shape, what
    diff = (bits(got) != bits(want)).nonzero()
    assert diff.numel() == 0, (f"{what}: {diff.shape[0]} elements differ, first at "
                               f"{diff[0].tolist()}")


def sample(shape, seed, dtype=torch.float32, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    # Exact ties, out-of-range values and negative zeros, where rounding and clamping differ.
    flat = x.view(-1)
    flat[::7] = torch.round(flat[::7] / 0.1) * 0.1 + 0.05
    flat[::11] = -0.0
    flat[::13] *= 100
    return x.to(dtype).to(DEV)


@pytest.mark.parametrize("shape", [[64, 768], [8, 16, 33]])
def test_per_tensor_forward_and_backward_are_torchs_bit_for_bit(shape):
    x = sample(shape, 1).requires_grad_()
    xt = x.detach().clone().requires_grad_()
    y = qgt.fake_quantize_per_tensor_affine(x, 0.1, 3, 0, 255)
    yt = torch.fake_quantize_per_tensor_affine(xt, 0.1, 3, 0, 255)
    assert_bits_equal(y, yt, "forward")
    dy = sample(shape, 2)  # negative dy on clamped elements: torch's -0
    y.backward(dy)
    yt.backward(dy)
    assert_bits_equal(x.grad, xt.grad, "backward")
    assert (bits(x.grad) == torch.iinfo(torch.int32).min).any(), "no -0 was tested"


def test_per_channel_forward_and_backward_are_torchs_bit_for_bit():
    x = sample([32, 16, 5, 5], 3).requires_grad_()
    xt = x.detach().clone().requires_grad_()
    scale = torch.rand(16, device=DEV) * 0.2 + 0.01
    zp = torch.randint(-10, 10, [16], device=DEV, dtype=torch.int32)
    y = qgt.fake_quantize_per_channel_affine(x, scale, zp, 1, -128, 127)
    yt = torch.fake_quantize_per_channel_affine(xt, scale, zp, 1, -128, 127)
    assert_bits_equal(y, yt, "forward")
    dy = sample([32, 16, 5, 5], 4)
    y.backward(dy)
    yt.backward(dy)
    assert_bits_equal(x.grad, xt.grad, "backward")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_token_and_group_scopes_match_the_cpu_reference(dtype):
    # The CPU kernels are the reference (SEMANTICS.md; tested against PyTorch's formulas).
    x = sample([6, 128], 5, dtype)
    tok_scale = torch.rand(6, device=DEV) * 0.05 + 0.01
    tok_zp = torch.randint(-5, 5, [6], device=DEV, dtype=torch.int32)
    grp_scale = torch.rand(6 * 4, device=DEV) * 0.05 + 0.01
    grp_zp = torch.zeros(6 * 4, device=DEV, dtype=torch.int32)
    for fn, args in ((qgt.fake_quantize_per_token, (tok_scale, tok_zp, -128, 127)),
                     (qgt.fake_quantize_per_group, (grp_scale, grp_zp, 32, -8, 7))):
        gpu = fn(x, *args)
        cpu = fn(x.cpu(), *[a.cpu() if torch.is_tensor(a) else a for a in args])
        assert_bits_equal(gpu, cpu, f"{fn.__name__} {dtype}")


def test_lsq_dynamic_and_packing_match_the_cpu():
    x = sample([16, 256], 6, scale=1.0).requires_grad_()
    scale = torch.tensor([0.05], device=DEV, requires_grad=True)
    zp = torch.tensor([0.0], device=DEV, requires_grad=True)
    y = qgt.lsq_fake_quantize(x, scale, zp, -8, 7)
    y.backward(torch.ones_like(y))
    xc = x.detach().cpu().requires_grad_()
    sc = scale.detach().cpu().requires_grad_()
    zc = zp.detach().cpu().requires_grad_()
    yc = qgt.lsq_fake_quantize(xc, sc, zc, -8, 7)
    yc.backward(torch.ones_like(yc))
    assert_bits_equal(y, yc, "lsq forward")
    assert_bits_equal(x.grad, xc.grad, "lsq dx")
    assert_bits_equal(scale.grad, sc.grad, "lsq dscale")
    w = x.detach()
    for name, fn in (("dynamic", lambda t: qgt.dynamic_quantize_per_token(t)),
                     ("int4", lambda t: qgt.int4_pack(t, 128)),
                     ("nf4", lambda t: qgt.nf4_pack(t, 64))):
        for got, want in zip(fn(w), fn(w.cpu())):
            assert torch.equal(got.cpu(), want), name


def test_runs_on_the_current_stream_into_torch_memory():
    x = sample([1024, 1024], 7)
    want = torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    before = torch.cuda.memory_allocated()
    with torch.cuda.stream(side):
        y = qgt.fake_quantize_per_tensor_affine(x, 0.1, 0, -128, 127)
        # Allocated by torch's caching allocator: y (4 MiB) shows in its accounting.
        assert torch.cuda.memory_allocated() - before >= x.numel() * 4
    torch.cuda.current_stream().wait_stream(side)
    assert_bits_equal(y, want, "side stream")


def test_fake_quantize_module_matches_torch_ao():
    # Against torch.ao's module on the CPU, bit for bit. torch.ao's module on CUDA differs in
    # the scale's last bit at times: its (max - min) / float(quant_max - quant_min) runs on
    # CUDA as a multiply by the divisor's reciprocal (PyTorch's CUDA divide by a CPU scalar),
    # where the CPU divides; qatgraph divides on both devices. That case is checked too, to
    # within one ulp, and the outputs agree given the same qparams.
    from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver
    ours = qgt.FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0,
                            quant_max=255).to(DEV)
    cpu = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
    cuda = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0,
                        quant_max=255).to(DEV)
    for step in range(5):
        x = sample([64, 768], 10 + step).requires_grad_()
        xc = x.detach().cpu().requires_grad_()
        y, yc = ours(x), cpu(xc)
        cuda(x.detach())
        assert_bits_equal(ours.scale, cpu.scale, f"scale, step {step}")
        assert torch.equal(ours.zero_point.cpu(), cpu.zero_point), step
        assert_bits_equal(y, yc, f"output, step {step}")
        ulps = (bits(ours.scale) - bits(cuda.scale)).abs().max().item()
        assert ulps <= 1, f"step {step}: {ulps} ulps from torch.ao's CUDA scale"
        y.backward(torch.ones_like(y))
        yc.backward(torch.ones_like(yc))
        assert_bits_equal(x.grad, xc.grad, f"grad, step {step}")
    # The state_dict moves across, and the module follows torch.ao's switches.
    cuda.load_state_dict(ours.state_dict())
    ours.apply(torch.ao.quantization.disable_observer)
    cuda.apply(torch.ao.quantization.disable_observer)
    x = sample([64, 768], 99)
    assert_bits_equal(ours(x), cuda(x), "after disable_observer")


def test_cuda_graph_capture_replays_the_ops():
    fq = qgt.FakeQuantize(quant_min=0, quant_max=255).to(DEV)
    static_x = sample([256, 512], 20)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels prepared, scratch cached
        for _ in range(3):
            fq(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fq(static_x)
    new_x = sample([256, 512], 21)
    static_x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    # The replayed observer saw new_x: the quantization matches an eager call with the
    # qparams the replay left in the buffers.
    want = torch.fake_quantize_per_tensor_affine(new_x, fq.scale, fq.zero_point, 0, 255)
    assert_bits_equal(static_y, want, "replay")


def test_torch_compile_fullgraph():
    if not hasattr(torch, "compile"):
        pytest.skip("torch.compile needs torch >= 2.0")
    scale = torch.tensor([0.05], device=DEV)
    zp = torch.tensor([2], device=DEV, dtype=torch.int32)

    def step(x):
        return (qgt.fake_quantize_per_tensor_affine(x, scale, zp, 0, 255) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True)
    x = sample([128, 256], 30).requires_grad_()
    xe = x.detach().clone().requires_grad_()
    compiled(x).backward()
    step(xe).backward()
    assert_bits_equal(x.grad, xe.grad, "compiled grad")


def test_bad_inputs_raise():
    x = sample([4, 8], 40)
    with pytest.raises(qg.Error, match=r"'scale' is on cpu, the input on cuda"):
        qgt.fake_quantize_per_channel_affine(x, torch.ones(8), torch.zeros(8, dtype=torch.int32),
                                             1, 0, 255)
    with pytest.raises(qg.Error, match=r"expected 8 qparams, got 3"):
        qgt.fake_quantize_per_channel_affine(x, torch.ones(3, device=DEV),
                                             torch.zeros(3, device=DEV, dtype=torch.int32),
                                             1, 0, 255)
    with pytest.raises(qg.Error, match=r"group_size = 3 must divide"):
        qgt.fake_quantize_per_group(x, torch.ones(1, device=DEV),
                                    torch.zeros(1, device=DEV, dtype=torch.int32), 3, 0, 15)
    # A scale <= 0 is found on the device: recorded there, raised by check_errors.
    qgt.fake_quantize_per_tensor_affine(x, torch.tensor([-1.0], device=DEV), 0, 0, 255)
    with pytest.raises(qg.Error, match=r"scale"):
        qgt.check_errors()
    qgt.check_errors()  # cleared once raised
