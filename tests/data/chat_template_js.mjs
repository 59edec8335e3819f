// Renders and tokenizes chat records with JavaScript libraries independent of Trident, for
// tests/data/compare_chat_templates.py: the real chat_template text of a tokenizer_config.json
// rendered by @huggingface/jinja, the rendering tokenized by @huggingface/tokenizers (no
// post-processor tokens, as apply_chat_template(tokenize=True) does), and the assistant spans
// found in the rendering by searching for the turn markers given on the command line.
//   node chat_template_js.mjs JINJA.js TOKENIZERS.mjs TOKENIZER_DIR RECORDS OUT MARKER END [--generation-prompt]
// MARKER: the text that opens an assistant's output (its header / generation prompt); END: its
// end-of-turn token. Each assistant message's span runs from after the next MARKER to the end of
// the next END. OUT: one JSON line per record, {"text", "ids", "learned"} or {"error"}.
import fs from "fs";
import path from "path";
import { pathToFileURL } from "url";

const args = process.argv.slice(2);
const genPrompt = args.includes("--generation-prompt");
const [jinjaLib, tokLib, dir, recordsPath, outPath, marker, end] = args.filter((a) => a !== "--generation-prompt");
if (!end) {
  console.error("usage: node chat_template_js.mjs JINJA.js TOKENIZERS.mjs TOKENIZER_DIR RECORDS OUT MARKER END " +
    "[--generation-prompt]");
  process.exit(2);
}
const { Template } = await import(pathToFileURL(path.resolve(jinjaLib)).href);
const { Tokenizer } = await import(pathToFileURL(path.resolve(tokLib)).href);
const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tc = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tok = new Tokenizer(tj, tc);
const special = (v) => (v && typeof v === "object" ? v.content : v);
const template = new Template(tc.chat_template);
const encode = (text) => (text.length ? tok.encode(text, { add_special_tokens: false }).ids : []);

const lines = fs.readFileSync(recordsPath, "utf8").split("\n").filter((l) => l.trim().length);
const out = [];
for (const line of lines) {
  const r = JSON.parse(line);
  let messages = r.messages;
  if (!messages) {
    messages = [];
    if (r.system !== undefined) messages.push({ role: "system", content: r.system });
    messages.push({ role: "user", content: r.prompt }, { role: "assistant", content: r.response });
  }
  let text;
  try {
    text = template.render({
      messages,
      bos_token: special(tc.bos_token) ?? "",
      eos_token: special(tc.eos_token) ?? "",
      add_generation_prompt: genPrompt,
    });
  } catch (e) {
    out.push(JSON.stringify({ error: String(e.message ?? e) }));
    continue;
  }
  const ids = encode(text);
  const learned = new Array(ids.length).fill(0);
  let cursor = 0, missing = "";
  const turns = messages.filter((m) => m.role === "assistant").length;
  for (let k = 0; k < turns && !missing; ++k) {
    const at = text.indexOf(marker, cursor);
    const e = at < 0 ? -1 : text.indexOf(end, at + marker.length);
    if (e < 0) {
      missing = `assistant turn ${k + 1}: no ${JSON.stringify(at < 0 ? marker : end)} in the rendering ` +
        JSON.stringify(text);
      break;
    }
    const a = at + marker.length;
    const b = e + end.length;
    const na = encode(text.slice(0, a)).length, nb = encode(text.slice(0, b)).length;
    for (let t = na; t < nb; ++t) learned[t] = 1;
    cursor = b;
  }
  out.push(JSON.stringify(missing ? { error: missing } : { text, ids, learned }));
}
fs.writeFileSync(outPath, out.join("\n") + (out.length ? "\n" : ""));
