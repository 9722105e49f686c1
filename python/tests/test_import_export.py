"""Pretrained weight import (nn.import_weights, io "torch"/"npz") and ONNX export."""
import importlib.util

import numpy as np
import pytest

import qatgraph as qg
from qatgraph import nn


def model(kind, seed=1, **sizes):
    g = qg.Graph()
    spec = nn.ModelSpec(kind)
    spec.mlp.batch = 8
    for key, value in sizes.items():
        setattr(getattr(spec, kind), key, value)
    m = nn.build_model(g, spec, nn.QConfig.w8a8(), seed=seed)
    return g, m, qg.Executor(g)


def params(ex):
    return ex.state_dict(parameters_only=True)


def torch_style_cnn_weights(ex, rng):
    """A PyTorch state_dict of the same cnn: Conv2d + BatchNorm2d pairs held as .conv / .bn,
    the counter BatchNorm2d keeps, a DataParallel prefix."""
    out = {}
    for name, value in params(ex).items():
        values = rng.standard_normal(value.shape).astype(np.float32)
        if name.endswith("running_var"):
            values = np.abs(values) + 0.5
        layer, _, tensor = name.partition(".")
        torch_name = f"{layer}.conv.weight" if tensor == "weight" and layer != "fc" else name
        out["module." + torch_name] = values
        if name.endswith("bn.running_var"):
            out["module." + name.replace("running_var", "num_batches_tracked")] = np.array(7)
    return out


def test_import_safetensors_with_torch_names(tmp_path, rng):
    g, m, ex = model("cnn", channels=[4, 4, 4])
    weights = torch_style_cnn_weights(ex, rng)
    path = tmp_path / "cnn.safetensors"
    qg.io.save_safetensors(path, weights)
    report = qg.io.load_state(ex, path, format="torch")
    got = params(ex)
    assert len(report.loaded) == len(got) == 17
    assert [f for f, _ in report.ignored] == [f"module.conv{i}.bn.num_batches_tracked"
                                             for i in (1, 2, 3)]
    for file_name, model_name in report.loaded:
        np.testing.assert_array_equal(got[model_name], weights[file_name])
    assert ("module.conv2.conv.weight", "conv2.weight") in report.loaded
    assert "imported 17" in report.summary


def test_import_npz_fused_names_and_mapping(tmp_path, rng):
    g, m, ex = model("mlp", hidden=[16])
    shapes = {k: v.shape for k, v in params(ex).items()}
    # fuse_modules' LinearReLU keeps the Linear as ".0"; the head has another name entirely.
    file = {"fc1.0.weight": shapes["fc1.weight"], "fc1.0.bias": shapes["fc1.bias"],
            "head.weight": shapes["fc2.weight"], "head.bias": shapes["fc2.bias"],
            "extra.scale": (3,)}
    file = {k: rng.standard_normal(s).astype(np.float32) for k, s in file.items()}
    path = tmp_path / "mlp.npz"
    np.savez(path, **file)
    trainer_like = type("T", (), {"executor": ex})()  # importers take a Trainer too
    mapping = {"head.weight": "fc2.weight", "head.bias": "fc2.bias", "extra.scale": None}
    report = qg.io.load_state(trainer_like, path, mapping=mapping)  # ".npz" -> "npz"
    got = params(ex)
    np.testing.assert_array_equal(got["fc1.weight"], file["fc1.0.weight"])
    np.testing.assert_array_equal(got["fc2.bias"], file["head.bias"])
    assert [f for f, _ in report.ignored] == ["extra.scale"]
    # A dict source (e.g. a state_dict) works the same.
    file["fc1.0.bias"] = file["fc1.0.bias"] + 1
    del file["extra.scale"]
    qg.io.import_weights(ex, file, mapping)
    np.testing.assert_array_equal(params(ex)["fc1.bias"], file["fc1.0.bias"])
    read_back = nn.read_weight_file(str(path))
    np.testing.assert_array_equal(read_back["head.weight"], file["head.weight"])


