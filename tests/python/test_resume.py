"""Resume and crash safety of `precompute run`, tested end to end against an oracle.

The oracle is one clean, uninterrupted run over a small generated dataset. Every test below
models one fault (kill -9 at a random moment or at a whitebox crash point, SIGTERM/SIGINT, disk
full, EIO on fsync, a read-only output, a second writer, changed settings or input, damaged
shards or index, a decoder that crashes or hangs, a sample that failed and is retried), then
reruns the same command and checks that the output equals the oracle bit for bit: the same ids,
the same stored embedding bytes (per-step rows and timestamps included), the same failure
records, every input id exactly once and no leftovers in the folder.

What each test proves: docs/reliability.md. The random kill test logs its seed; set
PRECOMPUTE_KILL_SEED to replay a run.
"""

import copy
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import h5py
import numpy as np
import pytest

from conftest import MODALITIES, colour_clip, shard_path, sine_file, write_manifest

SHARD_SIZE = 3
RANDOM_KILLS = 20
COLOURS = ["red", "blue", "lime", "yellow", "white", "black", "cyan", "magenta", "orange",
           "purple", "gray", "pink"]
# Environment variables that inject faults; never inherited by a run unless a test sets them.
FAULT_VARIABLES = ("PRECOMPUTE_CRASH_AT", "PRECOMPUTE_TEST_DECODER_FAULT")
CRASH_POINTS = ["shard-mid-write", "shard-before-fsync", "shard-before-rename",
                "shard-before-folder-fsync", "index-mid-write", "index-before-fsync",
                "index-before-rename", "index-before-folder-fsync", "before-index", "after-index"]
# Later occurrences: index.json is written once at the start, then after every shard commit.
CRASH_POINTS_LATER = ["shard-mid-write@6", "shard-before-folder-fsync@4", "index-before-rename@4",
                      "after-index@6"]


# --------------------------------------------------------------------------------------------
# The dataset and the oracle


@dataclass
class Dataset:
    root: Path
    manifest: Path
    entries: List[dict]          # manifest lines, with absolute paths
    config: dict
    config_path: Path

    @property
    def ids(self) -> List[str]:
        return [e["id"] for e in self.entries]

    def variant(self, folder: Path, name: str, change) -> Path:
        """Writes a copy of the config changed by `change(config)`; returns its path."""
        config = copy.deepcopy(self.config)
        change(config)
        path = folder / f"{name}.yaml"
        path.write_text(json.dumps(config, indent=1))
        return path


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, probes, minilm_folder) -> Dataset:
    """24 samples over 8 shards of 3: clips with per-frame video and per-window audio, captions,
    and four samples that fail in different ways (a missing file, a missing file and nothing
    else, a clip without an audio track) or have text only."""
    root = tmp_path_factory.mktemp("resume-data")
    entries = []
    for i in range(24):
        sample = {"id": f"c{i:02d}", "video": str(root / f"v{i:02d}.mp4"),
                  "audio": str(root / f"a{i:02d}.wav"), "text": f"caption {i}: a clip of colours"}
        if i == 4:        # no audio key: audio comes from the clip, which has none (no_stream)
            del sample["audio"]
        if i == 7:        # the video file is missing; audio and text are embedded
            sample = {"id": "gone", "video": str(root / "no-such-clip.mp4"),
                      "audio": str(root / "a07.wav"), "text": "a clip whose file is missing"}
        if i == 13:       # text only
            sample = {"id": "words", "text": "a caption without any media"}
        if i == 20:       # nothing can be embedded: in /failures only
            sample = {"id": "lost", "video": str(root / "no-such-clip-either.mp4")}
        if i in (10, 17):  # no caption
            del sample["text"]
        entries.append(sample)
    for i, sample in enumerate(entries):
        if sample.get("video", "").endswith(f"v{i:02d}.mp4"):
            colour_clip(Path(sample["video"]), [COLOURS[i % 12], COLOURS[(i + 5) % 12],
                                                COLOURS[(i + 7) % 12]], size="128x96")
        if sample.get("audio", "").endswith(f"a{i:02d}.wav"):
            sine_file(Path(sample["audio"]), 220 + 37 * i, 3.0)
    manifest = write_manifest(root / "manifest.jsonl", entries)
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(root / "oracle"), "shard_size": SHARD_SIZE},
        "run": {"decode_threads": 2},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")}, "sampling": {"fps": 4},
                  "size": 32, "pooling": "none", "batch_size": 4},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "sample_rate": 16000,
                  "window_s": 0.5, "pooling": "none", "batch_size": 4},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}, "batch_size": 4},
    }
    config_path = root / "config.yaml"
    config_path.write_text(json.dumps(config, indent=1))
    return Dataset(root, manifest, entries, config, config_path)


def fault_free_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FAULT_VARIABLES}
    env.update(extra or {})
    return env


class Job:
    """A run started in its own session (so that its whole process group can be killed)."""

    def __init__(self, cmd: List[str], log: Path, env: Dict[str, str]):
        self.log = log
        self._log_file = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=self._log_file, env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text()

    def wait(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        self._log_file.close()
        return code

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self._log_file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.kill_group()
        self._log_file.close()


class Precompute:
    """`precompute run` on the dataset's config, always with an explicit --output (the output
    path in the command line is also how stray processes of a killed run are found)."""

    def __init__(self, binary: Path, config_path: Path):
        self.binary = binary
        self.config_path = config_path
        self._logs = 0

    def command(self, out: Path, *flags: str, config: Optional[Path] = None,
                progress: str = "0") -> List[str]:
        return [str(self.binary), "run", "--config", str(config or self.config_path),
                "--output", str(out), "--progress-interval", progress, *flags]

    def run(self, out: Path, *flags: str, expect: Optional[int] = 0,
            env: Optional[Dict[str, str]] = None, config: Optional[Path] = None,
            progress: str = "0", prefix: Sequence[str] = (), timeout: float = 300):
        cmd = [*prefix, *self.command(out, *flags, config=config, progress=progress)]
        started = time.monotonic()
        result = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=fault_free_env(env),
                                timeout=timeout)
        result.seconds = time.monotonic() - started
        if expect is not None:
            assert result.returncode == expect, (
                f"{' '.join(cmd)}\nexit {result.returncode}, expected {expect}\n"
                f"{result.stderr[-4000:]}")
        return result

    def start(self, out: Path, *flags: str, env: Optional[Dict[str, str]] = None,
              config: Optional[Path] = None) -> Job:
        self._logs += 1
        log = out.parent / f"{out.name}.run{self._logs}.log"
        return Job(self.command(out, *flags, config=config), log, fault_free_env(env))


@pytest.fixture()
def precompute(binary, dataset) -> Precompute:
    return Precompute(binary, dataset.config_path)


# --------------------------------------------------------------------------------------------
# Reading and comparing outputs


def exact(array: np.ndarray) -> Tuple[str, tuple, bytes]:
    """An array as its exact bits: two of these are equal only if the stored bytes are."""
    array = np.ascontiguousarray(array)
    return array.dtype.str, array.shape, array.tobytes()


@dataclass
class Snapshot:
    """Everything a trainer reads from an output folder, as comparable plain values."""
    index: dict
    samples: Dict[str, dict] = field(default_factory=dict)  # id -> {"seq", modality: {...}}
    shard_ids: List[str] = field(default_factory=list)       # every /ids row, in shard order
    failures: List[tuple] = field(default_factory=list)      # (seq, id, modality, category, msg)
    schema: Dict[str, dict] = field(default_factory=dict)    # modality group attributes
    problems: List[str] = field(default_factory=list)        # shards whose contents disagree

    @property
    def layout(self) -> List[tuple]:
        # A shard's name ends in its hash, which the output path in its recorded config changes.
        return [(e["file"].rsplit("-", 1)[0], e["shard_index"], e["first_seq"], e["seq_count"], e["num_samples"],
                 e["num_failures"], tuple(sorted(e["modality_counts"].items())))
                for e in self.index["shards"]]

    def failure_kinds(self) -> List[tuple]:
        return [(f[1], f[2], f[3]) for f in self.failures]


