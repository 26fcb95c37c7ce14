"""Hostile ids and paths through the real CLI (docs/usage.md, "Input" and "Bad input"): ids that HDF5 or
h5py cannot hold (a NUL, bytes that are not UTF-8) are refused before any work with exit 65
naming the manifest line or the file; paths are bytes and work whatever they hold; an empty
input is refused; look-alike ids and link loops in an input folder are warned about, not fatal.

Paths with byte 0xff are made with os.fsdecode (surrogateescape) on the Python side and passed
to the CLI as flags or inside a CSV manifest: JSON, and so the YAML config, cannot hold them."""

import json
import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import colour_clip, read_output, write_manifest

EXIT_INVALID_INPUT = 65


def name(raw: bytes) -> str:
    """A file name holding exactly `raw`, as Python spells bytes that are not UTF-8."""
    return os.fsdecode(raw)


def text_config(probes, minilm_folder, manifest: Path, out: Path) -> dict:
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out)},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}},
    }


def with_video(config: dict, probes) -> dict:
    config["video"] = {"encoder": {"path": str(probes / "video_probe.pt")},
                       "sampling": {"fps": 1}, "size": 32}
    return config


def run(binary, tmp: Path, config: dict, *flags, expect: int):
    """`precompute run`, its output kept as bytes: messages quote paths that are not UTF-8."""
    config_path = tmp / "config.yaml"
    config_path.write_text(json.dumps(config, indent=1))
    cmd = [str(binary), "run", "--config", str(config_path), "--progress-interval", "0", *flags]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == expect, f"exit {result.returncode}, expected {expect}\n{stderr}"
    return stderr


def inspect(binary, out: Path, *flags) -> str:
    result = subprocess.run([str(binary), "inspect", str(out), *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, timeout=120)
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")
    return result.stdout.decode("utf-8", "replace")


def test_a_nul_in_an_id_exits_65_naming_the_line(binary, probes, minilm_folder, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "text": "fine"},
                                                     {"id": "b\u0000c", "text": "hostile"}])
    out = tmp_path / "out"
    stderr = run(binary, tmp_path, text_config(probes, minilm_folder, manifest, out),
                 expect=EXIT_INVALID_INPUT)
    assert "m.jsonl" in stderr and "line 2: the id 'b\\x00c' contains a NUL character" in stderr
    assert not out.exists(), "the id must be refused before any work"


def test_a_nul_in_a_media_path_exits_65_naming_the_line(binary, probes, minilm_folder,
                                                        tmp_path):
    colour_clip(tmp_path / "a.mp4", ["red"])
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "a", "video": "a.mp4\u0000.txt"}])
    config = with_video(text_config(probes, minilm_folder, manifest, tmp_path / "out"), probes)
    stderr = run(binary, tmp_path, config, expect=EXIT_INVALID_INPUT)
    assert "m.jsonl line 1: the 'video' path" in stderr and "a.mp4\\x00.txt" in stderr


def test_a_nul_in_a_caption_is_dropped_by_the_tokenizer(binary, probes, minilm_folder,
                                                        tmp_path):
    # Captions never become HDF5 strings: the tokenizer drops NUL as it drops every control
    # character (as BERT's clean-up does), so the caption embeds as if the NUL were not there.
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "nul", "text": "a red\u0000 clip"},
                                                     {"id": "plain", "text": "a red clip"}])
    out = tmp_path / "out"
    run(binary, tmp_path, text_config(probes, minilm_folder, manifest, out), expect=0)
    samples = read_output(out).samples
    np.testing.assert_array_equal(samples["nul"]["text"]["vector"],
                                  samples["plain"]["text"]["vector"])


