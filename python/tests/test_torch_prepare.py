"""qatgraph.torch.prepare_qat / convert against torch.ao's eager prepare_qat (PyTorch 1.13):
the same modules and state_dict keys, the same training steps bit for bit, checkpoints both
ways, copies, torch.ao's switches, a bit-exact convert, and errors that name the problem."""
import copy
import io
import pathlib
import re
import warnings

import pytest

torch = pytest.importorskip("torch")

import qatgraph as qg  # noqa: E402
import qatgraph.torch as qgt  # noqa: E402
from torch import nn  # noqa: E402
from torch.ao import quantization as tq  # noqa: E402
import torch.nn.intrinsic.qat as nniqat  # noqa: E402

# torch.ao's default fbgemm QAT qconfig built from torch.ao.quantization.FakeQuantize and the
# observers the "default" recipe names. (version=1, torch 1.13's default, builds the same
# observers into FusedMovingAvgObsFakeQuantize, whose C++ qparams differ from its own Python
# observers': see test_torch_default_version_1_differs_only_in_its_fused_qparams.)
TORCH_QCONFIG = tq.get_default_qat_qconfig("fbgemm", version=0)


class CNN(nn.Module):
    """conv-bn-relu and conv-bn (both fused), conv-relu (not fused), linear, quant stubs."""

    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8),
            nn.Conv2d(8, 4, 3), nn.ReLU())
        self.fc = nn.Linear(4 * 2 * 2, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.features(self.quant(x))
        return self.dequant(self.fc(torch.flatten(x, 1)))


CNN_FUSED = [["features.0", "features.1", "features.2"], ["features.3", "features.4"]]


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 10))


MODELS = {"cnn": (CNN, CNN_FUSED, (6, 3, 8, 8)), "mlp": (mlp, [], (12, 16))}


def models(name, seed=0, qconfig=TORCH_QCONFIG, recipe="default"):
    """(ours, torch.ao's) prepared from the same float model."""
    make, fuse, shape = MODELS[name]
    torch.manual_seed(seed)
    float_model = make()
    # Non-trivial running statistics and BN affine parameters, so folding is exercised.
    with torch.no_grad():
        for m in float_model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    theirs = copy.deepcopy(float_model)
    theirs.qconfig = qconfig
    if fuse:
        tq.fuse_modules_qat(theirs, fuse, inplace=True)
    return qgt.prepare_qat(float_model, recipe), tq.prepare_qat(theirs), shape


def batch(shape, step):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(100 + step)) * 2


def bits(t):
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def assert_bits_equal(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    assert torch.equal(bits(a), bits(b)), (what, (a.double() - b.double()).abs().max())


def assert_state_equal(ours, theirs):
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert_bits_equal(a[key], b[key], key)


def step(model, opt, x, seed):
    opt.zero_grad()
    y = model(x)
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(seed))).sum().backward()
    opt.step()
    return y.detach()


def train_in_lockstep(ours, theirs, shape, steps=4):
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (ours, theirs)]
    for s in range(steps):
        x = batch(shape, s)
        grads = []
        for model, opt in zip((ours, theirs), opts):
            out = step(model, opt, x, s)
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            grads[-1]["out"] = out
        assert list(grads[0]) == list(grads[1])
        for key in grads[0]:
            assert_bits_equal(grads[0][key], grads[1][key], (s, key))
        assert_state_equal(ours, theirs)  # observers' min/max, scale, zero_point, BN stats


def observers_off_eval(*models_):
    for m in models_:
        m.apply(tq.disable_observer)
        m.eval()


# --- module swap ------------------------------------------------------------------------


def test_swapped_modules_and_state_dict_keys_are_torch_aos():
    ours, theirs, _ = models("cnn")
    f = ours.features
    assert isinstance(f[0], qgt.QATConvBn2d) and f[0].relu
    assert isinstance(f[3], qgt.QATConvBn2d) and not f[3].relu
    assert isinstance(f[1], nn.Identity) and isinstance(f[2], nn.Identity)
    assert isinstance(f[5], qgt.QATConv2d) and isinstance(f[6], nn.ReLU)
    assert isinstance(ours.fc, qgt.QATLinear)
    assert isinstance(ours.fc.weight_fake_quant, qgt.FakeQuantize)
    assert isinstance(ours.quant.activation_post_process, qgt.FakeQuantize)
    assert not hasattr(ours.dequant, "activation_post_process")
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for key in ("fc.weight_fake_quant.scale", "fc.activation_post_process.scale",
                "features.0.bn.running_var",
                "features.0.activation_post_process.activation_post_process.min_val"):
        assert key in ours.state_dict()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_steps_match_torch_ao_bit_for_bit(name):
    ours, theirs, shape = models(name)
    train_in_lockstep(ours, theirs, shape)
    # Then in eval mode: running statistics and the trained qparams, observers still on.
    ours.eval(), theirs.eval()
    x = batch(shape, 50)
    assert_bits_equal(ours(x), theirs(x), "eval")
    assert_state_equal(ours, theirs)


