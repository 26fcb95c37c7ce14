"""XLM-RoBERTa-family folders (encoder type bert) against sentence-transformers, fp32 on CPU.

The folders are multilingual-e5's layout (XLMRobertaModel + mean pooling + Normalize) and
paraphrase-multilingual-MiniLM's (a BertModel with the XLM-R tokenizer), with random weights and
the Unigram tokenizer trained offline by tools/scripts/xlmr_test_folders.py. Captions are the
multilingual parity corpus (tests/data/multilingual_corpus.jsonl), plus captions holding "<pad>"
literally, which RoBERTa's position numbering must not count (Note [RoBERTa's positions] in
encoders/bert/bert_model.cpp)."""

import base64
import json
import subprocess

import numpy as np
import pytest
import torch

from conftest import (ROOT, assert_same_output, run_precompute, run_text_folder,
                      write_manifest)

SEED = 20261207
HIDDEN = 96


def corpus_texts(limit=None):
    lines = (ROOT / "tests" / "data" / "multilingual_corpus.jsonl").read_text().splitlines()
    texts = [base64.b64decode(json.loads(line)["b64"]).decode("utf-8", "replace")
             for line in lines if line]
    return texts[:limit] if limit else texts


def write_sentence_transformers_files(folder, max_seq_length=512):
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": HIDDEN, "pooling_mode_mean_tokens": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_seq_length, "do_lower_case": False}))


@pytest.fixture(scope="module")
def unigram_model(tmp_path_factory):
    pytest.importorskip("sentencepiece")
    import xlmr_test_folders
    return xlmr_test_folders.train_unigram(tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def e5_like(tmp_path_factory, unigram_model):
    """XLMRobertaModel, 4 layers of 96, with multilingual-e5's files around it."""
    import xlmr_test_folders
    from transformers import XLMRobertaConfig, XLMRobertaModel
    folder = xlmr_test_folders.e5_folder(unigram_model, tmp_path_factory.mktemp("e5") / "m")
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    torch.manual_seed(SEED)
    config = XLMRobertaConfig(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=4,
                              num_attention_heads=4, intermediate_size=192,
                              max_position_embeddings=514, layer_norm_eps=1e-5)
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    write_sentence_transformers_files(folder)
    return folder


@pytest.fixture(scope="module")
def multilingual_minilm_like(tmp_path_factory, unigram_model):
    """A BertModel with the XLM-R tokenizer, as paraphrase-multilingual-MiniLM-L12-v2 is."""
    import xlmr_test_folders
    from transformers import BertConfig, BertModel
    folder = xlmr_test_folders.saved_folder(unigram_model,
                                            tmp_path_factory.mktemp("mminilm") / "m")
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    torch.manual_seed(SEED + 1)
    config = BertConfig(vocab_size=vocab, hidden_size=HIDDEN, num_hidden_layers=3,
                        num_attention_heads=4, intermediate_size=192, pad_token_id=1)
    BertModel(config, add_pooling_layer=False).save_pretrained(str(folder))
    write_sentence_transformers_files(folder, max_seq_length=128)
    return folder


def compare_with_sentence_transformers(binary, tmp, folder, texts, name):
    from sentence_transformers import SentenceTransformer
    out, _ = run_text_folder(binary, tmp, folder, texts, name)
    model = SentenceTransformer(str(folder), device="cpu")
    expected = model.encode(texts, batch_size=64, convert_to_numpy=True)
    stored = {i: out.samples[f"t{i:04d}"]["text"]["vector"]
              for i in range(len(texts)) if f"t{i:04d}" in out.samples
              and "text" in out.samples[f"t{i:04d}"]}
    # Captions with no token left (white space only, controls only) are failure records.
    failed = set(range(len(texts))) - set(stored)
    for i in failed:
        assert not model.tokenizer(texts[i])["input_ids"][1:-1] or not texts[i].strip(), texts[i]
    assert len(stored) >= 0.95 * len(texts)
    kept = sorted(stored)
    got = np.stack([stored[i] for i in kept])
    want = expected[kept]
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.99999, (cos.min(), texts[kept[int(np.argmin(cos))]])
    assert np.abs(got - want).max() <= 1e-4
    return out


def test_e5_like_folder_matches_sentence_transformers(binary, e5_like, tmp_path):
    texts = corpus_texts() + ["a <pad> b", "<pad><pad> x <pad>", "query: <pad> café"]
    compare_with_sentence_transformers(binary, tmp_path, e5_like, texts, "e5")


def test_bert_with_xlmr_tokenizer_matches_sentence_transformers(binary, multilingual_minilm_like,
                                                                 tmp_path):
    texts = corpus_texts(800)
    out = compare_with_sentence_transformers(binary, tmp_path, multilingual_minilm_like, texts,
                                             "mminilm")
    truncated = [k for k in out.samples if out.samples[k]["text"]["truncated"]]
    assert truncated, "the long-word captions exceed max_seq_length 128"


def test_wordpiece_settings_are_refused_for_an_xlmr_folder(binary, e5_like, tmp_path):
    _, result = run_text_folder(binary, tmp_path, e5_like, ["hello"], "refused", expect=2,
                         tokenizer={"lower_case": True})
    assert "text.tokenizer.lower_case" in result.stderr
    assert "XLM-RoBERTa" in result.stderr and "remove" in result.stderr


def test_max_length_beyond_the_positions_is_refused(binary, e5_like, tmp_path):
    _, result = run_text_folder(binary, tmp_path, e5_like, ["hello"], "too-long", expect=2,
                         tokenizer={"max_length": 513})
    assert "513" in result.stderr and "512" in result.stderr


def test_tokenize_command_shows_xlmr_pieces(binary, e5_like):
    from transformers import AutoTokenizer
    reference = AutoTokenizer.from_pretrained(str(e5_like))
    text = "Ｈéllo  wörld, 東京 <mask> 😀"
    shown = subprocess.run([str(binary), "tokenize", "--model", str(e5_like), "--json", text],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout)
    assert result["ids"] == reference(text)["input_ids"]
    assert result["tokens"] == reference.convert_ids_to_tokens(result["ids"])
    cased = subprocess.run([str(binary), "tokenize", "--model", str(e5_like), "--cased", text],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert cased.returncode == 2 and "drop --cased" in cased.stderr, cased.stderr


def test_prefix_matches_sentence_transformers_prompts(binary, e5_like, tmp_path):
    from sentence_transformers import SentenceTransformer
    texts = corpus_texts(300)[100:300]
    out, _ = run_text_folder(binary, tmp_path, e5_like, texts, "passage", prefix="passage: ")
    model = SentenceTransformer(str(e5_like), device="cpu")
    expected = model.encode(texts, prompt="passage: ", batch_size=64, convert_to_numpy=True)
    plain = model.encode(texts, batch_size=64, convert_to_numpy=True)
    kept = [i for i in range(len(texts)) if "text" in out.samples.get(f"t{i:04d}", {})]
    assert len(kept) >= 0.95 * len(texts)
    got = np.stack([out.samples[f"t{i:04d}"]["text"]["vector"] for i in kept])
    assert np.abs(got - expected[kept]).max() <= 1e-4
    assert np.abs(got - plain[kept]).max() > 1e-2, "the prefix must change the vectors"
    assert out.index["model_settings"]["text.prefix"] == {"value": "passage: ",
                                                          "source": "config file"}


def test_a_folders_default_prompt_is_the_default_prefix(binary, e5_like, tmp_path):
    import shutil
    from sentence_transformers import SentenceTransformer
    folder = tmp_path / "prompted"
    shutil.copytree(e5_like, folder)
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "query: ", "passage": "passage: "},
         "default_prompt_name": "query"}))
    texts = corpus_texts(120)
    out, _ = run_text_folder(binary, tmp_path, folder, texts, "prompted-out")
    model = SentenceTransformer(str(folder), device="cpu")
    expected = model.encode(texts, batch_size=64, convert_to_numpy=True)  # its default prompt
    kept = [i for i in range(len(texts)) if "text" in out.samples.get(f"t{i:04d}", {})]
    got = np.stack([out.samples[f"t{i:04d}"]["text"]["vector"] for i in kept])
    assert np.abs(got - expected[kept]).max() <= 1e-4
    assert out.index["model_settings"]["text.prefix"] == {"value": "query: ",
                                                          "source": "model folder"}


