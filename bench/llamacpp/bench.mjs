// llama.cpp's batch-1 decode and prefill speed on a GGUF file, measured the
// way `exaserve bench-engine --batches 1` measures ExaServe's, for
// bench/vs_llamacpp.sh to compare side by side.
//
//   node bench.mjs MODEL [--threads T] [--prefill-tokens P] [--decode-prompt N]
//                        [--decode-steps S] [--flash-attention auto|on|off]
//     -> one JSON line:
//     {"prefill_tok_s":..,"decode_tok_s":..,"threads":T,"flash_attention":"enabled",
//      "cpu_variant":"libggml-cpu-zen4.so", ...}
//
// Only the evaluations are timed, never the load:
// - prefill: a fresh context, one controlledEvaluate of P prompt tokens that
//   asks for the greedy next token after the last (P tokens / seconds);
// - decode: a fresh context, an N-token prompt and its first greedy token
//   (not timed), then S steps of one token each, every step asking for the
//   greedy next token (S tokens / seconds).
// Prompt tokens follow the same formula as bench-engine's (3 + (i*31 +
// salt*17) mod (vocab-3)); the numbers do not depend on which ids they are.
// `cpu_variant` is the ggml CPU backend library this process mapped: the
// prebuilt bundle holds one per x86 level and ggml loads the best one the CPU
// supports from the first directory that has any (run with the current
// directory holding only libggml-cpu-haswell.so to force the AVX2 one).
// Nothing is downloaded.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";

function usage(msg) {
  if (msg) console.error(`bench.mjs: ${msg}`);
  console.error("usage: node bench.mjs MODEL [--threads T] [--prefill-tokens P] [--decode-prompt N] [--decode-steps S] [--flash-attention auto|on|off]");
  process.exit(2);
}

const [modelPath, ...rest] = process.argv.slice(2);
if (!modelPath || modelPath.startsWith("--")) usage();
const option = (name, fallback) => {
  const i = rest.indexOf(name);
  return i >= 0 && i + 1 < rest.length ? rest[i + 1] : fallback;
};
const int = (name, fallback) => {
  const v = Number(option(name, String(fallback)));
  if (!Number.isInteger(v) || v < 0) usage(`${name} must be a non-negative integer`);
  return v;
};
const threads = int("--threads", 1);
const prefillTokens = int("--prefill-tokens", 512);
const decodePrompt = Math.max(1, int("--decode-prompt", 8));
const decodeSteps = int("--decode-steps", 128);
const fa = option("--flash-attention", "auto");
if (!["auto", "on", "off"].includes(fa)) usage("--flash-attention must be auto, on or off");
const flashAttention = fa === "on" ? true : fa === "off" ? false : "auto";

// maxThreads 0: the context's thread count is used as given, not as a hint
// shared with other contexts.
// llama.cpp logs what "auto" flash attention resolved to ("Flash Attention
// enabled"/"... was auto, set to enabled"); the log is kept for that, not printed.
let faResolved = null;
const onLog = (level, message) => {
  const m = /flash attention (?:was auto, set to )?(enabled|disabled)/i.exec(message);
  if (m) faResolved = m[1].toLowerCase();
  else if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) console.error(message);
};
const llama = await getLlama({ gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.info, logger: onLog });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const vocab = model.fileInsights.vocabularySize ?? model.tokens.vocabularySize ?? 32000;
const promptOf = (n, salt) => Array.from({ length: n }, (_, i) => 3 + ((i * 31 + salt * 17) % (vocab - 3)));
const greedy = { token: true, options: { temperature: 0 } };
const withNext = (ids) => ids.map((t, i) => (i === ids.length - 1 ? [t, { generateNext: greedy }] : t));

async function prefill() {
  if (prefillTokens === 0) return null;
  const context = await model.createContext({
    contextSize: prefillTokens + 16, batchSize: Math.max(prefillTokens, 1), threads, flashAttention,
  });
  const seq = context.getSequence();
  const t0 = performance.now();
  const out = await seq.controlledEvaluate(withNext(promptOf(prefillTokens, 0)));
  const secs = (performance.now() - t0) / 1e3;
  if (out[prefillTokens - 1]?.next?.token == null) throw new Error("prefill produced no token");
  await context.dispose();
  return { tok_s: prefillTokens / secs };
}

async function decode() {
  if (decodeSteps === 0) return null;
  const context = await model.createContext({
    contextSize: decodePrompt + decodeSteps + 16, threads, flashAttention,
  });
  const seq = context.getSequence();
  let out = await seq.controlledEvaluate(withNext(promptOf(decodePrompt, 0)));
  let token = out[decodePrompt - 1]?.next?.token;
  if (token == null) throw new Error("decode prompt produced no token");
  const t0 = performance.now();
  for (let s = 0; s < decodeSteps; ++s) {
    out = await seq.controlledEvaluate([[token, { generateNext: greedy }]]);
    token = out[0]?.next?.token;
    if (token == null) throw new Error(`no token at decode step ${s}`);
  }
  const secs = (performance.now() - t0) / 1e3;
  await context.dispose();
  return { tok_s: decodeSteps / secs };
}

const p = await prefill();
const d = await decode();
const maps = readFileSync("/proc/self/maps", "utf8");
const variants = [...new Set([...maps.matchAll(/libggml-cpu-[\w-]+\.so/g)].map((m) => m[0]))];
process.stdout.write(JSON.stringify({
  prefill_tokens: prefillTokens, prefill_tok_s: p ? +p.tok_s.toFixed(2) : null,
  decode_prompt: decodePrompt, decode_steps: decodeSteps, decode_tok_s: d ? +d.tok_s.toFixed(2) : null,
  threads, flash_attention: faResolved, flash_attention_option: fa,
  cpu_variant: variants.join(",") || null,
}) + "\n");
await model.dispose();
await llama.dispose();
