"""out/dataset.h5, the one-file view: HDF5 virtual datasets over every committed shard, so that
h5py.File("out/dataset.h5")["text/embeddings"][i] is row i of the whole output. The view must
equal the shards concatenated in index order, after a first run, after a resume that adds shards,
with failed samples and absent modalities, from another working folder and after the output
folder moved; a view that cannot be written is a warning, never a failed run; a folder under
the view's name is not the tool's to replace."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import (SHARD_NAME, colour_clip, run_precompute, shard_path, sine_file,
                      write_manifest)

VIEW = "dataset.h5"


def make_samples(root: Path, count: int):
    samples = []
    for i in range(count):
        sample = {"id": f"s{i}", "video": str(root / f"v{i}.mp4"), "audio": str(root / f"a{i}.wav"),
                  "text": f"caption number {i}"}
        if i == 1:  # the video file is missing: its video row is absent, audio and text are not
            sample["video"] = str(root / "missing.mp4")
        if i == 2:  # nothing can be embedded: only in /failures, not a row of the view
            sample = {"id": "s2", "video": str(root / "also-missing.mp4")}
        if i == 3:  # no caption: its text row is absent
            del sample["text"]
        if i == 4:  # text only
            sample = {"id": "s4", "text": "words without media"}
        samples.append(sample)
    for sample in samples:
        if Path(sample.get("video", "")).name.startswith("v"):
            colour_clip(Path(sample["video"]), ["red", "blue"], size="64x48", seconds_each=0.5)
        if "audio" in sample:
            sine_file(Path(sample["audio"]), 300, 1.0)
    return samples


def config_for(manifest: Path, out: Path, probes: Path, minilm: Path) -> dict:
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "shard_size": 2},
        "run": {"decode_threads": 2},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")}, "sampling": {"fps": 4},
                  "size": 32, "pooling": "none"},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "sample_rate": 16000,
                  "window_s": 0.5, "pooling": "none"},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm / "vocab.txt")}},
    }


def concatenated_shards(out: Path) -> dict:
    """Every dataset the view shows, built from the shards in index order."""
    index = json.loads((out / "index.json").read_text())
    columns: dict = {}
    shifts: dict = {}
    for entry in index["shards"]:
        with h5py.File(out / entry["file"], "r") as f:
            columns.setdefault("ids", []).append(f["ids"].asstr()[:])
            columns.setdefault("seq", []).append(f["seq"][:])
            for modality in index["modalities"]:
                group = f[modality]
                for name in group:
                    key = f"{modality}/{name}"
                    if name == "offsets":
                        offsets = group[name][:]
                        shift = shifts.get(modality, 0)
                        first = [] if key in columns else [offsets[:1] + shift]
                        columns.setdefault(key, []).extend(first + [offsets[1:] + shift])
                        shifts[modality] = shift + int(offsets[-1])
                    else:
                        columns.setdefault(key, []).append(group[name][:])
    return {key: np.concatenate(parts) for key, parts in columns.items()}


def assert_view_equals_shards(out: Path) -> dict:
    expected = concatenated_shards(out)
    index = json.loads((out / "index.json").read_text())
    with h5py.File(out / VIEW, "r") as view:
        shown = []
        view.visititems(lambda name, obj: shown.append(name)
                        if isinstance(obj, h5py.Dataset) else None)
        assert sorted(shown) == sorted(expected)
        for key, want in expected.items():
            got = view[key].asstr()[:] if key == "ids" else view[key][:]
            assert got.dtype == want.dtype, key
            assert got.shape == want.shape, key
            np.testing.assert_array_equal(got, want, err_msg=key)
        # Row access, as a trainer does it.
        n = len(expected["ids"])
        assert n == sum(e["num_samples"] for e in index["shards"])
        for i in range(n):
            np.testing.assert_array_equal(view["text/embeddings"][i],
                                          expected["text/embeddings"][i])
        for modality in ("video", "audio"):
            o = view[f"{modality}/offsets"]
            assert o[0] == 0 and o[-1] == view[f"{modality}/values"].shape[0]
        assert view.attrs["format"] == "precompute-view"
        assert view.attrs["num_shards"] == len(index["shards"])
        assert view.attrs["config_fingerprint"] == index["config_fingerprint"]
        assert view["video"].attrs["layout"] == "per_step"
        assert view["text"].attrs["layout"] == "pooled"
    return expected


@pytest.fixture(scope="module")
def made(tmp_path_factory, binary, probes, minilm_folder):
    """A run over 5 samples (3 shards), then a resume after 3 more were appended (2 more
    shards)."""
    root = tmp_path_factory.mktemp("view")
    samples = make_samples(root, 8)
    out = root / "out"
    manifest = write_manifest(root / "m.jsonl", samples[:5])
    r = run_precompute(binary, root, config_for(manifest, out, probes, minilm_folder))
    assert "one-file view" not in r.stderr  # written at the start (no shards) and per commit
    first = root / "first"
    shutil.copytree(out, first)
    write_manifest(manifest, samples)
    run_precompute(binary, root, config_for(manifest, out, probes, minilm_folder))
    return first, out, root


def test_view_equals_shards_after_a_run(made):
    first, _, _ = made
    rows = assert_view_equals_shards(first)
    assert len(json.loads((first / "index.json").read_text())["shards"]) == 3
    ids = list(rows["ids"])
    assert ids == ["s0", "s1", "s3", "s4"]  # s2 failed entirely: not a row
    present = {m: dict(zip(ids, rows[f"{m}/present"])) for m in ("video", "audio", "text")}
    assert present["video"] == {"s0": 1, "s1": 0, "s3": 1, "s4": 0}
    assert present["audio"] == {"s0": 1, "s1": 1, "s3": 1, "s4": 0}
    assert present["text"] == {"s0": 1, "s1": 1, "s3": 0, "s4": 1}
    # Absent rows: a zero vector (pooled), an empty range of the per-step values.
    assert not rows["text/embeddings"][ids.index("s3")].any()
    assert rows["text/embeddings"][ids.index("s4")].any()
    o = rows["video/offsets"]
    assert o[ids.index("s1")] == o[ids.index("s1") + 1]


def test_view_equals_shards_after_a_resume_that_adds_shards(made):
    _, out, _ = made
    rows = assert_view_equals_shards(out)
    # [4, 5) was the last, short shard; the appended [5, 8) is cut at multiples of 2.
    assert len(json.loads((out / "index.json").read_text())["shards"]) == 5
    assert list(rows["ids"]) == ["s0", "s1", "s3", "s4", "s5", "s6", "s7"]
    assert list(rows["seq"]) == [0, 1, 3, 4, 5, 6, 7]


def test_view_reads_from_another_folder_and_after_the_output_moved(made, tmp_path):
    _, out, _ = made
    expected = concatenated_shards(out)
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    # A decoy shard in the working folder must not be read: sources resolve next to the view.
    (tmp_path / "cwd").mkdir()
    shutil.copy(shard_path(out, 1), tmp_path / "cwd" / shard_path(out, 0).name)
    previous = os.getcwd()
    os.chdir(tmp_path / "cwd")
    try:
        with h5py.File(moved / VIEW, "r") as view:
            np.testing.assert_array_equal(view["text/embeddings"][:], expected["text/embeddings"])
            np.testing.assert_array_equal(view["audio/values"][:], expected["audio/values"])
            assert list(view["ids"].asstr()[:]) == list(expected["ids"])
    finally:
        os.chdir(previous)


def test_view_is_rebuilt_on_resume_and_removed_by_overwrite(made, binary, probes,
                                                             minilm_folder, tmp_path):
    first, _, root = made
    out = tmp_path / "out"
    shutil.copytree(first, out)
    # A damaged view of this output (it still carries the output's id): the next run replaces it.
    output_id = json.loads((out / "index.json").read_text())["output_id"]
    (out / VIEW).write_bytes(b"stale " + output_id.encode())
    manifest = write_manifest(tmp_path / "m.jsonl",
                              [json.loads(l) for l in (root / "m.jsonl").read_text().splitlines()][:5])
    config = config_for(manifest, out, probes, minilm_folder)
    r = run_precompute(binary, tmp_path, config)
    assert "5 of 5 samples are in committed shards" in r.stderr
    assert_view_equals_shards(out)
    (out / VIEW).unlink()
    run_precompute(binary, tmp_path, config, "--overwrite")
    assert_view_equals_shards(out)
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert names[:2] == ["dataset.h5", "index.json"] and len(names) == 6, names
    assert all(re.fullmatch(SHARD_NAME, n) for n in names[2:-1]), names
    assert names[-1] == "summary.json", names  # the run's summary (docs/format.md)


def test_a_view_that_cannot_be_written_is_a_warning(made, binary, probes, minilm_folder,
                                                    tmp_path):
    """A resumed run's rename of the view fails (strace fault injection on the rename that a
    traced run of the same command shows is the view's): the run goes on and ends as it would
    have; the shards and index are whole, and the next run writes the view again."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    first, _, root = made
    out = tmp_path / "out"
    manifest = write_manifest(tmp_path / "m.jsonl",
                              [json.loads(l) for l in (root / "m.jsonl").read_text().splitlines()][:5])
    config = config_for(manifest, out, probes, minilm_folder)
    run_precompute(binary, tmp_path, config)
    command = [str(binary), "run", "--config", str(tmp_path / "config.yaml"),
               "--progress-interval", "0", "--no-supervisor"]

    def traced(*options):
        (out / VIEW).unlink()  # a resume writes a view that is missing
        return subprocess.run(["strace", "-f", "-qq", "-e", "trace=rename", *options, *command],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=600)
    trace = tmp_path / "renames.txt"
    r = traced("-o", str(trace))
    if "PTRACE" in r.stderr or "Operation not permitted" in r.stderr[:300]:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[-300:]}")
    renames = [line for line in trace.read_text().splitlines() if "rename(" in line]
    nth = next(i for i, line in enumerate(renames, 1) if f'"{out / VIEW}"' in line)
    r = traced("-o", "/dev/null", "-e", f"inject=rename:error=EIO:when={nth}")
    assert "could not write the one-file view" in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (out / VIEW).exists()
    assert len(json.loads((out / "index.json").read_text())["shards"]) == 3
    assert concatenated_shards(out)["ids"].tolist() == concatenated_shards(first)["ids"].tolist()
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    run_precompute(binary, tmp_path, config)
    assert_view_equals_shards(out)


def test_a_folder_under_the_views_name_is_refused_not_replaced(made, binary, probes,
                                                                minilm_folder, tmp_path):
    _, _, root = made
    out = tmp_path / "out"
    (out / VIEW).mkdir(parents=True)
    (out / VIEW / "keep").write_text("not empty")
    manifest = write_manifest(tmp_path / "m.jsonl",
                              [json.loads(l) for l in (root / "m.jsonl").read_text().splitlines()][:5])
    for flags in ((), ("--overwrite",)):
        r = run_precompute(binary, tmp_path, config_for(manifest, out, probes, minilm_folder),
                           *flags, expect=73)
        assert '"dataset.h5", which is not a regular file' in r.stderr, r.stderr[-2000:]
        assert (out / VIEW / "keep").read_text() == "not empty"
        assert not (out / "index.json").exists()
