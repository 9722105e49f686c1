"""qatgraph: quantization-aware training graphs, from Python.

The C++ engine (qatgraph._core, nanobind) builds graphs of named ops, differentiates them and
runs them on the CPU or CUDA backend; arrays go in and out as NumPy arrays, PyTorch tensors
or DLPack objects, without a copy where the layout allows.

    import numpy as np, qatgraph as qg
    g = qg.Graph()
    x = g.input("x", "f32", [4, 8])
    w = g.parameter("w", np.zeros((8, 2), np.float32))
    qp = g.apply("minmax_observer", [x])
    xq = g.apply("fake_quantize", [x, qp[0], qp[1]])[0]
    y = g.apply1("matmul", [xq, w])
    loss = g.apply1("sum", [y])
    dw = qg.grad(g, loss, [w])[0]
    out = qg.Executor(g).run({"x": np.ones((4, 8), np.float32)}, [loss, dw])

Submodules: qatgraph.nn (layers, models, Trainer), qatgraph.io (safetensors and the
import/export registry), qatgraph.torch (torch.autograd functions; imports torch).
"""
from ._core import (
    Error,
    Executor,
    Graph,
    build_info,
    cuda_available,
    get_num_threads,
    grad,
    grad_with_seed,
    op_info,
    ops,
    run_op,
    set_num_threads,
    share_states,
)
from . import io, nn

__version__ = build_info["version"]

__all__ = [
    "Error",
    "Executor",
    "Graph",
    "build_info",
    "cuda_available",
    "get_num_threads",
    "grad",
    "grad_with_seed",
    "io",
    "nn",
    "op_info",
    "ops",
    "run_op",
    "set_num_threads",
    "share_states",
]
