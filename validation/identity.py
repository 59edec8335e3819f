#!/usr/bin/env python3
"""Bitwise identity of Trident's training runs against a recorded baseline.

The redesign of the model core and the trainer (issue 19) must not change one bit of what a
run computes. This tool runs a fixed set of Trident jobs (every validation case, the
tensor/pipeline/data-parallel, recomputation, distributed-optimizer, 16-bit, fused-attention,
overlap, evaluation and generation runs the equivalence checks cover) and reduces each to:
  - the per-step metric columns as exact text (iteration, consumed samples, loss, lr, grad norm,
    loss scale, skipped), and the evaluation rows, also as text;
  - the sha256 of every dataset of every checkpoint the run saved (name, dtype, shape, bytes);
  - for generation, the printed text and token ids (greedy; sampled with and without the cache).

  identity.py record --build-dir build --sample data/sample [--family gpt|bert|t5]
      runs the jobs and writes validation/identity/<machine key>.json (merging families);
  identity.py check --build-dir build --sample data/sample [--family F]
      runs them again and compares with the record: exit 0 when every value is identical,
      1 with the first differences per run, 77 when no record exists for this machine key.

Bits depend on the CPU (oneDNN picks kernels by instruction set), the GEMM backend and its
version, the compiler and its version, and the host code's target CPU (TRIDENT_HOST_ARCH), so a
record is keyed by them:
<vendor>-f<family>-m<model>-<gemm><version>-<compiler><version>[-<arch>], e.g.
amd-f25-m1-dnnl2.6.3-gnu12.2.0-native.
Jobs run with OMP_NUM_THREADS=1 and one rank per process, as the suite does; --threads N runs
them with N threads per rank instead, against the same record (the host kernels' results do not
depend on the thread count, docs/DESIGN.md "Host threads"; nor, measured, do oneDNN's GEMMs'
where it runs its AVX-512 kernels; its AVX2 kernels sum some GEMMs cut into per-thread slabs in
another order, so on AVX2 CPUs that holds for these small models' shapes, 46 of 46 on Zen 3, and
not for every model).
"""
import argparse
import csv
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECORD_DIR = os.path.join(HERE, "identity")
METRIC_COLUMNS = ["iteration", "consumed_samples", "loss", "lr", "grad_norm", "loss_scale", "skipped"]


# The runs whose job is exactly a validation run's (validation/CMakeLists.txt: the run <name> of the
# test validation_<case>_np1 or _layouts, the same deck, layout and iterations; its dumps change no
# bit): with --validation-outputs, check reads their results from that run's own outputs (run_case.py writes identity.json) instead of
# running the job again. Not among them: the plain dp2 runs and T5's (no such validation test), the
# resumes (run_case.py's first job keeps the whole run's decay_iters, this tool's does not), and
# gpt_linear, gpt_constant and gpt_dropout (their validation tests take 10 steps, these runs 20).
VALIDATION_JOBS = {"gpt_tiny_np1", "gpt_tiny_tp2", "gpt_tiny_tp2_sp", "gpt_tiny_pp2", "gpt_tiny_pp2_vp2",
                   "gpt_tiny_tp2pp2dp2_sp", "gpt_tiny_zero1_tp2dp2", "gpt_tiny_zero1_pp2dp2",
                   "gpt_tiny_recompute_full_dp2", "gpt_tiny_recompute_selective_tp2", "gpt_bf16_np1", "gpt_fp16_np1",
                   "bert_tiny_np1", "bert_tiny_np2", "bert_tiny_tp2_sp", "bert_tiny_pp2", "bert_dropout_np1",
                   "t5_tiny_np1", "t5_tiny_tp2", "t5_tiny_pp2", "t5_dropout_np1"}


def case(name, family, deck, np_=1, set_=(), resume_at=0, resume_set=(), generate=False):
    # validation: the job of the validation run <name> (validation/CMakeLists.txt), which also
    # runs it (against the reference, to a tolerance) and leaves its result (run_result)
    return dict(name=name, family=family, deck=deck, np=np_, set=list(set_), resume_at=resume_at,
                resume_set=list(resume_set), generate=generate, validation=name in VALIDATION_JOBS)


