#!/usr/bin/python3
"""Unigram entropy of a tokenized corpus (Trident token shards), in nats per token.

    unigram_entropy.py SHARD_GLOB... [--split-docs 969,30,1] [--split-scope corpus|shard]

H = -sum_v p(v) log p(v), with p the token frequencies of the TRAINING documents. It is the
cross-entropy of the best context-free model, i.e. the loss a language model reaches by
learning token frequencies only: a training curve should fall below it quickly, and a model
stuck at it has learnt no context.

Shards: HDF5 with /tokens (1-D, uint16 or int32) and /document_offsets (int64, n_docs + 1;
document d is tokens[off[d]:off[d+1]]). Globs are expanded and the file names sorted, which is
the documents' input order. Tokens are streamed in chunks, so shards of any size work.

--split-docs a,b,c: Megatron-style train/valid/test split of the DOCUMENTS; only the first
round(a/(a+b+c) * n_docs) documents (the training part) are counted. --split-scope says whether
the split applies to the documents of all shards taken together in order (corpus, default) or
to each shard separately (shard). Without --split-docs every token is counted. Blend weights
(the deck's "w1 prefix1 w2 prefix2" form) are not applied: give one corpus at a time.
"""

import argparse
import glob
import math
import os
import sys

import h5py
import numpy as np

CHUNK = 1 << 24  # tokens per read (64 MiB as int32)


def split_train_docs(n_docs, weights):
    """Number of training documents for a Megatron-style split string 'a,b,c'."""
    w = [float(x) for x in weights]
    total = sum(w)
    if total <= 0 or any(x < 0 for x in w):
        raise ValueError("bad split weights %r" % (weights,))
    return min(n_docs, int(round(w[0] / total * n_docs)))


def count_range(ds, begin, end, counts):
    """Add token counts of ds[begin:end] into counts (grown as needed); returns counts."""
    pos = begin
    while pos < end:
        stop = min(end, pos + CHUNK)
        chunk = np.asarray(ds[pos:stop])
        if chunk.size:
            if chunk.dtype.kind == "i" and chunk.min() < 0:
                raise ValueError("negative token id in %s" % ds.file.filename)
            c = np.bincount(chunk.astype(np.int64, copy=False))
            if c.size > counts.size:
                counts = np.concatenate([counts, np.zeros(c.size - counts.size, np.int64)])
            counts[:c.size] += c
        pos = stop
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("shards", nargs="+", help="shard files or globs")
    ap.add_argument("--split-docs", help="train,valid,test weights over documents, e.g. 969,30,1")
    ap.add_argument("--split-scope", choices=["corpus", "shard"], default="corpus")
    a = ap.parse_args(argv)

    files = []
    for pat in a.shards:
        hits = glob.glob(pat)
        if not hits and os.path.isfile(pat):
            hits = [pat]
        if not hits:
            print("error: no shard matches %r" % pat, file=sys.stderr)
            return 2
        files.extend(hits)
    files = sorted(set(files))
    weights = a.split_docs.split(",") if a.split_docs else None

    try:
        # Document counts first (offsets are small), to place a corpus-wide split.
        ndocs = []
        for fn in files:
            with h5py.File(fn, "r") as f:
                for need in ("tokens", "document_offsets"):
                    if need not in f:
                        raise ValueError("%s: dataset /%s is missing" % (fn, need))
                ndocs.append(f["document_offsets"].shape[0] - 1)
        if weights is not None and a.split_scope == "corpus":
            remaining = split_train_docs(sum(ndocs), weights)
        counts = np.zeros(0, np.int64)
        n_train_docs = 0
        for fn, nd in zip(files, ndocs):
            if weights is None:
                take = nd
            elif a.split_scope == "shard":
                take = split_train_docs(nd, weights)
            else:
                take = min(nd, remaining)
                remaining -= take
            if take == 0:
                continue
            with h5py.File(fn, "r") as f:
                off = f["document_offsets"]
                begin, end = int(off[0]), int(off[take])
                ds = f["tokens"]
                if ds.ndim != 1 or end > ds.shape[0] or begin > end:
                    raise ValueError("%s: document offsets do not fit /tokens %s" % (fn, ds.shape))
                counts = count_range(ds, begin, end, counts)
            n_train_docs += take
    except (OSError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2

    n = int(counts.sum())
    if n == 0:
        print("error: no training tokens", file=sys.stderr)
        return 2
    c = counts[counts > 0].astype(np.float64)
    # H = -sum p log p = log n - (1/n) sum c log c   (numerically stable for large n)
    H = math.log(n) - float(np.dot(c, np.log(c))) / n
    print("%d shard(s), %d training documents, %d tokens, %d distinct token ids"
          % (len(files), n_train_docs, n, c.size))
    print("unigram entropy: %.6f nats" % H)
    return 0


if __name__ == "__main__":
    sys.exit(main())
