"""QAT recipes as data: which quantizer goes where, and which float modules are swapped.

A recipe names three quantizer factories (callables returning a torch module, built once per
swapped module) and the module kinds they apply to:

- `weight`: runs on the weight before every forward (`<module>.weight_fake_quant`);
- `activation`: runs on the module's output (`<module>.activation_post_process`), as
  torch.ao's eager prepare_qat places its activation fake-quant; None for weight-only recipes;
- `input`: runs on the module's input (`<module>.input_fake_quant`), for dynamic recipes whose
  activation qparams come from each batch (per token); None for the static ones.

The weight-only and dynamic recipes (8da4w, int4_weight_only, w8a8_dynamic: torchao's QAT
numerics, see dynamic_quantizers) are Recipes with `activation=None` and, for the dynamic ones,
an `input` factory. `recipe(name, **options)` builds one with options (group_size).
"""
import dataclasses
import functools
import inspect
from typing import Callable, Optional, Tuple

import torch
from torch import nn
from torch.ao import quantization as tq

from .. import _core
from .dynamic_quantizers import (
    GroupFloatZeroFakeQuantize,
    GroupSymmetricFakeQuantize,
    PerTokenFakeQuantize,
)
from .fake_quantize import FakeQuantize

_PREFIX = "[qatgraph.torch]"

