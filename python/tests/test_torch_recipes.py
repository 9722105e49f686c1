"""The torchao recipes of qatgraph.torch.prepare_qat (8da4w, int4_weight_only, w8a8_dynamic) on
the CPU: qparams and fake-quantized values worked out by hand from torchao's formulas, the
straight-through gradient, training a small MLP, state_dicts that are the float model's, a
bit-exact convert, and errors that name the recipe and the values. Conformance against
torchao itself is test_torch_torchao_conformance.py (it needs torchao)."""
import copy
import io

import pytest

torch = pytest.importorskip("torch")

import qatgraph as qg  # noqa: E402
import qatgraph.torch as qgt  # noqa: E402
from torch import nn  # noqa: E402

TORCHAO_RECIPES = ("8da4w", "int4_weight_only", "w8a8_dynamic")
# torch 1.13 has no f16 clamp or matmul on the CPU; the conformance test covers f16 on CUDA.
DTYPES = (torch.float32, torch.bfloat16)
# Options that fit mlp()'s 64 input features (int4_weight_only's default group is 128).
OPTIONS = {"8da4w": {}, "int4_weight_only": {"group_size": 64}, "w8a8_dynamic": {}}


def bits(t):
    """The raw bits of a float tensor, so +0.0 and -0.0 differ."""
    return t.contiguous().view({torch.float32: torch.int32}.get(t.dtype, torch.int16))


def assert_bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(bits(a), bits(b))


def mlp(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64, bias=False),
                         nn.ReLU(), nn.Linear(64, 10)).to(dtype)


# ---- the recipes and their options ----

def test_the_recipes_and_their_default_options():
    assert set(qgt.RECIPES) == {"default", "8da4w", "int4_weight_only", "w8a8_dynamic"}
    assert qgt.GROUP_SIZES == (32, 64, 128, 256)
    r = qgt.RECIPES["8da4w"]
    assert r.modules == (nn.Linear,) and r.activation is None
    assert r.input().bits == 8 and r.weight().bits == 4 and r.weight().group_size == 32
    r = qgt.RECIPES["int4_weight_only"]
    assert r.input is None and r.activation is None and r.weight().group_size == 128
    r = qgt.RECIPES["w8a8_dynamic"]
    assert r.input().bits == 8 and r.weight().bits == 8 and r.weight().group_size is None
    assert qgt.recipe("8da4w", group_size=256).weight().group_size == 256
    assert qgt.recipe("int4_weight_only", group_size=32).weight().group_size == 32
    assert qgt.recipe("8da4w") is qgt.RECIPES["8da4w"]


def test_prepare_qat_passes_the_recipe_options():
    model = qgt.prepare_qat(mlp(), "8da4w", group_size=64)
    assert all(m.weight_fake_quant.group_size == 64 for m in model.modules()
               if isinstance(m, qgt.QATLinear))


@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_only_linear_layers_are_swapped(name):
    # torchao's QAT quantizers swap nn.Linear only; convolutions stay float.
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 4))
    prepared = qgt.prepare_qat(model, name, **OPTIONS[name])
    assert [type(m) for m in prepared] == [nn.Conv2d, nn.BatchNorm2d, nn.Flatten,
                                           qgt.QATLinear]
    assert prepared(torch.randn(2, 1, 6, 6)).shape == (2, 4)
    with pytest.raises(qg.Error, match=rf"nothing to quantize.*recipe '{name}' swaps "
                                       r"\['Linear'\]"):
        qgt.prepare_qat(nn.Sequential(nn.Conv2d(1, 4, 3)), name, **OPTIONS[name])


# ---- qparams and fake quantization, worked out by hand ----

