"""Graph building, autodiff, the executor and the error path, with NumPy arrays."""
import numpy as np
import pytest

import qatgraph as qg
from conftest import cuda


def linear_graph(batch=4, features=3, out=2):
    g = qg.Graph()
    x = g.input("x", "f32", [batch, features])
    w = g.parameter("w", np.arange(features * out, dtype=np.float32).reshape(features, out) / 10)
    y = g.apply1("matmul", [x, w], name="matmul")
    g.set_name(y, "y")  # values are fetched by name once named
    loss = g.apply1("sum", [y])  # every axis
    return g, x, w, y, loss


def _attr_names(op):
    return [a["name"] for a in qg.op_info(op)["attrs"]]


def test_registry_lists_every_family():
    names = set(qg.ops())
    for op in ["fake_quantize", "minmax_observer", "conv2d", "batch_norm", "adam", "softmax",
               "embedding", "int4_quantize_pack", "nf4_quantize_pack", "dropout"]:
        assert op in names
    info = qg.op_info("fake_quantize")
    assert info["inputs"] == ["x", "scale", "zero_point"]
    assert info["differentiable"]
    assert {"bits", "signed", "scope", "axis"} <= set(_attr_names("fake_quantize"))


def test_forward_and_gradient_match_numpy(rng):
    g, x, w, y, loss = linear_graph()
    dw, dx = qg.grad(g, loss, [w, x])
    xv = rng.standard_normal((4, 3)).astype(np.float32)
    ex = qg.Executor(g)
    out_y, out_loss, out_dw, out_dx = ex.run({"x": xv}, [y, loss, dw, dx])
    wv = ex.parameter("w")
    np.testing.assert_allclose(out_y, xv @ wv, rtol=1e-6)
    np.testing.assert_allclose(out_loss, (xv @ wv).sum(), rtol=1e-5)
    # d sum(x @ w) / dw = x^T @ ones, / dx = ones @ w^T.
    np.testing.assert_allclose(out_dw, xv.T @ np.ones((4, 2), np.float32), rtol=1e-6)
    np.testing.assert_allclose(out_dx, np.ones((4, 2), np.float32) @ wv.T, rtol=1e-6)


def test_fetch_by_name_and_graph_introspection():
    g, x, w, y, loss = linear_graph()
    assert g.at("y") == y and g.find("nope") == -1
    info = g.value(y)
    assert info["dtype"] == "f32" and info["shape"] == [4, 2]
    node = g.node(info["producer"])
    assert node["op"] == "matmul" and node["inputs"] == [x, w]
    assert g.parameter_names() == ["w"]
    out = qg.Executor(g).run({"x": np.ones((4, 3), np.float32)}, ["y"])[0]
    assert out.shape == (4, 2)


def test_quantization_chain_and_attributes(rng):
    g = qg.Graph()
    x = g.input("x", "f32", [8, 16])
    scale, zp = g.apply("minmax_observer", [x], {"bits": 4, "signed": True, "qscheme": "symmetric"})
    y, mask = g.apply("fake_quantize", [x, scale, zp], {"bits": 4, "signed": True})
    xv = rng.standard_normal((8, 16)).astype(np.float32)
    yv, s, z = qg.Executor(g).run({"x": xv}, [y, scale, zp])
    # Symmetric int4: scale = max|x| / 7.5 (PyTorch's half-range denominator), zp 0, and
    # every output is a code in [-8, 7] times the scale.
    assert z.tolist() == [0]
    np.testing.assert_allclose(s[0], np.abs(xv).max() / 7.5, rtol=1e-6)
    codes = yv / s[0]
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-4)
    assert codes.min() >= -8 - 1e-4 and codes.max() <= 7 + 1e-4


def test_bad_input_raises_qatgraph_error():
    g = qg.Graph()
    x = g.input("x", "f32", [4, 4])
    with pytest.raises(qg.Error, match=r"unknown op"):
        g.apply("no_such_op", [x])
    s = g.constant(np.array([0.1], np.float32))
    z = g.constant(np.array([0], np.int32))
    with pytest.raises(qg.Error, match=r"fake_quantize.*bits.*1"):
        g.apply("fake_quantize", [x, s, z], {"bits": 1})
    with pytest.raises(qg.Error, match=r"unsupported type"):
        g.apply("fake_quantize", [x, s, z], {"bits": object()})
    with pytest.raises(qg.Error, match=r"device 'tpu'"):
        qg.Executor(g, "tpu")
    assert issubclass(qg.Error, ValueError)


class _BadIndex:
    def __index__(self):
        raise OverflowError("no index")