def snapshot(out: Path) -> Snapshot:
    snap = Snapshot(index=json.loads((out / "index.json").read_text()))
    for entry in snap.index["shards"]:
        with h5py.File(out / entry["file"], "r") as f:
            for key in ("shard_index", "first_seq", "seq_count"):
                if int(f.attrs[key]) != entry[key]:
                    snap.problems.append(f"{entry['file']}: attribute {key} {f.attrs[key]}, "
                                         f"index.json says {entry[key]}")
            ids = list(f["ids"].asstr()[:])
            seqs = [int(s) for s in f["seq"][:]]
            snap.shard_ids += ids
            groups = {}
            for m in MODALITIES:
                if m not in f:
                    continue
                g = f[m]
                snap.schema[m] = {k: (v if isinstance(v, str) else np.asarray(v).tolist())
                                  for k, v in g.attrs.items()}
                groups[m] = {name: g[name][:] for name in g.keys()}
                groups[m]["layout"] = g.attrs["layout"]
            for i, sample_id in enumerate(ids):
                record = {"seq": seqs[i]}
                for m, g in groups.items():
                    item = {"present": int(g["present"][i]), "num_steps": int(g["num_steps"][i])}
                    if "truncated" in g:
                        item["truncated"] = int(g["truncated"][i])
                    if g["layout"] == "pooled":
                        item["embedding"] = exact(g["embeddings"][i])
                    else:
                        lo, hi = int(g["offsets"][i]), int(g["offsets"][i + 1])
                        item["values"] = exact(g["values"][lo:hi])
                        if "timestamps" in g:
                            item["timestamps"] = exact(g["timestamps"][lo:hi])
                    record[m] = item
                snap.samples.setdefault(sample_id, record)
            if "failures" in f:
                g = f["failures"]
                columns = [g["seq"][:], g["id"].asstr()[:], g["modality"].asstr()[:],
                           g["category"].asstr()[:], g["message"].asstr()[:]]
                for seq, sample_id, modality, category, message in zip(*columns):
                    snap.failures.append((int(seq), sample_id, modality, category, message))
    snap.failures.sort(key=lambda r: (r[0], MODALITIES.index(r[2])))
    return snap


def assert_well_formed(snap: Snapshot, input_ids: List[str]) -> None:
    """Every input id exactly once (embedded, or only in /failures), at its input position; the
    shards tile the input without gaps or overlaps."""
    assert not snap.problems, snap.problems
    duplicates = sorted({i for i in snap.shard_ids if snap.shard_ids.count(i) > 1})
    assert not duplicates, f"ids stored more than once: {duplicates}"
    failed_only = {f[1] for f in snap.failures} - set(snap.shard_ids)
    assert sorted(set(snap.shard_ids) | failed_only) == sorted(input_ids)
    position = {sample_id: seq for seq, sample_id in enumerate(input_ids)}
    wrong = {i: r["seq"] for i, r in snap.samples.items() if r["seq"] != position[i]}
    assert not wrong, f"ids stored at the wrong input position: {wrong}"
    assert all(position[f[1]] == f[0] for f in snap.failures), snap.failures
    covered = 0
    for entry in sorted(snap.index["shards"], key=lambda e: e["first_seq"]):
        assert entry["first_seq"] == covered, f"gap or overlap at {entry}"
        covered += entry["seq_count"]
    assert covered == len(input_ids) == snap.index["total_samples"]


def assert_same_output(out: Path, expected: Snapshot, input_ids: List[str],
                       same_layout: bool = True) -> Snapshot:
    """`out` holds what the oracle holds: same ids at the same positions, the same embedding
    bits, the same failure records (messages included) and, unless the input grew between
    runs, the same shards."""
    actual = snapshot(out)
    assert_well_formed(actual, input_ids)
    assert sorted(actual.samples) == sorted(expected.samples)
    differing = [i for i in expected.samples if actual.samples[i] != expected.samples[i]]
    assert not differing, f"stored values differ from the oracle's for ids {differing}"
    assert actual.failures == expected.failures
    assert actual.schema == expected.schema
    if same_layout:
        assert actual.layout == expected.layout
    return actual


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_committed_intact(out: Path) -> int:
    """Every shard index.json lists has the recorded size and sha256 (a kill without power loss
    must never damage a committed shard). Returns how many shards are committed."""
    if not (out / "index.json").exists():
        return 0
    index = json.loads((out / "index.json").read_text())
    for entry in index["shards"]:
        shard = out / entry["file"]
        assert shard.exists(), f"committed {shard} is gone"
        assert shard.stat().st_size == entry["bytes"], f"committed {shard} changed size"
        assert sha256_of(shard) == entry["sha256"], f"committed {shard} changed"
    return len(index["shards"])


def leftovers(out: Path) -> Tuple[List[str], List[str]]:
    """(temporary files, shard files index.json does not list)."""
    names = sorted(os.listdir(out))
    listed = set()
    if (out / "index.json").exists():
        listed = {e["file"] for e in json.loads((out / "index.json").read_text())["shards"]}
    temps = [n for n in names if n.startswith(".tmp-")]
    unlisted = [n for n in names if n.startswith("shard-") and n.endswith(".h5")
                and n not in listed]
    return temps, unlisted


def assert_no_leftovers(out: Path) -> None:
    temps, unlisted = leftovers(out)
    assert not temps, f"temporary files left in {out}: {temps}"
    assert not unlisted, f"shard files index.json does not list in {out}: {unlisted}"
    assert_committed_intact(out)


def folder_state(out: Path) -> Dict[str, str]:
    """sha256 of index.json and of every shard file: to prove that a refused run changed nothing
    that was committed."""
    return {p.name: sha256_of(p) for p in sorted(out.iterdir())
            if p.name == "index.json" or p.name.startswith("shard-")}


