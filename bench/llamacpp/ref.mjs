// llama.cpp as the reference: tokenization, detokenization and greedy ids of
// a GGUF file, computed by llama.cpp's prebuilt CPU build (node-llama-cpp).
// Install once: cd bench/llamacpp && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install
//
//   node ref.mjs tokenize MODEL [--special] [--bos] < strings.json   -> [[ids...], ...]
//   node ref.mjs detokenize MODEL [--special] < idlists.json         -> ["text", ...]
//   node ref.mjs greedy MODEL --prompt-ids 1,2,3 --n N [--threads T] -> one JSON line:
//       {"ids":[...], "margins":[...]}  margins[i] = top1 - top2 logit-probability gap
//       at step i (from llama.cpp's own probabilities), to judge near-ties.
//   node ref.mjs info MODEL                                           -> bos/eos/eot, vocab type
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
const vocabOnly = cmd === "tokenize" || cmd === "detokenize" || cmd === "info";
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
} else if (cmd === "info") {
  process.stdout.write(JSON.stringify({
    bos: model.tokens.bos ?? null, eos: model.tokens.eos ?? null, eot: model.tokens.eot ?? null,
    shouldPrependBos: model.tokens.shouldPrependBosToken, vocabularyType: model.vocabularyType,
  }));
} else if (cmd === "greedy") {
  const ids = (option("--prompt-ids", "") || usage("--prompt-ids is required")).split(",").map(Number);
  const n = Number(option("--n", "16"));
  const threads = Number(option("--threads", "1"));
  const context = await model.createContext({ contextSize: Math.max(256, ids.length + n + 8), threads });
  const seq = context.getSequence();
  const outIds = [];
  const margins = [];
  const gen = seq.evaluateWithMetadata(ids, { probabilities: true }, { temperature: 0 });
  for await (const step of gen) {
    outIds.push(step.token);
    const probs = [...step.probabilities.values()].sort((a, b) => b - a);
    margins.push(probs.length > 1 ? probs[0] - probs[1] : 1);
    if (outIds.length >= n) break;
  }
  process.stdout.write(JSON.stringify({ ids: outIds, margins }) + "\n");
  await context.dispose();
} else {
  usage(`unknown command '${cmd}'`);
}
await model.dispose();
await llama.dispose();
