#!/usr/bin/env node
// Greedy ids of ExaServe against llama.cpp (node-llama-cpp 3.22.1's prebuilt
// CPU build, bench/llamacpp) on the same generated GGUF files: llama and
// qwen2, f16, q8_0 and q4_k_m, plus Llama 3.1-style rope_freqs and linear
// RoPE scaling. For every model and prompt both generate N tokens greedily;
// the ids must be equal up to the first step where the top-two logit margin
// is a near-tie (rule below), after which the two sequences may differ.
//
//   node scripts/crosscheck_llamacpp.mjs [--exaserve build/bin/exaserve] [--dir /tmp/exa-crosscheck]
//        [--steps 32] [--threads 2] [--quick] [--only REGEX] [--summary FILE] [--fixture FILE]
//
// --fixture writes llama.cpp's ids and margins for every run as JSON, for the
// engine test that repeats the comparison without llama.cpp
// (tests/engine/crosscheck_test.cpp, tests/fixtures/crosscheck/).
//
// Prints one line per comparison and a summary; exits 1 if any comparison
// diverges at a step that is not a near-tie. Also measures llama.cpp against
// itself, which is what the tie thresholds rest on: 1 thread against
// --threads, and its default CPU attention (flash attention, V accumulated in
// f16) against its other one (softmax, then a V matmul).
import { execFileSync } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const argv = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = argv.indexOf(name);
  return i >= 0 && i + 1 < argv.length ? argv[i + 1] : fallback;
};
const exaserveBuilt = path.resolve(opt("--exaserve", path.join(root, "build/bin/exaserve")));
const dir = opt("--dir", "/tmp/exa-crosscheck");
const steps = Number(opt("--steps", "32"));
const threads = Number(opt("--threads", "2"));
const quick = argv.includes("--quick");
const summaryFile = opt("--summary", "");
const fixtureFile = opt("--fixture", "");
const fixture = [];
const ref = path.join(root, "bench/llamacpp/ref.mjs");

// Near-tie rule: a step is a near-tie when its top-1 minus top-2 logit (in
// ExaServe's run or llama.cpp's) is below TIE[weight type]. Why per type:
// both engines compute the matmuls identically (a BOS-only prompt, where
// attention is trivial, gives logits equal to ~1e-7), but attention differs
// in rounding (llama.cpp's flash attention accumulates V in f16, ExaServe in
// f32); ~1e-4 relative differences there flip a few roundings when the next
// matmul quantizes its input to Q8_0/Q8_K, which grows them to quantization
// noise. llama.cpp's own two attention paths differ by the same amount
// (measured on the 3-layer llama files of this script, 9-token prompt, all
// 4096 logits: f16 max |Δlogit| 2.8e-3, q8_0 5.9e-2, q4_k_m 8.3e-2). A margin
// is a difference of two logits, so TIE = 2 × that maximum, rounded up; the
// run re-measures the llama.cpp self-disagreement and prints it beside.
const TIE = { f16: 6e-3, q8_0: 0.12, q4_k_m: 0.17 };
const typeOf = (m) => m.args[m.args.indexOf("--type") + 1];
const isTie = (margin, type) => margin < TIE[type];

// dim 256 and ff 768 are whole K-quant super-blocks; 4096 tokens make the
// head's argmax a real choice. 4 heads of 64, GQA 2:1.
const shape = ["--layers", "3", "--dim", "256", "--heads", "4", "--kv-heads", "2", "--ff", "768",
               "--vocab", "4096", "--context", "512"];
const models = [];
for (const arch of ["llama", "qwen2"])
  for (const type of ["f16", "q8_0", "q4_k_m"]) models.push({ name: `${arch}-${type}`, args: ["--arch", arch, "--type", type] });
// The scaled-RoPE models name an unscaled twin (same weights): ExaServe on the
// twin must disagree with llama.cpp on the scaled file at a clear margin,
// or the comparison could not tell whether the scaling is applied at all.
models.push({ name: "llama-f16-llama3rope", twin: "llama-f16",
              args: ["--arch", "llama", "--type", "f16", "--rope-scaling", "llama3", "--rope-original-context", "64"] });
models.push({ name: "llama-q4_k_m-llama3rope", twin: "llama-q4_k_m",
              args: ["--arch", "llama", "--type", "q4_k_m", "--rope-scaling", "llama3", "--rope-original-context", "64"] });
models.push({ name: "llama-q8_0-linear4", twin: "llama-q8_0",
              args: ["--arch", "llama", "--type", "q8_0", "--rope-scaling", "linear", "--rope-factor", "4"] });
