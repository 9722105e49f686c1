"""FakeQuantize: torch.ao.quantization.FakeQuantize's module (constructor, buffers, state_dict
names, switches, calculate_qparams, with_args) running qatgraph's observer and fake-quantize
kernels."""
import torch
from torch.ao import quantization as tq

from .. import _core
from ._kernels import attrs_key
from ._kernels import run as run_kernel
from . import _kernels
from . import observer_sync
from .functional import _FakeQuantizeFn, _fake_quantize_attrs, fake_quantize

_PREFIX = "[qatgraph.torch] FakeQuantize"
_PER_TENSOR = (torch.per_tensor_affine, torch.per_tensor_symmetric)
_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_symmetric)
_SYMMETRIC = (torch.per_tensor_symmetric, torch.per_channel_symmetric)

# torch observers whose statistics a qatgraph op computes: (op, per-channel). Exact types
# only: a subclass may change the statistics, so it runs its own forward.
_OBSERVER_OPS = {
    tq.MinMaxObserver: ("minmax_observer", False),
    tq.MovingAverageMinMaxObserver: ("moving_average_observer", False),
    tq.PerChannelMinMaxObserver: ("minmax_observer", True),
    tq.MovingAveragePerChannelMinMaxObserver: ("moving_average_observer", True),
}


def _observer_dtype(observer, kwargs):
    # torch.ao reads the dtype from the kwargs, or from a with_args wrapper's keywords.
    keywords = getattr(getattr(observer, "p", None), "keywords", {})
    return keywords.get("dtype", kwargs.get("dtype", torch.quint8))


class _FastFakeQuantizeFn(torch.autograd.Function):
    """FakeQuantize's fast path: the prepared fake_quantize kernel on the kept qparam pointers;
    the backward is the functional op's (PyTorch's STE bit for bit)."""

    @staticmethod
    def forward(ctx, x, prepared, qparams, stream):
        y, mask = _kernels.empty_outputs(prepared, x.device)
        prepared.kernel.run([x.data_ptr()] + qparams, [y.data_ptr(), mask.data_ptr()], [], True,
                            stream)
        ctx.save_for_backward(mask)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _FakeQuantizeFn.backward(ctx, dy)


