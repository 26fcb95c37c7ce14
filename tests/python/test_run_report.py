"""What a run reports beside its shards, through the real CLI: --summary-json PATH and the
output folder's summary.json (docs/format.md, "Run summary"), whose counts equal `precompute
inspect --json`, and --metrics-file PATH in Prometheus' text format (docs/format.md, "Metrics
file"), parsed while the run goes and after it ends; each written for every end a run can have
(done, too many failures, stopped, refused, a crash the supervisor restarts), for each rank of a
split job, and refused with exit 2 where a path cannot work."""

import json
import math
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import colour_clip, sine_file, write_manifest

SHARD_SIZE = 3
FAULTS = ("PRECOMPUTE_CRASH_AT", "PRECOMPUTE_TEST_DECODER_FAULT")


@pytest.fixture(scope="module")
def data(tmp_path_factory, probes, minilm_folder):
    """12 samples in 4 shards: clips with their own audio and captions, a caption alone, and one
    failure per modality: a missing clip (video missing), a clip without an audio track (audio
    no_stream), an empty caption (text bad_text)."""
    root = tmp_path_factory.mktemp("report-data")
    colours = ["red", "blue", "lime", "yellow", "white", "black", "cyan", "magenta"]
    entries = []
    for i in range(12):
        entries.append({"id": f"s{i:02d}", "video": str(root / f"v{i:02d}.mp4"),
                        "audio": str(root / f"a{i:02d}.wav"), "text": f"caption number {i}"})
    entries[2]["video"] = str(root / "no-such-clip.mp4")
    del entries[5]["audio"]           # audio from the clip, which has no audio track
    entries[7]["text"] = "   "        # an empty caption
    entries[9] = {"id": "s09", "text": "a caption alone"}
    for e in entries:
        if e.get("video", "").startswith(str(root / "v")):
            colour_clip(Path(e["video"]), colours[:2], size="64x48", seconds_each=0.5)
        if "audio" in e:
            sine_file(Path(e["audio"]), 330, 1.0)
    manifest = write_manifest(root / "manifest.jsonl", entries)
    config = {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(root / "unused"), "shard_size": SHARD_SIZE},
        "run": {"decode_threads": 2},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")},
                  "sampling": {"num_frames": 2}, "size": 32, "batch_size": 4},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "sample_rate": 16000,
                  "batch_size": 4},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}, "batch_size": 4},
    }
    config_path = root / "config.yaml"
    config_path.write_text(json.dumps(config, indent=1))
    return {"root": root, "manifest": manifest, "entries": entries, "config": config,
            "config_path": config_path}


def env_without_faults(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in FAULTS}
    env.update(extra or {})
    return env


def run(binary, config_path, out, *flags, expect: Optional[int] = 0, env=None, timeout=300):
    cmd = [str(binary), "run", "--config", str(config_path), "--output", str(out),
           "--progress-interval", "0", *map(str, flags)]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=env_without_faults(env), timeout=timeout)
    if expect is not None:
        assert r.returncode == expect, f"exit {r.returncode}, expected {expect}\n{r.stderr[-4000:]}"
    return r


