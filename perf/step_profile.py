#!/usr/bin/env python3
"""The device path's structure per training step: kernel launches, library calls and blocking waits.

Runs pretrain_gpt of a build configured with -DTRIDENT_DEVICE_KERNELS_ON_HOST=ON (the kernels'
device layouts on the host, so that the kernels counted are the ones a CUDA build launches) under
the Kokkos Tools library perf/kernel_timer.cpp, and prints one JSON object:

  launches_per_step       kernels (parallel_for / reduce / scan) and deep copies of one training step
  launches_per_layer      of them, those of one transformer layer (forward and backward) per
                          micro-batch
  library_calls_per_step  GEMM and attention-library calls (the ops::gemm* profiling regions: one
                          cuBLAS call each in a CUDA build)
  waits_per_step          blocking host-device waits: TRIDENT_DEVICE_WAIT() (common/device_wait.hpp)
                          and every Kokkos::deep_copy without an execution space (it fences)
  waits_by_site           the waits of one step by source line
  allocations_per_step    View allocations inside a step (each a cudaMalloc on a GPU, which
                          waits for the device and defeats CUDA graphs)
  launches_by_kernel      the launches of one step by kernel name

Counts do not depend on the widths of the model (hidden size, sequence length), only on its
structure (layers, micro-batch size, heads, precision, attention and MLP kinds, dropout), so the
deck's widths are shrunk to run in seconds on a CPU: hidden = heads x 16, sequence 64, the GPT-2
vocabulary of the sample shards. A step is
--micro-batches micro-batches (default 2, so that what happens once per micro-batch shows apart
from what happens once per step), on one rank. Each count is a difference of runs,
(4 iterations - 2 iterations) / 2 for a step and the same at one layer fewer for a layer, so the
set-up, the first step's allocations and the end of the run cancel out.

Not counted (docs/DESIGN.md "Waiting for the device"): copies to host memory and reductions into
host scalars, which a host build does not see as waits.

  perf/step_profile.py --build-dir build/device-on-host [--deck inputs/gpt2_124m.ini]
                       [--micro-batch 16] [--micro-batches 2] [--layers N] [--dtype bf16]
                       [--set KEY VALUE ...]
                       [--max-launches-per-layer N] [--max-waits-per-step N] [--out FILE]

Exit status 0, or 1 when a --max-* budget is exceeded or a run fails; 2 for a build without
TRIDENT_DEVICE_KERNELS_ON_HOST.
"""
import argparse
import configparser
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD_DIM = 16
SEQ = 64


def deck_value(deck, section, key, default=None):
    cp = configparser.ConfigParser(inline_comment_prefixes=("#",))
    cp.read(deck)
    return cp.get(section, key, fallback=default)


