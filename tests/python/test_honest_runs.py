"""A run that cannot do what its config asks says so: through the real CLI, a configured modality
that no line of the input can feed is refused before the output is touched (exit 65, naming the
column it reads and listing the columns the input has), columns nothing reads are named in one
warning, a modality that had inputs and embedded none fails the run (exit 3, whatever
--max-failures says, its most common failure category and an example in the last lines), and
failed samples past the default limit (more than half of them) exit 3 too."""

import csv
import json
import subprocess
from pathlib import Path
from typing import List, Optional

import pytest

from conftest import colour_clip, ffmpeg, file_sha256, read_output, write_manifest
from test_distributed import clean_env


def av_clip(path: Path) -> None:
    """A one-second clip with a video and an audio track."""
    ffmpeg("-f", "lavfi", "-i", "testsrc2=s=64x48:r=25:d=1", "-f", "lavfi", "-i",
           "sine=frequency=440:sample_rate=16000:duration=1", "-c:v", "libx264", "-preset",
           "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(path))


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("honest media")
    for name, colour in [("red", "red"), ("blue", "blue"), ("green", "lime")]:
        colour_clip(root / f"{name}.mp4", [colour])
    for i in range(3):  # the failing probe refuses white frames: every one of these fails
        colour_clip(root / f"white{i}.mp4", ["white"])
    av_clip(root / "av.mp4")
    return root


def config_for(probes: Path, minilm: Path, manifest: Path, out: Path, *modalities: str,
               video_encoder: str = "video_probe.pt") -> dict:
    sections = {
        "video": {"encoder": {"path": str(probes / video_encoder)}, "sampling": {"fps": 1},
                  "size": 32},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "sample_rate": 16000},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm / "vocab.txt")}},
    }
    config = {"input": {"manifest": str(manifest)},
              "output": {"path": str(out), "shard_size": 2},
              "run": {"decode_threads": 2}}
    for m in modalities:
        config[m] = sections[m]
    return config


def run(binary: Path, folder: Path, config: dict, *flags: str,
        expect: Optional[int] = 0) -> subprocess.CompletedProcess:
    path = folder / "config.yaml"
    path.write_text(json.dumps(config, indent=1))
    cmd = [str(binary), "run", "--config", str(path), "--progress-interval", "0", *flags]
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=clean_env(), timeout=300)
    if expect is not None:
        assert r.returncode == expect, f"exit {r.returncode}, expected {expect}\n{r.stderr[-4000:]}"
    return r


def tree(folder: Path):
    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".precompute.lock"}


def warnings(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if "[warning]" in line]


# --------------------------------------------------------------------------------------------
# 1. A modality that no line can feed is refused before any work


@pytest.mark.parametrize("fmt,misspelled,modality", [
    ("jsonl", "vid", "video"), ("jsonl", "caption", "text"),
    ("csv", "caption", "text"), ("tsv", "Vid", "video")])
def test_a_misspelled_column_is_refused_naming_it_and_the_columns_there(
        binary, probes, minilm_folder, media, tmp_path, fmt, misspelled, modality):
    rows = [{"id": f"s{i}", "video": str(media / "red.mp4"), "text": f"caption {i}"}
            for i in range(3)]
    for row in rows:
        row[misspelled] = row.pop(modality)
    columns = list(rows[0])
    if fmt == "jsonl":
        manifest = write_manifest(tmp_path / "m.jsonl", rows)
    else:
        manifest = tmp_path / f"m.{fmt}"
        with open(manifest, "w", newline="") as f:
            writer = csv.writer(f, delimiter="," if fmt == "csv" else "\t")
            writer.writerow(columns)
            writer.writerows([[row[c] for c in columns] for row in rows])
    out = tmp_path / "out"
    config = config_for(probes, minilm_folder, manifest, out, "video", "text")
    r = run(binary, tmp_path, config, expect=65)
    error = r.stderr.strip().splitlines()[-1]
    word = "key" if fmt == "jsonl" else "column"
    assert f"the {modality} section" in error and f"'{modality}' {word}" in error, error
    listed = ", ".join(f"'{c}'" for c in columns)
    assert listed in error, error
    assert f"remove the {modality} section" in error, error
    assert not out.exists(), "a refused run created its output folder"

    # Before the output is touched: an earlier output survives, with --overwrite and as a rank.
    good = config_for(probes, minilm_folder, write_manifest(tmp_path / "good.jsonl", [
        {"id": "g", "video": str(media / "red.mp4"), "text": "a red clip"}]), out, "video", "text")
    run(binary, tmp_path, good)
    before = tree(out)
    for flags in [(), ("--overwrite",), ("--rank", "1", "--world-size", "2")]:
        r = run(binary, tmp_path, config, *flags, expect=65)
        assert listed in r.stderr, (flags, r.stderr[-2000:])
        assert tree(out) == before, flags
    assert not (out / "ranks").exists()


