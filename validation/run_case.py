#!/usr/bin/env python3
"""Runs one validation case: Trident trains the case's deck (dumping its initial checkpoint,
every global batch, the step-1 gradients and the parameters after the first, middle and last
iterations), then the PyTorch reference retrains from the same initial checkpoint on the same
batches and compares losses, lr, grad norms, gradients and parameters. Cases named bert_* run
pretrain_bert against bert_reference.py, t5_* pretrain_t5 against t5_reference.py, the others
pretrain_gpt against gpt_reference.py.

usage: run_case.py CASE_DIR --app PRETRAIN_GPT --work DIR [--np N] [--mpiexec M] [--shards GLOB]
                   [--set KEY=VALUE ...] [--resume-at K]
       run_case.py CASE_DIR --app PRETRAIN_GPT --work-root DIR --layout 'NAME NP [OPTIONS...]' ...

--set overrides a deck key for this run (a parallel layout, recomputation, the distributed
optimizer); the layout the run reports must be the requested one (tests/testlib.assert_layout).
--resume-at K stops Trident after iteration K and resumes it from that checkpoint in a second
job; the reference still trains the whole run in one go from iteration 0, so the resumed half is
compared with the uninterrupted trajectory.

--layout runs several layouts of one case in this one process (CTest runs each case's layouts as
one test, validation/CMakeLists.txt): NAME and NP, then the options of that layout alone (--set,
--resume-at, --identity, ...), each layout in WORK_ROOT/<case>_<NAME>. The reference runs in this
process too (gpt_reference.main, bert_reference.main, t5_reference.main), so Python, torch and the
reference's modules load once per case rather than once per layout. Every layout runs, whether
or not an earlier one failed; the exit status is 0 only when all passed, and the summary at the end
names each layout's result.
"""
import argparse
import configparser
import glob
import importlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from testlib import assert_layout, cache_dir  # noqa: E402
# loaded by every run, whether it writes identity.json or not: the reference's trajectory cache key
# names the validation modules this process has loaded (gpt_reference._validation_sources), so the
# set must not depend on the layout
import identity  # noqa: E402

# The CTest cases assert about 10x the worst value measured over the GPT, BERT and T5 cases and
# their layouts (validation/README.md, "Tolerances"): loss 8.6e-8 (BERT's SOP part, pp=2), lr 1.9e-16,
# grad norm 5.2e-7, step-1 gradients 6.7e-7, parameters 3.18e-4 of their change since
# the checkpoint (GPT pp=2 x vp=2, 4 layers, after step 1).
TOLERANCES = ["--loss-rtol", "7e-7", "--lr-rtol", "1.8e-15", "--gnorm-rtol", "5e-6", "--grad-rtol", "6e-6",
              "--param-rtol", "3e-3"]


# 16-bit GPT cases meet the reference's emulation of Trident's rounding points (gpt_reference.py
# --emulate, automatic for a bf16 / fp16 checkpoint). Free-running, an fp32 value within its own
# rounding error of a 16-bit tie rounds the other way in Trident, so the trajectories part at about
# 1e-5 (measured worst over 20 steps: bf16 loss 1.65e-5, grad norm 1.2e-4, step-1 gradients 7.9e-4,
# parameters 5.8e-2 of their change; fp16 5.2e-6, 3.7e-5, 3.4e-4, 2.0e-2); the sharp checks are the
# reference's own: the loss from Trident's parameters (--forward-rtol 1.5e-6, measured 1.7e-7) and
# the update of Trident's step-1 gradients, reproduced exactly (--update-tol 0).
TOLERANCES_16 = {
    "bf16": ["--loss-rtol", "1.6e-4", "--lr-rtol", "1.8e-15", "--gnorm-rtol", "1.2e-3", "--grad-rtol", "7.8e-3",
             "--param-rtol", "0.5"],
    "fp16": ["--loss-rtol", "5e-5", "--lr-rtol", "1.8e-15", "--gnorm-rtol", "3.7e-4", "--grad-rtol", "3.3e-3",
             "--param-rtol", "0.2"],
}


