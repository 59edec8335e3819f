#!/usr/bin/python3
"""Self-test helper for gpt_reference.py: a fake "Trident run" made by the reference itself.

Writes, into --out DIR, files in exactly the formats Trident produces:
  DIR/ckpt/iter_0000000/checkpoint.h5   random initial weights (+ zero optimizer state)
  DIR/ckpt/iter_NNNNNNN/checkpoint.h5   weights + AdamW state after --resume-at iterations
  DIR/ckpt/latest
  DIR/batches.h5                        /iter_0000001 ... int32 [global_batch, seq+1]
  DIR/metrics.csv                       Trident's metrics columns, one row per iteration
  DIR/grads.h5                          gradients of iteration 1 (root attribute iteration=1)
  DIR/shard.h5                          a token shard (/tokens uint16, /document_offsets);
                                        the batches are its consecutive windows, so
                                        `gpt_reference.py eval --windows <global_batch>` on the
                                        initial checkpoint must reproduce iteration 1's loss.
The metrics and gradients come from the reference run in FLOAT32, i.e. they play the part of
an fp32 implementation; `gpt_reference.py compare` (float64) must pass on them.

--selftest runs the whole check in a temporary directory: clean case passes, a corrupted
gradient / loss / lr fails, resuming from a mid-run checkpoint passes, eval reproduces the
step-1 loss, missing inputs give exit status 2. Exit status 0 when all of that holds.

Run with OPENBLAS_NUM_THREADS/OMP_NUM_THREADS set (default here: 2).
"""

import os
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import argparse  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from contextlib import redirect_stdout, redirect_stderr  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402


def make_deck(a):
    """A full-looking effective deck (extra sections/keys that the reference ignores too)."""
    return f"""# effective configuration (fake case written by make_fake_case.py)
[model]
type = gpt
num_layers = {a.layers}
hidden_size = {a.hidden}
num_heads = {a.heads}
ffn_hidden_size = {a.ffn}
seq_length = {a.seq}
max_position_embeddings = {a.max_pos}
layernorm_epsilon = 1e-05
vocab_size = {a.vocab}

[parallel]
tp = 1
pp = 1
vp = 1
sequence_parallel = false

[train]
micro_batch_size = {a.micro_batch}
global_batch_size = {a.batch}
iters = {a.iters}
seed = {a.seed}

[optim]
lr = {a.lr!r}
min_lr = {a.min_lr!r}
warmup_iters = {a.warmup}
decay_iters = {a.decay_iters}
decay_style = {a.decay_style}
weight_decay = {a.weight_decay!r}
clip_grad = {a.clip_grad!r}
beta1 = 0.9
beta2 = 0.95
eps = 1e-08

[precision]
dtype = fp32
loss_scale = 1
recompute = none

[data]
train_shards = shard.h5
split = 100,0,0

[checkpoint]
save = ckpt
load =
interval = {a.resume_at}
save_initial = true

[eval]
interval = 0
iters = 0

[log]
interval = 1
metrics_file = metrics.csv
"""


def init_params(a, rng):
    """GPT-2 style init; biases and LayerNorm parameters perturbed so that every path
    (bias add, LN affine) carries a non-trivial value."""
    L, C, Fh, V, P = a.layers, a.hidden, a.ffn, a.vocab, a.max_pos
    std, out_std = 0.02, 0.02 / math.sqrt(2 * L)
    shapes = ref.expected_shapes(_FakeCfg(a))
    p = {}
    for n, shp in shapes.items():
        if n.endswith("layernorm/weight"):
            p[n] = 1.0 + 0.05 * rng.standard_normal(shp)
        elif n.endswith("/bias"):
            p[n] = 0.02 * rng.standard_normal(shp)
        elif n.endswith("proj/weight") or n.endswith("fc2/weight"):
            p[n] = out_std * rng.standard_normal(shp)
        else:
            p[n] = std * rng.standard_normal(shp)
    assert set(p) == set(ref.param_names(_FakeCfg(a))) and p["model/embedding/word_embeddings"].shape == (V, C)
    assert p["model/embedding/position_embeddings"].shape == (P, C) and Fh > 0
    return {n: v.astype(np.float32).astype(np.float64) for n, v in p.items()}


