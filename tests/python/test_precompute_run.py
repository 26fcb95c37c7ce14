"""tools/bench/precompute_run.py, the one module through which every benchmark script runs
precompute and reads its summary (docs/format.md, "Run summary"), on a tiny CPU text job: the
figures it gives come from the summary file, equal what the run wrote, and a run that fails
raises with its exit code and log; medians pick the middle run. The scripts that only run on the
GPU machine call it the same way (gpu_memory_budget.run is run here on the CPU)."""

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, write_manifest

sys.path.insert(0, str(ROOT / "tools" / "bench"))
import precompute_run  # noqa: E402


@pytest.fixture()
def text_job(probes, minilm_folder, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl",
                              [{"id": f"t{i}", "text": f"caption number {i}"} for i in range(20)]
                              + [{"id": "empty", "text": " "}])
    return {"input": {"manifest": str(manifest)},
            "output": {"path": str(tmp_path / "out"), "shard_size": 8, "overwrite": True},
            "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")},
                     "pooling": "model", "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}}}


class Watch:
    def __init__(self, pid: int):
        self.pid = pid

    def stop(self):
        return ("watched", self.pid)


def test_a_run_is_read_from_its_summary(binary, text_job, tmp_path):
    run = precompute_run.run_precompute(binary, text_job, tmp_path / "runs" / "one",
                                        "--progress-interval", "0", watch=Watch, timeout=300)
    assert run.returncode == 0 and not run.timed_out
    assert run.watched == ("watched", run.pid)
    for suffix in (".yaml", ".log", ".summary.json"):
        assert (tmp_path / "runs" / f"one{suffix}").exists(), suffix
    assert run.summary == json.loads((tmp_path / "runs" / "one.summary.json").read_text())
    assert "--summary-json" in run.cmd and run.wall_s > run.run_s > 0 and run.cpu_s > 0
    assert run.samples == 21 and run.per_s == pytest.approx(21 / run.run_s)
    assert run.load_s == run.summary["seconds"]["load"]
    assert {"route", "assemble", "build shards", "commit", "encode text"} <= set(run.busy)
    assert run.gpu_peak_mib() is None and run.calibrations() == []  # on the CPU
    # Every start-up step, in order, each from the process's start, before it ended.
    steps = run.timeline()
    assert [s for _, s in steps[:2]] == ["config read and checked; the run's clock starts",
                                         "input checked"]
    assert "encoders loaded and warmed up" in [s for _, s in steps]
    assert steps[-2][1] == "graph set up" and steps[-1] == [round(run.wall_s, 3),
                                                            "the process has ended"]
    assert 0 < steps[0][0] and all(a[0] <= b[0] for a, b in zip(steps, steps[1:]))
    assert run.done_line().startswith(f"[") and "done: 21 samples in" in run.done_line()
    figures = run.figures()
    assert figures == {"line": run.done_line(), "samples": 21, "seconds": run.run_s,
                       "per_s": run.per_s, "with_embeddings": 20, "text": 20, "failed": 1,
                       "load_seconds": run.load_s,
                       "peak_rss_mb": run.summary["memory"]["peak_rss_bytes"] / 1e6,
                       "failures_by_category": "bad_text 1"}
    assert run.embedded("text") == 20 and run.embedded("video") == 0


def test_medians_pick_the_middle_run(binary, text_job, tmp_path):
    runs = [precompute_run.run_precompute(binary, text_job, tmp_path / f"r{k}",
                                          "--progress-interval", "0") for k in range(3)]
    middle = sorted(runs, key=lambda r: r.run_s)[1]
    assert precompute_run.median_run(runs) is middle
    assert precompute_run.median(r.run_s for r in runs) == middle.run_s
    assert precompute_run.median_run(runs, key=lambda r: -r.wall_s) is \
        sorted(runs, key=lambda r: -r.wall_s)[1]