def committed_shards(out: Path) -> int:
    try:
        return len(json.loads((out / "index.json").read_text())["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


# --------------------------------------------------------------------------------------------
# Processes


def wait_until_gone(marker: str, timeout: float = 30) -> None:
    """Waits until no live process has `marker` as an argument. Killing a supervised run's
    process group kills the supervisor; its child (in a group of its own) dies by
    PR_SET_PDEATHSIG a moment later and holds the output lock until then."""
    deadline = time.monotonic() + timeout
    needle = marker.encode() + b"\0"  # a whole argument
    while True:
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if needle in cmdline and state != "Z":
                alive.append(int(entry.name))
        if not alive:
            return
        assert time.monotonic() < deadline, f"processes {alive} of a killed run live on"
        time.sleep(0.02)


def lock_holder(out: Path) -> Optional[int]:
    """The pid holding the flock on OUT/.precompute.lock, from /proc/locks (reading it does not
    touch the lock, so it cannot disturb the run)."""
    try:
        st = os.stat(out / ".precompute.lock")
    except FileNotFoundError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if "->" not in parts and len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == device:
            return int(parts[4])
    return None


def poll(condition, timeout: float, what: str, job: Optional[Job] = None):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if job is not None and job.proc.poll() is not None:
            pytest.fail(f"the run ended (exit {job.proc.returncode}) before {what}\n"
                        f"{job.stderr()[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def partial_run(precompute: Precompute, out: Path, at: str = "shard-before-rename@4") -> None:
    """An interrupted run: killed (SIGKILL, in-process) while writing its 4th shard, so that
    some shards are committed and some are not."""
    r = precompute.run(out, "--no-supervisor", expect=None, env={"PRECOMPUTE_CRASH_AT": at})
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    assert 0 < committed_shards(out) < 8


@dataclass
class Oracle:
    out: Path
    snap: Snapshot
    seconds: float        # the whole run
    work_seconds: float   # from taking the output lock to the end


@pytest.fixture(scope="module")
def oracle(binary, dataset) -> Oracle:
    """The clean, uninterrupted run every other output is compared with."""
    out = dataset.root / "oracle"
    started = time.monotonic()
    with Precompute(binary, dataset.config_path).start(out) as job:
        poll(lambda: lock_holder(out), 120, "the oracle run to take the lock", job)
        locked = time.monotonic()
        assert job.wait() == 0, job.stderr()[-3000:]
    ended = time.monotonic()
    return Oracle(out, snapshot(out), ended - started, ended - locked)


# --------------------------------------------------------------------------------------------
# 1. The oracle


def test_oracle_is_complete_and_a_clean_rerun_reproduces_it(precompute, oracle, dataset,
                                                            tmp_path):
    """The comparison is only meaningful if a clean run is reproducible bit for bit and the
    oracle holds what the dataset implies."""
    assert_well_formed(oracle.snap, dataset.ids)
    assert oracle.snap.layout == [
        (f"shard-{k:06d}", k, k * SHARD_SIZE, SHARD_SIZE, e[4], e[5], e[6])
        for k, e in enumerate(oracle.snap.layout)]
    assert len(oracle.snap.layout) == 8
    assert oracle.snap.failure_kinds() == [
        ("c04", "audio", "no_stream"), ("gone", "video", "missing"),
        ("lost", "video", "missing"), ("lost", "audio", "missing")]
    assert "lost" not in oracle.snap.samples
    assert set(oracle.snap.samples["words"]) == {"seq", "video", "audio", "text"}
    assert oracle.snap.samples["words"]["video"]["present"] == 0
    assert oracle.snap.samples["c03"]["video"]["num_steps"] == 12  # 3 s at 4 fps
    assert oracle.snap.samples["c03"]["audio"]["num_steps"] == 6   # 3 s in 0.5 s windows

    precompute.run(tmp_path / "again")
    assert_same_output(tmp_path / "again", oracle.snap, dataset.ids)
    assert_no_leftovers(tmp_path / "again")


# --------------------------------------------------------------------------------------------
# 2. kill -9


def test_sigkill_at_random_moments_then_resume_equals_oracle(precompute, oracle, dataset,
                                                             tmp_path):
    """A scheduler's kill -9 of the whole job (supervisor and child) at random moments, again and
    again on the same folder (a new folder once everything is committed): after every kill the
    committed shards are intact, and rerunning the same command until it finishes gives the
    oracle's output."""
    seed = int(os.environ.get("PRECOMPUTE_KILL_SEED", random.SystemRandom().randrange(2**32)))
    print(f"random kill test: seed {seed} (replay with PRECOMPUTE_KILL_SEED={seed})")
    rng = random.Random(seed)
    history: List[str] = []
    kills, attempts, sequence = 0, 0, 0
    out: Optional[Path] = None

    def finish_and_check(job_exit: int, where: Path) -> None:
        try:
            assert job_exit == 0, f"exit {job_exit}"
            assert_same_output(where, oracle.snap, dataset.ids)
            assert_no_leftovers(where)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, history {history}: {e}") from e

    while kills < RANDOM_KILLS:
        attempts += 1
        assert attempts < 10 * RANDOM_KILLS, f"seed {seed}: too many runs finished unkilled"
        if out is None:
            sequence += 1
            out = tmp_path / f"out{sequence}"
        # Half of the kills anywhere in a run's life, as asked; half while it holds the lock and
        # works, since start-up (loading LibTorch) takes most of such a small run.
        working = rng.random() < 0.5
        delay = rng.uniform(0, oracle.work_seconds if working else oracle.seconds)
        moment = f"{delay:.2f} s after {'taking the lock' if working else 'the start'}"
        with precompute.start(out) as job:
            if working:
                poll(lambda: lock_holder(out) or job.proc.poll() is not None, 120,
                     "the run to take the lock")
            try:
                code = job.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                job.kill_group()
                code = job.proc.returncode
        if code == 0:  # it finished before the kill: this sequence is done
            history.append(f"{out.name}: finished before {moment}")
            finish_and_check(code, out)
            out = None
            continue
        wait_until_gone(str(out))
        kills += 1
        try:
            assert code == -signal.SIGKILL, f"exit {code}\n{job.stderr()[-3000:]}"
            committed = assert_committed_intact(out)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, history {history}: {e}") from e
        history.append(f"{out.name}: killed {moment} with {committed} shards committed")
        if committed == len(oracle.snap.layout):
            # Everything is committed: later kills would only hit an idle rerun. Finish this
            # folder and start a new one.
            r = precompute.run(out, expect=None)
            history.append(f"{out.name}: run to completion")
            finish_and_check(r.returncode, out)
            out = None
    if out is not None:
        r = precompute.run(out, expect=None)
        history.append(f"{out.name}: run to completion")
        finish_and_check(r.returncode, out)
    print("\n".join(history))


@pytest.mark.parametrize("point", CRASH_POINTS + CRASH_POINTS_LATER)
def test_crash_point_then_resume_equals_oracle(precompute, oracle, dataset, tmp_path, point):
    """kill -9 at a precise step of the commit protocol (PRECOMPUTE_CRASH_AT, in-process run):
    the process dies with SIGKILL, leaving what that step leaves (a torn temporary file, a
    renamed but unrecorded shard, ...); the rerun cleans it up and equals the oracle."""
    out = tmp_path / "out"
    r = precompute.run(out, "--no-supervisor", expect=None, env={"PRECOMPUTE_CRASH_AT": point})
    assert r.returncode == -signal.SIGKILL, f"crash point {point} not reached\n{r.stderr[-3000:]}"
    assert_committed_intact(out)
    temps, unlisted = leftovers(out)
    step = point.split("@")[0]
    if step.endswith(("mid-write", "before-fsync", "before-rename")):
        assert temps, f"{point}: expected a temporary file, found {os.listdir(out)}"
    if step == "shard-before-folder-fsync":
        assert unlisted, f"{point}: expected a renamed, unrecorded shard"
    if step.startswith("index-") and not point.endswith("@4"):
        # The first index write (before any shard) was interrupted: nothing is committed.
        assert committed_shards(out) == 0

    r = precompute.run(out, "--no-supervisor")
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)
    if temps:
        assert "temporary file(s) left by an interrupted run" in r.stderr
    if unlisted:
        assert "written but not recorded" in r.stderr


# --------------------------------------------------------------------------------------------
# 3. SIGTERM and SIGINT


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGHUP],
                                     [signal.SIGTERM, signal.SIGTERM]],
                         ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGTERM-twice"])
def test_stop_signal_then_resume_equals_oracle(precompute, oracle, dataset, tmp_path, signals):
    """A scheduler's (or Ctrl-C's) stop request sent to the supervisor once a shard is
    committed: it is forwarded to the child, which commits its complete shards and exits 128 +
    signal asking for a rerun; a second signal exits at once. The rerun equals the oracle.
    Batch size 1 and one decode thread keep few samples in flight, so the stop leaves work."""
    out = tmp_path / "out"
    flags = ("--batch-size", "1", "--decode-threads", "1")
    with precompute.start(out, *flags) as job:
        poll(lambda: committed_shards(out) >= 1, 120, "the first shard commit", job)
        for i, sig in enumerate(signals):
            if i:
                time.sleep(0.05)
            os.kill(job.pid, sig)
        code = job.wait(timeout=120)
        stderr = job.stderr()
    wait_until_gone(str(out))
    assert code == 128 + signals[0], stderr[-3000:]
    if len(signals) == 1:
        assert "rerun the same command to resume" in stderr, stderr[-3000:]
    committed = assert_committed_intact(out)
    assert committed < 8, "the run was not stopped before its end; the test proves nothing"

    r = precompute.run(out, *flags)
    assert "resuming" in r.stderr
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


