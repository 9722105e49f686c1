"""The torchao recipes of qatgraph.torch.prepare_qat against torchao 0.18's own QAT modules,
bit for bit: the qparams, the fake-quantized activations and weights, and the whole QAT
Linear's forward, in f32, bf16 and f16, on CUDA when there is one, else on the CPU. Gradients
agree within the rounding of torchao's differentiated composition (see assert_grad_close).
The engine's recipes (qatgraph.nn.parse_recipe: the dynamic_fake_quantize nodes its Builder
puts on every Linear's weight and input, QConfig.dynamic_weight_attrs /
dynamic_activation_attrs) against torchao's fake quantizers the same way, bit for bit
(test_engine_recipe_*), the Llama token embedding's quantizer against torchao's embedding
QAT (test_engine_embedding_fake_quant), and the engine's learned ranges (lsq_fake_quantize,
grad_factor 1) against torchao's range learning (test_engine_learned_ranges_*).
Skipped where torchao cannot be imported (it needs a recent torch: Debian's 1.13 is too old).

Run it on the GPU machine (torch 2.11), with torchao's wheel unzipped, not installed, from the
repository root:

    python3 -m zipfile -e .gpudeps/wheels/torchao-0.18.0-*.whl .gpudeps/torchao
    PYTHONPATH=build-gpu/python:.gpudeps/torchao python3 -m pytest -q -rs \
        python/tests/test_torch_torchao_conformance.py

(`pip download torchao==0.18.0 --no-deps -d .gpudeps/wheels` fetches the wheel, the
cp310-abi3 manylinux one; build-gpu is the build tree of scripts/gpu_suite.sh: any build
with the Python module will do; CUDA_VISIBLE_DEVICES= runs it on the CPU.)
"""
import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

try:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torchao
        from torchao.quantization.qat import (
            FakeQuantizedEmbedding,
            FakeQuantizedLinear,
            Int4WeightOnlyEmbeddingQATQuantizer,
            Int4WeightOnlyQATQuantizer,
            Int8DynActInt4WeightQATQuantizer,
            IntxFakeQuantizeConfig,
        )
except Exception as error:  # an old torch fails inside torchao with other errors too
    pytest.skip(f"torchao cannot be imported: {error!r}", allow_module_level=True)

import qatgraph.nn as qgn  # noqa: E402
import qatgraph.torch as qgt  # noqa: E402
from qatgraph.torch import _kernels  # noqa: E402
from torch import nn  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GROUP_SIZES = (32, 64, 128, 256)
IN_FEATURES, OUT_FEATURES = 256, 48  # torchao's int4 QAT linear wants in_features % 128 == 0


def test_the_torchao_under_test():
    assert torchao.__version__.startswith("0.18"), torchao.__version__


def bits(t):
    return t.contiguous().view({torch.float32: torch.int32}.get(t.dtype, torch.int16))


def assert_bits_equal(ours, theirs, what):
    assert ours.dtype == theirs.dtype, (what, ours.dtype, theirs.dtype)
    assert ours.shape == theirs.shape, (what, ours.shape, theirs.shape)
    differ = bits(ours) != bits(theirs)
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {differ.numel()} elements differ, first at "
        f"{differ.nonzero()[0].tolist()}: ours {ours[differ][0].item()!r}, torchao's "
        f"{theirs[differ][0].item()!r}")


def assert_grad_close(ours, theirs, scale, dtype, what):
    """Ours is dy * mask exactly; torchao's is dy * scale, rounded to the tensor's dtype (to a
    subnormal, or to zero, where the product is that small), times 1 / scale (or / scale),
    rounded again. So |ours - theirs| <= rtol * |theirs| + 2 * (smallest subnormal) / scale,
    with `scale` broadcast to the gradient (None: no quantizer, the gradients are equal)."""
    if scale is None:
        assert_bits_equal(ours, theirs, what)
        return
    rtol = {torch.float32: 1e-6, torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}[dtype]
    subnormal = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    ours, theirs = ours.double(), theirs.double()
    bound = rtol * theirs.abs() + 2 * subnormal / scale.double()
    excess = (ours - theirs).abs() - bound
    assert (excess <= 0).all(), (
        f"{what}: {int((excess > 0).sum())} elements past the bound, worst at "
        f"{excess.argmax().item()}: ours {ours.flatten()[excess.argmax()].item()!r}, "
        f"torchao's {theirs.flatten()[excess.argmax()].item()!r}")
    # The masks agree: where ours is 0 (a clamped element), torchao's is 0 too.
    assert (theirs[ours == 0] == 0).all(), what


