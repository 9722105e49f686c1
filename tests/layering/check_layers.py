#!/usr/bin/env python3
"""Fails, naming file:line, when a library file includes a higher layer.

The layers, lowest first (each may include itself and the layers below it):
  core <- device <- ops <- autograd <- runtime <- nn <- data <- train <- export
runtime sits above autograd because compile() runs autograd on the graph it compiles; nn
holds layers and models, data the datasets and tokenizers, train the training loops. Every
#include "folder/..." that names a top-level folder of the repository is checked, so a
library file that includes apps/, bench/, tests/ or python/ fails too. core/ must not
include CUDA headers either: core is built without the CUDA toolkit's include path.

Usage: check_layers.py [repository root]   (default: two folders above this script)
"""
import os
import re
import sys

LAYERS = ["core", "device", "ops", "autograd", "runtime", "nn", "data", "train", "export"]
# Top-level folders that no library layer may include.
ABOVE_ALL = ["apps", "bench", "tests", "python", "examples", "fuzz"]
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
CUDA_HEADER = re.compile(r"^(cuda|cublas|cudnn|curand|cusparse|nccl|thrust/|cub/)")


# A block compiled only by nvcc (`#if defined(__CUDACC__)` ... `#endif`, not nested): a host
# compiler never sees what it includes, so core may include CUDA headers there.
NVCC_ONLY = re.compile(r"^\s*#\s*(if\s+defined\s*\(?\s*__CUDACC__\s*\)?|ifdef\s+__CUDACC__)\s*$")
ENDIF = re.compile(r"^\s*#\s*endif")


def problems_in(path, rel, layer):
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    nvcc_only = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if NVCC_ONLY.match(line):
                nvcc_only = True
            elif nvcc_only and ENDIF.match(line):
                nvcc_only = False
            m = INCLUDE.match(line)
            if not m:
                continue
            quote, target = m.groups()
            if quote == "<":
                if layer == "core" and CUDA_HEADER.match(target) and not nvcc_only:
                    yield f"{rel}:{number}: core includes the CUDA header <{target}>"
                continue
            top = target.split("/", 1)[0] if "/" in target else None
            if top is None:
                continue  # a file beside this one: same layer
            if top in LAYERS and top not in allowed:
                yield (f"{rel}:{number}: layer '{layer}' includes \"{target}\" of the higher "
                       f"layer '{top}' (it may include {', '.join(sorted(allowed, key=LAYERS.index))})")
            elif top in ABOVE_ALL:
                yield (f"{rel}:{number}: layer '{layer}' includes \"{target}\" from '{top}/', "
                       f"which is no library layer")


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    root = os.path.abspath(root)
    found, files = [], 0
    for layer in LAYERS:
        base = os.path.join(root, layer)
        for folder, _, names in sorted(os.walk(base)):
            for name in sorted(names):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(folder, name)
                files += 1
                found.extend(problems_in(path, os.path.relpath(path, root), layer))
    for p in found:
        print(p)
    if found:
        print(f"{len(found)} upward include(s) in {files} files")
        return 1
    print(f"layering: {files} files, every include goes to the same or a lower layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
