#!/usr/bin/python3
"""Peak memory of convert_checkpoint on a model of Llama 3 8B's real tensor shapes (issue 39).

validation/hf_llama.py writes a 2-layer model with Llama 3 8B's shapes (vocabulary 128256 x hidden 4096,
32 query heads in 8 key/value groups of 128, SwiGLU 14336, untied lm_head) as random bf16 weights in two
Hugging Face shards (about 3 GB); convert_checkpoint imports it (a 6 GB fp32 checkpoint) and exports it
back as bf16 shards. A sampler thread reads the converter's RssAnon (/proc/<pid>/status, every 2 ms:
anonymous memory only; the memory-mapped safetensors pages are file pages and do not count) and keeps
the peak. The bound: 1.5 x the largest tensor in fp32 (the 128256 x 4096 embedding, 2.1 GB) plus a fixed
256 MiB (the issue's bound), and what the converter claims, the memory of its parts: at most 384 MiB. The export
must give back the imported directory's tensors byte for byte.

usage: hf_convert_memory.py --build BUILD --work DIR [--report FILE] [--keep]
Exit: 0 within both bounds, 1 over it or wrong bytes, 77 (skipped) with less than 14 GB free in --work.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPE = dict(layers=2, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, max_pos=8192)
LARGEST_FP32 = SHAPE["vocab"] * SHAPE["hidden"] * 4
FIXED = 256 * 2**20
BOUND = int(1.5 * LARGEST_FP32 + FIXED)
# what hf_convert.hpp claims: the memory of the parts it converts (2^24 values, 64 MiB in fp32, a few
# at a time) over the program's own (MPI, Kokkos, HDF5)
PARTS = 384 * 2**20
CMP_BYTES = 1 << 26  # the export is compared with the input in parts of 64 MiB
NEEDED = 14e9  # the bf16 input (3.0 GB), the fp32 checkpoint (6.0 GB) and the bf16 export (3.0 GB), and room


def rss_anon(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def run_sampled(cmd):
    """Runs cmd; returns (exit status, output, wall seconds, peak RssAnon in bytes)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = [0]

    def sample():
        while p.poll() is None:
            v = rss_anon(p.pid)
            if v:
                peak[0] = max(peak[0], v)
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    out, _ = p.communicate()
    t.join()
    return p.returncode, out, time.time() - t0, peak[0]


def tensor_index(d):
    """{name: (dtype, shape, bytes, shard path, offset of the bytes)} of a Hugging Face directory's shards."""
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    out = {}
    for f in sorted(set(index["weight_map"].values())):
        path = os.path.join(d, f)
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, e in header.items():
            if name != "__metadata__":
                b, end = e["data_offsets"]
                out[name] = (e["dtype"], e["shape"], end - b, path, 8 + n + b)
    return out