class FakeQuantize(tq.FakeQuantizeBase):
    """torch.ao.quantization.FakeQuantize on qatgraph's kernels.

    FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
    **observer_kwargs), as torch.ao's: the observer module is built the same way and kept as
    `activation_post_process`, so the state_dict (scale, zero_point, fake_quant_enabled,
    observer_enabled, activation_post_process.min_val / max_val / eps) loads both ways between
    this module and torch.ao's. With torch's MinMaxObserver, MovingAverageMinMaxObserver or
    their per-channel variants, the observer statistics and qparams are computed by qatgraph's
    observer op (which, unlike torch's, ignores non-finite values); any other observer runs
    its own forward. Fake quantization always uses this module's `scale` and `zero_point`
    buffers, so values set by hand or loaded are honoured while the observer is off.
    torch.ao.quantization's disable_observer / enable_fake_quant ... work through
    `model.apply` (this is a FakeQuantizeBase), and `with_args` puts it in a QConfig.

    sync_observers (keyword; also an attribute): None syncs the observer across the ranks of
    `process_group` (None: torch.distributed's default group) whenever torch.distributed is
    initialized and the group has more than one rank; True requires an initialized process
    group (qatgraph.Error otherwise); False never syncs. Synced, every rank's statistics and
    qparams are those of one process observing the global batch (see observer_sync); every
    rank must then call the module the same number of times with the observer on, in
    training mode (in eval mode nothing is synced, so a rank may evaluate alone). Neither
    attribute is in the state_dict.
    """

    scale: torch.Tensor
    zero_point: torch.Tensor
    # TorchScript (a traced module's exports) has no type for a process group.
    __jit_unused_properties__ = ["process_group"]

    def __init__(self, observer=tq.MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
                 *, sync_observers=None, process_group=None, **observer_kwargs):
        super().__init__()
        self.sync_observers = observer_sync.check_mode(sync_observers, _PREFIX)
        self._process_group = observer_sync.GroupRef(process_group)
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                raise _core.Error(f"{_PREFIX}: quant_min = {quant_min} must be <= quant_max = "
                                  f"{quant_max}")
            dtype = _observer_dtype(observer, observer_kwargs)
            info = torch.iinfo(dtype)
            if quant_min < info.min or quant_max > info.max:
                raise _core.Error(f"{_PREFIX}: [{quant_min}, {quant_max}] is outside {dtype}'s "
                                  f"range [{info.min}, {info.max}]")
            observer_kwargs.update({"quant_min": quant_min, "quant_max": quant_max})
        self.activation_post_process = observer(**observer_kwargs)
        obs = self.activation_post_process
        self.quant_min, self.quant_max = obs.quant_min, obs.quant_max
        self.dtype, self.qscheme = obs.dtype, obs.qscheme
        if self.qscheme not in _PER_TENSOR + _PER_CHANNEL:
            raise _core.Error(f"{_PREFIX}: qscheme {self.qscheme} is not supported (per-tensor "
                              "or per-channel, affine or symmetric, integer zero points)")
        self.ch_axis = getattr(obs, "ch_axis", -1)
        self.is_per_channel = self.qscheme in _PER_CHANNEL
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=torch.int))
        self._host_flags = {"fake_quant": True, "observer": True}
        # Kernel-side observer state outside torch.ao's state_dict (see _initialized).
        self._qg_state = {}

    @property
    def process_group(self):
        """The torch.distributed process group the observer syncs in (None: the default)."""
        return self._process_group.group

    @process_group.setter
    def process_group(self, group):
        self._process_group = observer_sync.GroupRef(group)

    def _sync_group(self):
        """The process group to sync this call's statistics in, or None. Only in training
        mode, as DDP syncs its buffers: a rank evaluating alone (the usual rank-0
        validation) must not wait for the others; an eval-mode observer that is still
        enabled observes this rank's batch, as torch.ao's does."""
        if not self.training:
            return None
        return observer_sync.active_group(self.sync_observers, self._process_group, _PREFIX)

    @torch.jit.export
    def calculate_qparams(self):
        """(scale, zero_point) from the observer's statistics, as torch.ao computes them."""
        return self.activation_post_process.calculate_qparams()

    # The switches. torch.ao tests `observer_enabled[0] == 1` in every forward, which waits for
    # the device when the buffer is on a GPU. Here a host copy of each flag is read instead:
    # it follows enable_*/disable_* (what torch.ao.quantization's apply helpers call) and
    # every state_dict load. A CPU buffer is read directly.
    @torch.jit.unused  # TorchScript (a traced module's exports) cannot follow the host flags
    def enable_fake_quant(self, enabled: bool = True):
        """Switches fake quantization on or off (torch.ao's method; the host flag follows)."""
        super().enable_fake_quant(enabled)
        self._host_flags["fake_quant"] = bool(enabled)
        return self

    @torch.jit.unused
    def enable_observer(self, enabled: bool = True):
        """Switches the observer on or off (torch.ao's method; the host flag follows)."""
        super().enable_observer(enabled)
        self._host_flags["observer"] = bool(enabled)
        return self

    def _flag(self, name):
        buffer = getattr(self, f"{name}_enabled")
        if buffer.device.type == "cpu":
            return bool(buffer[0] == 1)
        return self._host_flags[name]

    def forward(self, X):
        """Observes X (observer on) into `scale` / `zero_point`, then fake-quantizes X with
        them (fake quant on); X's device, nothing waits for it."""
        out = self._fast_forward(X)
        if out is not None:
            return out
        observe, quant = self._flag("observer"), self._flag("fake_quant")
        if observe:
            self._observe(X.detach())
        if quant:
            axis = self.ch_axis if self.is_per_channel else None
            Y = fake_quantize(X, self.scale, self.zero_point, self.quant_min, self.quant_max, axis)
        self._record_fast(X, observe, quant)
        return Y if quant else X

    # The fast path. A training step calls each quantizer once per batch with the same input
    # type, so after one call through the checks above, the kernels and the data pointers of
    # the statistics and qparams are kept; later calls with that input type run the two
    # kernels directly (the Python around them was most of a call's cost on a GPU host).
    # The kept pointers are compared with the buffers' current ones on every call, so a
    # resize, a load or a move takes the full path again.
    def __getstate__(self):
        # Copies and pickles leave the kept kernels and pointers behind (they belong to this
        # process and these buffers); the next forward prepares them again.
        state = self.__dict__.copy()
        state["_qg_state"] = {}
        return state

    def __setstate__(self, state):
        # Modules pickled before the sync options existed load with the defaults.
        super().__setstate__(state)
        self.__dict__.setdefault("sync_observers", None)
        self.__dict__.setdefault("_process_group", observer_sync.GroupRef())

    def _watched(self):
        obs = self.activation_post_process
        return (obs.min_val.data_ptr(), obs.max_val.data_ptr(), self.scale.data_ptr(),
                self.zero_point.data_ptr(), tuple(self.scale.shape),
                id(self._qg_state.get("initialized")), id(self._qg_state.get("nonfinite_count")))

    def _fast_forward(self, X):
        if type(X) not in (torch.Tensor, torch.nn.Parameter) or torch.jit.is_tracing() \
                or _kernels.tracing():
            return None
        observe, quant = self._flag("observer"), self._flag("fake_quant")
        entry = self._qg_state.get(("fast", X.shape, X.dtype, X.device, observe, quant))
        if entry is None or entry["watched"] != self._watched():
            return None
        if observe and self._sync_group() is not None:
            return None  # the kept observer kernel would see this rank's batch only
        if not X.is_contiguous() or X.data_ptr() % 16:
            return None
        stream = _kernels.stream(X.device)
        if observe:
            entry["observer"].run([X.data_ptr()], entry["qparams"], entry["states"], True, stream)
        if quant:
            return _FastFakeQuantizeFn.apply(X, entry["fake_quantize"], entry["qparams"], stream)
        return X

    def _record_fast(self, X, observe, quant):
        if type(X) not in (torch.Tensor, torch.nn.Parameter) or torch.jit.is_tracing() \
                or _kernels.tracing() or not X.is_contiguous():
            return
        if self.scale.dtype != torch.float32 or self.zero_point.dtype != torch.int32:
            return
        entry = {"qparams": [self.scale.data_ptr(), self.zero_point.data_ptr()]}
        x = X.detach()
        if observe:
            obs = self.activation_post_process
            kind = _OBSERVER_OPS.get(type(obs))
            attrs = self._qg_state.get(("attrs_key", X.dim()))
            if kind is None or attrs is None:
                return  # torch's own observer ran
            entry["observer"] = _kernels.kernel(kind[0], attrs, [x]).kernel
            entry["states"] = [t.data_ptr() for t in self._qg_state["observer_states"]]
        if quant:
            axis = self.ch_axis % X.dim() if self.is_per_channel else None
            scope = "channel" if self.is_per_channel else "tensor"
            attrs = _fake_quantize_attrs(scope, axis, 0, int(self.quant_min),
                                         int(self.quant_max))
            if self.scale.shape != torch.Size([X.shape[axis] if self.is_per_channel else 1]):
                return
            entry["fake_quantize"] = _kernels.kernel("fake_quantize", attrs,
                                                     [x, self.scale, self.zero_point])
        entry["watched"] = self._watched()
        self._qg_state[("fast", X.shape, X.dtype, X.device, observe, quant)] = entry

    def _set_qparams(self, scale, zero_point):
        with torch.no_grad():
            if self.scale.shape != scale.shape:
                self.scale.resize_(scale.shape)
                self.zero_point.resize_(zero_point.shape)
            self.scale.copy_(scale)
            self.zero_point.copy_(zero_point)

    def _observe(self, x):
        """Updates the observer's statistics with x and writes the qparams into `scale` and
        `zero_point`: one qatgraph observer kernel, on x's device, without waiting for it."""
        obs = self.activation_post_process
        kind = _OBSERVER_OPS.get(type(obs))
        attrs = None
        if kind is not None:
            # Read once per input rank (the observer's eps is a tensor: reading it waits for
            # the device) and again after a state_dict load.
            key = ("attrs", x.dim())
            if key not in self._qg_state:
                self._qg_state[key] = self._observer_attrs(kind[1], x.dim())
            attrs = self._qg_state[key]
        group = None if torch.jit.is_tracing() else self._sync_group()
        if attrs is None or torch.jit.is_tracing():
            if group is not None:
                observer_sync.unsyncable(self.sync_observers, obs, _PREFIX)
            obs(x)
            self._set_qparams(*self.calculate_qparams())
            return
        op, per_channel = kind
        channels = x.shape[attrs["axis"]] if per_channel else 1
        with torch.no_grad():
            if obs.min_val.numel() == 0:  # a per-channel observer before its first batch
                obs.min_val.resize_([channels]).fill_(float("inf"))
                obs.max_val.resize_([channels]).fill_(float("-inf"))
            if obs.min_val.numel() != channels:
                raise _core.Error(f"{_PREFIX}: the observer holds {obs.min_val.numel()} "
                                  f"channels, the input has {channels} along axis "
                                  f"{attrs['axis']}")
            if obs.min_val.device != x.device:
                raise _core.Error(f"{_PREFIX}: the observer's statistics are on "
                                  f"{obs.min_val.device}, the input on {x.device} (move the "
                                  "module with .to())")
            # The statistics are updated in place, through flat views of torch's buffers.
            states = [obs.min_val.view(-1), obs.max_val.view(-1)]
            if op == "moving_average_observer":
                states.append(self._initialized(channels, obs))
            states += [self._nonfinite_count(x.device), self.observer_enabled]
            self._qg_state["observer_states"] = states  # what the fast path keeps pointers of
            shape = [channels]
            if self.scale.shape != torch.Size(shape):
                self.scale.resize_(shape)
                self.zero_point.resize_(shape)
            key = ("attrs_key", x.dim())
            if group is not None:  # the global batch's range stands in for x
                x, states, attrs = self._global_batch(x, attrs, per_channel, channels, states,
                                                      group)
                key = ("sync_attrs_key", x.dim())  # not the fast path's: another axis
            if key not in self._qg_state:
                self._qg_state[key] = attrs_key(attrs)
            run_kernel(op, self._qg_state[key], [x], states,
                       outputs=[self.scale, self.zero_point])

    def _global_batch(self, x, attrs, per_channel, channels, states, group):
        """(input, states, attributes) that make the observer kernel apply the update of
        the global batch: the [2, channels] tensor of its range (channel axis 1; [2] per
        tensor), the states with a scratch non-finite count (the synthetic input's infinities
        are not data; x's own are counted here), the attributes with that axis."""
        count, enabled = states[-2], states[-1]
        axis = attrs["axis"] if per_channel else None
        x = observer_sync.global_batch(x, axis, channels, count, enabled, group)
        scratch = self._qg_state.get("sync_scratch_count")
        if scratch is None or scratch.device != x.device:
            scratch = torch.zeros([1], dtype=torch.int64, device=x.device)
            self._qg_state["sync_scratch_count"] = scratch
        if axis is not None:
            attrs = dict(attrs, axis=1)
        return x, states[:-2] + [scratch, enabled], attrs

    def _initialized(self, channels, obs):
        """The moving-average observer's per-channel "has seen a batch" flags: kept beside the
        statistics (not in the state_dict, which stays torch.ao's), set by the kernel, and
        rebuilt from torch's first-batch test (an untouched (inf, -inf) range) whenever the
        statistics come from elsewhere (a load, torch's own observer, a new shape)."""
        flags = self._qg_state.get("initialized")
        if flags is None or flags.numel() != channels or flags.device != obs.min_val.device:
            fresh = (obs.min_val == float("inf")).all() & (obs.max_val == float("-inf")).all()
            flags = (~fresh).to(torch.uint8).expand(channels).contiguous()
            self._qg_state["initialized"] = flags
        return flags

    def _nonfinite_count(self, device):
        count = self._qg_state.get("nonfinite_count")
        if count is None or count.device != device:
            count = torch.zeros([1], dtype=torch.int64, device=device)
            self._qg_state["nonfinite_count"] = count
        return count

    def _observer_attrs(self, per_channel, ndim):
        """The qatgraph observer attributes of torch's observer, or None where qatgraph's
        qparams would differ from torch's (then torch's observer runs)."""
        obs = self.activation_post_process
        attrs = {"qscheme": "symmetric" if obs.qscheme in _SYMMETRIC else "affine",
                 "eps": float(obs.eps)}
        customized = getattr(obs, "has_customized_qrange", True)
        if obs.dtype in (torch.quint8, torch.qint8) and not customized:
            signed = obs.dtype == torch.qint8
            attrs.update({"bits": 8, "signed": signed, "reduce_range": bool(obs.reduce_range)})
            qg_zero_point = 0 if signed else 128
        else:
            attrs.update({"quant_min": int(obs.quant_min), "quant_max": int(obs.quant_max)})
            qg_zero_point = 0 if obs.quant_min < 0 else (obs.quant_min + obs.quant_max) // 2
        if obs.qscheme in _SYMMETRIC and qg_zero_point != self._torch_symmetric_zero_point():
            return None
        if hasattr(obs, "averaging_constant"):
            attrs["averaging_constant"] = float(obs.averaging_constant)
        if per_channel:
            attrs.update({"scope": "channel", "axis": obs.ch_axis % ndim})
        return attrs

    def _torch_symmetric_zero_point(self):
        # torch.ao's _calculate_qparams: unsigned 8-bit types take 128 (the midpoint of a
        # customized range), uint16 2^15, every other type 0.
        obs = self.activation_post_process
        if obs.dtype in (torch.quint8, getattr(torch, "uint8", None)):
            customized = getattr(obs, "has_customized_qrange", True)
            return (obs.quant_min + obs.quant_max) // 2 if customized else 128
        if obs.dtype == getattr(torch, "uint16", object()):
            return 2 ** 15
        return 0

    @torch.jit.export
    def extra_repr(self):
        """torch.ao's summary of the switches, range and qparams."""
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
                f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
                f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # scale and zero_point take the checkpoint's shape (per-channel qparams load into the
        # [1]-shaped buffers of a module that has not run yet), as torch.ao's module does.
        for name in ("scale", "zero_point"):
            key = prefix + name
            if key in state_dict:
                getattr(self, name).resize_(state_dict[key].shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        # Loaded switches and statistics: the host flags are read back (one wait, at load
        # time) and the observer's first-batch flags rebuilt on the next forward.
        self._host_flags = {"fake_quant": bool(self.fake_quant_enabled[0] == 1),
                            "observer": bool(self.observer_enabled[0] == 1)}
        self._qg_state = {}