def inspect_json(binary, out: Path) -> dict:
    r = subprocess.run([str(binary), "inspect", str(out), "--json"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def read_summary(path: Path) -> dict:
    text = path.read_text()
    summary = json.loads(text)
    # The output id is the second field, in the file's first bytes (the ownership check).
    assert list(summary)[:3] == ["format", "output_id", "format_version"], list(summary)[:3]
    assert summary["format"] == "precompute-summary" and summary["format_version"] == 1
    return summary


def assert_counts_equal_inspect(summary: dict, inspected: dict) -> None:
    totals = summary["output_totals"]
    assert totals["total_samples"] == inspected["total_samples"]
    if summary["rank"] is None:  # inspect counts a rank folder's span as incomplete
        assert totals["complete"] == inspected["complete"]
    assert totals["samples_with_embeddings"] == inspected["samples_with_embeddings"]
    assert totals["failure_records"] == inspected["failure_records"]
    assert totals["bytes"] == inspected["bytes"]
    assert totals["shards"] == len(inspected["shards"])
    assert totals["covered_samples"] == sum(s["seq_count"] for s in inspected["shards"])
    assert totals["failures_by_category"] == inspected["failures_by_category"]
    assert summary["config_fingerprint"] == inspected["config_fingerprint"]
    by_modality = Counter((f["modality"], f["category"]) for f in inspected["failures"])
    assert set(totals["modalities"]) == set(inspected["modalities"])
    for modality, item in totals["modalities"].items():
        assert item["embedded"] == inspected["modalities"][modality]["samples"], modality
        want = {c: n for (m, c), n in by_modality.items() if m == modality}
        assert item["failures_by_category"] == want, modality
        assert item["failed"] == sum(want.values())
        assert item["samples"] == item["embedded"] + item["failed"]


# --------------------------------------------------------------------------------------------
# Prometheus' text exposition format, checked line by line


NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf"^(?P<name>{NAME})(?:\{{(?P<labels>{LABEL}(?:,{LABEL})*)?\}})? "
                    rf"(?P<value>\S+)(?: (?P<timestamp>-?\d+))?$")


def parse_prometheus(text: str) -> Dict[tuple, float]:
    """Every series as (name, ((label, value), ...)) -> value; fails on anything the text format
    does not allow: a sample before its TYPE, a family's HELP or TYPE twice or its samples
    apart, an unknown type, a bad name, label or value, a series twice, a missing last line
    feed. Checks precompute's conventions too: the precompute_ prefix and counters in _total."""
    assert text.endswith("\n"), "the last line has no line feed"
    types: Dict[str, str] = {}
    helps = set()
    series: Dict[tuple, float] = {}
    closed = set()
    current = None
    for line in text.splitlines():
        assert line, "an empty line"
        if line.startswith("#"):
            m = re.match(rf"^# (HELP|TYPE) ({NAME}) (.*)$", line)
            assert m, line
            kind, name, rest = m.groups()
            assert name.startswith("precompute_"), name
            if kind == "HELP":
                assert name not in helps, f"HELP of {name} twice"
                helps.add(name)
            else:
                assert name not in types, f"TYPE of {name} twice"
                assert rest in ("counter", "gauge", "histogram", "summary", "untyped"), line
                if rest == "counter":
                    assert name.endswith("_total"), f"counter {name} does not end in _total"
                types[name] = rest
            if current is not None and current != name:
                closed.add(current)
            current = name
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name = m.group("name")
        assert name in types, f"{name} has no TYPE before its samples"
        assert name == current and name not in closed, f"{name}'s samples are apart"
        labels = tuple(re.findall(LABEL, m.group("labels") or ""))
        assert len({k for k, _ in labels}) == len(labels), f"a label twice: {line}"
        key = (name, labels)
        assert key not in series, f"series twice: {line}"
        series[key] = float(m.group("value"))  # also +Inf, -Inf, NaN
    return series


def value(series: Dict[tuple, float], name: str, **labels) -> float:
    found = [v for (n, ls), v in series.items()
             if n == name and all((k, str(labels[k])) in ls for k in labels)]
    assert len(found) == 1, f"{name} {labels}: {len(found)} series"
    return found[0]


def total(series: Dict[tuple, float], name: str, **labels) -> float:
    return sum(v for (n, ls), v in series.items()
               if n == name and all((k, str(labels[k])) in ls for k in labels))


# --------------------------------------------------------------------------------------------
# The summary of a run, and its metrics' last state


def test_summary_counts_equal_inspect_and_metrics_parse(binary, data, tmp_path):
    out = tmp_path / "out"
    summary_path = tmp_path / "reports" / "summary.json"
    summary_path.parent.mkdir()
    metrics_path = tmp_path / "reports" / "precompute.prom"
    r = run(binary, data["config_path"], out, "--summary-json", summary_path,
            "--metrics-file", metrics_path)
    summary = read_summary(summary_path)
    assert (out / "summary.json").read_bytes() == summary_path.read_bytes()
    index = json.loads((out / "index.json").read_text())
    assert summary["output_id"] == index["output_id"]
    assert summary["end"] == "done" and summary["exit_code"] == 0 and summary["message"] == ""
    assert summary["output"] == str(out) and summary["rank"] is None
    inspected = inspect_json(binary, out)
    assert_counts_equal_inspect(summary, inspected)
    # The failures this input makes, one of each kind.
    totals = summary["output_totals"]
    assert totals["modalities"]["video"]["failures_by_category"] == {"missing": 1}
    assert totals["modalities"]["audio"]["failures_by_category"] == {"no_stream": 1}
    assert totals["modalities"]["text"]["failures_by_category"] == {"bad_text": 1}
    # A first run: what it did is the whole output.
    run_part = summary["run"]
    assert run_part["samples"] == 12 and run_part["resumed_samples"] == 0
    assert summary["input_samples"] == 12
    assert run_part["failures_by_category"] == totals["failures_by_category"]
    for m in ("video", "audio", "text"):
        assert run_part["embedded"][m] == totals["modalities"][m]["embedded"]
        assert run_part["failures"][m] == totals["modalities"][m]["failures_by_category"]
    assert run_part["shards_written"] == 4 and run_part["bytes_written"] == totals["bytes"]
    # Times, rates, stages, memory, decoders.
    seconds = summary["seconds"]
    assert seconds["load"] > 0 and seconds["run"] > 0 and 0 <= seconds["calibrate"]
    assert 0 < seconds["graph"] <= seconds["run"]
    assert summary["throughput"]["samples_per_s"] == pytest.approx(12 / seconds["run"])
    # The first samples decode while the encoders load: only the load's idle tail is left out.
    assert 0 <= seconds["load_waited"] <= seconds["load"]
    assert summary["throughput"]["samples_per_s_with_load"] == pytest.approx(
        12 / (seconds["run"] + seconds["load_waited"]))
    assert any(m["step"].startswith("early decoding started: ") for m in summary["start_up"])
    assert 0 < seconds["early_decoding"] < seconds["run"]
    assert set(summary["busy_seconds"]) == set(summary["busy_fraction"])
    assert {"route", "assemble", "build shards", "commit", "encode video",
            "video encoder in use"} <= set(summary["busy_seconds"])
    # The union of the encoder's calls: within their sum and within the graph's time.
    in_use = summary["busy_seconds"]["video encoder in use"]
    assert 0 < in_use <= summary["busy_seconds"]["encode video"] + 1e-6
    assert summary["busy_fraction"]["video encoder in use"] <= 1 + 1e-6
    for stage, busy in summary["busy_seconds"].items():
        assert summary["busy_fraction"][stage] == pytest.approx(busy / seconds["graph"])
    assert summary["memory"]["peak_rss_bytes"] > 50 << 20
    assert summary["memory"]["gpu"] == [] and summary["memory"]["gpu_budget"] == []
    # The start-up steps, each when it ended, from the process's start: in order, within the
    # run's load and run seconds.
    start_up = summary["start_up"]
    assert start_up[0]["step"].startswith("config read") and start_up[-1]["step"] == "graph set up"
    ats = [m["at_s"] for m in start_up]
    assert 0 < ats[0] and ats == sorted(ats)
    assert ats[-1] - ats[0] <= seconds["load"] + seconds["run"]
    video = summary["video_decoding"]
    assert video["clips"] == 10 and video["clips_on_nvdec"] == 0 and video["clips_on_cpu"] == 10
    assert video["frames_kept"] == 20
    assert video["frames_decoded"] == video["frames_decoded_on_cpu"] > 0
    assert video["decoders"] == "CPU"
    # The "done:" line says what the summary says.
    assert f"12 samples in {seconds['run']:.2f} s" in r.stderr

    # The metrics' last state: the same counts.
    series = parse_prometheus(metrics_path.read_text())
    labels = {k for (_, ls), _ in series.items() for k, _ in ls}
    assert "output" in labels
    assert all(("output", str(out)) in ls for (_, ls) in series)
    assert value(series, "precompute_run_finished") == 1
    assert value(series, "precompute_run_exit_code") == 0
    assert value(series, "precompute_samples") == 12
    assert value(series, "precompute_samples_done_total") == 12
    assert value(series, "precompute_samples_failed_total") == run_part["failed_samples"]
    assert value(series, "precompute_shards_committed_total") == 4
    assert value(series, "precompute_written_bytes_total") == totals["bytes"]
    for m in ("video", "audio", "text"):
        assert value(series, "precompute_samples_embedded_total", modality=m) == \
            run_part["embedded"][m]
        for category, n in run_part["failures"][m].items():
            assert value(series, "precompute_failure_records_total", modality=m,
                         category=category) == n
        assert total(series, "precompute_failure_records_total", modality=m) == \
            sum(run_part["failures"][m].values())
        assert value(series, "precompute_batches_queued", modality=m) == 0
        assert value(series, "precompute_batches_total", modality=m) > 0
    assert value(series, "precompute_stage_busy_seconds_total", stage="commit") == \
        pytest.approx(summary["busy_seconds"]["commit"], abs=1e-6)
    for m in ("video", "audio", "text"):
        assert value(series, "precompute_encoder_in_use_seconds_total", modality=m) == \
            pytest.approx(summary["busy_seconds"][f"{m} encoder in use"], abs=1e-6)
    assert value(series, "precompute_host_memory_rss_bytes") > 50 << 20
    assert value(series, "precompute_video_clips_decoded_total", decoder="cpu") == 10
    assert value(series, "precompute_video_frames_decoded_total", decoder="cpu") == \
        video["frames_decoded"]
    assert value(series, "precompute_run_info", config_fingerprint=summary["config_fingerprint"],
                 rank=0, world_size=1) == 1
    assert abs(value(series, "precompute_metrics_updated_timestamp_seconds") - time.time()) < 120


def long_job(data, tmp_path: Path, samples: int) -> Path:
    """A config over `samples` lines that all name the same clip and caption, decoded one at a
    time: a run of some seconds without a fault to slow it."""
    clip = data["entries"][0]
    manifest = write_manifest(tmp_path / "long.jsonl",
                              [{"id": f"n{i:04d}", "video": clip["video"], "text": clip["text"]}
                               for i in range(samples)])
    config = json.loads(data["config_path"].read_text())
    config["input"]["manifest"] = str(manifest)
    config["run"]["decode_threads"] = 1
    del config["audio"]
    path = tmp_path / "long.yaml"
    path.write_text(json.dumps(config))
    return path


def test_metrics_file_is_rewritten_while_the_run_goes(binary, data, tmp_path):
    """Rewritten every 0.05 s, the file is whole at every read, shows the run going, then its
    end."""
    config_path = long_job(data, tmp_path, 400)
    metrics_path = tmp_path / "run.prom"
    out = tmp_path / "out"
    cmd = [str(binary), "run", "--config", str(config_path), "--output", str(out),
           "--progress-interval", "0.05", "--metrics-file", str(metrics_path)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env_without_faults())
    snapshots: List[Dict[tuple, float]] = []
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if metrics_path.exists():
            snapshots.append(parse_prometheus(metrics_path.read_text()))
        time.sleep(0.02)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0, stderr[-3000:]
    running = [s for s in snapshots if value(s, "precompute_run_finished") == 0]
    assert len(running) >= 5, f"{len(running)} snapshots while running"
    assert not any(n == "precompute_run_exit_code" for s in running for (n, _) in s)
    done = [value(s, "precompute_samples_done_total") for s in running]
    assert done == sorted(done) and done[0] < done[-1] and done[0] < 400
    assert any(value(s, "precompute_samples_in_stage", stage="decoding") > 0 for s in running)
    last = parse_prometheus(metrics_path.read_text())
    assert value(last, "precompute_run_finished") == 1
    assert value(last, "precompute_run_exit_code") == 0
    assert value(last, "precompute_samples_done_total") == 400
    assert value(last, "precompute_samples_embedded_total", modality="video") == 400
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_a_resume_counts_the_whole_output_and_its_own_part(binary, data, tmp_path):
    """A manifest that grew: the earlier run's failures are read back from its shards, so the
    whole output still equals inspect; "run" counts the appended samples alone."""
    root = tmp_path / "grown"
    root.mkdir()
    first = write_manifest(root / "m.jsonl", data["entries"][:9])
    config = json.loads(data["config_path"].read_text())
    config["input"]["manifest"] = str(first)
    config_path = root / "config.yaml"
    config_path.write_text(json.dumps(config))
    out, summary_path = tmp_path / "out", tmp_path / "summary.json"
    run(binary, config_path, out, "--summary-json", summary_path)
    assert read_summary(summary_path)["run"]["samples"] == 9
    write_manifest(first, data["entries"])  # three lines appended
    run(binary, config_path, out, "--summary-json", summary_path)
    summary = read_summary(summary_path)
    assert summary["run"]["samples"] == 3 and summary["run"]["resumed_samples"] == 9
    assert summary["run"]["failures"] == {"video": {}, "audio": {}, "text": {}}
    assert_counts_equal_inspect(summary, inspect_json(binary, out))
    assert summary["output_totals"]["failures_by_category"] == {
        "missing": 1, "no_stream": 1, "bad_text": 1}
    assert (out / "summary.json").read_bytes() == summary_path.read_bytes()

    # A rerun with nothing to do: its own summary says so; the folder's stays the last real
    # run's, byte for byte.
    kept = (out / "summary.json").read_bytes()
    run(binary, config_path, out, "--summary-json", summary_path, "--batch-size", "2")
    noop = read_summary(summary_path)
    assert noop["run"]["samples"] == 0 and noop["run"]["resumed_samples"] == 12
    assert noop["exit_code"] == 0
    assert_counts_equal_inspect(noop, inspect_json(binary, out))
    assert (out / "summary.json").read_bytes() == kept
    # Without a summary there, the rerun writes one.
    (out / "summary.json").unlink()
    run(binary, config_path, out)
    assert read_summary(out / "summary.json")["run"]["samples"] == 0


def test_over_the_failure_limit_the_summary_says_exit_3(binary, data, tmp_path):
    out, summary_path = tmp_path / "out", tmp_path / "summary.json"
    r = run(binary, data["config_path"], out, "--summary-json", summary_path, "--max-failures",
            "1", expect=3)
    summary = read_summary(summary_path)
    assert summary["exit_code"] == 3 and summary["end"] == "too_many_failures"
    assert_counts_equal_inspect(summary, inspect_json(binary, out))
    assert "over the limit of 1 (--max-failures" in r.stderr
    # The next run within the limit, with nothing to do, rewrites the folder's copy: it ends
    # otherwise than the one recorded there.
    run(binary, data["config_path"], out, "--summary-json", summary_path)
    assert read_summary(out / "summary.json")["exit_code"] == 0


def test_a_stopped_run_summarises_what_it_committed(binary, data, tmp_path):
    config_path = long_job(data, tmp_path, 1200)
    out, summary_path = tmp_path / "out", tmp_path / "summary.json"
    metrics_path = tmp_path / "m.prom"
    cmd = [str(binary), "run", "--config", str(config_path), "--output", str(out),
           "--progress-interval", "0.05", "--summary-json", str(summary_path),
           "--metrics-file", str(metrics_path)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env_without_faults())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics_path.exists() and value(parse_prometheus(metrics_path.read_text()),
                                           "precompute_shards_committed_total") >= 2:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGINT)  # the supervisor, which passes it on
    stderr = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, stderr[-3000:]
    summary = read_summary(summary_path)
    assert summary["exit_code"] == 130 and summary["end"] == "stopped"
    assert "stopped by SIGINT" in summary["message"]
    inspected = inspect_json(binary, out)
    assert not inspected["complete"] and inspected["shards"]
    assert_counts_equal_inspect(summary, inspected)
    assert summary["run"]["samples"] == 1200
    assert (out / "summary.json").read_bytes() == summary_path.read_bytes()
    series = parse_prometheus(metrics_path.read_text())
    assert value(series, "precompute_run_finished") == 1
    assert value(series, "precompute_run_exit_code") == 130


