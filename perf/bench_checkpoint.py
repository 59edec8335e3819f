#!/usr/bin/python3
"""Checkpoint save and load against the disk's own speed, in one run: for each target directory
(a tmpfs and a directory on the disk by default) and each rank count, pretrain_gpt trains a deck
(GPT-2 345M at sequence 64 by default) for a few iterations with a checkpoint after each, and
this script reads each save's stall from the log ("saved checkpoint F in S s (training waited; its phases)")
and the file's size; then the same checkpoint is loaded with a cold page cache (as root: sync and
drop_caches before the load; "loaded checkpoint F in S s"). `dd` writes the same number of bytes
to the same directory with conv=fdatasync, and reads them back cold, as the disk's own rate.
Prints, per directory and rank count: checkpoint GB, step time, save stall (median over the saves),
write GB/s and its ratio to dd's, load time, read GB/s and its ratio to dd's read.

  /usr/bin/python3 perf/bench_checkpoint.py [--build build] [--deck inputs/gpt2_345m.ini] [--ranks 1,2]
      [--dirs tmpfs=/dev/shm/trident_ckbench,disk=build/perf/ckbench] [--iters 3] [--out FILE.md]
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


def dd_rates(directory, nbytes):
    """dd's write rate (conv=fdatasync) and cold read rate of nbytes in directory, GB/s."""
    path = os.path.join(directory, "dd.bin")
    mib = max(1, nbytes // (1 << 20))
    t0 = time.time()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                   check=True, capture_output=True)
    w = mib * (1 << 20) / (time.time() - t0) / 1e9
    cold = drop_caches()
    t0 = time.time()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
    r = mib * (1 << 20) / (time.time() - t0) / 1e9
    os.remove(path)
    return w, r, cold


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--deck", default=os.path.join(ROOT, "inputs", "gpt2_345m.ini"))
    ap.add_argument("--shards", default=os.path.join(ROOT, "data", "sample", "kjv_gpt2_*.h5"))
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--dirs", default=f"tmpfs=/dev/shm/trident_ckbench,disk={os.path.join(ROOT, 'build', 'perf', 'ckbench')}")
    ap.add_argument("--iters", type=int, default=3, help="iterations, a checkpoint after each")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--out", help="write the table (markdown) here too")
    a = ap.parse_args()
    app = os.path.join(a.build, "apps", "pretrain_gpt")
    rows = []
    for spec in a.dirs.split(","):
        label, directory = spec.split("=", 1)
        for np_ in [int(x) for x in a.ranks.split(",")]:
            ck = os.path.join(directory, f"ck_np{np_}")
            shutil.rmtree(ck, ignore_errors=True)
            os.makedirs(directory, exist_ok=True)
            metrics = os.path.join(directory, f"m_np{np_}.csv")
            if os.path.exists(metrics):
                os.remove(metrics)
            base = [a.mpiexec, "-n", str(np_), app, "--deck", a.deck, "--data.train_shards", a.shards,
                    "--model.seq_length", str(a.seq), "--train.micro_batch_size", "1",
                    "--train.global_batch_size", str(np_), "--eval.interval", "0", "--log.interval", "1",
                    "--checkpoint.save", ck, "--checkpoint.interval", "1", "--watchdog.enable", "false"]
            p = subprocess.run(base + ["--train.iters", str(a.iters), "--log.metrics_file", metrics],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print(p.stdout[-3000:], p.stderr[-2000:])
                sys.exit(f"training at np={np_} in {directory} failed")
            stalls = [float(x) for x in re.findall(r"saved checkpoint \S+ in ([0-9.]+) s", p.stdout)]
            phases = [[float(x) for x in g] for g in re.findall(
                r"copy ([0-9.]+), gather ([0-9.]+), finiteness ([0-9.]+), checksums ([0-9.]+), write ([0-9.]+), "
                r"fsync ([0-9.]+), publish ([0-9.]+)\)", p.stdout)]
            breakdown = [statistics.median(col) for col in zip(*phases)] if phases else [float("nan")] * 7
            steps = [float(l.split(",")[7]) / 1e3 for l in open(metrics).read().splitlines()[1:]]
            files = sorted(glob.glob(os.path.join(ck, "iter_*", "checkpoint.h5")))
            size = os.path.getsize(files[-1])
            cold = drop_caches()
            q = subprocess.run(base + ["--train.iters", str(a.iters), "--checkpoint.load", ck, "--log.metrics_file="],
                               capture_output=True, text=True)
            m = re.search(r"loaded checkpoint \S+ in ([0-9.]+) s", q.stdout)
            if q.returncode != 0 or not m:
                print(q.stdout[-3000:], q.stderr[-2000:])
                sys.exit(f"loading at np={np_} from {directory} failed")
            load = float(m.group(1))
            shutil.rmtree(ck, ignore_errors=True)
            dd_w, dd_r, dd_cold = dd_rates(directory, size)
            save = statistics.median(stalls)
            rows.append((label, np_, size / 1e9, statistics.median(steps), save, size / save / 1e9, dd_w,
                         size / save / 1e9 / dd_w, load, size / load / 1e9, dd_r, size / load / 1e9 / dd_r,
                         "cold" if cold and dd_cold else "warm", breakdown))
            print(f"{label} np={np_}: {size / 1e9:.2f} GB, step {statistics.median(steps):.2f} s, save stall "
                  f"{save:.2f} s ({size / save / 1e9:.3f} GB/s = {size / save / 1e9 / dd_w:.2f} x dd {dd_w:.3f}), load "
                  f"{load:.2f} s ({size / load / 1e9:.3f} GB/s = {size / load / 1e9 / dd_r:.2f} x dd read {dd_r:.3f})",
                  flush=True)
    head = ("| target | ranks | checkpoint GB | step s | save stall s (median) | write GB/s | dd write GB/s | ratio "
            "| load s | read GB/s | dd read GB/s | ratio | page cache at load |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.3f} | {r[6]:.3f} | {r[7]:.2f} "
                     f"| {r[8]:.2f} | {r[9]:.3f} | {r[10]:.3f} | {r[11]:.2f} | {r[12]} |")
    lines += ["", "Where the save's time goes (rank 0, seconds, median over the saves):", "",
              "| target | ranks | copy | gather | finiteness | checksums | create + write + close | fsync | publish |",
              "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | " + " | ".join(f"{x:.2f}" for x in r[13]) + " |")
    table = "\n".join(lines)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
