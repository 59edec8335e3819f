#!/usr/bin/python3
"""Checkpoint save and load against the disk's own speed, in one run.

Two kinds of rows, per target directory (a tmpfs and a directory on the disk by default) and rank
count, each beside `dd`'s rate on the same directory (the same number of bytes written with
conv=fdatasync; and the checkpoint itself read right after each load with a cold page cache,
through the page cache, with O_DIRECT, and with O_DIRECT by two dd at once, the fastest of the
three taken as the disk's read rate). Each row loads --load-rounds times, each load followed by
dd's reads (medians, and each round's ratio), since this host's disk rates vary from one read to
the next:

  345M   pretrain_gpt trains a deck (GPT-2 345M at sequence 64 by default) for a few iterations
         with a checkpoint after each, synchronous and then asynchronous (checkpoint.async_save);
         this script reads each save's stall from the log ("saved checkpoint F in S s (training
         waited; ...)", "checkpoint of iteration N: training waited S s"), and the step time from
         the metrics file; the checkpoint is then loaded with a cold page cache ("loaded
         checkpoint F in S s").
  synth  bench_checkpoint_io (perf/bench_checkpoint_io.cpp) saves and loads a synthetic state of
         --synth-params parameters (12 bytes each: the model and two moments) without training,
         split over the ranks by tensor parallelism, so that a state larger than the 345M deck's
         fits this machine; its load checks every value.

Write GB/s is the checkpoint's bytes over the whole synchronous save (including the fsync of the
file, its directory and `latest`), read GB/s over the load (cold page cache: as root, sync and
drop_caches before it). The ratios to dd are the issue's measure (>= 0.7). The first save and the
first load of a process are shown apart from the steady state (345M: the median of the later
saves; synth: a second save, and a second load in the same process after dropping the page cache):
on a virtual machine whose host backs guest memory lazily, the first pass over memory a process has
not used before runs at a fraction of the memory's speed, and both a process's first save and its
load (into freshly allocated model and optimizer memory) pay for it (perf/results/checkpoint_*.md
shows it on the development host; a load reads with O_DIRECT, past the page cache). The save's
phases, the load's (open, read, verify, place)
and the peak resident memory per rank are printed too.

  /usr/bin/python3 perf/bench_checkpoint.py [--build build] [--deck inputs/gpt2_345m.ini] [--ranks 1,2]
      [--synth-ranks 1,2,4] [--synth-params 600000000] [--dirs tmpfs=/dev/shm/trident_ckbench,disk=build/perf/ckbench]
      [--iters 4] [--load-rounds 3] [--skip-345m] [--skip-synth] [--out FILE.md]
"""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def drop_caches():
    """Empties the page cache (root only); False when it cannot."""
    subprocess.run(["sync"])
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def dd_write(directory, nbytes):
    """dd's write rate (conv=fdatasync) of nbytes in directory, GB/s."""
    path = os.path.join(directory, "dd.bin")
    mib = max(1, nbytes // (1 << 20))
    t0 = time.time()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                   check=True, capture_output=True)
    w = mib * (1 << 20) / (time.time() - t0) / 1e9
    os.remove(path)
    return w


def dd_read(path):
    """dd's cold read rates of the file `path` (the checkpoint just loaded, so the same bytes at the
    same place on the disk), GB/s, each after dropping the page cache: through the page cache
    (bs=1M), with O_DIRECT (16 MiB requests, as the load's), and with O_DIRECT by two dd at once,
    each reading half of the file (two requests in flight, as the load's two reader threads);
    and whether the page cache could be dropped."""
    size = os.path.getsize(path)
    rates = {}
    cold = True
    block = 16 << 20
    blocks = (size + block - 1) // block
    half = (blocks + 1) // 2
    for name, cmds in (("cached", [["bs=1M"]]), ("direct", [["bs=16M", "iflag=direct"]]),
                       ("direct2", [["bs=16M", "iflag=direct", f"count={half}"],
                                    ["bs=16M", "iflag=direct", f"skip={half}"]])):
        cold = drop_caches() and cold
        t0 = time.time()
        ps = [subprocess.Popen(["dd", f"if={path}", "of=/dev/null"] + extra, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL) for extra in cmds]
        ok = all(q.wait() == 0 for q in ps)
        rates[name] = size / (time.time() - t0) / 1e9 if ok else float("nan")
    return rates, cold


def bytes_read(path, replicas):
    """the bytes all ranks of a load read from the file: the optimizer state once (its shards), the
    model once per data-parallel replica (each replica reads the whole model it holds)"""
    import h5py
    sizes = {"model": 0, "optimizer": 0}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            sizes["optimizer" if name.startswith("optimizer/") else "model"] += obj.size * obj.dtype.itemsize
    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return sizes["model"] * replicas + sizes["optimizer"]


