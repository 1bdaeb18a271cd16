#!/usr/bin/env python3
"""SentencePiece ("llama") vocabulary fixtures checked against llama.cpp.

  make_spm_vocab.py vocab [COMMIT]
      learns BPE merges SentencePiece-style (text normalised with spaces as
      U+2581 and a dummy prefix, merges inside whitespace-led pieces) from the
      docs and runtime/ + apps/ sources at COMMIT (default HEAD) plus the multilingual paragraphs
      below, and writes tests/fixtures/tokenizer/spm-vocab.json: <unk> <s>
      </s>, 256 byte-fallback tokens <0x00>..<0xFF>, the learned pieces with
      score = -rank (as BPE-trained SentencePiece models such as Llama 2 store
      them), single characters after them, and a few control and
      user-defined tokens.

  make_spm_vocab.py expected [EXASERVE]
      for every variant in VARIANTS, builds a GGUF of that vocabulary with
      `exaserve gen-model --vocab` (EXASERVE defaults to build/bin/exaserve),
      asks llama.cpp (bench/llamacpp/ref.mjs) for the ids of test_strings(),
      plain and with --special, and for the text of those ids (detokenize,
      plain and --special), and writes tests/fixtures/tokenizer/spm-expected.json.

Python 3.11, standard library only, plus node with bench/llamacpp installed
for `expected`. Nothing here runs in CI: the tests read the committed JSON.
"""

import collections
import heapq
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
VOCAB_JSON = os.path.join(FIXTURES, "spm-vocab.json")
N_MERGES = 16000
SPACE = "\u2581"
# Characters seen fewer times than this get no piece: they fall back to bytes,
# which the fixtures then exercise.
MIN_CHAR_COUNT = 3

CONTROL = ["<|im_start|>", "<|im_end|>", "<|user|>", "<|assistant|>", "<|endoftext|>", "<unused0>"]
USER_DEFINED = ["<tool_call>", "</tool_call>", "<|sep|>"]

# Text in several scripts, written for these fixtures, so the vocabulary has
# real pieces for them (and the fixture strings are not all byte fallback).
MULTILINGUAL = """
Un petit café près de la gare ouvre à sept heures ; les habitués y lisent le
journal en silence. Ça coûte trois euros, et c'est délicieux. Noël approche déjà.
Die Bäckerei öffnet früh, und die Brötchen sind noch warm. Wir müssen pünktlich
sein, weil der Zug um acht Uhr fährt. Grüße aus München und Köln!
La niña pidió una canción más antes de dormir. ¿Cuántos años tienes? Años atrás
vivíamos en Córdoba, cerca del río. ¡Olé!
Сегодня утром шёл снег, и дети лепили снеговика во дворе. Спасибо за помощь!
Η θάλασσα ήταν ήρεμη και το φως του ήλιου έλαμπε. Ευχαριστώ πολύ, φίλε μου.
我们明天早上八点在图书馆见面。这本书非常有意思，我已经读了两遍。谢谢你的帮助！
駅の近くに新しいパン屋さんができました。毎朝、焼きたてのパンを買います。ありがとう。
주말에는 가족과 함께 산에 갑니다. 김치찌개를 좋아해요. 감사합니다!
الطقس جميل اليوم، وسنذهب إلى الحديقة بعد الظهر. شكرا جزيلا.
हम कल सुबह बाज़ार जाएंगे और ताज़ी सब्ज़ियाँ खरीदेंगे। धन्यवाद!
Chúng tôi sẽ đi du lịch Đà Nẵng vào mùa hè. Phở bò ở đây rất ngon.
Smileys 😀 😂 🙂 and hearts ❤️ 💙, family 👨‍👩‍👧, flags 🇯🇵 🇧🇷, thumbs 👍🏿 👍🏻, rocket 🚀 and party 🎉.
Decomposed accents: cafe\u0301, re\u0301sume\u0301, n\u0303, u\u0308ber, Zoe\u0308, A\u030angstro\u0308m.
Numbers 7 13 256 4096 65536 3.5 0.001 1e-9 2026-12-02 12:45:07 +33 6 12 34 56 78.
Contractions don't can't won't I've you'd we'll they're it's O'Neil rock'n'roll.
Code: for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; } return sum;   // done
"""