# 16-bit MoE cases (moe_tiny in bf16 / fp16, 10 steps): the metrics' moe_* columns of the free-running
# trajectories. Once the trajectories part, a token whose top-k router scores lie within their
# difference of a tie is routed to another expert in Trident than in the reference: one selection
# of an iteration's 512 per layer moves moe_max_load by 1/256 (measured: one such selection, 3.6e-3,
# at steps 5-10 of the bf16 runs; none in fp16) and the aux loss with it (measured worst 1.8e-4,
# z loss 1.4e-4). The sharp checks stay the forward from Trident's parameters and the update.
MOE_TOLERANCES_16 = ["--moe-rtol", "1.8e-3", "--moe-load-rtol", "3.6e-2"]


def deck_is_moe(case, overrides):
    """The case's deck has MoE layers ([moe] num_experts > 0) after the --set overrides."""
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    cp.read(os.path.join(case, "deck.ini"))
    try:
        return float(overrides.get("moe.num_experts", cp.get("moe", "num_experts", fallback="0"))) > 0
    except ValueError:
        return False  # (the reference reports the bad value)


def deck_dtype(case, overrides):
    """precision.dtype of the case's deck after the --set overrides."""
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    cp.read(os.path.join(case, "deck.ini"))
    return overrides.get("precision.dtype", cp.get("precision", "dtype", fallback="fp32")).strip().lower()


def deck_iters(case, overrides):
    """train.iters and optim.decay_iters of the case's deck after the --set overrides."""
    cp = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    cp.read(os.path.join(case, "deck.ini"))
    get = lambda s, k, d: overrides.get(s + "." + k, cp.get(s, k, fallback=d))
    return int(get("train", "iters", "0")), int(get("optim", "decay_iters", "0"))


class CaseFailed(Exception):
    """A layout's run failed before its comparison (Trident's exit status, its output, a bad option)."""


# The environment the Trident jobs run in: this process's as it started. The references run in this
# process and set variables of their own when imported (bert_reference.py: OMP_NUM_THREADS), which
# must not reach the next layout's job.
JOB_ENV = dict(os.environ)


