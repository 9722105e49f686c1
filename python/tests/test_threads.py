"""qatgraph.set_num_threads / get_num_threads: the CPU backend's thread count from Python, as
torch.set_num_threads (QG_NUM_THREADS only sets the starting value)."""
import numpy as np
import pytest

import qatgraph as qg


def test_set_and_get_num_threads():
    before = qg.get_num_threads()
    assert before >= 1
    try:
        qg.set_num_threads(3)
        assert qg.get_num_threads() == 3
        # Results do not depend on the thread count (fixed chunks): run a reduction with 1
        # and 3 threads.
        x = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)
        outs = []
        for n in (1, 3):
            qg.set_num_threads(n)
            outs.append(qg.run_op("sum", [x])[0][0])
        assert outs[0].tobytes() == outs[1].tobytes()
    finally:
        qg.set_num_threads(before)
    assert qg.get_num_threads() == before


@pytest.mark.parametrize("bad,match", [(0, r"must be >= 1, got 0"), (-2, r"got -2"),
                                       (5000, r"<= 4096, got 5000"), (2**70, r"does not fit"),
                                       ("4", r"an int"), (2.0, r"an int")])
def test_bad_thread_counts_raise_qatgraph_error(bad, match):
    before = qg.get_num_threads()
    with pytest.raises(qg.Error, match=match):
        qg.set_num_threads(bad)
    assert qg.get_num_threads() == before
