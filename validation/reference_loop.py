"""The training-and-comparison loop shared by the BERT and T5 references (bert_reference.py,
t5_reference.py): read a Trident checkpoint of a given model kind, retrain from it on the
global batches Trident dumped, and compare per-step losses, lr and grad norm with Trident's
metrics CSV and the step-1 gradients with grads.h5. Each micro-batch's loss comes from the
model's `micro_loss(rows)`; the step's loss is the mean over the micro-batches (consecutive
blocks of micro_batch_size rows of the dump), as in Megatron's BERT and T5 pretraining.
"""
import argparse
import json
import math
import os

import h5py
import numpy as np
import torch

import gpt_reference as g
import torch_reference as tr


class Checkpoint:
    """Parameters (float64), iteration and deck of a Trident checkpoint whose `model` attribute
    is `kind`; fc1 names the first MLP weight (it gives ffn_hidden_size to gpt_reference.Config)."""

    def __init__(self, path, kind, fc1):
        g._need_file(path, "checkpoint")
        with h5py.File(path, "r") as f:
            model = g._attr_str(f.attrs.get("model", ""))
            if model != kind:
                raise g.InputError("%s: model is %r, expected %r" % (path, model, kind))
            self.iteration = int(f.attrs.get("iteration", 0))
            self.deck = g.parse_deck(g._attr_str(f.attrs["deck"]))
            if g._deck_get(self.deck, "moe", "num_experts", g._to_int, 0) > 0:
                raise g.InputError("%s: the BERT and T5 references model dense MLPs only (the deck has [moe] "
                                   "num_experts > 0)" % path)
            shapes = {n: tuple(f[n].shape) for n in ("model/embedding/word_embeddings",
                                                      "model/embedding/position_embeddings")}
            shapes["model/layers/0/mlp/fc1/weight"] = tuple(f[fc1].shape)
            self.config = g.Config(self.deck, shapes)
            self.params = {}
            f["model"].visititems(lambda n, d: self.params.__setitem__(
                "model/" + n, np.asarray(d[...], dtype=np.float64)) if isinstance(d, h5py.Dataset) else None)


def layer_spec(cfg):
    """The torch_reference.LayerSpec of the BERT and T5 layers: GPT-2's (LayerNorm, GELU, learned
    positions, multi-head attention) with the config's heads and eps. A deck with grouped-query
    attention, other head channels, q / k norms or MoE layers is refused: these references do not
    model them."""
    if g.is_moe(cfg):
        raise g.InputError("the BERT and T5 references model dense MLPs only (the deck has [moe] num_experts %d)"
                           % cfg.num_experts)
    if (cfg.num_query_groups, cfg.head_dim, cfg.qk_layernorm) != (cfg.num_heads, cfg.hidden_size // cfg.num_heads,
                                                                   False):
        raise g.InputError("the BERT and T5 references model multi-head attention of hidden_size / num_heads channels "
                           "without q / k norms (the deck has num_query_groups %d, kv_channels %d, qk_layernorm %s)"
                           % (cfg.num_query_groups, cfg.head_dim, cfg.qk_layernorm))
    return tr.LayerSpec(cfg.num_heads, cfg.head_dim, eps=cfg.layernorm_epsilon)


class Dropout:
    """Trident's recorded dropout masks (--dropout-tape, gpt_reference.DropoutTape) applied in a
    reference's forward pass: x * keep / (1 - p) at the call that asks for (site, layer); x itself
    when the run had no dropout there. `shape` is the mask's shape in the tape (Trident's layout of
    the call's elements)."""

    def __init__(self, tape, cfg):
        self.tape, self.cfg = tape, cfg

    def __call__(self, x, site, layer, which, shape):
        p = getattr(self.cfg, which)  # hidden_dropout or attention_dropout
        if self.tape is None or p <= 0:
            return x
        return tr.apply_mask(x, self.tape.next(site, layer, p, shape), 1.0 / (1.0 - p), shape)


def dropout_of(a, cfg):
    """The Dropout of a run: its tape when it used dropout (required then), else a no-op."""
    if cfg.hidden_dropout > 0 or cfg.attention_dropout > 0:
        if not a.dropout_tape:
            raise g.InputError("the run used dropout (hidden %g, attention %g): give its masks with --dropout-tape "
                               "(Trident's debug.dump_dropout), or train the case without dropout"
                               % (cfg.hidden_dropout, cfg.attention_dropout))
        return Dropout(g.DropoutTape(a.dropout_tape), cfg)
    return Dropout(None, cfg)


