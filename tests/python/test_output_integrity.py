"""Output integrity: no run, merge or reader overwrites a user's file or serves wrong data
silently (issue list in docs/reliability.md, "Output integrity"). Each test names the defect it
guards against:

1. files with the tool's names that it did not write are refused (73), with --overwrite and by
   merge too, and left as they were;
2. a byte flipped in a merged shard (a hard link of a rank's) is found by merge, repaired by
   rerunning the rank, and the next merge replaces OUT's copy;
3. a merge killed at any moment is completed by the next one, whose output equals an
   uninterrupted merge; a deleted view is made again;
4. a view held open across --overwrite or --retry-failed reads the old rows or fill values,
   never the new output's;
5. merge and status print the rank's own command line, which reruns it;
6. verify, inspect and the reader refuse an index that names a path, misstates a modality, or
   lists another output's shard;
7. verify's exit codes are the README's: 0 whole, 1 unfinished or without index, 2 not an
   output, 74 damaged;
8. status says what merge and verify say;
10. a re-merge over fewer samples leaves no stale shard; a refused start-up leaves rank.json; a
    lock without a pid names none; verify accepts a finished rank folder; a flipped byte in
    /ids or a kept column is found.
(9, kept columns byte for byte, is in test_keep_columns.py; 11, a crash recorded once, in
test_resume.py; 12, container start offsets, in tests/unit/video_decoder_test.cpp.)"""

import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict

import h5py
import numpy as np
import pytest

from conftest import (assert_same_output, file_sha256, index_checksum, shard_path,
                      write_manifest)
from test_distributed import Job, clean_env

SHARD_SIZE = 3
SAMPLES = 22  # 8 shards; 4 ranks get 2 each
INCOMPLETE, USAGE, FOREIGN, DAMAGED = 1, 2, 73, 74


def captions(count: int, tag: str = ""):
    return [{"id": f"t{i:02d}", "text": f"caption {i}{tag}: " + "words " * (i % 5),
             "label": f"label {i % 3}"} for i in range(count)]


@pytest.fixture()
def setup(tmp_path, probes, minilm_folder):
    manifest = write_manifest(tmp_path / "manifest.jsonl", captions(SAMPLES))
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(tmp_path / "out"), "shard_size": SHARD_SIZE},
        "run": {"decode_threads": 2},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}, "batch_size": 4},
    }
    return tmp_path, config, manifest


@pytest.fixture()
def job(binary, setup) -> Job:
    root, config, _ = setup
    return Job(binary, root, config)


def merged_job(job: Job, world: int = 4) -> None:
    for r in range(world):
        job.rank(r, world)
    assert json.loads(job.tool("status", str(job.out), "--json").stdout)["merged"]