def test_a_refused_run_writes_its_summary_and_leaves_the_folder(binary, data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    out, summary_path = tmp_path / "out", tmp_path / "summary.json"
    summary_path.write_text("an older run's summary")
    r = run(binary, data["config_path"], out, "--input", bad, "--summary-json", summary_path,
            expect=65)
    summary = read_summary(summary_path)
    assert summary["exit_code"] == 65 and summary["end"] == "refused"
    assert "ids must be unique" in summary["message"], summary["message"]
    assert summary["output_id"] is None and summary["output_totals"] is None
    assert "error" in r.stderr
    assert not (out / "summary.json").exists()


def test_a_config_refused_at_start_up_writes_its_summary(binary, data, tmp_path):
    """A setting out of range or a model that does not exist: exit 2, and the summary says why;
    a --rank that cannot be read leaves none (which file is this rank's is not known)."""
    summary_path = tmp_path / "summary.json"
    r = run(binary, data["config_path"], tmp_path / "out", "--batch-size", "0",
            "--summary-json", summary_path, expect=2)
    summary = read_summary(summary_path)
    assert summary["end"] == "refused" and summary["exit_code"] == 2
    assert "batch_size" in summary["message"] and summary["message"] in r.stderr
    config = json.loads(data["config_path"].read_text())
    config["video"]["encoder"]["path"] = str(tmp_path / "no-such-model.pt")
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(config))
    run(binary, bad, tmp_path / "out", "--summary-json", summary_path, expect=2)
    assert "no-such-model.pt" in read_summary(summary_path)["message"]
    summary_path.unlink()
    run(binary, data["config_path"], tmp_path / "out", "--rank", "x", "--world-size", "2",
        "--summary-json", summary_path, expect=2)
    assert not summary_path.exists()
    assert not (tmp_path / "out").exists()


