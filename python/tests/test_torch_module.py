"""qatgraph.torch.FakeQuantize as a drop-in for torch.ao.quantization.FakeQuantize: torch-style
construction, the same outputs, gradients and state_dict, reload, copy and pickle, torch's
module-level switches, torch.jit.trace."""
import copy
import io

import pytest

torch = pytest.importorskip("torch")

import qatgraph as qg  # noqa: E402
import qatgraph.torch as qgt  # noqa: E402
from torch.ao import quantization as tq  # noqa: E402

# Constructor arguments accepted alike by torch.ao's FakeQuantize and ours.
CONFIGS = {
    "default_act": dict(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                        dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=True),
    "minmax_sym_qint8": dict(observer=tq.MinMaxObserver, quant_min=-128, quant_max=127,
                             dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
    "sym_quint8_custom": dict(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                              dtype=torch.quint8, qscheme=torch.per_tensor_symmetric),
    "sym_quint8_default": dict(observer=tq.MovingAverageMinMaxObserver, dtype=torch.quint8,
                               qscheme=torch.per_tensor_symmetric, averaging_constant=0.1),
    "per_channel_weight": dict(observer=tq.MovingAveragePerChannelMinMaxObserver,
                               quant_min=-128, quant_max=127, dtype=torch.qint8,
                               qscheme=torch.per_channel_symmetric, ch_axis=0),
    "per_channel_minmax_affine": dict(observer=tq.PerChannelMinMaxObserver, quant_min=0,
                                      quant_max=15, dtype=torch.quint8,
                                      qscheme=torch.per_channel_affine, ch_axis=1),
}


def batch(step, shape=(16, 8)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(step)) * (step + 1)


def forward_backward(module, x, seed):
    x = x.clone().requires_grad_(True)
    y = module(x)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))
    (y * w).sum().backward()
    return y.detach(), x.grad


def bits_equal(a, b):
    return a.dtype == b.dtype and torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_torch_style_construction_matches_torch_ao(name):
    ref, mine = tq.FakeQuantize(**CONFIGS[name]), qgt.FakeQuantize(**CONFIGS[name])
    assert isinstance(mine, tq.FakeQuantizeBase)
    for step in range(4):
        x = batch(step)
        want_y, want_dx = forward_backward(ref, x, step)
        got_y, got_dx = forward_backward(mine, x, step)
        assert torch.equal(mine.scale, ref.scale), (name, step)
        assert torch.equal(mine.zero_point, ref.zero_point), (name, step)
        assert bits_equal(got_y, want_y), (name, step)
        assert bits_equal(got_dx, want_dx), (name, step)
    assert set(mine.state_dict()) == set(ref.state_dict())
    for key, value in ref.state_dict().items():
        assert torch.equal(mine.state_dict()[key], value), (name, key)
    want, got = ref.calculate_qparams(), mine.calculate_qparams()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_reload_is_identical_after_disable_observer():
    a = qgt.FakeQuantize(**CONFIGS["default_act"])
    for step in range(3):
        a(batch(step))
    b = qgt.FakeQuantize(**CONFIGS["default_act"])
    b.load_state_dict(a.state_dict())
    a.disable_observer()
    b.disable_observer()
    x = batch(7) * 3
    assert torch.equal(a(x), b(x))
    # The same checkpoint loads into torch.ao's module and gives the same outputs.
    ref = tq.FakeQuantize(**CONFIGS["default_act"])
    ref.load_state_dict(a.state_dict())
    ref.disable_observer()
    assert torch.equal(ref(x), a(x))


def test_per_channel_reload_resizes_qparams():
    a = qgt.FakeQuantize(**CONFIGS["per_channel_weight"])
    a(batch(0))
    b = qgt.FakeQuantize(**CONFIGS["per_channel_weight"])
    b.load_state_dict(a.state_dict())
    b.disable_observer()
    a.disable_observer()
    assert b.scale.shape == (16,)
    assert torch.equal(a(batch(1)), b(batch(1)))


def test_user_scale_is_honoured_with_the_observer_off():
    fq = qgt.FakeQuantize(**CONFIGS["default_act"])
    fq.disable_observer()
    fq.scale.fill_(0.5)
    fq.zero_point.fill_(3)
    x = batch(2)
    assert torch.equal(fq(x), torch.fake_quantize_per_tensor_affine(x, 0.5, 3, 0, 127))
    assert fq.scale.item() == 0.5