def test_a_failed_run_raises_with_its_exit_and_log(binary, text_job, tmp_path):
    text_job["text"]["encoder"]["path"] = str(tmp_path / "no-model.pt")
    with pytest.raises(precompute_run.PrecomputeFailed) as failed:
        precompute_run.run_precompute(binary, text_job, tmp_path / "bad")
    run = failed.value.run
    assert run.returncode == 2 and "exited 2" in str(failed.value)
    assert "no-model.pt" in str(failed.value) and str(run.log_path) in str(failed.value)
    # The refusal's own summary says so; a caller that takes exit 2 as a result gets the run.
    assert run.summary["end"] == "refused" and run.summary["exit_code"] == 2
    same = precompute_run.run_precompute(binary, text_job, tmp_path / "bad", ok=(0, 2))
    assert same.returncode == 2 and same.figures()["with_embeddings"] == 0
    assert "no-model.pt" in same.error_message() and same.calibrations() == []


def test_a_timeout_kills_the_run(binary, text_job, tmp_path):
    with pytest.raises(precompute_run.PrecomputeFailed) as failed:
        precompute_run.run_precompute(binary, text_job, tmp_path / "slow", timeout=0.01)
    assert failed.value.run.timed_out and "(timed out)" in str(failed.value)


def test_gpu_memory_budget_reads_a_run_through_it(binary, text_job, tmp_path):
    """The GPU script's runner, on a CPU job: the same fields, with no GPU peak."""
    import gpu_memory_budget
    res = gpu_memory_budget.run(binary, text_job, tmp_path, "cpu", tmp_path, timeout=300)
    assert res["returncode"] == 0 and res["summary"]["with_embeddings"] == 20
    assert res["oom_splits"] == 0 and "peak_reserved_mib" not in res
    assert res["token_limit"] is None and res["refusal"] == ""
    assert (tmp_path / "budget-cpu.log").exists()


def fake_run(summary: dict) -> "precompute_run.Run":
    return precompute_run.Run([], 0, 4.0, 1.0, 1, Path("x.log"), "", Path("x.json"), summary)


def test_the_budget_and_timeline_come_from_the_summary_and_no_script_parses_the_log():
    """The GPU budget's split and the start-up timeline, read from the summary (a GPU run's
    shape, which a CPU run cannot make); no script in tools/bench has a pattern over
    precompute's log."""
    summary = {"memory": {"gpu_budget": [{"device": "cuda:0", "budget_bytes": 2 << 30,
                                          "weights_bytes": 1 << 28, "concurrent_calls": 2,
                                          "encoders": [{"modality": "text",
                                                        "need_bytes": 164 << 20,
                                                        "share_bytes": 1 << 30,
                                                        "sample_units": 256,
                                                        "batch_units": 65536,
                                                        "warmup_batch": 256,
                                                        "warmup_reserved_bytes": 1 << 30}]}]},
               "start_up": [{"at_s": 0.3504, "step": "config read and checked"},
                            {"at_s": 1.25, "step": "graph set up"}]}
    run = fake_run(summary)
    assert run.calibrations() == [{"modality": "text", "device": "cuda:0",
                                   "need_bytes": 164 << 20, "share_bytes": 1 << 30,
                                   "units": 65536}]
    assert run.timeline() == [[0.35, "config read and checked"], [1.25, "graph set up"],
                              [4.0, "the process has ended"]]
    assert fake_run(None).calibrations() == [] and len(fake_run(None).timeline()) == 1
    assert precompute_run.table_row(["a", 1, None]) == "| a | 1 | - |"
    for script in (ROOT / "tools" / "bench").glob("*.py"):
        text = script.read_text()
        assert not re.search(r"\bre\.\w+\([^()]*(\([^()]*\)[^()]*)*\w\.log\b", text), script
        assert "per call for a" not in text and "at most (" not in text, script
        assert "_CALIBRATION" not in text and "_TIMED_LINE" not in text, script
