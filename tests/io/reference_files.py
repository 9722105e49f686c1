"""Reference files for the tensor-file tests (tests/io), written and checked with numpy and
torch 1.13. safetensors is not packaged in Debian, so its files are assembled by hand from
the documented layout: an 8-byte little-endian header length, the JSON header, the data.

  reference_files.py write DIR      writes DIR/ref.safetensors, DIR/ref.npz, DIR/ref_z.npz
  reference_files.py check FILE     checks a safetensors file written by qatgraph's writer
                                    (the tensors of expected_tensors()), exit status 0 if good
"""
import json
import struct
import sys

import numpy as np

try:
    import torch
except ImportError:  # bf16 bits can be made without torch
    torch = None


def bf16_bits(values):
    """The bfloat16 encodings of `values` (exactly representable) as uint16."""
    if torch is not None:
        return torch.tensor(values, dtype=torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    return (np.array(values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def expected_tensors():
    """name -> (safetensors dtype, shape, little-endian bytes); the C++ tests hold the same."""
    return {
        "weight": ("F32", [2, 3], (np.arange(6, dtype="<f4") * 0.5 - 1).tobytes()),
        "half": ("F16", [4], np.array([1, -2, 0.5, 65504], dtype="<f2").tobytes()),
        "bf": ("BF16", [3], bf16_bits([1.0, -2.5, 3.140625]).astype("<u2").tobytes()),
        "idx": ("I64", [2, 2], np.array([[-1, 2**40], [0, 7]], dtype="<i8").tobytes()),
        "empty": ("F32", [0, 5], b""),
    }


def write_safetensors(path):
    # Data deliberately not in name order, and the header not sorted: a reader must follow
    # the offsets.
    header = {"__metadata__": {"format": "pt", "source": "reference_files.py"}}
    data = b""
    for name in ["idx", "weight", "empty", "bf", "half"]:
        dtype, shape, raw = expected_tensors()[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def npz_arrays():
    return {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([-3, 0, 2**40], dtype=np.int64),
        "c": np.array([0.5, -1.0], dtype=np.float16),
        "mask": np.array([True, False, True]),
        "zeros": np.zeros((40, 25), dtype=np.float64),
    }


def check(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0, "data buffer not 8-byte aligned"
    text = raw[8 : 8 + n]
    assert text == text.rstrip(b" ") + b" " * (len(text) - len(text.rstrip(b" "))), "bad padding"
    header = json.loads(text)
    data = raw[8 + n :]
    assert header.pop("__metadata__") == {"writer": "qatgraph"}, "metadata"
    want = expected_tensors()
    assert sorted(header) == sorted(want), f"names {sorted(header)}"
    names_by_offset = sorted(header, key=lambda k: header[k]["data_offsets"])
    assert names_by_offset == sorted(header), "tensors not laid out in name order"
    for name, (dtype, shape, expect) in want.items():
        e = header[name]
        assert e["dtype"] == dtype and e["shape"] == shape, f"{name}: {e}"
        begin, end = e["data_offsets"]
        assert data[begin:end] == expect, f"{name}: data differ"
    assert max(e["data_offsets"][1] for e in header.values()) == len(data), "trailing bytes"
    # Values through numpy/torch as well, not only bytes.
    w = np.frombuffer(data[slice(*header["weight"]["data_offsets"])], "<f4").reshape(2, 3)
    assert np.array_equal(w, np.arange(6).reshape(2, 3) * 0.5 - 1)
    if torch is not None:
        b = np.frombuffer(data[slice(*header["bf"]["data_offsets"])], "<i2").copy()
        assert torch.from_numpy(b).view(torch.bfloat16).float().tolist() == [1.0, -2.5, 3.140625]
    print("reference_files.py: safetensors file checks out")


def main():
    mode, target = sys.argv[1], sys.argv[2]
    if mode == "write":
        write_safetensors(f"{target}/ref.safetensors")
        np.savez(f"{target}/ref.npz", **npz_arrays())
        np.savez_compressed(f"{target}/ref_z.npz", **npz_arrays())
    elif mode == "check":
        check(target)
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
