"""`qat op-serve` answers each call exactly as `qat op` run as its own process does: the same
outputs bit for bit, the same exit status and error text. The conformance suites rely on it
(qatop.run_op sends every case through one op-serve process), so this is what keeps their
verdicts about `qat op` itself. Also: a malformed request gets a named error, and the server
goes on to the next one."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from qatop import Tally, parse_args


def direct(qat, args):
    proc = subprocess.run([qat, "op"] + args, capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def main():
    qat = parse_args().qat
    tally = Tally("op_serve_check")
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as d:
        x = (rng.standard_normal((5, 8)) * 3).astype(np.float32)
        x[0, 0] = np.nan
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "s.npy"), np.array(0.05, np.float32))
        np.save(os.path.join(d, "z.npy"), np.array(3, np.int32))
        np.save(os.path.join(d, "bad_s.npy"), np.array(-1.0, np.float32))

        def args(tag, scale="s.npy"):
            return ["fake_quantize", "--in", f"x={d}/x.npy", "--in", f"scale={d}/{scale}",
                    "--in", f"zero_point={d}/z.npy", "--out", f"y={d}/y_{tag}.npy",
                    "--out", f"mask={d}/m_{tag}.npy", "--attr", "bits=8",
                    "--attr", "scope=tensor"]

        calls = {
            "runs": (args("direct"), args("served")),
            "bad scale": (args("d2", "bad_s.npy"), args("s2", "bad_s.npy")),
            "unknown option": (["fake_quantize", "--nope"], ["fake_quantize", "--nope"]),
            "unknown op": (["no_such_op"], ["no_such_op"]),
            "schema": (["fake_quantize", "--schema"], ["fake_quantize", "--schema"]),
        }
        requests = [json.dumps(served) for _, served in calls.values()]
        requests += ["this is not json", json.dumps(["fake_quantize", 3]), json.dumps({"a": 1})]
        requests.append(json.dumps(calls["runs"][1]))  # the server still works afterwards
        proc = subprocess.run([qat, "op-serve"], input="\n".join(requests) + "\n",
                              capture_output=True, text=True)
        answers = [json.loads(line) for line in proc.stdout.splitlines()]
        tally.check("op-serve", proc.returncode == 0 and len(answers) == len(requests),
                    f"rc {proc.returncode}, {len(answers)} answers to {len(requests)} requests: "
                    f"{proc.stderr}")
        if len(answers) != len(requests):
            tally.finish()
        for (name, (direct_args, _)), answer in zip(calls.items(), answers):
            rc, out, err = direct(qat, direct_args)
            got = (answer["rc"], answer["stdout"], answer["stderr"])
            tally.check("op-serve = qat op", got == (rc, out, err),
                        f"{name}: qat op gave {(rc, out, err)!r}, op-serve {got!r}")
            if name in ("bad scale", "unknown op"):
                tally.check("op-serve error", rc == 2 and "error:" in err, f"{name}: {err!r}")
        for tag in ("y", "m"):
            a = np.load(os.path.join(d, f"{tag}_direct.npy"))
            b = np.load(os.path.join(d, f"{tag}_served.npy"))
            tally.check("op-serve = qat op", a.dtype == b.dtype and a.tobytes() == b.tobytes(),
                        f"output {tag} differs")
        for answer, fragment in zip(answers[len(calls):len(calls) + 3],
                                    ("one JSON array", "JSON string", "one JSON array")):
            tally.check("op-serve bad request", answer["rc"] == 2 and fragment in answer["stderr"],
                        repr(answer))
        tally.check("op-serve after bad requests", answers[-1]["rc"] == 0, repr(answers[-1]))
    tally.finish()


if __name__ == "__main__":
    sys.exit(main())
