#!/usr/bin/python3
"""serve_gpt under concurrent streaming clients: continuous batching at --max-batch B against batch 1.

For each batch size B (default 1, 4, 16, 32) it starts build/apps/serve_gpt with --max-batch B on
loopback, then runs --rounds rounds of B concurrent clients, each streaming one greedy completion of
exactly --tokens new tokens (a stop token would end one early: the tokens counted are the server's own
usage figures, and a shorter answer is reported). Per batch size it prints:

  * tokens/s: all generated tokens of a round / the round's wall time (first request sent to last
    [DONE]), summed over the rounds, and its speed-up over B = 1;
  * time to first token (TTFT): request sent -> the first server-sent event carrying text, median and p90
    over every request of every round;
  * per-request latency: request sent -> [DONE], median and p90; and the time per token of a stream
    after its first, (latency - TTFT) / (tokens - 1), median; and the CPU time per generated token of the
    server (/proc/PID/stat) and of the clients (this process), which share the machine's cores.

The checkpoint: --checkpoint, or the deck (--deck, default inputs/gpt_tiny_ci.ini) at its initial weights
(one step at lr 0; the weights do not change the cost of a token), its context raised
(model.max_position_embeddings) when the prompts + --tokens would not fit. Clients are Python threads in
this process: on a small machine they share the cores with the server (the client side of a token is a
read and a JSON parse).

  /usr/bin/python3 perf/bench_serve.py [--deck inputs/gpt_tiny_ci.ini] [--batches 1,4,16,32] [--tokens 48]
      [--rounds 5] [--threads N (the server's OMP_NUM_THREADS; default: the environment's)] [--out FILE.md]
"""
import argparse
import configparser
import datetime
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPTS = ["In the beginning God created", "And the LORD said unto Moses,", "Blessed are the",
           "Now these are the generations of", "The word of the LORD came", "And it came to pass",
           "Hear, O Israel", "For God so loved the world"]


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def start_server(app, ck, vocab, batch, max_length, env, log):
    f = open(log, "w")
    p = subprocess.Popen([app, "--checkpoint", ck, "--vocab-file", os.path.join(vocab, "encoder.json"),
                          "--merge-file", os.path.join(vocab, "vocab.bpe"), "--port", "0", "--max-batch", str(batch),
                          "--max-queue", str(2 * batch + 8), "--max-length", str(max_length)],
                         stdout=f, stderr=subprocess.STDOUT, env=env)  # its default HTTP threads: --max-batch + --max-queue + 16
    t0 = time.time()
    while time.time() - t0 < 120:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
        if m:
            return p, f, int(m.group(1))
        if p.poll() is not None:
            raise SystemExit(f"serve_gpt exited with {p.returncode}:\n{open(log).read()}")
        time.sleep(0.05)
    p.kill()
    raise SystemExit(f"serve_gpt did not start:\n{open(log).read()}")


def stop_server(p, f):
    p.terminate()
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "killed"
    f.close()
    return rc


def stream_one(port, prompt, tokens, go, out, timeout):
    """One client: waits for `go`, streams a greedy completion; out gets (ttft, latency, tokens, finish)."""
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.connect()
        go.wait()
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            out.append(("error", f"status {r.status}: {r.read()[:200]!r}"))
            return
        ttft, n, finish = None, None, None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                break
            j = json.loads(payload)
            for ch in j["choices"]:
                if ttft is None and ch.get("text"):
                    ttft = time.perf_counter() - t0
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if j.get("usage"):
                n = j["usage"]["completion_tokens"]
        lat = time.perf_counter() - t0
        out.append(("ok", (ttft, lat, n, finish)))
    except Exception as e:  # noqa: BLE001
        out.append(("error", f"{type(e).__name__}: {e}"))
    finally:
        c.close()


