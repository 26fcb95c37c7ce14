"""The native BERT encoder (encoder type bert) against transformers, fp32 on CPU: the real
all-MiniLM-L6-v2 with its sentence-transformers pooling, a randomly initialised bert-base, every
pooling, a chosen layer, batch == single, and clear errors for folders it cannot run."""

import json
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch

from conftest import run_precompute, run_text_folder, write_manifest

SEED = 20261130


def make_texts(count: int, seed: int, max_words: int = 40):
    """Captions of mixed length and script; some longer than max_length."""
    rng = random.Random(seed)
    words = ["video", "guitar", "man", "playing", "the", "a", "dog", "runs", "café", "naïve",
             "東京", "タワー", "über", "straße", "emoji", "🎸", "don't", "self-driving", "3.14",
             "Ωmega", "résumé", "x", "supercalifragilisticexpialidocious", "(quoted)", "Hello!"]
    texts = []
    for i in range(count):
        n = rng.randint(1, max_words if i % 10 else 4 * max_words)
        texts.append(" ".join(rng.choice(words) for _ in range(n)))
    return texts


def hf_reference(folder, texts, max_length, pooling="mean", normalize=False, layer=-1):
    """transformers BertModel fp32 + pooling over real tokens, batched by length."""
    from transformers import BertModel, BertTokenizerFast
    tokenizer = BertTokenizerFast.from_pretrained(str(folder))
    model = BertModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = [None] * len(texts)
    with torch.inference_mode():
        for start in range(0, len(order), 32):
            idx = order[start:start + 32]
            batch = tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                              max_length=max_length, return_tensors="pt")
            result = model(**batch, output_hidden_states=layer != -1)
            hidden = result.last_hidden_state if layer == -1 else result.hidden_states[layer]
            mask = batch["attention_mask"].unsqueeze(-1).float()
            if pooling == "mean":
                pooled = (hidden * mask).sum(1) / mask.sum(1)
            elif pooling == "cls":
                pooled = hidden[:, 0]
            elif pooling == "max":
                pooled = hidden.masked_fill(mask == 0, float("-inf")).amax(1)
            else:
                pooled = None
            for r, i in enumerate(idx):
                if pooled is None:
                    n = int(batch["attention_mask"][r].sum())
                    out[i] = hidden[r, :n].numpy()
                else:
                    v = pooled[r]
                    out[i] = (torch.nn.functional.normalize(v, dim=0) if normalize else v).numpy()
    return out


def stored(out, i, key="vector"):
    return out.samples[f"t{i:04d}"]["text"][key]


@pytest.fixture(scope="module")
def bert_base(tmp_path_factory, minilm_folder):
    """A randomly initialised bert-base (12 x 768) with the MiniLM (= bert-base-uncased) vocab."""
    from transformers import BertConfig, BertModel
    torch.manual_seed(SEED)
    folder = tmp_path_factory.mktemp("bert-base")
    BertModel(BertConfig()).save_pretrained(str(folder), safe_serialization=True)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        shutil.copy(minilm_folder / name, folder / name)
    return folder


def test_minilm_matches_sentence_transformers_on_1000_texts(binary, minilm_folder, tmp_path):
    from sentence_transformers import SentenceTransformer
    texts = make_texts(1000, SEED)
    out, _ = run_text_folder(binary, tmp_path, minilm_folder, texts, "minilm")
    model = SentenceTransformer(str(minilm_folder), device="cpu")
    expected = model.encode(texts, batch_size=64, convert_to_numpy=True)
    got = np.stack([stored(out, i) for i in range(len(texts))])
    # The folder's own pooling: mean + Normalize (sentence-transformers' modules.json).
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.abs(got - expected).max() <= 1e-4
    long_ones = [i for i, t in enumerate(texts) if stored(out, i, "truncated")]
    assert long_ones, "some texts must exceed max_length 256"
    assert all(out.samples[f"t{i:04d}"]["text"]["steps"] == 256 for i in long_ones)


def test_random_bert_base_matches_transformers_on_1000_texts(binary, bert_base, tmp_path):
    texts = make_texts(1000, SEED + 1, max_words=12)
    out, _ = run_text_folder(binary, tmp_path, bert_base, texts, "base")
    expected = hf_reference(bert_base, texts, max_length=512)
    diff = max(np.abs(stored(out, i) - expected[i]).max() for i in range(len(texts)))
    assert diff <= 1e-4, diff


