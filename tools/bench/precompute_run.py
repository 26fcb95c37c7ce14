"""`precompute run` for the benchmarks in tools/bench: runs the command, reads the summary it
writes (--summary-json; docs/format.md, "Run summary") instead of parsing its log, and takes
medians. Every script here that runs precompute goes through this one module.

    from precompute_run import median_run, run_precompute
    runs = [run_precompute(binary, config, work / f"text-{k}") for k in range(3)]
    mid = median_run(runs)                  # the run of median `seconds.run`
    mid.samples, mid.run_s, mid.wall_s, mid.summary["busy_seconds"]
    print(table_row([tag, mid.samples, f"{mid.per_s:,.0f}"]))

The scripts read figures from the summary only; the log is kept for the record (done_line,
error_tail) and never parsed for a figure.

A run that exits other than 0 (or `ok` exits), times out or leaves no summary raises
PrecomputeFailed with the run attached (its exit code, the log's last error, its log file).
"""

import json
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence, Union


def binary_env(binary: Path) -> dict:
    """The environment for the binary: LD_LIBRARY_PATH from build_on_gpu.sh's env file, for a
    binary of its build tree (BUILD/tools/cli/precompute); any other binary gets this one's."""
    env = dict(os.environ)
    parents = Path(binary).resolve().parents
    env_file = parents[2] / "precompute-env.sh" if len(parents) > 2 else None
    if env_file is not None and env_file.exists():
        r = subprocess.run(["bash", "-c", f'. "{env_file}" && printf %s "$LD_LIBRARY_PATH"'],
                           capture_output=True, text=True, check=True)
        env["LD_LIBRARY_PATH"] = r.stdout
    return env


@dataclass
class Run:
    """One `precompute run`: the command, how it ended, its log and its summary."""
    cmd: List[str]
    returncode: int
    wall_s: float          # start to exit, as the caller waited for it
    cpu_s: float           # user + system seconds of the process and its children
    pid: int
    log_path: Path         # its stderr and stdout, interleaved
    log: str
    summary_path: Path
    summary: Optional[dict]  # None when the run left no summary
    timed_out: bool = False
    watched: object = None   # what `watch(pid).stop()` returned

    @property
    def samples(self) -> int:
        """Samples this run processed."""
        return self.summary["run"]["samples"]

    @property
    def run_s(self) -> float:
        """precompute's own timer: input read to last commit, loading the encoders aside."""
        return self.summary["seconds"]["run"]

    @property
    def load_s(self) -> float:
        return self.summary["seconds"]["load"]

    @property
    def per_s(self) -> float:
        return self.summary["throughput"]["samples_per_s"]

    @property
    def busy(self) -> dict:
        """Seconds each stage worked ("route", "build shards", "encode text", ...)."""
        return dict(self.summary["busy_seconds"])

    @property
    def peak_rss_mb(self) -> float:
        return self.summary["memory"]["peak_rss_bytes"] / 1e6

    def gpu_peak_mib(self, device: Optional[str] = None, kind: str = "reserved"):
        """Peak device memory of `device` (default: the first GPU used), "reserved" or
        "allocated", in MiB; None on the CPU."""
        for gpu in self.summary["memory"]["gpu"]:
            if device is None or gpu["device"] == device:
                return gpu[f"peak_{kind}_bytes"] / 2**20
        return None

    def embedded(self, modality: str) -> int:
        """Samples of the whole output with an embedding of `modality` (0 when not configured,
        or when the run changed no output)."""
        totals = self.summary["output_totals"] or {"modalities": {}}
        item = totals["modalities"].get(modality)
        return item["embedded"] if item else 0

    def done_line(self) -> str:
        """The "done:" line as printed, for the record (never parsed)."""
        lines = [ln.strip() for ln in self.log.splitlines() if "done:" in ln]
        return lines[-1] if lines else ""

    def figures(self) -> dict:
        """The figures the text benchmarks have reported for a run, from its summary."""
        s = self.summary
        failures = s["run"]["failures_by_category"]
        out = {"line": self.done_line(), "samples": self.samples, "seconds": self.run_s,
               "per_s": self.per_s,
               "with_embeddings": (s["output_totals"] or {}).get("samples_with_embeddings", 0),
               "text": self.embedded("text"), "failed": s["run"]["failed_samples"],
               "load_seconds": self.load_s, "peak_rss_mb": self.peak_rss_mb}
        if self.gpu_peak_mib() is not None:
            out["peak_gpu_mib"] = self.gpu_peak_mib()
        if failures:
            out["failures_by_category"] = " ".join(f"{c} {n}" for c, n in failures.items())
        return out

    def error_message(self) -> str:
        """How the run ended in words: the summary's `message` (the error's text, "" when it
        ended well), else the log's last error line."""
        if self.summary is not None:
            return self.summary.get("message", "")
        errors = [ln.strip() for ln in self.log.splitlines()
                  if "[error]" in ln or "[critical]" in ln]
        return errors[-1] if errors else ""

    def calibrations(self) -> List[dict]:
        """run.gpu_memory_budget's choice for each GPU encoder (the summary's
        memory.gpu_budget), device by device: {"modality", "device", "need_bytes" (per call, a
        largest sample alone), "share_bytes" (per call, given), "units" (the cost limit of a
        batch: frames, audio samples or tokens)}. Empty without a budget or when the run was
        refused before the split."""
        budget = (self.summary or {}).get("memory", {}).get("gpu_budget", [])
        return [{"modality": e["modality"], "device": d["device"], "need_bytes": e["need_bytes"],
                 "share_bytes": e["share_bytes"], "units": e["batch_units"]}
                for d in budget for e in d["encoders"]]

    def timeline(self) -> List[list]:
        """[seconds since the process started, step] for each start-up step the summary records
        (`start_up`), then the process's end as the caller timed it."""
        rows = [[round(m["at_s"], 3), m["step"]] for m in (self.summary or {}).get("start_up", [])]
        rows.append([round(self.wall_s, 3), "the process has ended"])
        return rows

    def error_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.splitlines()[-lines:])