def run_counts(a, work, layers, iters):
    """One run's counts: launches by kernel, GEMM-region calls, waits by site."""
    heads = int(deck_value(a.deck, "model", "num_heads"))
    hidden = heads * HEAD_DIM
    ffn = deck_value(a.deck, "model", "ffn_hidden_size")
    big_hidden = int(deck_value(a.deck, "model", "hidden_size"))
    ffn_small = (int(ffn) * hidden // big_hidden) // 16 * 16 if ffn else 4 * hidden
    name = f"L{layers}_i{iters}"
    d = os.path.join(work, name)
    os.makedirs(d)
    out_json = os.path.join(d, "timer.json")
    cmd = [a.app, "--deck", a.deck, "--data.train_shards", a.shards,
           "--model.num_layers", str(layers), "--model.hidden_size", str(hidden),
           "--model.ffn_hidden_size", str(ffn_small), "--model.kv_channels", str(HEAD_DIM),
           "--model.seq_length", str(SEQ), "--model.max_position_embeddings", str(max(SEQ, 64)),
           "--train.micro_batch_size", str(a.micro_batch),
           "--train.global_batch_size", str(a.micro_batch * a.micro_batches),
           "--train.iters", str(iters), "--eval.interval", "0", "--checkpoint.save", "",
           "--checkpoint.load", "", "--log.metrics_file", "", "--log.interval", "1",
           "--parallel.tp", "1", "--parallel.pp", "1", "--parallel.sequence_parallel", "false",
           "--precision.dtype", a.dtype, "--model.vocab_size", "50257"]
    for k, v in a.set:
        cmd += ["--" + k, v]
    env = dict(os.environ, KOKKOS_PROFILE_LIBRARY=a.timer_lib, TRIDENT_KERNEL_TIMER_OUT=out_json,
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with open(os.path.join(d, "out.txt"), "w") as log:
        rc = subprocess.run(cmd, cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900).returncode
    if rc != 0:
        with open(os.path.join(d, "out.txt")) as f:
            sys.stderr.write(f.read()[-4000:])
        raise SystemExit(f"step_profile: {' '.join(cmd)} exited {rc}")
    with open(out_json) as f:
        rep = json.load(f)
    launches = {}
    for k in rep["kernels"]:
        launches[k["name"]] = launches.get(k["name"], 0) + k["calls"]
    library = sum(r["calls"] for r in rep["regions"] if re.match(r"ops::(gemm|sdpa|attention_library)", r["name"]))
    events = {e["name"]: e["calls"] for e in rep.get("events", [])}
    waits = {k.split(" ", 1)[1]: v for k, v in events.items() if k.startswith("trident::wait ")}
    # every copy or fill Kokkos Tools saw, less those queued on the execution space (device_copy),
    # is a plain Kokkos::deep_copy: a wait on a device
    copies = sum(k["calls"] for k in rep["kernels"] if k["type"] == "copy")
    blocking = copies - events.get("trident::device_copy", 0)
    if blocking:
        waits["Kokkos::deep_copy without an execution space"] = blocking
    allocations = {k.split(" ", 1)[1]: v for k, v in events.items() if k.startswith("allocate ")}
    return launches, library, waits, allocations


def per_step(hi, lo, steps):
    """(hi - lo) / steps for dicts of counts, keeping non-zero entries."""
    keys = set(hi) | set(lo)
    out = {k: (hi.get(k, 0) - lo.get(k, 0)) / steps for k in keys}
    return {k: v for k, v in out.items() if v}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", required=True, help="a build with TRIDENT_DEVICE_KERNELS_ON_HOST=ON")
    p.add_argument("--deck", default=os.path.join(ROOT, "inputs", "gpt2_124m.ini"))
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--micro-batches", type=int, default=2, help="micro-batches per step (gradient accumulation)")
    p.add_argument("--layers", type=int, help="layers (default: the deck's; per-layer and per-step waits do not "
                   "depend on it, launches per step do)")
    p.add_argument("--set", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                   help="a deck setting, e.g. --set model.flash_attention true")
    p.add_argument("--shards", default=os.path.join(ROOT, "data", "sample", "kjv_gpt2_*.h5"))
    p.add_argument("--max-launches-per-layer", type=float)
    p.add_argument("--max-waits-per-step", type=float)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--work", help="run directory (default: a temporary one, removed)")
    a = p.parse_args()
    build = os.path.abspath(a.build_dir)
    cache = os.path.join(build, "CMakeCache.txt")
    if not os.path.exists(cache) or "TRIDENT_DEVICE_KERNELS_ON_HOST:BOOL=ON" not in open(cache).read():
        print(f"step_profile: {build} is not a build with -DTRIDENT_DEVICE_KERNELS_ON_HOST=ON: its host "
              "layouts are not the kernels a GPU launches", file=sys.stderr)
        return 2
    a.app = os.path.join(build, "apps", "pretrain_gpt")
    libs = glob.glob(os.path.join(build, "perf", "libtrident_kernel_timer.so"))
    if not os.path.exists(a.app) or not libs:
        print(f"step_profile: build pretrain_gpt and trident_kernel_timer in {build} first", file=sys.stderr)
        return 2
    a.timer_lib = libs[0]
    a.deck = os.path.abspath(a.deck)
    work = a.work or tempfile.mkdtemp(prefix="step_profile_")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        layers = a.layers or int(deck_value(a.deck, "model", "num_layers"))
        runs = {(l, i): run_counts(a, work, l, i) for l in (layers, layers - 1) for i in (2, 4)}
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    steps = 2

    def step(l):
        (hl, hlib, hw, ha), (ll, llib, lw, la) = runs[(l, 4)], runs[(l, 2)]
        return per_step(hl, ll, steps), (hlib - llib) / steps, per_step(hw, lw, steps), per_step(ha, la, steps)

    launches, library, waits, allocations = step(layers)
    launches1, library1, waits1, _ = step(layers - 1)
    total = sum(launches.values())
    result = {
        "deck": os.path.relpath(a.deck, ROOT),
        "shape": {"num_layers": layers, "micro_batch_size": a.micro_batch, "micro_batches_per_step": a.micro_batches,
                  "dtype": a.dtype,
                  "settings": {k: v for k, v in a.set}, "note": f"widths shrunk: head dim {HEAD_DIM}, sequence {SEQ}"},
        "launches_per_step": total,
        "launches_per_layer": (total - sum(launches1.values())) / a.micro_batches,
        "library_calls_per_step": library,
        "library_calls_per_layer": (library - library1) / a.micro_batches,
        "waits_per_step": sum(waits.values()),
        "waits_per_layer": (sum(waits.values()) - sum(waits1.values())) / a.micro_batches,
        "allocations_per_step": sum(allocations.values()),
        "waits_by_site": dict(sorted(waits.items(), key=lambda kv: -kv[1])),
        "allocations_by_label": dict(sorted(allocations.items(), key=lambda kv: -kv[1])),
        "launches_by_kernel": dict(sorted(launches.items(), key=lambda kv: -kv[1])),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    over = []
    if a.max_launches_per_layer is not None and result["launches_per_layer"] > a.max_launches_per_layer:
        over.append(f"launches_per_layer {result['launches_per_layer']:g} > {a.max_launches_per_layer:g}")
    if a.max_waits_per_step is not None and result["waits_per_step"] > a.max_waits_per_step:
        over.append(f"waits_per_step {result['waits_per_step']:g} > {a.max_waits_per_step:g}")
    for o in over:
        print(f"step_profile: over budget: {o}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
