"""prepare_qat and convert: passes over a torch model that swap float modules for QAT modules
and QAT modules for frozen inference modules."""
import copy
import itertools

from torch import nn
from torch.ao import quantization as tq
import torch.nn.intrinsic as nni

from .. import _core
from . import recipes as _recipes
from . import observer_sync
from .converted import ConvertedConv2d, ConvertedConvBn2d, ConvertedLinear, FrozenFakeQuantize
from .fake_quantize import FakeQuantize
from .qat_modules import QATConv2d, QATConvBn2d, QATLinear

_PREFIX = "[qatgraph.torch]"
_QAT = (QATLinear, QATConv2d, QATConvBn2d)
_CONVERTED = (ConvertedLinear, ConvertedConv2d, ConvertedConvBn2d)
# Modules never entered: quantizers, and what prepare_qat or convert made already.
_OPAQUE = (tq.FakeQuantizeBase, tq.ObserverBase) + _QAT + _CONVERTED


def prepare_qat(model, recipe="default", inplace=False, sync_observers=None,
                process_group=None, **options):
    """Returns `model` ready for quantization-aware training, as torch.ao's eager prepare_qat
    with the recipe's quantizers (qatgraph's FakeQuantize in the built-in recipes).

    recipe: a name from qatgraph.torch.RECIPES ("default": torch.ao's default fbgemm QAT
        qconfig; "8da4w", "int4_weight_only", "w8a8_dynamic": torchao's QAT numerics, on
        nn.Linear only), a qatgraph.torch.Recipe, or a torch.ao QConfig.
    inplace: modify `model` itself rather than a deep copy. A model that is itself a swapped
        module (a bare nn.Linear) is replaced, so always use the returned model.
    sync_observers: whether the activation observers sync their statistics across
        torch.distributed ranks, so that each rank's qparams are those of the global batch
        (torch.ao's observers under DistributedDataParallel each keep their rank's): None
        (default) syncs whenever torch.distributed is initialized and the group has more
        than one rank; True requires an initialized process group (qatgraph.Error otherwise)
        and quantizers qatgraph can sync; False never syncs. Weight quantizers never sync:
        data parallelism keeps the weights equal on every rank; nor does a module in eval
        mode (a rank may validate alone). The dynamic recipes' quantizers hold no
        statistics and need no sync. It sets the
        `sync_observers` and `process_group` attributes of the model's qatgraph
        FakeQuantize modules, which may also be changed one by one.
    process_group: the torch.distributed group to sync in; None: the default group.
    options: the named recipe's options, as qatgraph.torch.recipe(name, **options) takes them
        (group_size for "8da4w" and "int4_weight_only").

    Swaps nn.Linear for QATLinear and nn.Conv2d for QATConv2d; fuses Conv2d, BatchNorm2d (and
    a ReLU after them) in an nn.Sequential into one QATConvBn2d, leaving nn.Identity in the
    other places, as torch.ao.quantization.fuse_modules does; swaps modules fused by
    fuse_modules (ConvBn2d, ConvBnReLU2d, ConvReLU2d, LinearReLU) alike. Each QAT module gets
    `weight_fake_quant` and `activation_post_process` (its output quantizer); the leaf modules
    torch.ao would observe without swapping (QuantStub, BatchNorm2d, LayerNorm, ... see
    recipes.TORCH_AO_OBSERVED_OUTPUTS) get `activation_post_process` and a forward hook. So the
    state_dict has torch.ao's keys and loads both ways. Parameters are shared with the input
    model's (an optimizer made before an inplace prepare keeps working); training modes are
    kept. A submodule whose `qconfig` attribute is None is left float, as in torch.ao; other
    `qconfig` attributes are ignored (the recipe decides; pass a QConfig as the recipe to use
    one). Raises qatgraph.Error for a bad recipe or when nothing would be swapped.
    """
    if not isinstance(model, nn.Module):
        raise _core.Error(f"{_PREFIX} prepare_qat: model must be a torch.nn.Module, got "
                          f"{type(model).__name__}")
    recipe = _recipes.resolve(recipe, options)
    who = f"{_PREFIX} prepare_qat"
    observer_sync.check_mode(sync_observers, who)
    if sync_observers:
        observer_sync.require_process_group(who)
    if not inplace:
        model = copy.deepcopy(model)
    swapped = []
    model = _prepare(model, recipe, "", swapped, _unique_device(model))
    if not swapped:
        raise _core.Error(_nothing_to_swap(model, recipe))
    _set_sync(model, sync_observers, process_group)
    return model