def test_a_line_whose_every_input_key_is_misspelled_lists_its_keys(binary, probes, minilm_folder,
                                                                   media, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "vid": str(media / "red.mp4"), "caption": "a red clip", "label": "cat"}])
    r = run(binary, tmp_path, config_for(probes, minilm_folder, manifest, tmp_path / "out",
                                         "video", "text"), expect=65)
    error = r.stderr.strip().splitlines()[-1]
    assert "line 1: sample 'a' has none of 'video', 'audio', 'text'" in error, error
    assert "the line has the keys 'id', 'vid', 'caption', 'label'" in error, error
    assert not (tmp_path / "out").exists()


def test_a_column_that_is_empty_on_every_line_is_refused(binary, probes, minilm_folder, media,
                                                         tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "video": None, "text": "one"},
        {"id": "b", "video": "", "text": "two"}])
    r = run(binary, tmp_path, config_for(probes, minilm_folder, manifest, tmp_path / "out",
                                         "video", "text"), expect=65)
    error = r.stderr.strip().splitlines()[-1]
    assert "'video' key" in error and "the key is there, but null or empty on every line" in error
    assert "'id', 'video', 'text'" in error, error


def test_a_folder_without_captions_is_refused_under_a_text_section(binary, probes, minilm_folder,
                                                                    media, tmp_path):
    folder = tmp_path / "media"
    folder.mkdir()
    for name in ("red", "blue"):
        (folder / f"{name}.mp4").write_bytes((media / f"{name}.mp4").read_bytes())
    (folder / "notes.txt").write_text("a caption beside no media\n")
    config = config_for(probes, minilm_folder, tmp_path / "unused.jsonl", tmp_path / "out",
                        "video", "text")
    del config["input"]["manifest"]
    config["input"]["folder"] = str(folder)
    r = run(binary, tmp_path, config, expect=65)
    error = r.stderr.strip().splitlines()[-1]
    assert "the text section" in error and "NAME.txt" in error, error
    assert "2 video file(s), 0 audio file(s) and 1 caption file(s)" in error, error
    assert not (tmp_path / "out").exists()
    # The captions added: it runs, and nothing is said to be unused.
    for name in ("red", "blue"):
        (folder / f"{name}.txt").write_text(f"a {name} clip\n")
    (folder / "notes.txt").unlink()
    r = run(binary, tmp_path, config)
    assert not [w for w in warnings(r.stderr) if "not used" in w], warnings(r.stderr)


def test_audio_comes_from_the_video_column(binary, probes, minilm_folder, media, tmp_path):
    """An audio section with no 'audio' column is fed by the video files' tracks."""
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "a", "video": str(media / "av.mp4"), "text": "a test pattern with a tone"},
        {"id": "b", "video": str(media / "av.mp4"), "text": "the same again"}])
    r = run(binary, tmp_path, config_for(probes, minilm_folder, manifest, tmp_path / "out",
                                         "audio", "text"))
    assert not [w for w in warnings(r.stderr) if "not used" in w], warnings(r.stderr)
    output = read_output(tmp_path / "out")
    assert all("audio" in output.samples[i] for i in ("a", "b"))


def test_columns_nothing_reads_are_named_in_one_warning(binary, probes, minilm_folder, media,
                                                        tmp_path):
    manifest = tmp_path / "m.csv"
    with open(manifest, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "video", "audio", "text", "label",
                         b"caf\xe9".decode("utf-8", "surrogateescape")])
        writer.writerow(["a", str(media / "av.mp4"), str(media / "av.mp4"), "one", "cat", "x"])
        writer.writerow(["b", str(media / "red.mp4"), "", "two", "dog", "y"])
    config = config_for(probes, minilm_folder, manifest, tmp_path / "out", "video", "text")
    r = run(binary, tmp_path, config)
    unused = [w for w in warnings(r.stderr) if "not used" in w]
    assert len(unused) == 1, warnings(r.stderr)
    assert "'audio' (the config has no audio section)" in unused[0], unused[0]
    assert "'label'" in unused[0] and "'caf\\xE9'" in unused[0], unused[0]
    assert "'video'" not in unused[0] and "'text'" not in unused[0], unused[0]
    # A kept column is read; so is 'video' by an audio section.
    config = config_for(probes, minilm_folder, manifest, tmp_path / "out2", "audio", "text")
    config["output"]["keep_columns"] = ["label"]
    r = run(binary, tmp_path, config)
    unused = [w for w in warnings(r.stderr) if "not used" in w]
    assert len(unused) == 1 and "'label'" not in unused[0] and "'video'" not in unused[0], unused
    assert "'caf\\xE9'" in unused[0], unused[0]