def arguments(description, argv=None):
    """The references' command line (argv: default sys.argv[1:])."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--metrics", required=True)
    ap.add_argument("--grads")
    ap.add_argument("--loss-rtol", type=float, default=g.DEFAULT_LOSS_RTOL)
    ap.add_argument("--grad-rtol", type=float, default=g.DEFAULT_GRAD_RTOL)
    ap.add_argument("--gnorm-rtol", type=float, default=g.DEFAULT_GNORM_RTOL)
    ap.add_argument("--lr-rtol", type=float, default=g.DEFAULT_LR_RTOL)
    ap.add_argument("--params", help="Trident's debug.dump_params directory (parameters after some iterations)")
    ap.add_argument("--dropout-tape", help="Trident's debug.dump_dropout file: the masks of a run with dropout")
    ap.add_argument("--param-rtol", type=float, default=g.DEFAULT_PARAM_RTOL)
    ap.add_argument("--cache", metavar="DIR",
                    help="replay the reference's trajectory recorded in DIR by an earlier run on the same inputs, "
                         "else train it and record it there (gpt_reference.py compare --cache)")
    ap.add_argument("--report")
    return ap.parse_args(argv)


def trajectory_key(a, ck, fb, rows, param_iters, tape=None):
    """gpt_reference.trajectory_key's counterpart for these references: their code and platform,
    the configuration, the checkpoint's tensors, the batches of the iterations to train, the
    iterations whose parameters are compared and the dropout masks applied."""
    d = g.TrajectoryDigest()
    d.add_config(ck.config)
    d.add("counters", (ck.iteration, tuple(param_iters), bool(a.grads)))
    for n in sorted(ck.params):
        d.add(n, ck.params[n])
    it = ck.iteration
    while g.batch_name(it + 1) in fb and it + 1 in rows:
        it += 1
        d.add(g.batch_name(it), np.asarray(fb[g.batch_name(it)][...]))
    d.add_tape(tape)
    return d.hexdigest()


class _Holder:
    """The parameters as gpt_reference.TrajectoryCache records and replays a model's."""

    def __init__(self, params):
        self.params, self.buffers = params, {}


def _train_step(cfg, params, opt, batch, it, mbs, parts, micro_loss, dropout):
    """One reference iteration: the micro-batches' mean loss (and parts), the global gradient
    norm, the step-1 gradients, clipping, the schedule's lr and the AdamW update."""
    for t in params.values():
        t.grad = None
    if dropout is not None and dropout.tape is not None:
        dropout.tape.iteration = it
    nmb = cfg.global_batch_size // mbs
    tot = dict.fromkeys(("loss",) + tuple(parts), 0.0)
    for k in range(nmb):
        loss, part_values = micro_loss(batch[k * mbs:(k + 1) * mbs])
        (loss / nmb).backward()
        tot["loss"] += loss.item() / nmb
        for name in parts:
            tot[name] += part_values[name] / nmb
    grads = None
    with torch.no_grad():
        gnorm = math.sqrt(sum(float((t.grad ** 2).sum()) for t in params.values()))
        if it == 1:
            grads = {n: t.grad.numpy().copy() for n, t in params.items()}
        if cfg.clip_grad > 0 and cfg.clip_grad / (gnorm + 1e-6) < 1:
            for t in params.values():
                t.grad.mul_(cfg.clip_grad / (gnorm + 1e-6))
    lr = g.lr_at(cfg, it)
    opt.step(lr)
    return {"tot": tot, "grad_norm": gnorm, "lr": lr, "grads": grads}