def cases():
    v = lambda c: os.path.join("validation", c, "deck.ini")
    ci = lambda f: os.path.join("inputs", f + "_tiny_ci.ini")
    tp2, sp, pp2 = ["parallel.tp=2"], ["parallel.sequence_parallel=true"], ["parallel.pp=2"]
    zero = ["optim.distributed=true"]
    bf16, fp16 = ["precision.dtype=bf16"], ["precision.dtype=fp16"]
    out = [
        # the validation cases (validation/CMakeLists.txt), Trident's side only
        case("gpt_tiny_np1", "gpt", v("gpt_tiny"), generate=True),
        case("gpt_tiny_np2", "gpt", v("gpt_tiny"), 2),
        case("gpt_tiny_tp2", "gpt", v("gpt_tiny"), 2, tp2),
        case("gpt_tiny_tp2_sp", "gpt", v("gpt_tiny"), 2, tp2 + sp),
        case("gpt_tiny_pp2", "gpt", v("gpt_tiny"), 2, pp2),
        case("gpt_tiny_pp2_vp2", "gpt", v("gpt_tiny"), 2, pp2 + ["parallel.vp=2", "model.num_layers=4"]),
        case("gpt_tiny_tp2pp2dp2_sp", "gpt", v("gpt_tiny"), 8, tp2 + pp2 + sp + ["train.iters=5"]),
        case("gpt_tiny_zero1_tp2dp2", "gpt", v("gpt_tiny"), 4, tp2 + zero),
        case("gpt_tiny_zero1_pp2dp2", "gpt", v("gpt_tiny"), 4, pp2 + zero),
        case("gpt_tiny_recompute_full_dp2", "gpt", v("gpt_tiny"), 2, ["precision.recompute=full"]),
        case("gpt_tiny_recompute_selective_tp2", "gpt", v("gpt_tiny"), 2, tp2 + ["precision.recompute=selective"]),
        case("gpt_tiny_resume10_dp2", "gpt", v("gpt_tiny"), 2, resume_at=10),
        case("gpt_tiny_resume10_tp2_to_pp2", "gpt", v("gpt_tiny"), 2, tp2, 10,
             ["parallel.tp=1", "parallel.pp=2"]),
        case("gpt_linear_np1", "gpt", v("gpt_linear")),
        case("gpt_constant_np1", "gpt", v("gpt_constant")),
        case("gpt_dropout_np1", "gpt", v("gpt_dropout")),
        case("gpt_bf16_np1", "gpt", v("gpt_bf16")),
        case("gpt_fp16_np1", "gpt", v("gpt_fp16")),
        # 16-bit under the layouts, recomputation and the distributed optimizer
        case("gpt_bf16_tp2_sp", "gpt", v("gpt_bf16"), 2, tp2 + sp),
        case("gpt_bf16_pp2", "gpt", v("gpt_bf16"), 2, pp2),
        case("gpt_bf16_zero1_dp2", "gpt", v("gpt_bf16"), 2, zero),
        case("gpt_fp16_tp2_sp", "gpt", v("gpt_fp16"), 2, tp2 + sp),
        case("gpt_fp16_pp2_recompute", "gpt", v("gpt_fp16"), 2, pp2 + ["precision.recompute=full"]),
        # the CI deck: dropout, evaluation, fused attention, overlap, prefetch, grouped p2p
        case("gpt_ci_np1", "gpt", ci("gpt")),
        case("gpt_ci_flash_tp2_sp", "gpt", ci("gpt"), 2, tp2 + sp + ["model.flash_attention=true"]),
        case("gpt_ci_bf16_flash", "gpt", ci("gpt"), 1, bf16 + ["model.flash_attention=true"]),
        case("gpt_ci_overlap_dp2", "gpt", ci("gpt"), 2, ["parallel.overlap_grad_reduce=true",
                                                           "data.prefetch=true", "train.global_batch_size=8"]),
        case("gpt_ci_pp2_vp2_tp2", "gpt", ci("gpt"), 4, tp2 + pp2 + ["parallel.vp=2", "model.num_layers=4"]),
        # BERT
        case("bert_tiny_np1", "bert", v("bert_tiny")),
        case("bert_tiny_np2", "bert", v("bert_tiny"), 2),
        case("bert_tiny_tp2_sp", "bert", v("bert_tiny"), 2, tp2 + sp),
        case("bert_tiny_pp2", "bert", v("bert_tiny"), 2, pp2),
        case("bert_dropout_np1", "bert", v("bert_dropout"), 1, ["train.iters=10"]),
        case("bert_tiny_bf16_zero1_dp2", "bert", v("bert_tiny"), 2, bf16 + zero),
        case("bert_ci_np1", "bert", ci("bert")),
        case("bert_ci_pp2_vp2", "bert", ci("bert"), 2, pp2 + ["parallel.vp=2", "model.num_layers=4"]),
        case("bert_ci_fp16_recompute_tp2", "bert", ci("bert"), 2, fp16 + tp2 + ["precision.recompute=selective"]),
        # T5
        case("t5_tiny_np1", "t5", v("t5_tiny")),
        case("t5_tiny_np2", "t5", v("t5_tiny"), 2),
        case("t5_tiny_tp2", "t5", v("t5_tiny"), 2, tp2),
        case("t5_tiny_pp2", "t5", v("t5_tiny"), 2, pp2),
        case("t5_tiny_resume10_dp2", "t5", v("t5_tiny"), 2, resume_at=10),
        case("t5_dropout_np1", "t5", v("t5_dropout"), 1, ["train.iters=10"]),
        case("t5_tiny_bf16_tp2_sp", "t5", v("t5_tiny"), 2, bf16 + tp2 + sp),
        case("t5_ci_np1", "t5", ci("t5")),
        case("t5_ci_fp16_recompute_zero1_dp2", "t5", ci("t5"), 2, fp16 + zero + ["precision.recompute=full"]),
    ]
    return out