@pytest.mark.parametrize("pooling", ["cls", "max", "none"])
def test_every_pooling_and_token_vectors(binary, bert_base, tmp_path, pooling):
    texts = make_texts(60, SEED + 2, max_words=20)
    out, _ = run_text_folder(binary, tmp_path, bert_base, texts, pooling, pooling=pooling,
                      tokenizer={"max_length": 32})
    expected = hf_reference(bert_base, texts, max_length=32, pooling=pooling)
    key = "rows" if pooling == "none" else "vector"
    for i in range(len(texts)):
        got = stored(out, i, key)
        assert got.shape == expected[i].shape
        assert np.abs(got - expected[i]).max() <= 1e-4, (pooling, i)


def test_output_layer_and_normalize(binary, bert_base, tmp_path):
    texts = make_texts(40, SEED + 3, max_words=15)
    out, _ = run_text_folder(binary, tmp_path, bert_base, texts, "layer3", output_layer=3,
                      normalize=True)
    expected = hf_reference(bert_base, texts, max_length=512, layer=3, normalize=True)
    for i in range(len(texts)):
        assert np.abs(stored(out, i) - expected[i]).max() <= 1e-4


def test_batch_equals_single(binary, bert_base, tmp_path):
    texts = make_texts(48, SEED + 4, max_words=30)
    batched, _ = run_text_folder(binary, tmp_path, bert_base, texts, "batched", batch_size=48)
    single, _ = run_text_folder(binary, tmp_path, bert_base, texts, "single", batch_size=1)
    diff = max(np.abs(stored(batched, i) - stored(single, i)).max() for i in range(len(texts)))
    assert diff <= 1e-5, diff


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, minilm_folder):
    from transformers import BertConfig, BertModel
    torch.manual_seed(SEED)
    folder = tmp_path_factory.mktemp("tiny-bert")
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64)
    BertModel(config).save_pretrained(str(folder), safe_serialization=True)
    shutil.copy(minilm_folder / "vocab.txt", folder / "vocab.txt")
    return folder


def broken_copy(tiny_bert, tmp_path, name):
    folder = tmp_path / name
    shutil.copytree(tiny_bert, folder)
    return folder


def expect_error(binary, tmp_path, folder, *fragments):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "hello"}])
    config = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "out")},
              "text": {"encoder": {"type": "bert", "path": str(folder)}}}
    result = run_precompute(binary, tmp_path, config, expect=2)
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr[-2000:])


def test_unsupported_architecture_is_refused(binary, tiny_bert, tmp_path):
    folder = broken_copy(tiny_bert, tmp_path, "roberta")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "roberta"
    config["architectures"] = ["RobertaModel"]
    (folder / "config.json").write_text(json.dumps(config))
    expect_error(binary, tmp_path, folder, "roberta", "not supported", "torchscript")


def test_missing_files_are_named(binary, tiny_bert, tmp_path):
    folder = broken_copy(tiny_bert, tmp_path, "no-config")
    (folder / "config.json").unlink()
    expect_error(binary, tmp_path, folder, "config.json")
    folder = broken_copy(tiny_bert, tmp_path, "no-weights")
    (folder / "model.safetensors").unlink()
    expect_error(binary, tmp_path, folder, "safetensors")


def test_shape_mismatch_names_the_weight(binary, tiny_bert, tmp_path):
    folder = broken_copy(tiny_bert, tmp_path, "shapes")
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 128
    (folder / "config.json").write_text(json.dumps(config))
    expect_error(binary, tmp_path, folder, "encoder.layer.0.intermediate.dense.weight",
                 "config.json implies")


def test_corrupted_safetensors_header_is_caught(binary, tiny_bert, tmp_path):
    folder = broken_copy(tiny_bert, tmp_path, "corrupt")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[0:8] = (len(data) * 4).to_bytes(8, "little")  # header length beyond the file
    weights.write_bytes(bytes(data))
    expect_error(binary, tmp_path, folder, "model.safetensors", "header")


def test_tokenize_command(binary, minilm_folder, tmp_path):
    from transformers import BertTokenizerFast
    reference = BertTokenizerFast.from_pretrained(str(minilm_folder))
    shown = subprocess.run([str(binary), "tokenize", "--model", str(minilm_folder), "--json",
                            "--max-length", "8", "Héllo wörld, a long caption indeed!"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout)
    expected = reference("Héllo wörld, a long caption indeed!", truncation=True, max_length=8)
    assert result["ids"] == expected["input_ids"]
    assert result["tokens"][0] == "[CLS]" and result["truncated"]
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(make_texts(500, SEED + 5)))
    stats = subprocess.run([str(binary), "tokenize", "--model", str(minilm_folder), "--file",
                            str(texts), "--stats", "--threads", "2"], stdout=subprocess.PIPE,
                           text=True, check=True)
    assert stats.stdout.startswith("500 texts")
    assert "truncated" in stats.stdout and "texts/s" in stats.stdout
