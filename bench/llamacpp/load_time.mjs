// llama.cpp's load time for a GGUF file, for comparison with ExaServe's
// (scripts/load_time.sh runs both on the same file, cold and warm).
//
//   node load_time.mjs MODEL [--threads T]
//     -> {"load_ms": ..., "first_token_ms": ...}
//
// load_ms: llama_model_load (mmap, and on Linux MAP_POPULATE, which pages the
// whole file in); first_token_ms: context creation plus one decode of a
// one-token prompt. Nothing is downloaded.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { performance } from "node:perf_hooks";

const [modelPath, ...rest] = process.argv.slice(2);
if (!modelPath) {
  console.error("usage: node load_time.mjs MODEL [--threads T]");
  process.exit(2);
}
const i = rest.indexOf("--threads");
const threads = i >= 0 ? Number(rest[i + 1]) : 2;

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
const t0 = performance.now();
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const t1 = performance.now();
const context = await model.createContext({ contextSize: 256, threads });
const out = await context.getSequence().controlledEvaluate([[1, { generateNext: { token: true } }]]);
const t2 = performance.now();
if (out[0]?.next?.token == null) throw new Error("no token");
process.stdout.write(JSON.stringify({ load_ms: +(t1 - t0).toFixed(1), first_token_ms: +(t2 - t1).toFixed(1) }) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