def corpus_text(commit):
    """The Markdown docs, README and the runtime/ and apps/ sources at
    `commit` (committed text only, so the same commit always learns the same
    pieces), plus MULTILINGUAL."""
    git = ["git", "-C", ROOT]
    names = subprocess.run(git + ["ls-tree", "-r", "--name-only", commit, "--", "docs", "README.md", "runtime", "apps"],
                           capture_output=True, text=True, check=True).stdout.split()
    names = sorted(n for n in names if n.endswith((".md", ".hpp", ".cpp")))
    parts = [subprocess.run(git + ["show", f"{commit}:{n}"], capture_output=True, check=True).stdout
             .decode("utf-8", errors="replace") for n in names]
    parts += [MULTILINGUAL] * 30
    return "\n".join(parts)


def spm_words(text):
    """SentencePiece's view of the text: every line gets the dummy prefix,
    spaces become U+2581 and a piece starts at each U+2581 run's last
    U+2581 (split_by_whitespace); newlines and tabs stay characters."""
    words = collections.Counter()
    for line in text.split("\n"):
        if not line:
            continue
        s = SPACE + line.replace(" ", SPACE)
        start = 0
        for i in range(1, len(s)):
            if s[i] == SPACE and s[i - 1] != SPACE:
                words[s[start:i]] += 1
                start = i
        words[s[start:]] += 1
    return words


def learn(words, n_merges):
    """Plain BPE over characters: the most frequent adjacent pair merges
    first, ties broken by the pair's text. Returns (characters by count,
    merged pieces in merge order)."""
    chars = collections.Counter()
    for w, c in words.items():
        for ch in w:
            chars[ch] += c
    alphabet = {ch for ch, c in chars.items() if c >= MIN_CHAR_COUNT}
    seqs = [list(w) for w in words]
    freqs = list(words.values())
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            if a in alphabet and b in alphabet:
                pair_count[(a, b)] += freqs[i]
                where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    pieces, seen = [], set(alphabet)
    while len(pieces) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or -negc < 2:
            if -negc < 2:
                break
            continue
        a, b = pair
        merged = a + b
        if merged not in seen:
            pieces.append(merged)
            seen.add(merged)
        touched = set()
        for i in list(where[pair]):
            s, f = seqs[i], freqs[i]
            for x, y in zip(s, s[1:]):
                if (x, y) in pair_count:
                    pair_count[(x, y)] -= f
                    touched.add((x, y))
            out, j = [], 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
            for x, y in zip(out, out[1:]):
                if x in seen and y in seen:
                    pair_count[(x, y)] += f
                    where[(x, y)].add(i)
                    touched.add((x, y))
        for p in touched:
            if pair_count[p] > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    by_count = sorted(alphabet, key=lambda ch: (-chars[ch], ch))
    return by_count, pieces


def make_vocab(commit):
    chars, pieces = learn(spm_words(corpus_text(commit)), N_MERGES)
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)
        scores.append(0.0)
    for rank, p in enumerate(pieces):
        tokens.append(p)
        types.append(1)
        scores.append(-float(rank))
    # Characters rank below every merged piece, as SentencePiece's BPE
    # trainer orders them; the byte tokens already cover the rest.
    have = set(tokens)
    for rank, ch in enumerate(chars):
        if ch not in have:
            tokens.append(ch)
            types.append(1)
            scores.append(-float(len(pieces) + rank))
            have.add(ch)
    for t in CONTROL:
        tokens.append(t)
        types.append(3)
        scores.append(0.0)
    for t in USER_DEFINED:
        tokens.append(t)
        types.append(4)
        scores.append(0.0)
    vocab = {
        "model": "llama",
        "tokens": tokens, "scores": scores, "token_type": types,
        "bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0,
        "learned_from": f"docs/*.md, README.md, runtime/ and apps/ sources at {commit} + MULTILINGUAL of scripts/make_spm_vocab.py",
    }
    os.makedirs(FIXTURES, exist_ok=True)
    with open(VOCAB_JSON, "w", encoding="utf-8") as fh:
        json.dump(vocab, fh, ensure_ascii=False, separators=(",", ":"))
        fh.write("\n")
    print(f"{VOCAB_JSON}: {len(tokens)} tokens ({len(pieces)} merged pieces, {len(chars)} characters)")


