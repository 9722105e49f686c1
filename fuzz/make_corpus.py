"""Writes the seed corpus of the fuzz targets into fuzz/corpus/<target>/: a few small valid
files (from numpy, and assembled by hand from each documented layout) and a few broken ones.
Run with Debian's /usr/bin/python3 (numpy); the output is committed, so rerun it only when the
seeds should change. Inputs that once crashed a target are kept there as crash-*.bin files,
which this script leaves alone."""
import gzip
import io
import json
import os
import struct
import zlib

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def save(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, name), "wb") as f:
        f.write(data)


def npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def npz(compressed, **arrays):
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def safetensors(header, data):
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def checkpoint(sections):
    out = b"QGCKPT\r\n" + struct.pack("<II", 1, len(sections))
    for name, payload in sections:
        out += struct.pack("<I", len(name)) + name + struct.pack("<QI", len(payload), zlib.crc32(payload))
        out += payload
    return out + struct.pack("<I", zlib.crc32(out))


def tensor_payload(dtype_code, array):
    return struct.pack("<BB", dtype_code, array.ndim) + struct.pack(f"<{array.ndim}Q", *array.shape) + array.tobytes()


def main():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    save("npy", "f32_2x3.npy", npy(a))
    save("npy", "bool.npy", npy(np.array([True, False])))
    save("npy", "i8_scalar.npy", npy(np.int8(-3)))
    save("npy", "f16_empty.npy", npy(np.zeros((0, 4), np.float16)))
    save("npy", "bad_truncated.npy", npy(a)[:-5])
    save("npy", "bad_fortran.npy", npy(np.asfortranarray(a)))
    # A zero dimension next to huge ones (the strides overflowed; found in the checkpoint reader).
    zero_dim = npy(np.zeros((0, 2), np.float32)).replace(b"(0, 2)", b"(0, 4294967296, 4294967296)")
    save("npy", "regress_zero_dim_huge.npy", zero_dim)

    save("npz", "stored.npz", npz(False, x=a, y=np.array([1, 2], np.int64)))
    save("npz", "deflated.npz", npz(True, x=a, m=np.array([True])))
    save("npz", "bad_truncated.npz", npz(False, x=a)[:-10])

    data = a.tobytes() + np.array([7, -1], "<i8").tobytes()
    header = {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "i": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
        "h": {"dtype": "F16", "shape": [0], "data_offsets": [40, 40]},
    }
    save("safetensors", "valid.safetensors", safetensors(header, data))
    save("safetensors", "bf16.safetensors",
         safetensors({"b": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\x80\x3f\x00\xc0"))
    header["i"]["data_offsets"] = [16, 32]
    save("safetensors", "bad_overlap.safetensors", safetensors(header, data))
    save("safetensors", "regress_zero_dim_huge.safetensors",
         safetensors({"z": {"dtype": "F32", "shape": [0, 2**32, 2**32], "data_offsets": [0, 0]}}, b""))
    save("safetensors", "bad_header_length.safetensors", struct.pack("<Q", 1 << 40) + b"{}")

    t = tensor_payload(0, a)  # dtype code 0 is f32
    save("checkpoint", "two_sections.ckpt", checkpoint([(b"meta", b"epoch 1\nstep 5\n"), (b"param/w", t)]))
    save("checkpoint", "tensor_payload.bin", t)
    save("checkpoint", "bad_crc.ckpt", checkpoint([(b"param/w", t)])[:-1] + b"\x00")

    digits = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
    if os.path.exists(digits):
        with gzip.open(digits, "rt") as f:
            rows = [next(f) for _ in range(3)]
    else:
        rows = [",".join(["0"] * 64 + ["1"]) + "\n"]
    save("digits", "rows.csv", "".join(rows).encode())
    save("digits", "bad_label.csv", (",".join(["16"] * 64 + ["12"]) + "\n").encode())
    save("digits", "bad_cell.csv", b"1,2,x\n")


if __name__ == "__main__":
    main()
