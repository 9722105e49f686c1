"""Tensor files, model state import/export, pretrained weights and ONNX export.

Files: load_safetensors / save_safetensors, load_npy / save_npy (the validated C++ readers
and writers of core/).

Model state: save_state(executor, path) and load_state(executor, path) dispatch on a format
("safetensors" built in; the name comes from the path's extension when not given) through a
registry, so other formats plug in without touching this file:

    def export_tflite(executor, path, **options): ...
    qatgraph.io.register_exporter("tflite", export_tflite, extensions=(".tflite",))

    def import_gguf(executor, path, **options): ...   # returns the unused keys
    qatgraph.io.register_importer("gguf", import_gguf, extensions=(".gguf",))

An exporter receives the Executor (its .graph and .state_dict() give the graph and the
trained values); an importer writes into the executor, typically via load_state_dict().
Registered: "safetensors" both ways (the executor's full state by its own names, observers
included: a round trip); "torch" and "npz" import pretrained float weights from a
.safetensors or .npz file with PyTorch state_dict names (import_weights below); "onnx"
exports a trained model (export_onnx below). Importers and exporters take an Executor or a
Trainer (its .executor).

State names: parameters by name ("fc1.weight"), other persistent state as
"<node>/<state>" ("fc1.weight.observer/min"), as Executor.state_dict() gives them.
"""
import os

from . import _core

__all__ = [
    "export_onnx",
    "exporters",
    "import_weights",
    "importers",
    "load_npy",
    "load_safetensors",
    "load_state",
    "onnx_available",
    "register_exporter",
    "register_importer",
    "save_npy",
    "save_safetensors",
    "save_state",
]

load_npy = _core.load_npy
save_npy = _core.save_npy


def load_safetensors(path, framework=None, with_metadata=False):
    """name -> array (NumPy unless framework='torch' / 'dlpack'); with_metadata=True returns
    (tensors, metadata)."""
    tensors, metadata = _core.load_safetensors(os.fspath(path), framework)
    return (tensors, metadata) if with_metadata else tensors


def save_safetensors(path, tensors, metadata=None):
    """Writes name -> array (NumPy, torch, DLPack) atomically; metadata: str -> str."""
    _core.save_safetensors(os.fspath(path), dict(tensors), dict(metadata or {}))


_exporters = {}
_importers = {}
_extensions = {}


def register_exporter(fmt, fn, extensions=()):
    """fn(executor, path, **options) writes the executor's model in format `fmt`."""
    _exporters[fmt] = fn
    for ext in extensions:
        _extensions[ext] = fmt


def register_importer(fmt, fn, extensions=()):
    """fn(executor, path, **options) loads values into the executor; returns unused keys."""
    _importers[fmt] = fn
    for ext in extensions:
        _extensions[ext] = fmt


def exporters():
    return sorted(_exporters)


def importers():
    return sorted(_importers)


def _format_of(path, fmt, table, what):
    if fmt is None:
        fmt = _extensions.get(os.path.splitext(os.fspath(path))[1])
        if fmt is None:
            raise _core.Error(f"[io] cannot tell the format of '{path}': pass format= "
                              f"(one of {', '.join(sorted(table))})")
    if fmt not in table:
        raise _core.Error(f"[io] no {what} for format '{fmt}' (have {', '.join(sorted(table))})")
    return table[fmt]


def save_state(executor, path, format=None, **options):
    """Exports the executor's model state (or model) to `path`."""
    return _format_of(path, format, _exporters, "exporter")(executor, os.fspath(path), **options)


def load_state(executor, path, format=None, **options):
    """Imports values from `path` into the executor's states; returns the unused keys."""
    return _format_of(path, format, _importers, "importer")(executor, os.fspath(path), **options)


def _executor_of(target):
    return getattr(target, "executor", target)


def _export_safetensors(target, path, parameters_only=False, metadata=None):
    state = _executor_of(target).state_dict(parameters_only=parameters_only)
    save_safetensors(path, state, metadata)


def _import_safetensors(target, path, strict=True, torch_names=False, mapping=None):
    """torch_names=True (or a mapping): pretrained weights with PyTorch names, as "torch"."""
    if torch_names or mapping is not None:
        return import_weights(target, path, mapping)
    return _executor_of(target).load_state_dict(load_safetensors(path), strict=strict)


register_exporter("safetensors", _export_safetensors, extensions=(".safetensors",))
register_importer("safetensors", _import_safetensors, extensions=(".safetensors",))


def import_weights(target, source, mapping=None):
    """Loads pretrained float weights into a model's parameters and buffers (weights, biases,
    batch-norm gamma/beta/running statistics; never observer state) and returns the
    nn.ImportReport (.loaded: (file name, model name) pairs, .ignored: (file name, reason)).

    target: an Executor or a Trainer. source: a .safetensors / .npz path, or a dict of name ->
    array (NumPy, torch, DLPack), e.g. a PyTorch state_dict. Names follow PyTorch's rules
    (nn.torch_name_match); `mapping` (file name -> model name, None to leave a tensor out) is
    consulted first. All or nothing: a qatgraph.Error lists every unmatched file tensor,
    missing parameter and shape mismatch, and leaves the model untouched."""
    executor = _executor_of(target)
    if isinstance(source, dict):
        return _core.nn.import_weights(executor, source, mapping)
    return _core.nn.import_weights_file(executor, os.fspath(source), mapping)


onnx_available = _core.onnx_available


def export_onnx(source, path, data=None, input=None, output=None, graph_name="qatgraph", doc="",
                metadata=None):
    """Writes an ONNX QDQ model (opset 17) and returns a summary dict (nodes, op_counts,
    initializers, warnings, ...). Needs a module built with ONNX (onnx_available).

    source is one of:
      * a checkpoint path written by Trainer.save_checkpoint or `qat train` (what
        `qat export --onnx path checkpoint` does: the model it names, integer weights);
      * a Trainer: its trained model converted to integer weights (nn/convert.h);
      * an Executor with input= and output= value ids: its graph exported as it is.
    data (an nn.Dataset, for a checkpoint or Trainer): the result's "logits" are then the
    converted graph's on data, the reference an ONNX runtime should reproduce (what
    `qat export --reference` writes)."""
    path = os.fspath(path)
    if isinstance(source, (str, os.PathLike)):
        return _core.export_onnx_checkpoint(os.fspath(source), path, data)
    if isinstance(source, _core.nn.Trainer):
        return _core.export_onnx_trainer(source, path, data)
    if input is None or output is None:
        raise _core.Error("[io.export_onnx] exporting an Executor needs input= and output= "
                          "(value ids); pass a Trainer or a checkpoint path for a trained model")
    return _core.export_onnx_graph(source, input, output, path, graph_name, doc,
                                   list((metadata or {}).items()))


def _import_torch(target, path, mapping=None):
    return import_weights(target, path, mapping)


def _export_onnx(target, path, **options):
    return export_onnx(target, path, **options)


register_importer("torch", _import_torch)
register_importer("npz", _import_torch, extensions=(".npz",))
register_exporter("onnx", _export_onnx, extensions=(".onnx",))