def load_rounds(rounds, load_once, path):
    """`rounds` rounds of a cold load (load_once(): its seconds and its (open, read, verify, place))
    followed by dd's cold reads of the same file: the medians of each, and each round's ratio of
    the load's rate to the best of dd's rates in that round (medians and extremes, since this
    host's disk rates vary 2 to 3 x from one read to the next)."""
    size = os.path.getsize(path)
    loads, parts, dds, ratios, cold = [], [], [], [], True
    for _ in range(rounds):
        cold = drop_caches() and cold
        s, pt = load_once()
        d, c = dd_read(path)
        cold = cold and c
        loads.append(s)
        parts.append(pt)
        dds.append(d)
        best = max(v for v in d.values() if v == v)
        ratios.append(size / s / 1e9 / best)
    med = {k: statistics.median(d[k] for d in dds) for k in dds[0]}
    return dict(load=statistics.median(loads), loads=loads, load_parts=[statistics.median(c) for c in zip(*parts)],
                dd=med, ratios=ratios, cold=cold)


PHASES = ("copy", "create", "checksums", "write", "fsync", "publish")


def phases_of(text):
    """rank 0's phases of each synchronous save in a log"""
    pat = r"copy ([0-9.]+), create ([0-9.]+), checksums ([0-9.]+), write ([0-9.]+), fsync ([0-9.]+), publish ([0-9.]+)\)"
    return [[float(x) for x in g] for g in re.findall(pat, text)]


def run_345m(a, label, directory, np_):
    app = os.path.join(a.build, "apps", "pretrain_gpt")
    out = {}
    for mode in ("sync", "async"):
        ck = os.path.join(directory, f"ck_np{np_}_{mode}")
        shutil.rmtree(ck, ignore_errors=True)
        os.makedirs(directory, exist_ok=True)
        metrics = os.path.join(directory, f"m_np{np_}_{mode}.csv")
        if os.path.exists(metrics):
            os.remove(metrics)
        base = [a.mpiexec, "-n", str(np_), app, "--deck", a.deck, "--data.train_shards", a.shards,
                "--model.seq_length", str(a.seq), "--train.micro_batch_size", "1",
                "--train.global_batch_size", str(np_), "--eval.interval", "0", "--log.interval", "1",
                "--checkpoint.save", ck, "--checkpoint.interval", "1", "--watchdog.enable", "false",
                "--checkpoint.async_save", "true" if mode == "async" else "false"]
        p = subprocess.run(base + ["--train.iters", str(a.iters), "--log.metrics_file", metrics],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-2000:])
            sys.exit(f"training at np={np_} ({mode}) in {directory} failed")
        steps = [float(l.split(",")[7]) / 1e3 for l in open(metrics).read().splitlines()[1:]]
        files = sorted(glob.glob(os.path.join(ck, "iter_*", "checkpoint.h5")))
        size = os.path.getsize(files[-1])
        if mode == "sync":
            stalls = [float(x) for x in re.findall(r"saved checkpoint \S+ in ([0-9.]+) s \(training waited", p.stdout)]
            phases = phases_of(p.stdout)
            out.update(size=size, step=statistics.median(steps), first=stalls[0],
                       sync=statistics.median(stalls[1:] or stalls),
                       phases=[statistics.median(c) for c in zip(*(phases[1:] or phases))])

            def load_once():
                q = subprocess.run(base + ["--train.iters", str(a.iters), "--checkpoint.load", ck,
                                           "--log.metrics_file="], capture_output=True, text=True)
                m = re.search(r"loaded checkpoint \S+ in ([0-9.]+) s \(open ([0-9.]+), read ([0-9.]+), "
                              r"verify ([0-9.]+), place ([0-9.]+)\)", q.stdout)
                if q.returncode != 0 or not m:
                    print(q.stdout[-3000:], q.stderr[-2000:])
                    sys.exit(f"loading at np={np_} from {directory} failed")
                return float(m.group(1)), [float(m.group(k)) for k in (2, 3, 4, 5)]
            out.update(load_rounds(a.load_rounds, load_once, files[-1]), steady_load=float("nan"),
                       read_bytes=bytes_read(files[-1], np_))  # the deck's layout: dp = ranks
        else:
            # what training waits at each save: the copy and the file's creation; a save that waits for
            # the previous one (a save every iteration here) also waits for that one's writes
            begins = [float(x) for x in re.findall(r"checkpoint of iteration \d+: training waited ([0-9.]+) s", p.stdout)]
            waits = [float(x) for x in re.findall(r"wait ([0-9.]+), publish", p.stdout)]
            behind = [float(w) for w in re.findall(r"behind training: checksums [0-9.]+, write ([0-9.]+)", p.stdout)]
            out.update(async_stall=statistics.median(begins), async_wait=statistics.median(waits),
                       async_write=statistics.median(behind), async_step=statistics.median(steps))
        shutil.rmtree(ck, ignore_errors=True)
    return out