def run_round(port, batch, tokens, timeout, first_prompt):
    go, out = threading.Event(), []
    th = [threading.Thread(target=stream_one, args=(port, PROMPTS[(first_prompt + i) % len(PROMPTS)], tokens, go, out,
                                                      timeout), daemon=True) for i in range(batch)]
    for t in th:
        t.start()
    time.sleep(0.2)  # every client connected
    t0 = time.perf_counter()
    go.set()
    for t in th:
        t.join(timeout=timeout)
    wall = time.perf_counter() - t0
    errors = [x[1] for x in out if x[0] == "error"] + (["a client hung"] if any(t.is_alive() for t in th) else [])
    return wall, [x[1] for x in out if x[0] == "ok"], errors


def cpu_seconds(pid):
    """user + system CPU seconds of a process (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lscpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "?"
    get = lambda k: next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith(k + ":")), "?")  # noqa: E731
    return f"{get('Model name')}, {get('CPU(s)')} CPUs ({get('Vendor ID')} family {get('CPU family')} model {get('Model')})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--deck", default=os.path.join(ROOT, "inputs", "gpt_tiny_ci.ini"))
    ap.add_argument("--checkpoint", help="serve this checkpoint instead of the deck's initial weights")
    ap.add_argument("--batches", default="1,4,16,32")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default=None, help="the server's OMP_NUM_THREADS (default: the environment's)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a client may take")
    ap.add_argument("--work", default=os.path.join(ROOT, "perf", "work", "bench_serve"))
    ap.add_argument("--out", help="append the report (markdown) to this file")
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    apps = os.path.join(a.build, "apps")
    sample = os.path.join(ROOT, "data", "sample")
    vocab = os.path.join(sample, "gpt2")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    load0 = os.getloadavg()
    t_start = time.time()
    ck, deck_note = a.checkpoint, "--checkpoint " + str(a.checkpoint)
    need = 16 + a.tokens  # positions a request needs: the prompts are at most 10 GPT-2 tokens
    if not ck:
        cp = configparser.ConfigParser(inline_comment_prefixes=("#",))
        cp.read(a.deck)
        ctx = cp.getint("model", "max_position_embeddings")
        extra = []
        if need > ctx:
            extra = ["--model.max_position_embeddings", str(need)]
            ctx = need
        ck = os.path.join(a.work, "ck")
        # one step of one short sequence: only the weights' shapes matter here
        cmd = [os.path.join(apps, "pretrain_gpt"), "--deck", a.deck, "--data.train_shards",
               os.path.join(sample, "kjv_gpt2_*.h5"), "--train.iters", "1", "--optim.lr", "0", "--optim.min_lr", "0",
               "--optim.warmup_iters", "0", "--train.micro_batch_size", "1", "--train.global_batch_size", "1",
               "--model.seq_length", str(min(32, cp.getint("model", "seq_length"))), "--eval.interval", "0",
               "--checkpoint.save", ck, "--log.metrics_file="] + extra
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(p.stdout + p.stderr)
        shape = re.search(r"^GPT: .*$", p.stdout, re.M)
        deck_note = (f"{os.path.relpath(a.deck, ROOT)} at its initial weights (one step at lr 0), context {ctx}"
                     + (f" (raised: {' '.join(extra)})" if extra else "")
                     + (f"; {shape.group(0)}" if shape else ""))
    env = dict(os.environ)
    if a.threads is not None:
        env["OMP_NUM_THREADS"] = str(a.threads)
    threads_note = env.get("OMP_NUM_THREADS", "unset (serve_gpt: the node's cores)")
    rows, failures = [], []
    for b in batches:
        p, f, port = start_server(os.path.join(apps, "serve_gpt"), ck, vocab, b, need, env,
                                  os.path.join(a.work, f"serve_b{b}.log"))
        try:
            run_round(port, 1, 4, a.timeout, 0)  # warm-up
            tok, wall, ttft, lat, per_tok, short = 0, 0.0, [], [], [], 0
            srv_cpu0, cli_cpu0 = cpu_seconds(p.pid), sum(os.times()[:2])
            for r in range(a.rounds):
                w, res, errs = run_round(port, b, a.tokens, a.timeout, r)
                failures += [f"B={b} round {r}: {e}" for e in errs]
                wall += w
                for t_first, latency, n, finish in res:
                    tok += n or 0
                    ttft.append(t_first if t_first is not None else latency)
                    lat.append(latency)
                    if n and n > 1 and t_first is not None:
                        per_tok.append((latency - t_first) / (n - 1))
                    short += (n or 0) < a.tokens
            srv_cpu, cli_cpu = cpu_seconds(p.pid) - srv_cpu0, sum(os.times()[:2]) - cli_cpu0
        finally:
            rc = stop_server(p, f)
        if rc != 0:
            failures.append(f"B={b}: serve_gpt exited with {rc} after SIGTERM")
        row = dict(batch=b, requests=len(lat), tokens=tok, wall=wall, tps=tok / wall if wall else 0.0,
                   ttft_med=statistics.median(ttft) if ttft else float("nan"), ttft_p90=pct(ttft, 0.9),
                   lat_med=statistics.median(lat) if lat else float("nan"), lat_p90=pct(lat, 0.9),
                   tok_med=statistics.median(per_tok) if per_tok else float("nan"), short=short,
                   srv_ms=srv_cpu / tok * 1e3 if tok else float("nan"), cli_ms=cli_cpu / tok * 1e3 if tok else float("nan"))
        rows.append(row)
        print(f"B={b:3d}: {row['requests']} requests, {tok} tokens in {wall:.2f} s = {row['tps']:.0f} tokens/s; TTFT "
              f"median {row['ttft_med'] * 1e3:.1f} ms, p90 {row['ttft_p90'] * 1e3:.1f} ms; latency median "
              f"{row['lat_med'] * 1e3:.0f} ms, p90 {row['lat_p90'] * 1e3:.0f} ms", flush=True)
    if not a.checkpoint:
        shutil.rmtree(ck, ignore_errors=True)  # its own scratch checkpoint (large for 124M); the logs stay
    base = next((r["tps"] for r in rows if r["batch"] == 1), None)
    lines = ["| max-batch = clients | requests | tokens | tokens/s | speed-up over B=1 | TTFT median (ms) | TTFT p90 (ms) "
             "| latency median (ms) | latency p90 (ms) | ms/token of a stream after the first (median) "
             "| server CPU ms/token | clients' CPU ms/token |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sp = f"{r['tps'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['batch']} | {r['requests']} | {r['tokens']} | {r['tps']:.0f} | {sp} | {r['ttft_med'] * 1e3:.1f} "
                     f"| {r['ttft_p90'] * 1e3:.1f} | {r['lat_med'] * 1e3:.0f} | {r['lat_p90'] * 1e3:.0f} "
                     f"| {r['tok_med'] * 1e3:.2f} | {r['srv_ms']:.2f} | {r['cli_ms']:.2f} |")
    load1 = os.getloadavg()
    try:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    short = sum(r["short"] for r in rows)
    head = (f"serve_gpt, {deck_note}; {a.rounds} rounds per batch size of B concurrent streaming clients, each "
            f"{a.tokens} greedy tokens; server OMP_NUM_THREADS={threads_note}; --max-queue 2B+8, --max-length {need} "
            f"(key-value-cache positions per slot)\n"
            f"CPU: {lscpu()}; git {commit}; load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end; "
            f"{time.time() - t_start:.0f} s\n"
            + (f"{short} answers ended before {a.tokens} tokens (a stop token)\n" if short else ""))
    text = head + "\n" + "\n".join(lines)
    print("\n" + text)
    if failures:
        print("\nFAILURES:\n" + "\n".join(failures[:20]))
    if a.out:
        with open(a.out, "a") as f:
            f.write(f"## {datetime.date.today()} `{' '.join(['perf/bench_serve.py'] + sys.argv[1:])}`\n\n{text}\n\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
