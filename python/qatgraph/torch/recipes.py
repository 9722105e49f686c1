"""QAT recipes as data: which quantizer goes where, and which float modules are swapped.

A recipe names three quantizer factories (callables returning a torch module, built once per
swapped module) and the module kinds they apply to:

- `weight`: runs on the weight before every forward (`<module>.weight_fake_quant`);
- `activation`: runs on the module's output (`<module>.activation_post_process`), as
  torch.ao's eager prepare_qat places its activation fake-quant; None for weight-only recipes;
- `input`: runs on the module's input (`<module>.input_fake_quant`), for dynamic recipes whose
  activation qparams come from each batch (per token); None for the static ones.

Weight-only or dynamic recipes (int4_weight_only, 8da4w, w8a8_dynamic) are a Recipe with
`activation=None` and, for the dynamic ones, an `input` factory; nothing else changes.
"""
import dataclasses
from typing import Callable, Optional, Tuple

import torch
from torch import nn
from torch.ao import quantization as tq

from .. import _core
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
    """

    name: str
    weight: Callable[[], nn.Module]
    activation: Optional[Callable[[], nn.Module]] = None
    input: Optional[Callable[[], nn.Module]] = None
    modules: Tuple[type, ...] = (nn.Linear, nn.Conv2d)
    observed_outputs: Tuple[type, ...] = ()

    def __post_init__(self):
        for field in ("weight", "activation", "input"):
            value = getattr(self, field)
            if (value is None and field != "weight") or callable(value):
                continue
            raise _core.Error(f"{_PREFIX} Recipe '{self.name}': '{field}' must be a callable "
                              f"returning a module{'' if field == 'weight' else ' or None'}, "
                              f"got {type(value).__name__}")
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

RECIPES = {
    "default": Recipe("default", weight=DEFAULT_WEIGHT, activation=DEFAULT_ACTIVATION,
                      observed_outputs=TORCH_AO_OBSERVED_OUTPUTS),
}


def resolve(recipe):
    """The Recipe for a recipe name, a Recipe, or a torch.ao QConfig (its `weight` and
    `activation` factories on the default recipe's module kinds and placement)."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        if recipe not in RECIPES:
            raise _core.Error(f"{_PREFIX} unknown recipe '{recipe}'; known recipes: "
                              f"{sorted(RECIPES)} (or pass a Recipe or a torch.ao QConfig)")
        return RECIPES[recipe]
    if isinstance(recipe, tq.QConfig):
        if recipe.weight is None:
            raise _core.Error(f"{_PREFIX} the QConfig has no weight quantizer: {recipe}")
        return dataclasses.replace(RECIPES["default"], name="QConfig", weight=recipe.weight,
                                   activation=recipe.activation)
    raise _core.Error(f"{_PREFIX} recipe must be a name ({sorted(RECIPES)}), a "
                      f"qatgraph.torch.Recipe or a torch.ao QConfig, got "
                      f"{type(recipe).__name__}: {recipe!r}")


def build(factory, what, recipe):
    """Calls one of the recipe's factories; the result must be a module."""
    module = factory()
    if not isinstance(module, nn.Module):
        raise _core.Error(f"{_PREFIX} recipe '{recipe.name}': its {what} factory returned a "
                          f"{type(module).__name__}, not a torch.nn.Module")
    return module
