"""A mixed dataset through the real CLI: clips of several codecs, sizes and containers, with and
without audio, plus deliberately bad entries. Every id must end up exactly once, either with its
embeddings or with failure records of the right category; shapes and dtypes must match the
schema."""

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import failures_by_id, ffmpeg, read_output, run_precompute, write_manifest

CODECS = {
    "h264": (["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"], "mp4"),
    "vp9": (["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8"], "webm"),
    "mpeg4": (["-c:v", "mpeg4"], "avi"),
}
AUDIO_CODEC = {"mp4": ["-c:a", "aac"], "webm": ["-c:a", "libopus"], "avi": ["-c:a", "mp3"]}
SIZES = ["160x120", "320x240", "640x360", "1280x720", "360x640", "333x199"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed")
    samples, expect = [], {}
    n = 0
    for codec, (args, ext) in CODECS.items():
        for k, size in enumerate(SIZES):
            with_audio = (k + n) % 2 == 0
            name = f"{codec}_{size}_{'av' if with_audio else 'v'}"
            path = d / f"{name}.{ext}"
            cmd = ["-f", "lavfi", "-i", f"testsrc2=s={size}:r=25:d=1.6"]
            if with_audio:
                cmd += ["-f", "lavfi", "-i", "sine=frequency=660:sample_rate=44100:duration=1.6"]
            cmd += args + (AUDIO_CODEC[ext] if with_audio else []) + ["-shortest", str(path)]
            ffmpeg(*cmd)
            samples.append({"id": name, "video": path.name, "text": f"clip {name}"})
            expect[name] = {"video": True, "audio": with_audio, "text": True}
            n += 1
    # Bad entries, each with the failure it must produce.
    (d / "garbage.mp4").write_bytes(os.urandom(4096))
    (d / "empty.mp4").write_bytes(b"")
    ffmpeg("-f", "lavfi", "-i", "sine=frequency=300:duration=1", str(d / "only_audio.wav"))
    bad = [
        ({"id": "missing", "video": "nope.mp4", "text": "gone"},
         {"video": "missing", "audio": "missing"}),
        ({"id": "garbage", "video": "garbage.mp4"},
         {"video": "decode_error", "audio": "decode_error"}),
        ({"id": "zero bytes", "video": "empty.mp4", "text": "zero"},
         {"video": "decode_error", "audio": "decode_error"}),
        ({"id": "audio as video", "video": "only_audio.wav", "text": "x"}, {"video": "no_stream"}),
        ({"id": "empty text", "text": "   "}, {"text": "bad_text"}),
    ]
    for sample, _ in bad:
        samples.append(sample)
    manifest = write_manifest(d / "manifest.jsonl", samples)
    return manifest, expect, {s["id"]: f for s, f in bad}


def config(models, minilm_folder, manifest, out):
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "shard_size": 8},
        "run": {"decode_threads": 2},
        "video": {"encoder": {"path": str(models / "video_probe.pt")}, "sampling": {"fps": 2},
                  "size": [48, 64], "pooling": "none", "batch_size": 4},
        "audio": {"encoder": {"path": str(models / "audio_probe.pt")}, "window_s": 0.5,
                  "pooling": "mean", "batch_size": 5},
        "text": {"encoder": {"path": str(models / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}, "batch_size": 6},
    }


