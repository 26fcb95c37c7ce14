"""The Python reader (python/precompute) on a small real output: items equal what h5py reads
(with 0 and 4 DataLoader workers, under fork and spawn), every sample exactly once per epoch
across 3 ranks x 2 workers, collate on ragged sequences, lookup and split files, the package
installs with pip, and damaged, missing or foreign shards fail naming the shard."""

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import ROOT, ffmpeg, read_output, run_precompute, shard_path, write_manifest

import precompute
from precompute import (DamagedShardError, FingerprintMismatchError, MissingShardError,
                        OutputError, ShardDataset, ShardIterableDataset, collate)


def make_config(probes, minilm_folder, manifest, out, window_s=0.5):
    """Video per frame with timestamps, audio pooled, text per token (ragged lengths)."""
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "shard_size": 5},
        "run": {"decode_threads": 2, "torch_threads": 1},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")}, "sampling": {"fps": 4},
                  "size": [32, 32], "pooling": "none"},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "window_s": window_s,
                  "pooling": "mean"},
        "text": {"encoder": {"path": str(probes / "text_probe.pt")}, "pooling": "none",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}},
    }


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("reader-input")
    for k in range(3):  # clips of 2, 4 and 6 frames at 4 fps, with audio
        ffmpeg("-f", "lavfi", "-i", f"testsrc2=s=64x48:r=10:d={0.5 + 0.5 * k}",
               "-f", "lavfi", "-i", "sine=frequency=440:sample_rate=16000:duration=2",
               "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "aac",
               "-shortest", str(d / f"clip{k}.mp4"))
    samples = []
    for i in range(23):
        s = {"id": f"sample-{i:02d}" if i != 9 else "café ☕ 09", "text": "word " * (1 + i % 6)}
        if i % 4 == 0:
            s["video"] = f"clip{i % 3}.mp4"
        samples.append(s)
    samples[5] = {"id": "gone", "video": "missing.mp4"}  # fails in every modality: not in /ids
    return write_manifest(d / "manifest.jsonl", samples)


