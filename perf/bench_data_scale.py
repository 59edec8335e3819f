#!/usr/bin/env python3
"""The data path at The Pile's scale (issue: "The Pile at full scale"): a synthetic corpus
generated to disk at 1 M, 10 M and (with --sizes) 100 M documents, then for each size

  loader    bench_loader (the GPT data path alone): the time to build or load the indices, the
            per-process memory (private RssAnon, file-backed RssFile) and the sample rate, with
            the index cache cold (built and written), warm (mapped) and off (data.index_cache
            none: every rank builds it in its heap, as before the cache existed)
  startup   pretrain_gpt at np ranks on a tiny model: seconds from launch to the first metrics
            row and each rank's peak private memory, warm cache against no cache, in the same run

and, with --preprocess-mb, preprocess_data on a .jsonl.zst corpus of that size (Debian's
/usr/share/doc text repeated): tokens/s per rank and the hours The Pile would take at 64 ranks.
Prints a Markdown report (also written to --out) with ratios and the projection to The Pile
(210 M documents, 300 B GPT-2 tokens).

The synthetic corpus: GPT-2 vocabulary, document lengths uniform in [8, 88] tokens plus an EOD
(mean 48: 100 M documents are 9.6 GB), tokens from a Zipf law (s = 1.1) drawn once as a 16 M
token block that the shards repeat; 10 M documents per shard, written with h5py in the token
shard format. Corpora are kept in --work for later runs (--regenerate to remake them).

usage: bench_data_scale.py --build-dir build [--sizes 1e6,1e7] [--np 2] [--preprocess-mb 1024]
"""
import argparse
import datetime
import glob
import gzip
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PILE_DOCS = 210e6
PILE_TOKENS = 300e9
NEEDED_TOKENS_PER_S = 1.6e9 / 3600  # a 1.3B model's training rate on one GPU (issue)


def generate(prefix, n_docs, seed=1):
    """Writes <prefix>_NNNNN.h5 shards of n_docs documents; returns the token count."""
    import h5py
    rng = np.random.default_rng(seed)
    vocab, eod = 50257, 50256
    ranks = np.arange(1, eod + 1, dtype=np.float64)
    cdf = np.cumsum(ranks ** -1.1)
    cdf /= cdf[-1]
    block = np.searchsorted(cdf, rng.random(1 << 24)).astype(np.uint16)
    per_shard = 10_000_000
    total = 0
    for k, first in enumerate(range(0, n_docs, per_shard)):
        n = min(per_shard, n_docs - first)
        lengths = rng.integers(8, 89, size=n, dtype=np.int64) + 1  # + EOD
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        n_tok = int(offsets[-1])
        path = "%s_%05d.h5" % (prefix, k)
        pair = "%s_pair_%05d_text_document" % (prefix, k)  # the same documents as a Megatron pair
        binf = open(pair + ".bin", "wb")
        with h5py.File(path + ".tmp", "w") as f:
            ds = f.create_dataset("tokens", shape=(n_tok,), dtype="<u2", chunks=(16384,), fletcher32=True)
            step = 1 << 26
            ends = offsets[1:] - 1  # the EOD of each document
            for a in range(0, n_tok, step):
                b = min(n_tok, a + step)
                chunk = block[(np.arange(a, b, dtype=np.int64) + k * 7919) % block.size]
                lo, hi = np.searchsorted(ends, [a, b])
                chunk[ends[lo:hi] - a] = eod
                ds[a:b] = chunk
                binf.write(chunk.astype("<u2").tobytes())
            f.create_dataset("document_offsets", data=offsets)
            for key, val in (("format", "trident.tokens"), ("tokenizer", "GPT2BPETokenizer")):
                f.attrs.create(key, np.bytes_(val))
            f.attrs["format_version"] = np.int64(2)
            f.attrs["vocab_size"] = np.int64(vocab)
            f.attrs["eod_id"] = np.int64(eod)
            f.attrs["max_token_id"] = np.int64(eod)
        os.replace(path + ".tmp", path)
        binf.close()
        with open(pair + ".idx", "wb") as f:
            f.write(b"MMIDIDX\x00\x00" + np.array([1], "<u8").tobytes() + bytes([8]) +
                    np.array([n, n + 1], "<u8").tobytes())
            f.write(lengths.astype("<i4").tobytes())
            f.write((offsets[:-1] * 2).astype("<i8").tobytes())
            f.write(np.arange(n + 1, dtype="<i8").tobytes())
        total += n_tok
    return total