models.push({ name: "qwen2-q8_0-tied", args: ["--arch", "qwen2", "--type", "q8_0", "--tie-embeddings"] });
// Real-vocabulary files: the committed byte-level BPE vocabulary (8261 tokens,
// tests/fixtures/tokenizer) under a Llama 3.1-like and a Qwen2.5-like model.
const bpeVocab = path.join(root, "tests/fixtures/tokenizer/bpe-vocab.json");
models.push({ name: "llama31like-q4_k_m", vocab: bpeVocab,
              args: ["--arch", "llama", "--type", "q4_k_m", "--rope-scaling", "llama3", "--rope-original-context", "64"] });
models.push({ name: "qwen25like-q4_k_m-tied", vocab: bpeVocab, args: ["--arch", "qwen2", "--type", "q4_k_m", "--tie-embeddings"] });
const only = opt("--only", "");
if (only) models.splice(0, models.length, ...models.filter((m) => new RegExp(only).test(m.name)));

// Deterministic prompts of several lengths, BOS (1) first.
function prompt(len, salt) {
  const ids = [1];
  let x = BigInt(salt) * 0x9e3779b97f4a7c15n + 12345n;
  const mask = (1n << 64n) - 1n;
  while (ids.length < len) {
    x = (x ^ (x >> 12n)) & mask;
    x = (x ^ (x << 25n)) & mask;
    x = (x ^ (x >> 27n)) & mask;
    ids.push(Number(3n + ((x * 0x2545f4914f6cdd1dn) & mask) % 4093n));
  }
  return ids;
}
const prompts = quick ? [prompt(5, 1), prompt(40, 2)] : [prompt(1, 0), prompt(5, 1), prompt(17, 2), prompt(40, 3), prompt(96, 4)];

const run = (cmd, args) => execFileSync(cmd, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 1 << 26 });
const ours = (file, p) =>
  JSON.parse(run(exaserve, ["generate", "--model", file, "--prompt-ids", p.join(","), "--max-tokens", String(steps),
                            "--margins", "--ignore-eos", "--threads", String(threads)]).trim().split("\n").pop());
const theirs = (file, p, t, fa = "auto") =>
  JSON.parse(run("node", [ref, "greedy", file, "--prompt-ids", p.join(","), "--n", String(steps), "--threads", String(t),
                          "--flash-attention", fa]).trim().split("\n").pop());

// Walks both runs; equal up to the first divergence, which must be a tie.
// Margins are compared only where both runs rank the same two tokens first.
function compare(a, b, type) {
  let maxMarginDiff = 0;
  for (let i = 0; i < steps; ++i) {
    if (a.ids[i] !== b.ids[i]) {
      const tie = isTie(a.margins[i], type) || isTie(b.margins[i], type);
      return { equal: i, diverged: true, tie, at: i, marginA: a.margins[i], marginB: b.margins[i], maxMarginDiff };
    }
    if (a.top[i][2] === b.top[i][2]) maxMarginDiff = Math.max(maxMarginDiff, Math.abs(a.margins[i] - b.margins[i]));
  }
  return { equal: steps, diverged: false, tie: false, maxMarginDiff };
}

