"""`precompute verify OUT [--input MANIFEST]`: a clean output passes (exit 0); a shard with bytes
flipped anywhere, truncated or deleted is found and named (exit 74); an input id the output does
not account for is reported (exit 1). One real run makes the output; each test damages a copy."""

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import h5py
import pytest

from conftest import index_checksum, run_precompute, shard_path, write_manifest

SAMPLES = [
    {"id": "a", "text": "a first caption"},
    {"id": "b", "text": "a second caption"},
    {"id": "c", "text": "a third caption"},
    {"id": "d", "video": "missing.mp4"},  # no embedding at all: only a failure record
    {"id": "e", "text": "a fifth caption"},
]
DAMAGED, INCOMPLETE = 74, 1


@pytest.fixture(scope="module")
def made(tmp_path_factory, binary, probes, minilm_folder):
    """A finished run of 5 samples in 3 shards (2 + 2 + 1), one sample failed entirely."""
    root = tmp_path_factory.mktemp("verify")
    manifest = write_manifest(root / "m.jsonl", SAMPLES)
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(root / "out"), "shard_size": 2},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")}, "sampling": {"fps": 1},
                  "size": 32},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}},
    }
    # Its video section had one input, d's missing file, and embedded nothing: the run exits 3,
    # its output whole all the same.
    run_precompute(binary, root, config, expect=3)
    return manifest, root / "out"


