// Encodes a UTF-8 file with the JavaScript GPT-2 encoder of the npm package gpt-3-encoder
// (an implementation independent of Trident's) and writes the token ids, one per line.
//   node encode_js.js PATH/TO/package/Encoder.js INPUT OUTPUT
// The package's encode() concatenates arrays per piece (quadratic in the text length), so the
// text is cut into chunks of a few hundred characters at boundaries where GPT-2's pre-tokenizer
// always splits and where what comes after cannot change what comes before: between a
// non-space character and a white-space character. (The piece ending there is a letter, number,
// other-symbol or contraction piece, which stops at white space; the pattern has no
// look-behind, and the only look-ahead, in \s+(?!\S), belongs to white-space runs.)
// Tokenizing the chunks one by one then gives exactly the tokens of the whole text.
'use strict';
const fs = require('fs');
const path = require('path');

if (process.argv.length !== 5) {
  console.error('usage: node encode_js.js Encoder.js INPUT OUTPUT');
  process.exit(2);
}
const encoder = require(path.resolve(process.argv[2]));
const text = fs.readFileSync(process.argv[3], 'utf-8');
const isSpace = (ch) => /\s/u.test(ch);

const t0 = Date.now();
const out = [];
const minChunk = 256;
let start = 0;
for (let i = 1; i < text.length; i++) {
  // boundary between text[i-1] and text[i]
  if (i - start < minChunk || isSpace(text[i - 1]) || !isSpace(text[i])) continue;
  for (const id of encoder.encode(text.slice(start, i))) out.push(id);
  start = i;
}
if (start < text.length) for (const id of encoder.encode(text.slice(start))) out.push(id);
for (const id of out) {
  if (typeof id !== 'number') {
    console.error('encode_js.js: the JS encoder produced an unknown token');
    process.exit(1);
  }
}
fs.writeFileSync(process.argv[4], out.join('\n') + (out.length ? '\n' : ''));
const dt = (Date.now() - t0) / 1000;
console.error(`encode_js.js: ${out.length} tokens in ${dt.toFixed(2)} s`);