def test_per_token_activation_qparams_and_values_by_hand():
    fq = qgt.PerTokenFakeQuantize()  # 8da4w's and w8a8_dynamic's input quantizer
    x = torch.tensor([[-1.0, 0.0, 0.5, 2.984375, 0.0078125, 0.0234375],
                      [0.25, 0.5, 1.0, 1.9921875, 0.01171875, 0.0],
                      [0.0] * 6])
    scale, zero_point = fq.qparams(x)
    # Row 0: range [-1, 2.984375] = 255/64, scale 1/64, zp = -128 - rint(-1 * 64) = -64.
    # Row 1: the range extended to 0: [0, 255/128], scale 1/128, zp = -128 - 0.
    # Row 2: all zeros: scale is the eps (f32 epsilon), zp = -128.
    assert scale.dtype == torch.float32 and zero_point.dtype == torch.int32
    assert scale.tolist() == [1 / 64, 1 / 128, torch.finfo(torch.float32).eps]
    assert zero_point.tolist() == [-64, -128, -128]
    # 0.0078125 = 0.5 * scale rounds half to even (to 0), 0.0234375 = 1.5 * scale to 2.
    assert fq(x).tolist() == [[-1.0, 0.0, 0.5, 2.984375, 0.0, 0.03125],
                              [0.25, 0.5, 1.0, 1.9921875, 0.015625, 0.0], [0.0] * 6]


def test_per_token_qparams_are_computed_in_the_input_dtype():
    # torchao computes (max - min) / 255 in the input's dtype: in bf16, 3 / 255 = 0.0117647...
    # rounds to 193 * 2^-14 (8 significant bits), then becomes an f32 scale.
    fq = qgt.PerTokenFakeQuantize()
    scale, zero_point = fq.qparams(torch.tensor([[-1.0, 2.0]], dtype=torch.bfloat16))
    assert scale.item() == 193 * 2 ** -14 and scale.dtype == torch.float32
    assert zero_point.item() == -128 + 85  # rint(-1 / scale) = rint(-84.89...) = -85
    scale32, _ = fq.qparams(torch.tensor([[-1.0, 2.0]]))
    assert scale32.item() == torch.tensor(3.0 / 255).item()
    # The zero point's quotient rounds in bf16 too: scale = bf16(1.3125 / 255) = 169 * 2^-15,
    # -0.3125 / scale = -60.59 rounds to -60.5 in bf16, which rounds half to even to -60
    # (in f32 it would be -61): zp = -128 + 60.
    scale, zero_point = fq.qparams(torch.tensor([[-0.3125, 1.0]], dtype=torch.bfloat16))
    assert scale.item() == 169 * 2 ** -15 and zero_point.item() == -68


def test_int4_group_symmetric_weight_qparams_and_values_by_hand():
    fq = qgt.RECIPES["8da4w"].weight()
    w = torch.zeros(1, 64)
    w[0, :6] = torch.tensor([7.5, -7.5, 2.5, 3.5, -0.5, 0.5])
    w[0, 32:36] = torch.tensor([15.0, -15.0, 5.0, -3.0])
    scale, zero_point = fq.qparams(w)
    # scale = amax / ((7 - -8) / 2) = amax / 7.5 per group of 32.
    assert scale.tolist() == [[1.0, 2.0]] and zero_point.tolist() == [[0, 0]]
    y = fq(w)
    # 7.5 -> rint 8 -> clamped to 7; -7.5 -> -8 (in range); halves round to even.
    assert y[0, :6].tolist() == [7.0, -8.0, 2.0, 4.0, 0.0, 0.0]
    assert y[0, 32:36].tolist() == [14.0, -16.0, 4.0, -4.0]
    assert y[0, 6:32].abs().sum() == 0 and y[0, 36:].abs().sum() == 0


def test_int8_per_channel_weight_qparams_and_values_by_hand():
    fq = qgt.RECIPES["w8a8_dynamic"].weight()
    w = torch.tensor([[127.5, -1.5, 0.5, 2.5], [-255.0, 3.0, 127.0, 1.0]])
    scale, zero_point = fq.qparams(w)
    assert scale.tolist() == [1.0, 2.0] and zero_point.tolist() == [0, 0]  # amax / 127.5
    assert fq(w).tolist() == [[127.0, -2.0, 0.0, 2.0], [-256.0, 4.0, 128.0, 0.0]]


def test_weight_scale_floor_is_the_dtypes_smallest_normal():
    fq = qgt.RECIPES["8da4w"].weight()
    for dtype in DTYPES:
        scale, _ = fq.qparams(torch.zeros(2, 32, dtype=dtype))
        assert scale.tolist() == [[torch.finfo(dtype).smallest_normal]] * 2