class PrecomputeFailed(RuntimeError):
    def __init__(self, run: Run):
        self.run = run
        tail = run.log.splitlines()[-40:]
        errors = [ln for ln in tail if "[error]" in ln or "[critical]" in ln] or tail[-1:]
        why = errors[-1].strip() if errors else "(no output)"
        if run.summary is None and run.returncode == 0:
            why = f"no summary at {run.summary_path}"
        super().__init__(f"precompute exited {run.returncode}"
                         f"{' (timed out)' if run.timed_out else ''}: {why} (log {run.log_path})")


def run_precompute(binary: Path, config: Union[dict, Path], prefix: Path, *flags: str,
                   env: Optional[dict] = None, timeout: float = 900,
                   watch: Optional[Callable[[int], object]] = None,
                   ok: Sequence[int] = (0,)) -> Run:
    """Runs `binary run --config CONFIG FLAGS --summary-json PREFIX.summary.json`, logging to
    PREFIX.log; a dict config is written to PREFIX.yaml first (JSON is YAML). `watch(pid)` is
    started with the process and its `stop()` value kept in Run.watched (a memory sampler, say).
    Raises PrecomputeFailed unless it exits with one of `ok` and leaves its summary."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(config, dict):
        config_path = prefix.with_name(prefix.name + ".yaml")
        config_path.write_text(json.dumps(config, indent=1))
    else:
        config_path = Path(config)
    summary_path = prefix.with_name(prefix.name + ".summary.json")
    log_path = prefix.with_name(prefix.name + ".log")
    cmd = [str(binary), "run", "--config", str(config_path), *map(str, flags),
           "--summary-json", str(summary_path)]
    before = os.times()
    with open(log_path, "w") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT,
                                env=env if env is not None else binary_env(binary))
        watcher = watch(proc.pid) if watch else None
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
        wall = time.perf_counter() - started
    after = os.times()
    cpu_s = (after.children_user - before.children_user) + (after.children_system
                                                            - before.children_system)
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    run = Run(cmd, proc.returncode, wall, cpu_s, proc.pid, log_path,
              log_path.read_text(errors="replace"), summary_path, summary, timed_out,
              watcher.stop() if watcher else None)
    if timed_out or proc.returncode not in ok or summary is None:
        raise PrecomputeFailed(run)
    return run


def table_row(cells: Iterable[object]) -> str:
    """One Markdown table row: `| a | b | c |`; None is written as "-"."""
    return "| " + " | ".join("-" if c is None else str(c) for c in cells) + " |"


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def median_run(runs: Sequence[Run], key: Callable[[Run], float] = lambda r: r.run_s) -> Run:
    """The run whose `key` is the median (of an even count, the upper of the middle two)."""
    ordered = sorted(runs, key=key)
    return ordered[len(ordered) // 2]