# --------------------------------------------------------------------------------------------
# 2. A modality that had inputs and embedded none fails the run


def white_and_captions(media: Path, n: int = 3) -> List[dict]:
    return [{"id": f"w{i}", "video": str(media / f"white{i}.mp4"), "text": f"a white clip {i}"}
            for i in range(n)]


def assert_names_the_empty_modality(stderr: str, modality: str, category: str, example: str):
    last = stderr.strip().splitlines()[-1]
    assert f"{modality}: none of the" in last and "was embedded" in last, last
    assert f"most common failure: {category}" in last, last
    assert example in last, last
    assert "embedded nothing" in stderr.strip().splitlines()[-2], stderr[-2000:]


@pytest.mark.parametrize("limit", [None, "-1", "100%", "1000"])
def test_an_encoder_that_fails_on_every_sample_fails_the_run(binary, probes, minilm_folder,
                                                             media, tmp_path, limit):
    manifest = write_manifest(tmp_path / "m.jsonl", white_and_captions(media))
    config = config_for(probes, minilm_folder, manifest, tmp_path / "out", "video", "text",
                        video_encoder="failing_probe.pt")
    flags = ("--max-failures", limit) if limit else ()
    r = run(binary, tmp_path, config, *flags, expect=3)
    assert_names_the_empty_modality(r.stderr, "video", "encode_error", "refuses white frames")
    output = read_output(tmp_path / "out")  # the output is whole all the same
    assert all("text" in output.samples[f"w{i}"] for i in range(3))
    assert {(f["modality"], f["category"]) for f in output.failures} == {
        ("video", "encode_error")}
    # The whole output is judged: a rerun that has nothing to do says the same.
    r = run(binary, tmp_path, config, *flags, expect=3)
    assert "0 to process" in r.stderr
    assert_names_the_empty_modality(r.stderr, "video", "encode_error", "refuses white frames")


def test_a_resume_counts_the_embeddings_of_earlier_shards(binary, probes, minilm_folder, media,
                                                          tmp_path):
    good = [{"id": c, "video": str(media / f"{c}.mp4"), "text": f"a {c} clip"}
            for c in ("red", "blue", "green")]
    manifest = write_manifest(tmp_path / "m.jsonl", good)
    config = config_for(probes, minilm_folder, manifest, tmp_path / "out", "video", "text",
                        video_encoder="failing_probe.pt")
    run(binary, tmp_path, config)
    write_manifest(manifest, good + white_and_captions(media, 2))  # lines appended
    r = run(binary, tmp_path, config)
    assert "to process" in r.stderr and "embedded nothing" not in r.stderr


def test_each_rank_judges_its_own_part(binary, probes, minilm_folder, media, tmp_path):
    """Rank 0 (positions 0, 1) has good clips, rank 1 (2, 3) white ones, rank 2 (4, 5) none."""
    entries = [{"id": c, "video": str(media / f"{c}.mp4"), "text": c} for c in ("red", "blue")]
    entries += white_and_captions(media, 2)
    entries += [{"id": "t0", "text": "text only"}, {"id": "t1", "text": "text only too"}]
    manifest = write_manifest(tmp_path / "m.jsonl", entries)
    config = config_for(probes, minilm_folder, manifest, tmp_path / "out", "video", "text",
                        video_encoder="failing_probe.pt")
    split = ("--world-size", "3", "--max-failures", "-1")
    run(binary, tmp_path, config, "--rank", "0", *split)
    r = run(binary, tmp_path, config, "--rank", "1", *split, expect=3)
    assert_names_the_empty_modality(r.stderr, "video", "encode_error", "refuses white frames")
    run(binary, tmp_path, config, "--rank", "2", *split)  # no video input in its part: fine


# --------------------------------------------------------------------------------------------
# The default failure limit: more than half of the samples


def test_more_than_half_failing_exits_3_by_default(binary, probes, minilm_folder, media,
                                                   tmp_path):
    entries = [{"id": "ok", "video": str(media / "red.mp4"), "text": "a red clip"}]
    entries += [{"id": f"gone{i}", "video": str(media / f"gone{i}.mp4"), "text": "lost"}
                for i in range(2)]
    manifest = write_manifest(tmp_path / "m.jsonl", entries)
    config = config_for(probes, minilm_folder, manifest, tmp_path / "out", "video", "text")
    r = run(binary, tmp_path, config, expect=3)
    assert "2 of 3 samples failed, over the limit" in r.stderr, r.stderr[-2000:]
    assert "embedded nothing" not in r.stderr
    run(binary, tmp_path, config, "--max-failures", "-1")
    # Half is within it.
    write_manifest(manifest, entries + [{"id": "ok2", "video": str(media / "blue.mp4")}])
    run(binary, tmp_path, config, "--overwrite")