def run(a, ck, params, width, micro_loss, parts=(), dropout=None):
    """Trains `params` (name -> leaf tensor) from checkpoint `ck` on the dumped batches (rows of
    `width` ints); micro_loss(rows) returns (loss tensor, {part: float}) for one micro-batch,
    the parts being extra metrics columns. Returns the exit status (0 pass, 1 tolerance
    exceeded, 2 bad input)."""
    cfg = ck.config
    try:
        rows = g.read_metrics(a.metrics)
        for need in parts:
            if need not in next(iter(rows.values())):
                raise g.InputError("%s: column %r is missing (another model's run?)" % (a.metrics, need))
        ref_grads = None
        if a.grads:
            g._need_file(a.grads, "grads")
            with h5py.File(a.grads, "r") as f:
                ref_grads = {n: np.asarray(f[n][...], dtype=np.float64) for n in params if n in f}
    except g.InputError as e:
        print("bad input:", e)
        return 2
    opt = g.AdamW(params, cfg, step=ck.iteration)
    mbs = cfg.micro_batch_size
    worst = dict.fromkeys(("loss",) + tuple(parts) + ("lr", "grad_norm", "grad", "param"), 0.0)
    if a.params and not os.path.isdir(a.params):
        print("bad input: --params: %s is not a directory" % a.params)
        return 2
    param_iters = []
    failures = []
    it = ck.iteration
    with h5py.File(a.batches, "r") as fb:
        cache, replaying = None, False
        tape = dropout.tape if dropout is not None else None
        if getattr(a, "cache", None):
            dumped = [i for i in rows if i > ck.iteration and g.params_file(a.params, i)]
            cache = g.TrajectoryCache(a.cache, trajectory_key(a, ck, fb, rows, dumped, tape))
            replaying = cache.load()
            if replaying:
                cache.replay_tape(tape)
            print("reference trajectory: %s %s" % ("replayed from" if replaying else "trained, recorded in", cache.path))
        while g.batch_name(it + 1) in fb and it + 1 in rows:
            it += 1
            batch = torch.as_tensor(np.asarray(fb[g.batch_name(it)][...], dtype=np.int64))
            if tuple(batch.shape) != (cfg.global_batch_size, width):
                print("bad input: %s has shape %s, expected (%d, %d)" % (g.batch_name(it), tuple(batch.shape),
                                                                        cfg.global_batch_size, width))
                return 2
            pf = g.params_file(a.params, it)
            if replaying:
                res = cache.replay(it, _Holder(params))
            else:
                res = _train_step(cfg, params, opt, batch, it, mbs, parts, micro_loss, dropout)
                if cache is not None:
                    cache.record(it, res, _Holder(params), keep_params=pf is not None)
            tot, gnorm, lr = res["tot"], res["grad_norm"], res["lr"]
            if it == 1 and ref_grads is not None:
                for n in params:
                    if n not in ref_grads:
                        failures.append("step-1 gradient of %s missing from grads.h5" % n)
                        continue
                    ref = res["grads"][n]
                    err = np.linalg.norm(ref_grads[n] - ref) / max(np.linalg.norm(ref),
                                                                    g.DEFAULT_GRAD_FLOOR_FRAC * gnorm)
                    worst["grad"] = max(worst["grad"], err)
                    if err > a.grad_rtol:
                        failures.append("step-1 gradient of %s: relative L2 error %.2e" % (n, err))
            if pf:
                w, rows_p, bad_p = g.compare_params(pf, params, ck.params, a.param_rtol)
                worst["param"] = max(worst["param"], w) if w == w else w
                failures += bad_p
                param_iters.append(it)
                print("  parameters after iteration %d: %d tensors, worst error %.2e of the change since the "
                      "checkpoint (tolerance %.1e)" % (it, len(rows_p), w, a.param_rtol))
            row = rows[it]
            checks = [(k, v, a.loss_rtol) for k, v in tot.items()] + [("lr", lr, a.lr_rtol),
                                                                      ("grad_norm", gnorm, a.gnorm_rtol)]
            for key, mine, tol in checks:
                r = g._rel(row[key], mine)
                worst[key] = max(worst[key], r)
                if r > tol:
                    failures.append("step %d: %s Trident %.8g, reference %.8g (relative %.2e > %.0e)"
                                    % (it, key, row[key], mine, r, tol))
            print("step %3d | loss %.6f (Trident %.6f)%s | gnorm %.5f (Trident %.5f)"
                  % (it, tot["loss"], row["loss"], "".join(" | %s %.6f" % (k, tot[k]) for k in parts), gnorm,
                     row["grad_norm"]))
        if cache is not None and not replaying:
            cache.record_tape(tape)
            cache.save()
    steps = it - ck.iteration
    if steps == 0:
        print("bad input: no batch matches a metrics row")
        return 2
    tape = dropout.tape if dropout is not None else None
    if tape is not None:
        if tape.pos != tape.n:
            failures.append("dropout tape: %d masks recorded, the reference used %d" % (tape.n, tape.pos))
        kept = [k for _, _, k in tape.masks] or [float("nan")]
        print("dropout: %d of Trident's masks applied; kept fraction per mask %.4f .. %.4f"
              % (tape.pos, min(kept), max(kept)))
    if a.params and not param_iters:
        failures.append("%s: no parameter dump for the compared iterations" % a.params)
    print("worst relative differences over %d steps: %s" % (steps, ", ".join("%s %.2e" % kv for kv in worst.items())))
    if a.report:
        with open(a.report, "w") as fh:
            json.dump({"steps": steps, "worst": worst, "parameter_iterations": param_iters, "failures": failures}, fh, indent=1)
    for f_ in failures:
        print("FAIL:", f_)
    return 1 if failures else 0