def synth_tool(a, np_, directory, mode, extra=()):
    """bench_checkpoint_io's lines (key=value figures), each a dict"""
    tool = os.path.join(a.build, "perf", "bench_checkpoint_io")
    cmd = [a.mpiexec, "-n", str(np_), tool, "--dir", directory, "--params", str(a.synth_params),
           "--hidden", str(a.synth_hidden), "--tp", str(np_), "--mode", mode] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-2000:])
        sys.exit(f"bench_checkpoint_io {mode} at np={np_} in {directory} failed")
    return [{k: float(v) for k, v in (kv.split("=") for kv in line.split())}
            for line in p.stdout.splitlines() if line.startswith(("save_s=", "load_s="))]


def run_synth(a, label, directory, np_):
    ck = os.path.join(directory, f"synth_np{np_}")
    shutil.rmtree(ck, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)
    saves = synth_tool(a, np_, ck, "save", ["--repeat", "2"])
    first_save, s = saves
    path = glob.glob(os.path.join(ck, "iter_*", "checkpoint.h5"))[-1]
    steady = []

    def load_once():
        # a process's first load, and a second one in the same process (memory it has used before)
        first, second = synth_tool(a, np_, ck, "load", ["--repeat", "2"])
        steady.append(second["load_s"])
        return first["load_s"], [first["open_s"], first["read_s"], first["verify_s"], first["place_s"]]
    out = dict(size=os.path.getsize(path), sync=s["save_s"], first=first_save["save_s"],
               phases=[s["copy_s"], s["create_s"], s["checksum_s"], s["write_s"], s["fsync_s"], s["publish_s"]],
               rss=s["peak_rss_mb_max"], step=float("nan"))
    out.update(load_rounds(a.load_rounds, load_once, path), read_bytes=bytes_read(path, 1))  # tp = ranks
    out["steady_load"] = statistics.median(steady)
    shutil.rmtree(ck, ignore_errors=True)
    if not a.no_async_synth:
        _, s2 = synth_tool(a, np_, ck, "save", ["--async", "--repeat", "2"])
        out.update(async_stall=s2["stall_s"], async_total=s2["save_s"], async_rss=s2["peak_rss_mb_max"])
        shutil.rmtree(ck, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--deck", default=os.path.join(ROOT, "inputs", "gpt2_345m.ini"))
    ap.add_argument("--shards", default=os.path.join(ROOT, "data", "sample", "kjv_gpt2_*.h5"))
    ap.add_argument("--ranks", default="1,2", help="rank counts of the 345M rows")
    ap.add_argument("--synth-ranks", default="1,2,4", help="rank counts of the synthetic rows")
    ap.add_argument("--synth-params", type=int, default=600000000)
    ap.add_argument("--synth-hidden", type=int, default=4096)
    ap.add_argument("--no-async-synth", action="store_true", help="no asynchronous synthetic saves (memory)")
    ap.add_argument("--dirs", default=f"tmpfs=/dev/shm/trident_ckbench,disk={os.path.join(ROOT, 'build', 'perf', 'ckbench')}")
    ap.add_argument("--synth-dirs", help="directories of the synthetic rows (default: --dirs)")
    ap.add_argument("--iters", type=int, default=4, help="iterations, a checkpoint after each")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--skip-345m", action="store_true")
    ap.add_argument("--skip-synth", action="store_true")
    ap.add_argument("--load-rounds", type=int, default=3,
                    help="cold loads per row, each followed by dd's cold reads of the same file (medians)")
    ap.add_argument("--out", help="write the tables (markdown) here too")
    a = ap.parse_args()
    rows = []
    work = []
    if not a.skip_345m:
        work += [("345M", spec, int(n)) for spec in a.dirs.split(",") for n in a.ranks.split(",")]
    if not a.skip_synth:
        work += [("synth", spec, int(n)) for spec in (a.synth_dirs or a.dirs).split(",")
                 for n in a.synth_ranks.split(",")]
    for kind, spec, np_ in work:
        label, directory = spec.split("=", 1)
        r = run_345m(a, label, directory, np_) if kind == "345M" else run_synth(a, label, directory, np_)
        dd_w = dd_write(directory, r["size"])
        dd = r["dd"]
        dd_r = max(v for v in dd.values() if v == v)
        r.update(kind=kind, label=label, np=np_, dd_w=dd_w, dd_r=dd_r, cache="cold" if r["cold"] else "warm")
        gb = r["size"] / 1e9
        rr = r["ratios"]
        print(f"{kind} {label} np={np_}: {gb:.2f} GB, first save {r['first']:.2f} s, save {r['sync']:.2f} s ({gb / r['sync']:.3f} GB/s = "
              f"{gb / r['sync'] / dd_w:.2f} x dd {dd_w:.3f}), async stall {r.get('async_stall', float('nan')):.2f} s, "
              f"loads {', '.join(f'{x:.2f}' for x in r['loads'])} s (median {gb / r['load']:.3f} GB/s = "
              f"{gb / r['load'] / dd_r:.2f} x dd read {dd_r:.3f}: page cache {dd['cached']:.3f}, O_DIRECT "
              f"{dd['direct']:.3f}, two O_DIRECT {dd['direct2']:.3f}; per round {', '.join(f'{x:.2f}' for x in rr)}; "
              f"the ranks read {r['read_bytes'] / 1e9:.2f} GB: {r['read_bytes'] / r['load'] / 1e9:.3f} GB/s = "
              f"{r['read_bytes'] / r['load'] / 1e9 / dd_r:.2f} x dd)",
              flush=True)
        rows.append(r)
    lines = [f"Loads: the median of {a.load_rounds} cold loads per row, each followed by dd's cold reads of the same "
             "file (medians; the best of the three taken as the disk's read rate). Per-round ratio: the load's rate "
             "over the best dd rate of the same round (median, min to max). GB the ranks read: the optimizer state "
             "once and the model once per data-parallel replica (345M rows: dp = ranks; synth rows: tp = ranks).", "",
             "| state | target | ranks | checkpoint GB | first save s | save s (steady) | write GB/s | dd write GB/s "
             "| ratio | async stall s | load s (first, median) | read GB/s | dd read GB/s (page cache / O_DIRECT / two "
             "O_DIRECT) | ratio | per-round ratio | GB the ranks read | their GB/s | ratio | load s (steady) | ratio "
             "| page cache at load |", "|" + "---|" * 21]
    for r in rows:
        gb = r["size"] / 1e9
        steady = r.get("steady_load", float("nan"))
        dd, rr = r["dd"], r["ratios"]
        lines.append(f"| {r['kind']} | {r['label']} | {r['np']} | {gb:.2f} | {r['first']:.2f} | {r['sync']:.2f} "
                     f"| {gb / r['sync']:.3f} | {r['dd_w']:.3f} | {gb / r['sync'] / r['dd_w']:.2f} "
                     f"| {r.get('async_stall', float('nan')):.2f} | {r['load']:.2f} | {gb / r['load']:.3f} "
                     f"| {r['dd_r']:.3f} ({dd['cached']:.3f} / {dd['direct']:.3f} / {dd['direct2']:.3f}) "
                     f"| {gb / r['load'] / r['dd_r']:.2f} | {statistics.median(rr):.2f} ({min(rr):.2f}-{max(rr):.2f}) "
                     f"| {r['read_bytes'] / 1e9:.2f} | {r['read_bytes'] / r['load'] / 1e9:.3f} "
                     f"| {r['read_bytes'] / r['load'] / 1e9 / r['dd_r']:.2f} "
                     f"| {steady:.2f} | {gb / steady / r['dd_r']:.2f} | {r['cache']} |")
    lines += ["", "Where the time goes (rank 0, seconds): a synchronous save (345M: median over the saves after the "
              "first; synth: the second save) and the first load (medians):", "",
              "| state | target | ranks | " + " | ".join(PHASES) + " | load: open | read | verify | place |",
              "|" + "---|" * (7 + len(PHASES))]
    for r in rows:
        lines.append(f"| {r['kind']} | {r['label']} | {r['np']} | " + " | ".join(f"{x:.2f}" for x in r["phases"])
                     + " | " + " | ".join(f"{x:.2f}" for x in r["load_parts"]) + " |")
    m345 = [r for r in rows if r["kind"] == "345M"]
    if m345:
        lines += ["", "345M asynchronous saves (a save every iteration, median): what training waited at the save "
                  "(copy, create), what a save waited for the previous one's writes, and those writes' time:", "",
                  "| target | ranks | step s | async stall s | wait for the previous save s | background write s |",
                  "|" + "---|" * 6]
        for r in m345:
            lines.append(f"| {r['label']} | {r['np']} | {r['async_step']:.2f} | {r['async_stall']:.2f} "
                         f"| {r['async_wait']:.2f} | {r['async_write']:.2f} |")
    synth = [r for r in rows if r["kind"] == "synth"]
    if synth:
        lines += ["", "Synthetic state: peak resident memory of the largest rank (MiB) and the asynchronous save:", "",
                  "| target | ranks | peak RSS sync | peak RSS async | async stall s | async total s |", "|" + "---|" * 6]
        for r in synth:
            lines.append(f"| {r['label']} | {r['np']} | {r['rss']:.0f} | {r.get('async_rss', float('nan')):.0f} "
                         f"| {r.get('async_stall', float('nan')):.2f} | {r.get('async_total', float('nan')):.2f} |")
    table = "\n".join(lines)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