EXPECTED_JSON = os.path.join(FIXTURES, "spm-expected.json")
GENERATOR = "llama.cpp in node-llama-cpp 3.22.1 (bench/llamacpp/ref.mjs tokenize/detokenize)"
# What each variant changes in spm-vocab.json (JSON keys of gen-model --vocab)
# and the general.name it gets (Phi-3's specials strip spaces after them).
VARIANTS = [
    {"name": "prefix", "overrides": {}, "model_name": "spm-test"},
    {"name": "noprefix", "overrides": {"add_space_prefix": False, "add_bos_token": False}, "model_name": "spm-test"},
    {"name": "phi3", "overrides": {}, "model_name": "phi-3-spm-test"},
]


def test_strings():
    """Whitespace, digits, contractions, scripts, emoji, combining marks,
    special-token texts, code, long inputs and seeded random mixes."""
    fixed = [
        "", " ", "  ", "   ", "\n", "\t", " \n ", "\n\n\n", "\r\n", "hello", " hello", "  hello", "hello ",
        "hello  ", "Hello World", "hello world", "a    b", "a\tb\tc", "line1\nline2\r\nline3",
        "   leading and trailing   ", "\n leading newline", "trailing newline\n", " \t \n mixed \t\n",
        "0", "12", "123", "1234567890", "3.14159", "1,000,000", "2026-12-02 12:45:07", "v1.2.3", "x86_64",
        "I'm", "don't", "we'll", "they're", "it's", "DON'T", "O'Neil", "rock'n'roll", "'quoted'",
        "我们明天早上八点在图书馆见面。", "東京は日本の首都です", "한국어 문장입니다", "龘", "\U00020000",
        "สวัสดีครับ", "שלום עולם", "Καλημέρα κόσμε", "Привет, мир!", "مرحبا بالعالم", "नमस्ते दुनिया",
        "naïve café résumé", "Größe", "Ñandú", "Tiếng Việt",
        "👍", "👨\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "🇫🇷🇩🇪", "👋🏽", "❤\ufe0f", "😀😃😄", "🚀 launch",
        "e\u0301", "cafe\u0301", "a\u0300\u0301\u0302", "Ame\u0301lie", "Z\u0351\u0352\u0353", "\u0301alone",
        "for (int i = 0; i < n; ++i) {\n    x += y;\n}", "def f(x):\n\treturn x**2",
        "| a | b |\n|---|---|", "```cpp\nint main() {}\n```", "<div class=\"x\">&amp;</div>",
        "<|im_start|>user\nHi<|im_end|>", "<s>hello</s>", "<unk>", "<tool_call>{\"a\":1}</tool_call>",
        "x<|sep|>y", "<|user|>\nHello<|assistant|>", " <|im_end|> ", "<|im_end|><|im_end|>", "<unused0>",
        "<|user|>   spaced", "<0x41>", "\u2581", "\u2581\u2581hello", "<|im_start", "partial <|im_", "<s><s>",
        "</s> end", "a\u0000b", "\u007f\u0001\u001b[0m", "\ufffd", "\ufeffbom", "a\u200bb", "a\u00a0b",
        "a\u3000b", "\u2028\u2029", "~!@#$%^&*()_+`-=[]{}|;':\",./<>?",
    ]
    long = [
        MULTILINGUAL * 3,
        "a" * 5000,
        " " * 1000,
        "ab " * 2000,
        "\n".join(f"{i}: the quick brown fox" for i in range(400)),
        "👍🏽" * 300,
    ]
    rng = random.Random(20261202)
    vocab = json.load(open(VOCAB_JSON, encoding="utf-8"))
    pieces = [t for t, ty in zip(vocab["tokens"], vocab["token_type"]) if ty == 1]
    specials = CONTROL + USER_DEFINED + ["<s>", "</s>", "<unk>"]
    alphabet = "aeiou xyz\n\t  .,!?'\"0123456789éüñ中文字😀\u0301\u200d"
    mixes = []
    for _ in range(150):
        parts = []
        for _ in range(rng.randint(1, 25)):
            r = rng.random()
            if r < 0.55:
                parts.append(rng.choice(pieces).replace(SPACE, " "))
            elif r < 0.65:
                parts.append(rng.choice(specials))
            elif r < 0.85:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))))
            else:
                parts.append(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                             rng.randint(0x3000, 0xd7ff), rng.randint(0x1f300, 0x1faff)])))
        mixes.append("".join(parts))
    return fixed + long + mixes


