#!/usr/bin/env python3
"""TensorBoard event files of pretrain_gpt (log.tensorboard_dir; docs/DESIGN.md "TensorBoard"),
read by a reader of this test's own (run by CTest as e2e_tensorboard).

usage: tensorboard_checks.py tensorboard|tensorboard_package --app PRETRAIN_GPT --deck DECK --shards GLOB --work DIR
                              [--mpiexec M]

The reader: tb_event.proto (beside this script: the contract's messages with TensorFlow's public
field numbers) is compiled with the protoc found on PATH into the work directory; every event file
is read as TFRecords with both masked CRC32Cs of every record checked (CRC32C written here from its
definition, checked against crc32c("123456789") = 0xE3069283 first); a bad CRC, a truncated record
or trailing bytes fail. Every record must parse with no unknown field, hold exactly one of
file_version / summary / session_log, and the histograms' bucket_limit and bucket must be packed.
Without protoc or Python's google.protobuf the test is skipped (exit 77).

Runs (deck DECK, gpt_tiny_ci, with 4 layers so that the histograms have 4 buckets):
  A   np=2, tp=2: 4 iterations, checkpoint every 2, metrics CSV, memory JSON, histogram_interval 2,
      eval.interval 2, parameters dumped after iterations 2 and 4; then resumed from the save
      directory to 6 iterations (parameters dumped after 6): a second event file appears, the
      first is byte for byte unchanged, the metrics CSV holds the rows 1..6
  G   np=2, pp=2: 1 iteration with histogram_interval 1 and iteration 1's gradients and
      parameters dumped (debug.dump_grads, debug.dump_params)
  B   one rank, the MoE deck beside DECK (moe_tiny_ci): 3 iterations, eval.interval 3,
      histogram_interval 3, parameters dumped after 3
What each event file must hold (file by file, against what its own run wrote):
  - the name events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, seconds and wall times within
    the run; record 1 file_version "brain.Event:2" at step 0; record 2 a session_log START at the
    run's first iteration (1, or 5 after the resume); record 3 the text summary `deck` (plugin
    "text", a DT_STRING scalar) equal to the deck stored in the run's checkpoint (HDF5 root
    attribute `deck`) with each line indented by four spaces; no tag twice at one step, steps
    non-decreasing, only the contract's tag families
  - every iteration of the run: one event whose train/<column> scalars are, for every column of
    the metrics CSV but `iteration`, exactly numpy.float32 of the CSV's value (NaN for nan); no
    train/ scalars at other steps; eval/<column> likewise against the .eval.csv sibling, at the
    evaluations' iterations only
  - histograms at the multiples of histogram_interval only: param_norm/layer_<LLL> and
    param_norm/outside_layers recomputed in float64 from the dumped parameters of that
    iteration, grad_norm/* from the dumped gradients (G), within PER_TENSOR_REL; at every
    histogram step sqrt(sum of the squares of grad_norm/*) equals train/grad_norm within
    TOTAL_REL; param_norm/by_layer and grad_norm/by_layer: num = layers, min and max the
    per-layer scalars' (exactly, after float32 rounding), sum and sum_squares within float32
    rounding, min(30, layers) buckets with the contract's limits (the last one max), integral
    counts summing to num, each layer's norm in its bucket (previous limit, limit]
  - memory/rank_<r>/<figure> at the run's last iteration equal to float32 of every figure of the
    memory JSON the run wrote (every rank, nothing more)
  - B: train/moe_aux_loss, moe_z_loss, moe_max_load, moe_dropped (through the CSV columns) and in
    the same event moe/layer_<L>/max_load and moe/layer_<L>/expert_<e> exactly float32 of the
    .moe.csv sibling's row of layer L
Check tensorboard_package (CTest e2e_tensorboard_package): TensorBoard's own EventAccumulator reads the
directory of a run as A (4 iterations, resumed to 6) and its train/loss series (steps 1..6) must equal the
CSV's float32 losses; exit 77 with the reason where Python's tensorboard package is not installed (not in
the CPU image); a reader that does not finish within TB_READER_S fails.
The work directory is removed when every check passes.
"""
import csv
import glob
import hashlib
import json
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from testlib import assert_layout, check_main, run  # noqa: E402

PROTO = os.path.join(HERE, "tb_event.proto")
LAYERS = 4          # model.num_layers of runs A and G (min(30, 4) = 4 buckets)
# the per-layer norms against float64 recomputation from the dumps (the writer sums in another
# order, and its scalars are float32): measured at most 5.8e-8 relative (parameters, 23 norms) and
# 4.7e-8 (gradients, 5 norms), 2026-12-05; the test prints the largest of each run
PER_TENSOR_REL = 1e-5
TOTAL_REL = 1e-5    # sqrt(sum of grad_norm/*^2) against train/grad_norm: measured at most 4.8e-8
# TensorBoard's own reader (check tensorboard_package): a generous bound for importing the package and
# reading two small event files on a loaded host; past it the check fails (a hang is a bug)
TB_READER_S = 120

FAILURES = []


def expect(cond, msg):
    """A soft check: the failure is recorded and printed and the checks go on, so that one run
    reports every discrepancy at once."""
    if not cond:
        FAILURES.append(msg)
        print("FAIL: " + msg, flush=True)
    return bool(cond)


