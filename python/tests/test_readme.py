"""The README's Python example runs as written, and the last, smaller batch of an epoch trains
the same model: through shared states in the graph API, through drop_last in nn.Trainer."""
import math
import pathlib
import re

import numpy as np
import pytest

import qatgraph as qg

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_python_example():
    text = README.read_text()
    section = text[text.index("\n## Python\n"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(readme_python_example(), str(README), "exec"), scope)
    assert (tmp_path / "mlp.safetensors").exists()
    assert math.isfinite(float(scope["l"])) and float(scope["l"]) < 1.0
    full, last = scope["full"][0], scope["last"][0]
    # One model: the executor of the last batch holds the very same parameters.
    w_full, w_last = full.parameter("fc1.weight"), last.parameter("fc1.weight")
    assert np.array_equal(w_full, w_last)
    w_full[0, 0] += 1.0  # a live view: the write shows through the other executor too
    assert last.parameter("fc1.weight")[0, 0] == w_full[0, 0]


def test_share_states_names_a_mismatch():
    def graph(features):
        g = qg.Graph()
        x = g.input("x", "f32", [4, features])
        b = qg.nn.Builder(g, qg.nn.QConfig.w8a8(), seed=1)
        b.linear(b.quant_input(x), 3, "fc")
        return qg.Executor(g)
    with pytest.raises(qg.Error, match=r"fc.weight.*shape|fc.weight"):
        qg.share_states(graph(5), graph(6))


def test_trainer_trains_on_the_last_partial_batch(digits):
    train, test = digits
    cfg = qg.nn.TrainConfig()
    cfg.model = "mlp"
    batch = cfg.mlp.batch
    assert len(train) % batch != 0
    for drop_last, steps in ((True, len(train) // batch), (False, -(-len(train) // batch))):
        cfg.drop_last = drop_last
        seen = []
        qg.nn.Trainer(cfg, train, test).train_epoch(lambda s: seen.append(s.steps_per_epoch))
        assert len(seen) == steps and seen[-1] == steps, drop_last
