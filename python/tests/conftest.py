# The suite runs against whichever qatgraph is importable: the build tree's (ctest sets
# PYTHONPATH=<build>/python) or an installed one (`pip install .`).
import numpy as np
import pytest

import qatgraph


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def digits():
    data = qatgraph.nn.load_digits()
    return qatgraph.nn.split_dataset(data, 0.2, seed=0)


cuda = pytest.mark.skipif(not qatgraph.cuda_available(), reason="no CUDA backend or no GPU")
