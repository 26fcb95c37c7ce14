"""A job on a real SLURM cluster, started by this test on this host (munged, slurmctld, slurmd;
no systemd, cgroups or accounting database): tools/slurm/precompute.sbatch as an array of 4
tasks over a generated dataset. One task is killed as a crash would kill it (SIGKILL to its batch
step, after it has committed a shard); merging then refuses, naming that rank and its rerun
command; the index is resubmitted alone and resumes, the last rank merges, and the output equals
a single-process run's dataset by dataset (file by file, in fact) and passes `precompute verify`.
A rank rerun after the job finished changes nothing. Every daemon and job is stopped at the end.

Skips when the SLURM or munge programs are missing (tools/setup.sh installs them), and fails
instead under CI=true."""

import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import ROOT, assert_same_output, colour_clip, file_sha256, skip_unless_ci, \
    write_manifest

TEMPLATE = ROOT / "tools" / "slurm" / "precompute.sbatch"
PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel",
            "scontrol", "sinfo")
SHARD_SIZE = 3
SAMPLES = 24        # 8 shards, 2 per rank; rank 1 has positions 6 to 11
SLOW = 10           # rank 1's second shard holds a clip that the first submission hangs on
ACTIVE_STATES = "PD,CF,R,CG,S,RQ,RF,RH,SE,SO,ST,RS"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Cluster:
    """A one-node SLURM cluster in a temporary folder; jobs run as the current user."""

    def __init__(self):
        # munged needs every folder above its socket to be a+x: not pytest's tmp_path.
        self.dir = Path(tempfile.mkdtemp(prefix="precompute-slurm-", dir="/tmp"))
        os.chmod(self.dir, 0o755)
        self.daemons: Dict[str, subprocess.Popen] = {}
        self.jobs: List[str] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.dir / "slurm.conf"))
        for name in ("SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "SLURM_NTASKS"):
            self.env.pop(name, None)

    def start(self) -> None:
        d = self.dir
        (d / "spool").mkdir()
        (d / "state").mkdir()
        subprocess.run(["mungekey", "-c", "-k", str(d / "munge.key")], check=True,
                       capture_output=True)
        os.chmod(d / "munge.key", 0o600)
        self._daemon("munged", ["munged", "-F", f"--socket={d}/munge.sock",
                                f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid",
                                f"--seed-file={d}/munged.seed", f"--log-file={d}/munged.log"])
        wait_for(lambda: (d / "munge.sock").exists(), 10, "munged's socket")
        user = getpass.getuser()
        cpus = os.cpu_count() or 1
        # Four stand-in GPUs, so that the template's --gres=gpu:1 is scheduled as on a GPU
        # cluster (one task per "GPU"); the runs use the CPU. Slurm's gpu plugin wants a device
        # file per GPU (a count alone registers none); any character device does.
        (d / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName=node1 Name=gpu File={dev}\n"
            for dev in ("/dev/null", "/dev/zero", "/dev/full", "/dev/urandom")))
        (d / "slurm.conf").write_text(f"""ClusterName=precompute-test
SlurmctldHost=localhost
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MailProg=/bin/true
KillWait=2
MinJobAge=300
GresTypes=gpu
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:4
PartitionName=debug Nodes=node1 Default=YES MaxTime=INFINITE State=UP
""")
        self._daemon("slurmctld", ["slurmctld", "-D"])
        self._daemon("slurmd", ["slurmd", "-D", "-N", "node1"])

        def idle():
            out = self.cmd("sinfo", "-h", "-N", "-o", "%t", check=False).stdout.strip()
            return out == "idle"
        wait_for(idle, 30, "the node to be idle")

    def _daemon(self, name: str, cmd: List[str]) -> None:
        log = open(self.dir / f"{name}.out", "w")
        self.daemons[name] = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, env=self.env,
                                              start_new_session=True)
        log.close()

    def cmd(self, *args: str, check: bool = True, env: Optional[Dict[str, str]] = None):
        result = subprocess.run(list(args), capture_output=True, text=True, timeout=60,
                                env=env or self.env)
        if check:
            assert result.returncode == 0, f"{args}: {result.stdout}{result.stderr}"
        return result

    def sbatch(self, array: str, *args: str, env: Optional[Dict[str, str]] = None) -> str:
        # The template as users submit it; only its CPU count is cut to this host's.
        result = self.cmd("sbatch", "--parsable", f"--array={array}", "--cpus-per-task=1",
                          f"--output={self.dir}/job-%A_%a.log", str(TEMPLATE), *args,
                          env=env)
        job = result.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def active(self, job: str) -> List[str]:
        out = self.cmd("squeue", "-h", "-j", job, "-t", ACTIVE_STATES, "-o", "%i",
                       check=False).stdout
        return [line for line in out.split() if line]

    def wait(self, job: str, timeout: float = 90) -> None:
        wait_for(lambda: not self.active(job), timeout, f"job {job} to end", interval=0.5)

    def stop(self) -> None:
        for job in self.jobs:
            self.cmd("scancel", job, check=False)
        for job in self.jobs:
            try:
                self.wait(job, timeout=30)
            except AssertionError:
                pass
        if "slurmctld" in self.daemons:
            self.cmd("scontrol", "shutdown", check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.daemons.get(name)
            if proc is None:
                continue
            if name == "munged":
                proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture()
def cluster():
    missing = [p for p in PROGRAMS if shutil.which(p) is None and
               not Path(f"/usr/sbin/{p}").exists()]
    if missing:
        skip_unless_ci(f"no {', '.join(missing)}: tools/setup.sh installs slurmctld, slurmd, "
                       "slurm-client and munge")
    os.environ["PATH"] = os.environ.get("PATH", "") + ":/usr/sbin"
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()


def tree_hashes(folder: Path) -> Dict[str, str]:
    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".precompute.lock"}