class _FakeCfg:
    def __init__(self, a):
        self.vocab_size, self.max_position_embeddings = a.vocab, a.max_pos
        self.hidden_size, self.ffn_hidden_size, self.num_layers = a.hidden, a.ffn, a.layers
        # GPT-2's layer (the reference's defaults for the Llama-family variants)
        self.learned_positions, self.normalization, self.swiglu = True, "LayerNorm", False
        self.add_bias_linear, self.add_qkv_bias, self.untied = True, False, False


def write_checkpoint(path, deck, params, exp_avg, exp_avg_sq, iteration, consumed):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.attrs["format"] = "trident.checkpoint"
        f.attrs["format_version"] = 1
        f.attrs["model"] = "gpt"
        f.attrs["iteration"] = iteration
        f.attrs["consumed_samples"] = consumed
        f.attrs["deck"] = deck
        for n, v in params.items():
            f.create_dataset(n, data=np.asarray(v, dtype=np.float32))
            f.create_dataset("optimizer/exp_avg/" + n, data=np.asarray(exp_avg[n], dtype=np.float32))
            f.create_dataset("optimizer/exp_avg_sq/" + n, data=np.asarray(exp_avg_sq[n], dtype=np.float32))
    os.replace(tmp, path)


def make_tokens(a, rng, n_tokens):
    """Zipf-like documents ending with an EOD token (V-1) so that training has something to learn."""
    ranks = np.arange(1, a.vocab)
    prob = 1.0 / ranks ** 1.1
    prob /= prob.sum()
    perm = rng.permutation(a.vocab - 1)  # frequent tokens spread over the id range
    toks, offs = [], [0]
    while offs[-1] < n_tokens:
        n = int(rng.integers(20, 200))
        doc = perm[rng.choice(a.vocab - 1, size=n, p=prob)]
        toks.append(np.append(doc, a.vocab - 1))
        offs.append(offs[-1] + n + 1)
    return np.concatenate(toks), np.array(offs, dtype=np.int64)


def make_case(a):
    out = a.out
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    deck = make_deck(a)
    params = init_params(a, rng)
    zeros = {n: np.zeros_like(v) for n, v in params.items()}
    ckdir = os.path.join(out, "ckpt")
    init_path = os.path.join(ckdir, "iter_0000000", "checkpoint.h5")
    write_checkpoint(init_path, deck, params, zeros, zeros, 0, 0)

    S, B = a.seq, a.batch
    tokens, offsets = make_tokens(a, rng, a.iters * B * S + 1)
    dt = np.uint16 if a.vocab <= 65536 else np.int32
    with h5py.File(os.path.join(out, "shard.h5"), "w") as f:
        f.create_dataset("tokens", data=tokens.astype(dt), chunks=True)
        f.create_dataset("document_offsets", data=offsets)
        f.attrs["format"] = "trident.tokens"
        f.attrs["format_version"] = 1
        f.attrs["tokenizer"] = "fake"
        f.attrs["vocab_size"] = a.vocab
        f.attrs["eod_id"] = a.vocab - 1

    with h5py.File(os.path.join(out, "batches.h5"), "w") as f:
        for i in range(1, a.iters + 1):
            k0 = (i - 1) * B
            w = np.stack([tokens[k * S:k * S + S + 1] for k in range(k0, k0 + B)]).astype(np.int32)
            f.create_dataset(ref.batch_name(i), data=w)

    # The fake "Trident": the reference in float32.
    torch.set_num_threads(a.threads)
    ck = ref.Checkpoint(init_path)
    tr = ref.Trainer(ck, torch.float32)
    rows = []
    with h5py.File(os.path.join(out, "batches.h5"), "r") as bf:
        for i in range(1, a.iters + 1):
            t0 = time.time()
            res = tr.step(bf[ref.batch_name(i)][()], keep_grads=(i == 1))
            ms = 1e3 * (time.time() - t0)
            if i == 1:
                with h5py.File(os.path.join(out, "grads.h5"), "w") as gf:
                    gf.attrs["iteration"] = 1
                    for n, g in res["grads"].items():
                        gf.create_dataset(n, data=g.astype(np.float32))
            rows.append("%d,%d,%.9g,%.9g,%.9g,1,0,%.3f,%.1f,0,0"
                        % (i, i * B, res["loss"], res["lr"], res["grad_norm"], ms, B * S / (ms / 1e3)))
            if i == a.resume_at:
                write_checkpoint(os.path.join(ckdir, "iter_%07d" % i, "checkpoint.h5"), deck,
                                 {n: p.detach().numpy() for n, p in tr.model.params.items()},
                                 {n: m.numpy() for n, m in tr.opt.m.items()},
                                 {n: v.numpy() for n, v in tr.opt.v.items()}, i, i * B)
    with open(os.path.join(ckdir, "latest"), "w") as fh:
        fh.write("%d\n" % a.resume_at)
    with open(os.path.join(out, "metrics.csv"), "w") as fh:
        fh.write(",".join(ref.METRICS_COLUMNS) + "\n")
        fh.write("\n".join(rows) + "\n")
    print("fake case written to %s (%d iterations, loss %.4f -> %.4f)"
          % (out, a.iters, float(rows[0].split(",")[2]), float(rows[-1].split(",")[2])))