@pytest.fixture()
def out(made, tmp_path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(made[1], copy)
    return copy


def verify(binary, out, *flags, expect):
    r = subprocess.run([str(binary), "verify", str(out), *flags], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == expect, f"exit {r.returncode}, expected {expect}\n{r.stdout}{r.stderr}"
    return r


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_clean_output_passes_with_and_without_the_input(binary, made, out):
    r = verify(binary, out, expect=0)
    assert ": ok: 3 shard(s), 0 damaged" in r.stdout and "0 problem(s)" in r.stdout
    r = verify(binary, out, "--input", str(made[0]), expect=0)
    assert "5 of 5 ids accounted for" in r.stdout  # d by its failure record
    j = json.loads(verify(binary, out, "--json", "--input", str(made[0]), expect=0).stdout)
    assert j["ok"] and j["exit_code"] == 0 and j["problems"] == []
    assert j["samples_with_embeddings"] == 4 and j["failure_records"] >= 1
    assert j["input"]["accounted_for"] == 5 and j["input"]["missing_ids"] == []
    assert all(s["ok"] and s["datasets_read"] >= 4 for s in j["shards"])


@pytest.mark.parametrize("where", ["header", "middle", "end"])
def test_flipped_bytes_are_found_and_the_shard_named(binary, out, where):
    shard = shard_path(out, 1)
    size = shard.stat().st_size
    flip(shard, {"header": 8, "middle": size // 2, "end": size - 1}[where])
    r = verify(binary, out, expect=DAMAGED)
    assert f"DAMAGED: {shard}: its SHA-256 differs" in r.stdout
    assert "fix: rerun the same `precompute run` command" in r.stdout
    assert ": damaged: 3 shard(s), 1 damaged" in r.stdout
    j = json.loads(verify(binary, out, "--json", expect=DAMAGED).stdout)
    assert [p["shard"] for p in j["problems"]] == [shard.name]


def test_truncated_shard_is_found(binary, out):
    shard = shard_path(out, 0)
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size // 2)
    r = verify(binary, out, expect=DAMAGED)
    assert f"DAMAGED: {shard}: its size is {size // 2} bytes, not the {size} recorded" in r.stdout


def test_deleted_shard_is_found_and_its_ids_not_reported_twice(binary, made, out):
    deleted = shard_path(out, 2)
    deleted.unlink()
    r = verify(binary, out, "--input", str(made[0]), expect=DAMAGED)
    assert f"DAMAGED: {deleted}: it is missing" in r.stdout
    assert "neither an embedding" not in r.stdout  # e is in the damaged shard, named above
    assert "4 of 5 ids accounted for" in r.stdout


def test_manifest_with_an_id_the_output_lacks(binary, made, out, tmp_path):
    manifest = write_manifest(tmp_path / "more.jsonl", SAMPLES + [{"id": "new", "text": "late"}])
    r = verify(binary, out, "--input", str(manifest), expect=INCOMPLETE)
    assert "1 input id(s) have neither an embedding nor a failure record: new" in r.stdout
    assert "fix: rerun the same `precompute run` command to resume" in r.stdout
    j = json.loads(verify(binary, out, "--json", "--input", str(manifest),
                          expect=INCOMPLETE).stdout)
    assert j["verdict"] == "incomplete" and j["input"]["missing_ids"] == ["new"]


def test_manifest_without_an_id_the_output_holds(binary, out, tmp_path):
    manifest = write_manifest(tmp_path / "fewer.jsonl", [s for s in SAMPLES if s["id"] != "c"])
    r = verify(binary, out, "--input", str(manifest), expect=INCOMPLETE)
    assert "embedded id(s) are not in" in r.stdout
    assert f"c ({shard_path(out, 1).name})" in r.stdout


def test_a_flipped_chunk_behind_a_matching_sha256_fails_its_fletcher32(binary, out):
    """Reading every dataset end to end: damage that index.json was made to agree with (a shard
    rewritten by hand, a copy made from a damaged disk) is still found, naming the dataset."""
    shard = shard_path(out, 1)
    with h5py.File(shard, "r") as f:
        offset = f["text/embeddings"].id.get_chunk_info(0).byte_offset
    flip(shard, offset + 3)
    index = json.loads((out / "index.json").read_text())
    entry = next(e for e in index["shards"] if e["file"] == shard.name)
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    index["checksum"] = index_checksum(index)
    (out / "index.json").write_text(json.dumps(index, indent=2))
    r = verify(binary, out, expect=DAMAGED)
    assert f"DAMAGED: {shard}: cannot be read" in r.stdout and "/text/embeddings" in r.stdout
    assert "fix: delete this file and rerun" in r.stdout


def test_damaged_index_json_is_named(binary, out):
    (out / "index.json").write_text("{")
    r = verify(binary, out, expect=DAMAGED)
    assert "index.json" in r.stdout and "rebuilds index.json" in r.stdout


def rewrite_shard(out: Path, name: str, edit) -> None:
    """Edits a shard with h5py, then makes index.json agree with its new bytes (size, sha256,
    checksum), as a hand-assembled output would: only the content can give it away."""
    shard = out / name
    with h5py.File(shard, "r+") as f:
        edit(f)
    index = json.loads((out / "index.json").read_text())
    entry = next(e for e in index["shards"] if e["file"] == name)
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    entry["bytes"] = shard.stat().st_size
    index["checksum"] = index_checksum(index)
    (out / "index.json").write_text(json.dumps(index, indent=2))


def test_the_same_id_in_two_shards_is_found_and_both_named(binary, out):
    """An output assembled from two runs (or a shard copied from another output) can hold one id
    twice; a trainer would then see that sample twice an epoch and `lookup` would be ambiguous."""
    def rename_e_to_a(f):
        ids = f["ids"].asstr()[:]
        assert list(ids) == ["e"]
        f["ids"][0] = "a"
    second, first = shard_path(out, 2).name, shard_path(out, 0).name
    rewrite_shard(out, second, rename_e_to_a)
    with h5py.File(out / first, "r") as f:
        assert "a" in f["ids"].asstr()[:]
    r = verify(binary, out, expect=DAMAGED)
    line = next((ln for ln in r.stdout.splitlines() if "is also in" in ln), "")
    assert second in line and f"id 'a' is also in {first}" in line, r.stdout
    assert ": damaged: 3 shard(s), 1 damaged" in r.stdout
    j = json.loads(verify(binary, out, "--json", expect=DAMAGED).stdout)
    # The view was built from the index before the edit: verify names it too.
    assert {p["shard"] for p in j["problems"]} == {second, "dataset.h5"}
    assert any(f"id 'a' is also in {first}" in p["problem"] for p in j["problems"])
