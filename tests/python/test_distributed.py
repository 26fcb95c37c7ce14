"""A job split into ranks (docs/distributed.md), run as plain processes: each rank writes its span
into OUT/ranks/rank-R-of-N, the last one to finish merges, and OUT is then the output one process
makes, file for file: the same index.json, the same shard bytes, the same one-file view. Also:
merge refuses while a rank is missing or unfinished, naming it and its rerun command; a rerun of
a finished rank changes nothing; ranks without work exit 0; every bad rank or world size, from a
flag or the environment, exits 2 before anything is written. tests/python/test_slurm.py runs the
same job under a real SLURM cluster."""

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import assert_same_output, file_sha256, write_manifest

SHARD_SIZE = 3
SAMPLES = 22  # 8 shards: 4 ranks get 2 each
# Variables that make a rank of a run; a test's run sees only those it sets.
PARTITION_VARIABLES = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
                       "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP", "SLURM_PROCID",
                       "SLURM_NTASKS", "RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX",
                       "PRECOMPUTE_CRASH_AT", "PRECOMPUTE_TEST_DECODER_FAULT")


def clean_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PARTITION_VARIABLES}
    env.update(extra or {})
    return env


class Job:
    """One job's config over a text dataset with failures (a line with no text: no_input; an
    empty caption), and the commands on it."""

    def __init__(self, binary: Path, root: Path, config: dict):
        self.binary = binary
        self.root = root
        self.out = Path(config["output"]["path"])
        self.config_path = root / "config.yaml"
        self.config_path.write_text(json.dumps(config, indent=1))

    def run(self, *flags: str, expect: Optional[int] = 0, env: Optional[Dict[str, str]] = None,
            config: Optional[Path] = None) -> subprocess.CompletedProcess:
        cmd = [str(self.binary), "run", "--config", str(config or self.config_path),
               "--progress-interval", "0", *flags]
        result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                env=clean_env(env), timeout=300)
        if expect is not None:
            assert result.returncode == expect, (
                f"{' '.join(cmd)}: exit {result.returncode}, expected {expect}\n"
                f"{result.stderr[-4000:]}")
        return result

    def tool(self, *args: str, expect: Optional[int] = 0) -> subprocess.CompletedProcess:
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True,
                                env=clean_env(), timeout=300)
        if expect is not None:
            assert result.returncode == expect, (
                f"{args}: exit {result.returncode}, expected {expect}\n{result.stdout}\n"
                f"{result.stderr[-4000:]}")
        return result

    def rank(self, rank: int, world: int, *flags: str, **kw) -> subprocess.CompletedProcess:
        return self.run("--rank", str(rank), "--world-size", str(world), *flags, **kw)


@pytest.fixture(scope="module")
def job_data(tmp_path_factory, probes, minilm_folder):
    """The config, and the oracle: one process over the whole input, run at the job's own output
    path (so that its shards record the same config) and then moved aside."""
    root = tmp_path_factory.mktemp("distributed")
    entries = []
    for i in range(SAMPLES):
        sample = {"id": f"t{i:02d}", "text": f"caption {i}: " + "words " * (i % 5)}
        if i == 5:
            sample = {"id": "no-text", "video": str(root / "no-such.mp4")}  # no_input
        if i == 16:
            sample["text"] = ""  # an empty caption
        entries.append(sample)
    manifest = write_manifest(root / "manifest.jsonl", entries)
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(root / "out"), "shard_size": SHARD_SIZE},
        "run": {"decode_threads": 2},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}, "batch_size": 4},
    }
    return root, config, manifest


@pytest.fixture(scope="module")
def oracle(binary, job_data) -> Path:
    root, config, _ = job_data
    job = Job(binary, root, config)
    job.run()
    oracle = root / "oracle"
    shutil.move(str(job.out), oracle)
    return oracle


@pytest.fixture()
def job(binary, job_data, oracle):
    root, config, _ = job_data
    j = Job(binary, root, config)
    shutil.rmtree(j.out, ignore_errors=True)
    yield j
    shutil.rmtree(j.out, ignore_errors=True)


def tree_hashes(folder: Path) -> Dict[str, str]:
    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".precompute.lock"}


