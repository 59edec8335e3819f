#!/usr/bin/env python3
"""Megatron-LM's indexed dataset format (.bin/.idx), written and read with numpy alone, from
the public description of the format (Megatron-Core's datasets README: an index header, a
version, a dtype code, the sequence and document counts, then the sequence lengths, the
sequence byte pointers and the document indices). Independent of Trident's C++ reader and
writer (src/data/indexed_dataset.*), so that the two can be checked against each other.

  megatron_indexed.py from-hdf5 SHARD... --output-prefix P [--dtype auto|uint16|int32]
      one pair per Trident HDF5 shard (P.bin/.idx for one shard, P_NNNNN.* for several);
      documents become sequences, or each sentence one when the shard has /sentence_offsets
  megatron_indexed.py show P
      prints the header and counts of P.idx
"""
import argparse
import struct
import sys

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
CODES = {np.dtype(v).name: k for k, v in DTYPES.items()}


def megatron_dtype(vocab_size):
    """Megatron's rule: uint16 for a vocabulary below 65500 tokens, else int32."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def write(prefix, documents, dtype):
    """documents: a list of documents, each a list of sequences (1-D integer arrays)."""
    dtype = np.dtype(dtype)
    lengths, docs = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                a = np.asarray(seq)
                assert a.size == 0 or (a.min() >= np.iinfo(dtype).min and a.max() <= np.iinfo(dtype).max)
                f.write(a.astype(dtype).astype(dtype.newbyteorder("<")).tobytes())
                lengths.append(a.size)
            docs.append(len(lengths))
    lengths = np.array(lengths, dtype="<i4")
    pointers = np.zeros(len(lengths), dtype="<i8")
    if len(lengths) > 1:
        pointers[1:] = np.cumsum(lengths[:-1].astype(np.int64)) * dtype.itemsize
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype.name]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(docs)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(np.array(docs, dtype="<i8").tobytes())


def read(prefix):
    """Returns (dtype, lengths, pointers, document indices, tokens) of a pair."""
    raw = open(prefix + ".idx", "rb").read()
    assert raw[:9] == MAGIC, "wrong magic"
    version, = struct.unpack_from("<Q", raw, 9)
    code, = struct.unpack_from("<B", raw, 17)
    n_seq, n_doc = struct.unpack_from("<QQ", raw, 18)
    assert version == 1
    at = 34
    lengths = np.frombuffer(raw, "<i4", n_seq, at)
    at += 4 * n_seq
    pointers = np.frombuffer(raw, "<i8", n_seq, at)
    at += 8 * n_seq
    docs = np.frombuffer(raw, "<i8", n_doc, at)
    assert at + 8 * n_doc == len(raw)
    dtype = np.dtype(DTYPES[code]).newbyteorder("<")
    tokens = np.fromfile(prefix + ".bin", dtype=dtype)
    return np.dtype(DTYPES[code]), lengths, pointers, docs, tokens


def documents_of_shard(path):
    """A Trident HDF5 shard as a list of documents, each a list of sequences; its vocab size."""
    import h5py
    with h5py.File(path, "r") as f:
        tokens = f["tokens"][:].astype(np.int64)
        doc = f["document_offsets"][:]
        sent = f["sentence_offsets"][:] if "sentence_offsets" in f else None
        vocab = int(f.attrs["vocab_size"])
    out = []
    for d in range(len(doc) - 1):
        a, b = int(doc[d]), int(doc[d + 1])
        if sent is None:
            out.append([tokens[a:b]] if b > a else [])
        else:
            cuts = [int(s) for s in sent if a <= s <= b]
            out.append([tokens[x:y] for x, y in zip(cuts[:-1], cuts[1:])])
    return out, vocab


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("from-hdf5")
    a.add_argument("shards", nargs="+")
    a.add_argument("--output-prefix", required=True)
    a.add_argument("--dtype", default="auto", choices=["auto", "uint16", "int32"])
    s = sub.add_parser("show")
    s.add_argument("prefix")
    args = p.parse_args()
    if args.cmd == "from-hdf5":
        shards = sorted(args.shards)
        for k, shard in enumerate(shards):
            docs, vocab = documents_of_shard(shard)
            dtype = megatron_dtype(vocab) if args.dtype == "auto" else np.dtype(args.dtype)
            prefix = args.output_prefix if len(shards) == 1 else "%s_%05d" % (args.output_prefix, k)
            write(prefix, docs, dtype)
            print(f"{shard} -> {prefix}: {len(docs)} documents, dtype {np.dtype(dtype).name}")
    else:
        dtype, lengths, _, docs, tokens = read(args.prefix)
        print(f"{args.prefix}: dtype {dtype.name}, {len(lengths)} sequences, {len(docs) - 1} documents, "
              f"{tokens.size} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
