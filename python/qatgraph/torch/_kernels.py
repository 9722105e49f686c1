"""qatgraph kernels on torch tensors, on any device: the layer under qatgraph.torch's ops.

Each call finds a `_core.Kernel` prepared for (op, attributes, input dtypes and shapes,
device), made once and cached. torch allocates the outputs (its caching allocator, so its
memory accounting and CUDA-graph capture keep working), the kernel runs on torch's current
stream, and nothing waits for the device. Failures a CUDA kernel records (a scale <= 0, a
zero point out of range) are raised by check_errors(), which waits for the stream.

Under torch.compile the calls go through one torch.library custom op, `qatgraph::run`, whose
fake kernel infers the outputs with the same C++ shape inference, so graphs do not break.
"""
import atexit
import json

import torch

from .. import _core

PREFIX = "[qatgraph.torch]"

_QG_DTYPE = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.uint8: "u8", torch.int8: "i8", torch.int32: "i32", torch.int64: "i64",
}
_TORCH_DTYPE = {name: dtype for dtype, name in _QG_DTYPE.items()}
_kernels = {}
# The prepared kernels hold C++ state: drop them before the interpreter tears the module down.
atexit.register(_kernels.clear)


def device_name(device):
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


def attrs_key(attrs):
    """The canonical JSON string of an attribute dict: the kernel cache's key and the custom
    op's argument. Written out by hand rather than by json.dumps, which torch.compile's
    tracer cannot step through."""
    items = []
    for name in sorted(attrs or {}):
        value = attrs[name]
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = str(value)
        else:
            text = '"' + str(value) + '"'
        items.append('"' + name + '": ' + text)
    return "{" + ", ".join(items) + "}"


def kernel(op, attrs_str, inputs):
    """The prepared kernel for these tensors' dtypes, shapes and device (made on first use)."""
    device = inputs[0].device
    key = (op, attrs_str, device, tuple((t.dtype, tuple(t.shape)) for t in inputs))
    k = _kernels.get(key)
    if k is None:
        types = []
        for i, t in enumerate(inputs):
            if t.device != device:
                raise _core.Error(f"{PREFIX} {op}: input {i} is on {t.device}, input 0 on "
                                  f"{device} (all inputs must be on one device)")
            if t.dtype not in _QG_DTYPE:
                raise _core.Error(f"{PREFIX} {op}: input {i} has dtype {t.dtype}, which "
                                  "qatgraph does not take")
            types.append((_QG_DTYPE[t.dtype], list(t.shape)))
        k = _core.Kernel(op, json.loads(attrs_str), types, device_name(device))
        k = _Prepared(k, [(_TORCH_DTYPE[d], shape) for d, shape in k.output_types],
                      k.output_types, k.state_specs)
        _kernels[key] = k
    return k


class _Prepared:
    """A kernel with its output and state types read once (torch dtypes for allocation, the
    qatgraph names for checking caller-given tensors)."""
    __slots__ = ("kernel", "outputs", "output_types", "state_specs")

    def __init__(self, kernel, outputs, output_types, state_specs):
        self.kernel, self.outputs = kernel, outputs
        self.output_types, self.state_specs = output_types, state_specs


def empty_outputs(k, device):
    return [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in k.outputs]


