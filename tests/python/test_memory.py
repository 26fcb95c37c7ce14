"""Out-of-memory recovery through the real c10::OutOfMemoryError path: a batch that does not fit
is split in halves down to single samples, and a sample that does not fit alone is recorded as
`oom` while everything else is embedded (Note [Out of memory] in encode_stage.cpp).

The CI machine has no GPU, so the test arms PRECOMPUTE_TEST_OOM_ABOVE_COST: the encoder then
throws the real c10::OutOfMemoryError for every batch costing more tokens than the limit, exactly
where the CUDA caching allocator would, and the recovery code runs unchanged."""

import json
import os
from pathlib import Path

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


def test_doctor_reports_devices_memory_and_bytes_per_sample_on_the_demo_config(
        binary, tmp_path, minilm_folder):
    """`precompute doctor --json` on configs/demo.yaml (its models exported here as
    tools/demo.sh does): every encoder's weights and inputs on the CPU in float32, no mismatch,
    a timed forward pass at batch 1, 2, 4, ..., and bytes on disk consistent with the dims."""
    import subprocess
    import sys

    import yaml

    models = tmp_path / "models"
    subprocess.run([sys.executable, "tools/scripts/export_encoders.py", "demo", str(models)],
                   check=True, capture_output=True)
    demo = yaml.safe_load(open("configs/demo.yaml"))
    for section in ("video", "audio", "text"):
        path = Path(demo[section]["encoder"]["path"])
        demo[section]["encoder"]["path"] = str(models / path.name)
    demo["input"]["manifest"] = str(tmp_path / "unused.jsonl")
    demo["output"]["path"] = str(tmp_path / "out")
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(demo))

    r = subprocess.run([str(binary), "doctor", "--config", str(config), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    by_modality = {e["modality"]: e for e in report["encoders"]}
    assert set(by_modality) == {"video", "audio", "text"}
    for e in by_modality.values():
        assert e["device"] == "cpu" and e["parameters"]["devices"] == ["cpu"]
        assert e["inputs"]["dtype"] == "Float" and e["mismatches"] == []
        batches = [b["batch"] for b in e["batches"]]
        assert batches[:3] == [1, 2, 4] and all(b["seconds"] > 0 for b in e["batches"])
        assert all(b["before"] is None for b in e["batches"])  # no device memory on a CPU
    text = by_modality["text"]
    assert text["parameters"]["bytes"] > 80e6          # MiniLM-L6: 22.7M float32 parameters
    assert text["output"]["dim"] == 384 and text["disk_bytes_per_sample"] == 384 * 2
    assert text["sample"] == {"units": 256, "unit": "tokens"}  # the folder's max_seq_length
    video = by_modality["video"]
    rows = video["output"]["rows_per_sample"]
    assert video["disk_bytes_per_sample"] == rows * video["output"]["dim"] * 2 + rows * 8 + 8
    training = report["training"]
    assert training["bytes_per_sample_from_shards"] == sum(
        e["disk_bytes_per_sample"] for e in report["encoders"])
    assert training["raw_input_bytes_per_sample"] > 100 * training["bytes_per_sample_from_shards"]
    assert training["encoder_weights_bytes_not_needed"] == sum(
        e["parameters"]["bytes"] for e in report["encoders"])


def test_host_budget_bounds_decoded_samples_on_a_dataset_ten_times_larger(
        binary, probes, tmp_path):
    """150 samples of 16 decoded 224x224 frames (2.4 MB each, 360 MB decoded in all) under
    run.host_memory_budget 32 MB: the decoded samples held at once stay near the budget (plus
    what the graph needs to fill a batch), and the peak RSS stays at a small run's plus that."""
    from conftest import colour_clip

    clip = tmp_path / "clip.mp4"
    colour_clip(clip, ["red", "green", "blue"])

    def run(n: int, name: str, *flags: str):
        manifest = write_manifest(tmp_path / f"{name}.jsonl",
                                  [{"id": f"s{i}", "video": str(clip)} for i in range(n)])
        config = {"input": {"manifest": str(manifest)},
                  "output": {"path": str(tmp_path / name), "shard_size": 50},
                  "run": {"decode_threads": 2},
                  "video": {"encoder": {"path": str(probes / "video_probe.pt")},
                            "sampling": {"num_frames": 16}, "size": 224, "batch_size": 4}}
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(json.dumps(config))
        r = subprocess.run([str(binary), "run", "--config", str(cfg), "--progress-interval", "0",
                            *flags], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        held = float(re.search(r"decoded samples held at most ([\d.]+) MB", r.stderr).group(1))
        rss = float(re.search(r"peak RSS ([\d.]+) MB", r.stderr).group(1))
        return held, rss

    import re
    import subprocess

    sample_mb = 16 * 224 * 224 * 3 / 1e6
    small_held, small_rss = run(10, "small")
    big_held, big_rss = run(150, "big", "--host-memory-budget", "32MB")
    assert 150 * sample_mb > 10 * 32  # the dataset decodes to over ten times the budget
    # Over the budget, the source admits samples only while fewer than the graph's minimum
    # (4 per batch x 2 + 2 per decode thread x 2 = 12) are in flight, plus the 2 being decoded.
    assert big_held <= max(32, 12 * sample_mb) + 3 * sample_mb, big_held
    assert big_rss <= small_rss + 32 + 3 * sample_mb + 40, (big_rss, small_rss)


def test_out_of_memory_inside_a_torchscript_module_is_recovered_not_a_model_error(
        binary, tmp_path):
    """Seen on an H200: CUDA running out of memory deep inside a traced ResNet-50 reaches
    LibTorch as the TorchScript interpreter's own exception (a std::runtime_error), not as
    c10::OutOfMemoryError, and was taken for a broken model: calibration refused the budget with
    the model's traceback, and a run would have recorded `encode_error`. A scripted model that
    raises the allocator's message for batches of more than 2 frames stands in for it here:
    batches are split until they fit, and a clip whose own 6 frames are too many is `oom`."""
    import torch

    class OutOfMemoryAbove2Frames(torch.nn.Module):
        def forward(self, frames: torch.Tensor) -> torch.Tensor:
            if frames.size(0) > 2:
                raise RuntimeError("CUDA out of memory. Tried to allocate 98.00 MiB "
                                   "(raised by a test model)")
            return frames.mean(dim=[2, 3])

    model = tmp_path / "oom_video.pt"
    torch.jit.script(OutOfMemoryAbove2Frames()).save(str(model))
    from conftest import colour_clip

    samples = []
    for i in range(6):
        clip = tmp_path / f"v{i}.mp4"
        colour_clip(clip, ["red", "blue", "green"] if i == 3 else ["red"])
        samples.append({"id": f"v{i}", "video": str(clip)})
    manifest = write_manifest(tmp_path / "m.jsonl", samples)
    config = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "out")},
              "video": {"encoder": {"path": str(model)}, "sampling": {"fps": 2}, "size": 16,
                        "batch_size": 4}}
    r = run_precompute(binary, tmp_path, config, "--max-failures", "1")
    assert "split after running out of device memory" in r.stderr, r.stderr[-3000:]
    out = read_output(tmp_path / "out")
    assert [(f["id"], f["modality"], f["category"]) for f in out.failures] == [
        ("v3", "video", "oom")]
    assert set(out.samples) == {f"v{i}" for i in range(6)} - {"v3"}