def machine_key(build_dir):
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                k, v = (s.strip() for s in line.split(":", 1))
                info.setdefault(k, v)
            elif info:
                break
    cache = {}
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            for line in f:
                if "=" in line and ":" in line.split("=", 1)[0]:
                    k, v = line.rstrip("\n").split("=", 1)
                    cache[k.split(":")[0]] = v
    except OSError:
        sys.exit(f"{build_dir}/CMakeCache.txt: not a configured build directory")
    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(info.get("vendor_id", ""),
                                                                   info.get("vendor_id", "cpu").lower() or "cpu")
    # the GEMM library with its version (another oneDNN build may choose other kernels), then the
    # host code's target (TRIDENT_HOST_ARCH; none: the compiler's default, no suffix)
    key = (f"{vendor}-f{info.get('cpu family', 'x')}-m{info.get('model', 'x')}-"
           f"{cache.get('TRIDENT_GEMM_RESOLVED', 'unknown-gemm')}{cache.get('TRIDENT_GEMM_VERSION', '')}")
    # the compiler that built the host code (another version may schedule floating point otherwise)
    key += "-" + compiler_tag(build_dir)
    arch = cache.get("TRIDENT_HOST_ARCH")
    if arch is None:  # a build configured before TRIDENT_HOST_ARCH: its TRIDENT_NATIVE_ARCH switch
        arch = "native" if cache.get("TRIDENT_NATIVE_ARCH", "OFF").upper() in ("ON", "1", "TRUE", "YES") else "none"
    if arch != "none":
        key += "-" + arch
    return key


def compiler_tag(build_dir):
    """The C++ compiler of the build, as CMake identified it: e.g. gnu12.2.0."""
    for path in sorted(glob.glob(os.path.join(build_dir, "CMakeFiles", "*", "CMakeCXXCompiler.cmake"))):
        with open(path) as f:
            text = f.read()
        cid = re.search(r'set\(CMAKE_CXX_COMPILER_ID "([^"]*)"\)', text)
        ver = re.search(r'set\(CMAKE_CXX_COMPILER_VERSION "([^"]*)"\)', text)
        if cid and ver:
            return cid.group(1).lower() + ver.group(1)
    return "unknown-compiler"


