"""Promises the README makes that an adversarial pass broke, each tested through the real CLI:
--overwrite applied once per command (not once per restarted child), samples that no configured
modality can use, output folders holding other people's files, refusals that must leave the
earlier output alone, a stopped job. (SIGHUP and the pid named by the lock are in
test_resume.py.)"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import pytest

from conftest import colour_clip, index_checksum, shard_path, write_manifest
from test_resume import (  # noqa: F401  (fixtures)
    SHARD_SIZE, assert_media_failed, assert_same_output, committed_shards, dataset, lock_holder,
    oracle, poll, precompute, snapshot)


def read_failures(out: Path):
    """(id, modality, category, message) of every failure record in the output."""
    records = []
    for shard in sorted(out.glob("shard-*.h5")):
        with h5py.File(shard) as f:
            if "failures" not in f:
                continue
            g = f["failures"]
            for i, m, c, msg in zip(g["id"].asstr()[:], g["modality"].asstr()[:],
                                    g["category"].asstr()[:], g["message"].asstr()[:]):
                records.append((i, m, c, msg))
    return records


def stored_ids(out: Path):
    ids = []
    for shard in sorted(out.glob("shard-*.h5")):
        with h5py.File(shard) as f:
            ids += list(f["ids"].asstr()[:])
    return ids


# --------------------------------------------------------------------------------------------
# 1. --overwrite applies once per command


def test_overwrite_with_a_crashing_decoder_finishes(precompute, oracle, dataset, tmp_path):
    """Before: every restarted child re-applied --overwrite, deleting the quarantine, and the
    supervisor restarted forever (210 restarts in 60 s). Now the crash is pinned on its sample
    after at most two restarts and the job ends with the oracle's output plus the crash."""
    out = tmp_path / "out"
    precompute.run(out)  # an earlier run for --overwrite to remove
    r = precompute.run(out, "--overwrite", "--max-failures", "10", timeout=120,
                       env={"PRECOMPUTE_TEST_DECODER_FAULT": "crash:v05.mp4"})
    restarts = r.stderr.count("the run died (")
    assert 1 <= restarts <= 2, f"{restarts} restarts\n{r.stderr[-3000:]}"
    assert r.stderr.count("--overwrite: removed") == 1, "--overwrite applied more than once"
    assert_media_failed(out, oracle, dataset, "c05", "crash")


def test_overwrite_with_a_hanging_decoder_finishes(precompute, oracle, dataset, tmp_path):
    config = dataset.variant(tmp_path, "timeout", lambda c: c["run"].update(sample_timeout_s=1))
    out = tmp_path / "out"
    r = precompute.run(out, "--overwrite", "--max-failures", "10", config=config, timeout=150,
                       env={"PRECOMPUTE_TEST_DECODER_FAULT": "hang:v11.mp4"})
    assert r.seconds < 90, f"took {r.seconds:.0f} s"
    assert r.stderr.count("its watchdog ended it") <= 2
    assert_media_failed(out, oracle, dataset, "c11", "timeout")


# --------------------------------------------------------------------------------------------
# 2. Samples that no configured modality can use


@pytest.fixture()
def video_only(probes, tmp_path):
    """A config with only a video section and a manifest whose lines give video, only text,
    only audio, or video and text."""
    root = tmp_path / "data"
    root.mkdir()
    colour_clip(root / "a.mp4", ["red", "blue"])
    colour_clip(root / "b.mp4", ["green", "white"])
    entries = [{"id": "a", "video": str(root / "a.mp4")},
               {"id": "words", "text": "only a caption"},
               {"id": "sound", "audio": str(root / "a.mp4")},
               {"id": "b", "video": str(root / "b.mp4"), "text": "a caption too"}]
    manifest = write_manifest(root / "manifest.jsonl", entries)
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(tmp_path / "out"), "shard_size": 2},
              "video": {"encoder": {"path": str(probes / "video_probe.pt")},
                        "sampling": {"num_frames": 2}, "size": 32}}
    path = tmp_path / "video.yaml"
    path.write_text(json.dumps(config))
    return path, root, tmp_path / "out"