# --------------------------------------------------------------------------------------
# self-test
# --------------------------------------------------------------------------------------

def _run(argv, label, expect, log):
    """Run gpt_reference.main in-process; capture its output; check the exit status."""
    buf = io.StringIO()
    t0 = time.time()
    with redirect_stdout(buf), redirect_stderr(buf):
        rc = ref.main(argv)
    dt = time.time() - t0
    out = buf.getvalue()
    ok = rc == expect or expect is None
    log.append((label, ok))
    print("%-62s rc=%d (want %s) %5.1fs  %s" % (label, rc, "any" if expect is None else expect, dt,
                                                 "ok" if ok else "WRONG"))
    if not ok or os.environ.get("SELFTEST_VERBOSE"):
        print(out)
    return out


def selftest(a):
    tmp = tempfile.mkdtemp(prefix="trident_fake_")
    try:
        a.out = tmp
        t0 = time.time()
        make_case(a)
        print("  (made in %.1fs)" % (time.time() - t0))
        ck0 = os.path.join(tmp, "ckpt", "iter_0000000", "checkpoint.h5")
        base = ["compare", "--checkpoint", ck0, "--batches", os.path.join(tmp, "batches.h5"),
                "--threads", str(a.threads)]
        met, grads = os.path.join(tmp, "metrics.csv"), os.path.join(tmp, "grads.h5")
        log = []

        out = _run(base + ["--metrics", met, "--grads", grads,
                           "--report", os.path.join(tmp, "report.json")],
                   "clean case, %d steps, float64 reference" % a.iters, 0, log)
        print("\n".join("    | " + l for l in out.splitlines()))

        # A corrupted gradient tensor (0.1% off) must fail.
        bad = os.path.join(tmp, "grads_bad.h5")
        shutil.copy(grads, bad)
        with h5py.File(bad, "r+") as f:
            n = "model/layers/%d/mlp/fc1/weight" % (a.layers - 1)
            f[n][...] = f[n][()] * np.float32(1.001)
        _run(base + ["--metrics", met, "--grads", bad, "--steps", "1"],
             "gradient of one tensor scaled by 1.001 -> fail", 1, log)
        # A swapped-in transposed-looking error: one row of qkv zeroed.
        with h5py.File(bad, "r+") as f:
            n = "model/layers/%d/mlp/fc1/weight" % (a.layers - 1)
            f[n][...] = f[n][()] / np.float32(1.001)
            q = "model/layers/0/self_attention/qkv/weight"
            g = f[q][()]
            g[a.hidden + 1, :] = 0.0
            f[q][...] = g
        _run(base + ["--metrics", met, "--grads", bad, "--steps", "1"],
             "one row of a qkv gradient zeroed -> fail", 1, log)

        # The trajectory cache (compare --cache): the first run trains and records, the second
        # replays the reference's numbers and must judge Trident's afresh: the clean case passes,
        # the corrupted gradient still fails; other batches are another key (trained again).
        cache = os.path.join(tmp, "cache")
        cached = base + ["--metrics", met, "--grads", grads, "--cache", cache]
        out1 = _run(cached, "trajectory cache: clean case recorded", 0, log)
        out2 = _run(cached, "trajectory cache: clean case replayed", 0, log)
        ok = "recorded in" in out1 and "replayed from" in out2 and len(os.listdir(cache)) == 1
        log.append(("trajectory cache: one record, replayed", ok))
        print("%-62s %s" % ("trajectory cache: one record, replayed by the second run", "ok" if ok else "WRONG"))
        out3 = _run(base + ["--metrics", met, "--grads", bad, "--cache", cache],
                    "trajectory cache: replayed, qkv gradient row zeroed -> fail", 1, log)  # (bad: above)
        ok = "replayed from" in out3
        log.append(("trajectory cache: the corrupted run replayed", ok))
        other = os.path.join(tmp, "batches_other.h5")
        shutil.copy(os.path.join(tmp, "batches.h5"), other)
        with h5py.File(other, "r+") as f:
            d = f["iter_%07d" % 1]
            b = d[()]
            b[0, :] = b[0, ::-1]  # one window's tokens reversed: iteration 1's loss moves
            d[...] = b
        out4 = _run(["compare", "--checkpoint", ck0, "--batches", other, "--threads", str(a.threads),
                     "--metrics", met, "--cache", cache], "trajectory cache: other batches -> trained again", 1, log)
        ok = "recorded in" in out4 and len(os.listdir(cache)) == 2
        log.append(("trajectory cache: other batches are another record", ok))
        print("%-62s %s" % ("trajectory cache: other batches are another record", "ok" if ok else "WRONG"))

        # A wrong hit must be impossible: the key holds the reference's code by content (a copy of
        # it replays; a one-comment edit of the shared layer math misses), the deck's configuration
        # (a checkpoint whose deck differs in one optimizer key misses) and the platform (torch,
        # numpy and the CPU).
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        here = os.path.dirname(os.path.abspath(__file__))
        for n in ("gpt_reference.py", "torch_reference.py"):
            shutil.copy(os.path.join(here, n), src)
        key_cache = os.path.join(tmp, "key_cache")
        two = base + ["--metrics", met, "--steps", "2", "--cache", key_cache]

        def script(where, label, want):
            p_ = subprocess.run([sys.executable, os.path.join(where, "gpt_reference.py")] + two,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            ok_ = want in p_.stdout and p_.returncode == 0
            log.append((label, ok_))
            print("%-62s %s" % (label, "ok" if ok_ else "WRONG"))
            if not ok_:
                print(p_.stdout[-3000:])

        script(here, "cache key: the reference trains and records", "recorded in")
        script(src, "cache key: a copy of the same code replays", "replayed from")
        with open(os.path.join(src, "torch_reference.py"), "a") as fh:
            fh.write("\n# an edit\n")
        script(src, "cache key: edited torch_reference.py trains again", "recorded in")
        other_deck = os.path.join(tmp, "ck_other_deck.h5")
        shutil.copy(ck0, other_deck)
        with h5py.File(other_deck, "r+") as f:
            deck = f.attrs["deck"]
            deck = deck.decode() if isinstance(deck, bytes) else str(deck)
            assert "clip_grad = %s" % a.clip_grad in deck, "the fake deck has no clip_grad line"
            f.attrs["deck"] = deck.replace("clip_grad = %s" % a.clip_grad, "clip_grad = %s" % (a.clip_grad * 2))
        out5 = _run(["compare", "--checkpoint", other_deck] + base[3:] + ["--metrics", met, "--steps", "2",
                                                                          "--cache", key_cache],
                    "cache key: another deck (optim.clip_grad) -> trained again", None, log)
        ok = "recorded in" in out5
        log.append(("cache key: another deck is another record", ok))
        print("%-62s %s" % ("cache key: another deck is another record", "ok" if ok else "WRONG"))
        plat = ref._platform_text()
        ok = ("torch " + torch.__version__) in plat and ("numpy " + np.__version__) in plat and "threads" in plat
        log.append(("cache key: the platform names torch, numpy and the threads", ok))
        print("%-62s %s" % ("cache key: the platform names torch, numpy and the threads", "ok" if ok else "WRONG"))

        def corrupt_csv(col, it, factor, name):
            lines = open(met).read().splitlines()
            hdr = lines[0].split(",")
            j = hdr.index(col)
            cells = lines[it].split(",")
            cells[j] = "%.9g" % (float(cells[j]) * factor)
            lines[it] = ",".join(cells)
            p = os.path.join(tmp, name)
            with open(p, "w") as fh:
                fh.write("\n".join(lines) + "\n")
            return p

        k = min(4, a.iters)  # a corrupted late row: steps 1..k-1 pass, step k must fail
        _run(base + ["--metrics", corrupt_csv("loss", k, 1.0 + 1e-3, "m_loss.csv"),
                     "--steps", str(k)], "loss of iteration %d off by 1e-3 -> fail" % k, 1, log)
        _run(base + ["--metrics", corrupt_csv("lr", k, 1.01, "m_lr.csv"),
                     "--steps", str(k)], "lr of iteration %d off by 1%% -> fail" % k, 1, log)
        _run(base + ["--metrics", corrupt_csv("grad_norm", k, 1.01, "m_gn.csv"),
                     "--steps", str(k)], "grad norm of iteration %d off by 1%% -> fail" % k, 1, log)

        # Resume from the mid-run checkpoint (optimizer state and Adam step restored).
        ckr = os.path.join(tmp, "ckpt", "iter_%07d" % a.resume_at, "checkpoint.h5")
        _run(["compare", "--checkpoint", ckr, "--batches", os.path.join(tmp, "batches.h5"),
              "--metrics", met, "--threads", str(a.threads), "--steps", str(min(4, a.iters - a.resume_at))],
             "resume from iteration %d, float64 -> pass" % a.resume_at, 0, log)
        # Resuming without the optimizer state must be an input error.
        nost = os.path.join(tmp, "ck_noopt.h5")
        shutil.copy(ckr, nost)
        with h5py.File(nost, "r+") as f:
            del f["optimizer"]
        _run(["compare", "--checkpoint", nost, "--batches", os.path.join(tmp, "batches.h5"),
              "--metrics", met], "resume checkpoint without optimizer state -> error", 2, log)

        # Eval mode on the shard reproduces iteration 1's loss (same windows, same weights).
        out = _run(["eval", "--checkpoint", ck0, "--shard", os.path.join(tmp, "shard.h5"),
                    "--windows", str(a.batch), "--threads", str(a.threads)],
                   "eval on the shard's first %d windows" % a.batch, 0, log)
        ev = float([l for l in out.splitlines() if l.startswith("eval loss:")][0].split(":")[1])
        l1 = float(open(met).read().splitlines()[1].split(",")[2])
        rel = abs(ev - l1) / l1
        good = rel < 1e-6
        log.append(("eval == step-1 loss", good))
        print("%-62s %.9g vs %.9g rel %.1e  %s" % ("eval loss equals iteration 1 loss",
                                                     ev, l1, rel, "ok" if good else "WRONG"))

        # Input errors: missing file, missing dataset, wrong shape.
        _run(base + ["--metrics", os.path.join(tmp, "nope.csv")], "missing metrics file -> error", 2, log)
        miss = os.path.join(tmp, "grads_missing.h5")
        shutil.copy(grads, miss)
        with h5py.File(miss, "r+") as f:
            del f["model/final_layernorm/bias"]
        _run(base + ["--metrics", met, "--grads", miss, "--steps", "1"],
             "grads file lacking a dataset -> error", 2, log)
        with h5py.File(miss, "r+") as f:
            f.create_dataset("model/final_layernorm/bias", data=np.zeros(a.hidden + 1, np.float32))
        _run(base + ["--metrics", met, "--grads", miss, "--steps", "1"],
             "grads tensor with a wrong shape -> error", 2, log)
        badb = os.path.join(tmp, "batches_bad.h5")
        with h5py.File(badb, "w") as f:
            f.create_dataset("iter_0000001", data=np.zeros((a.batch, a.seq), np.int32))
        _run(["compare", "--checkpoint", ck0, "--batches", badb, "--metrics", met],
             "batch of the wrong shape -> error", 2, log)

        # The model agrees with a loop-level numpy implementation.
        good, mine, naive = check_forward_numpy()
        log.append(("forward == naive numpy", good))
        print("%-62s %.15g vs %.15g  %s" % ("loss equals a naive numpy GPT-2 (tiny model)",
                                           mine, naive, "ok" if good else "WRONG"))
        # torch.optim.AdamW agrees with the reference's AdamW (decay only on >= 2-D tensors).
        log.append(("AdamW matches torch.optim.AdamW", check_adamw()))
        print("%-62s %s" % ("AdamW matches torch.optim.AdamW (3 steps)", "ok" if log[-1][1] else "WRONG"))

        n_bad = sum(1 for _, ok in log if not ok)
        print("\nselftest: %d checks, %s (%.0fs)" % (len(log), "all passed" if not n_bad
                                                     else "%d FAILED" % n_bad, time.time() - t0))
        return 0 if n_bad == 0 else 1
    finally:
        if a.keep:
            print("kept %s" % tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def naive_gpt_loss(cfg, p, windows):
    """Loop-level numpy GPT-2 forward (independent of gpt_reference.GPTReference)."""
    C, H = cfg.hidden_size, cfg.num_heads
    D = C // H

    def ln(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg.layernorm_epsilon) * w + b

    def gelu(x):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))

    total, count = 0.0, 0
    for w in windows:
        inp, tgt = w[:-1], w[1:]
        T = len(inp)
        x = np.stack([p["model/embedding/word_embeddings"][inp[t]]
                      + p["model/embedding/position_embeddings"][t] for t in range(T)])
        for i in range(cfg.num_layers):
            q_ = "model/layers/%d/" % i
            a = ln(x, p[q_ + "input_layernorm/weight"], p[q_ + "input_layernorm/bias"])
            qkv = a @ p[q_ + "self_attention/qkv/weight"].T + p[q_ + "self_attention/qkv/bias"]
            y = np.zeros((T, C))
            for h in range(H):
                q = qkv[:, h * D:(h + 1) * D]
                k = qkv[:, C + h * D:C + (h + 1) * D]
                v = qkv[:, 2 * C + h * D:2 * C + (h + 1) * D]
                for t in range(T):
                    s = np.array([q[t] @ k[j] / math.sqrt(D) for j in range(t + 1)])
                    e = np.exp(s - s.max())
                    att = e / e.sum()
                    y[t, h * D:(h + 1) * D] = sum(att[j] * v[j] for j in range(t + 1))
            x = x + y @ p[q_ + "self_attention/proj/weight"].T + p[q_ + "self_attention/proj/bias"]
            a = ln(x, p[q_ + "post_attention_layernorm/weight"], p[q_ + "post_attention_layernorm/bias"])
            m = gelu(a @ p[q_ + "mlp/fc1/weight"].T + p[q_ + "mlp/fc1/bias"])
            x = x + m @ p[q_ + "mlp/fc2/weight"].T + p[q_ + "mlp/fc2/bias"]
        x = ln(x, p["model/final_layernorm/weight"], p["model/final_layernorm/bias"])
        logits = x @ p["model/embedding/word_embeddings"].T
        for t in range(T):
            z = logits[t] - logits[t].max()
            total += math.log(np.exp(z).sum()) - z[tgt[t]]
            count += 1
    return total / count