const e2 = (x) => x.toExponential(2);
mkdirSync(dir, { recursive: true });
// A private copy: a rebuild of build/bin/exaserve during the run cannot break it.
const exaserve = path.join(dir, "exaserve");
copyFileSync(exaserveBuilt, exaserve);
chmodSync(exaserve, 0o755);
const lines = [];
const say = (s) => { console.log(s); lines.push(s); };
say(`# ExaServe vs llama.cpp greedy ids: node-llama-cpp 3.22.1 (its bundled llama.cpp, release tag v0.5.0, prebuilt CPU`);
say(`# build, default context: flash attention auto = on, f16 KV cache). ${steps} steps per run, both at --threads ${threads}.`);
say(`# Near-tie: top-1 minus top-2 logit below ${Object.entries(TIE).map(([t, v]) => `${v} (${t})`).join(", ")}.`);
say(`# model | prompt tokens | result`);
let failures = 0, comparisons = 0, stepsCompared = 0, controls = 0, controlsClear = 0, threadRuns = 0, threadDiverged = 0;
let worstThreads = 0;
const perType = {};  // type -> measured disagreements
for (const m of models) {
  const type = typeOf(m);
  // Random tied heads are dominated by the last token's own embedding
  // (logits near 100, the model echoes its input): their ids still compare,
  // but their logit scale would swamp the per-type statistics.
  const tied = m.args.includes("--tie-embeddings");
  const t = tied ? { ours: 0, fa: 0, faRuns: 0, faDiverged: [], bos: 0, ties: [] }
                 : (perType[type] ??= { ours: 0, fa: 0, faRuns: 0, faDiverged: [], bos: 0, ties: [] });
  const file = path.join(dir, `${m.name}.gguf`);
  if (!existsSync(file)) {
    const sized = m.vocab ? shape.filter((x, i, all) => x !== "--vocab" && all[i - 1] !== "--vocab").concat(["--vocab", m.vocab])
                          : shape;
    run(exaserve, ["gen-model", "--out", file, "--seed", "7", ...sized, ...m.args]);
  }
  for (const p of prompts) {
    const a = ours(file, p);
    const b = theirs(file, p, threads);
    if (!m.vocab) fixture.push({ model: m.name, gen_model_args: m.args, prompt: p, ids: b.ids, margins: b.margins });
    const c = compare(a, b, type);
    ++comparisons;
    stepsCompared += c.equal + (c.diverged ? 1 : 0);
    t.ours = Math.max(t.ours, c.maxMarginDiff);
    // With a BOS-only prompt the first step's attention is trivial: the two
    // engines' matmuls alone decide it.
    if (p.length === 1 && a.top[0][2] === b.top[0][2]) t.bos = Math.max(t.bos, Math.abs(a.margins[0] - b.margins[0]));
    let result;
    if (!c.diverged) result = `equal for all ${steps} steps`;
    else if (c.tie) {
      result = `equal for ${c.equal} steps, then a near-tie at step ${c.at} (margin ours ${e2(c.marginA)}, llama.cpp ${e2(c.marginB)})`;
      t.ties.push(Math.max(c.marginA, c.marginB));
    } else {
      result = `FAIL: equal for ${c.equal} steps, then diverged at step ${c.at} with margin ours ${e2(c.marginA)}, ` +
               `llama.cpp ${e2(c.marginB)} (not a near-tie)`;
      ++failures;
    }
    say(`${m.name} | ${p.length} | ${result}`);
    if (m.twin) {
      const tw = compare(ours(path.join(dir, `${m.twin}.gguf`), p), b, type);
      const clear = tw.diverged && !tw.tie;
      say(`  control: ExaServe on ${m.twin} (same weights, no scaling) vs llama.cpp on ${m.name}: ` +
          (clear ? `differ at step ${tw.at} (margins ${e2(tw.marginA)} / ${e2(tw.marginB)}): the scaling is applied`
                 : tw.diverged ? `differ only at a near-tie (step ${tw.at})` : `equal for all ${steps} steps`));
      if (clear) ++controlsClear;
      ++controls;
    }
    // llama.cpp against itself: its other attention path.
    const f = compare(theirs(file, p, threads, "off"), b, type);
    t.fa = Math.max(t.fa, f.maxMarginDiff);
    ++t.faRuns;
    if (f.diverged) t.faDiverged.push(Math.max(f.marginA, f.marginB));
    // ...and one thread against `threads`, once per model.
    if (p === prompts[0]) {
      const s1 = compare(theirs(file, p, 1), b, type);
      worstThreads = Math.max(worstThreads, s1.maxMarginDiff);
      ++threadRuns;
      if (s1.diverged) ++threadDiverged;
    }
  }
}
say(`# ${comparisons} comparisons, ${stepsCompared} steps compared, ${failures} failures`);
say(`# controls (unscaled twin vs scaled file) that differ at a clear margin: ${controlsClear} of ${controls}`);
say(`# llama.cpp 1 thread vs ${threads}: largest |Δmargin| ${e2(worstThreads)}, diverged in ${threadDiverged} of ${threadRuns} runs`);
say(`# per type (untied models), at steps where both rank the same two tokens first, largest |Δ(top-1 − top-2 logit)|:`);
for (const [type, t] of Object.entries(perType)) {
  say(`#   ${type}: ExaServe vs llama.cpp ${e2(t.ours)}; llama.cpp flash attention on vs off ${e2(t.fa)}; ` +
      `BOS-only first step ExaServe vs llama.cpp ${prompts.some((p) => p.length === 1) ? e2(t.bos) : "n/a"}`);
  say(`#   ${type}: llama.cpp on vs off diverged in ${t.faDiverged.length} of ${t.faRuns} runs` +
      (t.faDiverged.length ? `, at margins up to ${e2(Math.max(...t.faDiverged))}` : "") +
      (t.ties.length ? `; ExaServe vs llama.cpp near-tie divergences at margins up to ${e2(Math.max(...t.ties))}` : ""));
}
if (summaryFile) writeFileSync(summaryFile, lines.join("\n") + "\n");
if (fixtureFile) {
  // One run per line: diffs of a regenerated fixture stay readable.
  const head = {
    source: "llama.cpp bundled with node-llama-cpp 3.22.1 (release tag v0.5.0, prebuilt CPU, flash attention auto), " +
            `--threads ${threads}; written by scripts/crosscheck_llamacpp.mjs`,
    gen_model_shape: shape, seed: 7, steps, tie: TIE };
  const body = Object.entries(head).map(([k, v]) => ` ${JSON.stringify(k)}: ${JSON.stringify(v)},`).join("\n");
  writeFileSync(fixtureFile, `{\n${body}\n "runs": [\n${fixture.map((r) => "  " + JSON.stringify(r)).join(",\n")}\n ]\n}\n`);
}
process.exit(failures ? 1 : 0);