def test_int4_float_zero_point_qparams_and_values_by_hand():
    fq = qgt.recipe("int4_weight_only", group_size=32).weight()
    w = torch.zeros(1, 64)
    w[0, :6] = torch.tensor([-1.0, 14.0, 0.5, 1.5, 2.5, 0.0])
    w[0, 32:35] = torch.tensor([-0.3, 0.7, 0.0])
    scale, zero = fq.qparams(w)
    assert scale.dtype == zero.dtype == torch.bfloat16
    # Group 0: scale = (14 - -1) / 15 = 1, zero = min + 8 * scale = 7.
    # Group 1: scale = 1/15 in f32, rounded to bf16: 137 * 2^-11; zero = -0.3 + 8 * (1/15)
    # from the unrounded f32 scale (0.2333334), then rounded to bf16: 239 * 2^-10 (from the
    # rounded scale it would be 241 * 2^-10).
    assert scale.float().tolist() == [[1.0, 137 * 2 ** -11]]
    assert zero.float().tolist() == [[7.0, 239 * 2 ** -10]]
    y = fq(w)
    # q = rint((w - (zero - 8 * scale)) / scale): 0.5 -> rint(1.5) = 2 -> (2 - 8) + 7 = 1;
    # 1.5 -> rint(2.5) = 2 -> 1; 2.5 -> rint(3.5) = 4 -> 3.
    assert y[0, :6].tolist() == [-1.0, 14.0, 1.0, 1.0, 3.0, 0.0]
    # Group 1: zero - 8 * scale = -0.3017578125 rounds in bf16 to -0.30078125 (154 * 2^-9);
    # -0.3 -> q = 0; 0.7 -> q = 15 -> 7 * scale + zero; 0.0 -> q = rint(4.496) = 4.
    s, z = 137 * 2 ** -11, 239 * 2 ** -10
    assert y[0, 32:35].tolist() == [-8 * s + z, 7 * s + z, -4 * s + z]
    assert y[0, 32:35].tolist() == [-0.3017578125, 0.70166015625, -0.0341796875]


def test_float_zero_point_quantize_divides_by_the_scale():
    # torchao divides by the scale here (where the integer zero point multiplies by its
    # reciprocal). A group [0, 15 * s] with s = 223 * 2^-11 (exact in bf16): zero = 8 * s,
    # zero - 8 * s = 0, and w = 2.5 * s gives exactly 2.5, which rounds to even: q = 2,
    # w' = (2 - 8) * s + 8 * s = 2 * s. (w * (1 / s) is 2.5000002 and would give 3 * s.)
    fq = qgt.recipe("int4_weight_only", group_size=32).weight()
    s = 223 * 2 ** -11
    w = torch.zeros(1, 32)
    w[0, :2] = torch.tensor([15 * s, 2.5 * s])
    scale, zero = fq.qparams(w)
    assert scale.float().tolist() == [[s]] and zero.float().tolist() == [[8 * s]]
    assert fq(w)[0, :2].tolist() == [15 * s, 2 * s]


# ---- gradients ----

@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_weight_gradient_is_the_straight_through_mask(name):
    fq = qgt.recipe(name, **OPTIONS[name]).weight()
    w = torch.zeros(1, 64)
    # The symmetric scales put +amax at qmax + 0.5, which rounds to even past qmax and is
    # clamped (its gradient is 0); -amax lands on qmin. The float zero point clamps nothing
    # within the group's range.
    amax = {"8da4w": 7.5, "w8a8_dynamic": 127.5, "int4_weight_only": 7.5}[name]
    w[0, :4] = torch.tensor([amax, -amax, 2.5, 0.25])
    w = w.requires_grad_()
    dy = -torch.arange(1.0, 65.0).reshape(1, 64)
    fq(w).backward(dy)
    mask = torch.ones(1, 64)
    if name != "int4_weight_only":
        mask[0, 0] = 0.0
    want = dy * mask
    assert_bits_equal(w.grad, want)  # -0.0 where a negative dy meets a clamped element


