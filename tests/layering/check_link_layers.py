#!/usr/bin/env python3
"""Fails when a layer library needs a symbol that only a higher layer defines.

Usage: check_link_layers.py NM LAYER=LIBRARY ...   (lowest layer first)

The includes are checked by check_layers.py; this checks the calls. A static archive links
even when it calls up, as long as the program also links the higher layer, so the archives
are compared directly: every symbol a layer leaves undefined must be defined by that layer
or one below it, or come from outside the library (the C++ runtime, CUDA, zlib...).
"""
import subprocess
import sys

DEFINED = set("TDBRVWui")  # text, data, bss, read-only, weak, unique
STRONG = set("TDBR")


def symbols(nm, library):
    """(defined, strongly defined, undefined) global symbols of an archive or shared object."""
    out = subprocess.run([nm, "-g", "-P", library], check=True, capture_output=True,
                         text=True).stdout
    defined, strong, undefined = set(), set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2 or line.endswith(":"):
            continue  # an archive member's header
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in DEFINED:
            defined.add(name)
            if kind in STRONG:
                strong.add(name)
    return defined, strong, undefined - defined


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), check=True,
                             capture_output=True, text=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return list(names)


def main():
    nm, pairs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    layers = [(name, symbols(nm, path)) for name, path in pairs]
    problems = 0
    for i, (name, (_, _, undefined)) in enumerate(layers):
        for higher, (_, strong, _) in layers[i + 1:]:
            up = sorted(undefined & strong)
            for shown in demangle(up):
                print(f"layer '{name}' calls {shown}, which only the higher layer '{higher}' "
                      "defines")
            problems += len(up)
            undefined -= strong
    if problems:
        print(f"{problems} call(s) into higher layers")
        return 1
    print("layer libraries: every symbol a layer needs comes from it, a lower layer or outside")
    return 0


if __name__ == "__main__":
    sys.exit(main())