def test_ranks_merge_into_the_single_process_output(job, oracle, job_data):
    _, _, manifest = job_data
    for r in (3, 0, 2, 1):  # any order; the last to finish merges
        result = job.rank(r, 4)
        assert f"rank {r} of 4 (from --rank and --world-size)" in result.stderr
    assert f"merged 4 rank(s) into {job.out}" in result.stderr
    for r in range(4):
        assert (job.out / "ranks" / f"rank-{r:05d}-of-00004" / "index.json").exists()
    assert_same_output(oracle, job.out)
    job.tool("verify", str(job.out), "--input", str(manifest))
    inspected = json.loads(job.tool("inspect", str(job.out), "--json").stdout)
    assert inspected == json.loads(job.tool("inspect", str(oracle), "--json").stdout
                                   .replace(str(oracle), str(job.out)))
    # The reader sees one output.
    from precompute import ShardDataset
    data = ShardDataset(str(job.out), modalities=["text"])
    assert len(data) == len(ShardDataset(str(oracle), modalities=["text"]))

    summary = json.loads((job.out / "job.json").read_text())
    assert summary["world_size"] == 4
    assert [r["rank"] for r in summary["ranks"]] == [0, 1, 2, 3]
    assert sum(r["samples"] for r in summary["ranks"]) == SAMPLES
    index = json.loads((oracle / "index.json").read_text())
    assert summary["totals"]["failure_records"] == index["totals"]["failures"]
    assert all(r["shards"] == 2 and r["finished"] for r in summary["ranks"])

    status = job.tool("status", str(job.out)).stdout
    assert status.count(": done, ") == 4, status
    assert f"total: {SAMPLES} of {SAMPLES} samples done (100.0%); merged" in status

    # Merging again, or rerunning a finished rank, changes nothing.
    before = tree_hashes(job.out)
    assert "already merged" in job.tool("merge", str(job.out)).stdout
    rerun = job.rank(1, 4)
    assert "already shows every rank's shards" in rerun.stderr
    assert tree_hashes(job.out) == before
    # --overwrite redoes the rank: the same shard bytes, the same merged output.
    job.rank(2, 4, "--overwrite")
    assert_same_output(oracle, job.out)

    # --retry-failed on the merged output, as one process: a later merge keeps its index.
    job.run("--world-size", "1", "--retry-failed")
    retried = (job.out / "index.json").read_bytes()
    refused = job.tool("merge", str(job.out), expect=2)
    assert "its index.json was not written by the last merge" in refused.stderr, refused.stderr
    assert (job.out / "index.json").read_bytes() == retried
    # The output is whole; job.json is the merge's history, which verify notes, and status says
    # what merge says.
    verified = job.tool("verify", str(job.out))
    assert "job.json describes the merge before a run on this output" in verified.stdout
    status = job.tool("status", str(job.out)).stdout
    assert "not merged: " in status and "was not written by the last merge" in status, status