@pytest.fixture(scope="module")
def output(binary, probes, minilm_folder, run_inputs, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reader-out")
    run_precompute(binary, tmp, make_config(probes, minilm_folder, run_inputs, tmp / "out"))
    return tmp / "out"


@pytest.fixture(scope="module")
def expected(output):
    return read_output(output)


def copy_output(output, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(output, copy)
    return copy


def assert_item_equals_h5py(item, expected):
    sample = expected.samples[item["id"]]
    assert item["seq"] == sample["seq"]
    for m in ("video", "audio", "text"):
        got = item[m]
        assert got["present"] == (m in sample), (item["id"], m)
        if m == "audio":  # pooled
            assert got["embedding"].shape == (3,) and got["embedding"].dtype == np.float16
            want = sample[m]["vector"] if m in sample else np.zeros(3)
            np.testing.assert_array_equal(got["embedding"].astype(np.float64), want)
            continue
        want = sample[m]["rows"] if m in sample else np.zeros((0, 3 if m == "video" else 2))
        assert got["values"].dtype == np.float16
        np.testing.assert_array_equal(got["values"].astype(np.float64), want)
        if m == "video":
            np.testing.assert_array_equal(got["timestamps"],
                                          sample[m]["timestamps"] if m in sample else [])
        else:
            assert "timestamps" not in got


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("workers,start", [(0, None), (4, "fork"), (4, "spawn")])
def test_items_equal_what_h5py_reads(output, expected, workers, start):
    data = ShardDataset(output)
    assert len(data) == len(expected.ids_in_order) == 22
    assert_item_equals_h5py(data[0], expected)  # the parent holds open handles before forking
    loader = DataLoader(data, batch_size=3, shuffle=True, num_workers=workers,
                        multiprocessing_context=start, collate_fn=list,
                        generator=torch.Generator().manual_seed(1))
    seen = []
    for batch in loader:
        for item in batch:
            assert_item_equals_h5py(item, expected)
            seen.append(item["id"])
    assert sorted(seen) == sorted(expected.ids_in_order)
    # Every item through the direct path too, in input order.
    assert [data[i]["id"] for i in range(len(data))] == expected.ids_in_order
    assert data[-1]["id"] == expected.ids_in_order[-1]


def test_batched_reads_coalesce_and_keep_the_requested_order(output, expected):
    data = ShardDataset(output, modalities=["text", "video"])
    wanted = [7, 0, 21, 3, 4, 5, 13, 12]
    items = data.__getitems__(wanted)
    assert [it["id"] for it in items] == [expected.ids_in_order[i] for i in wanted]
    for it in items:
        assert set(it) == {"id", "seq", "text", "video"}
    reads = data.reader._runs(np.array([0, 1, 2, 30, 31, 200]))  # gaps <= 32 merge
    assert [(lo, hi) for lo, hi, _ in reads] == [(0, 32), (200, 201)]


def test_every_sample_once_per_epoch_across_3_ranks_x_2_workers(output, expected, monkeypatch):
    everything = sorted(expected.ids_in_order)
    orders = []
    for epoch in (0, 1):
        counts = collections.Counter()
        order = []
        for rank in range(3):
            if rank == 2:  # the environment torchrun sets, instead of arguments
                monkeypatch.setenv("RANK", "2")
                monkeypatch.setenv("WORLD_SIZE", "3")
                data = ShardIterableDataset(output, buffer_size=4, read_rows=3, seed=5)
            else:
                data = ShardIterableDataset(output, buffer_size=4, read_rows=3, seed=5,
                                            rank=rank, world_size=3)
            assert (data.rank, data.world_size) == (rank, 3)
            data.set_epoch(epoch)
            loader = DataLoader(data, batch_size=2, num_workers=2, collate_fn=list,
                                multiprocessing_context="fork")
            ids = [item["id"] for batch in loader for item in batch]
            assert len(ids) == len(data) in (7, 8)
            counts.update(ids)
            order += ids
        assert sorted(counts) == everything and set(counts.values()) == {1}, counts
        orders.append(order)
    assert orders[0] != orders[1]  # set_epoch reshuffles


def test_iterable_items_equal_h5py_and_keep_input_order_unshuffled(output, expected):
    data = ShardIterableDataset(output, shuffle=False, rank=0, world_size=1)
    items = list(data)
    assert [it["id"] for it in items] == expected.ids_in_order
    for it in items:
        assert_item_equals_h5py(it, expected)
    shuffled = [it["id"] for it in ShardIterableDataset(output, seed=3, buffer_size=5,
                                                        rank=0, world_size=1)]
    assert sorted(shuffled) == sorted(expected.ids_in_order) and shuffled != \
        expected.ids_in_order


def test_collate_pads_ragged_sequences(output, expected):
    data = ShardDataset(output)
    items = data.__getitems__([0, 1, 2, 3, 4, 7])  # text of 3-8 tokens; video on some only
    batch = collate(items)
    assert batch["id"] == [it["id"] for it in items]
    assert batch["seq"].tolist() == [it["seq"] for it in items]
    audio = batch["audio"]
    assert audio["embedding"].shape == (6, 3) and audio["embedding"].dtype == torch.float16
    assert audio["present"].tolist() == [it["audio"]["present"] for it in items]
    for m, dim in (("text", 2), ("video", 3)):
        b = batch[m]
        lengths = [len(it[m]["values"]) for it in items]
        assert len(set(lengths)) > 1, f"{m} is not ragged in this batch: {lengths}"
        assert b["values"].shape == (6, max(lengths), dim)
        assert b["lengths"].tolist() == lengths
        assert b["mask"].sum(1).tolist() == lengths
        assert b["present"].tolist() == [it[m]["present"] for it in items]
        for k, it in enumerate(items):
            n = lengths[k]
            assert torch.equal(b["values"][k, :n], torch.from_numpy(it[m]["values"]))
            assert not b["values"][k, n:].any() and not b["mask"][k, n:].any()
            if m == "video":
                assert torch.equal(b["timestamps"][k, :n],
                                   torch.from_numpy(it[m]["timestamps"]))
    assert "timestamps" not in batch["text"]
    assert 0 in batch["video"]["lengths"].tolist()  # an absent video pads to all-zero rows


def test_lookup_ids_and_split_file(output, expected, tmp_path):
    data = ShardDataset(output)
    for sample_id in expected.ids_in_order:
        shard, row = data.lookup(sample_id)
        with h5py.File(output / shard, "r") as f:
            assert f["ids"].asstr()[row] == sample_id
    with pytest.raises(KeyError, match="gone"):
        data.lookup("gone")  # failed in every modality: only in /failures
    split = tmp_path / "val.txt"
    split.write_text("sample-13\ncafé ☕ 09\n\nsample-00\n", encoding="utf-8")
    subset = ShardDataset(output, ids=split)
    assert [it["id"] for it in subset] == ["sample-13", "café ☕ 09", "sample-00"]
    assert [it["id"] for it in ShardDataset(output, ids=["sample-22"])] == ["sample-22"]
    split.write_text("sample-01\nnot-there\n")
    with pytest.raises(KeyError, match="not-there"):
        ShardDataset(output, ids=split)


def test_missing_shard_fails_naming_it(output, tmp_path):
    copy = copy_output(output, tmp_path)
    missing = shard_path(copy, 2)
    missing.unlink()
    with pytest.raises(MissingShardError, match=rf"{missing.name}.*precompute run") as e:
        ShardDataset(copy)
    assert e.value.shard.endswith(missing.name)


def test_truncated_shard_fails_naming_it(output, tmp_path):
    copy = copy_output(output, tmp_path)
    shard = shard_path(copy, 1)
    shard.write_bytes(shard.read_bytes()[:20000])
    with pytest.raises(DamagedShardError, match=rf"{shard.name} has 20000 bytes"):
        ShardDataset(copy)
    unchecked = ShardDataset(copy, check="none")  # HDF5 itself refuses it when it is opened
    with pytest.raises(DamagedShardError, match=rf"{shard.name} cannot be opened by HDF5"):
        [unchecked[i] for i in range(len(unchecked))]


def test_flipped_bytes_fail_the_read_naming_the_shard(output, tmp_path):
    copy = copy_output(output, tmp_path)
    shard = shard_path(copy, 3)
    with h5py.File(shard, "r") as f:
        offset = f["text/values"].id.get_chunk_info(0).byte_offset
    data = bytearray(shard.read_bytes())
    data[offset + 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DamagedShardError, match=rf"{shard.name}: sha256"):
        ShardDataset(copy, check="sha256")
    dataset = ShardDataset(copy)  # same size: only the Fletcher-32 checksums catch it
    with pytest.raises(DamagedShardError, match=rf"reading shard .*{shard.name} failed"):
        [dataset[i] for i in range(len(dataset))]
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork",
                        collate_fn=collate)
    with pytest.raises(DamagedShardError, match=shard.name):  # re-raised with its type
        list(loader)


def test_mixed_config_fingerprints_fail_naming_the_shard(binary, probes, minilm_folder,
                                                         run_inputs, output, tmp_path):
    other = tmp_path / "other"
    run_precompute(binary, tmp_path,
                   make_config(probes, minilm_folder, run_inputs, other, window_s=0.25))
    copy = copy_output(output, tmp_path)
    mine = shard_path(copy, 1)
    shutil.copy(shard_path(other, 1), mine)  # under this output's name for the shard
    index = json.loads((copy / "index.json").read_text())
    entry = next(s for s in index["shards"] if s["file"] == mine.name)
    raw = mine.read_bytes()
    entry["bytes"], entry["sha256"] = len(raw), hashlib.sha256(raw).hexdigest()
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(FingerprintMismatchError, match=rf"{mine.name} was written with "
                                                       r"other settings"):
        ShardDataset(copy, check="open")
    lazy = ShardDataset(copy)  # the default check stats files; the shard's open catches it
    with pytest.raises(FingerprintMismatchError, match=mine.name):
        [lazy[i] for i in range(len(lazy))]


def test_unusable_output_folders_are_refused_with_the_fix(output, tmp_path):
    with pytest.raises(OutputError, match="index.json does not exist"):
        ShardDataset(tmp_path)
    copy = copy_output(output, tmp_path)
    index = json.loads((copy / "index.json").read_text())
    index["shards"] = index["shards"][:-1]
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(OutputError, match="cover 20 of 23 input positions"):
        ShardDataset(copy)
    assert len(ShardDataset(copy, allow_incomplete=True)) == 19
    with pytest.raises(ValueError, match="no modality 'depth'"):
        ShardDataset(output, modalities=["depth"])


def test_pip_installs_the_package(tmp_path):
    # From a copy: pip builds in the source folder, and its build/ must not land in the tree.
    source = shutil.copytree(ROOT / "python", tmp_path / "python",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", str(source), "--no-deps",
                        "--target", str(target), "-q", "--disable-pip-version-check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-c", "import precompute; print(precompute.__file__, "
                        "precompute.ShardDataset, precompute.collate)"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(target)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(target)), r.stdout
    assert (target / "precompute" / "py.typed").exists()
    assert precompute.__version__ in " ".join(p.name for p in target.iterdir())


def test_a_flipped_byte_in_an_id_fails_naming_the_shard(output, tmp_path):
    """Ids are variable-length strings, which HDF5 cannot checksum; their `sha256` attribute
    does it (docs/format.md): the id index and the rows' ids both check it."""
    copy = copy_output(output, tmp_path)
    shard = shard_path(copy, 1)
    data = bytearray(shard.read_bytes())
    at = data.find(b"sample-07")
    assert at > 0
    data[at + 8] = ord("X")  # sample-07 becomes sample-0X
    shard.write_bytes(bytes(data))
    with pytest.raises(DamagedShardError, match=rf"{shard.name}: /ids does not match"):
        ShardDataset(copy, ids=["sample-01"])
    dataset = ShardDataset(copy)
    with pytest.raises(DamagedShardError, match=rf"{shard.name}: /ids does not match"):
        [dataset[i] for i in range(len(dataset))]


def test_an_index_that_names_a_path_or_misstates_a_modality_is_refused(output, tmp_path):
    copy = copy_output(output, tmp_path)
    index = json.loads((copy / "index.json").read_text())
    victim = tmp_path / "victim.h5"
    shutil.copy(shard_path(copy, 0), victim)
    edited = json.loads(json.dumps(index))
    edited["shards"][0]["file"] = "../victim.h5"
    (copy / "index.json").write_text(json.dumps(edited))
    with pytest.raises(OutputError, match=r"'\.\./victim\.h5', which is not a shard name"):
        ShardDataset(copy, check="none")
    edited = json.loads(json.dumps(index))
    edited["modalities"]["text"]["dim"] += 1
    (copy / "index.json").write_text(json.dumps(edited))
    with pytest.raises(DamagedShardError, match=r"/text group is not what index.json says"):
        ShardDataset(copy, check="open")