# ---------------------------------------------------------------------------------------------
# TFRecords: CRC32C (Castagnoli, reflected polynomial 0x82F63B78) and its mask

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    """The data of every TFRecord of the file; a bad CRC, a short record or bytes after the last
    record fail (the runs here end normally, so the file must end at a record boundary)."""
    buf = open(path, "rb").read()
    recs, off = [], 0
    while off < len(buf):
        assert len(buf) - off >= 12, f"{path}: {len(buf) - off} trailing bytes at offset {off} (no record header)"
        header = buf[off:off + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", buf[off + 8:off + 12])
        assert hcrc == masked_crc(header), \
            f"{path}: record {len(recs)} at offset {off}: length CRC {hcrc:#010x}, expected {masked_crc(header):#010x}"
        assert off + 12 + n + 4 <= len(buf), \
            f"{path}: record {len(recs)} at offset {off}: length {n} runs past the end of the file ({len(buf)} bytes)"
        data = buf[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack("<I", buf[off + 12 + n:off + 16 + n])
        assert dcrc == masked_crc(data), \
            f"{path}: record {len(recs)} at offset {off}: data CRC {dcrc:#010x}, expected {masked_crc(data):#010x}"
        recs.append(data)
        off += 16 + n
    return recs


# ---------------------------------------------------------------------------------------------
# the protocol-buffer wire format, read directly where the parsed message cannot tell (which
# top-level fields a record holds, whether repeated doubles are packed)

def _varint(buf, i):
    r = s = 0
    while True:
        assert i < len(buf), "truncated varint"
        b = buf[i]
        i += 1
        r |= (b & 0x7F) << s
        s += 7
        if not b & 0x80:
            return r, i


def wire_fields(buf):
    """[(field number, wire type, value)] of one message's bytes."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(buf, i)
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise AssertionError(f"wire type {wt} of field {num}")
        out.append((num, wt, v))
    assert i == len(buf), "a field runs past the end of its message"
    return out


def load_pb(work):
    """Compiles tb_event.proto with the protoc on PATH and imports it (exit 77 without protoc
    or google.protobuf)."""
    protoc = shutil.which("protoc")
    if protoc is None:
        print("skipped: protoc is not on PATH (the reader's messages are compiled from tb_event.proto)")
        raise SystemExit(77)
    try:
        import google.protobuf  # noqa: F401
    except ImportError as e:
        print(f"skipped: Python's google.protobuf does not import ({e})")
        raise SystemExit(77)
    out = os.path.join(work, "pb")
    os.makedirs(out, exist_ok=True)
    run([protoc, f"--proto_path={HERE}", f"--python_out={out}", PROTO])
    sys.path.insert(0, out)
    try:
        import tb_event_pb2
    except Exception as e:  # a protoc whose output this runtime does not take
        print(f"skipped: the module protoc generated does not import with this google.protobuf ({e!r})")
        raise SystemExit(77)
    return tb_event_pb2


# ---------------------------------------------------------------------------------------------
# one event file, parsed and indexed

class EventFile:
    """events: [(step, wall_time, kind, {tag: ("scalar", float) | ("histo", proto) | ("tensor",
    Value)})] in file order (kind: file_version, session_log, summary)."""

    def __init__(self, pb, path, t0=None, t1=None):
        self.path, self.name = path, os.path.basename(path)
        self.raw = open(path, "rb").read()
        self.sha256 = hashlib.sha256(self.raw).hexdigest()
        self.records = read_records(path)
        self.pb = pb
        self.events, self.parsed = [], []
        for i, data in enumerate(self.records):
            ev = pb.Event()
            ev.ParseFromString(data)
            self.parsed.append(ev)
            self._wire_checks(i, data, ev)
            kind = ev.WhichOneof("what")
            tags = {}
            if kind == "summary":
                for v in ev.summary.value:
                    which = v.WhichOneof("value")
                    expect(which is not None, f"{self.name} record {i}: tag {v.tag!r} holds no value")
                    expect(v.tag not in tags, f"{self.name} record {i}: tag {v.tag!r} twice in one event")
                    if which == "simple_value":
                        tags[v.tag] = ("scalar", v.simple_value)
                    elif which == "histo":
                        tags[v.tag] = ("histo", v.histo)
                    elif which == "tensor":
                        tags[v.tag] = ("tensor", v)
            self.events.append((ev.step, ev.wall_time, kind, tags))
        self._structure_checks(t0, t1)

    def _wire_checks(self, i, data, ev):
        top = [f[0] for f in wire_fields(data)]
        if 6 in top:  # one message for this cause (the record's other checks would only repeat it)
            return expect(False, f"{self.name} record {i}: top-level field 6 present: in TensorFlow's event.proto 6 is the "
                          f"deprecated LogMessage log_message and session_log is field 7 (docs/DESIGN.md's table says 6); "
                          f"TensorBoard would not see this record as a SessionLog (field bytes "
                          f"{[f[2].hex() if isinstance(f[2], bytes) else f[2] for f in wire_fields(data) if f[0] == 6]})")
        expect(set(top) <= {1, 2, 3, 5, 7}, f"{self.name} record {i}: top-level fields {sorted(set(top))}, "
                                            f"the contract's Event has 1, 2, 3, 5 and session_log (7)")
        expect(ev.WhichOneof("what") is not None and sum(top.count(n) for n in (3, 5, 7)) == 1,
               f"{self.name} record {i}: holds {top}, not exactly one of file_version / summary / session_log")
        copy = self.pb.Event()
        copy.CopyFrom(ev)
        copy.DiscardUnknownFields()
        expect(copy.ByteSize() == ev.ByteSize(),
               f"{self.name} record {i} (step {ev.step}): unknown fields ({ev.ByteSize() - copy.ByteSize()} bytes) "
               f"in a nested message")
        for num, wt, summ in wire_fields(data):
            if num != 5:
                continue
            for vnum, _, val in wire_fields(summ):
                if vnum != 1:
                    continue
                for hnum, _, histo in wire_fields(val):
                    if hnum != 5:
                        continue
                    for fnum, fwt, fval in wire_fields(histo):
                        if fnum in (6, 7):
                            expect(fwt == 2 and len(fval) % 8 == 0,
                                   f"{self.name} record {i}: histogram field {fnum} not packed doubles "
                                   f"(wire type {fwt})")

    def _structure_checks(self, t0, t1):
        m = re.fullmatch(r"events\.out\.tfevents\.(\d+)\.(.+)\.(\d+)\.(\d+)", self.name)
        expect(m is not None, f"{self.name}: not events.out.tfevents.<unix seconds>.<host>.<pid>.<n>")
        if m:
            secs, host = int(m.group(1)), m.group(2)
            self.seconds = secs
            host_here = socket.gethostname()
            expect(host in (host_here, host_here.split(".")[0]), f"{self.name}: host {host!r}, this host is {host_here!r}")
            if t0 is not None:
                expect(int(t0) - 1 <= secs <= t1 + 1, f"{self.name}: {secs} s is not within the run ({t0:.0f}..{t1:.0f})")
        if t0 is not None:
            bad = [(s, w) for s, w, _, _ in self.events if not (t0 - 1 <= w <= t1 + 1)]
            expect(not bad, f"{self.name}: wall times outside the run ({t0:.1f}..{t1:.1f}): {bad[:5]}")
        seen, last = set(), -1
        for i, (step, _, kind, tags) in enumerate(self.events):
            if i >= 1 and set(tags) != {"deck"}:  # the contract gives the deck record no step
                expect(step >= last, f"{self.name} record {i}: step {step} after step {last}")
                last = max(last, step)
            for t in tags:
                expect((step, t) not in seen, f"{self.name}: tag {t!r} twice at step {step}")
                seen.add((step, t))
                expect(t == "deck" or re.match(r"(train|eval|param_norm|grad_norm|moe|memory)/", t),
                       f"{self.name}: tag {t!r} at step {step} is none of the contract's")

    # ----- look-ups
    def at(self, step, prefix):
        """{tag: value} of the scalars at step whose tag starts with prefix (all events)."""
        out = {}
        for s, _, _, tags in self.events:
            if s == step:
                out.update({t: v for t, (k, v) in tags.items() if k == "scalar" and t.startswith(prefix)})
        return out

    def histo(self, step, tag):
        for s, _, _, tags in self.events:
            if s == step and tag in tags and tags[tag][0] == "histo":
                return tags[tag][1]
        return None

    def steps_with(self, prefix):
        return sorted({s for s, _, _, tags in self.events for t in tags if t.startswith(prefix)})

    def tags(self):
        return sorted({t for _, _, _, tags in self.events for t in tags})


# ---------------------------------------------------------------------------------------------
# checks of one file

def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def f32_bits(x):
    return np.float32(x).tobytes()


def same_f32(tb_value, csv_text):
    """The scalar equals numpy.float32 of the CSV's double exactly (NaN matches NaN)."""
    want = np.float32(float(csv_text))
    got = np.float32(tb_value)
    if np.isnan(want) or np.isnan(got):
        return bool(np.isnan(want) and np.isnan(got))
    return f32_bits(got) == f32_bits(want)


def deck_of(checkpoint):
    import h5py
    with h5py.File(checkpoint, "r") as f:
        d = f.attrs["deck"]
    return d.decode() if isinstance(d, bytes) else str(d)


def check_header(ef, first_iter, deck):
    """Records 1-3: file_version, session_log START at the first iteration, the deck."""
    ev = ef.parsed
    expect(len(ev) >= 3, f"{ef.name}: {len(ev)} records")
    if len(ev) < 3:
        return
    expect(ev[0].WhichOneof("what") == "file_version" and ev[0].file_version == "brain.Event:2" and ev[0].step == 0,
           f"{ef.name} record 0: {ev[0].WhichOneof('what')} {ev[0].file_version!r} step {ev[0].step}, "
           f"not file_version 'brain.Event:2' at step 0")
    expect(ev[1].WhichOneof("what") == "session_log" and ev[1].session_log.status == ef.pb.SessionLog.START
           and ev[1].step == first_iter,
           f"{ef.name} record 1: {ev[1].WhichOneof('what')} status {ev[1].session_log.status} step {ev[1].step}, "
           f"not a session_log START at step {first_iter}")
    starts = [i for i, e in enumerate(ev) if e.WhichOneof("what") == "session_log"]
    expect(starts == [1] or ev[1].WhichOneof("what") != "session_log",
           f"{ef.name}: session_log records at {starts}, expected record 1 only")
    e = ev[2]
    vals = list(e.summary.value) if e.WhichOneof("what") == "summary" else []
    expect(len(vals) == 1 and vals[0].tag == "deck", f"{ef.name} record 2: not the one-value summary `deck`")
    if not (len(vals) == 1 and vals[0].tag == "deck"):
        return
    v = vals[0]
    expect(v.metadata.plugin_data.plugin_name == "text",
           f"{ef.name}: deck summary plugin {v.metadata.plugin_data.plugin_name!r}, not 'text'")
    expect(v.WhichOneof("value") == "tensor", f"{ef.name}: deck summary holds {v.WhichOneof('value')}, not a tensor")
    t = v.tensor
    expect(t.dtype == 7, f"{ef.name}: deck tensor dtype {t.dtype}, not DT_STRING (7)")
    expect(len(t.tensor_shape.SerializeToString()) == 0, f"{ef.name}: deck tensor shape is not a scalar's")
    expect(len(t.string_val) == 1, f"{ef.name}: deck tensor holds {len(t.string_val)} strings, not 1")
    if len(t.string_val) != 1:
        return
    text = t.string_val[0].decode("utf-8")
    want_lines = deck[:-1].split("\n") if deck.endswith("\n") else deck.split("\n")
    got_lines = text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
    ok = len(got_lines) == len(want_lines)
    bad = None
    blank_bare = 0
    for i, (g, w) in enumerate(zip(got_lines, want_lines)):
        if g == "    " + w:
            continue
        if w == "" and g == "":
            blank_bare += 1
            continue
        ok, bad = False, (i, g, w)
        break
    expect(ok, f"{ef.name}: the deck summary is not the checkpoint's deck indented by four spaces "
               f"({len(got_lines)} lines against {len(want_lines)}; first difference {bad})")
    if ok:
        print(f"  {ef.name}: deck summary = the checkpoint's deck ({len(want_lines)} lines) indented by 4 spaces"
              + (f" ({blank_bare} blank lines left unindented)" if blank_bare else "")
              + ("" if text.endswith("\n") == deck.endswith("\n") else
                 f" (trailing newline: deck {deck.endswith(chr(10))}, summary {text.endswith(chr(10))})"))


def check_train(ef, rows, iters, moe_rows=None):
    """Every iteration in iters: one event with train/<column> = float32 of the CSV row exactly;
    with MoE the same event carries moe/layer_<L>/{max_load,expert_<e>} of the .moe.csv rows."""
    by_iter = {int(r["iteration"]): r for r in rows}
    cols = [c for c in rows[0].keys() if c != "iteration"]
    want_tags = {"train/" + c for c in cols}
    steps = ef.steps_with("train/")
    expect(steps == list(iters), f"{ef.name}: train/ scalars at steps {steps}, expected {list(iters)}")
    compared = 0
    for k in iters:
        evs = [tags for s, _, _, tags in ef.events if s == k and any(t.startswith("train/") for t in tags)]
        if not expect(len(evs) == 1, f"{ef.name}: {len(evs)} events with train/ scalars at step {k}, expected 1"):
            continue
        tags = evs[0]
        have = {t for t in tags if t.startswith("train/")}
        expect(have == want_tags, f"{ef.name} step {k}: train/ tags missing {sorted(want_tags - have)}, "
                                  f"extra {sorted(have - want_tags)}")
        if k not in by_iter:
            expect(False, f"{ef.name}: no CSV row for iteration {k}")
            continue
        for c in cols:
            t = "train/" + c
            if t in tags:
                kind, v = tags[t]
                compared += 1
                expect(kind == "scalar" and same_f32(v, by_iter[k][c]),
                       f"{ef.name} step {k}: {t} = {v!r} ({kind}), float32 of the CSV's {by_iter[k][c]} is "
                       f"{np.float32(float(by_iter[k][c]))!r}")
        if moe_rows is not None:
            mine = [r for r in moe_rows if int(r["iteration"]) == k]
            expect(mine, f"no .moe.csv rows at iteration {k}")
            want_moe = set()
            for r in mine:
                L = r["layer"]
                for c in r:
                    if c in ("iteration", "layer"):
                        continue
                    t = f"moe/layer_{L}/{c}"
                    want_moe.add(t)
                    if expect(t in tags, f"{ef.name} step {k}: {t} missing from the train event (moe tags there: "
                                         f"{sorted(x for x in tags if x.startswith('moe/'))[:8]})"):
                        compared += 1
                        expect(same_f32(tags[t][1], r[c]), f"{ef.name} step {k}: {t} = {tags[t][1]!r}, "
                                                           f"float32 of the .moe.csv's {r[c]} is {np.float32(float(r[c]))!r}")
            have_moe = {t for t in tags if t.startswith("moe/")}
            expect(have_moe == want_moe, f"{ef.name} step {k}: moe tags extra {sorted(have_moe - want_moe)}")
    other_moe = [s for s in ef.steps_with("moe/") if s not in iters]
    expect(not other_moe, f"{ef.name}: moe/ tags at steps {other_moe}")
    return compared


def check_eval(ef, rows, iters):
    """eval/<column> at every evaluation of the run (the .eval.csv rows within iters), nowhere else."""
    rows = [r for r in rows if int(r["iteration"]) in iters]
    expect(rows, f"{ef.name}: the .eval.csv holds no row of iterations {list(iters)}")
    steps = ef.steps_with("eval/")
    want_steps = [int(r["iteration"]) for r in rows]
    expect(steps == want_steps, f"{ef.name}: eval/ scalars at steps {steps}, the .eval.csv at {want_steps}")
    n = 0
    for r in rows:
        k = int(r["iteration"])
        got = ef.at(k, "eval/")
        cols = [c for c in r if c != "iteration"]
        expect(set(got) == {"eval/" + c for c in cols}, f"{ef.name} step {k}: eval tags {sorted(got)}, columns {cols}")
        for c in cols:
            if "eval/" + c in got:
                n += 1
                expect(same_f32(got["eval/" + c], r[c]), f"{ef.name} step {k}: eval/{c} = {got['eval/' + c]!r}, "
                                                         f"float32 of the .eval.csv's {r[c]} is {np.float32(float(r[c]))!r}")
    return n


def check_memory(ef, mem_json, last_iter):
    """memory/rank_<r>/<figure> at the last iteration: float32 of every figure of the JSON."""
    mem = json.load(open(mem_json))
    got = ef.at(last_iter, "memory/")
    steps = ef.steps_with("memory/")
    expect(steps == [last_iter], f"{ef.name}: memory/ scalars at steps {steps}, expected [{last_iter}]")
    coords = {"rank", "pp", "tp", "dp", "cp"}
    want = {}
    for r in mem["ranks"]:
        for k, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                want[f"memory/rank_{r['rank']}/{k}"] = (v, k in coords)
    missing = sorted(t for t, (_, coord) in want.items() if not coord and t not in got)
    extra = sorted(t for t in got if t not in want)
    expect(not missing, f"{ef.name}: memory figures missing at step {last_iter}: {missing[:10]}")
    expect(not extra, f"{ef.name}: memory tags with no figure of {os.path.basename(mem_json)}: {extra[:10]}")
    n = 0
    for t, v in got.items():
        if t in want:
            n += 1
            expect(f32_bits(v) == f32_bits(want[t][0]), f"{ef.name}: {t} = {v!r}, float32 of the JSON's {want[t][0]} "
                                                        f"is {np.float32(want[t][0])!r}")
    return n


def norms_from_dump(path):
    """{'layer_<LLL>' | 'outside_layers': norm} in float64 from a parameter or gradient dump (the
    checkpoint names: model/layers/<i>/... is transformer layer i, every other model tensor is
    outside the layers; a tied copy is stored once)."""
    import h5py
    sq = {}
    with h5py.File(path, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in names:
            if not n.startswith("model/"):
                continue
            m = re.match(r"model/layers/(\d+)/", n)
            key = f"layer_{int(m.group(1)):03d}" if m else "outside_layers"
            a = f[n][()].astype(np.float64)
            sq[key] = sq.get(key, 0.0) + float(np.sum(a * a))
    return {k: math.sqrt(v) for k, v in sq.items()}


def check_histogram(ef, step, family, layers):
    """family/by_layer against the family/layer_<LLL> scalars of the same step."""
    h = ef.histo(step, f"{family}/by_layer")
    if not expect(h is not None, f"{ef.name} step {step}: no {family}/by_layer histogram"):
        return
    sc = ef.at(step, f"{family}/layer_")
    vals = np.array([sc.get(f"{family}/layer_{i:03d}", np.nan) for i in range(layers)], dtype=np.float64)
    if not expect(not np.isnan(vals).any(), f"{ef.name} step {step}: {family} layer scalars {sorted(sc)}"):
        return
    B = min(30, layers)
    expect(h.num == layers, f"{ef.name} step {step}: {family}/by_layer num {h.num}, layers {layers}")
    expect(f32_bits(h.min) == f32_bits(vals.min()) and f32_bits(h.max) == f32_bits(vals.max()),
           f"{ef.name} step {step}: {family}/by_layer min/max {h.min!r}/{h.max!r}, the layer scalars' "
           f"{vals.min()!r}/{vals.max()!r}")
    u = 2.0 ** -23  # float32 rounding of each scalar is within 2^-24 relative
    expect(abs(h.sum - vals.sum()) <= u * np.abs(vals).sum(),
           f"{ef.name} step {step}: {family}/by_layer sum {h.sum!r}, the scalars' {vals.sum()!r}")
    expect(abs(h.sum_squares - (vals ** 2).sum()) <= 2 * u * (vals ** 2).sum(),
           f"{ef.name} step {step}: {family}/by_layer sum_squares {h.sum_squares!r}, the scalars' {(vals ** 2).sum()!r}")
    lim, cnt = list(h.bucket_limit), list(h.bucket)
    if not expect(len(lim) == B and len(cnt) == B, f"{ef.name} step {step}: {family}/by_layer has {len(lim)} limits "
                                                   f"and {len(cnt)} buckets, expected {B}"):
        return
    scale = max(abs(h.min), abs(h.max))
    want = [h.min + (h.max - h.min) * (i + 1) / B for i in range(B)]
    want[-1] = h.max
    worst = max(abs(a - b) for a, b in zip(lim, want))
    expect(lim[-1] == h.max and worst <= 4 * np.finfo(np.float64).eps * scale,
           f"{ef.name} step {step}: {family}/by_layer limits {lim}, expected {want}")
    expect(all(c == int(c) and c >= 0 for c in cnt) and sum(cnt) == layers,
           f"{ef.name} step {step}: {family}/by_layer counts {cnt} (sum {sum(cnt)}, layers {layers})")
    # each norm in (previous limit, limit]: the cumulative count up to bucket k lies between the
    # norms surely at or below limit k and those possibly so (the scalars are float32 of the norms)
    cum = 0.0
    for k in range(B):
        cum += cnt[k]
        lo = int(np.sum(vals * (1 + u) <= lim[k]))
        hi = int(np.sum(vals * (1 - u) <= lim[k]))
        if not expect(lo <= cum <= hi, f"{ef.name} step {step}: {family}/by_layer counts {cnt} with limits {lim} "
                                       f"do not place the layer norms {vals.tolist()} (buckets 0..{k} hold {cum}, "
                                       f"{lo}..{hi} of the norms are at or below {lim[k]!r})"):
            break


def check_norms(ef, hist_steps, layers, csv_rows, param_dumps, grad_dumps, deviations):
    """The histogram records: at exactly hist_steps; per-layer scalars against the dumps; the
    grad norms' squares sum to train/grad_norm; the two histograms."""
    by_iter = {int(r["iteration"]): r for r in csv_rows}
    want_layer_tags = {f"layer_{i:03d}" for i in range(layers)} | {"outside_layers"}
    for family in ("param_norm", "grad_norm"):
        steps = ef.steps_with(family + "/")
        expect(steps == list(hist_steps), f"{ef.name}: {family}/ records at steps {steps}, expected {list(hist_steps)}")
    for k in hist_steps:
        for family in ("param_norm", "grad_norm"):
            sc = ef.at(k, family + "/")
            names = {t.split("/", 1)[1] for t in sc}
            expect(names == want_layer_tags, f"{ef.name} step {k}: {family} scalars {sorted(names)}, expected "
                                             f"{sorted(want_layer_tags)}")
            check_histogram(ef, k, family, layers)
        g = ef.at(k, "grad_norm/")
        total = math.sqrt(sum(float(v) ** 2 for v in g.values()))
        tg = ef.at(k, "train/grad_norm").get("train/grad_norm")
        if expect(tg is not None, f"{ef.name} step {k}: no train/grad_norm"):
            rel = abs(total - tg) / abs(tg)
            deviations.setdefault("total", []).append(rel)
            expect(rel <= TOTAL_REL, f"{ef.name} step {k}: sqrt(sum grad_norm/*^2) = {total!r}, train/grad_norm "
                                     f"{tg!r} (CSV {by_iter[k]['grad_norm']}): relative {rel:.2e}")
        for family, dumps in (("param_norm", param_dumps), ("grad_norm", grad_dumps)):
            if k not in dumps:
                continue
            ref = norms_from_dump(dumps[k])
            sc = ef.at(k, family + "/")
            expect(set(ref) == want_layer_tags, f"{dumps[k]}: groups {sorted(ref)} (the dump's names changed?)")
            for name, r in sorted(ref.items()):
                t = f"{family}/{name}"
                if t not in sc:
                    continue
                rel = abs(float(sc[t]) - r) / r
                deviations.setdefault(family, []).append(rel)
                expect(rel <= PER_TENSOR_REL, f"{ef.name} step {k}: {t} = {sc[t]!r}, recomputed from "
                                              f"{os.path.relpath(dumps[k])} in float64 {r!r}: relative {rel:.2e}")
            if family == "param_norm":
                tot = math.sqrt(sum(v * v for v in ref.values()))
                got = math.sqrt(sum(float(v) ** 2 for v in sc.values()))
                expect(abs(got - tot) <= PER_TENSOR_REL * tot, f"{ef.name} step {k}: the param norms' squares sum "
                                                               f"to {got ** 2!r}, the parameters' norm^2 is {tot ** 2!r}")


# ---------------------------------------------------------------------------------------------
# the runs

class Ctx:
    def __init__(self, a):
        self.app, self.deck, self.shards, self.mpiexec = a.app, a.deck, a.shards, a.mpiexec
        self.moe_deck = os.path.join(os.path.dirname(os.path.abspath(a.deck)), "moe_tiny_ci.ini")
        self.work = a.work
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)

    def cmd(self, np_, *extra, deck=None):
        base = [self.app, "--deck", deck or self.deck, "--data.train_shards", self.shards]
        if np_ > 1 or self.mpiexec:
            base = [self.mpiexec or "mpiexec", "-n", str(np_)] + base
        return base + list(extra)

    def path(self, *p):
        return os.path.join(self.work, *p)

    def train(self, np_, *extra, deck=None):
        """Runs one training; returns (output, start time, end time)."""
        cmd = self.cmd(np_, *extra, deck=deck)
        t0 = time.time()
        _, out, dt = run(cmd)
        t1 = time.time()
        assert_layout(cmd, out)
        print(f"  ran {' '.join(os.path.basename(x) if x == self.app else x for x in cmd[:3])} ... "
              f"({dt:.1f} s)", flush=True)
        return out, t0, t1


def event_files(d):
    return sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))


