#!/usr/bin/env python3
"""The real job scripts under a real (single-node) Slurm (CTest label slurm).

usage: slurm_checks.py --root REPO --build BUILD --shards GLOB --work DIR [--mpiexec M]

Starts Slurm with tests/slurm/slurm_cluster.sh (skips with exit code 77 and the reason without root
or the packages; fails when they are there but Slurm does not come up), then:
  gpt      `sbatch --wait jobscripts/pretrain_gpt.sbatch` (2 ranks through srun --mpi=pmi2) trains
           the tiny deck: exit code 0, every metrics row, a checkpoint
  preempt  a run of jobscripts/pretrain_gpt.sbatch with TRIDENT_RESUBMIT=1 receives the time-limit
           warning the way `#SBATCH --signal=B:USR1@300` delivers it (`scancel --signal=USR1
           --batch`: to the batch shell, which passes it on to the ranks); the job ends with exit
           code 3 after a checkpoint, resubmits itself, and the new job resumes with
           --checkpoint.load auto and ends with exit code 0 and the same 150 losses as an
           uninterrupted run (bitwise)
"""
import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def job_state(job, env):
    out = subprocess.run(["scontrol", "-o", "show", "job", str(job)], capture_output=True, text=True, env=env).stdout
    state = re.search(r"JobState=(\S+)", out)
    code = re.search(r"ExitCode=(\d+):(\d+)", out)
    return (state.group(1) if state else "UNKNOWN"), (int(code.group(1)) if code else -1)


def wait_job(job, env, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        state, code = job_state(job, env)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "UNKNOWN"):
            return state, code
        time.sleep(0.5)
    raise AssertionError(f"job {job} did not end within {timeout} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--shards", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--mpiexec", default="mpiexec")
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    w = lambda *p: os.path.join(a.work, *p)  # noqa: E731
    state_dir = w("slurm")
    r = subprocess.run(["bash", os.path.join(HERE, "slurm_cluster.sh"), "start", state_dir], capture_output=True,
                       text=True)
    if r.returncode == 77:
        print("SKIP: Slurm is not available here:", r.stderr.strip())
        return 77
    if r.returncode != 0:  # root and the packages are there, but Slurm did not come up: a failure
        print("FAIL: Slurm is installed but did not start:", r.stderr.strip())
        return 1
    print(r.stderr.strip())  # the ports it picked
    env = dict(os.environ, SLURM_CONF=os.path.join(state_dir, "slurm.conf"), TRIDENT_BUILD=a.build,
               DECK=os.path.join(a.root, "inputs", "gpt_tiny_ci.ini"))
    env.pop("OMP_NUM_THREADS", None)
    try:
        # ---- gpt: the plain job
        extra = (f"--data.train_shards {a.shards} --train.iters 10 --eval.interval 0 --log.metrics_file {w('gpt.csv')}"
                 f" --checkpoint.save {w('ck_gpt')}")
        r = subprocess.run(["sbatch", "--wait", "--overcommit", "--nodes=1", "--ntasks=2", "-o", w("gpt.out"),
                            "jobscripts/pretrain_gpt.sbatch"], cwd=a.root, env=dict(env, EXTRA=extra),
                           capture_output=True, text=True, timeout=600)
        out = open(w("gpt.out")).read() if os.path.exists(w("gpt.out")) else ""
        assert r.returncode == 0, f"sbatch --wait: exit code {r.returncode}\n{r.stderr}\n{out}"
        assert len(rows(w("gpt.csv"))) == 10 and os.path.exists(w("ck_gpt", "latest")), out
        assert "trident: pretrain_gpt on 2 ranks" in out and "exited with code 0" in out, out
        print("gpt: sbatch --wait jobscripts/pretrain_gpt.sbatch, 2 ranks through srun: exit 0, 10 iterations, "
              "checkpoint written")

        # ---- preempt: the time-limit warning, checkpoint, exit 3, resubmission, exact resume
        iters = "--train.iters 150 --optim.decay_iters 150 --eval.interval 0 --log.interval 50"
        subprocess.run([a.mpiexec, "-n", "2", os.path.join(a.build, "apps", "pretrain_gpt"), "--deck", env["DECK"],
                        "--data.train_shards", a.shards, *iters.split(), "--log.metrics_file", w("ref.csv")],
                       check=True, capture_output=True, timeout=600)
        want = [x["loss"] for x in rows(w("ref.csv"))]
        extra = (f"--data.train_shards {a.shards} {iters} --log.metrics_file {w('pre.csv')}"
                 f" --checkpoint.save {w('ck_pre')}")
        sb = f"--overcommit --nodes=1 --ntasks=2 -o {w('pre_%j.out')}"
        r = subprocess.run(["sbatch", "--parsable", *sb.split(), "jobscripts/pretrain_gpt.sbatch"], cwd=a.root,
                           env=dict(env, EXTRA=extra, TRIDENT_RESUBMIT="1", TRIDENT_SBATCH_ARGS=sb),
                           capture_output=True, text=True, check=True)
        first = int(r.stdout.strip().split(";")[0])
        t0 = time.time()
        while len(rows(w("pre.csv"))) < 5:
            assert time.time() - t0 < 300, "the job wrote no metrics"
            state, _ = job_state(first, env)
            assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {first} ended early: {state}"
            time.sleep(0.2)
        subprocess.run(["scancel", "--signal=USR1", "--batch", str(first)], env=env, check=True)
        state, code = wait_job(first, env)
        out1 = open(w(f"pre_{first}.out")).read()
        assert code == 3, f"job {first}: {state}, exit code {code} (expected 3)\n{out1}"
        assert "USR1 (time limit ahead)" in out1 and "received SIGUSR1: stopped after iteration" in out1, out1
        stopped = int(open(w("ck_pre", "latest")).read())
        m = re.search(r"Submitted batch job (\d+)", out1)
        assert m, f"job {first} did not resubmit itself\n{out1}"
        second = int(m.group(1))
        state, code = wait_job(second, env)
        out2 = open(w(f"pre_{second}.out")).read()
        assert code == 0, f"resubmitted job {second}: {state}, exit code {code}\n{out2}"
        assert f"at iteration {stopped}" in out2, out2
        got = rows(w("pre.csv"))
        assert [x["iteration"] for x in got] == [str(i) for i in range(1, 151)], "metrics rows not continuous"
        assert [x["loss"] for x in got] == want, "the resumed losses differ from the uninterrupted run"
        print(f"preempt: job {first} got USR1 in its batch shell, checkpointed after iteration {stopped} and exited 3; "
              f"it resubmitted itself as job {second}, which resumed (--checkpoint.load auto) and finished with exit "
              f"code 0 and all 150 losses equal to an uninterrupted run")
    finally:
        subprocess.run(["bash", os.path.join(HERE, "slurm_cluster.sh"), "stop", state_dir])
    return 0


if __name__ == "__main__":
    sys.exit(main())