def weight_scale_per_element(quantizer, w):
    """The weight quantizer's scale of each element of w (as f32)."""
    scale = quantizer.qparams(w)[0].float()
    if scale.dim() == 1:  # per output channel
        return scale.reshape(-1, 1).expand(w.shape)
    return scale.repeat_interleave(w.shape[1] // scale.shape[1], dim=1)


def activations(dtype, seed=0):
    """[4, 9, IN_FEATURES]: rows of many ranges, and rows that are all zero, constant, all
    positive, all negative, or one outlier."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 9, IN_FEATURES, generator=g)
    x = x * torch.logspace(-3, 2, 36).reshape(4, 9, 1)
    x[0, 0] = 0.0
    x[0, 1] = 0.75
    x[0, 2] = x[0, 2].abs() + 0.1
    x[0, 3] = -x[0, 3].abs()
    x[0, 4, 7] = 1e4
    return x.to(dtype).to(DEVICE)


def weights(dtype, seed=1):
    """[OUT_FEATURES, IN_FEATURES] with row and group scales, an all-zero group, an all-positive
    group, a constant group and values on scale ties."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(OUT_FEATURES, IN_FEATURES, generator=g) * 0.05
    w = w * torch.logspace(-2, 1, OUT_FEATURES).reshape(-1, 1)
    w[0, :32] = 0.0
    w[1, :32] = w[1, :32].abs()
    w[2, 32:64] = -0.25
    w[3, :32] = torch.arange(32) * 0.5 - 7.5  # amax 7.5: int4 scale 1, ties at every .5
    return w.to(dtype).to(DEVICE)


def their_8da4w(group_size, model):
    return Int8DynActInt4WeightQATQuantizer(groupsize=group_size).prepare(model)


def their_int4_weight_only(group_size, model):
    return Int4WeightOnlyQATQuantizer(groupsize=group_size).prepare(model)


def their_w8a8_dynamic(group_size, model):
    # torchao's QAT has no w8a8 quantizer class: its configurable QAT linear with 8da4w's
    # activation config and per-channel symmetric int8 weights.
    activation = IntxFakeQuantizeConfig(
        torch.int8, "per_token", is_symmetric=False, scale_precision=torch.float32,
        zero_point_precision=torch.float32, eps=torch.finfo(torch.float32).eps)
    weight = IntxFakeQuantizeConfig(torch.int8, "per_channel")
    for name, child in model.named_children():
        if type(child) is nn.Linear:
            setattr(model, name, FakeQuantizedLinear.from_linear(child, activation, weight))
    return model


THEIRS = {"8da4w": their_8da4w, "int4_weight_only": their_int4_weight_only,
          "w8a8_dynamic": their_w8a8_dynamic}
CASES = ([("8da4w", g) for g in GROUP_SIZES] + [("int4_weight_only", g) for g in GROUP_SIZES]
         + [("w8a8_dynamic", None)])


def float_model(name, dtype, seed=2):
    torch.manual_seed(seed)
    bias = name != "int4_weight_only"  # torchao's int4 QAT swaps only bias-free linears
    return nn.Sequential(nn.Linear(IN_FEATURES, OUT_FEATURES, bias=bias)).to(dtype).to(DEVICE)


def prepared(name, group_size, dtype):
    """(ours, torchao's) QAT models of one float model; their weight is the same tensor."""
    model = float_model(name, dtype)
    options = {} if group_size is None else {"group_size": group_size}
    ours = qgt.prepare_qat(model, name, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = THEIRS[name](group_size, copy.deepcopy(model))
    assert type(ours[0]) is qgt.QATLinear
    assert isinstance(theirs[0], FakeQuantizedLinear), type(theirs[0])
    return ours, theirs


def case_id(case):
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_weight_qparams_and_fake_quant(case, dtype):
    name, group_size = case
    ours, theirs = prepared(name, group_size, dtype)
    w = weights(dtype)
    ours_q, theirs_q = ours[0].weight_fake_quant, theirs[0].weight_fake_quantizer
    theirs_y = theirs_q(w)
    assert_bits_equal(ours_q(w), theirs_y, "fake-quantized weight")
    scale, zero_point = ours_q.qparams(w)
    theirs_scale = theirs_q.scale.reshape(scale.shape)
    assert_bits_equal(scale, theirs_scale, "weight scale")
    if name == "int4_weight_only":
        assert_bits_equal(zero_point, theirs_q.zero_point.reshape(scale.shape), "float zero")
    else:  # integer zero points, held as floats (8da4w) or int32 (per-channel) by torchao
        assert torch.equal(zero_point.to(torch.float64),
                           theirs_q.zero_point.reshape(scale.shape).to(torch.float64))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["8da4w", "w8a8_dynamic"])
def test_activation_qparams_and_fake_quant(name, dtype):
    ours, theirs = prepared(name, 32 if name == "8da4w" else None, dtype)
    ours_q, theirs_q = ours[0].input_fake_quant, theirs[0].activation_fake_quantizer
    for seed in range(3):
        x = activations(dtype, seed)
        theirs_y = theirs_q(x)
        assert_bits_equal(ours_q(x), theirs_y, f"fake-quantized activation (seed {seed})")
        scale, zero_point = ours_q.qparams(x)
        assert_bits_equal(scale, theirs_q.scale.reshape(scale.shape), "activation scale")
        assert torch.equal(zero_point.to(torch.float32),
                           theirs_q.zero_point.reshape(scale.shape).to(torch.float32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_qat_linear_forward_and_gradients(case, dtype):
    name, group_size = case
    ours, theirs = prepared(name, group_size, dtype)
    x = activations(dtype)
    ours_x = x.clone().requires_grad_()
    theirs_x = x.clone().requires_grad_()
    ours_y, theirs_y = ours(ours_x), theirs(theirs_x)
    assert_bits_equal(ours_y, theirs_y, "QAT linear output")
    dy = torch.randn(ours_y.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    ours_y.backward(dy.to(DEVICE))
    theirs_y.backward(dy.to(DEVICE))
    quantizer = ours[0].input_fake_quant
    x_scale = None if quantizer is None else quantizer.qparams(x)[0].unsqueeze(-1)
    assert_grad_close(ours_x.grad, theirs_x.grad, x_scale, dtype, "input gradient")
    w = ours[0].weight
    assert_grad_close(w.grad, theirs[0].weight.grad,
                      weight_scale_per_element(ours[0].weight_fake_quant, w.detach()), dtype,
                      "weight gradient")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_state_dicts_load_both_ways(case):
    name, group_size = case
    ours, theirs = prepared(name, group_size, torch.float32)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    with torch.no_grad():
        theirs[0].weight.mul_(0.5)
    ours.load_state_dict(theirs.state_dict())
    x = activations(torch.float32)
    assert_bits_equal(ours(x), theirs(x), "output after loading torchao's state_dict")
    with torch.no_grad():
        ours[0].weight.mul_(2.0)
    theirs.load_state_dict(ours.state_dict())
    assert_bits_equal(ours(x), theirs(x), "output after loading our state_dict")


# --- The engine's recipes (nn::parse_recipe) against torchao's fake quantizers ---------------

def their_intx_weight_quantizer(bits, group_size):
    """torchao's weight fake quantizer of QATConfig(Int8DynamicActivationIntxWeightConfig(
    weight_dtype=torch.int{bits}, weight_granularity=PerGroup(group_size))): symmetric per
    group, scale_precision as that config leaves it."""
    from torchao.quantization.qat import IntxFakeQuantizer
    dtype = {2: torch.int2, 3: torch.int3, 4: torch.int4}[bits]
    return IntxFakeQuantizer(IntxFakeQuantizeConfig(dtype, group_size=group_size,
                                                    is_symmetric=True))


def their_weight_quantizer(recipe, group_size, dtype):
    """torchao's weight fake quantizer of the recipe, on a bias-free Linear of `dtype`."""
    if recipe in ("8da3w", "8da2w"):
        return their_intx_weight_quantizer(int(recipe[3]), group_size)
    name = {"8da4w": "8da4w", "int4_weight_only": "int4_weight_only",
            "w8a8_dynamic": "w8a8_dynamic"}[recipe]
    model = nn.Sequential(nn.Linear(IN_FEATURES, OUT_FEATURES, bias=False)).to(dtype).to(DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = THEIRS[name](group_size, model)
    return theirs[0].weight_fake_quantizer


def their_activation_quantizer():
    """torchao 8da4w's activation fake quantizer (the engine's dynamic recipes share it)."""
    model = nn.Sequential(nn.Linear(IN_FEATURES, OUT_FEATURES)).to(DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = their_8da4w(32, model)
    return theirs[0].activation_fake_quantizer


ENGINE_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
ENGINE_CASES = ([("8da4w", g) for g in GROUP_SIZES] + [("8da3w", g) for g in GROUP_SIZES]
                + [("8da2w", g) for g in GROUP_SIZES]
                + [("int4_weight_only", g) for g in GROUP_SIZES] + [("w8a8_dynamic", 32)])


def engine_fake_quantize(attrs, x):
    """(y, scale, zero_point) of the engine's dynamic_fake_quantize with these attributes."""
    y, _, scale, zero_point = _kernels.run("dynamic_fake_quantize", attrs, [x])
    return y, scale, zero_point


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ENGINE_CASES, ids=case_id)
def test_engine_recipe_weight_fake_quant(case, dtype):
    recipe, group_size = case
    qc = qgn.parse_recipe(recipe, group_size)
    attrs = qc.dynamic_weight_attrs(ENGINE_DTYPE_NAMES[dtype])
    theirs_q = their_weight_quantizer(recipe, group_size, dtype)
    w = weights(dtype)
    theirs_y = theirs_q(w)
    ours_y, scale, zero_point = engine_fake_quantize(attrs, w)
    assert_bits_equal(ours_y, theirs_y, f"engine {recipe} fake-quantized weight")
    theirs_scale = theirs_q.scale.reshape(scale.shape)
    assert torch.equal(scale.double(), theirs_scale.double()), "weight scale"
    assert torch.equal(zero_point.double(),
                       theirs_q.zero_point.reshape(scale.shape).double()), "weight zero point"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("recipe", ["8da4w", "8da3w", "8da2w", "w8a8_dynamic"])
def test_engine_recipe_activation_fake_quant(recipe, dtype):
    attrs = qgn.parse_recipe(recipe, 32).dynamic_activation_attrs()
    theirs_q = their_activation_quantizer()
    for seed in range(3):
        x = activations(dtype, seed)
        theirs_y = theirs_q(x)
        ours_y, scale, zero_point = engine_fake_quantize(attrs, x)
        assert_bits_equal(ours_y, theirs_y, f"engine {recipe} activation (seed {seed})")
        assert torch.equal(scale.double(), theirs_q.scale.reshape(scale.shape).double())
        assert torch.equal(zero_point.double(),
                           theirs_q.zero_point.reshape(scale.shape).double())


# --- The Llama token embedding's quantizer (QConfig.embedding_weight) ------------------------

def their_embedding(bits, group_size, dtype):
    """torchao's fake-quantized embedding of a [OUT_FEATURES, IN_FEATURES] table: int4 through
    Int4WeightOnlyEmbeddingQATQuantizer, int8 as FakeQuantizedEmbedding with
    IntxFakeQuantizeConfig(torch.int8, group_size, is_symmetric=True) (what QATConfig builds for
    an embedding under IntxWeightOnlyConfig)."""
    table = nn.Embedding(OUT_FEATURES, IN_FEATURES).to(dtype).to(DEVICE)
    with torch.no_grad():
        table.weight.copy_(weights(dtype))
    if bits == 4:
        model = nn.Sequential(table)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Int4WeightOnlyEmbeddingQATQuantizer(group_size=group_size).prepare(model)
        return model[0]
    config = IntxFakeQuantizeConfig(torch.int8, group_size=group_size, is_symmetric=True)
    return FakeQuantizedEmbedding.from_embedding(table, weight_config=config)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("bits", [4, 8])
def test_engine_embedding_fake_quant(bits, group_size, dtype):
    qc = qgn.QConfig()
    qc.embedding_weight = qgn.WeightQuant.int4 if bits == 4 else qgn.WeightQuant.int8
    qc.embedding_group_size = group_size
    attrs = qc.embedding_weight_attrs(ENGINE_DTYPE_NAMES[dtype])
    theirs = their_embedding(bits, group_size, dtype)
    ids = torch.tensor([[0, 3, 3, 47], [1, 2, 5, 0]], device=DEVICE)
    with torch.no_grad():
        theirs_out = theirs(ids)
    table_q, scale, zero_point = engine_fake_quantize(attrs, theirs.weight.detach())
    assert_bits_equal(table_q[ids], theirs_out, f"engine int{bits} embedding, gathered")
    fq = theirs.weight_fake_quantizer
    assert torch.equal(scale.double(), fq.scale.reshape(scale.shape).double()), "scale"
    assert torch.equal(zero_point.double(), fq.zero_point.reshape(scale.shape).double())


# --- Learned ranges (QConfig.learned_weight_ranges) against torchao's range learning ---------

def their_range_learning_quantizer(recipe, group_size):
    """torchao's IntxFakeQuantizer with range_learning=True (is_dynamic=False), symmetric, as
    the engine's learned ranges follow it for `recipe`."""
    from torchao.quantization.qat import IntxFakeQuantizer
    if recipe == "w8a8_dynamic":
        config = IntxFakeQuantizeConfig(torch.int8, "per_channel", is_symmetric=True,
                                        is_dynamic=False, range_learning=True)
    else:
        dtype = {2: torch.int2, 3: torch.int3, 4: torch.int4}[int(recipe[3])]
        config = IntxFakeQuantizeConfig(dtype, group_size=group_size, is_symmetric=True,
                                        is_dynamic=False, range_learning=True)
    return IntxFakeQuantizer(config)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("case", [("8da4w", 32), ("8da2w", 64), ("w8a8_dynamic", 32)],
                         ids=case_id)
def test_engine_learned_ranges_against_torchao_range_learning(case, dtype):
    """torchao initialises the scale from the first batch (initialize_fake_quantizers: the
    dynamic qparams, floored at 1e-9) and differentiates its fake quant with plain autograd
    through a straight-through round. The engine's lsq_fake_quantize with grad_factor 1 on that
    scale: y bit for bit; dw within assert_grad_close; dscale within f32 rounding of torchao's
    per-group sums (ours are exact terms summed in f64)."""
    from torchao.quantization.qat import initialize_fake_quantizers
    recipe, group_size = case
    qc = qgn.parse_recipe(recipe, group_size)
    dyn = qc.dynamic_weight_attrs(ENGINE_DTYPE_NAMES[dtype])
    theirs_q = their_range_learning_quantizer(recipe, group_size)
    w = weights(dtype)
    initialize_fake_quantizers(theirs_q, (w,))
    assert isinstance(theirs_q.scale, torch.nn.Parameter)
    # The initial scale is the engine's dynamic scale, floored at 1e-9 (the all-zero group).
    _, dyn_scale, _ = engine_fake_quantize(dyn, w)
    scale = theirs_q.scale.detach().reshape(dyn_scale.shape).float().contiguous()
    assert torch.equal(scale, dyn_scale.clamp(min=1e-9)), "initial learned scale"

    wt = w.clone().requires_grad_(True)
    theirs_y = theirs_q(wt)
    g = torch.Generator().manual_seed(7)
    dy = torch.randn(w.shape, generator=g).to(dtype).to(DEVICE)
    theirs_y.backward(dy)

    attrs = {"quant_min": dyn["quant_min"], "quant_max": dyn["quant_max"], "grad_factor": 1.0}
    if recipe == "w8a8_dynamic":
        attrs.update(scope="channel", axis=0)
    else:
        attrs.update(scope="group", axis=1, group_size=group_size)
    zero = torch.zeros_like(scale)
    (ours_y,) = _kernels.run("lsq_fake_quantize", attrs, [w, scale, zero])
    assert_bits_equal(ours_y, theirs_y.detach(), f"learned {recipe} fake-quantized weight")
    dw, dscale, _ = _kernels.run("lsq_backward", attrs, [dy, w, scale, zero])
    per_element = scale.reshape(scale.shape[0], -1)
    per_element = per_element.repeat_interleave(w.shape[1] // per_element.shape[1], dim=1)
    assert_grad_close(dw, wt.grad, per_element, dtype, f"learned {recipe} weight gradient")
    # dscale. Ours: each term exact in f64 (dy * (code - x * inv_scale) in range, dy * code at
    # the clamp), summed in f64. torchao's autograd instead sums dy * code and, separately,
    # dcode * x / scale^2, where dcode = dy * scale is the gradient of the dequantized codes and
    # is rounded to the weight's dtype (the codes are cast to it before the multiply by the
    # scale). In f32 that rounding is 2^-24; in bf16 it is 2^-9 of a term that cancels, so the
    # two sums differ by far more than f32 rounding (found on the GPU: 2.9 of -2.8 for int8).
    # Each is therefore checked against its own formula evaluated in f64, within f32 rounding
    # of the sum of |terms|: ours against the exact sum, torchao's against its rounding. In f32
    # the two must also agree with each other.
    v = (w.float() * (1.0 / per_element)).double()  # the forward's f32 product
    code = torch.round(v)  # half to even, as the forward
    inside = (code >= dyn["quant_min"]) & (code <= dyn["quant_max"])
    clamped = code.clamp(dyn["quant_min"], dyn["quant_max"])
    x, dyd = w.double(), dy.double()
    inv = (1.0 / per_element).double()
    exact_terms = torch.where(inside, dyd * (code - x * inv), dyd * clamped)
    dcode = (dy.float() * per_element).to(dtype).double()  # torchao's rounded gradient
    torchao_terms = dyd * clamped - torch.where(inside, dcode * x / per_element.double() ** 2,
                                                torch.zeros_like(x))

    def group_sums(t):
        return t.reshape(scale.shape[0], scale.numel() // scale.shape[0], -1).sum(-1).reshape(
            scale.shape)

    terms = dyd.abs() * (v.abs() + abs(dyn["quant_min"]) + 1)
    bound = group_sums(terms) * 2.0 ** -20
    theirs_ds = theirs_q.scale.grad.reshape(scale.shape).double()

    def assert_sum_close(got, want, what):
        excess = (got.double() - want).abs() - bound
        assert (excess <= 0).all(), (f"learned {recipe} dscale, {what}: worst excess "
                                     f"{excess.max().item()}, got {got.flatten()[:4]}, "
                                     f"want {want.flatten()[:4]}")

    assert_sum_close(dscale, group_sums(exact_terms), "ours against the exact f64 sum")
    assert_sum_close(theirs_ds, group_sums(torchao_terms),
                     "torchao's against its own rounding evaluated in f64")
    if dtype == torch.float32:
        assert_sum_close(dscale, theirs_ds, "ours against torchao's")
