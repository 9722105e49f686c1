"""Observer statistics synced across torch.distributed ranks, as qatgraph's own data-parallel
trainer syncs them: every rank's observer sees the global batch.

Data parallelism splits a batch over ranks; an observer that only sees its rank's share ends
each step with that rank's range, so the ranks quantize with different qparams (torch.ao's
observers under DistributedDataParallel do). Synced, one observer step is:

1. the rank's batch range per tensor or channel: qatgraph's min-max observer kernel from
   fresh states, which skips non-finite values as every qatgraph observer does (a rank whose
   batch holds none gives the empty range (+inf, -inf), which changes nothing below);
2. one all-reduce MAX of the stacked [-min, max]: the global batch's range (MIN of the mins
   is -MAX of the negated mins, exact), the same on every rank;
3. the module's own observer kernel fed the [2, channels] tensor of that range: its batch
   range is the global one, so it applies exactly the update (running min-max, or the moving
   average with its averaging constant) that one process observing the concatenated global
   batch applies, and writes the same qparams on every rank.

All of it runs on the input's device in stream order (NCCL reduces on a stream ordered after
torch's current one; gloo's CPU all-reduce is synchronous by nature): nothing waits for a GPU.
"""
import warnings

import torch

from .. import _core
from . import _kernels

PREFIX = "[qatgraph.torch]"


def _distributed():
    """torch.distributed where this torch build has it, else None."""
    dist = getattr(torch, "distributed", None)
    return dist if dist is not None and dist.is_available() else None


def _initialized():
    dist = _distributed()
    return dist is not None and dist.is_initialized()


def check_mode(value, who):
    """sync_observers must be None (sync when a process group of several ranks exists), True
    (sync; a process group must exist) or False (never)."""
    if value is not None and not isinstance(value, bool):
        raise _core.Error(f"{PREFIX} {who}: sync_observers must be None, True or False, got "
                          f"{type(value).__name__} {value!r}")
    return value


def require_process_group(who):
    """sync_observers=True: raises qatgraph.Error when there is no process group to sync in."""
    if _distributed() is None:
        raise _core.Error(f"{PREFIX} {who}: sync_observers=True needs torch.distributed, which "
                          "this torch build lacks (pass sync_observers=None or False)")
    if not _initialized():
        raise _core.Error(f"{PREFIX} {who}: sync_observers=True needs an initialized "
                          "torch.distributed process group; call "
                          "torch.distributed.init_process_group first (or pass "
                          "sync_observers=None to sync only when one exists)")


class GroupRef:
    """The process group a quantizer syncs in (None: the default group). Module copies share
    it (a group belongs to the process and cannot be copied); a pickled quantizer keeps only
    "the default group": an explicit group does not outlive its process, so an unpickled
    quantizer that would sync in it raises instead of syncing in another group."""

    __slots__ = ("group", "lost")

    def __init__(self, group=None, lost=False):
        self.group, self.lost = group, lost

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (GroupRef, (None, self.lost or self.group is not None))


def active_group(mode, ref, who):
    """The process group to sync in on this call, or None (no sync): mode None syncs when
    torch.distributed is initialized and the group has more than one rank, True also
    requires the process group, False never syncs."""
    if mode is False:
        return None
    if not _initialized():
        if mode:
            require_process_group(who)
        return None
    if ref.lost:
        raise _core.Error(f"{PREFIX} {who}: its process group did not survive pickling (a "
                          "group belongs to the process that made it); set "
                          "`.process_group` again, or to None for the default group")
    dist = _distributed()
    group = ref.group if ref.group is not None else dist.group.WORLD
    return group if dist.get_world_size(group) > 1 else None


_warned = set()


def unsyncable(mode, observer, who):
    """An observer whose statistics qatgraph's kernels do not compute cannot be synced:
    qatgraph.Error where the sync was asked for (True), a warning (once per observer type)
    where it was the default."""
    name = type(observer).__name__
    text = (f"{PREFIX} {who}: cannot sync {name} across ranks (only the observers qatgraph "
            "computes sync: MinMaxObserver, MovingAverageMinMaxObserver and their per-channel "
            "variants); each rank keeps its own statistics")
    if mode:
        raise _core.Error(text + " (pass sync_observers=False to accept that)")
    if name not in _warned:
        _warned.add(name)
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def global_batch(x, axis, channels, nonfinite_count, enabled, group):
    """A [2, channels] f32 tensor (rows: min, max) of the global batch's finite range per
    channel along `axis` of x (axis None: per tensor, a [2] tensor), on x's device; the
    rank's non-finite values are added to `nonfinite_count`. Every rank must call it."""
    attrs = {} if axis is None else {"scope": "channel", "axis": axis}
    lo = torch.full([channels], float("inf"), dtype=torch.float32, device=x.device)
    hi = torch.full([channels], float("-inf"), dtype=torch.float32, device=x.device)
    _kernels.run("minmax_observer", attrs, [x], [lo, hi, nonfinite_count, enabled])
    both = torch.stack([lo.neg_(), hi])
    _distributed().all_reduce(both, op=_distributed().ReduceOp.MAX, group=group)
    both[0].neg_()
    return both if axis is not None else both.view(-1)