def test_float_zero_point_gradient_masks_the_clamped_codes():
    fq = qgt.recipe("int4_weight_only", group_size=32).weight()
    w = torch.linspace(-1.0, 1.0, 64).reshape(1, 64).requires_grad_()
    dy = torch.randn(1, 64)
    fq(w).backward(dy)
    # Every element lies within its group's [min, max], so no code is clamped.
    assert_bits_equal(w.grad, dy * 1.0)
    codes, mask = qgt.dynamic_quantizers.float_zero_codes(
        torch.tensor([[0.0, 1.0] * 16]), torch.tensor([[0.01]], dtype=torch.bfloat16),
        torch.tensor([[0.0]], dtype=torch.bfloat16), 4, 32)
    assert mask.reshape(-1).tolist() == [True, False] * 16  # 1.0 / 0.01 + 8 is past 15
    assert codes.reshape(-1).tolist() == [8.0, 15.0] * 16


def test_per_token_gradient_is_the_straight_through_mask():
    fq = qgt.PerTokenFakeQuantize()
    x = torch.randn(3, 5, 16).requires_grad_()
    dy = torch.randn(3, 5, 16)
    fq(x).backward(dy)
    # The row's own range sets the qparams: nothing is clamped.
    assert_bits_equal(x.grad, dy * 1.0)


# ---- prepare_qat: training, state_dict, copies, switches ----

@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_prepared_mlp_trains(name):
    model = qgt.prepare_qat(mlp(), name, **OPTIONS[name])
    assert sum(isinstance(m, qgt.QATLinear) for m in model.modules()) == 3
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 64, generator=g)
    target = torch.randint(0, 10, (64,), generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.parameters())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_forward_is_the_fake_quantized_linear(name):
    model = qgt.prepare_qat(mlp(), name, **OPTIONS[name])
    layer = model[0]
    x = torch.randn(4, 7, 64)
    xq = x if layer.input_fake_quant is None else layer.input_fake_quant(x)
    want = nn.functional.linear(xq, layer.weight_fake_quant(layer.weight), layer.bias)
    assert_bits_equal(layer(x), want)
    assert not torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_state_dict_is_the_float_models_and_loads_both_ways(name):
    float_model = mlp()
    model = qgt.prepare_qat(float_model, name, **OPTIONS[name])
    # torchao's QAT linears keep no quantizer state either: checkpoints move both ways.
    assert list(model.state_dict()) == list(float_model.state_dict())
    other = mlp(seed=1)
    model.load_state_dict(other.state_dict())
    assert torch.equal(model[0].weight, other[0].weight)
    mlp(seed=2).load_state_dict(model.state_dict())


@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_prepared_model_copies_and_saves(name):
    model = qgt.prepare_qat(mlp(), name, **OPTIONS[name])
    x = torch.randn(3, 64)
    y = model(x)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    # torch >= 2.6 loads weights only unless told otherwise; 1.13 takes the flag too.
    for other in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        assert_bits_equal(other(x), y)


def test_fake_quant_switch():
    model = qgt.prepare_qat(mlp(), "8da4w")
    layer = model[0]
    x = torch.randn(3, 64)
    layer.weight_fake_quant.disable_fake_quant()
    layer.input_fake_quant.disable_fake_quant()
    assert_bits_equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
    layer.weight_fake_quant.enable_fake_quant()
    assert layer.weight_fake_quant.enabled
    assert not torch.equal(layer.weight_fake_quant(layer.weight), layer.weight)


# ---- convert ----

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_convert_equals_the_qat_forward_bit_for_bit(name, dtype):
    model = qgt.prepare_qat(mlp(dtype), name, **OPTIONS[name])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 64, dtype=dtype)).float().square().mean().backward()
    opt.step()  # trained weights, off the initial grid
    converted = qgt.convert(model)
    model.eval()
    for seed in range(3):
        x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(seed)).to(dtype)
        assert_bits_equal(converted(x), model(x))
    kinds = [type(m).__name__ for m in converted.modules()]
    assert kinds.count("ConvertedLinear") == 3 and "QATLinear" not in kinds