@pytest.mark.parametrize("prefix, fragment", [
    ("pass\u0000age: ", "NUL"),
    ("x" * 5000, "at most 4096 bytes"),
    ("word " * 600, "no room for the caption"),
])
def test_bad_prefixes_are_refused(binary, e5_like, tmp_path, prefix, fragment):
    _, result = run_text_folder(binary, tmp_path, e5_like, ["hello"], "bad-prefix", expect=2,
                         prefix=prefix)
    assert "text.prefix" in result.stderr and fragment in result.stderr, result.stderr[-1500:]


def test_a_prefix_is_refused_where_pooling_leaves_the_prompt_out(binary, e5_like, tmp_path):
    import shutil
    folder = tmp_path / "no-prompt-pooling"
    shutil.copytree(e5_like, folder)
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    pooling["include_prompt"] = False
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    _, result = run_text_folder(binary, tmp_path, folder, ["hello"], "excluded", expect=2,
                         prefix="query: ")
    assert "include_prompt false" in result.stderr


def edited_copy(folder, tmp_path, name, file, edit):
    import shutil
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    path = copy / file
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("name, file, edit, fragments", [
    ("other-class", "tokenizer_config.json",
     lambda d: d.update(tokenizer_class="CamembertTokenizer"),
     ["tokenizer_class \"CamembertTokenizer\"", "XLMRobertaTokenizer"]),
    ("byte-fallback", "tokenizer.json", lambda d: d["model"].update(byte_fallback=True),
     ["byte_fallback true is not supported"]),
    ("no-pieces", "tokenizer.json", lambda d: d["model"].update(vocab=[]),
     ["has no vocab"]),
    ("bad-piece", "tokenizer.json", lambda d: d["model"]["vocab"].__setitem__(7, ["x"]),
     ["vocab entry 7", "is not a [piece, score] pair"]),
    ("bad-charsmap", "tokenizer.json",
     lambda d: d["normalizer"].update(precompiled_charsmap="not base64!"),
     ["precompiled_charsmap is not valid base64"]),
    ("normalized-added", "tokenizer_config.json",
     lambda d: d["added_tokens_decoder"]["0"].update(normalized=True),
     ["added token '<s>' with normalized or single_word true is not supported"]),
    ("foreign-eos", "tokenizer_config.json", lambda d: d.update(eos_token="[SEP]"),
     ["the eos token '[SEP]'", "is not in the vocabulary"]),
    ("small-model", "config.json", lambda d: d.update(vocab_size=100),
     ["pieces but config.json's vocab_size is 100"]),
    ("lower-cased", "sentence_bert_config.json", lambda d: d.update(do_lower_case=True),
     ["do_lower_case true with an XLM-RoBERTa (Unigram) tokenizer is not supported"]),
])
def test_folders_it_cannot_reproduce_are_refused(binary, e5_like, tmp_path, name, file, edit,
                                                 fragments):
    folder = edited_copy(e5_like, tmp_path, name, file, edit)
    _, result = run_text_folder(binary, tmp_path, folder, ["hello"], f"{name}-out", expect=2)
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr[-1500:])
    assert str(folder) in result.stderr