# torch's raw current-stream handle without building a Stream object (a few microseconds a
# call on the GPU machine's host); torch.cuda.current_stream where the private call is absent.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream(device):
    if device.type != "cuda":
        return 0
    if _raw_stream is not None:
        return _raw_stream(device.index if device.index is not None else
                           torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


_constants = {}


def constant(value, dtype, device):
    """A 1-element device tensor holding a Python number, made once per (value, dtype,
    device): torch.tensor(v, device='cuda') copies from pageable memory, which waits for the
    device, in every call that passes a Python scale or zero point."""
    key = (value, dtype, device)
    t = _constants.get(key)
    if t is None:
        if len(_constants) >= 1024:  # many distinct values: start over rather than grow
            _constants.clear()
        t = torch.tensor([value], dtype=dtype, device=device)
        _constants[key] = t
    return t


def _operand(t):
    # The kernels read dense, 16-byte aligned memory: a strided view or an unaligned slice
    # becomes a copy (as torch's own kernels copy what they cannot read in place).
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.data_ptr() % 16 and t.numel():
        t = t.clone()
    return t


def _check_like(op, what, tensors, specs, device):
    """Caller-given outputs and states must be dense tensors of the kernel's types on its
    device: the kernel writes through their data pointers."""
    if len(tensors) != len(specs):
        raise _core.Error(f"{PREFIX} {op}: takes {len(specs)} {what}s, got {len(tensors)}")
    for i, (t, spec) in enumerate(zip(tensors, specs)):
        dtype, shape = spec[-2], spec[-1]
        if (t.device != device or _QG_DTYPE.get(t.dtype) != dtype or list(t.shape) != shape
                or not t.is_contiguous()):
            raise _core.Error(f"{PREFIX} {op}: {what} {i} must be a contiguous {dtype}"
                              f"{shape} on {device}, got {t.dtype}{list(t.shape)} on {t.device}"
                              f"{'' if t.is_contiguous() else ' (not contiguous)'}")


def run_eager(op, attrs_str, inputs, states=(), outputs=None, training=True):
    inputs = [_operand(t) for t in inputs]
    device = inputs[0].device
    k = kernel(op, attrs_str, inputs)
    if outputs is None:
        outputs = empty_outputs(k, device)
    else:
        _check_like(op, "output", outputs, k.output_types, device)
    if states:
        _check_like(op, "state", states, k.state_specs, device)
    k.kernel.run([t.data_ptr() for t in inputs], [t.data_ptr() for t in outputs],
          [t.data_ptr() for t in states], training, stream(device))
    return outputs


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def tracing():
    """Whether torch.compile's tracer runs this code."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and compiler.is_compiling()


def _compiling(inputs):
    """Whether the call is being traced: by dynamo, or by AOTAutograd's tracing of a backward
    (whose tensors are fake or functional subclasses, with no memory to hand a kernel)."""
    return tracing() or any(type(t) not in _PLAIN for t in inputs)


_custom_op = _custom_op_with_states = None
if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    from typing import List

    # Two functional custom ops: torch.compile's functionalization takes no mutable tensor
    # lists, so the stateful form returns the updated states (copies) after the outputs and
    # run() copies them back into the caller's state tensors.
    @torch.library.custom_op("qatgraph::run", mutates_args=())
    def _custom_op(op: str, attrs: str, inputs: List[torch.Tensor],
                   training: bool) -> List[torch.Tensor]:
        return run_eager(op, attrs, inputs, (), None, training)

    @_custom_op.register_fake
    def _(op, attrs, inputs, training):
        return empty_outputs(kernel(op, attrs, inputs), inputs[0].device)

    @torch.library.custom_op("qatgraph::run_with_states", mutates_args=())
    def _custom_op_with_states(op: str, attrs: str, inputs: List[torch.Tensor],
                               states: List[torch.Tensor],
                               training: bool) -> List[torch.Tensor]:
        after = [t.clone() for t in states]
        return run_eager(op, attrs, inputs, after, None, training) + after

    @_custom_op_with_states.register_fake
    def _(op, attrs, inputs, states, training):
        outs = empty_outputs(kernel(op, attrs, inputs), inputs[0].device)
        return outs + [torch.empty_like(t) for t in states]


def run(op, attrs, inputs, states=(), outputs=None, training=True):
    """Runs qatgraph op `op` on torch tensors: returns its outputs (new torch tensors, or the
    given `outputs`, written in place). `states` (the op's persistent state tensors, in its
    order) are updated in place; empty: the op's initial states."""
    attrs_str = attrs if isinstance(attrs, str) else attrs_key(attrs)
    if _custom_op is not None and _compiling(inputs):
        if states:
            result = _custom_op_with_states(op, attrs_str, list(inputs), list(states), training)
            n = len(result) - len(states)
            for dst, src in zip(states, result[n:]):
                dst.copy_(src)
            result = result[:n]
        else:
            result = _custom_op(op, attrs_str, list(inputs), training)
        if outputs is not None:
            for dst, src in zip(outputs, result):
                dst.copy_(src)
            return outputs
        return result
    return run_eager(op, attrs_str, inputs, states, outputs, training)


def check_errors(device=None):
    """Waits for the current stream of `device` (default: the current CUDA device) and raises
    what a qatgraph kernel run on it recorded on the device."""
    if not torch.cuda.is_available():
        return
    device = torch.device("cuda") if device is None else torch.device(device)
    _core.check_device_errors(device_name(device), stream(device))
