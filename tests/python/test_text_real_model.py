"""The real all-MiniLM-L6-v2 through precompute: the exported TorchScript BERT matches
transformers, the CLI's pooled and normalised embeddings match sentence-transformers, and the
demo's paraphrase pairs score above unrelated pairs, through the TorchScript text path and the
native BERT encoder."""

import itertools

import numpy as np
import pytest
import torch

from conftest import read_output, run_precompute, write_manifest

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "A red ball rolls across the wooden floor.",
    "Ça va très bien, merci! 東京タワーへ行きましょう。",
    "",  # stays out: an empty caption is a failure record
    "The quick brown fox jumps over the lazy dog. " * 30,  # longer than max_length
]


@pytest.fixture(scope="module")
def minilm_torchscript(tmp_path_factory, minilm_folder):
    import export_encoders
    out = tmp_path_factory.mktemp("minilm")
    export_encoders.export_bert(minilm_folder, out / "minilm.pt")
    return out / "minilm.pt"


def test_exported_bert_matches_transformers(minilm_torchscript, minilm_folder):
    from transformers import AutoModel, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_folder))
    reference = AutoModel.from_pretrained(str(minilm_folder)).eval()
    model = torch.jit.load(str(minilm_torchscript))
    batch = tokenizer([s for s in SENTENCES if s], padding=True, truncation=True,
                      max_length=256, return_tensors="pt")
    with torch.no_grad():
        expected = reference(**batch).last_hidden_state
        got = model(batch["input_ids"], batch["attention_mask"])
    mask = batch["attention_mask"].bool()
    assert (expected - got)[mask].abs().max().item() <= 1e-4


def test_cli_embeddings_match_sentence_transformers(binary, minilm_torchscript, minilm_folder,
                                                    tmp_path):
    from sentence_transformers import SentenceTransformer
    manifest = write_manifest(tmp_path / "m.jsonl",
                              [{"id": f"s{i}", "text": s} for i, s in enumerate(SENTENCES)])
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(tmp_path / "out"), "dtype": "float32"},
        "text": {"encoder": {"path": str(minilm_torchscript)},
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt"), "max_length": 256},
                 "pooling": "mean", "normalize": True, "batch_size": 2},
    }
    run_precompute(binary, tmp_path, config)
    out = read_output(tmp_path / "out")
    model = SentenceTransformer(str(minilm_folder), device="cpu")
    for i, sentence in enumerate(SENTENCES):
        if not sentence:
            assert f"s{i}" not in out.samples
            continue
        expected = model.encode([sentence], convert_to_numpy=True, normalize_embeddings=True)[0]
        got = out.samples[f"s{i}"]["text"]["vector"]
        assert got.shape == (384,)
        assert float(np.dot(got, expected)) >= 0.9999, sentence
        np.testing.assert_allclose(got, expected, atol=1e-4)
    assert [f["category"] for f in out.failures] == ["bad_text"]
    assert out.samples["s5"]["text"]["truncated"] and out.samples["s5"]["text"]["steps"] == 256


@pytest.mark.parametrize("encoder_type", ["bert", "torchscript"])
def test_paraphrases_score_above_unrelated_captions(binary, minilm_torchscript, minilm_folder,
                                                    tmp_path, encoder_type):
    import make_demo_dataset
    captions = [c for _, a, b in make_demo_dataset.SCENES for c in (a, b)]
    manifest = write_manifest(tmp_path / "m.jsonl",
                              [{"id": f"c{i:02d}", "text": c} for i, c in enumerate(captions)])
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(tmp_path / "out")},
        # The native encoder takes tokenizer, pooling and normalisation from the folder.
        "text": ({"encoder": {"type": "bert", "path": str(minilm_folder)}}
                 if encoder_type == "bert" else
                 {"encoder": {"path": str(minilm_torchscript)},
                  "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")},
                  "pooling": "mean", "normalize": True}),
    }
    run_precompute(binary, tmp_path, config)
    out = read_output(tmp_path / "out")
    vectors = np.stack([out.samples[f"c{i:02d}"]["text"]["vector"] for i in range(len(captions))])
    similarity = vectors @ vectors.T
    pairs = len(captions) // 2
    paraphrase = [similarity[2 * k, 2 * k + 1] for k in range(pairs)]
    unrelated = [similarity[i, j] for i, j in itertools.combinations(range(len(captions)), 2)
                 if i // 2 != j // 2]
    assert np.mean(paraphrase) > np.mean(unrelated) + 0.2, (np.mean(paraphrase),
                                                           np.mean(unrelated))
    # Each caption's paraphrase is closer to it than the average unrelated caption.
    for k in range(pairs):
        row = [similarity[2 * k, j] for j in range(len(captions)) if j // 2 != k]
        assert paraphrase[k] > np.mean(row), captions[2 * k]