def trident(cmd, expect_output=(), env=None):
    """Runs one Trident job, echoing its output; returns the output (raises CaseFailed on failure).
    env: variables set for the job on top of JOB_ENV."""
    print("+", " ".join(f"{k}={v}" for k, v in (env or {}).items()), " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=dict(JOB_ENV, **(env or {})))
    print(p.stdout, end="", flush=True)
    if p.returncode != 0:
        raise CaseFailed(f"Trident failed ({p.returncode})")
    for text in expect_output:
        if text not in p.stdout:
            raise CaseFailed(f"Trident's output lacks {text!r} (--expect-output)")
    return p.stdout


def reference(script, argv):
    """Runs the case's reference script's main(argv) in this process; returns its exit status."""
    module = importlib.import_module(script[:-len(".py")])
    print("+ " + script, " ".join(argv), flush=True)
    try:
        rc = module.main(argv)
    except SystemExit as e:  # argparse, or a reference that exits
        rc = e.code if isinstance(e.code, int) else 1
    sys.stdout.flush()
    return rc or 0


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("case")
    p.add_argument("--app", required=True)
    p.add_argument("--work", help="the run's directory (emptied first); one layout")
    p.add_argument("--work-root", help="with --layout: the directory that holds each layout's <case>_<NAME>")
    p.add_argument("--layout", action="append", default=[], metavar="'NAME NP [OPTIONS...]'",
                   help="run this layout of the case (its name, ranks and own options, one argument) in this "
                        "process; repeat for several")
    p.add_argument("--np", type=int, default=1)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--shards", default="", help="override data.train_shards")
    p.add_argument("--vocab", default="", help="override data.vocab_file (BERT, T5)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a deck key")
    p.add_argument("--resume-at", type=int, default=0, metavar="K", help="stop after iteration K and resume")
    p.add_argument("--dropout-tape", action="store_true",
                   help="record Trident's dropout masks (debug.dump_dropout; one rank) for the reference to apply")
    p.add_argument("--resume-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a deck key in the resumed job only (e.g. another layout)")
    p.add_argument("--reference-cache", metavar="DIR", default=cache_dir("reference"),
                   help="the reference's trajectory cache (gpt_reference.py compare --cache, reference_loop.py --cache), "
                        "kept between runs: each reference trajectory is trained once per machine and code "
                        "(default %(default)s: $TRIDENT_CACHE_DIR/reference, else $XDG_CACHE_HOME/trident/reference, "
                        "else ~/.cache/trident/reference; '' trains every time)")
    p.add_argument("--keep", action="store_true", default=os.environ.get("TRIDENT_KEEP_RUN_FILES", "") not in ("", "0"),
                   help="keep the checkpoints and dumps of a passed case (default: removed; a failed case keeps them)")
    p.add_argument("--identity", action="store_true",
                   help="write the Trident run's identity result (identity.py run_result: metric rows as text, the "
                        "checkpoints' dataset hashes) to WORK/identity.json, for identity.py check --validation-outputs")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep WORK/ck of a passed case (identity.py generates from it)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set NAME=VALUE in the Trident jobs' environment (e.g. ONEDNN_MAX_CPU_ISA=AVX2)")
    p.add_argument("--expect-output", action="append", default=[], metavar="TEXT",
                   help="fail unless every Trident job prints TEXT (e.g. the bf16 path of its GEMM line)")
    return p


def run_layout(a):
    """One layout of the case: Trident's job(s) in a.work, then the reference's comparison.
    Returns the exit status (0: passed)."""
    def pairs(items, flag):
        out = {}
        for kv in items:
            if "=" not in kv:
                raise CaseFailed(f"{flag} {kv}: expected KEY=VALUE")
            k, v = kv.split("=", 1)
            out[k] = v
        return out

    overrides = pairs(a.set, "--set")
    env = pairs(a.env, "--env")
    resume_overrides = dict(overrides, **pairs(a.resume_set, "--resume-set"))
    iters, decay_iters = deck_iters(a.case, overrides)
    if iters < 1:
        raise CaseFailed(f"{a.case}/deck.ini: no train.iters")
    if a.resume_at and not 0 < a.resume_at < iters:
        raise CaseFailed(f"--resume-at {a.resume_at}: must lie inside the run's {iters} iterations")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    w = lambda *x: os.path.join(a.work, *x)
    dump_at = sorted({1, (iters + 1) // 2, iters} | ({a.resume_at} if a.resume_at else set()))

    def command(over, initial=True):
        cmd = [a.mpiexec, "-n", str(a.np), a.app, "--deck", os.path.join(a.case, "deck.ini"),
               "--checkpoint.save", w("ck"), "--checkpoint.save_initial", "true" if initial else "false",
               "--debug.dump_batches", w("batches.h5"), "--debug.dump_grads", w("grads.h5"),
               "--debug.dump_params", w("params"), "--debug.dump_params_iters", ",".join(map(str, dump_at)),
               "--log.metrics_file", w("metrics.csv")]
        if a.dropout_tape:
            cmd += ["--debug.dump_dropout", w("dropout.h5")]
        if a.shards:
            cmd += ["--data.train_shards", a.shards]
        if a.vocab:
            cmd += ["--data.vocab_file", a.vocab]
        for k, v in over.items():
            cmd += ["--" + k, v]
        return cmd

    if a.resume_at:
        # the whole run's schedule in both jobs (decay_iters defaults to train.iters)
        sched = ["--optim.decay_iters", str(decay_iters or iters)]
        first = command(overrides) + ["--train.iters", str(a.resume_at)] + sched
        assert_layout(first, trident(first, a.expect_output, env))
        second = command(resume_overrides, initial=False) + ["--checkpoint.load", w("ck"),
                                                             "--train.iters", str(iters)] + sched
        out = trident(second, a.expect_output, env)
        assert_layout(second, out)
        if "resumed from" not in out or f"at iteration {a.resume_at} " not in out:
            raise CaseFailed(f"the second job did not report resuming at iteration {a.resume_at}")
    else:
        cmd = command(overrides)
        assert_layout(cmd, trident(cmd, a.expect_output, env))
    if a.identity:
        tmp = w("identity.json.tmp")
        with open(tmp, "w") as f:
            json.dump(identity.run_result(a.work), f, indent=1, sort_keys=True)
        os.replace(tmp, w("identity.json"))
    name = os.path.basename(os.path.normpath(a.case))
    script = "bert_reference.py" if name.startswith("bert") else "t5_reference.py" if name.startswith("t5") \
        else "gpt_reference.py"
    ref = ["compare"] if script == "gpt_reference.py" else []
    ref += ["--checkpoint", w("ck", "iter_0000000", "checkpoint.h5"), "--batches", w("batches.h5"),
            "--metrics", w("metrics.csv"), "--grads", w("grads.h5"), "--params", w("params"),
            "--report", w("report.json")]
    dtype = deck_dtype(a.case, overrides)
    ref += TOLERANCES_16[dtype] if script == "gpt_reference.py" and dtype in TOLERANCES_16 else TOLERANCES
    if script == "gpt_reference.py" and dtype in TOLERANCES_16 and deck_is_moe(a.case, overrides):
        ref += MOE_TOLERANCES_16
    if a.dropout_tape:
        ref += ["--dropout-tape", w("dropout.h5")]
    if a.reference_cache:
        ref += ["--cache", a.reference_cache]
    if script == "gpt_reference.py" and a.shards:
        # the corpus's end-of-document id, for runs that pack documents (read from the shards)
        first = sorted(glob.glob(a.shards))
        if first:
            with h5py.File(first[0], "r") as f:
                if "eod_id" in f.attrs:
                    ref += ["--eod-id", str(int(f.attrs["eod_id"]))]
    rc = reference(script, ref)
    if rc == 0 and not a.keep:
        # a passed case leaves its metrics and report; its checkpoints and dumps (tens of MB a
        # case, gigabytes over the suite) go, so the suite's disk use stays that of a few cases
        freed = 0
        for name in ("params", "batches.h5", "grads.h5", "dropout.h5") + (() if a.keep_checkpoints else ("ck",)):
            path = w(name)
            if os.path.isdir(path):
                for root, _, files in os.walk(path):
                    freed += sum(os.path.getsize(os.path.join(root, f)) for f in files)
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                freed += os.path.getsize(path)
                os.remove(path)
        print(f"passed: removed {freed / 2**20:.1f} MiB of checkpoints and dumps from {a.work} "
              f"(--keep or TRIDENT_KEEP_RUN_FILES=1 keeps them)", flush=True)
    return rc


def without_layouts(argv):
    """argv less its --layout options (the options every layout shares)."""
    out, k = [], 0
    while k < len(argv):
        if argv[k] == "--layout":
            k += 2
            continue
        if not argv[k].startswith("--layout="):
            out.append(argv[k])
        k += 1
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = parser()
    a = p.parse_args(argv)
    if not a.layout:
        if not a.work:
            p.error("--work is required (or --work-root with --layout)")
        try:
            return run_layout(a)
        except CaseFailed as e:
            print(e, file=sys.stderr, flush=True)
            return 1
        except AssertionError as e:
            print(f"assertion failed: {e}", file=sys.stderr, flush=True)
            return 1
    if not a.work_root or a.work:
        p.error("--layout takes --work-root (each layout's directory is WORK_ROOT/<case>_<NAME>), not --work")
    shared = without_layouts(argv)
    case_name = os.path.basename(os.path.normpath(a.case))
    results = []
    for spec in a.layout:
        parts = shlex.split(spec)
        if len(parts) < 2 or not parts[1].isdigit():
            p.error(f"--layout {spec!r}: expected 'NAME NP [OPTIONS...]'")
        name, np_ = parts[0], parts[1]
        work = os.path.join(a.work_root, f"{case_name}_{name}")
        print(f"==== {case_name} {name}: {np_} rank(s), {' '.join(parts[2:]) or 'the deck as it is'}", flush=True)
        t0 = time.time()
        try:
            rc = run_layout(p.parse_args(shared + ["--np", np_, "--work", work] + parts[2:]))
            why = "" if rc == 0 else f"the comparison failed (exit {rc})"
        except CaseFailed as e:
            rc, why = 1, str(e)
        except SystemExit as e:
            rc, why = 1, f"exit {e.code}"
        except Exception as e:  # a layout's error (an assertion on its layout, ...) is reported with the others' results
            import traceback
            traceback.print_exc()
            rc, why = 1, f"{type(e).__name__}: {e}"
        if rc:
            print(f"==== {case_name} {name}: FAILED: {why} (its files stay in {work})", flush=True)
        results.append((name, rc, why, time.time() - t0))
    failed = [r for r in results if r[1]]
    print(f"==== {case_name}: {len(results) - len(failed)} of {len(results)} runs passed", flush=True)
    for name, rc, why, secs in results:
        print(f"  {name:40s} {'passed' if rc == 0 else 'FAILED: ' + why} ({secs:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