def test_an_id_that_is_not_utf8_exits_65_naming_the_line(binary, probes, minilm_folder,
                                                         tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(b"id,text\nok,fine\nbad\xffid,hostile\n")
    out = tmp_path / "out"
    stderr = run(binary, tmp_path, text_config(probes, minilm_folder, manifest, out),
                 expect=EXIT_INVALID_INPUT)
    assert "m.csv line 3: the id 'bad\\xFFid' is not valid UTF-8" in stderr
    assert not out.exists()


def test_a_media_file_name_that_is_not_utf8_exits_65_naming_it(binary, probes, minilm_folder,
                                                               tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    colour_clip(folder / "good.mp4", ["red"])
    colour_clip(folder / name(b"bad\xffname.mp4"), ["blue"])
    config = with_video(text_config(probes, minilm_folder, tmp_path / "unused.jsonl",
                                    tmp_path / "out"), probes)
    stderr = run(binary, tmp_path, config, "--input", str(folder), expect=EXIT_INVALID_INPUT)
    assert "the file name 'bad\\xFFname.mp4' is not valid UTF-8" in stderr
    assert "rename the file" in stderr


def test_paths_that_are_not_utf8_work_end_to_end(binary, probes, minilm_folder, tmp_path):
    # Manifest folder, media file and output folder all hold byte 0xff; the run must open the
    # real bytes, and JSON (index.json, inspect --json) shows them as U+FFFD.
    folder = tmp_path / name(b"in\xffput")
    folder.mkdir()
    colour_clip(folder / name(b"clip\xff.mp4"), ["red", "blue"])
    manifest = folder / "m.csv"
    manifest.write_bytes(b"id,video,text\n"
                         b"clip,clip\xff.mp4,a red then blue clip\n"
                         b"gone,gone\xff.mp4,a clip that is missing\n")
    out = tmp_path / name(b"out\xff")
    config = with_video(text_config(probes, minilm_folder, tmp_path / "unused.csv",
                                    tmp_path / "unused-out"), probes)
    run(binary, tmp_path, config, "--input", str(manifest), "--output", str(out), expect=0)

    output = read_output(out)
    assert set(output.samples) == {"clip", "gone"}
    assert {"video", "text"} <= set(output.samples["clip"])
    assert "text" in output.samples["gone"] and "video" not in output.samples["gone"]
    [failure] = output.failures
    assert failure["id"] == "gone" and failure["category"] == "missing"
    assert "gone\ufffd.mp4" in failure["message"]  # readable with h5py's asstr()
    assert output.index["input"].endswith("in\ufffdput/m.csv")
    with h5py.File(out / output.index["shards"][0]["file"], "r") as f:
        assert list(f["ids"].asstr()[:]) == ["clip", "gone"]

    assert "2 of 2 samples" in inspect(binary, out)
    report = json.loads(inspect(binary, out, "--json"))
    assert report["ok"] and report["output"].endswith("out\ufffd")
    assert report["failures"][0]["id"] == "gone"
    # A rerun finds its output and resumes: the stored paths are only for people.
    stderr = run(binary, tmp_path, config, "--input", str(manifest), "--output", str(out),
                 expect=0)
    assert "2 of 2 samples are in committed shards; 0 to process" in stderr


@pytest.mark.parametrize("kind", ["jsonl", "csv", "folder"])
def test_an_empty_input_exits_65(binary, probes, minilm_folder, tmp_path, kind):
    if kind == "jsonl":
        source = tmp_path / "m.jsonl"
        source.write_text("\n\n")
        expected = "holds no samples"
    elif kind == "csv":
        source = tmp_path / "m.csv"
        source.write_text("id,video,text\n")
        expected = "holds no samples"
    else:
        source = tmp_path / "media"
        source.mkdir()
        (source / "orphan.txt").write_text("a caption with no clip")
        expected = "holds no video or audio file"
    out = tmp_path / "out"
    config = text_config(probes, minilm_folder, tmp_path / "unused.jsonl", out)
    stderr = run(binary, tmp_path, config, "--input", str(source), expect=EXIT_INVALID_INPUT)
    assert expected in stderr and str(source) in stderr
    assert not out.exists()


def test_look_alike_ids_are_kept_with_a_warning(binary, probes, minilm_folder, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "caf\u00e9", "text": "NFC"},
                                                     {"id": "cafe\u0301", "text": "NFD"}])
    out = tmp_path / "out"
    stderr = run(binary, tmp_path, text_config(probes, minilm_folder, manifest, out), expect=0)
    assert "(line 1) and 'cafe\u0301' (line 2) differ only in Unicode normalization" in stderr
    assert set(read_output(out).samples) == {"caf\u00e9", "cafe\u0301"}


def test_a_link_loop_in_an_input_folder_is_skipped(binary, probes, minilm_folder, tmp_path):
    folder = tmp_path / "media"
    (folder / "sub").mkdir(parents=True)
    colour_clip(folder / "sub" / "x.mp4", ["lime"])
    (folder / "sub" / "x.txt").write_text("a green clip\n")  # the config's text section reads it
    (folder / "sub" / "loop").symlink_to(folder)
    (folder / "self.mp4").symlink_to("self.mp4")
    config = with_video(text_config(probes, minilm_folder, tmp_path / "unused.jsonl",
                                    tmp_path / "out"), probes)
    stderr = run(binary, tmp_path, config, "--input", str(folder), expect=0)
    assert f"skipped '{folder / 'sub' / 'loop'}': it leads to a folder already scanned" in stderr
    assert f"skipped '{folder / 'self.mp4'}'" in stderr
    assert set(read_output(tmp_path / "out").samples) == {"sub/x"}
