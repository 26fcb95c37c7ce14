"""examples/train_fusion.py trains on a real, demo-sized output (the demo's encoders: per-frame
video, pooled audio, the real all-MiniLM-L6-v2) on the CPU, through DataLoader workers: the
contrastive loss falls, and with a label file a classifier learns the training labels; both
readers (ShardDataset, ShardIterableDataset) and samples with a missing modality take part.
Then tools/bench/trainer_bench.py's CPU smoke test runs end to end."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, colour_clip, run_precompute, sine_file, write_manifest

COLOURS = ["red", "green", "blue", "yellow"]
PITCHES = {"low": 220.0, "middle": 660.0, "high": 1760.0, "very high": 3520.0}


@pytest.fixture(scope="module")
def demo_output(binary, minilm_folder, tmp_path_factory):
    """24 samples: every colour x pitch with a caption naming both, 4 with only a caption, 4
    whose video is missing (video absent, audio and caption present); shards of 8."""
    import export_encoders
    root = tmp_path_factory.mktemp("train-fusion")
    models = root / "models"
    models.mkdir()
    export_encoders.export_demo(models)
    for c in COLOURS:
        colour_clip(root / f"{c}.mp4", [c], size="64x48", rate=4)
    for name, hz in PITCHES.items():
        sine_file(root / f"{name.replace(' ', '_')}.wav", hz, 1.0, rate=16000)
    samples, labels = [], []
    for c in COLOURS:
        for name in PITCHES:
            sid = f"{c}-{name}"
            samples.append({"id": sid, "video": f"{c}.mp4",
                            "audio": f"{name.replace(' ', '_')}.wav",
                            "text": f"a {c} picture with a {name} tone"})
            labels.append({"id": sid, "label": c})
    for c in COLOURS:
        samples.append({"id": f"caption-{c}", "text": f"only words about {c}"})
        samples.append({"id": f"novideo-{c}", "video": "missing.mp4", "audio": "low.wav",
                        "text": f"a lost {c} clip with a low tone"})
        labels.append({"id": f"novideo-{c}", "label": c})
    manifest = write_manifest(root / "manifest.jsonl", samples)
    write_manifest(root / "labels.jsonl", labels)
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(root / "out"), "shard_size": 8},
        "run": {"decode_threads": 2, "torch_threads": 1},
        "video": {"encoder": {"path": str(models / "video_demo.pt")}, "sampling": {"fps": 2},
                  "size": [32, 32], "pooling": "none"},
        "audio": {"encoder": {"path": str(models / "audio_demo.pt")}, "window_s": 0.5,
                  "pooling": "mean"},
        "text": {"encoder": {"type": "bert", "path": str(minilm_folder)}},
    }
    run_precompute(binary, root, config)
    return root


def train(out, tmp_path, *flags):
    metrics = tmp_path / "metrics.json"
    cmd = [sys.executable, str(ROOT / "examples" / "train_fusion.py"), str(out / "out"),
           "--device", "cpu", "--metrics", str(metrics), *flags]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr[-4000:]}"
    return json.loads(metrics.read_text()), r.stdout


@pytest.mark.parametrize("reader", ["map", "stream"])
def test_contrastive_loss_falls(demo_output, tmp_path, reader):
    flags = ["--epochs", "12", "--batch-size", "8", "--workers", "2", "--seed", "1"]
    if reader == "stream":
        flags.append("--stream")
    m, stdout = train(demo_output, tmp_path, *flags)
    assert m["objective"] == "contrastive text <-> video+audio" and not m["amp"]
    assert m["modalities"] == ["video", "audio", "text"]
    epochs = m["epochs"]
    assert len(epochs) == 12 and all(e["samples"] == 24 for e in epochs)  # every sample
    # The rows the loss used: caption + video or audio (not the 4 caption-only samples); a
    # streamed worker's last, short batch may hold fewer than the two rows a contrastive loss
    # needs, and is then skipped.
    assert all(e["rows"] == 20 for e in epochs) if reader == "map" else \
        all(16 <= e["rows"] <= 20 for e in epochs)
    first, last = epochs[0]["loss"], min(e["loss"] for e in epochs[-3:])
    assert last < 0.6 * first, [round(e["loss"], 3) for e in epochs]
    assert "samples/s" in stdout and all(e["samples_per_s"] > 0 for e in epochs)


def test_classifier_learns_the_labels(demo_output, tmp_path):
    m, stdout = train(demo_output, tmp_path, "--labels", str(demo_output / "labels.jsonl"),
                      "--epochs", "25", "--batch-size", "8", "--workers", "0", "--lr", "3e-3",
                      "--save", str(tmp_path / "head.pt"))
    assert m["classes"] == sorted(COLOURS)
    epochs = m["epochs"]
    assert all(e["rows"] == 20 for e in epochs)  # the labelled samples only
    assert epochs[-1]["loss"] < 0.5 * epochs[0]["loss"], [round(e["loss"], 3) for e in epochs]
    assert max(e["accuracy"] for e in epochs[-3:]) >= 0.9
    assert "train accuracy" in stdout and (tmp_path / "head.pt").stat().st_size > 0


def test_refuses_an_output_without_text_and_no_labels(demo_output, tmp_path):
    cmd = [sys.executable, str(ROOT / "examples" / "train_fusion.py"), str(demo_output / "out"),
           "--device", "cpu", "--modalities", "video", "audio"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "needs text and video or audio" in r.stderr


def test_trainer_bench_quick_mode_runs_end_to_end(binary, tmp_path):
    """The GPU benchmark's CPU smoke test: precompute makes 300 samples of pooled 768-d
    float16 vectors x 3, the reader is timed with 0 and 2 workers both ways, train_fusion.py runs
    on the output, and the three ways (plus the contrastive head) each find a batch and a
    rate."""
    cmd = [sys.executable, str(ROOT / "tools" / "bench" / "trainer_bench.py"), "--quick",
           "--binary", str(binary), "--out", str(tmp_path / "out"), "--work",
           str(tmp_path / "work")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    res = json.loads((tmp_path / "out" / "trainer_bench.json").read_text())
    assert res["errors"] == []
    assert res["precompute"]["dims"] == {m: [768, "pooled"] for m in ("video", "audio", "text")}
    assert res["precompute"]["summary"]["with_embeddings"] == 300
    assert set(res["reader"]) == {"random/0", "random/2", "shard/0", "shard/2"}
    assert all(v["samples_per_s"] > 0 for v in res["reader"].values())
    assert set(res["ways"]) == {"a", "b", "c", "c2"}
    for key, w in res["ways"].items():
        assert w["largest_batch"] >= (2 if key in ("a", "b", "c2") else 256), (key, w)
        assert w["throughput"]["samples_per_s"] > 0
    # examples/train_fusion.py itself on the bench's output, in its own process.
    assert res["example"]["samples_per_s"] > 0 and res["example"]["amp"] is False
    assert len(res["example"]["losses"]) == 3
    md = (tmp_path / "out" / "trainer_bench.md").read_text()
    assert "c. head on precomputed tensors" in md and "shard order" in md


def test_trainer_bench_finds_the_largest_batch_by_doubling_then_bisection():
    """The GPU run's batch search, against a fake way that runs out of memory above 60 (as a
    CUDA out-of-memory error or as cuDNN's failed workspace allocation): exactly 60 is found,
    and an error that is not about memory is not taken for one."""
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    import torch
    import trainer_bench as tb

    def make(limit, error):
        tried = []

        def inputs(b):
            tried.append(b)
            if b > limit:
                raise error
            return {}
        w = torch.nn.Parameter(torch.zeros(1))
        return tb.Way("fake", [w], inputs, lambda x: (w * 2).sum(), lambda: None), tried

    cpu = torch.device("cpu")
    for error in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                  RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")):
        way, tried = make(60, error)
        found = tb.largest_batch(way, 4096, cpu)
        assert found["largest_batch"] == 60 and not found["capped"], found
        assert tried[:7] == [1, 2, 4, 8, 16, 32, 64] and max(tried) == 64
    way, _ = make(10**9, None)
    found = tb.largest_batch(way, 100, cpu)
    assert found["largest_batch"] == 64 and found["capped"]
    way, _ = make(5, ValueError("a bug, not memory"))
    with pytest.raises(ValueError):
        tb.largest_batch(way, 100, cpu)