def test_merge_refuses_a_missing_or_unfinished_rank(job, oracle, job_data):
    job.rank(0, 4)
    # Rank 1 from SLURM's array variables, rank 3 from torchrun's.
    result = job.run(env={"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4"})
    assert "rank 1 of 4 (from SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT)" in result.stderr
    assert "the job is merged when every rank is" in result.stderr
    result = job.run(env={"RANK": "3", "WORLD_SIZE": "4"})
    assert "rank 3 of 4 (from RANK and WORLD_SIZE)" in result.stderr

    refused = job.tool("merge", str(job.out), expect=1)
    assert "rank 2 of 4: not started" in refused.stderr, refused.stderr
    # Never started: the command the job ran with (rank 0's), for rank 2.
    assert f"--config {job.config_path} --progress-interval 0 --rank 2 --world-size 4" \
        in refused.stderr
    assert "rank 0 of 4" not in refused.stderr
    assert not (job.out / "index.json").exists()
    status = job.tool("status", str(job.out)).stdout
    assert "rank     2: not started, 0 of 6 samples" in status, status
    assert "not merged yet" in status

    # Rank 2 stopped after one shard (a crash at the second shard's commit): unfinished.
    crashed = job.rank(2, 4, "--no-supervisor", expect=None,
                       env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@2"})
    assert crashed.returncode != 0
    refused = job.tool("merge", str(job.out), expect=1)
    assert "rank 2 of 4: stopped" in refused.stderr, refused.stderr
    assert "3 of 6 samples" in refused.stderr
    status = job.tool("status", str(job.out)).stdout
    assert "rank     2: stopped" in status and "3 of 6 samples" in status, status

    # Kubernetes: the index from JOB_COMPLETION_INDEX, the count from the config.
    k8s_config = job.root / "k8s.yaml"
    config = json.loads(job.config_path.read_text())
    config["run"]["world_size"] = 4
    k8s_config.write_text(json.dumps(config))
    result = job.run(env={"JOB_COMPLETION_INDEX": "2"}, config=k8s_config)
    assert "rank 2 of 4 (from JOB_COMPLETION_INDEX and run.world_size)" in result.stderr
    assert f"merged 4 rank(s) into {job.out}" in result.stderr
    assert_same_output(oracle, job.out)


def test_ranks_without_work_exit_0(job):
    # 8 shards over 10 ranks: ranks 0 and 5 have none.
    result = job.rank(0, 10)
    assert "rank 0 of 10 has no work" in result.stderr
    # Its folder holds only rank.json: a rerun is not refused as a folder of foreign files.
    assert "has no work" in job.rank(0, 10).stderr
    refused = job.tool("merge", str(job.out), expect=1)
    for r in (1, 2, 3, 4, 6, 7, 8, 9):
        assert f"rank {r} of 10: not started" in refused.stderr
    for r in (0, 5):
        assert f"rank {r} of 10:" not in refused.stderr
    status = job.tool("status", str(job.out)).stdout
    assert "rank     0: done, no work" in status and "rank     5: done, no work" in status


@pytest.mark.parametrize("flags, env, message", [
    (["--rank", "4", "--world-size", "4"], {}, "rank 4 (from --rank) is not below the world size 4"),
    (["--rank", "-1", "--world-size", "4"], {}, "--rank = -1 is negative"),
    (["--rank", "0", "--world-size", "0"], {}, "--world-size 0: a job has at least 1 rank"),
    (["--rank", "x", "--world-size", "4"], {}, "--rank = 'x' is not a whole number"),
    (["--rank", "0", "--world-size", "1000000000000"], {}, "--world-size = 1000000000000 is too large"),
    (["--rank", "1"], {}, "rank 1 (from --rank) but no world size"),
    (["--world-size", "4"], {}, "a world size of 4 (from --world-size) but no rank"),
    ([], {"RANK": "two", "WORLD_SIZE": "4"}, "environment variable RANK = 'two' is not a whole number"),
    ([], {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "1"},
     "a resubmitted task sees only its own count: pass --world-size"),
    ([], {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "4", "RANK": "2", "WORLD_SIZE": "4"},
     "the environment names two different ranks"),
    ([], {"JOB_COMPLETION_INDEX": "1"}, "rank 1 (from JOB_COMPLETION_INDEX) but no world size"),
    (["--rank", "0", "--world-size", "4", "--retry-failed"], {},
     "--retry-failed is not for one rank"),
])
def test_bad_ranks_exit_2_before_writing(job, flags, env, message):
    result = job.run(*flags, expect=2, env=env)
    assert message in result.stderr, result.stderr
    assert not job.out.exists()


def test_a_rank_refuses_a_changed_split(job):
    job.rank(1, 4)
    other = job.root / "other-shards.yaml"
    config = json.loads(job.config_path.read_text())
    config["output"]["shard_size"] = SHARD_SIZE + 1
    other.write_text(json.dumps(config))
    result = job.rank(1, 4, expect=2, config=other)
    assert "which splits the job into other ranks" in result.stderr, result.stderr
    # --overwrite starts the rank over with the new split.
    job.rank(1, 4, "--overwrite", config=other)
    # The flags beat the environment, and --world-size 1 is one process over everything.
    result = job.run("--world-size", "1", "--overwrite", env={"RANK": "1", "WORLD_SIZE": "4"})
    assert "world size 1 (from --world-size): one process runs the whole input" in result.stderr
    assert (job.out / "index.json").exists()


def test_a_rank_left_without_work_by_a_new_split_refuses_its_old_shards(job):
    small = job.root / "shards-of-1.yaml"
    config = json.loads(job.config_path.read_text())
    config["output"]["shard_size"] = 1
    small.write_text(json.dumps(config))
    job.rank(0, 10, config=small)  # 22 shards of 1: rank 0 of 10 embeds positions 0 and 1
    result = job.rank(0, 10, expect=2)  # 8 shards of 3: rank 0 of 10 has none
    assert "holds shards of an earlier split of the job" in result.stderr, result.stderr
    result = job.rank(0, 10, "--overwrite")
    assert "has no work" in result.stderr
    assert not list((job.out / "ranks" / "rank-00000-of-00010").glob("shard-*.h5"))


def test_max_failures_applies_to_each_ranks_part(job):
    # Position 5 (no text: no_input) is rank 0's; rank 1 (positions 6 to 11) has no failure.
    result = job.rank(0, 4, "--max-failures", "0", expect=3)
    assert "1 of 6 samples failed, over the limit" in result.stderr, result.stderr
    job.rank(1, 4, "--max-failures", "0")
    job.rank(1, 4, "--max-failures", "0%")
    status = job.tool("status", str(job.out)).stdout
    assert "rank     0: done" in status and "rank     1: done" in status, status


def test_the_last_two_ranks_finishing_together_merge_once(job, oracle):
    job.rank(0, 4)
    job.rank(1, 4)
    cmds = [[str(job.binary), "run", "--config", str(job.config_path), "--progress-interval",
             "0", "--rank", str(r), "--world-size", "4"] for r in (2, 3)]
    procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=clean_env()) for c in cmds]
    logs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    assert any(f"merged 4 rank(s) into {job.out}" in log for log in logs), logs
    assert_same_output(oracle, job.out)
    status = json.loads(job.tool("status", str(job.out), "--json").stdout)
    assert status["merged"] and status["done"] == status["total"] == SAMPLES
    assert [r["state"] for r in status["ranks"]] == ["done"] * 4
    assert not list(job.out.glob(".tmp-*"))