def check_forward_numpy():
    """The reference's loss equals a naive loop implementation on a tiny random model."""
    class A:
        layers, hidden, heads, ffn, vocab, max_pos = 2, 12, 3, 20, 37, 9
    rng = np.random.default_rng(7)
    params = init_params(A, rng)
    params = {n: v * (5.0 if v.ndim == 2 else 1.0) for n, v in params.items()}  # non-trivial attention
    cfg = type("Cfg", (), dict(num_layers=2, hidden_size=12, num_heads=3, head_dim=4, ffn_hidden_size=20,
                               vocab_size=37, max_position_embeddings=9, layernorm_epsilon=1e-5,
                               learned_positions=True, normalization="LayerNorm", swiglu=False,
                               position_embedding_type="learned_absolute", add_bias_linear=True,
                               add_qkv_bias=False, untied=False))()
    windows = rng.integers(0, A.vocab, size=(3, 8))
    model = ref.GPTReference(cfg, params, torch.float64)
    mine = float(model.loss_sum(torch.from_numpy(windows))) / (3 * 7)
    naive = naive_gpt_loss(cfg, params, windows)
    return abs(mine - naive) <= 1e-12 * abs(naive), mine, naive


def check_adamw():
    class C:
        beta1, beta2, eps, weight_decay = 0.9, 0.95, 1e-8, 0.1
    g = torch.Generator().manual_seed(0)
    w = {"w": torch.randn(5, 3, generator=g, dtype=torch.float64),
         "b": torch.randn(3, generator=g, dtype=torch.float64)}
    mine = {k: v.clone() for k, v in w.items()}
    theirs = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    opt_t = torch.optim.AdamW([{"params": [theirs["w"]], "weight_decay": C.weight_decay},
                               {"params": [theirs["b"]], "weight_decay": 0.0}],
                              lr=1e-2, betas=(C.beta1, C.beta2), eps=C.eps)
    opt_m = ref.AdamW(mine, C)
    for step, lr in enumerate([1e-2, 5e-3, 2e-3]):
        grads = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in w.items()}
        for k in w:
            mine[k].grad = grads[k].clone()
            theirs[k].grad = grads[k].clone()
        for grp in opt_t.param_groups:
            grp["lr"] = lr
        opt_t.step()
        opt_m.step(lr)
    return all(torch.allclose(mine[k], theirs[k].detach(), rtol=1e-13, atol=1e-15) for k in w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="output directory (required unless --selftest)")
    ap.add_argument("--selftest", action="store_true", help="make a case in a temp dir and check compare")
    ap.add_argument("--keep", action="store_true", help="with --selftest: keep the temp dir")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=None, help="default 4*hidden")
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--max-pos", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4, help="global batch size")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--resume-at", type=int, default=10, help="also save a checkpoint after this iteration")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--decay-iters", type=int, default=0, help="0: train iters")
    ap.add_argument("--decay-style", default="cosine", choices=["constant", "linear", "cosine"])
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--clip-grad", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    ref.tune_malloc()
    a.ffn = a.ffn or 4 * a.hidden
    if not (1 <= a.resume_at < a.iters):
        ap.error("--resume-at must be in [1, iters)")
    if a.selftest:
        return selftest(a)
    if not a.out:
        ap.error("--out is required (or use --selftest)")
    make_case(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