@pytest.fixture(scope="module")
def slow_decodes(tmp_path_factory, probes) -> Path:
    """A config whose samples take long to decode: one short clip, then 16 lines naming a 40-s
    360p clip at 60 frames/s decoded in full (seek: false), on one decode thread, one sample per
    shard. A stop after the first commit finds about ten seconds of decoding admitted into the
    pipeline."""
    root = tmp_path_factory.mktemp("slow-decodes")
    colour_clip(root / "short.mp4", ["red"])
    long_clip = root / "long.mp4"
    subprocess.run(["ffmpeg", "-nostdin", "-y", "-loglevel", "error", "-f", "lavfi", "-i",
                    "testsrc2=s=640x360:r=60:d=40", "-c:v", "libx264", "-preset", "ultrafast",
                    "-g", "600", "-pix_fmt", "yuv420p", str(long_clip)], check=True)
    entries = [{"id": "short", "video": str(root / "short.mp4")}]
    entries += [{"id": f"long{i:02d}", "video": str(long_clip)} for i in range(16)]
    manifest = write_manifest(root / "manifest.jsonl", entries)
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(root / "unused"), "shard_size": 1},
              "run": {"decode_threads": 1},
              "video": {"encoder": {"path": str(probes / "video_probe.pt")},
                        "sampling": {"fps": 1}, "size": 32, "seek": False}}
    path = root / "config.yaml"
    path.write_text(json.dumps(config, indent=1))
    return path


def test_sigint_stops_within_two_seconds_keeping_the_committed_shards(binary, slow_decodes,
                                                                      tmp_path):
    """Ctrl-C with about ten seconds of decoding admitted into the pipeline: samples still being
    decoded or waiting for a decoder are dropped (their decode is cut short), not finished, so
    the run exits 130 within two seconds; the shards committed before are intact, and the rerun
    does the rest. (Finishing what was admitted took 9.5 s here.)"""
    out = tmp_path / "out"
    runner = Precompute(binary, slow_decodes)
    with runner.start(out) as job:
        poll(lambda: committed_shards(out) >= 1, 120, "the first shard commit", job)
        signalled = time.monotonic()
        os.kill(job.pid, signal.SIGINT)
        code = job.wait(timeout=120)
        took = time.monotonic() - signalled
        stderr = job.stderr()
    assert code == 130, stderr[-3000:]
    print(f"the stop took {took:.2f} s")
    assert took < 2.0, f"the stop took {took:.2f} s\n{stderr[-3000:]}"
    assert "rerun the same command to resume" in stderr
    committed = assert_committed_intact(out)
    assert 1 <= committed < 17, "the run was not stopped before its end; the test proves nothing"
    assert_no_leftovers(out)

    r = runner.run(out)
    assert f"{committed} of 17 samples are in committed shards" in r.stderr, r.stderr[-2000:]
    ids = []
    for entry in json.loads((out / "index.json").read_text())["shards"]:
        with h5py.File(out / entry["file"], "r") as f:
            ids += list(f["ids"].asstr()[:])
    assert sorted(ids) == sorted(["short"] + [f"long{i:02d}" for i in range(16)])


def test_a_second_sigint_exits_at_once_when_a_decoder_holds_the_stop(binary, slow_decodes,
                                                                     tmp_path):
    """A decoder stuck inside one call (here: made to hang) cannot be cut short, so it holds a
    graceful stop; the second Ctrl-C exits 130 at once, and the committed shards are intact."""
    out = tmp_path / "out"
    runner = Precompute(binary, slow_decodes)
    with runner.start(out, env={"PRECOMPUTE_TEST_DECODER_FAULT": "hang:long.mp4"}) as job:
        poll(lambda: committed_shards(out) >= 1, 120, "the first shard commit", job)
        os.kill(job.pid, signal.SIGINT)
        time.sleep(1.0)
        assert job.proc.poll() is None, "the stuck decoder did not hold the first stop"
        signalled = time.monotonic()
        os.kill(job.pid, signal.SIGINT)
        code = job.wait(timeout=120)
        took = time.monotonic() - signalled
        stderr = job.stderr()
    wait_until_gone(str(out))
    assert code == 130, stderr[-3000:]
    assert took < 1.0, f"the second signal took {took:.2f} s to end the run"
    assert assert_committed_intact(out) == 1


def test_child_killed_alone_is_restarted_by_the_supervisor(precompute, oracle, dataset,
                                                           tmp_path):
    """The kernel's OOM killer SIGKILLs the working child (not the supervisor) after a shard is
    committed: the supervisor restarts it without blaming any sample, the restart resumes, and
    the job exits 0 with the oracle's output."""
    out = tmp_path / "out"
    with precompute.start(out, "--batch-size", "1", "--decode-threads", "1") as job:
        poll(lambda: committed_shards(out) >= 1, 120, "the first shard commit", job)
        child = lock_holder(out)
        assert child is not None and child != job.pid
        os.kill(child, signal.SIGKILL)
        code = job.wait(timeout=300)
        stderr = job.stderr()
    assert code == 0, stderr[-3000:]
    assert "the run died (signal 9" in stderr and "0 sample(s) in flight quarantined" in stderr
    assert "resuming" in stderr
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


def test_failure_limit_counts_the_failures_of_committed_shards(precompute, oracle, dataset,
                                                               tmp_path):
    """The oracle has 3 failed samples, so a clean run with --max-failures 2 exits 3. An
    interrupted run resumed with the same limit ends with the same output, so it must exit 3
    too, whether the failures were committed before or after the interruption."""
    failed = {f[1] for f in oracle.snap.failures}
    assert len(failed) == 3
    precompute.run(tmp_path / "clean", "--max-failures", "2", expect=3)

    out = tmp_path / "out"
    partial_run(precompute, out)
    assert {f[1] for f in snapshot(out).failures}, "no failure committed before the kill"
    r = precompute.run(out, "--max-failures", "2", expect=None)
    assert_same_output(out, oracle.snap, dataset.ids)
    assert r.returncode == 3, f"exit {r.returncode}\n{r.stderr[-2000:]}"


# --------------------------------------------------------------------------------------------
# 4. Disk full and I/O errors


def require_root_mounts():
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a file system")


def sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_disk_full_exits_74_and_resumes_once_space_is_freed(precompute, oracle, dataset,
                                                           tmp_path):
    """The output file system fills up mid-run (a tmpfs half the size of the oracle's output):
    exit 74 naming the file and 'disk full', no temporary file left, committed shards intact;
    after the file system grows, the same command finishes and equals the oracle."""
    require_root_mounts()
    disk = tmp_path / "disk"
    disk.mkdir()
    size = sum(e["bytes"] for e in oracle.snap.index["shards"]) // 2
    mounted = sh("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        out = disk / "out"
        r = precompute.run(out, expect=74)
        assert "disk full (No space left on device)" in r.stderr, r.stderr[-3000:]
        assert str(out) in r.stderr
        temps, _ = leftovers(out)
        assert not temps, f"temporary files left after the failed write: {temps}"
        assert 0 < assert_committed_intact(out) < 8
        inspected = subprocess.run([str(precompute.binary), "inspect", str(out), "--json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert inspected.returncode == 0, inspected.stdout + inspected.stderr
        report = json.loads(inspected.stdout)
        assert report["ok"] and not report["complete"]

        grown = sh("mount", "-o", "remount,size=8m", str(disk))
        assert grown.returncode == 0, grown.stderr
        precompute.run(out)
        assert_same_output(out, oracle.snap, dataset.ids)
        assert_no_leftovers(out)
    finally:
        if sh("umount", str(disk)).returncode != 0:
            sh("umount", "-l", str(disk))


def test_disk_full_at_start_is_reported_not_a_crash(precompute, tmp_path):
    """The output file system has room for the lock file and the first index.json but not one
    page more: the run must fail with a disk-full error (73 or 74) naming the folder, not die of
    a signal. (Run in-process: the supervisor would take the crash for a decoder's.)"""
    require_root_mounts()
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "out"
    page = os.sysconf("SC_PAGE_SIZE")
    if sh("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)).returncode != 0:
        pytest.skip("cannot mount a tmpfs")
    try:
        # How big the first index.json is at this very path (it records the output path).
        precompute.run(out, "--no-supervisor", expect=-signal.SIGKILL,
                       env={"PRECOMPUTE_CRASH_AT": "after-index"})
        index_pages = -(-(out / "index.json").stat().st_size // page)
    finally:
        sh("umount", str(disk))
    # One page for the lock file, then the index: nothing is left after the first index write.
    assert sh("mount", "-t", "tmpfs", "-o", f"size={page * (1 + index_pages)}", "tmpfs",
              str(disk)).returncode == 0
    try:
        r = precompute.run(out, "--no-supervisor", expect=None)
        assert r.returncode in (73, 74), f"exit {r.returncode}\n{r.stderr[-3000:]}"
        assert "disk full (No space left on device)" in r.stderr and str(out) in r.stderr
    finally:
        if sh("umount", str(disk)).returncode != 0:
            sh("umount", "-l", str(disk))


@pytest.mark.parametrize("nth_fsync", [3, 9])
def test_fsync_eio_exits_74_and_resume_equals_oracle(precompute, oracle, dataset, tmp_path,
                                                     nth_fsync):
    """The N-th fsync of the run fails with EIO (strace fault injection; the 3rd is the first
    index.json's, later ones hit shards): exit 74 naming the file and the error, nothing
    retried on the same descriptor, no temporary file left; the rerun equals the oracle."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    out = tmp_path / "out"
    prefix = ["strace", "-f", "-qq", "-o", "/dev/null", "-e",
              f"inject=fsync:error=EIO:when={nth_fsync}"]
    r = precompute.run(out, expect=None, prefix=prefix)
    if r.returncode != 74 and "ptrace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[-300:]}")
    assert r.returncode == 74, r.stderr[-3000:]
    assert "Input/output error" in r.stderr and str(out) in r.stderr, r.stderr[-3000:]
    temps, _ = leftovers(out)
    assert not temps
    assert_committed_intact(out)

    precompute.run(out)
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


# --------------------------------------------------------------------------------------------
# 5. Output that cannot be written


def assert_refused_before_decoding(r, seconds_limit: float = 30) -> None:
    assert r.seconds < seconds_limit, f"took {r.seconds:.1f} s to refuse"
    assert "loaded and warmed up" not in r.stderr, "encoders were loaded before the refusal"
    assert "progress:" not in r.stderr, "samples were processed before the refusal"


def test_read_only_output_exits_73_before_decoding(precompute, tmp_path):
    """The output is on a read-only file system (a read-only bind mount; chmod would not stop
    root): both a new folder there and an existing one are refused with 73 in seconds, before
    any encoder loads or sample is decoded."""
    require_root_mounts()
    ro = tmp_path / "ro"
    (ro / "existing").mkdir(parents=True)
    if sh("mount", "--bind", str(ro), str(ro)).returncode != 0:
        pytest.skip("cannot make a bind mount")
    try:
        remounted = sh("mount", "-o", "remount,bind,ro", str(ro))
        if remounted.returncode != 0:
            pytest.skip(f"cannot remount read-only: {remounted.stderr.strip()}")
        for out in (ro / "new", ro / "existing"):
            r = precompute.run(out, expect=73, progress="0.05")
            assert str(out) in r.stderr and "Read-only file system" in r.stderr, r.stderr
            assert_refused_before_decoding(r)
    finally:
        if sh("umount", str(ro)).returncode != 0:
            sh("umount", "-l", str(ro))


def test_output_under_a_regular_file_exits_73_before_decoding(precompute, tmp_path):
    """The output's parent path is a regular file: refused with 73, naming it, before decoding."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    r = precompute.run(blocker / "out", expect=73, progress="0.05")
    assert str(blocker) in r.stderr
    assert_refused_before_decoding(r)


# --------------------------------------------------------------------------------------------
# 6. Two writers


def test_second_writer_is_refused_while_the_first_runs(precompute, oracle, dataset, tmp_path):
    """Run B starts on the folder run A is writing (A is frozen with SIGSTOP right after it
    takes the lock, so that it is surely still running): B exits 69 naming the pid of A's
    supervisor (the process to signal to stop A; its child holds the flock, and killing the
    child would only restart it) and touches nothing, with --overwrite too; A, continued,
    finishes with the oracle's output."""
    out = tmp_path / "out"
    with precompute.start(out) as a:
        holder = poll(lambda: lock_holder(out), 120, "run A to take the lock", a)
        os.kill(holder, signal.SIGSTOP)
        try:
            pid_in_file = (out / ".precompute.lock").read_text().strip()
            assert holder != a.pid and pid_in_file == str(a.pid)
            before = folder_state(out)
            for flags in ((), ("--overwrite",)):
                r = precompute.run(out, *flags, expect=69)
                assert f"is in use by another precompute run (pid {a.pid})" in r.stderr, r.stderr
                assert folder_state(out) == before, f"run B {flags} changed the folder"
        finally:
            os.kill(holder, signal.SIGCONT)
        assert a.wait(timeout=300) == 0, a.stderr()[-3000:]
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


# --------------------------------------------------------------------------------------------
# 7. Settings and input that change between runs


def test_changed_settings_are_refused_listing_what_changed(precompute, oracle, dataset,
                                                           tmp_path, probes):
    """A rerun with settings that change stored values (sampling fps, frame size, autorotation,
    storage dtype, another encoder file) on an interrupted run exits 2 listing what changed, and
    leaves every committed file as it was; batch size and thread counts may change, and the
    finished output still equals the oracle."""
    out = tmp_path / "out"
    partial_run(precompute, out)
    state = folder_state(out)

    other_encoder = tmp_path / "other_video.pt"
    shutil.copy(probes / "failing_probe.pt", other_encoder)  # same interface, other weights
    changes = {
        "fps": (lambda c: c["video"].update(sampling={"fps": 2}), "video.fps"),
        "size": (lambda c: c["video"].update(size=48), "video.size"),
        "autorotate": (lambda c: c["video"].update(autorotate=False), "video.autorotate"),
        "dtype": (lambda c: c["output"].update(dtype="float32"), "output.dtype"),
        "encoder": (lambda c: c["video"]["encoder"].update(path=str(other_encoder)),
                    "video encoder other_video.pt"),
    }
    for name, (change, named) in changes.items():
        r = precompute.run(out, expect=2, config=dataset.variant(tmp_path, name, change))
        assert "holds a run made with other settings; what changed:" in r.stderr, r.stderr
        assert named in r.stderr, f"{name}: {r.stderr[-2000:]}"
        assert folder_state(out) == state, f"the refused {name} change modified the folder"

    r = precompute.run(out, "--batch-size", "1", "--decode-threads", "1", "--torch-threads", "1")
    assert "resuming" in r.stderr
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


def test_shard_size_may_change_on_resume(precompute, oracle, dataset, tmp_path):
    """An interrupted run resumed with another --shard-size: the committed shards are kept, the
    rest is cut into shards of the new size with unique numbers, and every sample is stored once
    with the oracle's values."""
    out = tmp_path / "out"
    partial_run(precompute, out)
    kept = folder_state(out)
    r = precompute.run(out, "--shard-size", "5")
    assert "resuming" in r.stderr
    snap = assert_same_output(out, oracle.snap, dataset.ids, same_layout=False)
    assert all(folder_state(out)[name] == digest for name, digest in kept.items()
               if name != "index.json"), "a committed shard was rewritten"
    assert len({e["shard_index"] for e in snap.index["shards"]}) == len(snap.index["shards"])
    assert max(e["seq_count"] for e in snap.index["shards"]) == 5
    assert_no_leftovers(out)


def test_a_resume_with_nothing_to_do_leaves_every_file_as_it_was(precompute, oracle, dataset,
                                                                 tmp_path):
    """A rerun of a finished output with other throughput settings (batch size, decode threads,
    shard size: all free to change on resume) processes no sample, so it writes nothing: index
    .json, with the config it records, and dataset.h5 stay byte for byte as they were. A view
    deleted meanwhile is made again, from the index as it was."""
    out = tmp_path / "out"
    precompute.run(out)
    files = ["index.json", "dataset.h5"] + [e["file"] for e in
                                            json.loads((out / "index.json").read_text())["shards"]]
    before = {name: (out / name).read_bytes() for name in files}
    r = precompute.run(out, "--batch-size", "7", "--decode-threads", "1", "--shard-size", "5")
    assert "0 to process" in r.stderr, r.stderr[-2000:]
    for name in files:
        assert (out / name).read_bytes() == before[name], f"{name} was rewritten"
    recorded = json.loads(before["index.json"])["config"]
    assert recorded["video"]["batch_size"] == 4 and recorded["output"]["shard_size"] == SHARD_SIZE

    (out / "dataset.h5").unlink()
    r = precompute.run(out, "--batch-size", "2")
    assert "0 to process" in r.stderr, r.stderr[-2000:]
    assert (out / "dataset.h5").read_bytes() == before["dataset.h5"]
    assert (out / "index.json").read_bytes() == before["index.json"]
    assert_same_output(out, oracle.snap, dataset.ids)


def test_appended_manifest_processes_only_the_new_samples(precompute, oracle, dataset, tmp_path):
    """Samples appended to the manifest between runs: the rerun keeps every committed shard
    (the old last one is short), embeds only the new samples, and holds what a clean run over
    the longer manifest holds."""
    short = write_manifest(tmp_path / "short.jsonl", dataset.entries[:16])
    out = tmp_path / "out"
    precompute.run(out, "--input", str(short))
    before = folder_state(out)

    r = precompute.run(out, "--input", str(dataset.manifest))
    assert "grew from 16 to 24 samples" in r.stderr, r.stderr[-2000:]
    assert "16 of 24 samples are in committed shards; 8 to process" in r.stderr
    assert all(folder_state(out).get(name) == digest
               for name, digest in before.items() if name != "index.json")
    assert_same_output(out, oracle.snap, dataset.ids, same_layout=False)
    assert_no_leftovers(out)


def test_edited_or_shortened_manifest_is_refused(precompute, oracle, dataset, tmp_path):
    """A manifest whose earlier lines changed (a caption edited, lines swapped) or that lost
    lines cannot resume the run made over it: exit 2, folder untouched."""
    out = tmp_path / "out"
    shutil.copytree(oracle.out, out)
    state = folder_state(out)
    edited = copy.deepcopy(dataset.entries)
    edited[2]["text"] = "an edited caption"
    swapped = copy.deepcopy(dataset.entries)
    swapped[5], swapped[6] = swapped[6], swapped[5]
    for name, entries, message in [("edited", edited, "the input changed"),
                                   ("swapped", swapped, "the input changed"),
                                   ("shortened", dataset.entries[:-1],
                                    "samples may only be appended")]:
        manifest = write_manifest(tmp_path / f"{name}.jsonl", entries)
        r = precompute.run(out, "--input", str(manifest), expect=2)
        assert message in r.stderr, f"{name}: {r.stderr[-2000:]}"
        assert folder_state(out) == state


# --------------------------------------------------------------------------------------------
# 8. Damaged shards and index


def test_damaged_committed_shards_are_detected_and_redone(precompute, oracle, dataset,
                                                          tmp_path):
    """Committed shards damaged after the run (bytes flipped mid-file, a truncated file, a
    deleted file): `inspect` reports the tree damaged (74); the rerun names each one, redoes
    exactly their samples and equals the oracle."""
    out = tmp_path / "out"
    shutil.copytree(oracle.out, out)
    flipped = shard_path(out, 1)
    data = bytearray(flipped.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    flipped.write_bytes(bytes(data))
    truncated = shard_path(out, 3)
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    deleted = shard_path(out, 5)
    deleted.unlink()

    inspected = subprocess.run([str(precompute.binary), "inspect", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert inspected.returncode == 74, inspected.stdout + inspected.stderr
    assert inspected.stdout.count("DAMAGED") == 3, inspected.stdout

    r = precompute.run(out)
    for shard in (flipped, truncated, deleted):
        assert f"committed shard {shard} is damaged" in r.stderr, r.stderr[-3000:]
    assert f"{24 - 3 * SHARD_SIZE} of 24 samples are in committed shards" in r.stderr
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


def truncate_index(index_file: Path) -> None:
    text = index_file.read_text()
    index_file.write_text(text[: len(text) // 2])


def alter_a_shard_record(index_file: Path) -> None:
    """One number in a shard's record changed (the totals still add up): only the checksum
    over the records can tell."""
    index = json.loads(index_file.read_text())
    index["shards"][0]["modality_counts"]["text"] -= 1
    index_file.write_text(json.dumps(index, indent=2))


@pytest.mark.parametrize("damage", [truncate_index, alter_a_shard_record],
                         ids=["truncated", "record-changed"])
def test_damaged_index_is_rebuilt_from_the_shards(precompute, oracle, dataset, tmp_path,
                                                  damage):
    """index.json of an interrupted run is damaged (torn, or a record altered): the rerun warns,
    rebuilds it from the ids stored in the shards, finishes, and equals the oracle."""
    out = tmp_path / "out"
    partial_run(precompute, out)
    committed = committed_shards(out)
    damage(out / "index.json")
    r = precompute.run(out)
    assert "is damaged" in r.stderr and "rebuilding it from the" in r.stderr, r.stderr[-3000:]
    assert f"{committed * SHARD_SIZE} of 24 samples are in committed shards" in r.stderr
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


def test_crash_while_rebuilding_the_index_keeps_the_committed_shards(precompute, oracle, dataset,
                                                                     tmp_path):
    """kill -9 while a rerun rebuilds a torn index.json (just before it writes the rebuilt one):
    the shards were intact and are still there, so the next rerun must rebuild the index again
    and keep them, not redo their samples."""
    out = tmp_path / "out"
    partial_run(precompute, out)
    committed = committed_shards(out)
    truncate_index(out / "index.json")
    precompute.run(out, "--no-supervisor", expect=-signal.SIGKILL,
                   env={"PRECOMPUTE_CRASH_AT": "before-index"})
    r = precompute.run(out)
    assert_same_output(out, oracle.snap, dataset.ids)
    assert f"{committed * SHARD_SIZE} of 24 samples are in committed shards" in r.stderr, (
        r.stderr[-3000:])


def test_deleted_index_is_rebuilt_from_the_shards(precompute, oracle, dataset, tmp_path):
    """index.json of an interrupted run is deleted (a run writes it before its first shard, so
    shards without one mean it was deleted): the rerun rebuilds it from the shards' own
    attributes and ids, keeps their samples, and equals the oracle."""
    out = tmp_path / "out"
    partial_run(precompute, out)
    committed = committed_shards(out)
    (out / "index.json").unlink()
    r = precompute.run(out)
    assert "is missing; rebuilding it from the" in r.stderr
    assert f"{committed * SHARD_SIZE} of 24 samples are in committed shards" in r.stderr
    assert_same_output(out, oracle.snap, dataset.ids)
    assert_no_leftovers(out)


# --------------------------------------------------------------------------------------------
# 9. Decoders that crash or hang


def assert_media_failed(out: Path, oracle: Oracle, dataset: Dataset, sample_id: str,
                        category: str) -> None:
    """`out` holds the oracle's output, except that `sample_id`'s video and audio failed with
    `category`: its caption is still embedded, and so is every other sample."""
    snap = snapshot(out)
    assert_well_formed(snap, dataset.ids)
    expected_failures = oracle.snap.failure_kinds() + [(sample_id, "video", category),
                                                       (sample_id, "audio", category)]
    assert sorted(snap.failure_kinds()) == sorted(expected_failures)
    assert sorted(snap.samples) == sorted(oracle.snap.samples)
    others = [i for i in oracle.snap.samples
              if i != sample_id and snap.samples[i] != oracle.snap.samples[i]]
    assert not others, f"stored values differ from the oracle's for ids {others}"
    record = snap.samples[sample_id]
    assert record["text"] == oracle.snap.samples[sample_id]["text"], "its text must be kept"
    assert record["video"]["present"] == 0 and record["audio"]["present"] == 0
    assert_no_leftovers(out)
    assert not (out / ".precompute.quarantine").exists(), "quarantine kept after a full run"


def test_decoder_crash_is_contained(precompute, oracle, dataset, tmp_path):
    """A decoder that segfaults on one clip (every time): the supervisor restarts the run, the
    suspect is prepared alone, crashes again and is recorded as 'crash' for its video and audio;
    its caption and every other sample are embedded as in the oracle; exit 0."""
    out = tmp_path / "out"
    r = precompute.run(out, "--max-failures", "10",
                       env={"PRECOMPUTE_TEST_DECODER_FAULT": "crash:v05.mp4"})
    assert "the run died (signal 11" in r.stderr
    assert_media_failed(out, oracle, dataset, "c05", "crash")


def test_a_decoder_crash_while_the_encoders_load_is_contained_with_and_without_overwrite(
        precompute, oracle, dataset, tmp_path):
    """The crash on c01, one of the first samples, which are decoded while the encoders load
    (Note [Decoding while the encoders load]). Into a fresh folder it goes as in the graph: two
    deaths, then 'crash'. With --overwrite over a finished output the crashes come before the
    earlier run's files are removed, and the quarantine that pins them is written beside those:
    the restarted runs take it as their command's and the removal leaves it, so again two deaths,
    one removal and the same output."""
    crash = {"PRECOMPUTE_TEST_DECODER_FAULT": "crash:v01.mp4"}
    out = tmp_path / "out"
    r = precompute.run(out, "--max-failures", "10", env=crash)
    assert r.stderr.count("the run died (signal 11") == 2, r.stderr[-3000:]
    assert_media_failed(out, oracle, dataset, "c01", "crash")
    steps = [m["step"] for m in json.loads((out / "summary.json").read_text())["start_up"]]
    assert "early decoding started: 4 sample(s)" in steps, steps
    r = precompute.run(out, "--max-failures", "10", "--overwrite", env=crash)
    assert r.stderr.count("the run died (signal 11") == 2, r.stderr[-3000:]
    assert r.stderr.count("--overwrite: removed") == 1
    assert_media_failed(out, oracle, dataset, "c01", "crash")


def test_decoder_crash_in_a_rank_is_contained_and_the_ranks_merge(precompute, oracle, dataset,
                                                                    tmp_path):
    """The same crash inside a rank of a job split in two (docs/distributed.md): the rank's
    supervisor restarts it, the suspect is recorded as 'crash', the rank finishes, and the last
    rank merges an output in which only that sample's media failed."""
    out = tmp_path / "out"
    died = []
    for rank in (1, 0):
        r = precompute.run(out, "--max-failures", "10", "--rank", str(rank), "--world-size", "2",
                           env={"PRECOMPUTE_TEST_DECODER_FAULT": "crash:v05.mp4"})
        died.append("the run died (signal 11" in r.stderr)
    assert died.count(True) == 1, "exactly the rank holding c05 crashes and is restarted"
    assert "merged 2 rank(s) into" in r.stderr
    assert_media_failed(out, oracle, dataset, "c05", "crash")


def test_decoder_hang_is_bounded_by_the_watchdog(precompute, oracle, dataset, tmp_path):
    """A decoder that never returns on one clip, with run.sample_timeout_s 1: the watchdog ends
    the child after 2 * 1 + 5 s, the supervisor restarts it, the sample is recorded as 'timeout'
    and the job finishes in bounded time."""
    config = dataset.variant(tmp_path, "timeout", lambda c: c["run"].update(sample_timeout_s=1))
    out = tmp_path / "out"
    r = precompute.run(out, "--max-failures", "10", config=config, timeout=120,
                       env={"PRECOMPUTE_TEST_DECODER_FAULT": "hang:v11.mp4"})
    assert r.seconds < 60, f"took {r.seconds:.0f} s"
    assert "its watchdog ended it" in r.stderr
    assert_media_failed(out, oracle, dataset, "c11", "timeout")


def test_without_the_supervisor_a_stuck_decoder_exits_75_and_a_rerun_resumes(
        precompute, oracle, dataset, tmp_path):
    """The same hang under --no-supervisor: nothing restarts the run, so the watchdog's exit is
    the run's, 75 (README, "Exit codes": rerun to resume), in bounded time and saying what to do.
    The rerun the message asks for (supervised) finishes the output, c11 recorded 'timeout'."""
    config = dataset.variant(tmp_path, "timeout", lambda c: c["run"].update(sample_timeout_s=1))
    out = tmp_path / "out"
    hang = {"PRECOMPUTE_TEST_DECODER_FAULT": "hang:v11.mp4"}
    r = precompute.run(out, "--no-supervisor", "--max-failures", "10", config=config,
                       timeout=120, env=hang, expect=75)
    assert r.seconds < 60, f"took {r.seconds:.0f} s"
    assert "a decoder is stuck" in r.stderr
    assert "rerun without that flag to resume" in r.stderr
    r = precompute.run(out, "--max-failures", "10", config=config, timeout=120, env=hang)
    assert "its watchdog ended it" in r.stderr
    assert_media_failed(out, oracle, dataset, "c11", "timeout")


def test_a_run_that_dies_with_no_sample_to_blame_gives_up_with_70(precompute, oracle, dataset,
                                                                   tmp_path):
    """A child killed before its first commit every time (SIGKILL, as the OOM killer does: no
    sample is blamed) makes no progress: after run.max_restarts restarts the supervisor gives up
    with 70 (README, "Exit codes") instead of looping, and says to rerun. The rerun without the
    fault finishes the output as a clean run does."""
    config = dataset.variant(tmp_path, "restarts", lambda c: c["run"].update(max_restarts=1))
    out = tmp_path / "out"
    r = precompute.run(out, config=config, timeout=240, expect=70,
                       env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@1"})
    assert "the run died 2 times in a row" in r.stderr and "giving up" in r.stderr, r.stderr
    assert "Rerun the same command to resume" in r.stderr
    precompute.run(out, config=config)
    assert_same_output(out, oracle.snap, dataset.ids)


def assert_failed_once(out: Path, oracle: Oracle, dataset: Dataset, sample_id: str,
                       expected: Dict[str, str]) -> None:
    """`out` holds the oracle's output, except that `sample_id` has exactly the failure records
    `expected` (modality -> category), one per modality, and none of those modalities embedded;
    its other modalities and every other sample are as in the oracle."""
    snap = snapshot(out)
    assert_well_formed(snap, dataset.ids)
    records = sorted((f[2], f[3]) for f in snap.failures if f[1] == sample_id)
    assert records == sorted(expected.items()), (
        f"{sample_id}'s failure records: {[f for f in snap.failures if f[1] == sample_id]}")
    assert ([f for f in snap.failures if f[1] != sample_id]
            == [f for f in oracle.snap.failures if f[1] != sample_id])
    others = [i for i in oracle.snap.samples
              if i != sample_id and snap.samples.get(i) != oracle.snap.samples[i]]
    assert not others, f"stored values differ from the oracle's for ids {others}"
    kept = [m for m in MODALITIES if m not in expected
            and oracle.snap.samples.get(sample_id, {}).get(m, {}).get("present")]
    if not kept:
        assert sample_id not in snap.samples, "stored without any embedding"
    else:
        record = snap.samples[sample_id]
        assert all(record[m] == oracle.snap.samples[sample_id][m] for m in kept)
        assert all(record[m]["present"] == 0 for m in expected)
    assert_no_leftovers(out)
    assert not (out / ".precompute.quarantine").exists(), "quarantine kept after a full run"


# c10 and c17 have a clip and an audio file but no caption: once their media are skipped, their
# line gives nothing else to prepare.
CAPTIONLESS_CRASH = {"PRECOMPUTE_TEST_DECODER_FAULT": "crash:v10.mp4"}
CRASHED = {"video": "crash", "audio": "crash"}


@pytest.mark.parametrize("overwrite", [False, True], ids=["new-folder", "overwrite"])
def test_crashed_sample_without_a_caption_is_recorded_once(precompute, oracle, dataset, tmp_path,
                                                           overwrite):
    """A decoder that segfaults on the clip of a sample without a caption: its video and audio
    each get one record, of category 'crash', and nothing else. With its media skipped, nothing
    of the line is left to prepare, yet the line gives a clip: no no_input record ("the line
    gives nothing") for any modality."""
    out = tmp_path / "out"
    flags = ["--max-failures", "10"]
    if overwrite:
        precompute.run(out)  # an earlier run for --overwrite to remove
        flags.append("--overwrite")
    r = precompute.run(out, *flags, timeout=120, env=CAPTIONLESS_CRASH)
    assert "the run died (signal 11" in r.stderr
    assert_failed_once(out, oracle, dataset, "c10", CRASHED)


def test_hung_sample_without_a_caption_is_recorded_once(precompute, oracle, dataset, tmp_path):
    """The same for a decoder that hangs: one record per media modality, 'timeout'."""
    config = dataset.variant(tmp_path, "timeout", lambda c: c["run"].update(sample_timeout_s=1))
    out = tmp_path / "out"
    r = precompute.run(out, "--max-failures", "10", config=config, timeout=120,
                       env={"PRECOMPUTE_TEST_DECODER_FAULT": "hang:v17.mp4"})
    assert "its watchdog ended it" in r.stderr
    assert_failed_once(out, oracle, dataset, "c17", {"video": "timeout", "audio": "timeout"})


def test_crashed_sample_whose_audio_is_its_clip_is_recorded_once(precompute, oracle, dataset,
                                                                 tmp_path):
    """A caption-less sample without an audio file takes its audio from the clip that crashes:
    audio is recorded once, as 'crash', like video."""
    entries = copy.deepcopy(dataset.entries)
    assert entries[10]["id"] == "c10"
    del entries[10]["audio"]
    manifest = write_manifest(tmp_path / "manifest.jsonl", entries)
    out = tmp_path / "out"
    precompute.run(out, "--input", str(manifest), "--max-failures", "10", timeout=120,
                   env=CAPTIONLESS_CRASH)
    assert_failed_once(out, oracle, dataset, "c10", CRASHED)


def test_kill_between_crashes_then_resume_records_the_crash_once(precompute, oracle, dataset,
                                                                 tmp_path):
    """kill -9 of the whole job once the supervisor has quarantined the crash, before the
    restarted run settles it: rerunning the same command resumes from the quarantine and
    records the crash once."""
    out = tmp_path / "out"
    flags = ["--max-failures", "10"]
    with precompute.start(out, *flags, env=CAPTIONLESS_CRASH) as job:
        poll(lambda: (out / ".precompute.quarantine").exists(), 120, "the first crash", job)
        job.kill_group()
    wait_until_gone(str(out))
    assert (out / ".precompute.quarantine").exists()
    r = precompute.run(out, *flags, timeout=120, env=CAPTIONLESS_CRASH)
    assert "resuming" in r.stderr
    assert_failed_once(out, oracle, dataset, "c10", CRASHED)


# --------------------------------------------------------------------------------------------
# 10. --retry-failed


def test_retry_failed_redoes_samples_whose_file_appeared(precompute, oracle, dataset, tmp_path):
    """A clip missing during the run (category missing) is copied in afterwards: a plain rerun
    keeps the failure record (nothing to redo); `--retry-failed` embeds it, even when its first
    attempt is killed while replacing the shard; the output equals a clean run over the now
    complete input (the oracle, whose clip has the same bytes)."""
    entries = copy.deepcopy(dataset.entries)
    late = tmp_path / "late.mp4"
    entries[9]["video"] = str(late)
    manifest = write_manifest(tmp_path / "manifest.jsonl", entries)
    out = tmp_path / "out"
    precompute.run(out, "--input", str(manifest))
    snap = snapshot(out)
    assert ("c09", "video", "missing") in snap.failure_kinds()

    shutil.copy(dataset.root / "v09.mp4", late)
    precompute.run(out, "--input", str(manifest))
    assert ("c09", "video", "missing") in snapshot(out).failure_kinds()

    # Killed while replacing the shard that held the failure, before index.json lists the new
    # file: the rerun must still end with the right output.
    r = precompute.run(out, "--input", str(manifest), "--retry-failed", "--no-supervisor",
                       expect=-signal.SIGKILL,
                       env={"PRECOMPUTE_CRASH_AT": "shard-before-folder-fsync"})
    assert "--retry-failed: redoing" in r.stderr

    precompute.run(out, "--input", str(manifest), "--retry-failed")
    # The redone shard covers the same positions under a new file number (the one it replaced
    # stays intact until the index lists the new one).
    after = assert_same_output(out, oracle.snap, dataset.ids, same_layout=False)
    assert [entry[2:] for entry in after.layout] == [entry[2:] for entry in oracle.snap.layout]
    assert_no_leftovers(out)


def test_retry_failed_after_a_crash_replaces_its_records(precompute, oracle, dataset, tmp_path):
    """--retry-failed after a contained crash decodes the crashed sample again: while the decoder
    still crashes, the crash is pinned on it again and its records are replaced, not added to;
    once it no longer crashes, the sample is embedded and the output equals the oracle."""
    out = tmp_path / "out"
    flags = ["--max-failures", "10"]
    precompute.run(out, *flags, timeout=120, env=CAPTIONLESS_CRASH)
    r = precompute.run(out, *flags, "--retry-failed", timeout=120, env=CAPTIONLESS_CRASH)
    assert "--retry-failed: redoing" in r.stderr and "the run died (signal 11" in r.stderr
    assert_failed_once(out, oracle, dataset, "c10", CRASHED)

    precompute.run(out, *flags, "--retry-failed")
    after = assert_same_output(out, oracle.snap, dataset.ids, same_layout=False)
    assert [entry[2:] for entry in after.layout] == [entry[2:] for entry in oracle.snap.layout]
    assert_no_leftovers(out)