def run_cli(binary, *args, timeout=120):
    return subprocess.run([str(binary), *map(str, args)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def test_lines_without_a_configured_input_are_recorded_not_dropped(binary, video_only):
    config, _, out = video_only
    r = run_cli(binary, "run", "--config", config, "--progress-interval", "0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 of 4 samples give no input that the configured modalities use" in r.stderr
    assert sorted(stored_ids(out)) == ["a", "b"]  # the others are only in /failures
    failures = {(i, m, c) for i, m, c, _ in read_failures(out)}
    assert failures == {("words", "video", "no_input"), ("sound", "video", "no_input")}
    message = next(msg for i, _, _, msg in read_failures(out) if i == "words")
    assert "has no video input (the line gives only text)" in message
    summary = r.stderr.splitlines()[-1]
    assert "2 with embeddings" in summary and "2 with failures" in summary
    assert "no_input 2" in summary
    inspect = run_cli(binary, "inspect", out, "--json")
    assert inspect.returncode == 0, inspect.stderr
    report = json.loads(inspect.stdout)
    assert json.dumps(report).count("no_input") >= 1


def test_an_input_that_no_configured_modality_can_use_is_refused(binary, video_only, tmp_path):
    config, root, out = video_only
    manifest = write_manifest(root / "text.jsonl", [{"id": "x", "text": "one"},
                                                     {"id": "y", "text": "two"}])
    r = run_cli(binary, "run", "--config", config, "--input", manifest, "--progress-interval",
                "0")
    assert r.returncode == 65, r.stderr[-3000:]
    assert "none of the 2 samples" in r.stderr and "(video)" in r.stderr
    assert not list(out.glob("shard-*.h5"))


# --------------------------------------------------------------------------------------------
# 6. Files the tool did not write


def test_a_folder_of_other_files_is_refused_and_never_emptied(precompute, dataset, tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "shard-final-results.h5").write_bytes(b"the user's own results")
    (out / "notes.txt").write_text("keep me")
    r = precompute.run(out, expect=73)
    assert "is not empty and holds no earlier precompute run" in r.stderr
    assert "notes.txt" in r.stderr and "--overwrite" in r.stderr
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "notes.txt", "shard-final-results.h5"]
    # --overwrite writes there, and still removes nothing it did not write.
    precompute.run(out, "--overwrite")
    assert (out / "shard-final-results.h5").read_bytes() == b"the user's own results"
    assert (out / "notes.txt").read_text() == "keep me"
    assert committed_shards(out) == 24 // SHARD_SIZE
    # A rerun resumes (the folder is an output now) and keeps the files too.
    r = precompute.run(out)
    assert "24 of 24 samples are in committed shards" in r.stderr
    assert (out / "shard-final-results.h5").exists() and (out / "notes.txt").exists()


def test_a_foreign_index_json_is_not_overwritten(precompute, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.json").write_text('{"experiment": "someone else\'s"}\n')
    precompute.run(out, expect=73)
    assert (out / "index.json").read_text() == '{"experiment": "someone else\'s"}\n'


def test_an_index_naming_a_file_outside_the_folder_deletes_nothing(precompute, oracle, dataset,
                                                                    tmp_path):
    out = tmp_path / "out"
    precompute.run(out)
    victim = tmp_path / "victim.txt"
    victim.write_text("not precompute's")
    index_file = out / "index.json"
    index = json.loads(index_file.read_text())
    index["shards"][0]["file"] = "../victim.txt"
    index["checksum"] = index_checksum(index)
    index_file.write_text(json.dumps(index))
    r = precompute.run(out)
    assert victim.read_text() == "not precompute's"
    assert "which is not a shard file name" in r.stderr
    assert_same_output(out, oracle.snap, dataset.ids)


def test_the_checksum_recomputation_matches_the_tool(precompute, tmp_path):
    """The test above is only meaningful if its forged index passes the checksum."""
    out = tmp_path / "out"
    precompute.run(out)
    index = json.loads((out / "index.json").read_text())
    assert index_checksum(index) == index["checksum"]


# --------------------------------------------------------------------------------------------
# 8. A refused run leaves the earlier output as it was


def test_a_run_refused_at_start_up_keeps_the_earlier_output(precompute, dataset, tmp_path):
    out = tmp_path / "out"
    precompute.run(out)
    before = {p.name: p.read_bytes() for p in out.glob("*") if p.is_file()
              and not p.name.startswith(".")}
    # A model that does not load: refused after the folder was locked, before it was touched.
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a TorchScript archive")
    config = dataset.variant(tmp_path, "broken",
                             lambda c: c["video"]["encoder"].update(path=str(broken)))
    r = precompute.run(out, "--overwrite", config=config, expect=None)
    assert r.returncode == 2, r.stderr[-3000:]
    after = {p.name: p.read_bytes() for p in out.glob("*") if p.is_file()
             and not p.name.startswith(".")}
    assert after == before, "a refused --overwrite run changed the earlier output"
    # Changed settings are refused before a resume repairs anything either.
    (out / "index.json").write_bytes(before["index.json"])
    changed = dataset.variant(tmp_path, "changed",
                              lambda c: c["video"].update(size=48))
    r = precompute.run(out, config=changed, expect=2)
    after = {p.name: p.read_bytes() for p in out.glob("*") if p.is_file()
             and not p.name.startswith(".")}
    assert after == before


# --------------------------------------------------------------------------------------------
# A stopped job is not a stuck decoder


def stopped_child(out: Path):
    """The pid of the run's child once it is stopped (state T), else None."""
    holder = lock_holder(out)
    if holder is None:
        return None
    try:
        state = Path(f"/proc/{holder}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return None
    return holder if state in ("T", "t") else None


def test_a_stop_longer_than_the_sample_timeout_is_not_a_timeout(precompute, oracle, dataset,
                                                                 tmp_path):
    """The run stops itself (SIGSTOP, as Ctrl-Z or a scheduler's suspend would) while preparing
    c05, for 10 s, with run.sample_timeout_s 1 (the watchdog's limit is 2 * 1 + 5 s). Before,
    the watchdog ended the continued run and every sample in flight was recorded `timeout` for
    good; now the limits count from the SIGCONT and the output equals the oracle's."""
    config = dataset.variant(tmp_path, "timeout", lambda c: c["run"].update(sample_timeout_s=1))
    out = tmp_path / "out"
    with precompute.start(out, config=config,
                          env={"PRECOMPUTE_TEST_DECODER_FAULT": "stop:v05.mp4"}) as job:
        child = poll(lambda: stopped_child(out), 120, "the run to stop itself", job)
        time.sleep(10)
        os.kill(child, signal.SIGCONT)
        code = job.wait(timeout=120)
        stderr = job.stderr()
    assert code == 0, stderr[-3000:]
    assert "its watchdog ended it" not in stderr and "the run died" not in stderr
    assert_same_output(out, oracle.snap, dataset.ids)


# --------------------------------------------------------------------------------------------
# An index rebuilt from the shards verifies them against the input and their own checksums


def test_rebuilt_index_drops_a_shard_whose_caption_changed(precompute, oracle, dataset, tmp_path):
    """Before, with index.json deleted, the rebuild checked ids only: a caption edited since was
    kept with its old embedding. Each shard now stores the SHA-256 of its input range."""
    out = tmp_path / "out"
    precompute.run(out)
    (out / "index.json").unlink()
    entries = [dict(e) for e in dataset.entries]
    entries[5]["text"] = "an edited caption"  # c05, in shard 1 (positions 3-5)
    manifest = write_manifest(tmp_path / "edited.jsonl", entries)
    config = dataset.variant(tmp_path, "edited",
                             lambda c: c["input"].update(manifest=str(manifest)))
    r = precompute.run(out, config=config)
    assert "the input of its positions [3, 6) changed since it was written" in r.stderr
    assert f"{24 - SHARD_SIZE} of 24 samples are in committed shards" in r.stderr
    fresh = tmp_path / "fresh"
    precompute.run(fresh, config=config)
    assert_same_output(out, snapshot(fresh), dataset.ids)


def test_rebuilt_index_drops_a_shard_with_a_flipped_bit(precompute, oracle, dataset, tmp_path):
    """A bit flipped in a shard's stored vectors, then index.json deleted: the rebuild reads the
    shard, HDF5's Fletcher-32 checksum fails, and the shard is redone (before, it was kept with
    the wrong vector)."""
    out = tmp_path / "out"
    precompute.run(out)
    shard = shard_path(out, 2)
    with h5py.File(shard) as f:
        info = f["video/values"].id.get_chunk_info(0)
    data = bytearray(shard.read_bytes())
    data[info.byte_offset + 1] ^= 0x10
    shard.write_bytes(bytes(data))
    (out / "index.json").unlink()
    r = precompute.run(out)
    assert f"{shard.name} cannot be used to rebuild the index" in r.stderr, r.stderr[-3000:]
    assert_same_output(out, oracle.snap, dataset.ids)
