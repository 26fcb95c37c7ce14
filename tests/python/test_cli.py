"""The CLI's contract with users and schedulers: exit codes, errors that name the input and the
fix, overrides, progress on stderr."""

import json
import os
import subprocess

import pytest

from conftest import colour_clip, read_output, run_precompute, write_manifest


@pytest.fixture()
def small(tmp_path, probes, minilm_folder):
    colour_clip(tmp_path / "a.mp4", ["red", "blue"])
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "video": "a.mp4", "text": "a red then blue clip"},
        {"id": "b", "video": "missing.mp4", "text": "no such clip"},
        {"id": "c", "text": "text only"},
    ])
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(tmp_path / "out")},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")}, "sampling": {"fps": 1},
                  "size": 32},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}},
    }
    return config


def test_exit_code_3_when_failures_exceed_the_limit(binary, small, tmp_path):
    r = run_precompute(binary, tmp_path, small, "--max-failures", "0", expect=3)
    assert "over the limit" in r.stderr
    # The output is complete all the same: the failure is recorded, the rest embedded.
    out = read_output(tmp_path / "out")
    assert set(out.samples) == {"a", "b", "c"}  # b keeps its text
    assert out.failures[0]["id"] == "b" and out.failures[0]["category"] == "missing"
    run_precompute(binary, tmp_path, small, "--max-failures", "50%", "--overwrite", expect=0)


def test_a_rerun_resumes_and_overwrite_starts_over(binary, small, tmp_path):
    run_precompute(binary, tmp_path, small)
    first = read_output(tmp_path / "out")
    r = run_precompute(binary, tmp_path, small)
    assert "3 of 3 samples are in committed shards; 0 to process" in r.stderr
    assert read_output(tmp_path / "out").index["shards"] == first.index["shards"]
    r = run_precompute(binary, tmp_path, small, "--overwrite")
    assert "--overwrite: removed" in r.stderr and "resuming" not in r.stderr


def test_flags_override_the_config(binary, small, tmp_path):
    other = tmp_path / "elsewhere"
    r = run_precompute(binary, tmp_path, small, "--output", str(other), "--shard-size", "1",
                       "--batch-size", "2", "--device", "cpu", "--decode-threads", "1")
    index = json.loads((other / "index.json").read_text())
    assert len(index["shards"]) == 3
    assert index["shard_size"] == 1
    assert "1 decode threads" in r.stderr