def status_of(pid):
    out = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024.0
    except OSError:
        pass
    return out


def loader(a, spec, cache, train_samples, seq):
    cmd = [os.path.join(a.build_dir, "perf", "bench_loader"), "--shards", spec, "--seq-length", str(seq),
           "--train-samples", str(train_samples), "--read", str(a.read), "--index-cache", cache]
    if "_pair_" in spec:  # a Megatron pair records no tokenizer (loading it is part of build_s)
        cmd += ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(a.sample, "gpt2", "encoder.json"),
                "--merge-file", os.path.join(a.sample, "gpt2", "vocab.bpe")]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"bench_loader failed: {p.stderr}")
    first = p.stdout.splitlines()[0]
    r = {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", first)}
    r["wall_s"] = time.time() - t0
    m = re.search(r"index: train ([^;\n]*)", p.stdout)
    r["origin"] = m.group(1).split(" /")[0].split(" in /")[0] if m else "?"
    return r


def startup(a, spec, cache, work, seq):
    """pretrain_gpt at a.np ranks, 2 iterations: seconds to the first metrics row, peak private
    memory per rank (MB), polled from /proc."""
    metrics = os.path.join(work, f"startup_{cache.replace('/', '_')}_{time.time_ns()}.csv")
    cmd = ["mpiexec", "-n", str(a.np), os.path.join(a.build_dir, "apps", "pretrain_gpt"), "--deck",
           os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"), "--data.train_shards", spec, "--data.index_cache", cache,
           "--model.seq_length", str(seq), "--model.max_position_embeddings", str(seq), "--train.iters", "3",
           "--train.micro_batch_size", "1", "--train.global_batch_size", str(a.np), "--eval.interval", "0",
           "--log.metrics_file", metrics]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_row, peak = None, {}
    while p.poll() is None:
        pids = subprocess.run(["pgrep", "-f", metrics], capture_output=True, text=True).stdout.split()
        for pid in pids:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read() if os.path.exists(f"/proc/{pid}/cmdline") else b""
            if b"pretrain_gpt" not in cmdline or b"mpiexec" in cmdline.split(b"\0")[0]:
                continue
            st = status_of(pid)
            if st:
                peak[pid] = max(peak.get(pid, 0.0), st.get("RssAnon", 0.0))
        if first_row is None and os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 2:
            first_row = time.time() - t0
        time.sleep(0.05)
    out = p.stdout.read()
    if p.returncode != 0:
        raise SystemExit(f"pretrain_gpt failed:\n{out[-3000:]}")
    if first_row is None:
        first_row = time.time() - t0
    m = re.search(r"index: train ([^;\n]*)", out)
    return {"first_row_s": first_row, "peak_anon_mb": max(peak.values()) if peak else float("nan"),
            "origin": m.group(1) if m else "?"}


def preprocess_rate(a, work):
    """preprocess_data on a .jsonl.zst of about a.preprocess_mb MB: tokens/s per rank."""
    src = os.path.join(work, "doc_corpus.jsonl")
    docs = []
    for path in sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
        if not os.path.isfile(path):
            continue
        try:
            raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError):
            continue
        if text.strip():
            docs.append(json.dumps({"text": text}))
    unique = "\n".join(docs) + "\n"
    copies = max(1, int(a.preprocess_mb * 1e6 / max(len(unique), 1)) + 1)
    with open(src, "w") as f:
        for _ in range(copies):
            f.write(unique)
    subprocess.run(["zstd", "-q", "-f", "--rm", "-T2", src, "-o", src + ".zst"], check=True)
    out = os.path.join(work, "pp", "docs")
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    cmd = ["mpiexec", "-n", str(a.np), os.path.join(a.build_dir, "apps", "preprocess_data"), "--input", src + ".zst",
           "--output-prefix", out, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
           os.path.join(a.sample, "gpt2", "encoder.json"), "--merge-file", os.path.join(a.sample, "gpt2", "vocab.bpe"),
           "--append-eod", "--log-interval", "0", "--shard-tokens", "100000000"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"preprocess_data failed:\n{p.stdout}{p.stderr}")
    done = re.search(r"done in ([0-9.]+) s: (\d+) documents.*?, (\d+) tokens, ([0-9.]+) MB", p.stdout)
    comp = re.search(r"([0-9.]+) MB on disk, ([0-9.]+) MB decoded; sizes measured by decoding once in ([0-9.]+) s",
                     p.stdout)
    secs, tokens, mb = float(done.group(1)), int(done.group(3)), float(done.group(4))
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    return {"unique_mb": len(unique) / 1e6, "decoded_mb": mb, "zst_mb": float(comp.group(1)), "seconds": secs,
            "measure_s": float(comp.group(3)), "tokens": tokens, "tok_per_s_rank": tokens / secs / a.np,
            "mb_per_s_rank": mb / secs / a.np}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    p.add_argument("--sample", default=os.path.join(ROOT, "data", "sample"))
    p.add_argument("--sizes", default="1e6,1e7")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--seq-length", type=int, default=1024)
    p.add_argument("--train-samples", type=int, default=100000)
    p.add_argument("--read", type=int, default=20000)
    p.add_argument("--work", default=os.path.join(ROOT, "perf", "work", "data_scale"))
    p.add_argument("--regenerate", action="store_true")
    p.add_argument("--preprocess-mb", type=float, default=0)
    p.add_argument("--out", default=os.path.join(ROOT, "perf", "results",
                                                 "data_scale_%s.md" % datetime.date.today().isoformat()))
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    lines = [f"# Data path at scale ({datetime.date.today().isoformat()})", "",
             f"`perf/bench_data_scale.py --sizes {a.sizes} --np {a.np} --seq-length {a.seq_length} "
             f"--train-samples {a.train_samples} --read {a.read}"
             + (f" --preprocess-mb {a.preprocess_mb:g}" if a.preprocess_mb else "") + "`",
             "", f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             + _cpu_model(), ""]
    rows, starts = [], []
    for size in [int(float(x)) for x in a.sizes.split(",")]:
        prefix = os.path.join(a.work, f"zipf_{size}")
        if a.regenerate:
            for f in glob.glob(prefix + "_*.h5") + glob.glob(prefix + "_pair_*"):
                os.remove(f)
        if not glob.glob(prefix + "_*.h5"):
            t0 = time.time()
            n_tok = generate(prefix, size)
            print(f"generated {size} documents, {n_tok} tokens in {time.time() - t0:.0f} s", flush=True)
        spec = prefix + "_[0-9]*.h5"
        disk = sum(os.path.getsize(f) for f in glob.glob(spec))
        cache = os.path.join(a.work, f"cache_{size}")
        shutil.rmtree(cache, ignore_errors=True)
        r = {"docs": size, "disk_gb": disk / 1e9}
        r["none"] = loader(a, spec, "none", a.train_samples, a.seq_length)
        r["cold"] = loader(a, spec, cache, a.train_samples, a.seq_length)
        r["warm"] = loader(a, spec, cache, a.train_samples, a.seq_length)
        loader(a, prefix + "_pair_*.idx", cache, a.train_samples, a.seq_length)  # builds its cache
        r["megatron warm"] = loader(a, prefix + "_pair_*.idx", cache, a.train_samples, a.seq_length)
        r["cache_mb"] = sum(os.path.getsize(f) for f in glob.glob(os.path.join(cache, "*.idx"))) / 1e6 / 2
        print(json.dumps(r), flush=True)
        rows.append(r)
        s = {"docs": size, "none": startup(a, spec, "none", a.work, 256), "warm": None}
        startup(a, spec, cache, a.work, 256)  # builds the cache for this sequence length
        s["warm"] = startup(a, spec, cache, a.work, 256)
        print(json.dumps(s), flush=True)
        starts.append(s)
    lines += ["## Loader alone (one process; `bench_loader`)", "",
              "| documents | shards on disk | index | build/load s | private MB | file-backed MB | samples/s | "
              "tokens/s | vs 1.3B-on-one-GPU need |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for mode in ("none", "cold", "warm", "megatron warm"):
            x = r[mode]
            lines.append(f"| {r['docs']:,} | {r['disk_gb']:.2f} GB | {mode} ({x['origin']}) | {x['build_s']:.2f} | "
                         f"{x['rss_anon_mb']:.0f} | {x['rss_file_mb']:.0f} | {x['samples_per_s']:.0f} | "
                         f"{x['tokens_per_s']:.3g} | {x['tokens_per_s'] / NEEDED_TOKENS_PER_S:.1f}x |")
    lines += ["", "Modes: `none` = data.index_cache none (every process builds the index in its heap); `cold` = "
              "built and written to the cache; `warm` = mapped from the cache; `megatron warm` = the same documents as "
              "Megatron .bin/.idx pairs, warm cache. The last column is the loader's token rate over the 444k tokens/s "
              "(1.6 B tokens per hour) a 1.3B model trains at on one GPU.", ""]
    lines += ["", "Cache files: " + ", ".join(f"{r['docs']:,} documents: {r['cache_mb']:.0f} MB" for r in rows), ""]
    lines += ["## Start-up of pretrain_gpt (np=%d, tiny model, seq 256)" % a.np, "",
              "| documents | index | launch to first iteration s | peak private MB per rank |", "|---|---|---|---|"]
    for s in starts:
        for mode in ("none", "warm"):
            x = s[mode]
            lines.append(f"| {s['docs']:,} | {mode} | {x['first_row_s']:.2f} | {x['peak_anon_mb']:.0f} |")
        lines.append(f"| {s['docs']:,} | ratio none/warm | {s['none']['first_row_s'] / s['warm']['first_row_s']:.2f}x | "
                     f"{s['none']['peak_anon_mb'] / s['warm']['peak_anon_mb']:.2f}x |")
    # projection: private memory grows linearly with documents; the slope from the two largest sizes
    if len(rows) >= 2:
        r0, r1 = rows[-2], rows[-1]
        lines += ["", "## Projection to The Pile (210 M documents)", ""]
        for mode in ("none", "warm"):
            slope = (r1[mode]["rss_anon_mb"] - r0[mode]["rss_anon_mb"]) / (r1["docs"] - r0["docs"])
            at_pile = r1[mode]["rss_anon_mb"] + slope * (PILE_DOCS - r1["docs"])
            lines.append(f"- index `{mode}`: {slope * 1e6:.1f} bytes of private memory per document per process "
                         f"({slope * 1e6 * 1e-6 * 1e6:.1f} MB per million); at 210 M documents about "
                         f"{at_pile / 1e3:.2f} GB per rank, {8 * at_pile / 1e3:.1f} GB on an 8-GPU node")
        per_doc_cache = r1["cache_mb"] / r1["docs"]
        lines.append(f"- the cache files hold {per_doc_cache * 1e6:.1f} bytes per document: about "
                     f"{per_doc_cache * PILE_DOCS / 1e3:.1f} GB on disk at 210 M documents for one (split, sequence "
                     f"length, sample count, seed), shared by every rank of a node through the page cache")
    if a.preprocess_mb:
        pr = preprocess_rate(a, a.work)
        hours = PILE_TOKENS / (pr["tok_per_s_rank"] * 64) / 3600
        lines += ["", f"## Preprocessing (GPT-2 BPE, np={a.np}, .jsonl.zst)", "",
                  f"- input: Debian's /usr/share/doc text ({pr['unique_mb']:.0f} MB unique) repeated to "
                  f"{pr['decoded_mb']:.0f} MB, {pr['zst_mb']:.0f} MB as zstd; sizes measured by decoding once in "
                  f"{pr['measure_s']:.1f} s",
                  f"- {pr['tokens']:,} tokens in {pr['seconds']:.1f} s: {pr['tok_per_s_rank']:,.0f} tokens/s and "
                  f"{pr['mb_per_s_rank']:.2f} MB/s per rank",
                  f"- The Pile (300 B tokens) at 64 such ranks: about {hours:.1f} hours"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
        print(f"written: {a.out}")
    return 0


def _cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


if __name__ == "__main__":
    sys.exit(main())