def ref(cmd, gguf, payload, *flags):
    # stdin from a file, not a pipe: node's readFileSync(0) fails with EAGAIN
    # on a pipe that is not ready yet.
    with tempfile.TemporaryFile("w+", encoding="utf-8") as fh:
        json.dump(payload, fh)
        fh.seek(0)
        out = subprocess.run(["node", os.path.join(ROOT, "bench", "llamacpp", "ref.mjs"), cmd, gguf, *flags],
                             stdin=fh, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def make_expected(exaserve):
    vocab = json.load(open(VOCAB_JSON, encoding="utf-8"))
    strings = test_strings()
    variants = []
    with tempfile.TemporaryDirectory() as tmp:
        for v in VARIANTS:
            vj = os.path.join(tmp, f"{v['name']}.json")
            gguf = os.path.join(tmp, f"{v['name']}.gguf")
            with open(vj, "w", encoding="utf-8") as fh:
                json.dump(dict(vocab, **v["overrides"]), fh, ensure_ascii=False)
            subprocess.run([exaserve, "gen-model", "--vocab", vj, "--name", v["model_name"], "--layers", "1",
                            "--dim", "32", "--heads", "2", "--kv-heads", "1", "--ff", "64", "--out", gguf],
                           check=True, capture_output=True)
            ids = ref("tokenize", gguf, strings)
            ids_special = ref("tokenize", gguf, strings, "--special")
            detok = ref("detokenize", gguf, ids)
            detok_special = ref("detokenize", gguf, ids_special, "--special")
            info = ref("info", gguf, [])
            # A decoded text equal to the input string is left out (most are).
            cases = []
            for t, a, b, c, d in zip(strings, ids, ids_special, detok, detok_special):
                case = {"ids": a, "ids_special": b}
                if c != t:
                    case["detok"] = c
                if d != t:
                    case["detok_special"] = d
                cases.append(case)
            variants.append(dict(v, info=info, cases=cases))
            print(f"{v['name']}: {len(cases)} strings, {sum(len(c['ids']) for c in cases)} ids")
    with open(EXPECTED_JSON, "w", encoding="utf-8") as fh:
        json.dump({"generator": GENERATOR, "vocab": "spm-vocab.json",
                   "note": "cases[i] belongs to strings[i]; detok/detok_special are llama.cpp's decoding of "
                           "ids/ids_special (plain / --special), left out where equal to the string",
                   "strings": strings, "variants": variants}, fh, ensure_ascii=False, separators=(",", ":"))
        fh.write("\n")
    print(f"wrote {EXPECTED_JSON}")


def main(argv):
    if len(argv) >= 2 and argv[1] == "expected":
        make_expected(argv[2] if len(argv) > 2 else os.path.join(ROOT, "build", "bin", "exaserve"))
        return 0
    if len(argv) >= 2 and argv[1] == "vocab":
        commit = argv[2] if len(argv) > 2 else "HEAD"
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", commit], capture_output=True,
                                text=True, check=True).stdout.strip()
        make_vocab(commit)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
