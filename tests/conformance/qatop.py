"""Runs one op through `qat op` on .npy files (all calls of a script in one `qat op-serve`
process): the harness every conformance script uses.

    run_op(qat, "fake_quantize", inputs={"x": x, "scale": s, "zero_point": z},
           outputs=["y", "mask"], attrs={"bits": 8, "scope": "tensor"},
           states={"min": m}, state_out=["min", "max"], eval_mode=False)

returns a dict of output name -> numpy array (and "state:NAME" for requested states).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--qat", required=True, help="path to the qat binary")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    return p.parse_args()


def fresh_rng(seed):
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def _attr_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(str(int(e)) for e in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


class OpResult:
    """What one `qat op` call returned: its exit status and what it printed."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


class _OpServer:
    """One `qat op-serve` process per qat binary: each call is one line in, one line out, so
    a suite of thousands of cases starts one process instead of thousands (a start costs about
    0.1 s; the op itself microseconds). Its stderr is left as this script's, so a sanitizer
    report or a crash message reaches the test log."""

    _servers = {}

    @classmethod
    def call(cls, qat, args):
        server = cls._servers.get(qat)
        if server is None or server.poll() is not None:
            server = subprocess.Popen([qat, "op-serve"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            cls._servers[qat] = server
        server.stdin.write(json.dumps(args) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        if not line:
            rc = server.wait()
            del cls._servers[qat]
            raise RuntimeError(f"qat op-serve ended (status {rc}) during: qat op {' '.join(args)}")
        answer = json.loads(line)
        return OpResult(answer["rc"], answer["stdout"], answer["stderr"])


def run_op(qat, op, inputs, outputs, attrs=None, states=None, state_out=None, eval_mode=False,
           device="cpu", expect_failure=False):
    attrs = attrs or {}
    states = states or {}
    state_out = state_out or []
    with tempfile.TemporaryDirectory() as d:
        args = [op, "--device", device]
        for name, arr in inputs.items():
            path = os.path.join(d, f"in_{name}.npy")
            np.save(path, arr)
            args += ["--in", f"{name}={path}"]
        for name, arr in states.items():
            path = os.path.join(d, f"state_{name}.npy")
            np.save(path, arr)
            args += ["--state", f"{name}={path}"]
        for name in outputs:
            args += ["--out", f"{name}={os.path.join(d, f'out_{name}.npy')}"]
        for name in state_out:
            args += ["--state-out", f"{name}={os.path.join(d, f'stateout_{name}.npy')}"]
        for k, v in attrs.items():
            args += ["--attr", f"{k}={_attr_text(v)}"]
        if eval_mode:
            args += ["--eval"]
        proc = _OpServer.call(qat, args)
        if expect_failure:
            return proc
        if proc.returncode != 0:
            raise RuntimeError(f"qat op {op} failed ({proc.returncode}):\nqat op {' '.join(args)}\n"
                               f"{proc.stdout}{proc.stderr}")
        result = {n: np.load(os.path.join(d, f"out_{n}.npy")) for n in outputs}
        for n in state_out:
            result["state:" + n] = np.load(os.path.join(d, f"stateout_{n}.npy"))
        return result


class Tally:
    """Counts cases per op and reports failures; exit code 1 on any failure."""

    def __init__(self, suite):
        self.suite = suite
        self.counts = {}
        self.failures = []

    def check(self, op, ok, detail=""):
        self.counts[op] = self.counts.get(op, 0) + 1
        if not ok:
            self.failures.append(f"{op}: {detail}")

    def finish(self):
        total = sum(self.counts.values())
        for op, n in sorted(self.counts.items()):
            print(f"  {op:40s} {n:6d} cases")
        for f in self.failures[:20]:
            print("FAIL", f)
        print(f"{self.suite}: {total - len(self.failures)} passed, {len(self.failures)} failed")
        sys.exit(1 if self.failures else 0)


def check_bad_input(qat, tally, op, inputs, outputs, attrs, fragment):
    """Runs `op` on bad input and counts it passed when `qat op` fails with a message naming the
    op and holding `fragment`."""
    proc = run_op(qat, op, inputs, outputs, attrs, expect_failure=True)
    text = proc.stdout + proc.stderr
    ok = proc.returncode != 0 and op in text and fragment in text
    tally.check(f"{op} bad input", ok,
                f"expected a failure naming {op} and '{fragment}', got rc {proc.returncode}: {text}")
