"""Out-of-memory recovery through the real c10::OutOfMemoryError path: a batch that does not fit
is split in halves down to single samples, and a sample that does not fit alone is recorded as
`oom` while everything else is embedded (Note [Out of memory] in encode_stage.cpp).

The CI machine has no GPU, so the test arms PRECOMPUTE_TEST_OOM_ABOVE_COST: the encoder then
throws the real c10::OutOfMemoryError for every batch costing more tokens than the limit, exactly
where the CUDA caching allocator would, and the recovery code runs unchanged."""

import os

import numpy as np

from conftest import read_output, run_precompute, write_manifest

WORDS = "the red cat sat on a blue mat and looked at one small dog".split()


def text_config(tmp_path, probes, minilm_folder, manifest, out):
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "shard_size": 8},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "batch_size": 8, "tokenizer": {"vocab": str(minilm_folder / "vocab.txt"),
                                                "max_length": 128}},
    }


def test_batches_split_until_they_fit_and_an_oversize_sample_is_recorded_as_oom(
        binary, probes, minilm_folder, tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    samples = [{"id": f"s{i}", "text": " ".join(rng.choice(WORDS, size=int(rng.integers(2, 6))))}
               for i in range(20)]
    samples[5]["text"] = " ".join(rng.choice(WORDS, size=100))  # ~100 tokens: never fits
    manifest = write_manifest(tmp_path / "m.jsonl", samples)

    reference = text_config(tmp_path, probes, minilm_folder, manifest, tmp_path / "ref")
    run_precompute(binary, tmp_path, reference)
    expected = read_output(tmp_path / "ref")

    # Every batch over 24 tokens (about four short captions with [CLS]/[SEP]) runs out of memory.
    monkeypatch.setenv("PRECOMPUTE_TEST_OOM_ABOVE_COST", "24")
    config = text_config(tmp_path, probes, minilm_folder, manifest, tmp_path / "out")
    r = run_precompute(binary, tmp_path, config, "--max-failures", "1")
    assert "split after running out of device memory" in r.stderr
    out = read_output(tmp_path / "out")

    assert [(f["id"], f["modality"], f["category"]) for f in out.failures] == [
        ("s5", "text", "oom")]
    assert "does not fit in device memory on its own" in out.failures[0]["message"]
    assert set(out.samples) == {s["id"] for s in samples} - {"s5"}
    for sample_id, entry in out.samples.items():
        np.testing.assert_allclose(entry["text"]["vector"],
                                   expected.samples[sample_id]["text"]["vector"], rtol=0, atol=1e-3)