def test_qat_modules_match_torch_ao_with_torch_quantizers_too():
    # A QConfig as the recipe: the QAT modules' own arithmetic (BN folding included) is
    # torch.ao's whichever quantizer runs inside.
    ours, theirs, shape = models("cnn", recipe=TORCH_QCONFIG)
    assert type(ours.fc.weight_fake_quant) is tq.FakeQuantize
    train_in_lockstep(ours, theirs, shape, steps=3)


def test_observed_outputs_and_qconfig_none_match_torch_ao():
    def make():
        torch.manual_seed(3)
        m = nn.Sequential(tq.QuantStub(), nn.Conv2d(3, 4, 1), nn.ReLU6(), nn.BatchNorm2d(4),
                          nn.Flatten(), nn.LayerNorm(64), nn.Linear(64, 8), nn.Hardswish(),
                          nn.Linear(8, 4))
        m[8].qconfig = None  # torch.ao's way to keep a layer float
        return m
    ours = qgt.prepare_qat(make())
    theirs = make()
    theirs.qconfig = TORCH_QCONFIG
    theirs = tq.prepare_qat(theirs)
    assert type(ours[8]) is nn.Linear and type(ours[3]) is nn.BatchNorm2d
    assert isinstance(ours[3].activation_post_process, qgt.FakeQuantize)
    train_in_lockstep(ours, theirs, (5, 3, 4, 4), steps=3)


def test_observed_leaves_get_their_quantizer_on_their_device():
    # A model moved to its device before prepare_qat (a CUDA ResNet) must get its observed
    # leaves' quantizers there too; they were built on the CPU, and the first forward raised
    # "the observer's statistics are on cpu, the input on cuda:0". The meta device stands in
    # for CUDA here: any device other than the CPU shows the placement. The batch norm follows
    # a ReLU (so it is not fused into the conv); the ReLU6 has no tensors and takes the model's.
    m = nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(), nn.BatchNorm2d(4), nn.ReLU6(), nn.Flatten(),
                      nn.LayerNorm(64), nn.Linear(64, 8)).to("meta")
    qat = qgt.prepare_qat(m)
    for leaf in (qat[2], qat[3], qat[5]):
        tensors = list(leaf.activation_post_process.buffers())
        assert tensors and all(t.device.type == "meta" for t in tensors), type(leaf).__name__


def test_default_recipe_is_torch_aos_default_qat_qconfig():
    recipe = qgt.RECIPES["default"]
    for ours, theirs in ((recipe.weight(), TORCH_QCONFIG.weight()),
                         (recipe.activation(), TORCH_QCONFIG.activation())):
        a, b = ours.activation_post_process, theirs.activation_post_process
        assert type(a) is type(b)
        for attr in ("quant_min", "quant_max", "dtype", "qscheme", "reduce_range", "eps",
                     "averaging_constant", "ch_axis"):
            assert getattr(a, attr, None) == getattr(b, attr, None), attr
        assert (ours.quant_min, ours.quant_max) == (theirs.quant_min, theirs.quant_max)


def test_observed_outputs_cover_torch_aos_propagation_list():
    from torch.ao.quantization.quantization_mappings import (
        get_default_qconfig_propagation_list)
    import torch.nn.intrinsic as nni
    swapped = {nn.Linear, nn.Conv2d, nni.ConvBn2d, nni.ConvBnReLU2d, nni.ConvReLU2d,
               nni.LinearReLU}
    # Not observed by torch.ao either (Dropout, DeQuantStub, containers), or needing their
    # own quantized modules (RNNs, embeddings, FloatFunctional, 1d/3d fused and QAT kinds).
    left = {c for c in get_default_qconfig_propagation_list()
            if c not in swapped and c not in qgt.recipes.TORCH_AO_OBSERVED_OUTPUTS}
    allowed = (nn.Dropout, tq.DeQuantStub, nn.Sequential, nn.RNNBase, nn.RNNCellBase,
               nn.Embedding, nn.EmbeddingBag, torch.nn.quantized.FloatFunctional,
               torch.nn.intrinsic._FusedModule, nn.modules.linear.NonDynamicallyQuantizableLinear)
    qat_kinds = ("torch.ao.nn.qat", "torch.nn.qat", "torch.nn.intrinsic.qat")
    unexpected = [c for c in left if not issubclass(c, allowed)
                  and not c.__module__.startswith(qat_kinds)]
    assert unexpected == []