def test_import_errors_list_every_name_and_change_nothing(tmp_path, rng):
    g, m, ex = model("mlp", hidden=[16])
    before = params(ex)
    file = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in before.items()}
    del file["fc2.bias"]
    file["fc3.weight"] = np.zeros((2, 2), np.float32)
    file["fc1.weight"] = np.zeros((3, 64), np.float32)
    path = tmp_path / "bad.safetensors"
    qg.io.save_safetensors(path, file)
    with pytest.raises(qg.Error) as err:
        qg.io.import_weights(ex, path)
    message = str(err.value)
    assert "nn.import" in message
    for name in ["fc3.weight", "fc2.bias", "fc1.weight"]:
        assert name in message, message
    for name, value in params(ex).items():
        np.testing.assert_array_equal(value, before[name])
    with pytest.raises(qg.Error, match=r"mapping must be a dict"):
        qg.io.import_weights(ex, path, mapping=["fc1.weight"])
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(qg.Error, match=r"nn.import"):
        qg.io.load_state(ex, tmp_path / "junk.npz")


def test_torch_name_rules():
    assert nn.torch_name_match("module.fc1.0.weight")[0] == ["fc1.0.weight", "fc1.weight"]
    candidates, reason = nn.torch_name_match("conv1.bn.num_batches_tracked")
    assert reason


onnx_only = pytest.mark.skipif(not qg.io.onnx_available, reason="module built without ONNX")


@pytest.fixture(scope="module")
def trained(digits, tmp_path_factory):
    train, test = digits
    cfg = nn.TrainConfig()
    cfg.model = "mlp"
    cfg.mlp.hidden = [32]
    cfg.qconfig = nn.QConfig.w8a8()
    cfg.optimizer = nn.OptimizerConfig("adam", 3e-3)
    trainer = nn.train(cfg, train, test, epochs=3)
    path = tmp_path_factory.mktemp("ckpt") / "mlp.ckpt"
    trainer.save_checkpoint(str(path))
    return trainer, path


@onnx_only
def test_onnx_export_from_checkpoint_and_trainer(trained, digits, tmp_path):
    trainer, checkpoint = trained
    train, test = digits
    from_ckpt = qg.io.export_onnx(checkpoint, tmp_path / "a.onnx", data=test)
    from_trainer = qg.io.save_state(trainer, tmp_path / "b.onnx", data=test)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert from_ckpt["op_counts"]["QuantizeLinear"] >= 2 and from_ckpt["op_counts"]["Gemm"] == 2
    np.testing.assert_array_equal(from_ckpt["logits"], from_trainer["logits"])
    acc, _ = trainer.integer_accuracy(test)
    # A trained model (seeded: about 0.88), so the argmax comparison below means something.
    assert acc > 0.8
    assert (from_ckpt["logits"].argmax(1) == test.labels).mean() == acc
    if importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("onnxruntime is not installed: ONNX file not run")
    import onnxruntime as ort
    options = ort.SessionOptions()
    # As scripts/onnx_check.py: every QuantizeLinear / DequantizeLinear runs as written.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "a.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    (ours,) = session.run(None, {session.get_inputs()[0].name: test.x})
    np.testing.assert_array_equal(ours.argmax(1), from_ckpt["logits"].argmax(1))


@onnx_only
def test_onnx_export_of_executor_graph(tmp_path):
    g, m, ex = model("mlp", hidden=[16])
    summary = qg.io.export_onnx(ex, tmp_path / "graph.onnx", input=m.x, output=m.logits)
    assert summary["nodes"] > 0 and (tmp_path / "graph.onnx").stat().st_size == summary["bytes"]
    with pytest.raises(qg.Error, match=r"input= and output="):
        qg.io.export_onnx(ex, tmp_path / "c.onnx")


@onnx_only
def test_onnx_export_errors(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(qg.Error, match=r"checkpoint"):
        qg.io.export_onnx(bad, tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.skipif(qg.io.onnx_available, reason="module built with ONNX")
def test_onnx_export_without_onnx_says_so(tmp_path):
    with pytest.raises(qg.Error, match=r"built without ONNX"):
        qg.io.export_onnx(tmp_path / "none.ckpt", tmp_path / "x.onnx")