def tensorboard_package_missing():
    """Why Python's tensorboard package is not here (None when it is installed)."""
    import importlib.util
    try:
        found = importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError) as e:
        return f"looking for it raised {e!r}"
    return None if found else f"Python's tensorboard package is not installed for {sys.executable}"


def check_tensorboard_package(c):
    """TensorBoard's own EventAccumulator (the tensorboard package) reads the event files of a run
    and its resume (np=2, tp=2, 4 iterations then 6): its train/loss series, steps 1..6, equals the
    CSV's float32 losses. Exit 77 where the package is not installed; its reader not finishing within
    TB_READER_S is a failure (a reader that hangs on the files is a bug, not a reason to skip)."""
    missing = tensorboard_package_missing()
    if missing:
        print(f"SKIPPED (77): {missing}; TensorBoard's own reader cannot be compared")
        raise SystemExit(77)
    tb, m, ck = c.path("A_tb"), c.path("A_m.csv"), c.path("A_ck")
    common = ["--parallel.tp", "2", "--model.num_layers", str(LAYERS), "--log.tensorboard_dir", tb,
              "--log.histogram_interval", "2", "--log.metrics_file", m, "--eval.interval", "2",
              "--checkpoint.save", ck, "--checkpoint.interval", "2"]
    c.train(2, *common, "--train.iters", "4")
    first = event_files(tb)
    # the resumed run's file must have a later name (TensorBoard reads a directory's files in name order)
    t_first = int(first[0].split("tfevents.")[1].split(".")[0]) if first else 0
    while int(time.time()) <= t_first:
        time.sleep(0.05)
    c.train(2, *common, "--train.iters", "6", "--checkpoint.load", ck)
    files = event_files(tb)
    assert len(files) == 2, f"{tb} holds {len(files)} event files after the resume, not 2: {files}"
    rows = read_csv(m)
    code = (
        "import json, sys\n"
        "from tensorboard.backend.event_processing import event_accumulator as ea\n"
        "acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})\n"
        "acc.Reload()\n"
        "print('SCALARS', json.dumps([[e.step, e.value] for e in acc.Scalars('train/loss')]))\n")
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-c", code, tb], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=TB_READER_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"FAILED: TensorBoard's EventAccumulator did not finish reading {tb} in {TB_READER_S} s")
    line = [l for l in p.stdout.splitlines() if l.startswith("SCALARS")]
    assert p.returncode == 0 and line, f"TensorBoard's EventAccumulator failed on {tb} (exit {p.returncode}):\n" \
                                       f"{p.stdout[-3000:]}"
    series = json.loads(line[-1].split(" ", 1)[1])
    steps = [s for s, _ in series]
    expect(steps == [int(r["iteration"]) for r in rows],
           f"TensorBoard's EventAccumulator: train/loss at steps {steps}, the CSV's {[r['iteration'] for r in rows]}")
    bad = [(s, v) for s, v in series if str(s) not in {r["iteration"] for r in rows}
           or not same_f32(v, next(r["loss"] for r in rows if int(r["iteration"]) == s))]
    expect(not bad, f"TensorBoard's EventAccumulator: train/loss values differ from the CSV at {bad}")
    if FAILURES:
        raise SystemExit(f"{len(FAILURES)} check(s) failed; the first: {FAILURES[0]}")
    print(f"TensorBoard's EventAccumulator ({time.time() - t0:.1f} s) reads {len(series)} train/loss scalars of "
          f"both files, equal to the CSV's float32 losses")
    shutil.rmtree(c.work, ignore_errors=True)