@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_convert_stores_integer_codes(name):
    model = qgt.prepare_qat(mlp(), name, **OPTIONS[name])
    converted = qgt.convert(model)
    state = converted.state_dict()
    codes = state["0.weight_quantized.int_data"]
    low, high, dtype, scale_dtype = {
        "8da4w": (-8, 7, torch.int8, torch.float32),
        "int4_weight_only": (0, 15, torch.uint8, torch.bfloat16),
        "w8a8_dynamic": (-128, 127, torch.int8, torch.float32)}[name]
    assert codes.dtype == dtype and codes.shape == (64, 64)
    assert low <= int(codes.min()) and int(codes.max()) <= high
    assert int(codes.min()) == low or int(codes.max()) == high  # the grid's ends are used
    assert state["0.weight_quantized.scale"].dtype == scale_dtype
    assert "0.weight" not in state and "0.bias" in state
    # The codes with their qparams are the QAT module's fake-quantized weight.
    assert_bits_equal(converted[0].dequantized_weight(),
                      model[0].weight_fake_quant(model[0].weight).detach())


def test_convert_of_a_disabled_weight_quantizer_keeps_the_float_weight():
    model = qgt.prepare_qat(mlp(), "8da4w")
    model[0].weight_fake_quant.disable_fake_quant()
    converted = qgt.convert(model)
    assert converted[0].weight_quantized is None
    assert_bits_equal(converted[0].weight, model[0].weight.detach())


# ---- bad inputs ----

def test_group_size_that_does_not_divide_in_features():
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 4))
    for name in ("8da4w", "int4_weight_only"):
        with pytest.raises(qg.Error, match=rf"recipe '{name}' \(group_size=32\): nn.Linear "
                                           r"'2' has in_features = 48, which group_size 32 "
                                           r"does not divide"):
            qgt.prepare_qat(model, name, group_size=32)
    with pytest.raises(qg.Error, match=r"recipe '8da4w' \(group_size=32\).*"
                                       r"in_features = 40"):
        qgt.QATLinear(40, 8, recipe=qgt.recipe("8da4w", group_size=32))
    # In a layer made otherwise, the quantizer itself says so.
    with pytest.raises(qg.Error, match=r"recipe '8da4w' weight quantizer: group_size = 32 "
                                       r"does not divide in_features = 40"):
        qgt.RECIPES["8da4w"].weight()(torch.randn(8, 40))


@pytest.mark.parametrize("value", [48, 16, 512, 0, -32, 32.0, "32", True, None])
def test_unknown_group_size(value):
    for name in ("8da4w", "int4_weight_only"):
        with pytest.raises(qg.Error, match=rf"recipe '{name}': group_size must be one of "
                                           rf"\[32, 64, 128, 256\], got {value!r}"):
            qgt.prepare_qat(mlp(), name, group_size=value)


def test_unknown_recipe_options():
    with pytest.raises(qg.Error, match=r"recipe 'w8a8_dynamic' takes the options \[\], got "
                                       r"\['group_size'\]"):
        qgt.prepare_qat(mlp(), "w8a8_dynamic", group_size=32)
    with pytest.raises(qg.Error, match=r"recipe '8da4w' takes the options \['group_size'\], "
                                       r"got \['groupsize'\]"):
        qgt.recipe("8da4w", groupsize=32)
    with pytest.raises(qg.Error, match=r"recipe options \['group_size'\] need a recipe name, "
                                       r"got a Recipe"):
        qgt.prepare_qat(mlp(), qgt.RECIPES["8da4w"], group_size=64)


@pytest.mark.parametrize("name", TORCHAO_RECIPES)
def test_non_float_weight_dtypes_are_rejected(name):
    model = qgt.prepare_qat(mlp(torch.float64), name, **OPTIONS[name])
    with pytest.raises(qg.Error, match=rf"recipe '{name}' (weight|activation) quantizer: the "
                                       r"(weight|input) has dtype torch.float64"):
        model(torch.randn(2, 64, dtype=torch.float64))


def test_a_non_finite_activation_row_raises():
    fq = qgt.PerTokenFakeQuantize()
    x = torch.randn(2, 8)
    x[1, 3] = float("inf")
    with pytest.raises(qg.Error, match="scale.* must be positive and finite"):
        fq(x)
