"""Shared pieces of the Python test drivers (tests/e2e, tests/mpi, tests/faults and
validation/run_case.py): run() a command and collect its output; single_error_failures() for
cases that must fail with exactly one 'error' line; check_main(), the drivers' common command
line; trident_checksum(), a checkpoint dataset's `checksum` attribute recomputed with numpy; and
assert_layout(), the parallel layout a run reports checked against the one it asked for;
cache_dir(), where the tests keep what they download and the references' trajectories (kept across
build directories and clones)."""
import os
import subprocess
import time


def cache_dir(*sub):
    """The tests' download cache: $TRIDENT_CACHE_DIR, else ${XDG_CACHE_HOME:-$HOME/.cache}/trident,
    joined with sub. Outside the build directory, so that a clean clone on a machine that ran the
    suite before finds what an earlier run fetched (each file is checked by its pinned sha256 before
    use, whoever wrote it)."""
    base = os.environ.get("TRIDENT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "trident")
    return os.path.join(base, *sub)


def run(cmd, expect_ok=True, timeout=600, env=None):
    """Runs cmd; returns (exit code, combined output, seconds). Stops the test on failure
    when expect_ok."""
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=env)
    dt = time.time() - t0
    if expect_ok and p.returncode != 0:
        print(p.stdout)
        raise SystemExit(f"FAILED ({p.returncode}): {' '.join(cmd)}")
    return p.returncode, p.stdout, dt


def single_error_failures(cases, timeout=120):
    """cases: (name, command, needle). Each command must exit non-zero within `timeout` s (no
    rank left hanging) with exactly one line starting with 'error' and the needle in its
    output. Returns the names that failed."""
    failures = []
    for name, cmd, needle in cases:
        try:
            rc, out, dt = run(cmd, expect_ok=False, timeout=timeout)
        except subprocess.TimeoutExpired:
            failures.append(f"{name}: HUNG")
            continue
        errors = [l for l in out.splitlines() if l.startswith("error")]
        ok = rc != 0 and needle in out and len(errors) == 1
        print(f"{'ok  ' if ok else 'FAIL'} {name:40s} rc={rc} {dt:4.1f}s  {errors[0] if errors else out[-300:]}")
        if not ok:
            failures.append(name)
    return failures


def check_main(checks, make_context, mpiexec_default="mpiexec"):
    """The drivers' command line: CHECK --app --deck --shards --work [--mpiexec]; runs
    checks[CHECK](make_context(args)) and prints '<check>: passed'."""
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("check", choices=sorted(checks))
    p.add_argument("--app", required=True)
    p.add_argument("--deck", required=True)
    p.add_argument("--shards", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mpiexec", default=mpiexec_default)
    a = p.parse_args()
    checks[a.check](make_context(a))
    print(f"{a.check}: passed")



def trident_checksum(values):
    """The `checksum` attribute Trident writes on a checkpoint dataset (docs/checkpoints.md), computed
    independently of the C++ code: the sum mod 2^64 over the elements, in row-major order, of
    splitmix64(index * 0x9e3779b97f4a7c15 + the element's fp32 bits), as 16 hex digits."""
    import numpy as np
    k = np.uint64(0x9E3779B97F4A7C15)
    bits = np.ascontiguousarray(values, dtype="<f4").view(np.uint32).ravel().astype(np.uint64)
    with np.errstate(over="ignore"):
        x = np.arange(bits.size, dtype=np.uint64) * k + bits + k
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
        return "%016x" % int(x.sum(dtype=np.uint64))


def assert_layout(cmd, out):
    """The layout a pretraining run reports (its 'parallel:' and 'optimizer:' lines) is the one its
    command line asks for: tp, pp, cp, dp (ranks / (tp x pp x cp)), sequence parallelism, vp and the
    distributed optimizer, each checked when given on the command line (dp always). A run that fell
    back to another layout fails here instead of passing its comparison by accident."""
    import re

    def flag(key, default):
        v = default
        for i, a in enumerate(cmd):
            if a == "--" + key and i + 1 < len(cmd):
                v = cmd[i + 1]
            elif a.startswith("--" + key + "="):
                v = a.split("=", 1)[1]
        return v

    np_ = int(cmd[cmd.index("-n") + 1]) if "-n" in cmd else 1
    tp, pp, cp = int(flag("parallel.tp", 1)), int(flag("parallel.pp", 1)), int(flag("parallel.cp", 1))
    want = dict(tp=tp, pp=pp, dp=np_ // (tp * pp * cp), cp=cp)
    m = re.search(r"^parallel: tp (\d+)( with sequence parallelism)?, pp (\d+)(?: \((?:interleaved 1F1B, vp (\d+)|1F1B)\))?"
                  r", dp (\d+)(?:, cp (\d+) \(([^)]*)\))?;", out, re.M)
    assert m, "the run printed no 'parallel:' line"
    got = dict(tp=int(m.group(1)), pp=int(m.group(3)), dp=int(m.group(5)), cp=int(m.group(6) or 1))
    if flag("parallel.cp_comm_type", None) is not None and cp > 1:
        want["cp_comm_type"] = flag("parallel.cp_comm_type", "p2p")
        got["cp_comm_type"] = m.group(7).rsplit(", ", 1)[-1]
    if flag("parallel.sequence_parallel", None) is not None:
        want["sp"] = flag("parallel.sequence_parallel", "false") == "true" and tp > 1
        got["sp"] = m.group(2) is not None
    if flag("parallel.vp", None) is not None and pp > 1:
        want["vp"] = int(flag("parallel.vp", 1))
        got["vp"] = int(m.group(4) or 1)
    if flag("optim.distributed", None) is not None:  # auto: on when dp > 1
        setting = flag("optim.distributed", "auto")
        want["zero1"] = want["dp"] > 1 if setting == "auto" else setting in ("true", "1", "yes", "on")
        got["zero1"] = "distributed (ZeRO-1)" in out
    if flag("parallel.ep", None) is not None:  # MoE: the experts' grid
        want["ep"] = int(flag("parallel.ep", 1))
        e = re.search(r"^experts: ep (\d+), expert_tp (\d+), expert_dp (\d+)", out, re.M)
        assert e, "the run printed no 'experts:' line"
        got["ep"] = int(e.group(1))
        if flag("parallel.expert_tp", None) is not None:
            want["expert_tp"] = int(flag("parallel.expert_tp", 1))
            got["expert_tp"] = int(e.group(2))
        assert int(e.group(1)) * int(e.group(2)) * int(e.group(3)) == tp * want["dp"], \
            f"the experts' grid {e.group(0)} does not cover the tp x dp = {tp * want['dp']} ranks of a stage"
    assert got == want, f"the run reports the layout {got}, not the requested {want}"
