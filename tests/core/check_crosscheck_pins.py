"""Every op that `qat crosscheck` has cases or rounded outputs for is pinned by exactly one
expect_crosscheck_pins call in tests/ (its family's folder), and the pin agrees with the spec.

Usage: check_crosscheck_pins.py QAT TESTS_DIR
The family tests check the pins against the registry at run time; this script checks that none
is missing, so a new family cannot skip pinning its crosscheck spec.
"""
import pathlib
import re
import subprocess
import sys

PIN = re.compile(r'expect_crosscheck_pins\(\s*"([A-Za-z0-9_]+)"\s*,\s*(\d+)\s*,\s*\{([^}]*)\}')


def listed_spec(qat):
    out = subprocess.run([qat, "crosscheck", "--list-spec"], check=True, capture_output=True,
                         text=True).stdout
    spec = {}
    for line in out.splitlines():
        m = re.match(r"(\S+) cases=(\d+) rounded=(\S+) reason=", line)
        if not m:
            sys.exit(f"unexpected line from qat crosscheck --list-spec: {line!r}")
        rounded = [] if m.group(3) == "none" else [int(v) for v in m.group(3).split(",")]
        spec[m.group(1)] = (int(m.group(2)), rounded)
    return spec


def pins(tests_dir):
    found = {}
    root = pathlib.Path(tests_dir)
    for path in sorted(root.rglob("*_test.cpp")):
        if "pins_fixture" in path.relative_to(root).parts:
            continue  # the fixture of this script's own test
        for m in PIN.finditer(path.read_text()):
            rounded = [int(v) for v in m.group(3).replace(" ", "").split(",") if v]
            found.setdefault(m.group(1), []).append((path.name, int(m.group(2)), rounded))
    return found


def main():
    qat, tests_dir = sys.argv[1], sys.argv[2]
    spec, found = listed_spec(qat), pins(tests_dir)
    problems = []
    for op, (cases, rounded) in sorted(spec.items()):
        where = found.get(op, [])
        if not where:
            problems.append(f"{op}: cases={cases} rounded={rounded} is pinned by no test")
        elif len(where) > 1:
            problems.append(f"{op}: pinned {len(where)} times ({', '.join(w[0] for w in where)})")
        elif where[0][1:] != (cases, rounded):
            problems.append(f"{op}: pinned as cases={where[0][1]} rounded={where[0][2]} in "
                            f"{where[0][0]}, the spec has cases={cases} rounded={rounded}")
    for problem in problems:
        print(problem)
    print(f"{len(spec)} ops with a crosscheck spec, {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
