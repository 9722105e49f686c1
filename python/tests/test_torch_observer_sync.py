"""qatgraph.torch's observers synced across torch.distributed ranks: two gloo ranks on the CPU,
each observing its own half of a batch, end every step with the statistics and qparams of one
process observing the whole batch, bit for bit; unsynced (torch.ao's behaviour under DDP) they
do not. Also a prepared MLP under DistributedDataParallel, and the errors."""
import contextlib
import copy
import datetime
import inspect
import io
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.ao import quantization as tq  # noqa: E402

import qatgraph as qg  # noqa: E402
import qatgraph.torch as qgt  # noqa: E402

WORLD = 2
ROWS = 4  # each rank's share of the batch
STEPS = 5

# Observers qatgraph computes, per tensor and per channel (along axis 1 of a [8, 6, 3] batch).
CONFIGS = {
    "minmax_tensor": dict(observer=tq.MinMaxObserver, quant_min=0, quant_max=255),
    "average_tensor": dict(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                           reduce_range=True),
    "minmax_channel": dict(observer=tq.PerChannelMinMaxObserver, quant_min=0, quant_max=255,
                           ch_axis=1),
    "average_channel": dict(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128,
                            quant_max=127, dtype=torch.qint8,
                            qscheme=torch.per_channel_symmetric, ch_axis=1,
                            averaging_constant=0.25),
}
CASES = [(name, torch.float32) for name in CONFIGS] + [("average_tensor", torch.bfloat16),
                                                        ("minmax_channel", torch.bfloat16)]


def rank_batch(step, rank, dtype=torch.float32):
    """Rank `rank`'s share of step `step`'s batch: rank 1's range is wider, so unsynced ranks
    disagree. At step 0 rank 1 holds no finite value (NaN and infinities); at step 3 one row of
    rank 0's is NaN."""
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(ROWS, 6, 3, generator=g) * (1 + 2 * rank + step) + (rank - 0.5) * step
    if step == 0 and rank == 1:
        x = torch.tensor([float("nan"), float("inf"), float("-inf")]).repeat(ROWS, 6, 1)
    if step == 3 and rank == 0:
        x[1] = float("nan")
    return x.to(dtype)


def global_batch(step, dtype=torch.float32):
    return torch.cat([rank_batch(step, r, dtype) for r in range(WORLD)])


def record(fq, y):
    obs = fq.activation_post_process
    return {"min_val": obs.min_val.cpu(), "max_val": obs.max_val.cpu(),
            "scale": fq.scale.cpu(), "zero_point": fq.zero_point.cpu(), "y": y.detach().cpu()}


def bits(t):
    """The tensor's bit patterns (so -0.0 differs from +0.0 and NaNs compare equal)."""
    t = t.detach().contiguous()
    if t.is_floating_point():
        return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])
    return t


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


# ---- the ranks ------------------------------------------------------------------------------

def _rank_main(rank, case, store, out_dir, backend):
    # NCCL: one GPU a rank, the CUDA kernels and the all-reduce on torch's current stream.
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        result = globals()[case](rank, device)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def spawn(case, tmp_path, backend="gloo"):
    """Runs the function named `case` on WORLD ranks; returns each rank's result."""
    mp.spawn(_rank_main, args=(case, str(tmp_path / "store"), str(tmp_path), backend),
             nprocs=WORLD)
    return [load(tmp_path / f"{rank}.pt") for rank in range(WORLD)]


def load(source):
    # Newer torch loads weights only by default; these files hold modules and plain data.
    if "weights_only" in inspect.signature(torch.load).parameters:
        return torch.load(source, weights_only=False)
    return torch.load(source)