def test_mixed_dataset_every_id_once_with_right_failures(binary, probes, minilm_folder, dataset,
                                                         tmp_path):
    manifest, expect, bad = dataset
    out = tmp_path / "out"
    result = run_precompute(binary, tmp_path, config(probes, minilm_folder, manifest, out))
    assert "failures by category" in result.stderr
    import re
    decoding = re.search(r"video decoding: (\d+) frames decoded for (\d+) kept \((\S+) per clip\)",
                         result.stderr)
    assert decoding, result.stderr[-2000:]
    assert int(decoding.group(1)) >= int(decoding.group(2)) > 0
    # How busy the CPU decoders kept (the config's 2 decode threads at most) while the graph ran.
    busy = re.search(r"graph ran ([\d.]+) s(?: \(decoding began ([\d.]+) s before it\))?: "
                     r"CPU video decodes ([\d.]+) at a time on average", result.stderr)
    assert busy, result.stderr[-2000:]
    assert float(busy.group(1)) > 0
    # The first samples are decoded while the encoders load (2 decode threads: 4 of them).
    assert busy.group(2) is not None and float(busy.group(2)) > 0, result.stderr[-2000:]
    assert 0 < float(busy.group(3)) <= 2.05
    output = read_output(out)
    failures = failures_by_id(output)

    total = len(expect) + len(bad)
    assert output.index["total_samples"] == total
    assert len(output.index["shards"]) == (total + 7) // 8
    # Every id once: good ones in /ids, bad ones only in /failures (a sample with some modality
    # left appears in both).
    assert len(output.ids_in_order) == len(set(output.ids_in_order))
    assert set(output.samples) | set(failures) == set(expect) | set(bad)

    for name, modalities in expect.items():
        sample = output.samples[name]
        assert ("audio" in sample) == modalities["audio"], name
        assert "video" in sample and "text" in sample, name
        rows = sample["video"]["rows"]
        assert rows.shape == (4, 3) and sample["video"]["steps"] == 4  # 1.6 s at 2 fps
        np.testing.assert_allclose(sample["video"]["timestamps"], [0.24, 0.72, 1.24, 1.56],
                                   atol=0.05)
        if modalities["audio"]:
            assert sample["audio"]["vector"].shape == (3,)
            assert abs(sample["audio"]["vector"][1] - 660) < 5
            assert failures.get(name) is None
        else:
            assert failures[name] == {"audio": "no_stream"}, name
    for name, expected_failures in bad.items():
        assert failures[name] == expected_failures, (name, failures.get(name))
    assert output.samples["audio as video"]["text"]["vector"][0] == 3  # [CLS] x [SEP]

    # Schema: default storage dtype float16, per-step video with offsets, pooled text.
    assert output.dtypes["video"] == np.float16
    assert output.dtypes["text"] == np.float16
    messages = {f["id"]: f["message"] for f in output.failures}
    assert "nope.mp4" in messages["missing"]


def test_inspect_reports_the_run(binary, probes, minilm_folder, dataset, tmp_path):
    manifest, expect, bad = dataset
    out = tmp_path / "out"
    run_precompute(binary, tmp_path, config(probes, minilm_folder, manifest, out))
    text = subprocess.run([str(binary), "inspect", str(out)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    assert text.returncode == 0, text.stderr
    assert f"{len(expect) + len(bad)} of {len(expect) + len(bad)} samples" in text.stdout
    assert "decode_error" in text.stdout and "no_stream" in text.stdout
    as_json = subprocess.run([str(binary), "inspect", "--json", str(out)],
                             stdout=subprocess.PIPE, text=True, check=True)
    report = json.loads(as_json.stdout)
    assert report["complete"] and report["ok"]
    assert report["modalities"]["video"]["layout"] == "per_step"
    assert report["modalities"]["text"]["dim"] == 2
    assert report["failures_by_category"]["missing"] == 2
    assert len(report["failures"]) == report["failure_records"]

    # A damaged shard is caught by its checksum.
    shard = out / report["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    damaged = subprocess.run([str(binary), "inspect", str(out)], stdout=subprocess.PIPE,
                             text=True)
    assert damaged.returncode == 74
    assert "DAMAGED" in damaged.stdout


def test_results_do_not_depend_on_thread_counts(binary, probes, minilm_folder, dataset, tmp_path):
    # Batches are cut in input order (Note [Deterministic batches]), so decode parallelism and
    # LibTorch threads change nothing in what is stored, to the bit.
    manifest, _, _ = dataset
    outputs = []
    for decode, torch_threads in [(1, 1), (3, 2)]:
        out = tmp_path / f"out-{decode}"
        run_precompute(binary, tmp_path, config(probes, minilm_folder, manifest, out),
                       "--decode-threads", str(decode), "--torch-threads", str(torch_threads))
        outputs.append(read_output(out))
    a, b = outputs
    assert a.ids_in_order == b.ids_in_order
    assert a.failures == b.failures
    for sample_id, sample in a.samples.items():
        for modality in ("video", "audio", "text"):
            if modality not in sample:
                assert modality not in b.samples[sample_id]
                continue
            for key in ("rows", "vector", "timestamps"):
                if key in sample[modality]:
                    assert np.array_equal(sample[modality][key], b.samples[sample_id][modality][key])
