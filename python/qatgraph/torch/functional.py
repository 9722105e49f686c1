"""Quantization ops as torch.autograd.Functions over qatgraph's kernels, on CPU and CUDA
tensors, with torch's signatures, results and gradients (the STE backward is PyTorch's
`dy * mask` bit for bit, signed zeros included)."""
import functools

import torch
import torch.nn.functional as F

from .. import _core
from . import _kernels
from ._kernels import PREFIX as _PREFIX


def to_torch(array):
    """A torch tensor sharing the memory of a qatgraph result / DLPack object."""
    return torch.utils.dlpack.from_dlpack(array)


def from_torch(tensor):
    """A NumPy array sharing a CPU tensor's memory (detached)."""
    return tensor.detach().numpy()


def run(op, inputs, attrs=None, states=None):
    """Runs one qatgraph op on the CPU through the graph-free run_op: (outputs, states after
    the run) as torch tensors. Kept for callers of the earlier API; the ops below use
    qatgraph.torch's kernel layer, which also runs on CUDA."""
    return _core.run_op(op, inputs, attrs, "cpu", True, states, "torch")


def _qparam(value, dtype, shape, what, op, device):
    if torch.is_tensor(value) and value.requires_grad and torch.is_grad_enabled():
        # torch raises here too: these ops give no gradient for their qparams.
        raise _core.Error(f"{_PREFIX} {op} is not differentiable with respect to '{what}': "
                          f"pass it detached (or use LSQ for a learned {what})")
    if torch.is_tensor(value):
        if value.device != device:
            raise _core.Error(f"{_PREFIX} {op}: '{what}' is on {value.device}, the input on "
                              f"{device}")
        t = value.detach()
    elif isinstance(value, (int, float)) and not _kernels.tracing() \
            and not torch.jit.is_tracing():
        # A kept constant; a tracer records a fresh one (the traced graph must not change).
        t = _kernels.constant(value, dtype, device)
    else:
        t = torch.tensor(value, device=device)
    n = 1
    for d in shape:
        n *= d
    if t.numel() != n:
        raise _core.Error(f"{_PREFIX} {op}: expected {n} qparams, got {t.numel()} (in "
                          f"'{what}')")
    return t.to(dtype).reshape(shape)


class _SteFn(torch.autograd.Function):
    """dx = dy * mask, PyTorch's STE, on qatgraph's ste_backward_exact kernel. Linear in dy,
    so its own gradient is the same op: create_graph=True differentiates through it."""

    @staticmethod
    def forward(ctx, dy, mask):
        ctx.save_for_backward(mask)
        return _kernels.run("ste_backward_exact", None, [dy, mask])[0]

    @staticmethod
    def backward(ctx, ddx):
        (mask,) = ctx.saved_tensors
        return _SteFn.apply(ddx, mask), None


def _ste(dy, mask):
    """dx = dy * mask: the kernel, or _SteFn when the backward itself is differentiated."""
    if torch.is_grad_enabled():  # create_graph=True: a differentiable STE
        return _SteFn.apply(dy, mask)
    return _kernels.run("ste_backward_exact", None, [dy, mask])[0]


class _FakeQuantizeFn(torch.autograd.Function):
    """y = fake_quantize(x) and its bit-packed in-range mask, one kernel; backward _SteFn."""

    @staticmethod
    def forward(ctx, x, scale, zero_point, attrs):
        y, mask = _kernels.run("fake_quantize", attrs, [x, scale, zero_point])
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved_tensors
        return _ste(dy, mask), None, None, None


def _qparam_shape(x, scope, axis, group_size, op):
    """The qparam shape the kernel takes for this scope (SEMANTICS.md): [1] per tensor,
    [C] per channel, x's shape without its last axis per token, and x's shape with the group
    count along `axis` per group."""
    if scope == "tensor":
        return [1]
    if scope == "channel":
        return [x.shape[axis]]
    if scope == "token":
        return list(x.shape[:-1])
    length = x.shape[axis]
    if group_size <= 0 or length % group_size:
        raise _core.Error(f"{_PREFIX} {op}: group_size = {group_size} must divide the size "
                          f"{length} of axis {axis} of the input {list(x.shape)}")
    shape = list(x.shape)
    shape[axis] = length // group_size
    return shape