def _quantizers(module, path=""):
    """(path, quantizer, its parent) of the quantizers and observers in `module`, not
    entering them."""
    for name, child in module.named_children():
        if isinstance(child, (tq.FakeQuantizeBase, tq.ObserverBase)):
            yield _join(path, name), child, module
        else:
            yield from _quantizers(child, _join(path, name))


def _set_sync(model, mode, group):
    """prepare_qat's sync_observers and process_group on the model's statistics-holding
    quantizers other than the weights'."""
    for path, quantizer, owner in _quantizers(model):
        if isinstance(owner, _QAT) and quantizer is owner.weight_fake_quant:
            continue
        if isinstance(quantizer, FakeQuantize):
            quantizer.sync_observers, quantizer.process_group = mode, group
        elif mode:
            raise _core.Error(
                f"{_PREFIX} prepare_qat: sync_observers=True, but {path!r} is a "
                f"{type(quantizer).__name__}, whose statistics qatgraph cannot sync (use "
                "qatgraph.torch.FakeQuantize in the recipe, or sync_observers=None)")


def convert(model, inplace=False):
    """Returns the inference model of a prepared one, in eval mode: each QAT module becomes a
    Converted* module (integer weight codes with their scale and zero point, dequantized in
    forward; conv-bn keeps its frozen batch norm) and every quantizer a FrozenFakeQuantize of
    its current `scale` / `zero_point` (nn.Identity where its fake quantization is off).

    Its outputs equal the prepared model's in eval mode with its observers off
    (`model.apply(torch.ao.quantization.disable_observer)`) bit for bit; with observers on,
    the prepared model would keep moving its qparams with every batch. Raises qatgraph.Error
    when the model holds no QAT module.
    """
    if not isinstance(model, nn.Module):
        raise _core.Error(f"{_PREFIX} convert: model must be a torch.nn.Module, got "
                          f"{type(model).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    converted = []
    model = _convert(model, "", converted)
    if not converted:
        raise _core.Error(f"{_PREFIX} convert: {type(model).__name__} holds no qatgraph QAT "
                          "module (QATLinear, QATConv2d, QATConvBn2d); run prepare_qat first")
    return model.eval()


def _join(path, name):
    return f"{path}.{name}" if path else name


def _swap(module, recipe, path):
    """The QAT module of one float module (torch.ao-fused ones included), or None."""
    kind = type(module)  # exact types, as torch.ao: a subclass may change forward
    linear, conv = nn.Linear in recipe.modules, nn.Conv2d in recipe.modules
    if kind is nn.Linear and linear:
        _check(recipe, module, path)
        return QATLinear.from_float(module, recipe)
    if kind is nni.LinearReLU and linear:
        _check(recipe, module[0], path)
        return QATLinear.from_float(module[0], recipe, relu=True)
    if kind is nn.Conv2d and conv:
        return QATConv2d.from_float(module, recipe)
    if kind is nni.ConvReLU2d and conv:
        return QATConv2d.from_float(module[0], recipe, relu=True)
    if kind in (nni.ConvBn2d, nni.ConvBnReLU2d) and conv:
        if not _foldable(module[0], module[1]):
            bn = module[1]
            raise _core.Error(
                f"{_PREFIX} prepare_qat: the fused {kind.__name__} {path!r} cannot fold its "
                f"batch norm (affine={bn.affine}, track_running_stats={bn.track_running_stats},"
                f" num_features={bn.num_features}, conv out_channels="
                f"{module[0].out_channels}): folding needs gamma and the running variance")
        return QATConvBn2d.from_float(module[0], module[1], recipe,
                                      relu=kind is nni.ConvBnReLU2d)
    return None


def _check(recipe, module, path):
    """The recipe's own check of a module it is about to swap (it names the path)."""
    if recipe.check is not None:
        recipe.check(module, path)


def _excluded(module):
    # torch.ao's way to keep a submodule float: qconfig = None.
    return hasattr(module, "qconfig") and module.qconfig is None


def _prepare(module, recipe, path, swapped, model_device):
    if _excluded(module) or isinstance(module, _OPAQUE):
        return module
    qat = _swap(module, recipe, path)
    if qat is not None:
        swapped.append(path)
        return qat
    if isinstance(module, nn.Sequential) and nn.Conv2d in recipe.modules:
        _fuse_conv_bn(module, recipe, path, swapped)
    for name, child in list(module.named_children()):
        new = _prepare(child, recipe, _join(path, name), swapped, model_device)
        if new is not child:
            setattr(module, name, new)
    # A leaf with an activation_post_process has its quantizer already (torch.ao prepared it).
    if (type(module) in recipe.observed_outputs and recipe.activation is not None
            and not any(True for _ in module.children())
            and not hasattr(module, "activation_post_process")):
        quantizer = _recipes.build(recipe.activation, "activation", recipe)
        # On the leaf's device (a parameterless leaf: the model's one device), as torch.ao's
        # prepare places its observers: a model moved to CUDA before prepare_qat must not get
        # CPU statistics.
        device = _unique_device(module, path) or model_device
        module.activation_post_process = quantizer if device is None else quantizer.to(device)
        handle = module.register_forward_hook(_quantize_output)
        # First among the forward hooks, as torch.ao: later hooks see the quantized output.
        module._forward_hooks.move_to_end(handle.id, last=False)
    return module


def _unique_device(module, path=None):
    """The one device of a module's parameters and buffers; None when it has none, or, for the
    whole model (path None), when they are on several devices. A leaf to observe (path given)
    whose tensors are on several devices is an error: its quantizer could not follow them."""
    devices = {t.device for t in itertools.chain(module.parameters(), module.buffers())}
    if len(devices) > 1 and path is not None:
        raise _core.Error(f"{_PREFIX} prepare_qat: {type(module).__name__} {path!r} holds "
                          f"tensors on several devices {sorted(map(str, devices))}")
    return next(iter(devices)) if len(devices) == 1 else None


def _quantize_output(module, inputs, output):
    """Forward hook of the observed leaf modules: their output through their quantizer."""
    return module.activation_post_process(output)


def _foldable(conv, bn):
    return (type(conv) is nn.Conv2d and type(bn) is nn.BatchNorm2d and bn.affine
            and bn.track_running_stats and bn.num_features == conv.out_channels
            and not _excluded(conv) and not _excluded(bn))


def _fuse_conv_bn(seq, recipe, path, swapped):
    """Conv2d, BatchNorm2d (, ReLU) runs of an nn.Sequential become one QATConvBn2d followed
    by nn.Identity placeholders, torch.ao.quantization.fuse_modules' layout."""
    names = list(seq._modules)
    i = 0
    while i + 1 < len(names):
        conv, bn = seq._modules[names[i]], seq._modules[names[i + 1]]
        if not _foldable(conv, bn):
            i += 1
            continue
        after = seq._modules[names[i + 2]] if i + 2 < len(names) else None
        relu = type(after) is nn.ReLU and not _excluded(after)
        seq._modules[names[i]] = QATConvBn2d.from_float(conv, bn, recipe, relu=relu)
        swapped.append(_join(path, names[i]))
        for name in names[i + 1:i + 2 + relu]:
            seq._modules[name] = nn.Identity()
        i += 2 + relu


def _nothing_to_swap(model, recipe):
    kinds = sorted(type(m).__name__ for m in model.modules())
    prepared = [k for k in kinds if k in {c.__name__ for c in _QAT}]
    if prepared:
        return (f"{_PREFIX} prepare_qat: the model is prepared already (it holds "
                f"{sorted(set(prepared))}); nothing left to swap")
    return (f"{_PREFIX} prepare_qat: nothing to quantize in {type(model).__name__}: recipe "
            f"'{recipe.name}' swaps {[m.__name__ for m in recipe.modules]} (and their "
            f"torch.ao-fused forms), the model holds {sorted(set(kinds))} "
            "(submodules with qconfig = None are left alone)")


def _convert(module, path, converted):
    kinds = ((QATConvBn2d, ConvertedConvBn2d), (QATConv2d, ConvertedConv2d),
             (QATLinear, ConvertedLinear))
    for qat_kind, converted_kind in kinds:
        if isinstance(module, qat_kind):
            converted.append(path)
            return converted_kind(module, path or type(module).__name__)
    if isinstance(module, _OPAQUE):
        return module
    for name, child in list(module.named_children()):
        new = _convert(child, _join(path, name), converted)
        if new is not child:
            setattr(module, name, new)
    if _quantize_output in module._forward_hooks.values():
        module.activation_post_process = FrozenFakeQuantize.freeze(
            module.activation_post_process)
    return module