def test_inplace_shares_parameters_with_an_existing_optimizer():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared = qgt.prepare_qat(model, inplace=True)
    assert prepared is model and isinstance(model[0], qgt.QATLinear)
    before = model[0].weight.detach().clone()
    step(model, opt, batch((4, 16), 0), 0)
    assert not torch.equal(before, model[0].weight)


def test_not_inplace_leaves_the_float_model_alone_and_a_bare_linear_is_swapped():
    model = mlp()
    prepared = qgt.prepare_qat(model)
    assert type(model[0]) is nn.Linear and isinstance(prepared[0], qgt.QATLinear)
    assert isinstance(qgt.prepare_qat(nn.Linear(3, 2)), qgt.QATLinear)


# --- checkpoints and copies -------------------------------------------------------------


@pytest.mark.parametrize("direction", ["ours_to_theirs", "theirs_to_ours"])
def test_state_dict_moves_both_ways(direction):
    ours, theirs, shape = models("cnn")
    source, target = (ours, theirs) if direction == "ours_to_theirs" else (theirs, ours)
    opt = torch.optim.SGD(source.parameters(), lr=0.05)
    for s in range(3):
        step(source, opt, batch(shape, s), s)
    target.load_state_dict(source.state_dict(), strict=True)
    assert_state_equal(ours, theirs)
    observers_off_eval(ours, theirs)
    x = batch(shape, 9)
    assert_bits_equal(ours(x), theirs(x), direction)


def test_torch_default_version_1_differs_only_in_its_fused_qparams():
    # torch 1.13's get_default_qat_qconfig("fbgemm") (version=1) runs the same observers inside
    # FusedMovingAvgObsFakeQuantize, whose C++ qparams are not its Python observers': the
    # symmetric per-channel weight scale is max(-min / 128, max / 127) rather than
    # max(-min, max) / 127.5, and the activation scale can differ by an ulp. Training steps
    # therefore cannot match; with the qparams exchanged through the state_dict and the
    # observers off, fake quantization is the same op and the outputs agree bit for bit.
    ours, theirs, shape = models("cnn", qconfig=tq.get_default_qat_qconfig("fbgemm"))
    opt = torch.optim.SGD(theirs.parameters(), lr=0.05)
    for s in range(3):
        step(theirs, opt, batch(shape, s), s)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    observers_off_eval(ours, theirs)
    x = batch(shape, 9)
    assert_bits_equal(ours(x), theirs(x), "version 1")
    theirs.load_state_dict(ours.state_dict(), strict=True)


def _torch_load(buffer):
    import inspect
    if "weights_only" in inspect.signature(torch.load).parameters:
        return torch.load(buffer, weights_only=False)
    return torch.load(buffer)


def test_deepcopy_and_torch_save_load_of_a_prepared_model():
    ours, _, shape = models("cnn")
    opt = torch.optim.SGD(ours.parameters(), lr=0.05)
    for s in range(2):
        step(ours, opt, batch(shape, s), s)
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    copies = [copy.deepcopy(ours), _torch_load(buffer)]
    x = batch(shape, 7)
    for clone in copies:
        assert_state_equal(clone, ours)
    # Training on: the observers and the QuantStub's output hook run in every copy alike.
    outs = [m(x) for m in [ours] + copies]
    for out in outs[1:]:
        assert_bits_equal(out, outs[0], "copy")
    for clone in copies:
        assert_state_equal(clone, ours)
    # A reloaded model converts as the original: its QuantStub's hook is recognised.
    converted = [qgt.convert(m.apply(tq.disable_observer)) for m in [ours] + copies]
    for c in converted:
        assert isinstance(c.quant.activation_post_process, qgt.FrozenFakeQuantize)
        assert_bits_equal(c(x), converted[0](x), "converted copy")


# --- torch.ao's switches ----------------------------------------------------------------