def test_a_refusal_for_other_settings_leaves_no_summary_of_its_own_there(binary, data,
                                                                         tmp_path):
    """With index.json gone, a run of other settings rebuilds the index from the shards and is
    refused (exit 2): the folder holds the earlier output, so it keeps no summary with the
    refused run's id, and the earlier settings resume it."""
    out, summary_path = tmp_path / "out", tmp_path / "summary.json"
    run(binary, data["config_path"], out)
    (out / "index.json").unlink()
    (out / "summary.json").unlink()
    config = json.loads(data["config_path"].read_text())
    config["output"]["dtype"] = "float32"
    other = tmp_path / "other.yaml"
    other.write_text(json.dumps(config))
    run(binary, other, out, "--summary-json", summary_path, expect=2)
    refused = read_summary(summary_path)
    assert refused["end"] == "refused" and refused["output_totals"] is None
    assert not (out / "summary.json").exists()
    run(binary, data["config_path"], out)
    assert read_summary(out / "summary.json")["run"]["resumed_samples"] == 12


def test_a_crash_the_supervisor_restarts_leaves_whole_reports(binary, data, tmp_path):
    out, summary_path = tmp_path / "out", tmp_path / "summary.json"
    metrics_path = tmp_path / "m.prom"
    r = run(binary, data["config_path"], out, "--summary-json", summary_path,
            "--metrics-file", metrics_path, timeout=300,
            env={"PRECOMPUTE_TEST_DECODER_FAULT": "crash:v06.mp4"})
    assert "the run died (" in r.stderr
    summary = read_summary(summary_path)
    assert summary["exit_code"] == 0
    inspected = inspect_json(binary, out)
    assert_counts_equal_inspect(summary, inspected)
    assert summary["output_totals"]["modalities"]["video"]["failures_by_category"][
        "crash"] == 1
    series = parse_prometheus(metrics_path.read_text())
    assert value(series, "precompute_run_finished") == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