@functools.lru_cache(maxsize=256)
def _fake_quantize_attrs(scope, axis, group_size, quant_min, quant_max):
    """fake_quantize's attribute string (the kernel cache key), built once per setting."""
    attrs = {"scope": scope, "quant_min": quant_min, "quant_max": quant_max}
    if scope in ("channel", "group"):
        attrs["axis"] = axis
    if scope == "group":
        attrs["group_size"] = group_size
    return _kernels.attrs_key(attrs)


def fake_quantize(x, scale, zero_point, quant_min, quant_max, axis=None, scope=None,
                  group_size=0):
    """Affine fake quantization with the straight-through gradient:
    (clamp(rint(x / scale) + zero_point, quant_min, quant_max) - zero_point) * scale.
    scope 'tensor' (axis None), 'channel' (along `axis`), 'token' (one qparam per row of the
    last dimension) or 'group' (`group_size` consecutive elements along `axis`, default the
    last). Under torch.jit.trace it records torch's own op (per-tensor and per-channel), so
    the traced module holds no Python call and can be saved."""
    scope = scope or ("tensor" if axis is None else "channel")
    op = f"fake_quantize_per_{scope}" + ("_affine" if scope in ("tensor", "channel") else "")
    if scope in ("channel", "group"):
        axis = (-1 if axis is None else axis) % max(x.dim(), 1)
    attrs = _fake_quantize_attrs(scope, axis, int(group_size), int(quant_min), int(quant_max))
    shape = _qparam_shape(x, scope, axis, int(group_size), op)
    s = _qparam(scale, torch.float32, shape, "scale", op, x.device)
    zp = _qparam(zero_point, torch.int32, shape, "zero_point", op, x.device)
    if torch.jit.is_tracing() and scope in ("tensor", "channel"):
        if scope == "tensor":
            return torch.fake_quantize_per_tensor_affine(x, s, zp, quant_min, quant_max)
        return torch.fake_quantize_per_channel_affine(x, s, zp, axis, quant_min, quant_max)
    return _FakeQuantizeFn.apply(x, s, zp, attrs)


class _DynamicFakeQuantizeFn(torch.autograd.Function):
    """dynamic_fake_quantize: the qparams from x itself and the fake quantization, one kernel;
    backward _SteFn. The qparams are returned too (no gradient)."""

    @staticmethod
    def forward(ctx, x, attrs):
        y, mask, scale, zero_point = _kernels.run("dynamic_fake_quantize", attrs, [x])
        ctx.save_for_backward(mask)
        ctx.mark_non_differentiable(scale, zero_point)
        return y, scale, zero_point

    @staticmethod
    def backward(ctx, dy, dscale, dzero_point):
        (mask,) = ctx.saved_tensors
        return _ste(dy, mask), None


@functools.lru_cache(maxsize=256)
def _dynamic_attrs(group_size, symmetric, quant_min, quant_max, eps):
    return _kernels.attrs_key({"group_size": group_size, "quant_min": quant_min,
                               "quant_max": quant_max, "eps": eps,
                               "mode": "symmetric" if symmetric else "asymmetric"})


def dynamic_fake_quantize(x, quant_min, quant_max, group_size=0, symmetric=False, eps=None):
    """Fake quantization with qparams computed from x itself, one (scale, zero point) per
    `group_size` consecutive elements of the last dimension (0: per row, i.e. per token of an
    activation or per output channel of a [out, in] weight), with torchao's QAT arithmetic
    in x's dtype (its 8da4w activations: asymmetric; its int4 weights: symmetric), in one
    kernel. eps: the scale's floor (default: f32's epsilon). Returns (y, scale, zero_point);
    the gradient of y is the straight-through estimator dy * mask."""
    eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
    attrs = _dynamic_attrs(int(group_size), bool(symmetric), int(quant_min), int(quant_max), eps)
    return _DynamicFakeQuantizeFn.apply(x, attrs)