@contextlib.contextmanager
def host_sync_is_an_error(device):
    """On CUDA, torch raises for any operation that waits for the device (the first call of
    a quantizer reads its observer's eps once, so this wraps the later ones)."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def observe_steps(fq, batches):
    steps = []
    for step, x in enumerate(batches):
        with host_sync_is_an_error(x.device) if step else contextlib.nullcontext():
            y = fq(x)
        steps.append(record(fq, y))
    return steps


def case_quantizers(rank, device):
    """Every CASE with sync_observers None (the default), True and False, over STEPS steps."""
    out = {}
    for name, dtype in CASES:
        batches = [rank_batch(s, rank, dtype).to(device) for s in range(STEPS)]
        for mode in (None, True, False):
            fq = qgt.FakeQuantize(**CONFIGS[name], sync_observers=mode).to(device)
            out[(name, str(dtype), mode)] = observe_steps(fq, batches)
        # Unsynced first (every rank observing the same batch), synced afterwards: the
        # kernels kept for the fast path after the first call must not skip the sync.
        fq = qgt.FakeQuantize(**CONFIGS[name], sync_observers=False).to(device)
        steps = observe_steps(fq, [rank_batch(1, 0, dtype).to(device)])
        fq.sync_observers = None
        out[(name, str(dtype), "toggled")] = steps + observe_steps(fq, batches[1:])
    return out


def case_model(rank, device):
    """A prepared MLP trained 3 steps under DDP on each rank's data, synced and not."""
    out = {}
    # DDP's default broadcast of rank 0's buffers at each forward does not hide a missing
    # sync: each rank observes its batch after it. Without the broadcast, only the sync keeps
    # the ranks' statistics together from step to step.
    for mode, broadcast in ((None, True), (None, False), (False, True)):
        torch.manual_seed(0)
        model = qgt.prepare_qat(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4)),
                                sync_observers=mode)
        ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=broadcast)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(3):
            x = rank_batch(step + 1, rank)[:, :, 0]
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
        out[(mode, broadcast)] = {k: v.clone() for k, v in model.state_dict().items()}
        out[(mode, "weight_sync")] = [m.weight_fake_quant.sync_observers for m in model
                                      if isinstance(m, qgt.QATLinear)]
    return out


def case_errors(rank, device):
    """What needs a process group: quantizers qatgraph cannot sync, pickled groups."""
    x = rank_batch(1, rank)
    # An observer qatgraph does not compute: an error where the sync was asked for, a warning
    # (and each rank's own statistics) where it was the default.
    fq = qgt.FakeQuantize(observer=tq.HistogramObserver, quant_min=0, quant_max=255,
                          sync_observers=True)
    with pytest.raises(qg.Error, match="cannot sync HistogramObserver"):
        fq(x)
    fq = qgt.FakeQuantize(observer=tq.HistogramObserver, quant_min=0, quant_max=255)
    with pytest.warns(RuntimeWarning, match="cannot sync HistogramObserver"):
        fq(x)
    qconfig = tq.get_default_qat_qconfig("fbgemm", version=0)  # torch.ao's own FakeQuantize
    with pytest.raises(qg.Error, match=r"'0.activation_post_process' is a FakeQuantize, whose "
                                       "statistics qatgraph cannot sync"):
        qgt.prepare_qat(nn.Sequential(nn.Linear(3, 3)), qconfig, sync_observers=True)
    # A copy shares the explicit group (and syncs in it); a pickled one has lost it.
    group = dist.new_group(list(range(WORLD)))
    fq = qgt.FakeQuantize(process_group=group)
    twin = copy.deepcopy(fq)
    assert twin.process_group is group
    twin(x)
    buffer = io.BytesIO()
    torch.save(fq, buffer)
    buffer.seek(0)
    loaded = load(buffer)
    assert loaded.process_group is None
    with pytest.raises(qg.Error, match="process group did not survive pickling"):
        loaded(x)
    loaded.process_group = None  # the default group again
    loaded(x)
    # In eval mode nothing syncs: rank 0 evaluates alone (a sync would wait for rank 1
    # until the timeout) and observes its own batch.
    evaluated = qgt.FakeQuantize(sync_observers=True).eval()
    if rank == 0:
        evaluated(x)
        alone_ref = qgt.FakeQuantize(sync_observers=False)
        alone_ref(x)
        assert same_bits(evaluated.scale, alone_ref.scale)
    # A group of one rank has nothing to sync with.
    alone = [dist.new_group([r]) for r in range(WORLD)][rank]
    single = qgt.FakeQuantize(process_group=alone, sync_observers=True)
    single(x)
    return {"twin": record(twin, x), "single": record(single, x)}


# ---- the tests ------------------------------------------------------------------------------

def reference(name, dtype, device, first=None):
    """One process observing the global batches (no process group here: no sync); `first`
    replaces the first one."""
    fq = qgt.FakeQuantize(**CONFIGS[name]).to(device)
    batches = [global_batch(s, dtype) for s in range(STEPS)]
    if first is not None:
        batches[0] = first
    return [record(fq, fq(x.to(device))) for x in batches]


NCCL = pytest.mark.skipif(
    not (dist.is_nccl_available() and torch.cuda.is_available()
         and torch.cuda.device_count() >= WORLD and qg.cuda_available()),
    reason=f"NCCL needs {WORLD} GPUs and qatgraph's CUDA backend")


@pytest.fixture(scope="module", params=["gloo", pytest.param("nccl", marks=NCCL)])
def quantizer_runs(request, tmp_path_factory):
    """(each rank's runs, the device of the one-process reference)."""
    runs = spawn("case_quantizers", tmp_path_factory.mktemp("quantizers"), request.param)
    return runs, torch.device("cuda", 0) if request.param == "nccl" else torch.device("cpu")


