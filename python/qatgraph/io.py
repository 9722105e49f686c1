"""Tensor files and model state import/export.

Files: load_safetensors / save_safetensors, load_npy / save_npy (the validated C++ readers
and writers of core/).

Model state: save_state(executor, path) and load_state(executor, path) dispatch on a format
("safetensors" built in; the name comes from the path's extension when not given) through a
registry, so other formats plug in without touching this file:

    def export_onnx(executor, path, **options): ...
    qatgraph.io.register_exporter("onnx", export_onnx, extensions=(".onnx",))

    def import_torch(executor, path, **options): ...   # returns the unused keys
    qatgraph.io.register_importer("torch", import_torch, extensions=(".pt", ".pth"))

An exporter receives the Executor (its .graph and .state_dict() give the graph and the
trained values); an importer writes into the executor, typically via load_state_dict().
State names: parameters by name ("fc1.weight"), other persistent state as
"<node>/<state>" ("fc1.weight.observer/min"), as Executor.state_dict() gives them.
"""
import os

from . import _core

__all__ = [
    "exporters",
    "importers",
    "load_npy",
    "load_safetensors",
    "load_state",
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


def _export_safetensors(executor, path, parameters_only=False, metadata=None):
    save_safetensors(path, executor.state_dict(parameters_only=parameters_only), metadata)


def _import_safetensors(executor, path, strict=True):
    return executor.load_state_dict(load_safetensors(path), strict=strict)


register_exporter("safetensors", _export_safetensors, extensions=(".safetensors",))
register_importer("safetensors", _import_safetensors, extensions=(".safetensors",))
