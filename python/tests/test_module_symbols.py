"""The extension module exports its init function and nothing else.

On the GPU image the toolchain links libstdc++ statically into the module. While the module
also exported those symbols, the loader bound part of its references to the libstdc++ that
NumPy had loaded and part to its own copy, and formatting the first integer into an error
message crashed the interpreter (std::locale facet ids of two runtimes). Any exported C++
symbol can be interposed that way, so the test asks for none."""
import shutil
import subprocess
import sys

import pytest

import qatgraph._core as core


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None,
                    reason="ELF dynamic symbols are read with binutils' nm on Linux")
def test_module_exports_only_its_init_function():
    listing = subprocess.run(["nm", "-D", "--defined-only", core.__file__], check=True,
                             capture_output=True, text=True).stdout
    exported = sorted(line.split()[-1] for line in listing.splitlines() if line.strip())
    assert exported == ["PyInit__core"], f"{len(exported)} symbols exported: {exported[:10]}"


def test_integer_in_an_error_message_after_numpy_loaded():
    # The crash's path: an attribute range error formats the integer with std::ostream.
    import numpy as np
    import qatgraph as qg
    g = qg.Graph()
    x = g.input("x", "f32", [4, 4])
    s = g.constant(np.array([0.1], np.float32))
    z = g.constant(np.array([0], np.int32))
    with pytest.raises(qg.Error, match=r"'bits' = 1 is outside \[2, 16\]"):
        g.apply("fake_quantize", [x, s, z], {"bits": 1})
