// The OpenAI client library for Node (npm package `openai`, fetched and sha256-checked by
// serve_checks.py) as a real client of serve_gpt. Reads a JSON job from argv[2]:
//   {"baseURL", "apiKey", "model", "prompts": [...], "chat": [{role, content}], "max_tokens", "seed"}
// and prints one JSON object with what each call returned; serve_checks.py compares it with
// generate_gpt.
"use strict";
const OpenAI = require("openai");

async function streamed(iter, chat) {
  let text = "";
  let finish = null;
  let chunks = 0;
  for await (const chunk of iter) {
    chunks += 1;
    for (const c of chunk.choices) {
      text += chat ? c.delta.content || "" : c.text || "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, chunks };
}

async function main() {
  const job = JSON.parse(process.argv[2]);
  const client = new OpenAI({ baseURL: job.baseURL, apiKey: job.apiKey, maxRetries: 0, timeout: 60000 });
  const out = { models: [], completions: [], chat: null, stream: [], chatStream: null, sampled: null };
  const models = await client.models.list();
  for await (const m of models) out.models.push(m.id);
  for (const prompt of job.prompts) {
    const r = await client.completions.create({
      model: job.model, prompt, max_tokens: job.max_tokens, temperature: 0, logprobs: 2 });
    out.completions.push({
      text: r.choices[0].text, finish: r.choices[0].finish_reason, logprobs: r.choices[0].logprobs.token_logprobs,
      top: r.choices[0].logprobs.top_logprobs, usage: r.usage });
    const s = await client.completions.create({
      model: job.model, prompt, max_tokens: job.max_tokens, temperature: 0, stream: true });
    out.stream.push(await streamed(s, false));
  }
  const c = await client.chat.completions.create({
    model: job.model, messages: job.chat, max_tokens: job.max_tokens, temperature: 0, logprobs: true, top_logprobs: 1 });
  out.chat = { text: c.choices[0].message.content, role: c.choices[0].message.role, finish: c.choices[0].finish_reason,
               logprobs: c.choices[0].logprobs.content.map((e) => e.logprob), usage: c.usage };
  const cs = await client.chat.completions.create({
    model: job.model, messages: job.chat, max_tokens: job.max_tokens, temperature: 0, stream: true,
    stream_options: { include_usage: true } });
  out.chatStream = await streamed(cs, true);
  const n2 = await client.completions.create({
    model: job.model, prompt: job.prompts[0], max_tokens: job.max_tokens, temperature: 0.8, top_p: 0.9, n: 2,
    seed: job.seed });
  out.sampled = n2.choices.map((x) => x.text);
  try {
    await client.completions.create({ model: job.model, prompt: job.prompts[0], max_tokens: 0 });
    out.badRequest = "accepted";
  } catch (e) {
    out.badRequest = { status: e.status, message: e.error && e.error.message };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((e) => {
  process.stderr.write(`client error: ${e.stack || e}\n`);
  process.exit(1);
});