def test_disable_observer_freezes_qparams():
    ours, theirs, shape = models("mlp")
    train_in_lockstep(ours, theirs, shape, steps=2)
    for m in (ours, theirs):
        m.apply(tq.disable_observer)
    frozen = {k: v.clone() for k, v in ours.state_dict().items() if k.endswith("scale")}
    train_in_lockstep(ours, theirs, shape, steps=2)
    for key, value in frozen.items():
        assert torch.equal(ours.state_dict()[key], value), key
    assert all(m.observer_enabled.item() == 0 for m in ours.modules()
               if isinstance(m, qgt.FakeQuantize))


def test_freeze_and_update_bn_stats():
    ours, theirs, shape = models("cnn")
    ours.apply(qgt.freeze_bn_stats)
    theirs.apply(nniqat.freeze_bn_stats)
    ours.train(), theirs.train()  # train() must not unfreeze
    assert ours.features[0].freeze_bn and not ours.features[0].bn.training
    stats = ours.features[0].bn.running_mean.clone()
    train_in_lockstep(ours, theirs, shape, steps=2)
    assert torch.equal(ours.features[0].bn.running_mean, stats)
    # qatgraph's switch handles torch.ao's modules too.
    ours.apply(qgt.update_bn_stats)
    theirs.apply(qgt.update_bn_stats)
    assert ours.features[0].bn.training and theirs.features[0].bn.training
    train_in_lockstep(ours, theirs, shape, steps=2)
    assert not torch.equal(ours.features[0].bn.running_mean, stats)


# --- convert ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODELS))
def test_convert_is_bit_exact(name):
    prepared, _, shape = models(name)
    opt = torch.optim.SGD(prepared.parameters(), lr=0.05)
    for s in range(3):
        step(prepared, opt, batch(shape, s), s)
    prepared.apply(tq.disable_observer)
    converted = qgt.convert(prepared)
    assert not converted.training
    assert any(isinstance(m, qgt.QATLinear) for m in prepared.modules())  # not in place
    kinds = {type(m) for m in converted.modules()}
    assert not kinds & {qgt.QATLinear, qgt.QATConv2d, qgt.QATConvBn2d, qgt.FakeQuantize}
    prepared.eval()
    for s in range(3):
        x = batch(shape, 20 + s) * (s + 1)
        want = prepared(x)
        got = converted(x)
        assert_bits_equal(got, want, (name, s))
        # No training-mode behaviour left: batch norm runs on its frozen statistics.
        assert_bits_equal(converted.train()(x), want, (name, s, "train()"))
        converted.eval()
    for m in converted.modules():
        if isinstance(m, (qgt.ConvertedLinear, qgt.ConvertedConv2d, qgt.ConvertedConvBn2d)):
            assert m.weight_int.dtype == torch.int8 and m.weight_axis == 0
            assert isinstance(m.output_quant, qgt.FrozenFakeQuantize)


def test_convert_affine_per_tensor_weights_groups_and_padding_modes():
    # Non-zero weight zero points (uint8 codes), per-tensor weight qparams, grouped convs and
    # the padding modes the converted conv must repeat.
    recipe = qgt.Recipe("affine", weight=qgt.FakeQuantize.with_args(
        observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
        dtype=torch.quint8, qscheme=torch.per_tensor_affine),
        activation=qgt.recipes.DEFAULT_ACTIVATION)
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1, padding_mode="reflect"),
                          nn.BatchNorm2d(4),
                          nn.Conv2d(4, 4, 3, padding=1, padding_mode="circular", groups=2),
                          nn.Flatten(), nn.Linear(64, 3))
    prepared = qgt.prepare_qat(model, recipe)
    opt = torch.optim.SGD(prepared.parameters(), lr=0.05)
    shape = (5, 2, 4, 4)
    for s in range(3):
        step(prepared, opt, batch(shape, s), s)
    prepared.apply(tq.disable_observer)
    converted = qgt.convert(prepared)
    prepared.eval()
    x = batch(shape, 11)
    assert_bits_equal(converted(x), prepared(x), "affine")
    for m in (converted[0], converted[2], converted[4]):
        assert m.weight_int.dtype == torch.uint8 and m.weight_axis is None
        assert m.weight_zero_point.item() not in (0, 128)


def test_convert_keeps_switched_off_quantizers_off():
    prepared, _, shape = models("cnn")
    step(prepared, torch.optim.SGD(prepared.parameters(), lr=0.05), batch(shape, 0), 0)
    prepared.apply(tq.disable_observer)
    prepared.fc.weight_fake_quant.disable_fake_quant()
    prepared.fc.activation_post_process.disable_fake_quant()
    converted = qgt.convert(prepared)
    assert converted.fc.weight_int is None and isinstance(converted.fc.output_quant,
                                                          nn.Identity)
    prepared.eval()
    x = batch(shape, 3)
    assert_bits_equal(converted(x), prepared(x), "fake quant off")