def same_tensors(a, b):
    """(tensors in directory b, whether a and b hold the same tensors: names, dtypes, shapes and bytes).
    The bytes are compared directly, in parts read into two arrays kept for the whole comparison: new
    memory for each part (f.read) costs, in page faults, several times the reading and comparing."""
    ta, tb = tensor_index(a), tensor_index(b)
    if {k: v[:3] for k, v in ta.items()} != {k: v[:3] for k, v in tb.items()}:
        return len(tb), False
    bufs = bytearray(CMP_BYTES), bytearray(CMP_BYTES)
    views = [memoryview(x) for x in bufs]
    files = {}
    try:
        for name, (_, _, n, path_a, at_a) in sorted(ta.items(), key=lambda kv: kv[1][3:]):
            at_b, path_b = tb[name][4], tb[name][3]
            while n:
                k = min(n, CMP_BYTES)
                for view, path, at in ((views[0], path_a, at_a), (views[1], path_b, at_b)):
                    fh = files.get(path) or files.setdefault(path, open(path, "rb"))
                    fh.seek(at)
                    if fh.readinto(view[:k]) != k:
                        return len(tb), False
                # both arrays get the same number of bytes at the same places, and this stops at the first
                # difference: past the k bytes just read they are equal, so the whole arrays compare as those
                if bufs[0] != bufs[1]:
                    return len(tb), False
                n, at_a, at_b = n - k, at_a + k, at_b + k
    finally:
        for fh in files.values():
            fh.close()
    return len(tb), True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--report")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--spare-gb", type=float, default=0.0,
                    help="GB that must stay free beside the conversion's own (the CTest: the tests running beside it)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    free = shutil.disk_usage(a.work).free
    if free < NEEDED + a.spare_gb * 1e9:
        print(f"skipped: {free / 1e9:.1f} GB free in {a.work}, the conversion of an 8B-shaped model needs "
              f"{NEEDED / 1e9:.0f} GB" + (f" and {a.spare_gb:.0f} GB must stay free for the rest" if a.spare_gb else ""))
        return 77
    src, ck, exp = (os.path.join(a.work, x) for x in ("hf_8b_shapes", "imported", "exported"))
    for d in (src, ck, exp):
        shutil.rmtree(d, ignore_errors=True)
    conv = os.path.join(a.build, "apps", "convert_checkpoint")
    rows = []
    try:
        t0 = time.time()
        subprocess.run([sys.executable, os.path.join(ROOT, "validation", "hf_llama.py"), "write", "--family", "llama",
                        "--out", src, "--seed", "1", "--layers", str(SHAPE["layers"]), "--hidden", str(SHAPE["hidden"]),
                        "--heads", str(SHAPE["heads"]), "--kv-heads", str(SHAPE["kv_heads"]), "--ffn", str(SHAPE["ffn"]),
                        "--vocab", str(SHAPE["vocab"]), "--max-pos", str(SHAPE["max_pos"]), "--rope-theta", "500000",
                        "--rope-scaling", "llama3:8,1,4,8192", "--dtype", "bf16", "--shard-size", "2000000000"],
                       check=True)
        written = time.time() - t0
        bytes_in = sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src))
        for what, cmd in (("import (bf16 shards -> fp32 checkpoint)",
                           [conv, "--to", "trident", "--input", src, "--output", ck]),
                          ("export (fp32 checkpoint -> bf16 shards of 2 GB)",
                           [conv, "--to", "hf", "--input", ck, "--output", exp, "--dtype", "bf16",
                            "--max-shard-size", "2GB"])):
            rc, out, wall, peak = run_sampled(cmd)
            if rc != 0:
                print(out)
                return 1
            rows.append((what, wall, peak))
            print(f"{what}: {wall:.1f} s, peak RssAnon {peak / 2**20:.0f} MiB (bound {BOUND / 2**20:.0f} MiB)")
        count, same = same_tensors(src, exp)
        print(f"export == imported directory: {count} tensors, byte for byte: {same}")
        ok = same and all(peak <= min(BOUND, PARTS) for _, _, peak in rows)
        ck_bytes = os.path.getsize(os.path.join(ck, "iter_0000000", "checkpoint.h5"))
        lines = [
            f"# convert_checkpoint's peak memory on Llama 3 8B's tensor shapes, {time.strftime('%Y-%m-%d')}",
            "",
            f"Command: `/usr/bin/python3 perf/hf_convert_memory.py --build {a.build} --work {a.work}` "
            f"(CTest `hf_memory`). Machine: {os.uname().nodename}, {os.cpu_count()} cores.",
            "",
            f"Model: validation/hf_llama.py, 2 layers of Llama 3 8B's shapes ({SHAPE}), random bf16 weights in "
            f"two shards, {bytes_in / 1e9:.2f} GB, written in {written:.1f} s. The checkpoint: "
            f"{ck_bytes / 1e9:.2f} GB (fp32). Largest tensor: the {SHAPE['vocab']} x {SHAPE['hidden']} embedding "
            f"(and lm_head), {LARGEST_FP32 / 2**20:.0f} MiB in fp32. Bound: 1.5 x that + 256 MiB = "
            f"{BOUND / 2**20:.0f} MiB of RssAnon (anonymous memory; the mapped safetensors pages are file pages); "
            f"the converter's own claim, parts of 2^24 values: {PARTS / 2**20:.0f} MiB.",
            "",
            "| conversion | wall s | peak RssAnon MiB | of the largest tensor (fp32) | within the bound |",
            "|---|---|---|---|---|",
        ]
        for what, wall, peak in rows:
            lines.append(f"| {what} | {wall:.1f} | {peak / 2**20:.0f} | {peak / LARGEST_FP32:.3f} | "
                         f"{'yes' if peak <= min(BOUND, PARTS) else 'NO'} |")
        lines += ["", f"The export holds the imported directory's {count} tensors byte for byte: {same}."]
        text = "\n".join(lines) + "\n"
        print(text)
        if a.report:
            open(a.report, "w").write(text)
        return 0 if ok else 1
    finally:
        if not a.keep:
            for d in (src, ck, exp):
                shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