def test_bad_config_exits_2_naming_the_key(binary, small, tmp_path):
    small["video"]["sampling"] = {"fps": 1, "num_frames": 3}
    r = run_precompute(binary, tmp_path, small, expect=2)
    assert "video.sampling" in r.stderr
    small["video"]["sampling"] = {"fps": 1}
    small["video"]["encoder"]["path"] = str(tmp_path / "nope.pt")
    r = run_precompute(binary, tmp_path, small, expect=2)
    assert "nope.pt" in r.stderr and "does not exist" in r.stderr
    r = subprocess.run([str(binary), "run"], stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2 and "--config" in r.stderr


def test_a_model_that_is_not_torchscript_exits_2(binary, small, tmp_path):
    fake = tmp_path / "fake.pt"
    fake.write_bytes(b"not a model")
    small["video"]["encoder"]["path"] = str(fake)
    r = run_precompute(binary, tmp_path, small, expect=2)
    assert "cannot load TorchScript model" in r.stderr and "fake.pt" in r.stderr


def test_invalid_manifest_exits_65_naming_both_lines(binary, small, tmp_path):
    write_manifest(tmp_path / "m.jsonl", [{"id": "x", "text": "1"}, {"id": "y", "text": "2"},
                                          {"id": "x", "text": "3"}])
    r = run_precompute(binary, tmp_path, small, expect=65)
    assert "id 'x' appears on line 1 and on line 3" in r.stderr
    assert not (tmp_path / "out").exists(), "nothing may be written for an invalid manifest"


def test_unwritable_output_exits_73_before_decoding(binary, small, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = run_precompute(binary, tmp_path, small, "--output", str(blocker / "out"), expect=73)
    assert str(blocker) in r.stderr


def test_progress_lines_on_stderr(binary, small, tmp_path):
    config_path = tmp_path / "config.yaml"
    config_path.write_text(json.dumps(small))
    r = subprocess.run([str(binary), "run", "--config", str(config_path), "--progress-interval",
                        "0.001"], stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, r.stderr
    assert "3/3 samples (100.0%)" in r.stderr
    assert "ETA" in r.stderr and "decoding" in r.stderr


def test_input_folder_mode(binary, small, tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    colour_clip(folder / "x.mp4", ["lime"])
    (folder / "x.txt").write_text("a green clip\n")
    colour_clip(folder / "y.mp4", ["blue"])
    run_precompute(binary, tmp_path, small, "--input", str(folder))
    out = read_output(tmp_path / "out")
    assert set(out.samples) == {"x", "y"}
    assert "text" in out.samples["x"] and "text" not in out.samples["y"]


def test_a_failing_sample_fails_alone_in_its_batch(binary, small, probes, tmp_path):
    # The failing probe raises on white frames: the white clip's batch is retried sample by
    # sample, so only it fails (encode_error) and its batch-mates are embedded.
    for name, colour in [("r", "red"), ("w", "white"), ("g", "lime")]:
        colour_clip(tmp_path / f"{name}.mp4", [colour])
    write_manifest(tmp_path / "m.jsonl", [{"id": n, "video": f"{n}.mp4"} for n in "rwg"])
    small["video"]["encoder"]["path"] = str(probes / "failing_probe.pt")
    small["video"]["batch_size"] = 3
    del small["text"]
    r = run_precompute(binary, tmp_path, small)
    assert "retrying them one by one" in r.stderr
    out = read_output(tmp_path / "out")
    assert set(out.samples) == {"r", "g"}
    assert [(f["id"], f["category"]) for f in out.failures] == [("w", "encode_error")]
    assert "refuses white frames" in out.failures[0]["message"]


def test_video_decoder_choice_without_a_gpu(binary, small, tmp_path):
    """video.decoder on a machine (or device list) without CUDA: nvdec is refused before any
    work, naming the key and the way out; auto decodes on the CPU and says so, with the same
    embeddings as cpu. (NVDEC itself: tests/gpu/nvdec_parity.py on the GPU machine.)"""
    small["video"]["decoder"] = "nvdec"
    r = run_precompute(binary, tmp_path, small, expect=2)
    assert "video.decoder: nvdec, but" in r.stderr and "video.decoder: auto" in r.stderr
    assert not (tmp_path / "out" / "index.json").exists()
    small["video"]["decoder"] = "cpu"
    run_precompute(binary, tmp_path, small, "--max-failures", "50%")
    cpu = read_output(tmp_path / "out")
    # Refused with --overwrite on that output too: nothing of it is removed.
    small["video"]["decoder"] = "nvdec"
    r = run_precompute(binary, tmp_path, small, "--overwrite", expect=2)
    assert "video.decoder: nvdec, but" in r.stderr and "removed" not in r.stderr
    assert read_output(tmp_path / "out").index["shards"] == cpu.index["shards"]
    small["video"]["decoder"] = "auto"
    small["video"]["nvdec_sessions"] = 64
    # The decoder is not part of the settings a resume checks: a rerun with auto resumes.
    r = run_precompute(binary, tmp_path, small, "--max-failures", "50%")
    assert "0 to process" in r.stderr, r.stderr[-2000:]
    r = run_precompute(binary, tmp_path, small, "--max-failures", "50%", "--overwrite")
    assert "video decoding: on the CPU (" in r.stderr
    auto = read_output(tmp_path / "out")
    assert (auto.samples["a"]["video"]["vector"] == cpu.samples["a"]["video"]["vector"]).all()
    for bad in (-1, 65, 1e300, 0.5, "many", "", "4\u0000"):
        small["video"]["nvdec_sessions"] = bad
        r = run_precompute(binary, tmp_path, small, expect=2)
        assert "video.nvdec_sessions" in r.stderr, (bad, r.stderr[-500:])
    small["video"]["nvdec_sessions"] = 0  # two per engine; on the CPU as above where none
    r = run_precompute(binary, tmp_path, small, "--max-failures", "50%")
    assert "0 to process" in r.stderr, r.stderr[-2000:]
    for bad in ("gpu", "", "NVDEC", "nvdec\u0000"):
        small["video"]["decoder"] = bad
        r = run_precompute(binary, tmp_path, small, expect=2)
        assert "video.decoder" in r.stderr and "auto, cpu, nvdec" in r.stderr, (bad, r.stderr)