def test_deepcopy_and_pickle_after_forward():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), qgt.FakeQuantize(**CONFIGS["default_act"]))
    model(batch(0))
    clone = copy.deepcopy(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False) if _has_weights_only() else torch.load(buffer)
    for m in (model, clone, loaded):
        m.apply(tq.disable_observer)
    x = batch(3)
    assert torch.equal(clone(x), model(x)) and torch.equal(loaded(x), model(x))


def _has_weights_only():
    import inspect
    return "weights_only" in inspect.signature(torch.load).parameters


def test_module_switches_of_torch_ao_apply():
    model = torch.nn.Sequential(qgt.FakeQuantize(**CONFIGS["default_act"]))
    fq = model[0]
    model.apply(tq.disable_observer)
    assert fq.observer_enabled.item() == 0
    model.apply(tq.enable_observer)
    assert fq.observer_enabled.item() == 1
    model.apply(tq.disable_fake_quant)
    assert fq.fake_quant_enabled.item() == 0
    x = batch(1)
    assert torch.equal(fq(x), x)
    model.apply(tq.enable_fake_quant)
    assert fq.fake_quant_enabled.item() == 1


def test_with_args_in_a_torch_qconfig():
    qconfig = tq.QConfig(activation=qgt.FakeQuantize.with_args(**CONFIGS["default_act"]),
                         weight=qgt.FakeQuantize.with_args(**CONFIGS["per_channel_weight"]))
    act, weight = qconfig.activation(), qconfig.weight()
    assert isinstance(act, qgt.FakeQuantize) and isinstance(weight, qgt.FakeQuantize)
    assert act.qscheme == torch.per_tensor_affine and weight.ch_axis == 0
    assert (act.quant_min, act.quant_max) == (0, 127)  # reduce_range, as torch.ao


def test_bad_construction_raises_qatgraph_error():
    with pytest.raises(qg.Error, match=r"quant_min.*5.*quant_max.*4"):
        qgt.FakeQuantize(quant_min=5, quant_max=4)
    with pytest.raises(qg.Error, match=r"qscheme"):
        qgt.FakeQuantize(observer=tq.PerChannelMinMaxObserver,
                         qscheme=torch.per_channel_affine_float_qparams)


def test_jit_trace_gives_a_savable_module():
    fq = qgt.FakeQuantize(**CONFIGS["default_act"])
    fq(batch(0))
    fq.disable_observer()
    traced = torch.jit.trace(fq, batch(1))
    x = batch(2)
    assert torch.equal(traced(x), fq(x))
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    fn = torch.jit.trace(lambda v: qgt.fake_quantize_per_tensor_affine(v, 0.1, 3, 0, 255), x)
    assert torch.equal(fn(x * 2), torch.fake_quantize_per_tensor_affine(x * 2, 0.1, 3, 0, 255))


def test_kept_kernels_follow_switches_loads_and_copies():
    # From its second call on, FakeQuantize runs kernels it kept with the buffers' pointers;
    # switching the observer off, loading another module's state and copying the module must
    # each give torch.ao's results as the full path does.
    from torch.ao.quantization import FakeQuantize as TorchFakeQuantize
    cfg = CONFIGS["default_act"]
    ours, theirs = qgt.FakeQuantize(**cfg), TorchFakeQuantize(**cfg)
    other = TorchFakeQuantize(**cfg)
    other(batch(50) * 4)

    def step(k):
        x = batch(k)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = ours(xa), theirs(xb)
        ya.backward(torch.ones_like(ya))
        yb.backward(torch.ones_like(yb))
        for a, b, what in ((ya, yb, "output"), (xa.grad, xb.grad, "grad"),
                           (ours.scale, theirs.scale, "scale")):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (k, what)
        assert torch.equal(ours.zero_point, theirs.zero_point), k

    for k in range(3):
        step(k)
    ours.disable_observer()
    theirs.disable_observer()
    step(3)
    step(4)
    ours.load_state_dict(other.state_dict())
    theirs.load_state_dict(other.state_dict())
    ours.enable_observer()
    theirs.enable_observer()
    step(5)
    step(6)
    ours = copy.deepcopy(ours)
    step(7)
    step(8)
