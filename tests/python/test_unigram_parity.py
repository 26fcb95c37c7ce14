"""Parity of precompute's XLM-RoBERTa (Unigram) tokenizer with transformers' XLMRobertaTokenizer.

The folders are made offline by tools/scripts/xlmr_test_folders.py: a real SentencePiece
Unigram model trained here (nmt_nfkc, so its charsmap is a real one) in the layout
transformers 5 saves, the layout published folders ship, and multilingual-e5's
added_tokens_decoder variant. Every string of tests/data/multilingual_corpus.jsonl (made by
tools/scripts/make_multilingual_corpus.py: 2,000+ captions in 11 scripts and the hard cases)
goes through tests/tools/tokenizer_dump and through AutoTokenizer.from_pretrained(folder), the
tokenizer sentence-transformers runs; the ids must be equal for every string, at two
max_lengths, with the truncated flag and the count of invalid UTF-8 bytes.

Two controls show that the corpus tells tokenizers apart: the sentencepiece library on the
folder's .model, and the tokenizers library reading the published tokenizer.json directly, each
disagree with transformers on some strings (so equality above is not a corpus too easy to fail).
"""

import base64
import codecs
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, ROOT, skip_unless_ci

os.environ["HF_HUB_OFFLINE"] = "1"

DUMP = BUILD / "tests" / "tools" / "tokenizer_dump"
CORPUS = ROOT / "tests" / "data" / "multilingual_corpus.jsonl"
LAYOUTS = ["saved", "published", "e5"]
MAX_LENGTHS = [512, 12]


def corpus():
    lines = [json.loads(line) for line in CORPUS.read_text().splitlines() if line]
    return [(line["kind"], base64.b64decode(line["b64"])) for line in lines]


def decode(raw: bytes):
    """bytes.decode with "replace", and the number of bytes replaced."""
    replaced = [0]

    def count(error):
        replaced[0] += error.end - error.start
        return codecs.replace_errors(error)

    codecs.register_error("count_replace", count)
    return raw.decode("utf-8", "count_replace"), replaced[0]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    import xlmr_test_folders
    try:
        import sentencepiece  # noqa: F401
    except ImportError:
        skip_unless_ci("sentencepiece is not installed (python/requirements.txt has it)")
    out = tmp_path_factory.mktemp("xlmr")
    model_file = xlmr_test_folders.train_unigram(out / "spm")
    return {
        "model_file": model_file,
        "saved": xlmr_test_folders.saved_folder(model_file, out / "saved"),
        "published": xlmr_test_folders.published_folder(model_file, out / "published"),
        "e5": xlmr_test_folders.e5_folder(model_file, out / "e5"),
    }


def run_dump(folder, raws, tmp_path, max_length):
    if not DUMP.is_file():
        skip_unless_ci(f"{DUMP} not found: build the tokenizer_dump target")
    source = tmp_path / "texts.jsonl"
    with open(source, "w") as f:
        for raw in raws:
            f.write(json.dumps({"b64": base64.b64encode(raw).decode()}) + "\n")
    result = subprocess.run(
        [str(DUMP), "--unigram-folder", str(folder), "--max-length", str(max_length), str(source)],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_corpus_is_what_its_script_makes():
    import make_multilingual_corpus
    expected = [(kind, raw) for kind, raw in make_multilingual_corpus.corpus()]
    assert corpus() == expected, "regenerate it with tools/scripts/make_multilingual_corpus.py"
    kinds = {kind for kind, _ in expected}
    assert len({k for k in kinds if k.startswith("script:")}) >= 10
    assert len(expected) >= 2000


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ids_equal_transformers_for_every_string(folders, layout, tmp_path):
    from transformers import AutoTokenizer
    folder = folders[layout]
    reference = AutoTokenizer.from_pretrained(str(folder))
    assert type(reference).__name__ == "XLMRobertaTokenizer"
    entries = corpus()
    raws = [raw for _, raw in entries]
    texts = [decode(raw) for raw in raws]
    full = [reference(text)["input_ids"] for text, _ in texts]
    for max_length in MAX_LENGTHS:
        got = run_dump(folder, raws, tmp_path, max_length)
        assert len(got) == len(entries)
        wrong = []
        for (kind, raw), (text, invalid), whole, line in zip(entries, texts, full, got):
            expected = reference(text, truncation=True, max_length=max_length)["input_ids"]
            if (line["ids"] != expected or line["truncated"] != (len(whole) > max_length)
                    or line["invalid_utf8_bytes"] != invalid):
                wrong.append((kind, raw, reference.convert_ids_to_tokens(expected),
                              [reference.convert_ids_to_tokens(i) for i in [line["ids"]]][0]))
        assert not wrong, (
            f"{len(wrong)} of {len(entries)} strings differ at max_length {max_length}; first: "
            + "\n".join(f"{k} {r!r}\n  transformers {e}\n  precompute   {g}"
                        for k, r, e, g in wrong[:5]))


def test_the_corpus_tells_tokenizers_apart(folders):
    """The controls: other readings of the same model disagree with transformers here."""
    import sentencepiece as spm
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    reference = AutoTokenizer.from_pretrained(str(folders["published"]))
    library = Tokenizer.from_file(str(folders["published"] / "tokenizer.json"))
    processor = spm.SentencePieceProcessor(model_file=str(folders["model_file"]))
    texts = [decode(raw)[0] for _, raw in corpus()]
    by_library = by_sentencepiece = 0
    for text in texts:
        expected = reference(text)["input_ids"]
        by_library += library.encode(text).ids != expected
        # fairseq's offset: pieces move up by one, the .model's <unk> (0) is id 3.
        pieces = [3 if p == 0 else p + 1 for p in processor.encode(text)]
        by_sentencepiece += [0, *pieces, 2] != expected
    print(f"tokenizers on tokenizer.json differs on {by_library}, sentencepiece on "
          f"{by_sentencepiece} of {len(texts)} strings")
    assert by_library > 0
    assert by_sentencepiece > 0
