#!/usr/bin/env python3
"""Byte-level BPE fixtures checked against llama.cpp.

  make_bpe_vocab.py vocab [COMMIT]
                               learns merges from this repository's docs and
                               sources at COMMIT (default HEAD) plus
                               multilingual paragraphs, writes
                               tests/fixtures/tokenizer/bpe-vocab.json and
                               bpe-holes-vocab.json (the committed ones were
                               learned at the commit their "learned_from" names)
  make_bpe_vocab.py gguf PRE OUT.gguf
                               writes a vocabulary-only llama GGUF of that
                               vocabulary with tokenizer.ggml.pre = PRE
  make_bpe_vocab.py expected   for every pre-tokenizer in PRES, builds the GGUF,
                               asks llama.cpp (bench/llamacpp/ref.mjs) for the
                               ids of test_strings() and writes
                               tests/fixtures/tokenizer/bpe-expected-PRE.json;
                               then the same for bpe-holes-vocab.json (the
                               vocabulary with tokens taken out, to pin down
                               llama.cpp's fallbacks) under HOLES_PRES, written
                               to bpe-expected-holes-PRE.json
  make_bpe_vocab.py e2e EXASERVE
                               end to end: for every expected-ids fixture,
                               `EXASERVE gen-model --vocab` writes a model with
                               that vocabulary and pre-tokenizer, and
                               `EXASERVE tokenize --text-file` must print
                               llama.cpp's ids for every string (no node needed)

Needs Python 3.11 with the `regex` module (Unicode properties, for training
only) and, for `expected`, node with bench/llamacpp installed. Nothing here
runs in CI: the tests read the committed JSON files.
"""

import collections
import glob
import heapq
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import regex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
VOCAB_JSON = os.path.join(FIXTURES, "bpe-vocab.json")
HOLES_JSON = os.path.join(FIXTURES, "bpe-holes-vocab.json")
HOLES_PRES = ["llama-bpe", "gpt-2"]
N_MERGES = 8000
PRES = ["llama-bpe", "qwen2", "gpt-2", "default", "smollm", "starcoder", "qwen35", "tekken", "gpt-4o"]
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
GENERATOR = "llama.cpp in node-llama-cpp 3.22.1 (bench/llamacpp/ref.mjs tokenize)"

