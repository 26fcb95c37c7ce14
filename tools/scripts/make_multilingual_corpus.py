"""Writes the multilingual tokenizer parity corpus (tests/data/multilingual_corpus.jsonl).

Each line is {"kind": KIND, "b64": base64 of the text's bytes}: captions in the scripts that
mixed-language video datasets carry, and the inputs where tokenizers disagree (combining marks,
zero-width and control characters, full-width forms, emoji sequences, very long words, white
space only, special tokens written in the text, invalid UTF-8). The same seed gives the same
file, so the committed corpus can be checked against this script:

    python tools/scripts/make_multilingual_corpus.py > tests/data/multilingual_corpus.jsonl

tests/python/test_unigram_parity.py tokenizes every line with precompute and with transformers.
"""

import base64
import json
import random
import sys

# A few real words per script, so that trained vocabularies have real pieces to find.
WORDS = {
    "latin": "the quick brown fox jumps over a lazy dog while people watch the video clip".split(),
    "accents": "café naïve résumé über straße façade año coração żółw ångström crème brûlée "
    "Ελλάδα İstanbul ağaç çiçek Dvořák smörgåsbord".split(),
    "cyrillic": "привет мир быстрая лиса прыгает через ленивую собаку видео Москва Київ "
    "щоденник ёлка".split(),
    "greek": "γειά σου κόσμε η γρήγορη καφέ αλεπού πηδάει πάνω από τον σκύλο Αθήνα".split(),
    "arabic": "مرحبا بالعالم الثعلب البني السريع يقفز فوق الكلب الكسول فيديو".split(),
    "hebrew": "שלום עולם השועל החום המהיר קופץ מעל הכלב העצלן סרטון".split(),
    "devanagari": "नमस्ते दुनिया तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है क्षत्रिय".split(),
    "thai": "สวัสดีชาวโลก สุนัขจิ้งจอก สีน้ำตาล กระโดด ข้าม สุนัข ขี้เกียจ วิดีโอ".split(),
    "chinese": "你好 世界 敏捷的 棕色 狐狸 跳过 懒狗 视频 東京 北京".split(),
    "japanese": "こんにちは 世界 素早い 茶色の 狐が 怠け者の 犬を 飛び越える カタカナ".split(),
    "korean": "안녕하세요 세계 빠른 갈색 여우가 게으른 개를 뛰어넘는다 동영상".split(),
}

EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "🇯🇵", "❤️", "🏳️‍🌈", "✋🏿", "🧑🏻‍💻", "#️⃣", "🤖", "👀"]
COMBINING = ["\u0301", "\u0300", "\u0308", "\u0327", "\u030c", "\u0323", "\u0338", "\u20dd"]
ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u200e", "\u202e"]
CONTROLS = ["\x00", "\x01", "\x07", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\x9f"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2003", "\u2028", "\u205f"]
SPECIALS = ["<s>", "</s>", "<pad>", "<unk>", "<mask>", "< s>", "<S>", "</s", "<mask >"]
PUNCT = list(".,!?;:'\"()[]{}-–—…«»„“”‘’¿¡、。，！？・「」") + ["...", "!!", "?!"]


