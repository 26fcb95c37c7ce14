"""The GPU media benchmarks' CPU smoke modes, end to end on tiny inputs made with the ffmpeg CLI:
tools/bench/audio_throughput.py --quick (whole tracks, precompute against torchcodec's
AudioDecoder) and tools/bench/multimodal_job.py --quick (video + audio + text in one job against
the torchcodec + DataLoader + h5py equivalent). Each run must exit 0, report positive throughput
for precompute and, when torchcodec can be imported (installed, or its folder in
PEER_PYTHONPATH), for the peer too, with the parity the scripts compute."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

BENCH = ROOT / "tools" / "bench"


def peer_available() -> bool:
    if importlib.util.find_spec("torchcodec") is not None:
        return True
    path = os.environ.get("PEER_PYTHONPATH", "")
    return bool(path) and (Path(path) / "torchcodec").is_dir()


def run_quick(script: str, binary: Path, tmp_path: Path) -> dict:
    if shutil.which("ffmpeg") is None:
        pytest.skip("the ffmpeg CLI makes the test media")
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH / script), "--quick", "--binary", str(binary),
           "--work", str(tmp_path / "work"), "--out", str(out)]
    if not peer_available():
        cmd.append("--no-peer")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, \
        f"{script} exit {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return json.loads((out / script.replace(".py", ".json").replace("_throughput", "_bench"))
                      .read_text())


def check_rows(report: dict, key: str) -> None:
    assert report["failed"] == 0
    who = [r["who"] for r in report["results"]]
    assert who[0].startswith("precompute")
    assert len(who) == (2 if peer_available() else 1), who
    for r in report["results"]:
        assert r[f"whole_{key}_per_s"] > 0 and r[f"run_{key}_per_s"] >= r[f"whole_{key}_per_s"]
        assert r["peak_rss_mib"] > 50


def test_audio_quick(binary, tmp_path):
    report = run_quick("audio_throughput.py", binary, tmp_path)
    check_rows(report, "tracks")
    assert report["workload"]["tracks"] == 16 and report["workload"]["window_s"] == 0
    r = report["results"][0]
    assert r["whole_audio_h_per_s"] == pytest.approx(
        r["whole_tracks_per_s"] * report["workload"]["audio_hours"] / 16, rel=0.02)
    if peer_available():
        parity = report["parity"]
        assert parity["ok"] and parity["compared"] == 16 and parity["min"] >= 0.99, parity


def test_multimodal_quick(binary, tmp_path):
    report = run_quick("multimodal_job.py", binary, tmp_path)
    check_rows(report, "samples")
    assert report["workload"]["samples"] == 6
    if peer_available():
        for modality, p in report["parity"].items():
            assert p["compared"] == 6, (modality, p)
            assert p["min"] >= 0.99, (modality, p)