def test_converted_model_copies_and_traces():
    prepared, _, shape = models("cnn")
    step(prepared, torch.optim.SGD(prepared.parameters(), lr=0.05), batch(shape, 0), 0)
    prepared.apply(tq.disable_observer)
    converted = qgt.convert(prepared)
    x = batch(shape, 4)
    buffer = io.BytesIO()
    torch.save(converted, buffer)
    buffer.seek(0)
    assert_bits_equal(_torch_load(buffer)(x), converted(x), "saved")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's constant-tensor notes
        traced = torch.jit.trace(converted, x)
    assert_bits_equal(traced(batch(shape, 5)), converted(batch(shape, 5)), "traced")


# --- bad input --------------------------------------------------------------------------


def test_unknown_recipe_name():
    with pytest.raises(qg.Error, match=r"unknown recipe 'w3a3'.*"
                       r"\['8da4w', 'default', 'int4_weight_only', 'w8a8_dynamic'\]"):
        qgt.prepare_qat(mlp(), "w3a3")
    assert issubclass(qg.Error, ValueError)


def test_recipe_of_the_wrong_type():
    with pytest.raises(qg.Error, match=r"recipe must be .*got int: 8"):
        qgt.prepare_qat(mlp(), 8)
    with pytest.raises(qg.Error, match=r"Recipe 'x': 'weight' must be a callable.*got str"):
        qgt.Recipe("x", weight="per_channel")
    with pytest.raises(qg.Error, match=r"modules may be nn.Linear and nn.Conv2d, got "
                                       r"\['Conv1d'\]"):
        qgt.Recipe("x", weight=qgt.recipes.DEFAULT_WEIGHT, modules=(nn.Conv1d,))
    bad = qgt.Recipe("x", weight=lambda: 0.5)
    with pytest.raises(qg.Error, match=r"recipe 'x': its weight factory returned a float"):
        qgt.prepare_qat(mlp(), bad)
    import torch.nn.intrinsic as nni
    fused = nn.Sequential(nni.ConvBn2d(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2, affine=False)))
    with pytest.raises(qg.Error, match=r"fused ConvBn2d '0' cannot fold.*affine=False"):
        qgt.prepare_qat(fused)
    # Unfused, a conv and a non-affine batch norm stay apart: the conv alone is swapped.
    apart = qgt.prepare_qat(nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2, affine=False)))
    assert isinstance(apart[0], qgt.QATConv2d) and type(apart[1]) is nn.BatchNorm2d
    with pytest.raises(qg.Error, match=r"model must be a torch.nn.Module, got dict"):
        qgt.prepare_qat({"fc": nn.Linear(2, 2)})


def test_nothing_to_swap_is_an_error():
    # An error rather than torch.ao's warning: training on would fine-tune a float model that
    # the user believes is quantized.
    with pytest.raises(qg.Error, match=r"nothing to quantize in Sequential: recipe 'default' "
                                       r"swaps \['Linear', 'Conv2d'\].*'Flatten', 'ReLU'"):
        qgt.prepare_qat(nn.Sequential(nn.ReLU(), nn.Flatten()))
    excluded = mlp()
    excluded.qconfig = None
    with pytest.raises(qg.Error, match="qconfig = None"):
        qgt.prepare_qat(excluded)
    with pytest.raises(qg.Error, match=r"prepared already.*QATLinear"):
        qgt.prepare_qat(qgt.prepare_qat(mlp()))
    # A model torch.ao prepared already: its QAT modules are not swapped again, its
    # QuantStub keeps its one quantizer.
    _, theirs, _ = models("cnn")
    with pytest.raises(qg.Error, match=r"nothing to quantize in CNN.*'ConvBnReLU2d'"):
        qgt.prepare_qat(theirs)
    theirs.head = nn.Linear(10, 2)
    mixed = qgt.prepare_qat(theirs)
    assert isinstance(mixed.head, qgt.QATLinear) and len(mixed.quant._forward_hooks) == 1
    with pytest.raises(qg.Error, match=r"convert: Sequential holds no qatgraph QAT module"):
        qgt.convert(mlp())


# --- README -----------------------------------------------------------------------------


def test_readme_prepare_qat_example_runs():
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "prepare_qat" in b]
    assert len(blocks) == 1
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert isinstance(scope["model"][4], qgt.QATLinear)
    assert torch.equal(scope["y"], scope["y_int"])
