// llama.cpp as the reference: tokenization, detokenization and greedy ids of
// a GGUF file, computed by llama.cpp's prebuilt CPU build (node-llama-cpp).
// Install once: cd bench/llamacpp && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install
//
//   node ref.mjs tokenize MODEL [--special] [--bos] < strings.json   -> [[ids...], ...]
//   node ref.mjs detokenize MODEL [--special] < idlists.json         -> ["text", ...]
//   node ref.mjs greedy MODEL --prompt-ids 1,2,3 --n N [--threads T] [--flash-attention auto|on|off]
//       -> one JSON line:
//       {"ids":[...], "margins":[...], "top":[[id1, logit1, id2, logit2], ...]}
//       margins[i] = top1 - top2 raw logit at step i (llama.cpp's own logits), to
//       judge near-ties; top holds the two best ids and their logits.
//   node ref.mjs info MODEL                                           -> bos/eos/eot, vocab type
//   node ref.mjs tokenize-speed MODEL --text-file F [--repeat N]      -> {"bytes","tokens","seconds","mb_per_s"}
//       tokenizes the file's text N times (default 5; plain, no specials) and reports
//       the throughput, to compare with `exaserve tokenize --text-file F --repeat N`.
//
// Input on stdin is a JSON array; output on stdout is JSON. Nothing is downloaded.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { readFileSync } from "node:fs";

function usage(msg) {
  if (msg) console.error(`ref.mjs: ${msg}`);
  console.error("usage: node ref.mjs tokenize|detokenize|greedy|info MODEL [options]");
  process.exit(2);
}

const [cmd, modelPath, ...rest] = process.argv.slice(2);
if (!cmd || !modelPath) usage();
const flag = (name) => rest.includes(name);
const option = (name, fallback) => {
  const i = rest.indexOf(name);
  return i >= 0 && i + 1 < rest.length ? rest[i + 1] : fallback;
};

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const vocabOnly = cmd === "tokenize" || cmd === "detokenize" || cmd === "info" || cmd === "tokenize-speed";
const model = await llama.loadModel({ modelPath, gpuLayers: 0, vocabOnly });

if (cmd === "tokenize") {
  const texts = JSON.parse(readFileSync(0, "utf8"));
  const out = texts.map((t) => {
    const ids = Array.from(model.tokenize(t, flag("--special")));
    if (flag("--bos") && model.tokens.bos != null && model.tokens.shouldPrependBosToken) ids.unshift(model.tokens.bos);
    return ids;
  });
  process.stdout.write(JSON.stringify(out));
} else if (cmd === "detokenize") {
  const lists = JSON.parse(readFileSync(0, "utf8"));
  process.stdout.write(JSON.stringify(lists.map((ids) => model.detokenize(ids, flag("--special")))));
} else if (cmd === "tokenize-speed") {
  const text = readFileSync(option("--text-file", "") || usage("--text-file is required"), "utf8");
  const repeat = Number(option("--repeat", "5"));
  let n = 0;
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < repeat; i++) n = model.tokenize(text, false).length;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const bytes = Buffer.byteLength(text, "utf8");
  process.stdout.write(JSON.stringify({ bytes, tokens: n, seconds, mb_per_s: (bytes * repeat) / 1e6 / seconds }) + "\n");
} else if (cmd === "info") {
  process.stdout.write(JSON.stringify({
    bos: model.tokens.bos ?? null, eos: model.tokens.eos ?? null, eot: model.tokens.eot ?? null,
    shouldPrependBos: model.tokens.shouldPrependBosToken, vocabularyType: model.vocabularyType,
  }));
} else if (cmd === "greedy") {
  // One controlledEvaluate per step: the prompt in one batch, then each
  // chosen token, asking llama.cpp for its greedy pick and its raw top-2
  // logits (no sampling options: temperature 0, no penalties).
  const prompt = (option("--prompt-ids", "") || usage("--prompt-ids is required")).split(",").map(Number);
  const n = Number(option("--n", "16"));
  const threads = Number(option("--threads", "1"));
  // llama.cpp's default ("auto") runs CPU attention as flash attention, which
  // accumulates V in f16; "off" runs softmax then a V matmul. Both are
  // llama.cpp, and how far they disagree measures its own numeric noise.
  const fa = option("--flash-attention", "auto");
  const flashAttention = fa === "on" ? true : fa === "off" ? false : "auto";
  const context = await model.createContext({ contextSize: Math.max(256, prompt.length + n + 8), threads, flashAttention });
  const seq = context.getSequence();
  const next = { token: true, options: { temperature: 0 },
                 logits: { filter: { tokens: [], includeTop: 2, includeSelected: true } } };
  const ids = [], margins = [], top = [];
  let input = prompt.map((t, i) => (i === prompt.length - 1 ? [t, { generateNext: next }] : t));
  while (ids.length < n) {
    const out = await seq.controlledEvaluate(input);
    const step = out[input.length - 1]?.next;
    if (step?.token == null || step.logits == null) throw new Error(`no token at step ${ids.length}`);
    const best = [...step.logits.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]).slice(0, 2);
    // Greedy must pick the top logit; anything else means sampling options leaked in.
    if (best[0][0] !== step.token && best[0][1] !== step.logits.get(step.token))
      throw new Error(`step ${ids.length}: picked ${step.token}, top logit is ${best[0][0]}`);
    ids.push(step.token);
    margins.push(best[0][1] - best[1][1]);
    top.push([best[0][0], best[0][1], best[1][0], best[1][1]]);
    input = [[step.token, { generateNext: next }]];
  }
  process.stdout.write(JSON.stringify({ ids, margins, top }) + "\n");
  await context.dispose();
} else {
  usage(`unknown command '${cmd}'`);
}
await model.dispose();
await llama.dispose();