# --------------------------------------------------------------------------------------------
# Ranks: each its own files


def test_each_rank_writes_its_own_reports(binary, data, tmp_path):
    out = tmp_path / "out"
    summary_path, metrics_path = tmp_path / "summary.json", tmp_path / "job.prom"
    for rank in (1, 0):
        run(binary, data["config_path"], out, "--rank", rank, "--world-size", 2,
            "--summary-json", summary_path, "--metrics-file", metrics_path)
    assert not summary_path.exists() and not metrics_path.exists()
    merged = inspect_json(binary, out)
    embedded = 0
    for rank in range(2):
        folder = out / "ranks" / f"rank-{rank:05d}-of-00002"
        mine = tmp_path / f"summary.rank-{rank:05d}-of-00002.json"
        summary = read_summary(mine)
        assert summary["rank"] == {"rank": rank, "world_size": 2}
        assert summary["output"] == str(folder)
        assert (folder / "summary.json").read_bytes() == mine.read_bytes()
        assert_counts_equal_inspect(summary, inspect_json(binary, folder))
        embedded += summary["output_totals"]["samples_with_embeddings"]
        series = parse_prometheus(
            (tmp_path / f"job.rank-{rank:05d}-of-00002.prom").read_text())
        assert value(series, "precompute_run_info", rank=rank, world_size=2) == 1
        assert all(("output", str(folder)) in ls for (_, ls) in series)
    assert embedded == merged["samples_with_embeddings"]
    assert not (out / "summary.json").exists()