@pytest.mark.parametrize("name,dtype", CASES)
@pytest.mark.parametrize("mode", [None, True, "toggled"])
def test_synced_ranks_observe_the_global_batch(quantizer_runs, name, dtype, mode):
    ranks, device = quantizer_runs
    if mode == "toggled":  # both ranks observed rank_batch(1, 0) alone, unsynced, first
        ref = reference(name, dtype, device, first=rank_batch(1, 0, dtype))
    else:
        ref = reference(name, dtype, device)
    for rank, runs in enumerate(ranks):
        for step, (got, want) in enumerate(zip(runs[(name, str(dtype), mode)], ref)):
            for key in ("min_val", "max_val", "scale", "zero_point"):
                assert same_bits(got[key], want[key]), (rank, step, key, got[key], want[key])
            rows = want["y"] if step == 0 and mode == "toggled" else \
                want["y"][rank * ROWS:(rank + 1) * ROWS]
            assert same_bits(got["y"], rows), (rank, step)


@pytest.mark.parametrize("name,dtype", CASES)
def test_unsynced_ranks_disagree(quantizer_runs, name, dtype):
    # torch.ao's observers under DDP: each rank quantizes with its own range.
    runs = [r[(name, str(dtype), False)] for r in quantizer_runs[0]]
    for step in range(1, STEPS):
        assert not same_bits(runs[0][step]["scale"], runs[1][step]["scale"]), step


def test_prepared_mlp_under_ddp_keeps_equal_qparams(tmp_path):
    ranks = spawn("case_model", tmp_path)
    assert ranks[0][(None, "weight_sync")] == [False, False]
    for broadcast in (True, False):
        synced = [r[(None, broadcast)] for r in ranks]
        quantizers = [k for k in synced[0] if k.endswith((".scale", ".zero_point", "min_val",
                                                          "max_val"))]
        assert len(quantizers) == 16  # two linears: weight and activation quantizers
        for key, value in synced[0].items():
            assert same_bits(value, synced[1][key]), (broadcast, key)
    unsynced = [r[(False, True)] for r in ranks]
    differ = [k for k in quantizers if not same_bits(unsynced[0][k], unsynced[1][k])]
    assert differ and all("activation_post_process" in k for k in differ), differ


def test_sync_errors_and_group_handling(tmp_path):
    twin, single = zip(*[(r["twin"], r["single"]) for r in spawn("case_errors", tmp_path)])
    assert same_bits(twin[0]["scale"], twin[1]["scale"])  # synced in the copied group
    assert not same_bits(single[0]["scale"], single[1]["scale"])  # one-rank groups


def test_sync_true_needs_a_process_group():
    assert not dist.is_initialized()
    model = nn.Sequential(nn.Linear(3, 3))
    with pytest.raises(qg.Error, match="sync_observers=True needs an initialized "
                                       "torch.distributed process group"):
        qgt.prepare_qat(model, sync_observers=True)
    fq = qgt.FakeQuantize(sync_observers=True)
    with pytest.raises(qg.Error, match="FakeQuantize: sync_observers=True needs an initialized"):
        fq(torch.randn(4))
    with pytest.raises(qg.Error, match="sync_observers must be None, True or False, got str"):
        qgt.FakeQuantize(sync_observers="yes")
    with pytest.raises(qg.Error, match="sync_observers must be None, True or False, got int"):
        qgt.prepare_qat(model, sync_observers=1)


def test_a_module_pickled_without_the_sync_options_loads_with_the_defaults():
    fq = qgt.FakeQuantize()
    state = fq.__getstate__()
    del state["sync_observers"], state["_process_group"]
    old = qgt.FakeQuantize.__new__(qgt.FakeQuantize)
    old.__setstate__(state)
    assert old.sync_observers is None and old.process_group is None
    assert same_bits(old(torch.ones(3)), fq(torch.ones(3)))


def test_without_a_process_group_the_default_and_false_do_not_sync():
    # No process group: sync_observers None or False observe as before; the fast path runs.
    for mode in (None, False):
        fq = qgt.FakeQuantize(**CONFIGS["average_channel"], sync_observers=mode)
        ref = qgt.FakeQuantize(**CONFIGS["average_channel"])
        for step in range(3):
            x = global_batch(step)
            assert same_bits(fq(x), ref(x))
        assert any(k[0] == "fast" for k in fq._qg_state)
    model = qgt.prepare_qat(nn.Sequential(nn.Linear(3, 3)), sync_observers=False)
    assert model[0].activation_post_process.sync_observers is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(torch.randn(2, 3))