@pytest.mark.parametrize("attrs,match", [
    ({"bits": object()}, r"'bits' has unsupported type object"),
    ({"bits": 2**70}, r"'bits' = 1180591620717411303424 does not fit in 64 bits"),
    ({"bits": -2**64}, r"'bits' = -18446744073709551616 does not fit"),
    ({"bits": _BadIndex()}, r"'bits' .*_BadIndex"),
    ({"shape": [1, object()]}, r"'shape': item 1 has type object"),
    ({"shape": [1, 2**70]}, r"'shape': item 1 = 1180591620717411303424 does not fit"),
    ({"shape": [True]}, r"'shape': item 0 has type bool"),
    ({"qscheme": "\ud800"}, r"'qscheme' is not valid UTF-8"),
    ({1: 2}, r"attribute names are strings, got int"),
    ([("bits", 4)], r"attributes are a dict, got list"),
])
def test_bad_attribute_values_raise_qatgraph_error(attrs, match):
    # Every attribute value a user can write: an error naming the attribute, never a crash
    # (the GPU image's Python 3.12 died here) or a bare std::bad_cast.
    g = qg.Graph()
    x = g.input("x", "f32", [4, 4])
    s = g.constant(np.array([0.1], np.float32))
    z = g.constant(np.array([0], np.int32))
    with pytest.raises(qg.Error, match=match):
        g.apply("fake_quantize", [x, s, z], attrs)
    with pytest.raises(qg.Error, match=match):
        qg.run_op("fake_quantize", [np.ones((4, 4), np.float32), np.float32([0.1]),
                                    np.int32([0])], attrs)


def test_bad_attributes_do_not_crash_the_interpreter():
    # The sequence that killed the GPU image's Python 3.12 (numpy 2.x, torch imported first),
    # in a child process: a crash there fails this test with the child's faulthandler
    # backtrace instead of ending the whole pytest run.
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import importlib.util, numpy as np
        if importlib.util.find_spec("torch"):
            import torch  # noqa: F401  (as the suite imports it before test_graph runs)
        import qatgraph as qg
        g = qg.Graph()
        x = g.input("x", "f32", [4, 4])
        s = g.constant(np.array([0.1], np.float32))
        z = g.constant(np.array([0], np.int32))
        for bad in [{"bits": 1}, {"bits": object()}, {"bits": 2**70}, {"shape": [object()]}]:
            try:
                g.apply("fake_quantize", [x, s, z], bad)
            except qg.Error:
                pass
        print("survived")
    """)
    child = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0 and "survived" in child.stdout, child.stderr[-4000:]


def test_numpy_scalar_attributes_are_accepted():
    g = qg.Graph()
    x = g.input("x", "f32", [4, 4])
    s = g.constant(np.array([0.1], np.float32))
    z = g.constant(np.array([0], np.int32))
    g.apply("fake_quantize", [x, s, z], {"bits": np.int64(4), "signed": np.bool_(True)})
    node = g.node(g.num_nodes - 1)
    assert node["attrs"]["bits"] == 4 and node["attrs"]["signed"] is True


def test_feed_type_mismatch_names_the_input():
    g, x, w, y, loss = linear_graph()
    ex = qg.Executor(g)
    with pytest.raises(qg.Error, match=r"x"):
        ex.run({"x": np.ones((5, 3), np.float32)}, [y])


def test_zero_copy_in_and_out():
    g = qg.Graph()
    x = g.input("x", "f32", [64])
    g.mark_output(x)
    xv = np.arange(64, dtype=np.float32)
    (back,) = qg.Executor(g).run({"x": xv}, [x])
    assert np.shares_memory(back, xv)  # the input's own memory, fed and fetched unchanged


def test_non_contiguous_and_list_inputs_are_copied():
    g = qg.Graph()
    x = g.input("x", "f32", [3, 2])
    y = g.apply1("neg", [x])
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    (out,) = qg.Executor(g).run({"x": base[:, ::2]}, [y])
    np.testing.assert_array_equal(out, -base[:, ::2])
    c = g.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # a list: numpy.asarray, f64
    assert g.value(c)["dtype"] == "f64"


def test_parameter_views_are_live_and_settable():
    g, x, w, y, loss = linear_graph()
    ex = qg.Executor(g)
    view = ex.parameter("w")
    ex.set_parameter("w", np.full((3, 2), 2.0, np.float32))
    np.testing.assert_array_equal(view, np.full((3, 2), 2.0))  # the same memory
    with pytest.raises(qg.Error, match=r"parameter 'w'"):
        ex.set_parameter("w", np.zeros((2, 2), np.float32))


def test_dtypes_round_trip():
    for dtype in [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64,
                  np.bool_]:
        g = qg.Graph()
        c = g.constant(np.array([1, 0, 1], dtype=dtype))
        (out,) = qg.Executor(g).run({}, [c])
        assert out.dtype == dtype and out.tolist() == [1, 0, 1]
    with pytest.raises(qg.Error, match=r"not a qatgraph dtype"):
        qg.Graph().constant(np.array([1], np.int16))


@cuda
def test_cuda_executor_matches_cpu(rng):
    g, x, w, y, loss = linear_graph()
    (dw,) = qg.grad(g, loss, [w])
    xv = rng.standard_normal((4, 3)).astype(np.float32)
    cpu = qg.Executor(g).run({"x": xv}, [y, dw])
    gpu = qg.Executor(g, "cuda").run({"x": xv}, [y, dw], framework="dlpack")
    for a, b in zip(cpu, gpu):
        import torch
        np.testing.assert_allclose(torch.utils.dlpack.from_dlpack(b).cpu().numpy(), a, rtol=1e-6)