def sha_of_file_datasets(path):
    """{dataset name: sha256 of dtype, shape and bytes} for every dataset of one HDF5 file."""
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            a = np.ascontiguousarray(obj[()])
            h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.tobytes())
            out[name] = h.hexdigest()[:16]  # 64 bits: a chance collision is not a concern here

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def metric_rows(path):
    """The metric columns that carry results, as the text Trident wrote."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    cols = [c for c in METRIC_COLUMNS if rows and c in rows[0]]
    return [",".join(r[c] for c in cols) for r in rows]


def run(cmd, env):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout[-4000:])
        sys.exit(f"identity: {' '.join(cmd)} failed ({p.returncode})")
    return p.stdout


def run_case(c, a, work):
    apps = {"gpt": "pretrain_gpt", "bert": "pretrain_bert", "t5": "pretrain_t5"}
    shards = {"gpt": "kjv_gpt2_*.h5", "bert": "kjv_bert_*.h5", "t5": "kjv_t5_*.h5"}
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    app = os.path.join(a.build_dir, "apps", apps[c["family"]])
    w = lambda *x: os.path.join(work, *x)

    def command(over, initial=True):
        cmd = [a.mpiexec, "-n", str(c["np"]), app, "--deck", os.path.join(ROOT, c["deck"]),
               "--data.train_shards", os.path.join(a.sample, shards[c["family"]]),
               "--checkpoint.save", w("ck"), "--checkpoint.save_initial", "true" if initial else "false",
               "--log.metrics_file", w("metrics.csv")]
        if c["family"] != "gpt":
            cmd += ["--data.vocab_file", os.path.join(a.sample, "bert", "vocab.txt")]
        for kv in over:
            k, v = kv.split("=", 1)
            cmd += ["--" + k, v]
        return cmd

    if c["resume_at"]:
        run(command(c["set"]) + ["--train.iters", str(c["resume_at"])], env)
        run(command(c["set"] + c["resume_set"], initial=False) + ["--checkpoint.load", w("ck")], env)
    else:
        run(command(c["set"]), env)
    result = run_result(work)
    if c["generate"]:
        result.update(generation(a, w("ck"), env))
    return result


def run_all(todo, a, work):
    """Every run's result and where it came from, {name: (result, source)}: read from its validation
    test's outputs (check --validation-outputs), or run, side by side as long as their ranks fit in
    --slots (a run of more ranks than slots runs alone). Each run's bits do not depend on what runs
    beside it (one thread per rank, its own files)."""
    import threading
    out, errors = {}, []
    free = [a.slots]
    cond = threading.Condition()

    def one(c, need):
        try:
            d = os.path.join(work, c["name"])
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            out[c["name"]] = (run_case(c, a, d), "run")
        except BaseException as e:  # noqa: B036 (run() exits on a failed job: reported after the others)
            errors.append(f"{c['name']}: {e}")
        finally:
            with cond:
                free[0] += need
                cond.notify_all()

    threads = []
    for c in todo:
        if a.validation_outputs and c["validation"] and a.mode == "check":
            out[c["name"]] = (from_validation(c, a), "read from the validation run %s" % c["name"])
            continue
        need = min(c["np"], a.slots)
        with cond:
            cond.wait_for(lambda: free[0] >= need)
            free[0] -= need
        t = threading.Thread(target=one, args=(c, need))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    if errors:
        sys.exit("identity: " + "; ".join(errors))
    return out


def run_result(work):
    """A finished job's result in its directory: the metric rows (and any other metrics*.csv) as
    text and the datasets' hashes of every checkpoint in ck/."""
    w = lambda *x: os.path.join(work, *x)
    result = {"metrics": metric_rows(w("metrics.csv"))}
    for extra in sorted(glob.glob(w("metrics*.csv"))):
        if extra != w("metrics.csv"):
            with open(extra) as f:
                result[os.path.basename(extra)] = f.read().splitlines()
    result["checkpoints"] = {os.path.basename(os.path.dirname(p)): sha_of_file_datasets(p)
                             for p in sorted(glob.glob(w("ck", "iter_*", "checkpoint.h5")))}
    return result