def check_tensorboard(c):
    t_start = time.time()
    assert crc32c(b"123456789") == 0xE3069283, f"crc32c self-check: {crc32c(b'123456789'):#010x}"
    pb = load_pb(c.work)
    deviations = {}
    counts = {"scalars compared": 0}

    # ---- A: np=2, tp=2, 4 iterations, then resumed to 6
    print("A: np=2 tp=2, 4 iterations, checkpoints every 2, then resumed to 6", flush=True)
    tb, m, mem, ck = c.path("A_tb"), c.path("A_m.csv"), c.path("A_mem.json"), c.path("A_ck")
    common = ["--parallel.tp", "2", "--model.num_layers", str(LAYERS), "--log.tensorboard_dir", tb,
              "--log.histogram_interval", "2", "--log.metrics_file", m, "--log.memory_file", mem,
              "--eval.interval", "2", "--checkpoint.save", ck, "--checkpoint.interval", "2"]
    _, t0, t1 = c.train(2, *common, "--train.iters", "4", "--debug.dump_params", c.path("A_params"),
                        "--debug.dump_params_iters", "2,4")
    files = event_files(tb)
    assert len(files) == 1, f"run A wrote {len(files)} event files in {tb}: {os.listdir(tb) if os.path.isdir(tb) else 'no directory'}"
    first = EventFile(pb, files[0], t0, t1)
    sha_first = first.sha256
    rows_before = read_csv(m)
    shutil.copy(mem, c.path("A_mem_4.json"))
    shutil.copy(m, c.path("A_m_4.csv"))
    shutil.copy(c.path("A_m.eval.csv"), c.path("A_m_4.eval.csv"))
    print(f"  {first.name}: {len(first.records)} records, {len(first.raw)} bytes, sha256 {sha_first[:16]}...")
    # the resumed run's file must have a later name (TensorBoard reads a directory's files in name order)
    while int(time.time()) <= getattr(first, "seconds", 0):
        time.sleep(0.05)
    _, t2, t3 = c.train(2, *common, "--train.iters", "6", "--checkpoint.load", ck, "--debug.dump_params",
                        c.path("A_params6"), "--debug.dump_params_iters", "6")
    files = event_files(tb)
    expect(len(files) == 2, f"after the resume {tb} holds {len(files)} event files: {files}")
    expect(files[0] == first.path, f"the first event file {first.name} is gone or not first by name: {files}")
    now = hashlib.sha256(open(first.path, "rb").read()).hexdigest()
    expect(now == sha_first, f"the resumed run changed the first event file (sha256 {sha_first} -> {now})")
    rows = read_csv(m)
    expect([r["iteration"] for r in rows] == [str(i) for i in range(1, 7)],
           f"metrics CSV after the resume: iterations {[r['iteration'] for r in rows]}")
    expect(rows[:4] == rows_before, "the resume changed the metrics CSV's rows 1..4")
    eval_rows = read_csv(c.path("A_m.eval.csv"))
    # first file: iterations 1..4
    check_header(first, 1, deck_of(os.path.join(ck, "iter_0000004", "checkpoint.h5")))
    expect(deck_of(os.path.join(ck, "iter_0000002", "checkpoint.h5")) == deck_of(os.path.join(ck, "iter_0000004", "checkpoint.h5")),
           "the two checkpoints of run A store other decks")
    counts["scalars compared"] += check_train(first, rows_before, range(1, 5))
    counts["scalars compared"] += check_eval(first, read_csv(c.path("A_m_4.eval.csv")), range(1, 5))
    check_norms(first, [2, 4], LAYERS, rows_before,
                {k: c.path("A_params", f"iter_{k:07d}.h5") for k in (2, 4)}, {}, deviations)
    counts["scalars compared"] += check_memory(first, c.path("A_mem_4.json"), 4)
    # second file: iterations 5..6
    second = [p for p in files if p != first.path]
    if expect(len(second) == 1, f"no second event file after the resume: {files}"):
        ef2 = EventFile(pb, second[0], t2, t3)
        print(f"  {ef2.name}: {len(ef2.records)} records, {len(ef2.raw)} bytes")
        check_header(ef2, 5, deck_of(os.path.join(ck, "iter_0000006", "checkpoint.h5")))
        counts["scalars compared"] += check_train(ef2, rows, range(5, 7))
        counts["scalars compared"] += check_eval(ef2, eval_rows, range(5, 7))
        check_norms(ef2, [6], LAYERS, rows, {6: c.path("A_params6", "iter_0000006.h5")}, {}, deviations)
        counts["scalars compared"] += check_memory(ef2, mem, 6)

    # ---- G: np=2, pp=2, iteration 1's gradients
    print("G: np=2 pp=2, 1 iteration, gradients and parameters of iteration 1 dumped", flush=True)
    tb, m, mem = c.path("G_tb"), c.path("G_m.csv"), c.path("G_mem.json")
    _, t0, t1 = c.train(2, "--parallel.pp", "2", "--model.num_layers", str(LAYERS), "--train.iters", "1",
                        "--eval.interval", "0", "--log.tensorboard_dir", tb, "--log.histogram_interval", "1",
                        "--log.metrics_file", m, "--log.memory_file", mem, "--checkpoint.save", c.path("G_ck"),
                        "--debug.dump_grads", c.path("G_grads.h5"), "--debug.dump_params", c.path("G_params"),
                        "--debug.dump_params_iters", "1")
    files = event_files(tb)
    if expect(len(files) == 1, f"run G wrote {len(files)} event files"):
        ef = EventFile(pb, files[0], t0, t1)
        check_header(ef, 1, deck_of(os.path.join(c.path("G_ck"), "iter_0000001", "checkpoint.h5")))
        counts["scalars compared"] += check_train(ef, read_csv(m), range(1, 2))
        expect(ef.steps_with("eval/") == [], f"{ef.name}: eval/ scalars without evaluations")
        check_norms(ef, [1], LAYERS, read_csv(m), {1: c.path("G_params", "iter_0000001.h5")},
                    {1: c.path("G_grads.h5")}, deviations)
        counts["scalars compared"] += check_memory(ef, mem, 1)

    # ---- B: one rank, MoE
    print("B: one rank, MoE (moe_tiny_ci), 3 iterations", flush=True)
    tb, m, mem = c.path("B_tb"), c.path("B_m.csv"), c.path("B_mem.json")
    _, t0, t1 = c.train(1, "--train.iters", "3", "--eval.interval", "3", "--log.tensorboard_dir", tb,
                        "--log.histogram_interval", "3", "--log.metrics_file", m, "--log.memory_file", mem,
                        "--checkpoint.save", c.path("B_ck"), "--debug.dump_params", c.path("B_params"),
                        "--debug.dump_params_iters", "3", deck=c.moe_deck)
    rows = read_csv(m)
    moe_cols = [x for x in rows[0] if x.startswith("moe_")]
    expect(moe_cols == ["moe_aux_loss", "moe_z_loss", "moe_max_load", "moe_dropped"],
           f"MoE run: the metrics CSV's MoE columns are {moe_cols}")
    files = event_files(tb)
    if expect(len(files) == 1, f"run B wrote {len(files)} event files"):
        ef = EventFile(pb, files[0], t0, t1)
        check_header(ef, 1, deck_of(os.path.join(c.path("B_ck"), "iter_0000003", "checkpoint.h5")))
        moe_rows = read_csv(c.path("B_m.moe.csv"))
        expect(len(moe_rows) == 3 * 2, f"the .moe.csv holds {len(moe_rows)} rows, expected 3 iterations x 2 layers")
        counts["scalars compared"] += check_train(ef, rows, range(1, 4), moe_rows=moe_rows)
        counts["scalars compared"] += check_eval(ef, read_csv(c.path("B_m.eval.csv")), range(1, 4))
        check_norms(ef, [3], 2, rows, {3: c.path("B_params", "iter_0000003.h5")}, {}, deviations)
        counts["scalars compared"] += check_memory(ef, mem, 3)

    for k, v in sorted(deviations.items()):
        print(f"largest relative deviation, {k}: {max(v):.2e} over {len(v)} norms")
    print(f"{counts['scalars compared']} scalars compared exactly; {time.time() - t_start:.1f} s")
    if FAILURES:
        raise SystemExit(f"{len(FAILURES)} check(s) failed; the first: {FAILURES[0]}")
    shutil.rmtree(c.work, ignore_errors=True)


def main():
    check_main({"tensorboard": check_tensorboard, "tensorboard_package": check_tensorboard_package}, Ctx,
               mpiexec_default="")


if __name__ == "__main__":
    main()