# --------------------------------------------------------------------------------------------
# Paths that cannot work: exit 2 before any work, naming the key, the flag and the fix


@pytest.mark.parametrize("flag,key", [("--summary-json", "run.summary_json"),
                                      ("--metrics-file", "run.metrics_file")])
def test_paths_that_cannot_work_are_refused(binary, data, tmp_path, flag, key):
    out = tmp_path / "out"
    (tmp_path / "a-folder").mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        (tmp_path / "no-such-folder" / "r.json", "does not exist; create it first"),
        (tmp_path / "a-folder", "a folder; give the path of a file"),
        (str(tmp_path / "a-folder") + "/", "a folder; give the path of a file"),
        (fifo, "not a regular file"),
        (out / "r.json", "inside the output folder"),
        (out / "index.json", "inside the output folder"),
        (data["config_path"], "the config file this run reads"),
        (data["manifest"], "the input manifest this run reads"),
        (tmp_path / ("x" * 250), "bytes long; at most"),
    ]
    for path, message in cases:
        r = run(binary, data["config_path"], out, flag, path, expect=2)
        assert key in r.stderr and flag in r.stderr and message in r.stderr, \
            f"{path}: {r.stderr[-2000:]}"
        assert not out.exists(), f"{path}: the output folder was made"
    # Another output's folder: this run's summary.json there would carry another output id.
    other = tmp_path / "other-out"
    other.mkdir()
    (other / "index.json").write_text("{}")
    r = run(binary, data["config_path"], out, flag, other / "summary.json", expect=2)
    assert "holds a precompute output" in r.stderr and key in r.stderr
    # The same file for both reports.
    same = tmp_path / "same.json"
    r = run(binary, data["config_path"], out, "--summary-json", same, "--metrics-file", same,
            expect=2)
    assert "give each report its own file" in r.stderr


