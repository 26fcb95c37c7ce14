"""Settings at and past their bounds, through the real CLI: each is refused before any work with
exit 2 and a message naming the option and its range, and none can overflow a clock, start
100,000 threads or leave every caption without tokens (Note [Config bounds] in
pipeline/core/config_bounds.hpp)."""

import json
import subprocess
import time
from pathlib import Path

import pytest

# Refusals come from validate(), before a model loads or a sample is read: seconds at most,
# whatever the option asked for.
QUICK_S = 30

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world"]


@pytest.fixture()
def config(tmp_path) -> Path:
    """A config that passes validate(): a text-only TorchScript setup whose files exist. The
    model is not a model, so a setting that slipped through would fail later on loading it, with
    a message that names neither the setting nor its range."""
    (tmp_path / "model.pt").write_bytes(b"not loaded: validate() refuses first")
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "a", "text": "hello world"}) + "\n")
    return write_config(tmp_path, "")


def write_config(folder: Path, run_section: str, max_length: str = "") -> Path:
    # YAML text, not JSON: .inf and .nan have no JSON spelling.
    tokenizer = "{vocab: vocab.txt" + (f", max_length: {max_length}" if max_length else "") + "}"
    path = folder / "config.yaml"
    path.write_text(
        "input: {manifest: m.jsonl}\n"
        "output: {path: out}\n"
        f"run: {{{run_section}}}\n"
        "text: {encoder: {path: model.pt}, pooling: model, tokenizer: " + tokenizer + "}\n")
    return path


def precompute(binary: Path, *args: str) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run([str(binary), *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=QUICK_S)
    assert time.monotonic() - started < QUICK_S
    return result


def assert_refused(result: subprocess.CompletedProcess, *mentions: str) -> None:
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    for text in mentions:
        assert text in result.stderr, f"{text!r} not in:\n{result.stderr[-4000:]}"
    assert "progress:" not in result.stderr


@pytest.mark.parametrize("value", ["1e10", "1e300", "86401", "0.0001"])
def test_progress_interval_out_of_range_is_refused(binary, config, value):
    r = precompute(binary, "run", "--config", str(config), "--progress-interval", value)
    assert_refused(r, "--progress-interval", "run.progress_interval_s", "86400")


def test_an_infinite_progress_interval_is_refused(binary, config):
    # The flag's own check refuses it while parsing, before the config is read.
    r = precompute(binary, "run", "--config", str(config), "--progress-interval", "inf")
    assert_refused(r, "--progress-interval")


@pytest.mark.parametrize("flag,value,limit", [
    ("--decode-threads", "100000", "1024"),
    ("--decode-threads", "1025", "1024"),
    ("--torch-threads", "100000", "1024"),
    ("--batch-size", "100000", "65536"),
    ("--shard-size", "99999999999", "1000000000"),
])
def test_counts_out_of_range_are_refused(binary, config, flag, value, limit):
    r = precompute(binary, "run", "--config", str(config), flag, value)
    assert_refused(r, flag, limit)


@pytest.mark.parametrize("key,value,limit", [
    ("sample_timeout_s", ".inf", "604800"),
    ("sample_timeout_s", "1e10", "604800"),
    ("sample_timeout_s", ".nan", "604800"),
    ("sample_timeout_s", "0", "604800"),
    ("progress_interval_s", "1e300", "86400"),
    ("decode_threads", "99999999999", "1024"),
    ("decode_threads", "1e10", "1024"),
    ("max_restarts", "-1", "1000"),
    ("world_size", "-1", "100000"),
    ("world_size", "100001", "100000"),
    ("world_size", "1e10", "100000"),
])
def test_run_keys_out_of_range_are_refused(binary, config, key, value, limit):
    write_config(config.parent, f"{key}: {value}")
    r = precompute(binary, "run", "--config", str(config))
    assert_refused(r, f"run.{key}", limit)


def test_a_max_length_without_room_for_a_token_is_refused(binary, config):
    vocab = config.parent / "vocab.txt"
    r = precompute(binary, "tokenize", "--vocab", str(vocab), "--max-length", "2", "hello")
    assert_refused(r, "--max-length", "65536")
    write_config(config.parent, "", max_length="2")
    r = precompute(binary, "tokenize", "--config", str(config), "hello")
    assert_refused(r, "text.tokenizer.max_length", "from 3 to")
    r = precompute(binary, "run", "--config", str(config))
    assert_refused(r, "text.tokenizer.max_length", "65536")


def test_the_shortest_max_length_keeps_one_token(binary, config):
    vocab = config.parent / "vocab.txt"
    r = precompute(binary, "tokenize", "--vocab", str(vocab), "--max-length", "3", "--json",
                   "hello world")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["tokens"] == ["[CLS]", "hello", "[SEP]"] and shown["truncated"]