# Paragraphs in many scripts so the vocabulary learns merges for them too.
MULTILINGUAL = """
Le renard brun rapide saute par-dessus le chien paresseux. L'été dernier, nous
sommes allés à la mer ; c'était très agréable. Où êtes-vous allés ? Déjà vu !
Der schnelle braune Fuchs springt über den faulen Hund. Größere Änderungen
müssen überprüft werden. Straße, Fußgänger, Mädchen, schön.
El rápido zorro marrón salta sobre el perro perezoso. ¿Dónde está la biblioteca?
¡Qué día tan bonito! Mañana iremos a la montaña con niños pequeños.
Быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир! Как дела?
Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο. Καλημέρα κόσμε.
快速的棕色狐狸跳过了懒狗。你好，世界！今天天气很好，我们去公园散步吧。中文分词测试。
日本語のテキストです。東京は日本の首都です。ひらがなとカタカナと漢字を使います。
한국어 문장입니다. 안녕하세요, 세계! 오늘은 날씨가 좋습니다.
مرحبا بالعالم. هذه جملة باللغة العربية للاختبار.
नमस्ते दुनिया। यह हिंदी में एक वाक्य है। किताबें पढ़ना अच्छा है।
Tiếng Việt có nhiều dấu: người, được, những, trường học, cảm ơn bạn.
Emoji: 👍 👋🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 🇩🇪 😀😃😄 ❤️ 🎉 ✨ 🚀
Combining marks: e\u0301 a\u0300 n\u0303 o\u0308 A\u030a c\u0327 — Ame\u0301lie, nai\u0308ve.
Numbers: 0 1 2 3 42 100 1234 56789 3.14159 2,718 1,000,000 2024-01-31 10:30 ½ ² ³ ٣٤٥ ४२
Contractions: I'm you're we've they'll she'd it's don't DON'T WE'VE I'LL can't won't.
"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return bs, {b: chr(c) for b, c in zip(bs, cs)}


GPT2_RE = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def corpus_text(commit="HEAD"):
    """The Markdown docs and C++ sources of `commit` (committed text only, so
    that the same commit always learns the same merges), plus MULTILINGUAL."""
    git = ["git", "-C", ROOT]
    names = subprocess.run(git + ["ls-tree", "-r", "--name-only", commit, "--", "docs", "README.md", "runtime", "apps"],
                           capture_output=True, text=True, check=True).stdout.split()
    names = sorted(n for n in names if n.endswith((".md", ".hpp", ".cpp")))
    parts = [subprocess.run(git + ["show", f"{commit}:{n}"], capture_output=True, check=True).stdout
             .decode("utf-8", errors="replace") for n in names]
    parts += [MULTILINGUAL] * 20
    return "\n".join(parts)


def learn_merges(text, n_merges):
    """Plain byte-level BPE: the most frequent adjacent pair merges first
    (ties broken by the pair's text), inside GPT-2 pre-tokenizer words."""
    _, b2u = bytes_to_unicode()
    words = collections.Counter(GPT2_RE.findall(text))
    seqs = [[b2u[b] for b in w.encode("utf-8")] for w in words]
    freqs = list(words.values())
    pair_count = collections.Counter()
    where = collections.defaultdict(set)
    for i, s in enumerate(seqs):
        for a, b in zip(s, s[1:]):
            pair_count[(a, b)] += freqs[i]
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc:
            continue  # stale
        if -negc < 2:
            break
        merges.append(pair)
        a, b = pair
        merged = a + b
        touched = collections.Counter()
        for i in list(where[pair]):
            s = seqs[i]
            f = freqs[i]
            for x, y in zip(s, s[1:]):
                pair_count[(x, y)] -= f
                touched[(x, y)] += 0
            out = []
            j = 0
            while j < len(s):
                if j + 1 < len(s) and s[j] == a and s[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(s[j])
                    j += 1
            seqs[i] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                where[(x, y)].add(i)
                touched[(x, y)] += 0
        for p in touched:
            c = pair_count[p]
            if c > 0:
                heapq.heappush(heap, (-c, p))
    return merges


def make_vocab(commit):
    bs, b2u = bytes_to_unicode()
    merges = learn_merges(corpus_text(commit), N_MERGES)
    tokens = [b2u[b] for b in bs]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    types = [1] * len(tokens)
    for s in SPECIALS:
        tokens.append(s)
        types.append(3)
    ids = {t: i for i, t in enumerate(tokens)}
    vocab = {
        "model": "gpt2", "pre": "llama-bpe",
        "tokens": tokens, "token_type": types,
        "merges": [f"{a} {b}" for a, b in merges],
        "bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": ids["<|endoftext|>"],
        "eot_token_id": ids["<|eot_id|>"], "add_bos_token": False,
        "learned_from": f"docs, README.md, runtime/ and apps/ sources at {commit} + MULTILINGUAL of scripts/make_bpe_vocab.py",
    }
    os.makedirs(FIXTURES, exist_ok=True)
    with open(VOCAB_JSON, "w", encoding="utf-8") as fh:
        json.dump(vocab, fh, ensure_ascii=False, separators=(",", ":"))
        fh.write("\n")
    print(f"{VOCAB_JSON}: {len(tokens)} tokens, {len(merges)} merges")
    make_holes(vocab)


def make_holes(vocab):
    """The same vocabulary with every 7th merged token, the byte tokens of
    'Q' and 0xA9 (the last byte of 'é') taken out, plus a merge listed twice
    (the first rank must win), one without a space and one with two."""
    _, b2u = bytes_to_unicode()
    drop = {b2u[ord("Q")], b2u[0xA9]}
    tokens, types = [], []
    for i, (t, ty) in enumerate(zip(vocab["tokens"], vocab["token_type"])):
        if t in drop or (256 <= i < 256 + N_MERGES and i % 7 == 0):
            continue
        tokens.append(t)
        types.append(ty)
    merges = vocab["merges"] + [vocab["merges"][10], "nospace", "a b c"]
    ids = {t: i for i, t in enumerate(tokens)}
    holes = dict(vocab, tokens=tokens, token_type=types, merges=merges,
                 bos_token_id=ids["<|begin_of_text|>"], eos_token_id=ids["<|endoftext|>"],
                 eot_token_id=ids["<|eot_id|>"])
    with open(HOLES_JSON, "w", encoding="utf-8") as fh:
        json.dump(holes, fh, ensure_ascii=False, separators=(",", ":"))
        fh.write("\n")
    print(f"{HOLES_JSON}: {len(tokens)} tokens, {len(merges)} merges")


# --- a vocabulary-only GGUF (llama.cpp still wants llama.* hyper-parameters) ---

def gguf_bytes(vocab, pre):
    out = bytearray()
    kvs = []

    def s(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def kv(key, typ, payload):
        kvs.append(s(key) + struct.pack("<I", typ) + payload)

    def kv_str(key, v): kv(key, 8, s(v))
    def kv_u32(key, v): kv(key, 4, struct.pack("<I", v))
    def kv_f32(key, v): kv(key, 6, struct.pack("<f", v))
    def kv_bool(key, v): kv(key, 7, struct.pack("<B", 1 if v else 0))

    def kv_arr(key, elem_type, items, fmt=None):
        payload = struct.pack("<IQ", elem_type, len(items))
        payload += b"".join(s(x) if elem_type == 8 else struct.pack(fmt, x) for x in items)
        kv(key, 9, payload)

    kv_str("general.architecture", "llama")
    kv_str("general.name", "bpe-fixture")
    kv_u32("llama.context_length", 256)
    kv_u32("llama.embedding_length", 64)
    kv_u32("llama.block_count", 1)
    kv_u32("llama.feed_forward_length", 128)
    kv_u32("llama.attention.head_count", 4)
    kv_u32("llama.attention.head_count_kv", 4)
    kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    kv_u32("llama.rope.dimension_count", 16)
    kv_u32("llama.vocab_size", len(vocab["tokens"]))
    kv_str("tokenizer.ggml.model", "gpt2")
    kv_str("tokenizer.ggml.pre", pre)
    kv_arr("tokenizer.ggml.tokens", 8, vocab["tokens"])
    kv_arr("tokenizer.ggml.token_type", 5, vocab["token_type"], "<i")
    kv_arr("tokenizer.ggml.merges", 8, vocab["merges"])
    kv_u32("tokenizer.ggml.bos_token_id", vocab["bos_token_id"])
    kv_u32("tokenizer.ggml.eos_token_id", vocab["eos_token_id"])
    kv_u32("tokenizer.ggml.eot_token_id", vocab["eot_token_id"])
    kv_bool("tokenizer.ggml.add_bos_token", vocab["add_bos_token"])

    out += b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for k in kvs:
        out += k
    out += b"\0" * ((-len(out)) % 32)
    return bytes(out)


def load_vocab(path=VOCAB_JSON):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def test_strings():
    with open(os.path.join(ROOT, "docs", "PERFORMANCE.md"), encoding="utf-8") as fh:
        long_doc = fh.read()[:3000]
    return [
        "", " ", "  ", "   ", "\n", "\n\n\n", "\t", " \t\n ", "\r\n", " \n\n  \n",
        "Hello world", " Hello world", "Hello  world", "Hello   world  ", "hello\nworld",
        "hello \n world", "a\r\nb", "word   ", "   leading", "\n\nparagraph\n\n",
        "1", "12", "123", "1234", "1234567", "12345678901234567890", "3.14159", "1,000,000",
        "2024-01-31", " 42", "x1y22z333", "version 2.0.1", "٣٤٥", "²³", "½", "Ⅻ", "४२",
        "I'm", "DON'T", "we've", "You'LL", "she'd", "it's", "'s", "rock 'n' roll", "O'Neil",
        "They'RE here", "'ll've'd",
        "你好，世界！", "日本語のテキストです。", "한국어 문장입니다", "Chinese中文English",
        "👍", "👨‍👩‍👧‍👦", "🏳️‍🌈", "hi 👋🏽 there", "🇫🇷🇩🇪", "❤️🎉✨",
        "e\u0301", "Ame\u0301lie", "n\u0303", "ä", "t\u0336e\u0337x\u0338t", "Tiếng Việt",
        "नमस्ते दुनिया", "किताबें पढ़ना",
        "def foo(x):\n    return x**2\n", "if (a != b) { return -1; }", "std::vector<int> v{1,2,3};",
        "<html><body>Hi</body></html>", "path/to/file.txt", "https://example.com/a?b=c&d=e",
        "    indented\n\tTabbed", "// comment\n/* block */", "x = [i * 2 for i in range(10)]",
        "Hello, world! How are you?", "...", "!!!???", "$100 + 50% = ~$150 ^_^ |pipe|",
        "“quoted” ‘text’ — dash…", "«French» ¿Spanish?", "a\u00a0b", "a\u3000b", "a\u2003b",
        "a\u180eb", "a\u0085b", "a\u200bb", "a\u2028b", "a\x01b", "a\x1cb", "a\x7fb",
        "Ελληνικά κείμενα", "Привет, мир!", "مرحبا بالعالم", "HelloWorld", "camelCaseWord",
        "ALLCAPS", "XMLHttpRequest", "<|eot_id|>", "<|begin_of_text|>Hi<|im_end|>",
        "snake_case_name", "__init__", "e-mail", "C++ and C#", "tab\there",
        "a" * 500, " " * 300, "9" * 100, "ab " * 200, "\n" * 50, long_doc,
        MULTILINGUAL,
    ] + fuzz_strings(200)


def fuzz_strings(n, seed=9):
    """Random strings over characters that pre-tokenizers treat differently
    (whitespace of all kinds, marks, digits of several scripts, letters,
    symbols, emoji parts) and random code points up to U+2FFFF."""
    r = random.Random(seed)
    pool = list("abcXYZ  \t\n\r'sStTmMdDlLvVeErR0123456789.,!?;:-_()[]{}<>/\\|~^$+=@#%&*\"`") + [
        "\u00a0", "\u3000", "\u2003", "\u180e", "\u0085", "\u200b", "\u2028", "\u1680", "\x0b", "\x0c",
        "\x1c", "\u0301", "\u0308", "\u093e", "\u094d", "é", "ß", "Ω", "ж", "中", "文", "の", "한", "ا", "ب",
        "٣", "४", "²", "½", "Ⅻ", "👍", "🏽", "\u200d", "🇫", "🇷", "\ufe0f", "—", "…", "“", "”", "«", "»", "¿",
        "€", "©", "™", "\x00", "\x7f", "\u00ad"]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(r.randint(1, 40)):
            if r.random() < 0.85:
                chars.append(r.choice(pool))
            else:
                chars.append(chr(r.choice([r.randint(0x80, 0xD7FF), r.randint(0xE000, 0xFFFD),
                                           r.randint(0x10000, 0x2FFFF)])))
        out.append("".join(chars))
    return out


def expected_for(vocab_path, pres, prefix):
    vocab = load_vocab(vocab_path)
    strings = test_strings()
    with tempfile.TemporaryDirectory() as tmp:
        for pre in pres:
            path = os.path.join(tmp, f"{pre}.gguf")
            with open(path, "wb") as fh:
                fh.write(gguf_bytes(vocab, pre))
            res = subprocess.run(["node", os.path.join(ROOT, "bench", "llamacpp", "ref.mjs"), "tokenize", path],
                                 input=json.dumps(strings), capture_output=True, text=True, check=True)
            ids = json.loads(res.stdout)
            assert len(ids) == len(strings)
            out = {"generator": GENERATOR, "regenerate": "python3 scripts/make_bpe_vocab.py expected",
                   "vocab": os.path.basename(vocab_path), "pre": pre,
                   "cases": [{"text": t, "ids": i} for t, i in zip(strings, ids)]}
            dest = os.path.join(FIXTURES, f"{prefix}{pre}.json")
            with open(dest, "w", encoding="utf-8") as fh:
                json.dump(out, fh, ensure_ascii=False, separators=(",", ":"))
                fh.write("\n")
            print(f"{dest}: {len(strings)} strings")


def expected():
    expected_for(VOCAB_JSON, PRES, "bpe-expected-")
    expected_for(HOLES_JSON, HOLES_PRES, "bpe-expected-holes-")


def e2e(exaserve):
    """Runs `exaserve tokenize` on every fixture string; prints the matches per
    vocabulary and pre-tokenizer, and the first few differences."""
    all_ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted(glob.glob(os.path.join(FIXTURES, "bpe-expected-*.json"))):
            with open(path, encoding="utf-8") as fh:
                fx = json.load(fh)
            vocab = load_vocab(os.path.join(FIXTURES, fx["vocab"]))
            vocab["pre"] = fx["pre"]
            vpath, mpath, tpath = (os.path.join(tmp, n) for n in ("v.json", "m.gguf", "t.txt"))
            with open(vpath, "w", encoding="utf-8") as fh:
                json.dump(vocab, fh, ensure_ascii=False)
            subprocess.run([exaserve, "gen-model", "--preset", "tiny", "--vocab", vpath, "--out", mpath],
                           check=True, capture_output=True)
            ok, bad = 0, []
            for case in fx["cases"]:
                with open(tpath, "wb") as fh:
                    fh.write(case["text"].encode("utf-8"))
                res = subprocess.run([exaserve, "tokenize", "--model", mpath, "--text-file", tpath],
                                     capture_output=True, text=True)
                line = res.stdout.strip()
                got = [int(x) for x in line.split(",")] if res.returncode == 0 and line else []
                if res.returncode == 0 and got == case["ids"]:
                    ok += 1
                else:
                    bad.append((case["text"], got, case["ids"], res.stderr.strip()))
            all_ok &= not bad
            print(f"{os.path.basename(path)}: {ok}/{len(fx['cases'])} match llama.cpp")
            for text, got, want, err in bad[:3]:
                print(f"  {ascii(text)[:80]}: got {got[:12]} want {want[:12]} {err[:120]}")
    sys.exit(0 if all_ok else 1)


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "vocab":
        commit = sys.argv[2] if len(sys.argv) > 2 else subprocess.run(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        make_vocab(commit)
    elif len(sys.argv) == 4 and sys.argv[1] == "gguf":
        with open(sys.argv[3], "wb") as fh:
            fh.write(gguf_bytes(load_vocab(), sys.argv[2]))
    elif len(sys.argv) >= 2 and sys.argv[1] == "expected":
        expected()
    elif len(sys.argv) == 3 and sys.argv[1] == "e2e":
        e2e(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
