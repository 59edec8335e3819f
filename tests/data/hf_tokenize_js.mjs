// Tokenizes documents with the JavaScript implementation of Hugging Face's tokenizers
// (@huggingface/tokenizers, an npm package independent of Trident), for
// tests/data/compare_hf_tokenizers.py.
//   node hf_tokenize_js.mjs LIBRARY.mjs TOKENIZER_DIR DOCS OUT [--no-special] [--rate]
// LIBRARY.mjs: the package's dist/tokenizers.mjs; TOKENIZER_DIR: tokenizer.json and
// tokenizer_config.json. DOCS: records of an 8-byte little-endian length and the bytes, decoded as
// UTF-8 the way Node.js decodes (invalid sequences become U+FFFD). OUT: one JSON line per document,
// {"ids": [...], "decoded": "..."}. Each document is encoded once; --rate: a warm-up pass over all
// of them first (the caches filled), and the encoding rate of the pass after it to stderr.
import fs from "fs";
import path from "path";
import { pathToFileURL } from "url";

const [lib, dir, docsPath, outPath, ...flags] = process.argv.slice(2);
if (!outPath || flags.some((f) => f !== "--no-special" && f !== "--rate")) {
  console.error("usage: node hf_tokenize_js.mjs LIBRARY.mjs TOKENIZER_DIR DOCS OUT [--no-special] [--rate]");
  process.exit(2);
}
const { Tokenizer } = await import(pathToFileURL(path.resolve(lib)).href);
const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const cfgPath = path.join(dir, "tokenizer_config.json");
const tc = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
const tok = new Tokenizer(tj, tc);
const buf = fs.readFileSync(docsPath);
const docs = [];
for (let at = 0; at + 8 <= buf.length; ) {
  const n = Number(buf.readBigUInt64LE(at));
  docs.push(buf.subarray(at + 8, at + 8 + n).toString("utf8"));
  at += 8 + n;
}
const opts = { add_special_tokens: !flags.includes("--no-special") };
const rate = flags.includes("--rate");
if (rate) for (const d of docs) tok.encode(d, opts); // warm-up
const t0 = process.hrtime.bigint();
let tokens = 0, bytes = 0;
const encoded = docs.map((d) => {
  const ids = tok.encode(d, opts).ids;
  tokens += ids.length;
  bytes += Buffer.byteLength(d, "utf8");
  return ids;
});
const s = Number(process.hrtime.bigint() - t0) / 1e9;
// the library refuses to decode no ids: their text is the empty string
const lines = encoded.map((ids) => JSON.stringify({ ids, decoded: ids.length ? tok.decode(ids) : "" }));
fs.writeFileSync(outPath, lines.join("\n") + (lines.length ? "\n" : ""));
if (rate) {
  console.error(`hf_tokenize_js: ${docs.length} documents, ${tokens} tokens, ${bytes} bytes in ${s.toFixed(3)} s: ` +
    `${Math.round(tokens / s)} tokens/s, ${(bytes / s / 1e6).toFixed(2)} MB/s`);
}