def test_a_folder_with_only_the_sentencepiece_file_says_how_to_write_tokenizer_json(
        binary, e5_like, unigram_model, tmp_path):
    import shutil
    folder = tmp_path / "spm-only"
    shutil.copytree(e5_like, folder)
    (folder / "tokenizer.json").unlink()
    shutil.copy(unigram_model, folder / "sentencepiece.bpe.model")
    _, result = run_text_folder(binary, tmp_path, folder, ["hello"], "spm-only-out", expect=2)
    assert "has sentencepiece.bpe.model but no tokenizer.json" in result.stderr, result.stderr
    assert "save_pretrained" in result.stderr


def test_ranks_a_crash_and_a_changed_prefix(binary, e5_like, tmp_path):
    """An XLM-R job with a prefix over 3 ranks, one of them killed at a shard's commit and run
    again, merges into what one process writes; resuming with another prefix is refused, as the
    prefix changes every vector."""
    import shutil
    texts = corpus_texts(600)
    manifest = write_manifest(tmp_path / "captions.jsonl",
                              [{"id": f"t{i:04d}", "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "out"
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(out), "dtype": "float32", "shard_size": 64},
              "text": {"encoder": {"type": "bert", "path": str(e5_like)}, "batch_size": 32,
                       "prefix": "passage: "}}
    run_precompute(binary, tmp_path, config)
    oracle = tmp_path / "oracle"
    shutil.move(str(out), oracle)

    for rank in (2, 0):
        run_precompute(binary, tmp_path, config, "--rank", str(rank), "--world-size", "3")
    crashed = run_precompute(binary, tmp_path, config, "--rank", "1", "--world-size", "3",
                             "--no-supervisor", expect=None,
                             env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@2"})
    assert crashed.returncode != 0
    changed = {**config, "text": {**config["text"], "prefix": "query: "}}
    refused = run_precompute(binary, tmp_path, changed, "--rank", "1", "--world-size", "3",
                             expect=2)
    assert "text.prefix" in refused.stderr, refused.stderr[-2000:]
    resumed = run_precompute(binary, tmp_path, config, "--rank", "1", "--world-size", "3")
    assert f"merged 3 rank(s) into {out}" in resumed.stderr, resumed.stderr[-2000:]
    assert_same_output(oracle, out)


def test_tokenize_shows_the_ids_run_embeds_prefix_included(binary, e5_like, tmp_path):
    from transformers import AutoTokenizer
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"input": {"manifest": "unused.jsonl"},
                                  "output": {"path": str(tmp_path / "out")},
                                  "text": {"encoder": {"type": "bert", "path": str(e5_like)},
                                           "prefix": "passage: "}}))
    texts = ["Ｈéllo wörld, 東京", "a <pad> b"]
    shown = subprocess.run([str(binary), "tokenize", "--config", str(config), "--json", *texts],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(str(e5_like))
    for row, text in zip(rows, texts):
        assert row["text"] == text and row["prefix"] == "passage: "
        assert row["ids"] == tokenizer("passage: " + text)["input_ids"], text
    plain = subprocess.run([str(binary), "tokenize", "--model", str(e5_like), "--json", texts[0]],
                           capture_output=True, text=True)
    assert "prefix" not in json.loads(plain.stdout)
    stats = subprocess.run([str(binary), "tokenize", "--config", str(config), "--stats", *texts],
                           capture_output=True, text=True)
    assert stats.returncode == 0 and 'text.prefix "passage: "' in stats.stdout, stats.stdout
