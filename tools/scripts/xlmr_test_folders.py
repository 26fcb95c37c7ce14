"""XLM-RoBERTa-style model folders made offline, for the tokenizer and model parity tests.

Nothing is downloaded: a real SentencePiece Unigram model is trained here on generated
multilingual text (normalization rule nmt_nfkc, so its precompiled charsmap is a real one), with
XLM-R's special-token layout (<unk> 0, <s> 1, </s> 2 in the .model; transformers shifts pieces by
one and puts <s> <pad> </s> <unk> first and <mask> last). Then:

* saved_folder: what transformers 5 writes with save_pretrained after loading a folder that
  holds sentencepiece.bpe.model (its tokenizer.json: Precompiled normalizer, WhitespaceSplit +
  Metaspace pre-tokenizer);
* published_folder: the layout of folders published on model hubs (tokenizer.json made by
  transformers' XLMRobertaConverter, whose normalizer also strips and replaces runs of spaces,
  a Metaspace-only pre-tokenizer, <mask> with lstrip, the .model beside it, a minimal
  tokenizer_config.json);
* e5_folder: a saved folder whose tokenizer_config.json lists added_tokens_decoder (<mask> with
  lstrip) and whose config.json names XLMRobertaModel, as multilingual-e5's do;
* sized_folder: a saved folder whose vocabulary is grown to XLM-R's 250,002 pieces (the trained
  ones, then pieces made of two to four of them, scored like real ones), for benchmarks: a
  tokenizer of the real size, a model whose embedding table has the real size.

    python tools/scripts/xlmr_test_folders.py OUT_DIR   # writes OUT_DIR/{saved,published,e5}
    python tools/scripts/xlmr_test_folders.py --sized OUT_DIR   # OUT_DIR/sized (the benchmark's)
    python tools/scripts/xlmr_test_folders.py --bench-data bench-data/xlmr-tokenizer
        # the sized folder's tokenizer, gzipped (4 MB), for the GPU host that has no sentencepiece
"""

import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

import make_multilingual_corpus

VOCAB_SIZE = 8000


def train_unigram(out_dir: Path, seed: int = 7, vocab_size: int = VOCAB_SIZE) -> Path:
    """Trains a Unigram model on generated captions; returns the .model file."""
    import sentencepiece as spm

    out_dir.mkdir(parents=True, exist_ok=True)
    maker = make_multilingual_corpus.Maker(seed)
    rng = random.Random(seed)
    text = out_dir / "training_text.txt"
    with open(text, "w", encoding="utf-8") as f:
        for _ in range(40_000):
            script = rng.choice(sorted(make_multilingual_corpus.WORDS))
            line = maker.sentence(script) if rng.random() < 0.7 else maker.mixed()
            f.write(line.replace("\n", " ") + "\n")
    prefix = out_dir / "unigram"
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), vocab_size=vocab_size, model_type="unigram",
        normalization_rule_name="nmt_nfkc", character_coverage=0.9995, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, num_threads=2, minloglevel=2, hard_vocab_limit=False)
    return prefix.with_suffix(".model")


def _model_config(vocab_size: int, architecture: str = "XLMRobertaModel"):
    from transformers import XLMRobertaConfig

    config = XLMRobertaConfig(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=128,
                              max_position_embeddings=514)
    config.architectures = [architecture]
    return config


def saved_folder(model_file: Path, out: Path, tokenizer_config: dict | None = None) -> Path:
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as raw:
        raw = Path(raw)
        shutil.copy(model_file, raw / "sentencepiece.bpe.model")
        json.dump({"model_max_length": 512, "tokenizer_class": "XLMRobertaTokenizer"},
                  open(raw / "tokenizer_config.json", "w"))
        tokenizer = AutoTokenizer.from_pretrained(str(raw))
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(out))
        _model_config(len(tokenizer)).save_pretrained(str(out))
    if tokenizer_config:
        path = out / "tokenizer_config.json"
        merged = json.load(open(path))
        merged.update(tokenizer_config)
        json.dump(merged, open(path, "w"), indent=2, ensure_ascii=False)
    return out