def generation(a, ck, env):
    """Greedy, sampled, and sampled without the key-value cache, from checkpoint directory ck."""
    result = {}
    gen = [a.mpiexec, "-n", "1", os.path.join(a.build_dir, "apps", "generate_gpt"), "--checkpoint", ck,
           "--vocab-file", os.path.join(a.sample, "gpt2", "encoder.json"),
           "--merge-file", os.path.join(a.sample, "gpt2", "vocab.bpe"),
           "--prompt", "In the beginning", "--prompt", "And the LORD said unto Moses",
           "--max-new-tokens", "12", "--print-ids"]
    keep = lambda out: [l for l in out.splitlines() if l.startswith(("ids[", "["))]
    sample = ["--top-k", "40", "--temperature", "1.5", "--seed", "7"]
    result["generate_greedy"] = keep(run(gen + ["--greedy"], env))
    result["generate_sampled"] = keep(run(gen + sample, env))
    result["generate_sampled_no_cache"] = keep(run(gen + sample + ["--no-cache"], env))
    return result


def from_validation(c, a):
    """The result of run c as its validation test left it (run_case.py --identity): identity.json in
    the test's work directory, and generation from its kept checkpoints when c generates."""
    d = os.path.join(a.validation_outputs, c["name"])
    path = os.path.join(d, "identity.json")
    if not os.path.exists(path):
        sys.exit(f"identity: {path} is missing: the validation run {c['name']} did not run with --identity "
                 f"(CTest runs its test, validation_<case>_np1 or _layouts, first, as this test's fixture)")
    with open(path) as f:
        got = json.load(f)
    if c["generate"]:
        if not os.path.isdir(os.path.join(d, "ck")):
            sys.exit(f"identity: {d}/ck is missing: the validation run {c['name']} must keep its checkpoints "
                     f"(run_case.py --identity --keep-checkpoints)")
        got.update(generation(a, os.path.join(d, "ck"), dict(os.environ, OMP_NUM_THREADS=str(a.threads))))
    return got


def diff(name, want, got):
    """The first differences between a recorded and a new result, as lines."""
    out = []
    for k in sorted(set(want) | set(got)):
        w, g = want.get(k), got.get(k)
        if w == g:
            continue
        if k == "checkpoints" and isinstance(w, dict) and isinstance(g, dict):
            for it in sorted(set(w) | set(g)):
                wd, gd = w.get(it, {}), g.get(it, {})
                bad = [d for d in sorted(set(wd) | set(gd)) if wd.get(d) != gd.get(d)]
                if bad:
                    out.append(f"{name}: checkpoint {it}: {len(bad)} datasets differ, e.g. {bad[:3]}")
        elif isinstance(w, list) and isinstance(g, list):
            for i, (x, y) in enumerate(zip(w, g)):
                if x != y:
                    out.append(f"{name}: {k} row {i + 1}: recorded {x!r}, now {y!r}")
                    break
            if len(w) != len(g):
                out.append(f"{name}: {k}: {len(w)} rows recorded, {len(g)} now")
        else:
            out.append(f"{name}: {k}: recorded {w!r:.200}, now {g!r:.200}")
    return out