class _DynamicLinearPlan:
    """The kernels of one QAT linear's dynamic fake quantizations on CUDA, prepared for fixed
    input and weight types, called straight through their data pointers. _kernels.run spends
    about 50 us of host time a call on the GPU machine (checks, cache keys, four output
    allocations), and a language model's step makes hundreds of these calls: the plan leaves
    one allocation per result the backward keeps (xq, wq and their masks), and writes the
    qparams, which the linear does not keep, into scratch made once. The STE of each gradient
    runs in place on the GEMM's fresh result (each element is read before the same thread
    writes it, so the aliasing is safe)."""

    __slots__ = ("x_kernel", "w_kernel", "x_mask", "w_mask", "x_tail", "w_tail", "ste_x",
                 "ste_w", "scratch")

    def __init__(self, x, w, x_attrs, w_attrs):
        kx = _kernels.kernel("dynamic_fake_quantize", x_attrs, [x])
        kw = _kernels.kernel("dynamic_fake_quantize", w_attrs, [w])
        self.x_kernel, self.w_kernel = kx.kernel, kw.kernel
        self.x_mask, self.w_mask = kx.outputs[1], kw.outputs[1]
        self.scratch = [torch.empty(shape, dtype=dtype, device=x.device)
                        for dtype, shape in kx.outputs[2:] + kw.outputs[2:]]
        self.x_tail = [t.data_ptr() for t in self.scratch[:2]]
        self.w_tail = [t.data_ptr() for t in self.scratch[2:]]
        masks = [torch.empty(shape, dtype=dtype, device=x.device)
                 for dtype, shape in (self.x_mask, self.w_mask)]
        self.ste_x = _kernels.kernel("ste_backward_exact", "{}", [x, masks[0]]).kernel
        self.ste_w = _kernels.kernel("ste_backward_exact", "{}", [w, masks[1]]).kernel


_linear_plans = {}


def _linear_plan(x, w, x_attrs, w_attrs):
    key = (x_attrs, w_attrs, x.dtype, x.shape, w.dtype, w.shape, x.device)
    plan = _linear_plans.get(key)
    if plan is None:
        if len(_linear_plans) >= 1024:  # many shapes: start over rather than grow
            _linear_plans.clear()
        plan = _linear_plans[key] = _DynamicLinearPlan(x, w, x_attrs, w_attrs)
    return plan


def _dense(t):
    """Whether a kernel can read t in place: contiguous and 16-byte aligned."""
    return t.is_contiguous() and t.data_ptr() % 16 == 0


class _DynamicQATLinearFn(torch.autograd.Function):
    """linear(dynamic_fake_quantize(x), dynamic_fake_quantize(w), b) as one autograd node:
    the two fake quantizations (one kernel each) and the GEMM forward; backward the GEMMs
    PyTorch's linear runs and the STE of each input. One node instead of three keeps the
    host's per-layer work small, which a language model's step (hundreds of linears) is
    bound by; the plan (_DynamicLinearPlan) keeps each kernel call small too."""

    @staticmethod
    def forward(ctx, x, w, b, x_attrs, w_attrs):
        ctx.has_bias = b is not None
        ctx.plan = None
        if _kernels._compiling([x, w]) or not (_dense(x) and _dense(w)):
            xq, x_mask = _kernels.run("dynamic_fake_quantize", x_attrs, [x])[:2]
            wq, w_mask = _kernels.run("dynamic_fake_quantize", w_attrs, [w])[:2]
        else:
            plan = ctx.plan = _linear_plan(x, w, x_attrs, w_attrs)
            xq, wq = torch.empty_like(x), torch.empty_like(w)
            x_mask = torch.empty(plan.x_mask[1], dtype=plan.x_mask[0], device=x.device)
            w_mask = torch.empty(plan.w_mask[1], dtype=plan.w_mask[0], device=x.device)
            stream = _kernels.stream(x.device)
            plan.x_kernel.run([x.data_ptr()], [xq.data_ptr(), x_mask.data_ptr()] + plan.x_tail,
                              [], True, stream)
            plan.w_kernel.run([w.data_ptr()], [wq.data_ptr(), w_mask.data_ptr()] + plan.w_tail,
                              [], True, stream)
        ctx.save_for_backward(xq, wq, x_mask, w_mask)
        return F.linear(xq, wq, b)

    @staticmethod
    def backward(ctx, dy):
        xq, wq, x_mask, w_mask = ctx.saved_tensors
        plan = ctx.plan
        # In place on the GEMM's result when it is a dense tensor of the input's type (not
        # when the backward itself is differentiated: _ste's autograd form then).
        fast = plan is not None and not torch.is_grad_enabled()
        stream = _kernels.stream(dy.device) if fast else 0
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = dy.matmul(wq)
            if fast and dx.dtype == xq.dtype and dx.shape == xq.shape and _dense(dx):
                plan.ste_x.run([dx.data_ptr(), x_mask.data_ptr()], [dx.data_ptr()], [], True,
                               stream)
            else:
                dx = _ste(dx, x_mask)
        if ctx.needs_input_grad[1]:
            dy2 = dy.reshape(-1, dy.shape[-1])
            dw = dy2.t().mm(xq.reshape(-1, xq.shape[-1]))
            if fast and dw.dtype == wq.dtype and _dense(dw):
                plan.ste_w.run([dw.data_ptr(), w_mask.data_ptr()], [dw.data_ptr()], [], True,
                               stream)
            else:
                dw = _ste(dw, w_mask)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.reshape(-1, dy.shape[-1]).sum(0)
        return dx, dw, db, None, None