def test_a_folder_that_cannot_be_written_is_refused(binary, data, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):
        pytest.skip("running as root: a read-only folder is writable")
    r = run(binary, data["config_path"], tmp_path / "out", "--metrics-file", locked / "r",
            expect=2)
    assert "run.metrics_file" in r.stderr and "cannot create files" in r.stderr


def test_config_values_of_the_paths(binary, data, tmp_path):
    """In the config file: relative to its folder, null for none, an empty or NUL-holding
    path refused; an empty flag leaves the file's value, as for every text flag."""
    config = json.loads(data["config_path"].read_text())
    out = tmp_path / "out"
    (tmp_path / "reports").mkdir()
    config["run"]["summary_json"] = "reports/s.json"
    config["run"]["metrics_file"] = None
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(config))
    run(binary, path, out, "--summary-json", "")
    assert read_summary(tmp_path / "reports" / "s.json")["exit_code"] == 0
    for bad, message in [("", "is empty; give a path"), ("a\u0000b", "NUL")]:
        config["run"]["summary_json"] = bad
        path.write_text(json.dumps(config))
        r = run(binary, path, tmp_path / "out2", expect=2)
        assert "run.summary_json" in r.stderr and message in r.stderr, r.stderr[-2000:]


def test_a_path_that_is_not_utf8_and_overwrite(binary, data, tmp_path):
    out = tmp_path / "out"
    name = os.fsencode(tmp_path) + b"/r\xff\xfe.json"
    cmd = [os.fsencode(str(binary)), b"run", b"--config", os.fsencode(data["config_path"]),
           b"--output", os.fsencode(out), b"--progress-interval", b"0", b"--summary-json", name]
    r = subprocess.run(cmd, capture_output=True, env=env_without_faults(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(name, "rb") as f:
        summary = json.loads(f.read())
    assert summary["exit_code"] == 0
    # --overwrite: the earlier run's summary.json goes with its other files; the new one is
    # written whole.
    first = read_summary(out / "summary.json")
    run(binary, data["config_path"], out, "--overwrite")
    second = read_summary(out / "summary.json")
    assert second["run"]["samples"] == 12 and second["output_id"] == first["output_id"]


def test_a_summary_json_of_another_output_is_refused_by_name(binary, data, tmp_path):
    """summary.json carries the output id like every file of the tool's: one that does not
    (a user's file under that name) is refused, not replaced."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"format": "precompute-summary", "mine": true}\n')
    r = run(binary, data["config_path"], out, expect=73)
    assert '"summary.json", which carries no output id' in r.stderr
    assert json.loads((out / "summary.json").read_text())["mine"]


def test_an_output_path_with_quotes_newlines_and_bytes(binary, data, tmp_path):
    """The output folder names every series (label `output`) and the summary: a path with a
    quote, a backslash, a line feed and bytes that are not UTF-8 stays valid in both."""
    out = os.fsencode(tmp_path) + b'/o"u\\t\nput \xff\xfe'
    summary_path, metrics_path = tmp_path / "s.json", tmp_path / "m.prom"
    cmd = [os.fsencode(str(binary)), b"run", b"--config", os.fsencode(data["config_path"]),
           b"--output", out, b"--progress-interval", b"0", b"--summary-json",
           os.fsencode(summary_path), b"--metrics-file", os.fsencode(metrics_path)]
    r = subprocess.run(cmd, capture_output=True, env=env_without_faults(), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    shown = str(tmp_path) + '/o"u\\t\nput \ufffd\ufffd'
    assert read_summary(summary_path)["output"] == shown
    series = parse_prometheus(metrics_path.read_text())
    escaped = shown.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    assert all(("output", escaped) in labels for (_, labels) in series)
    assert value(series, "precompute_samples_done_total") == 12


def test_without_progress_lines_the_metrics_still_tick(binary, data, tmp_path):
    """--progress-interval 0 silences the lines, not the metrics: rewritten every 2 s. A job
    must last over 4.5 s to show two ticks; one that ends sooner is rerun with more lines."""
    for samples in (2000, 5000, 12000):
        folder = tmp_path / str(samples)
        folder.mkdir()
        config_path = long_job(data, folder, samples)
        out, metrics_path = folder / "out", folder / "run.prom"
        cmd = [str(binary), "run", "--config", str(config_path), "--output", str(out),
               "--progress-interval", "0", "--metrics-file", str(metrics_path)]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=env_without_faults())
        ticks = set()
        while proc.poll() is None and time.monotonic() - started < 120:
            if metrics_path.exists():
                series = parse_prometheus(metrics_path.read_text())
                if value(series, "precompute_run_finished") == 0:
                    ticks.add(value(series, "precompute_metrics_updated_timestamp_seconds"))
            time.sleep(0.05)
        stderr = proc.communicate(timeout=60)[1]
        assert proc.returncode == 0, stderr[-3000:]
        assert stderr.count("] progress: ") == 1  # the last line alone
        seconds = json.loads((out / "summary.json").read_text())["seconds"]["graph"]
        if seconds > 4.5:
            break
    assert seconds > 4.5, f"the job took {seconds:.1f} s, too short to see two ticks"
    ordered = sorted(ticks)
    assert len(ordered) >= 3, ordered  # the graph's start, then every 2 s
    assert all(1.5 < b - a < 3 for a, b in zip(ordered[1:], ordered[2:])), ordered