# Leaf modules torch.ao's eager prepare_qat gives an output fake-quant without swapping them
# (its qconfig propagation list, less what is swapped, containers and what it skips: Dropout,
# DeQuantStub, the RNNs and embeddings, which need their own quantized modules). Observing
# the same outputs keeps the state_dict keys, and the quantized graph, the same as torch.ao's.
TORCH_AO_OBSERVED_OUTPUTS = (
    tq.QuantStub,
    nn.BatchNorm2d, nn.BatchNorm3d,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
    nn.LayerNorm, nn.GroupNorm,
    nn.ELU, nn.Hardswish, nn.LeakyReLU, nn.PReLU, nn.ReLU6,
    nn.Conv1d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d,
)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Where prepare_qat puts which quantizer.

    name: shown in errors and reprs.
    weight: factory of the weight quantizer (a module mapping the weight to its fake-quantized
        value), built once per swapped module.
    activation: factory of the output quantizer, or None (weight-only or dynamic recipes).
    input: factory of an input quantizer, or None; dynamic recipes quantize the input per
        batch here instead of quantizing the output with trained qparams.
    modules: the float module kinds swapped for QAT modules, among nn.Linear and nn.Conv2d
        (a Conv2d followed by BatchNorm2d, and ReLU, in an nn.Sequential is fused).
    observed_outputs: leaf module kinds that are not swapped but whose output goes through an
        `activation` quantizer, as torch.ao's eager prepare_qat does (QuantStub, norms, ...).
    check: None, or a callable (float module, its path) run before a module is swapped; it
        raises qatgraph.Error for a module the recipe cannot quantize (a group size that does
        not divide in_features).
    """

    name: str
    weight: Callable[[], nn.Module]
    activation: Optional[Callable[[], nn.Module]] = None
    input: Optional[Callable[[], nn.Module]] = None
    modules: Tuple[type, ...] = (nn.Linear, nn.Conv2d)
    observed_outputs: Tuple[type, ...] = ()
    check: Optional[Callable[[nn.Module, str], None]] = None

    def __post_init__(self):
        for field in ("weight", "activation", "input"):
            value = getattr(self, field)
            if (value is None and field != "weight") or callable(value):
                continue
            raise _core.Error(f"{_PREFIX} Recipe '{self.name}': '{field}' must be a callable "
                              f"returning a module{'' if field == 'weight' else ' or None'}, "
                              f"got {type(value).__name__}")
        if self.check is not None and not callable(self.check):
            raise _core.Error(f"{_PREFIX} Recipe '{self.name}': 'check' must be None or a "
                              f"callable (module, path), got {type(self.check).__name__}")
        unknown = [m for m in self.modules if m not in (nn.Linear, nn.Conv2d)]
        if unknown:
            raise _core.Error(f"{_PREFIX} Recipe '{self.name}': modules may be nn.Linear and "
                              f"nn.Conv2d, got {[m.__name__ for m in unknown]}")


# torch.ao.quantization.get_default_qat_qconfig("fbgemm")'s quantizers, on qatgraph's kernels:
# activations per tensor, affine quint8 with fbgemm's reduced range [0, 127]; weights per
# output channel, symmetric qint8.
DEFAULT_ACTIVATION = FakeQuantize.with_args(
    observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255, reduce_range=True)
DEFAULT_WEIGHT = FakeQuantize.with_args(
    observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
    dtype=torch.qint8, qscheme=torch.per_channel_symmetric)

# The group sizes torchao's int4 QAT quantizers take (its int4 weight-only one asserts them).
GROUP_SIZES = (32, 64, 128, 256)


def _group_size(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value not in GROUP_SIZES:
        raise _core.Error(f"{_PREFIX} recipe '{name}': group_size must be one of "
                          f"{list(GROUP_SIZES)}, got {value!r}")
    return value


def _divisible_in_features(name, group_size, module, path):
    """Recipe.check of the group-wise recipes: the group size must divide in_features."""
    if module.in_features % group_size:
        raise _core.Error(f"{_PREFIX} recipe '{name}' (group_size={group_size}): nn.Linear "
                          f"{path!r} has in_features = {module.in_features}, which "
                          f"group_size {group_size} does not divide; pick a group size that "
                          "does, or keep that layer float (qconfig = None)")


def _default():
    return Recipe("default", weight=DEFAULT_WEIGHT, activation=DEFAULT_ACTIVATION,
                  observed_outputs=TORCH_AO_OBSERVED_OUTPUTS)


def _int8_dynamic_activation_int4_weight(group_size=32):
    # torchao's Int8DynActInt4WeightQATQuantizer: per-token asymmetric int8 inputs (f32 qparams,
    # eps = f32 epsilon), symmetric int4 weights per group (f32 scales).
    name = "8da4w"
    group_size = _group_size(name, group_size)
    return Recipe(
        name, modules=(nn.Linear,),
        input=functools.partial(PerTokenFakeQuantize, bits=8, recipe=name),
        weight=functools.partial(GroupSymmetricFakeQuantize, bits=4, group_size=group_size,
                                 recipe=name),
        check=functools.partial(_divisible_in_features, name, group_size))


def _int4_weight_only(group_size=128):
    # torchao's Int4WeightOnlyQATQuantizer: asymmetric uint4 weights per group with a float
    # zero point (tinygemm's format), bf16 scales and zeros; inputs stay float.
    name = "int4_weight_only"
    group_size = _group_size(name, group_size)
    return Recipe(
        name, modules=(nn.Linear,),
        weight=functools.partial(GroupFloatZeroFakeQuantize, bits=4, group_size=group_size,
                                 recipe=name),
        check=functools.partial(_divisible_in_features, name, group_size))


def _int8_dynamic_activation_int8_weight():
    # Per-token asymmetric int8 inputs as 8da4w's (torchao's QAT has no symmetric per-token
    # activations), symmetric int8 weights per output channel (torchao's
    # IntxFakeQuantizeConfig(torch.int8, "per_channel")).
    name = "w8a8_dynamic"
    return Recipe(
        name, modules=(nn.Linear,),
        input=functools.partial(PerTokenFakeQuantize, bits=8, recipe=name),
        weight=functools.partial(GroupSymmetricFakeQuantize, bits=8, group_size=None,
                                 recipe=name))


# Recipe builders by name; their keyword arguments are the recipe's options.
RECIPE_BUILDERS = {
    "default": _default,
    "8da4w": _int8_dynamic_activation_int4_weight,
    "int4_weight_only": _int4_weight_only,
    "w8a8_dynamic": _int8_dynamic_activation_int8_weight,
}

# Each recipe with its default options.
RECIPES = {name: build_recipe() for name, build_recipe in RECIPE_BUILDERS.items()}


def recipe(name, **options):
    """The named recipe with options: "8da4w" and "int4_weight_only" take `group_size` (one of
    32, 64, 128, 256; defaults 32 and 128), "default" and "w8a8_dynamic" take none. Raises
    qatgraph.Error for an unknown name, option or value."""
    if name not in RECIPE_BUILDERS:
        raise _core.Error(f"{_PREFIX} unknown recipe {name!r}; known recipes: "
                          f"{sorted(RECIPE_BUILDERS)} (or pass a Recipe or a torch.ao QConfig)")
    if not options:
        return RECIPES[name]
    takes = list(inspect.signature(RECIPE_BUILDERS[name]).parameters)
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise _core.Error(f"{_PREFIX} recipe '{name}' takes the options {takes}, got "
                          f"{unknown}")
    return RECIPE_BUILDERS[name](**options)


def resolve(recipe_, options=None):
    """The Recipe for a recipe name (with `options`, see recipe()), a Recipe, or a torch.ao
    QConfig (its `weight` and `activation` factories on the default recipe's module kinds and
    placement)."""
    if options and not isinstance(recipe_, str):
        raise _core.Error(f"{_PREFIX} recipe options {sorted(options)} need a recipe name, got "
                          f"a {type(recipe_).__name__}")
    if isinstance(recipe_, Recipe):
        return recipe_
    if isinstance(recipe_, str):
        return recipe(recipe_, **(options or {}))
    if isinstance(recipe_, tq.QConfig):
        if recipe_.weight is None:
            raise _core.Error(f"{_PREFIX} the QConfig has no weight quantizer: {recipe_}")
        return dataclasses.replace(RECIPES["default"], name="QConfig", weight=recipe_.weight,
                                   activation=recipe_.activation)
    raise _core.Error(f"{_PREFIX} recipe must be a name ({sorted(RECIPES)}), a "
                      f"qatgraph.torch.Recipe or a torch.ao QConfig, got "
                      f"{type(recipe_).__name__}: {recipe_!r}")


def build(factory, what, recipe):
    """Calls one of the recipe's factories; the result must be a module."""
    module = factory()
    if not isinstance(module, nn.Module):
        raise _core.Error(f"{_PREFIX} recipe '{recipe.name}': its {what} factory returned a "
                          f"{type(module).__name__}, not a torch.nn.Module")
    return module