def test_slurm_array_job_with_a_crashed_task(cluster, binary, probes, minilm_folder):
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="precompute-slurm-data-", dir="/tmp"))
    try:
        entries = [{"id": f"s{i:02d}", "text": f"sample {i} of the job"} for i in range(SAMPLES)]
        clip = root / "slow-clip.mp4"
        colour_clip(clip, ["red", "blue"], size="64x48", seconds_each=0.5)
        entries[SLOW]["video"] = str(clip)
        entries[3] = {"id": "no-caption", "video": str(root / "missing.mp4")}  # a failure
        manifest = write_manifest(root / "manifest.jsonl", entries)
        out = root / "out"
        config = {
            "input": {"manifest": str(manifest)},
            "output": {"path": str(out), "shard_size": SHARD_SIZE},
            "run": {"decode_threads": 2, "progress_interval_s": 0, "sample_timeout_s": 300},
            "video": {"encoder": {"path": str(probes / "video_probe.pt")},
                      "sampling": {"fps": 2}, "size": 32},
            "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")},
                     "pooling": "model", "batch_size": 4,
                     "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}},
        }
        config_path = root / "config.yaml"
        config_path.write_text(json.dumps(config, indent=1))

        # The oracle: one process, at the same output path, then moved aside.
        env = {k: v for k, v in cluster.env.items()
               if k not in ("PRECOMPUTE_TEST_DECODER_FAULT", "PRECOMPUTE_CRASH_AT")}
        subprocess.run([str(binary), "run", "--config", str(config_path)], check=True,
                       capture_output=True, env=env, timeout=120)
        oracle = root / "oracle"
        shutil.move(str(out), oracle)

        env["PRECOMPUTE"] = str(binary)
        hung = dict(env, PRECOMPUTE_TEST_DECODER_FAULT="hang:slow-clip")
        job = cluster.sbatch("0-3", str(config_path), "4", env=hung)
        rank1 = out / "ranks" / "rank-00001-of-00004"

        def committed_a_shard():
            try:
                return len(json.loads((rank1 / "index.json").read_text())["shards"]) >= 1
            except (OSError, ValueError, KeyError):
                return False
        wait_for(committed_a_shard, 60, "rank 1 to commit a shard")
        cluster.cmd("scancel", "--signal=KILL", "--batch", f"{job}_1")
        cluster.wait(job)  # the other three finish

        merge = subprocess.run([str(binary), "merge", str(out)], capture_output=True, text=True,
                               env=env, timeout=60)
        assert merge.returncode == 1, merge.stderr
        assert "rank 1 of 4: stopped" in merge.stderr, merge.stderr
        assert f"--config {config_path} --rank 1 --world-size 4" in merge.stderr
        assert f"sbatch --array=1 tools/slurm/precompute.sbatch {config_path} 4" in merge.stderr
        assert not (out / "index.json").exists()
        status = subprocess.run([str(binary), "status", str(out)], capture_output=True,
                                text=True, env=env, timeout=60).stdout
        assert "rank     1: stopped" in status and "not merged yet" in status, status

        # The index alone again: it resumes, and as the last rank it merges.
        again = cluster.sbatch("1", str(config_path), "4", env=env)
        cluster.wait(again)
        log = (cluster.dir / f"job-{again}_1.log").read_text()
        assert "rank 1 of 4 (from SLURM_ARRAY_TASK_ID and --world-size)" in log, log
        assert "resuming" in log and "merged 4 rank(s)" in log, log
        assert_same_output(oracle, out)
        verify = subprocess.run([str(binary), "verify", str(out), "--input", str(manifest)],
                                capture_output=True, text=True, env=env, timeout=60)
        assert verify.returncode == 0, verify.stdout + verify.stderr

        # A finished rank run again changes nothing.
        before = tree_hashes(out)
        rerun = cluster.sbatch("2", str(config_path), "4", env=env)
        cluster.wait(rerun)
        assert "already shows every rank's shards" in (
            cluster.dir / f"job-{rerun}_2.log").read_text()
        assert tree_hashes(out) == before
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert time.monotonic() - started < 120