def dynamic_qat_linear(x, w, b, x_attrs, w_attrs):
    """The fused QAT linear of the dynamic recipes (8da4w, w8a8_dynamic) on CUDA: x_attrs and
    w_attrs are dynamic_fake_quantize's attribute keys (the quantizers' dynamic_attrs)."""
    return _DynamicQATLinearFn.apply(x, w, b, x_attrs, w_attrs)


def fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max):
    """torch.fake_quantize_per_tensor_affine's signature and results."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max)


def fake_quantize_per_channel_affine(input, scale, zero_point, axis, quant_min, quant_max):
    """torch.fake_quantize_per_channel_affine's signature and results."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max, axis=axis)


def fake_quantize_per_token(input, scale, zero_point, quant_min, quant_max):
    """One (scale, zero_point) per row of the last dimension (numel / shape[-1] of each)."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max, scope="token")


def fake_quantize_per_group(input, scale, zero_point, group_size, quant_min, quant_max,
                            axis=-1):
    """One (scale, zero_point) per `group_size` consecutive elements along `axis` (default
    the last), in row-major order of the groups."""
    return fake_quantize(input, scale, zero_point, quant_min, quant_max, axis=axis,
                         scope="group", group_size=group_size)


class _LsqFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, zero_point, attrs):
        ctx.save_for_backward(x, scale, zero_point)
        ctx.attrs = attrs
        return _kernels.run("lsq_fake_quantize", attrs, [x, scale, zero_point])[0]

    @staticmethod
    def backward(ctx, dy):
        x, scale, zero_point = ctx.saved_tensors
        dx, dscale, dzero = _kernels.run("lsq_backward", ctx.attrs, [dy, x, scale, zero_point])
        return dx, dscale.reshape(scale.shape), dzero.reshape(zero_point.shape), None


def lsq_fake_quantize(x, scale, zero_point, quant_min, quant_max, grad_factor=None, axis=None):
    """Learned step size quantization (LSQ, Esser et al.): fake quantization whose scale (and
    zero point, a float) are learned, per tensor or per channel along `axis`; gradients as
    qatgraph's lsq_backward (SEMANTICS.md), scaled by `grad_factor` (None: the paper's
    1 / sqrt(numel * quant_max))."""
    attrs = {"quant_min": int(quant_min), "quant_max": int(quant_max)}
    if grad_factor is not None:
        attrs["grad_factor"] = float(grad_factor)
    if axis is not None:
        attrs.update({"scope": "channel", "axis": axis % x.dim()})
    return _LsqFn.apply(x, scale, zero_point, _kernels.attrs_key(attrs))


def dynamic_quantize_per_token(x, bits=8, symmetric=False):
    """Per-token dynamic quantization: (codes, scale, zero_point), one scale per row of the
    last dimension computed from the row's range (qatgraph's dynamic_range_quantize)."""
    attrs = {"scope": "token", "bits": int(bits), "signed": True,
             "mode": "symmetric" if symmetric else "affine"}
    return _kernels.run("dynamic_range_quantize", attrs, [x.detach()])


def int4_pack(w, group_size=128, symmetric=False):
    """Packs w (2-D, groups along the last axis) into int4 codes, two per byte, with one
    scale and zero point per group: (packed, scale, zero_point)."""
    attrs = {"group_size": int(group_size), "mode": "symmetric" if symmetric else "asymmetric"}
    return _kernels.run("int4_quantize_pack", attrs, [w.detach()])


def nf4_pack(w, group_size=64):
    """Packs w into NF4 codes (QLoRA's 16 normal-float levels), two per byte, with one absmax
    per group: (packed, absmax)."""
    return _kernels.run("nf4_quantize_pack", {"group_size": int(group_size)}, [w.detach()])


def check_errors(device=None):
    """Waits for the current CUDA stream and raises what a qatgraph kernel recorded there (a
    scale <= 0, a zero point out of range): CUDA kernels cannot raise as they run."""
    _kernels.check_errors(device)