def full_width(text):
    """ASCII letters and digits as their full-width forms (NFKC maps them back)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


class Maker:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def words(self, script, low=1, high=10):
        return [self.r.choice(WORDS[script]) for _ in range(self.r.randint(low, high))]

    def sentence(self, script):
        words = self.words(script)
        if self.r.random() < 0.5:
            words[-1] += self.r.choice(PUNCT)
        if self.r.random() < 0.2:
            words.insert(self.r.randrange(len(words) + 1), str(self.r.randint(0, 10**6)))
        text = " ".join(words)
        return text.capitalize() if self.r.random() < 0.3 else text

    def mixed(self):
        scripts = self.r.sample(sorted(WORDS), self.r.randint(2, 4))
        return self.r.choice(SPACES[:3]).join(self.sentence(s) for s in scripts)

    def marks(self):
        text = self.sentence(self.r.choice(["latin", "accents", "cyrillic", "greek"]))
        out = []
        for c in text:
            out.append(c)
            if c.isalpha() and self.r.random() < 0.3:
                out.extend(self.r.choices(COMBINING, k=self.r.randint(1, 3)))
        return "".join(out)

    def sprinkle(self, pool, rate=0.15):
        text = self.mixed()
        return "".join(c + (self.r.choice(pool) if self.r.random() < rate else "") for c in text)

    def emoji(self):
        parts = self.words(self.r.choice(sorted(WORDS)), 1, 4)
        for _ in range(self.r.randint(1, 4)):
            parts.insert(self.r.randrange(len(parts) + 1), "".join(self.r.choices(EMOJI, k=2)))
        return self.r.choice([" ", ""]).join(parts)

    def long_word(self):
        script = self.r.choice(sorted(WORDS))
        return "".join(self.words(script, 20, 80)) + " " + self.sentence("latin")

    def white_space(self):
        return "".join(self.r.choices(SPACES, k=self.r.randint(1, 6)))

    def specials(self):
        words = self.words(self.r.choice(sorted(WORDS)), 2, 6)
        for _ in range(self.r.randint(1, 3)):
            special = self.r.choice(SPECIALS)
            glue = self.r.choice(["", " ", "  "])
            at = self.r.randrange(len(words) + 1)
            words.insert(at, glue + special + self.r.choice(["", " "]))
        return self.r.choice([" ", ""]).join(words)

    def random_code_points(self):
        ranges = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F),
                  (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x2BFF), (0x3000, 0x30FF),
                  (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF)]
        out = []
        for _ in range(self.r.randint(1, 24)):
            low, high = self.r.choice(ranges)
            out.append(chr(self.r.randint(low, high)))
        return "".join(out)

    def invalid_utf8(self):
        raw = self.mixed().encode()
        junk = [b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\x80\x80",
                b"\xc0\xaf"]
        for _ in range(self.r.randint(1, 3)):
            at = self.r.randrange(len(raw) + 1)
            raw = raw[:at] + self.r.choice(junk) + raw[at:]
        return raw


def corpus(seed=20261207):
    m = Maker(seed)
    kinds = [(f"script:{s}", lambda s=s: m.sentence(s), 80) for s in sorted(WORDS)]
    kinds += [
        ("mixed", m.mixed, 200),
        ("combining", m.marks, 120),
        ("zero_width", lambda: m.sprinkle(ZERO_WIDTH), 100),
        ("controls", lambda: m.sprinkle(CONTROLS), 100),
        ("full_width", lambda: full_width(m.sentence("latin")), 80),
        ("full_width_mixed", lambda: m.sprinkle([full_width("A1!"), "\uff0e", "\uff5e"]), 40),
        ("emoji", m.emoji, 120),
        ("long_word", m.long_word, 40),
        ("white_space", m.white_space, 40),
        ("specials", m.specials, 100),
        ("code_points", m.random_code_points, 200),
        ("invalid_utf8", m.invalid_utf8, 60),
    ]
    fixed = ["", " ", "\u2581", "a\u2581b", "\u2581\u2581x", "e\u0301", "\u1100\u1161\u11a8",
             "\ufb01", "\u3231", "\u2460", "\u00bd", "\u2126", "\u212b", "x" * 600]
    for text in fixed:
        yield "fixed", text.encode()
    for kind, make, count in kinds:
        for _ in range(count):
            text = make()
            yield kind, text if isinstance(text, bytes) else text.encode("utf-8")


def main():
    out = sys.stdout
    for kind, raw in corpus():
        out.write(json.dumps({"kind": kind, "b64": base64.b64encode(raw).decode()}) + "\n")


if __name__ == "__main__":
    main()