def folder_hashes(folder: Path) -> Dict[str, str]:
    return {p.name: file_sha256(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name != ".precompute.lock"}


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def write_user_hdf5(path: Path) -> bytes:
    with h5py.File(path, "w") as f:
        f["my_results"] = np.arange(10)
        f.attrs["format"] = "precompute-shard"  # even a user's file that looks like one
    return path.read_bytes()


# --------------------------------------------------------------------------------------------
# 1. Files the tool did not write


@pytest.mark.parametrize("name", ["dataset.h5", "shard-000000-0123abcd.h5", "index.json",
                                  "job.json"])
def test_a_users_file_under_a_tools_name_is_refused_and_kept(job, name):
    job.out.mkdir()
    path = job.out / name
    before = write_user_hdf5(path) if name.endswith(".h5") else None
    if before is None:
        path.write_text('{"format": "precompute-index", "mine": true}\n')
        before = path.read_bytes()
    for flags in ((), ("--overwrite",)):
        r = job.run(*flags, expect=FOREIGN)
        assert f'"{name}", which carries no output id' in r.stderr, r.stderr[-2000:]
        assert "nothing was changed" in r.stderr
        assert path.read_bytes() == before
        assert sorted(p.name for p in job.out.iterdir() if not p.name.startswith(".")) == [name]


def test_merge_refuses_a_users_dataset_h5_in_the_output(job):
    for r in range(4):
        job.rank(r, 4)
    (job.out / "dataset.h5").unlink()
    before = write_user_hdf5(job.out / "dataset.h5")
    r = job.tool("merge", str(job.out), expect=FOREIGN)
    assert '"dataset.h5", which carries no output id' in r.stderr
    assert (job.out / "dataset.h5").read_bytes() == before


def test_a_shard_of_another_output_in_the_folder_is_refused(job, binary, setup):
    root, config, _ = setup
    job.run()
    other_config = json.loads(json.dumps(config))
    other_config["output"]["path"] = str(root / "other")
    other_config["output"]["dtype"] = "float32"  # other settings: another output id
    (root / "o").mkdir()
    Job(binary, root / "o", other_config).run()
    foreign = shard_path(root / "other", 1)
    mine = shard_path(job.out, 1)
    shutil.copy(foreign, mine)
    before = folder_hashes(job.out)
    for flags in ((), ("--overwrite",)):
        r = job.run(*flags, expect=FOREIGN)
        assert f'"{mine.name}", which belongs to another output' in r.stderr, r.stderr[-2000:]
        assert folder_hashes(job.out) == before


# --------------------------------------------------------------------------------------------
# 2. Bit rot in a merged output


def test_bit_rot_in_a_merged_shard_is_found_repaired_and_replaced(job, setup):
    _, _, manifest = setup
    merged_job(job)
    victim = shard_path(job.out, 3)  # rank 1's first shard, a hard link
    with h5py.File(victim, "r") as f:
        offset = f["text/embeddings"].id.get_chunk_info(0).byte_offset
    flip(victim, offset + 5)
    r = job.tool("merge", str(job.out), expect=INCOMPLETE)
    assert "rank 1 of 4" in r.stderr and "does not hash to the SHA-256" in r.stderr, r.stderr
    assert "rerun it: cd " in r.stderr
    assert "already merged" not in r.stdout
    job.tool("verify", str(job.out), expect=DAMAGED)
    job.rank(1, 4)  # redoes the damaged shard (a new file), then merges: OUT's copy replaced
    index = json.loads((job.out / "index.json").read_text())
    for entry in index["shards"]:
        assert file_sha256(job.out / entry["file"]) == entry["sha256"], entry["file"]
    job.tool("verify", str(job.out), "--input", str(manifest))
    assert "already merged" in job.tool("merge", str(job.out)).stdout


# --------------------------------------------------------------------------------------------
# 3. A merge killed at any moment


MERGE_CRASH_POINTS = ["merge-before-job-summary", "merge-before-index", "index-mid-write",
                      "index-before-rename", "merge-before-view", "merge-before-cleanup"]


def snapshot_merge(out: Path) -> Dict[str, str]:
    return {name: digest for name, digest in folder_hashes(out).items()}


def test_a_killed_merge_is_completed_by_the_next_and_equals_an_uninterrupted_one(job, setup):
    """Every crash point of the merge, then SIGKILL at random moments (seeded): the rerun's
    folder equals an uninterrupted merge's, byte for byte, and verify passes."""
    _, _, manifest = setup
    for r in range(4):
        job.rank(r, 4)
    uninterrupted = snapshot_merge(job.out)
    assert set(uninterrupted) >= {"index.json", "dataset.h5", "job.json"}
    # A merge over the ranks of an earlier merge writes the same files: start from no merge.
    def unmerge():
        for p in job.out.iterdir():
            if p.is_file() and p.name != ".precompute.lock":
                p.unlink()
    for point in MERGE_CRASH_POINTS:
        unmerge()
        crashed = subprocess.run([str(job.binary), "merge", str(job.out)], capture_output=True,
                                 text=True, env=clean_env({"PRECOMPUTE_CRASH_AT": point}))
        assert crashed.returncode == -signal.SIGKILL, (point, crashed.stderr)
        if point == "merge-before-view":
            job.tool("verify", str(job.out), expect=DAMAGED)  # the index has no view yet
        job.tool("merge", str(job.out))
        assert snapshot_merge(job.out) == uninterrupted, point
    seed = int(os.environ.get("PRECOMPUTE_TEST_SEED", random.randrange(1 << 30)))
    print(f"random merge kills: seed {seed}")
    rng = random.Random(seed)
    for attempt in range(8):
        unmerge()
        for _ in range(20):
            p = subprocess.Popen([str(job.binary), "merge", str(job.out)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env=clean_env())
            time.sleep(rng.uniform(0.0, 0.05))
            p.kill()
            if p.wait() == 0:
                break
        job.tool("merge", str(job.out))
        assert snapshot_merge(job.out) == uninterrupted, (seed, attempt)
    job.tool("verify", str(job.out), "--input", str(manifest))


def test_a_deleted_view_is_made_again_by_merge(job):
    merged_job(job)
    view = file_sha256(job.out / "dataset.h5")
    (job.out / "dataset.h5").unlink()
    r = job.tool("status", str(job.out))
    assert "not merged: " in r.stdout and "dataset.h5: it is missing" in r.stdout, r.stdout
    job.tool("verify", str(job.out), expect=DAMAGED)
    assert "merged: " in job.tool("merge", str(job.out)).stdout
    assert file_sha256(job.out / "dataset.h5") == view
    job.tool("verify", str(job.out))


# --------------------------------------------------------------------------------------------
# 4. A view held open across a rewrite


def view_rows(f: h5py.File):
    """(ids, seqs, text vectors) read through a view file held open."""
    return (list(f["ids"].asstr()[:]), f["seq"][:], f["text/embeddings"][:].astype(np.float32))


@pytest.mark.parametrize("rewrite", ["overwrite", "retry-failed"])
def test_a_view_held_open_reads_old_rows_or_fill_values_never_new_ones(job, setup, rewrite):
    root, config, manifest = setup
    # Captions over 30 bytes fail (too_large) in four shards, for --retry-failed to redo.
    limited = json.loads(json.dumps(config))
    limited["text"]["max_text_bytes"] = 30
    limited_path = root / "limited.yaml"
    limited_path.write_text(json.dumps(limited))
    job.run(config=limited_path)
    index = json.loads((job.out / "index.json").read_text())
    redone = [(e["first_seq"], e["first_seq"] + e["seq_count"]) for e in index["shards"]
              if e["num_failures"] > 0]
    assert len(redone) == 4
    f = h5py.File(job.out / "dataset.h5", "r")
    try:
        old_ids, old_seq, old_vectors = view_rows(f)
        if rewrite == "overwrite":
            other = json.loads(json.dumps(config))
            other["output"]["dtype"] = "float32"  # other bytes, other shard names
            other_path = root / "other.yaml"
            other_path.write_text(json.dumps(other))
            job.run("--overwrite", config=other_path)
        else:
            job.run("--retry-failed")  # the default limit: the redone shards hold more rows
        ids, seq, vectors = view_rows(f)
        assert len(ids) == len(old_ids)  # the old view's shape
        gone = seq == -1
        for i in range(len(ids)):
            if gone[i]:  # a shard of the old output no longer there: the view's fill values
                assert ids[i] == "" and np.isnan(vectors[i]).all(), i
            else:
                assert ids[i] == old_ids[i] and seq[i] == old_seq[i], i
                np.testing.assert_array_equal(vectors[i], old_vectors[i])
        if rewrite == "overwrite":
            assert gone.all()
        else:
            in_redone = np.array([any(lo <= q < hi for lo, hi in redone) for q in old_seq])
            np.testing.assert_array_equal(gone, in_redone)
    finally:
        f.close()
    with h5py.File(job.out / "dataset.h5", "r") as new:  # reopened: the new output
        assert (new["seq"][:] >= 0).all() and len(new["seq"]) == SAMPLES


# --------------------------------------------------------------------------------------------
# 5. The rerun command is the rank's own


def test_the_rerun_command_repeats_every_override_and_reruns_the_rank(job, setup, tmp_path):
    root, config, manifest = setup
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = shutil.copy(manifest, elsewhere / "input.jsonl")
    out = tmp_path / "job out"
    flags = ["-o", str(out), "-i", str(moved), "--keep-columns", "label", "--overwrite"]
    for r in (0, 2, 3):
        job.rank(r, 4, *flags)
    crashed = job.rank(1, 4, *flags, "--no-supervisor", expect=None,
                       env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@2"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-2000:]
    r = job.tool("merge", str(out), expect=INCOMPLETE)
    line = next(ln for ln in r.stderr.splitlines() if "rank 1 of 4" in ln)
    command = line.split("rerun it: ", 1)[1]
    assert "-o " + shlex.quote(str(out)) in command and "-i " + str(moved) in command
    assert "--keep-columns label" in command and "--rank 1 --world-size 4" in command
    assert "--overwrite" not in command  # carried out: repeating it would remove the work
    status = job.tool("status", str(out)).stdout
    assert command in status
    # Pasted verbatim into a shell, from another folder, it finishes the rank and the job.
    done = subprocess.run(command, shell=True, cwd="/", capture_output=True, text=True,
                          env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(job.tool("status", str(out), "--json").stdout)["merged"]
    single = tmp_path / "single"
    job.run("-o", str(single), "-i", str(moved), "--keep-columns", "label")
    for k in range(8):
        with h5py.File(shard_path(out, k)) as a, h5py.File(shard_path(single, k)) as b:
            assert list(a["columns/label"].asstr()[:]) == list(b["columns/label"].asstr()[:])
            np.testing.assert_array_equal(a["text/embeddings"][:], b["text/embeddings"][:])


def test_a_refused_start_up_leaves_rank_json_as_it_was(job, setup):
    root, config, _ = setup
    merged_job(job)
    record = job.out / "ranks" / "rank-00002-of-00004" / "rank.json"
    before = record.read_bytes()
    other = json.loads(json.dumps(config))
    other["output"]["dtype"] = "float32"
    other_path = root / "other.yaml"
    other_path.write_text(json.dumps(other))
    r = job.rank(2, 4, config=other_path, expect=USAGE)
    assert "settings" in r.stderr
    assert record.read_bytes() == before
    assert json.loads(job.tool("status", str(job.out), "--json").stdout)["merged"]


# --------------------------------------------------------------------------------------------
# 6. verify, inspect and the reader do not trust index.json


def forge_index(out: Path, edit) -> None:
    """Edits index.json and recomputes its checksum, as an attacker (or a careless script)
    would: only the shards' own statements can give the edit away."""
    index = json.loads((out / "index.json").read_text())
    edit(index)
    index["checksum"] = index_checksum(index)
    (out / "index.json").write_text(json.dumps(index, indent=2))


def test_an_index_naming_a_path_outside_the_folder_is_damage_everywhere(job, tmp_path):
    job.run()
    victim = tmp_path / "victim.h5"
    shutil.copy(shard_path(job.out, 0), victim)
    forge_index(job.out, lambda i: i["shards"][0].update(file="../victim.h5"))
    for command in ("verify", "inspect"):
        r = job.tool(command, str(job.out), expect=DAMAGED)
        assert "'../victim.h5', which is not a shard file name" in r.stdout + r.stderr, command
    from precompute import OutputError, ShardDataset
    with pytest.raises(OutputError, match="not a shard name"):
        ShardDataset(str(job.out), check="none")


@pytest.mark.parametrize("field,value,words", [
    ("dim", 7, "has dim '2', index.json '7'"),
    ("layout", "per_step", "has layout 'pooled', index.json 'per_step'"),
])
def test_an_index_misstating_a_modality_fails_verify(job, field, value, words):
    job.run()
    forge_index(job.out, lambda i: i["modalities"]["text"].update({field: value}))
    r = job.tool("verify", str(job.out), expect=DAMAGED)
    assert words in r.stdout, r.stdout
    assert r.stdout.count("DAMAGED") >= 8  # every shard says otherwise


def test_an_index_misstating_the_dtype_fails_verify(job):
    job.run()
    forge_index(job.out, lambda i: i.update(storage_dtype="float32"))
    r = job.tool("verify", str(job.out), expect=DAMAGED)
    assert "stores float16, index.json records float32" in r.stdout, r.stdout


def test_a_shard_swapped_for_another_outputs_fails_verify(job, binary, setup):
    root, config, _ = setup
    job.run()
    other_config = json.loads(json.dumps(config))
    other_config["output"]["path"] = str(root / "other")
    other_config["output"]["dtype"] = "float32"
    (root / "o").mkdir()
    Job(binary, root / "o", other_config).run()
    mine = shard_path(job.out, 2)
    shutil.copy(shard_path(root / "other", 2), mine)

    def swap(index):
        entry = next(e for e in index["shards"] if e["file"] == mine.name)
        entry["bytes"], entry["sha256"] = mine.stat().st_size, file_sha256(mine)
    forge_index(job.out, swap)
    r = job.tool("verify", str(job.out), expect=DAMAGED)
    assert f"DAMAGED: {mine}: carries output id" in r.stdout and "another output" in r.stdout
    assert "was made with config fingerprint" in r.stdout


# --------------------------------------------------------------------------------------------
# 7. verify's exit codes


def test_verify_exit_codes_are_the_readmes(job, setup, tmp_path):
    _, _, manifest = setup
    # 2: not an output at all.
    empty = tmp_path / "empty"
    empty.mkdir()
    r = job.tool("verify", str(empty), expect=USAGE)
    assert "holds no precompute output" in r.stderr
    # 1: a run killed after two commits: sound, unfinished.
    crashed = job.run("--no-supervisor", expect=None,
                      env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@3"})
    assert crashed.returncode == -signal.SIGKILL
    r = job.tool("verify", str(job.out), expect=INCOMPLETE)
    assert "the run has not finished" in r.stdout and "DAMAGED" not in r.stdout, r.stdout
    # 1: its index deleted: the shards are there, a rerun rebuilds it.
    (job.out / "index.json").unlink()
    r = job.tool("verify", str(job.out), expect=INCOMPLETE)
    assert "index.json: is missing" in r.stdout
    # 0: finished.
    job.run()
    job.tool("verify", str(job.out), "--input", str(manifest))
    # 74: damaged.
    flip(shard_path(job.out, 4), 3000)
    job.tool("verify", str(job.out), expect=DAMAGED)


# --------------------------------------------------------------------------------------------
# 8. status says what merge and verify say


def test_status_agrees_with_merge_and_verify(job, setup, binary):
    root, config, manifest = setup
    merged_job(job)
    # Ranks of two world sizes in one folder: both commands ask which, and say the same of it.
    for r in range(2):
        job.rank(r, 2)
    for command in ("status", "merge"):
        r = job.tool(command, str(job.out), expect=USAGE)
        assert "different world sizes (2, 4); pass --world-size" in r.stderr
    status = job.tool("status", str(job.out), "--world-size", "4").stdout
    assert "also holds the folders of a job of 2 rank(s)" in status
    assert "; merged" in status
    assert "already merged" in job.tool("merge", str(job.out), "--world-size", "4").stdout
    shutil.rmtree(job.out / "ranks" / "rank-00000-of-00002")
    shutil.rmtree(job.out / "ranks" / "rank-00001-of-00002")
    # A damaged rank index: not done, and both say why and how to rerun it.
    rank_index = job.out / "ranks" / "rank-00002-of-00004" / "index.json"
    saved = rank_index.read_bytes()
    rank_index.write_text("{")
    status = job.tool("status", str(job.out)).stdout
    merge = job.tool("merge", str(job.out), expect=INCOMPLETE).stderr
    for text in (status, merge):
        assert "is damaged: not valid JSON" in text and "--rank 2 --world-size 4" in text, text
    assert "not merged" in status
    rank_index.write_bytes(saved)
    # The input grew and every rank was redone over it: OUT shows an earlier merge until merged.
    write_manifest(manifest, captions(SAMPLES + 5))
    for r in range(4):
        job.rank(r, 4, "--overwrite")
    status = job.tool("status", str(job.out)).stdout
    assert "total: 27 of 27 samples done (100.0%); merged" in status, status
    job.tool("verify", str(job.out), "--input", str(manifest))
    # A rank redone with other settings (--overwrite): OUT is out of date until all are.
    other = json.loads(json.dumps(config))
    other["output"]["dtype"] = "float32"
    other_path = root / "other.yaml"
    other_path.write_text(json.dumps(other))
    job.rank(0, 4, "--overwrite", config=other_path)
    status = job.tool("status", str(job.out)).stdout
    assert "; not merged:" in status, status
    r = job.tool("merge", str(job.out), expect=USAGE)
    assert "other settings" in r.stderr


# --------------------------------------------------------------------------------------------
# 10. Rough edges


def test_a_re_merge_over_fewer_samples_leaves_no_stale_shard(job, setup):
    _, _, manifest = setup
    merged_job(job)
    write_manifest(manifest, captions(SAMPLES - 7))
    for r in range(4):
        job.rank(r, 4, "--overwrite")
    index = json.loads((job.out / "index.json").read_text())
    listed = {e["file"] for e in index["shards"]}
    on_disk = {p.name for p in job.out.glob("shard-*.h5")}
    assert on_disk == listed and len(listed) == 5
    job.tool("verify", str(job.out), "--input", str(manifest))


def test_verify_accepts_a_finished_rank_folder(job):
    merged_job(job)
    r = job.tool("verify", str(job.out / "ranks" / "rank-00001-of-00004"))
    assert ": ok: 2 shard(s)" in r.stdout


def test_a_lock_without_a_pid_names_no_process(job):
    job.run()
    lock = job.out / ".precompute.lock"
    holder = subprocess.Popen(["flock", "--exclusive", str(lock), "sleep", "30"])
    try:
        time.sleep(0.5)
        lock.write_text("")
        r = job.run(expect=69)
        assert "is in use by another precompute run; wait for it to finish, stop it, or" \
               in r.stderr, r.stderr[-2000:]
        assert "unknown" not in r.stderr
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("dataset", ["ids", "columns/label"])
def test_a_flipped_byte_in_a_string_dataset_fails_verify(job, dataset):
    job.run("--keep-columns", "label")
    shard = shard_path(job.out, 1)
    with h5py.File(shard, "r") as f:
        before = list(f[dataset].asstr()[:])
    value = before[1].encode()  # t04, "label 1"
    original = shard.read_bytes()
    # The stored string, not the same bytes elsewhere in the file by chance: the first place
    # whose change changes the dataset's row (t04 -> t05, "label 1" -> "label 0").
    at = original.find(value)
    while at >= 0:
        data = bytearray(original)
        data[at + len(value) - 1] ^= 0x01
        shard.write_bytes(bytes(data))
        with h5py.File(shard, "r") as f:
            if list(f[dataset].asstr()[:]) != before:
                break
        at = original.find(value, at + 1)
    assert at >= 0
    forge_index(job.out, lambda i: next(e for e in i["shards"] if e["file"] == shard.name)
                .update(sha256=file_sha256(shard)))
    r = job.tool("verify", str(job.out), expect=DAMAGED)
    assert f"/{dataset} does not match its sha256 attribute" in r.stdout, r.stdout