def selftest(a):
    """The comparison fails on one changed digit, dataset or token, and passes on a rerun."""
    c = next(c for c in cases() if c["name"] == "gpt_tiny_np1")
    c = dict(c, set=["train.iters=4"])
    with tempfile.TemporaryDirectory(prefix="trident_identity_") as work:
        first = run_case(c, a, os.path.join(work, "first"))
        second = run_case(c, a, os.path.join(work, "second"))
    problems = []
    if diff("rerun", first, second):
        problems.append(f"two identical runs differ: {diff('rerun', first, second)[:2]}")
    m = json.loads(json.dumps(first))
    row = m["metrics"][2].split(",")
    row[2] = row[2][:-1] + ("1" if row[2][-1] != "1" else "2")
    m["metrics"][2] = ",".join(row)
    d = json.loads(json.dumps(first))
    it = sorted(d["checkpoints"])[-1]
    name = sorted(d["checkpoints"][it])[-1]
    d["checkpoints"][it][name] = "0" * 16
    g = json.loads(json.dumps(first))
    g["generate_sampled"][1] += " 1"
    for what, changed in (("a loss's last digit", m), ("one checkpoint dataset", d), ("one generated token", g)):
        found = diff("selftest", changed, second)
        print(f"{what} changed: {'detected: ' + found[0] if found else 'NOT detected'}")
        if not found:
            problems.append(f"{what} changed but the comparison passed")
    for p_ in problems:
        print("FAIL:", p_)
    print("identity comparator selftest:", "FAIL" if problems else "PASS")
    return 1 if problems else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["record", "check", "list", "validation-jobs", "selftest"])
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--sample", default=os.path.join(ROOT, "data", "sample"))
    p.add_argument("--family", choices=["gpt", "bert", "t5"], action="append",
                   help="only this model family's runs (repeatable; default all)")
    p.add_argument("--only", action="append", default=[], metavar="RUN", help="only this run (repeatable)")
    p.add_argument("--validation-outputs", metavar="DIR",
                   help="read the runs that are validation tests' jobs from those tests' outputs, DIR/<run>/identity.json "
                        "(and DIR/<run>/ck for generation; run_case.py --identity), instead of running them again "
                        "(CTest's identity_* tests: build/validation)")
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every job (default 1, as recorded)")
    p.add_argument("--slots", type=int, default=1,
                   help="cores for the jobs: runs whose ranks fit run side by side (default 1: one after another)")
    p.add_argument("--record-dir", default=RECORD_DIR)
    p.add_argument("--work", default="", help="keep the runs' files here (default: a temporary directory)")
    a = p.parse_args()
    a.build_dir = os.path.abspath(a.build_dir)
    a.sample = os.path.abspath(a.sample)
    todo = [c for c in cases() if (not a.family or c["family"] in a.family) and (not a.only or c["name"] in a.only)]
    unknown = set(a.only) - {c["name"] for c in cases()}
    if unknown:
        sys.exit(f"--only {sorted(unknown)[0]}: no such run (identity.py list)")
    if a.mode == "validation-jobs":  # for validation/CMakeLists.txt: name family generates
        for c in todo:
            if c["validation"]:
                print(c["name"], c["family"], int(c["generate"]))
        return 0
    if a.mode == "list":
        for c in todo:
            print(c["name"], c["np"], " ".join(c["set"]))
        return 0
    if a.mode == "selftest":
        return selftest(a)
    key = machine_key(a.build_dir)
    path = os.path.join(a.record_dir, key + ".json")
    record = {}
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    if a.mode == "check":
        missing = [c["name"] for c in todo if c["name"] not in record.get("runs", {})]
        if missing:
            others = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(a.record_dir, "*.json")))
            print(f"SKIP: no identity record for machine key {key} ({len(missing)} of {len(todo)} runs missing, e.g. "
                  f"{missing[0]}; records exist for: {', '.join(others) or 'none'}). To make one, check out a "
                  f"trusted commit (the one before your change), build it, and run: /usr/bin/python3 "
                  f"validation/identity.py record --build-dir {a.build_dir} --sample {a.sample}; then commit "
                  f"validation/identity/{key}.json (validation/README.md, \"identity.py: bitwise identity across refactors\")")
            return 77
    work = a.work or tempfile.mkdtemp(prefix="trident_identity_")
    failures, results = [], {}
    try:
        done = run_all(todo, a, work)
        for c in todo:
            got, source = done[c["name"]]
            results[c["name"]] = got
            n = sum(len(v) for v in got["checkpoints"].values())
            if a.mode == "check":
                lines = diff(c["name"], record["runs"][c["name"]], got)
                failures += lines
                print(f"{c['name']}: {'DIFFERS' if lines else 'identical'} ({len(got['metrics'])} steps, "
                      f"{len(got['checkpoints'])} checkpoints, {n} datasets; {source})", flush=True)
            else:
                print(f"{c['name']}: recorded ({len(got['metrics'])} steps, {len(got['checkpoints'])} "
                      f"checkpoints, {n} datasets)", flush=True)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    if a.mode == "record":
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                                text=True).stdout.strip()
        record.setdefault("runs", {}).update(results)
        record["machine_key"] = key
        record.setdefault("recorded_at", {}).update({n: commit for n in results})
        os.makedirs(a.record_dir, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
        print(f"wrote {path} ({len(results)} runs)")
        return 0
    for line in failures:
        print("FAIL:", line)
    print(f"{len(todo) - len({l.split(':')[0] for l in failures})} of {len(todo)} runs bitwise identical "
          f"to the record ({key})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