def published_folder(model_file: Path, out: Path) -> Path:
    from transformers.convert_slow_tokenizer import XLMRobertaConverter

    class Original:  # what the converter reads of a slow tokenizer
        vocab_file = str(model_file)

        def __init__(self):
            self.init_kwargs = {}

        def convert_tokens_to_ids(self, token):
            return {"<s>": 0, "</s>": 2}[token]

    tokenizer = json.loads(XLMRobertaConverter(Original()).converted().to_str())
    vocab = [piece for piece, _ in tokenizer["model"]["vocab"]]
    tokenizer["added_tokens"] = [
        {"id": vocab.index(t), "content": t, "single_word": False, "lstrip": t == "<mask>",
         "rstrip": False, "normalized": False, "special": True}
        for t in ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    ]
    out.mkdir(parents=True, exist_ok=True)
    json.dump(tokenizer, open(out / "tokenizer.json", "w"), ensure_ascii=False)
    shutil.copy(model_file, out / "sentencepiece.bpe.model")
    json.dump({"model_max_length": 512}, open(out / "tokenizer_config.json", "w"))
    _model_config(len(vocab), "XLMRobertaForMaskedLM").save_pretrained(str(out))
    return out


def e5_folder(model_file: Path, out: Path) -> Path:
    specials = [(0, "<s>"), (1, "<pad>"), (2, "</s>"), (3, "<unk>")]
    folder = saved_folder(model_file, out)
    vocab_size = json.load(open(folder / "config.json"))["vocab_size"]
    specials.append((vocab_size - 1, "<mask>"))
    decoder = {str(i): {"content": t, "lstrip": t == "<mask>", "normalized": False,
                        "rstrip": False, "single_word": False, "special": True}
               for i, t in specials}
    path = folder / "tokenizer_config.json"
    config = json.load(open(path))
    config["added_tokens_decoder"] = decoder
    json.dump(config, open(path, "w"), indent=2)
    return folder


def sized_folder(model_file: Path, out: Path, vocab_size: int = 250_002, seed: int = 11) -> Path:
    """saved_folder with the vocabulary grown to `vocab_size` pieces (<mask> stays last)."""
    folder = saved_folder(model_file, out)
    path = folder / "tokenizer.json"
    tokenizer = json.load(open(path, encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    mask = vocab.pop()
    assert mask[0] == "<mask>", mask
    rng = random.Random(seed)
    real = [(piece, score) for piece, score in vocab[4:] if piece != "\u2581"]
    scores = sorted(score for _, score in real)
    seen = {piece for piece, _ in vocab}
    while len(vocab) < vocab_size - 1:
        parts = rng.choices(real, k=rng.randint(2, 4))
        piece = parts[0][0] + "".join(p.lstrip("\u2581") for p, _ in parts[1:])
        if piece in seen:
            continue
        seen.add(piece)
        vocab.append([piece, rng.choice(scores) - rng.random()])
    vocab.append(mask)
    for added in tokenizer["added_tokens"]:
        if added["content"] == "<mask>":
            added["id"] = len(vocab) - 1
    json.dump(tokenizer, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    config = json.load(open(folder / "config.json"))
    config["vocab_size"] = len(vocab)
    json.dump(config, open(folder / "config.json", "w"), indent=2)
    return folder


def main():
    args = sys.argv[1:]
    sized = args[:1] == ["--sized"]
    out = Path(args[-1])
    if args[:1] == ["--bench-data"]:
        import gzip
        with tempfile.TemporaryDirectory() as tmp:
            folder = sized_folder(train_unigram(Path(tmp) / "spm"), Path(tmp) / "sized")
            out.mkdir(parents=True, exist_ok=True)
            with gzip.open(out / "tokenizer.json.gz", "wb", compresslevel=9) as f:
                f.write((folder / "tokenizer.json").read_bytes())
            for name in ("tokenizer_config.json", "config.json"):
                shutil.copy(folder / name, out / name)
        print(out)
        return
    model_file = train_unigram(out / "spm")
    if sized:
        print(sized_folder(model_file, out / "sized"))
        return
    saved_folder(model_file, out / "saved")
    published_folder(model_file, out / "published")
    e5_folder(model_file, out / "e5")
    print(out)


if __name__ == "__main__":
    main()
