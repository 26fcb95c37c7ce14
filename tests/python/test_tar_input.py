"""WebDataset tar shards as input, read in place (Note [Tar members read in place] in
pipeline/input/tar_index.cpp), end to end with the real binary:

- the same clips and captions packed into tars (GNU, PAX and ustar formats, a long member name,
  members in a subfolder) give exactly the embeddings of a manifest run over the files;
- --input takes a brace range, one .tar or a folder of tars; verify takes the same argument;
- kill -9 mid-run, then the same command, equals a clean run;
- hostile members (links, a device, '../' and absolute names, one over run.max_file_bytes) are
  each recorded as their sample's failure naming TAR:MEMBER, the rest embedded;
- damaged or unusable shards are refused with exit 65 naming the tar (a bad header checksum, a
  truncated tar, a compressed shard, a key in two tars, a shard of a range that is missing);
- a tar of 10,000 small members is indexed quickly.
"""

import io
import os
import json
import signal
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import List

import numpy as np
import pytest

from conftest import (assert_same_output, failures_by_id, ffmpeg, read_output, run_precompute,
                      write_manifest)

COLOURS = ["red", "blue", "lime", "yellow", "white", "cyan", "magenta", "orange"]
LONG_DIR = "a-folder-whose-name-is-long-enough/" + "x" * 80


def av_clip(path: Path, colour: str, frequency: int) -> None:
    """A 2 s clip with a video and an audio track."""
    ffmpeg("-f", "lavfi", "-i", f"color=c={colour}:s=64x48:r=10:d=2",
           "-f", "lavfi", "-i", f"sine=frequency={frequency}:sample_rate=16000:duration=2",
           "-c:v", "libx264", "-qp", "0", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest",
           str(path))


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tar-media")
    for i, colour in enumerate(COLOURS):
        av_clip(root / f"clip{i}.mp4", colour, 300 + 100 * i)
    return root


def key_of(i: int) -> str:
    # One sample lives under a long folder name: GNU and PAX tars need their long-name records.
    return f"{LONG_DIR}/clip{i}" if i == 5 else f"clip{i}"


def caption(i: int) -> str:
    return f"clip {i} shows {COLOURS[i]}"


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes, **fields) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in fields.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data))


def write_tar(path: Path, media: Path, indices: List[int], fmt=tarfile.GNU_FORMAT) -> Path:
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in indices:
            tar.add(media / f"clip{i}.mp4", arcname=f"{key_of(i)}.mp4")
            add_bytes(tar, f"{key_of(i)}.txt", caption(i).encode() + b"\n")
            add_bytes(tar, f"{key_of(i)}.json", json.dumps({"i": i}).encode())
    return path


def config(out: Path, probes: Path, minilm: Path, **input_section) -> dict:
    return {
        "input": input_section,
        "output": {"path": str(out), "shard_size": 3},
        "run": {"device": "cpu"},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")}, "sampling": {"fps": 2},
                  "size": [32, 32]},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "window_s": 1.0},
        "text": {"encoder": {"type": "bert", "path": str(minilm)}},
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory, media) -> Path:
    root = tmp_path_factory.mktemp("tar-shards")
    write_tar(root / "000000.tar", media, [0, 1, 2], tarfile.GNU_FORMAT)
    write_tar(root / "000001.tar", media, [3, 4, 5], tarfile.PAX_FORMAT)
    write_tar(root / "000002.tar", media, [6, 7], tarfile.USTAR_FORMAT)
    return root


def assert_same_embeddings(a: Path, b: Path) -> None:
    x, y = read_output(a), read_output(b)
    assert x.ids_in_order == y.ids_in_order
    assert x.failures == y.failures
    for sample_id, want in x.samples.items():
        got = y.samples[sample_id]
        for m in ("video", "audio", "text"):
            assert (m in want) == (m in got), (sample_id, m)
            if m not in want:
                continue
            for field in ("vector", "rows", "timestamps"):
                if field in want[m]:
                    np.testing.assert_array_equal(want[m][field], got[m][field])


def test_tars_embed_exactly_as_the_same_files_through_a_manifest(binary, probes, minilm_folder,
                                                                 media, shards, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": key_of(i), "video": str(media / f"clip{i}.mp4"), "text": caption(i)}
        for i in range(len(COLOURS))])
    from_files = tmp_path / "files"
    run_precompute(binary, tmp_path, config(from_files, probes, minilm_folder,
                                            manifest=str(manifest)))
    from_tars = tmp_path / "tars"
    r = run_precompute(binary, tmp_path, config(from_tars, probes, minilm_folder,
                                                tars=str(shards / "{000000..000002}.tar")))
    assert "input: 8 samples" in r.stderr
    out = read_output(from_tars)
    assert out.ids_in_order == [key_of(i) for i in range(len(COLOURS))]
    assert out.failures == []
    assert all(set(s) >= {"video", "audio", "text"} for s in out.samples.values())
    assert_same_embeddings(from_files, from_tars)


@pytest.mark.parametrize("form", ["range", "folder", "list"])
def test_input_flag_takes_a_range_a_folder_or_a_list(binary, probes, minilm_folder, shards,
                                                     tmp_path, form):
    argument = {"range": shards / "{000000..000002}.tar", "folder": shards,
                "list": shards / "00000{0,1,2}.tar"}[form]
    cfg = config(tmp_path / "out", probes, minilm_folder, manifest="unused.jsonl")
    del cfg["input"]
    r = run_precompute(binary, tmp_path, cfg, "--input", str(argument))
    assert "input: 8 samples" in r.stderr
    v = subprocess.run([str(binary), "verify", str(tmp_path / "out"), "--input", str(argument)],
                       capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


def test_one_tar_alone(binary, probes, minilm_folder, shards, tmp_path):
    r = run_precompute(binary, tmp_path, config(tmp_path / "out", probes, minilm_folder,
                                                tars=str(shards / "000001.tar")))
    assert "input: 3 samples" in r.stderr
    assert read_output(tmp_path / "out").ids_in_order == [key_of(i) for i in (3, 4, 5)]


def test_a_list_of_tars_reads_them_in_its_order(binary, probes, minilm_folder, shards, tmp_path):
    # input.tars as a YAML list: entries in the order given, each a tar, a folder or a range, a
    # relative one from the config file's folder.
    shutil.copy(shards / "000002.tar", tmp_path / "local.tar")
    listed = ["local.tar", str(shards / "{000000..000001}.tar")]
    out = tmp_path / "listed"
    r = run_precompute(binary, tmp_path, config(out, probes, minilm_folder, tars=listed))
    assert "input: 8 samples" in r.stderr
    got = read_output(out)
    assert got.ids_in_order == [key_of(i) for i in (6, 7, 0, 1, 2, 3, 4, 5)]
    assert got.index["input"] == f"{tmp_path / 'local.tar'}, {listed[1]}"
    # verify takes the list as --input given once per entry, in order.
    v = subprocess.run([str(binary), "verify", str(out), "--input", str(tmp_path / "local.tar"),
                        "--input", listed[1]], capture_output=True, text=True)
    assert v.returncode == 0 and "8 of 8 ids accounted for" in v.stdout, v.stdout + v.stderr
    v = subprocess.run([str(binary), "verify", str(out), "--input", listed[1], "--input",
                        str(tmp_path / "local.tar")], capture_output=True, text=True)
    assert v.returncode != 0 and "other input samples" in v.stdout, v.stdout + v.stderr
    v = subprocess.run([str(binary), "verify", str(out), "--input", str(tmp_path / "local.tar"),
                        "--input", str(tmp_path / "m.jsonl")], capture_output=True, text=True)
    assert v.returncode == 2 and "names no .tar" in v.stderr, v.stdout + v.stderr
    v = subprocess.run([str(binary), "verify", str(out), "--input", ""], capture_output=True,
                       text=True)
    assert v.returncode == 2 and "--input is empty" in v.stderr, v.stdout + v.stderr
    # Run again: the output is complete and stays as it is.
    before = (out / "index.json").read_bytes()
    run_precompute(binary, tmp_path, config(out, probes, minilm_folder, tars=listed))
    assert (out / "index.json").read_bytes() == before

    # A tar named twice, here once by itself and once through its folder, is refused naming both.
    r = run_precompute(binary, tmp_path, config(tmp_path / "twice", probes, minilm_folder,
                                                tars=[str(shards / "000001.tar"), str(shards)]),
                       expect=65)
    assert "input.tars names the tar" in r.stderr and "000001.tar" in r.stderr, r.stderr[-2000:]
    assert "in entry 0" in r.stderr and "in entry 1" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "twice" / "index.json").exists()
    r = run_precompute(binary, tmp_path, config(tmp_path / "none", probes, minilm_folder,
                                                tars=[]), expect=2)
    assert "'input.tars' lists no path" in r.stderr, r.stderr[-2000:]


def test_kill_then_resume_equals_a_clean_run(binary, probes, minilm_folder, shards, tmp_path):
    pattern = str(shards / "{000000..000002}.tar")
    clean = tmp_path / "clean"
    run_precompute(binary, tmp_path, config(clean, probes, minilm_folder, tars=pattern))
    out = tmp_path / "resumed"
    cfg = config(out, probes, minilm_folder, tars=pattern)
    r = run_precompute(binary, tmp_path, cfg, "--no-supervisor", expect=None,
                       env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@2"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    r = run_precompute(binary, tmp_path, cfg)
    assert "resum" in r.stderr.lower()
    assert_same_embeddings(clean, out)


def test_hostile_members_are_recorded_as_their_samples_failures(binary, probes, minilm_folder,
                                                                 media, tmp_path):
    tar_path = tmp_path / "hostile.tar"
    clip = (media / "clip0.mp4").read_bytes()
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        add_bytes(tar, "good.mp4", clip)
        add_bytes(tar, "good.txt", b"a good caption")
        for name, kind in [("soft.mp4", tarfile.SYMTYPE), ("hard.mp4", tarfile.LNKTYPE)]:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "good.mp4"
            tar.addfile(info)
        device = tarfile.TarInfo("device.mp4")
        device.type = tarfile.CHRTYPE
        device.devmajor, device.devminor = 1, 3
        tar.addfile(device)
        add_bytes(tar, "../up.mp4", clip)
        add_bytes(tar, "/abs.mp4", clip)
        add_bytes(tar, "big.mp4", clip + b"\0" * 4096)
        add_bytes(tar, "noise.mp4", b"\x00\x01 not a video at all" * 100)
    cfg = config(tmp_path / "out", probes, minilm_folder, tars=str(tar_path))
    cfg["run"]["max_file_bytes"] = len(clip) + 100
    cfg["run"]["max_failures"] = 100
    run_precompute(binary, tmp_path, cfg)
    out = read_output(tmp_path / "out")
    failed = failures_by_id(out)
    assert "video" in out.samples["good"] and "text" in out.samples["good"]
    expect = {"soft": "unreadable", "hard": "unreadable", "device": "unreadable",
              "../up": "unreadable", "/abs": "unreadable", "big": "too_large",
              "noise": "decode_error"}
    assert {k: v["video"] for k, v in failed.items()} == expect
    messages = {f["id"]: f["message"] for f in out.failures if f["modality"] == "video"}
    for key in expect:
        assert f"hostile.tar:{key}.mp4" in messages[key], messages[key]
    assert "symbolic link" in messages["soft"] and "hard link" in messages["hard"]
    assert "'..'" in messages["../up"] and "absolute" in messages["/abs"]
    # Audio comes from the video member's track, so it fails alike, never silently.
    assert {k: v.get("audio") for k, v in failed.items()} == expect


def damaged_copy(shards: Path, tmp: Path, edit) -> Path:
    data = bytearray((shards / "000000.tar").read_bytes())
    data = edit(data)
    path = tmp / "damaged.tar"
    path.write_bytes(bytes(data))
    return path


def second_header(data: bytearray) -> int:
    """The offset of the tar's second header (after the first member's data)."""
    size = int(bytes(data[124:136]).rstrip(b"\0 ") or b"0", 8)
    return 512 + (size + 511) // 512 * 512


def flip_checksummed_byte(data: bytearray) -> bytearray:
    at = second_header(data)
    data[at + 10] ^= 0x01  # inside the name: the header's checksum no longer matches
    return data


@pytest.mark.parametrize("damage,expect", [
    (flip_checksummed_byte, "checksum is wrong"),
    (lambda d: d[:len(d) // 2], "truncated"),
    (lambda d: d[:second_header(d) + 100], "ends inside a header"),
])
def test_a_damaged_tar_is_refused_naming_the_tar_and_the_place(binary, probes, minilm_folder,
                                                               shards, tmp_path, damage, expect):
    path = damaged_copy(shards, tmp_path, damage)
    r = run_precompute(binary, tmp_path, config(tmp_path / "out", probes, minilm_folder,
                                                tars=str(path)), expect=65)
    assert expect in r.stderr and "damaged.tar" in r.stderr and "at byte" in r.stderr, r.stderr


def test_unusable_shard_lists_are_refused_with_the_fix(binary, probes, minilm_folder, media,
                                                       shards, tmp_path):
    def refused(tars: str) -> str:
        r = run_precompute(binary, tmp_path, config(tmp_path / "out", probes, minilm_folder,
                                                    tars=tars), expect=65)
        return r.stderr

    gz = tmp_path / "000000.tar.gz"
    gz.write_bytes(b"\x1f\x8b not really")
    assert "gunzip -k" in refused(str(gz))
    missing = refused(str(shards / "{000000..000003}.tar"))
    assert "000003.tar" in missing and "No such file" in missing
    again = write_tar(tmp_path / "again.tar", media, [1])
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "a.tar").write_bytes((shards / "000000.tar").read_bytes())
    (tmp_path / "set" / "b.tar").write_bytes(again.read_bytes())
    message = refused(str(tmp_path / "set"))
    assert "'clip1'" in message and "a.tar" in message and "b.tar" in message
    assert "backwards" in refused(str(shards / "{000002..000000}.tar"))


def test_ten_thousand_members_index_in_seconds(binary, probes, minilm_folder, media, tmp_path):
    tar_path = tmp_path / "many.tar"
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(media / "clip0.mp4", arcname="only.mp4")
        add_bytes(tar, "only.txt", b"the one sample")
        for i in range(10_000):
            add_bytes(tar, f"k{i:05d}.cls", b"%d" % i)
    cfg = config(tmp_path / "out", probes, minilm_folder, tars=str(tar_path))
    summary = tmp_path / "summary.json"
    r = run_precompute(binary, tmp_path, cfg, "--summary-json", str(summary))
    assert "input: 1 samples" in r.stderr
    steps = json.loads(summary.read_text())["start_up"]
    k = next(i for i, s in enumerate(steps) if s["step"] == "input checked")
    seconds = steps[k]["at_s"] - (steps[k - 1]["at_s"] if k else 0.0)
    # 10,001 headers read one by one, members skipped: well under a second on a local disk.
    assert seconds < 3, steps


def test_the_webdataset_example_packs_runs_and_trains(binary, probes, minilm_folder, media,
                                                       tmp_path):
    """examples/webdataset_shards.py packs a manifest into shards, precompute reads them with
    the command its docstring gives, and examples/train_fusion.py trains on the output; the
    reader's rows carry the shards' keys as ids."""
    from conftest import ROOT
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": f"clip{i}", "video": str(media / f"clip{i}.mp4"), "text": caption(i),
         "label": i % 2} for i in range(len(COLOURS))] + [{"id": "gone", "video": "none.mp4"}])
    shards = tmp_path / "shards"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "webdataset_shards.py"),
                        str(manifest), str(shards), "--shards", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "8 samples in 3 shards" in r.stdout and "left out (media missing): gone" in r.stdout
    with tarfile.open(shards / "000000.tar") as tar:
        assert tar.getnames()[:3] == ["clip0.mp4", "clip0.txt", "clip0.json"]
    cfg = config(tmp_path / "x", probes, minilm_folder, manifest="unused.jsonl")
    del cfg["input"]
    run_precompute(binary, tmp_path, cfg, "--input", str(shards / "{000000..000002}.tar"),
                   "--output", str(tmp_path / "out"))
    from precompute import ShardDataset
    ids = [ShardDataset(tmp_path / "out")[k]["id"] for k in range(len(COLOURS))]
    assert sorted(ids) == sorted(f"clip{i}" for i in range(len(COLOURS)))
    metrics = tmp_path / "metrics.json"
    t = subprocess.run([sys.executable, str(ROOT / "examples" / "train_fusion.py"),
                        str(tmp_path / "out"), "--device", "cpu", "--epochs", "2",
                        "--batch-size", "4", "--workers", "0", "--metrics", str(metrics)],
                       capture_output=True, text=True, timeout=600)
    assert t.returncode == 0, t.stderr[-3000:]
    assert len(json.loads(metrics.read_text())["epochs"]) == 2


@pytest.mark.parametrize("form", ["range", "list"])
def test_four_ranks_and_their_merge_equal_one_process(binary, probes, minilm_folder, shards,
                                                      tmp_path, form):
    # The same tars as one range, or as a list of a tar and a range (input.tars).
    tars = ([str(shards / "{000000..000002}.tar")] if form == "range" else
            [str(shards / "000000.tar"), str(shards / "{000001..000002}.tar")])
    key = tars[0] if form == "range" else tars
    one = tmp_path / "one"
    run_precompute(binary, tmp_path, config(one, probes, minilm_folder, tars=key))
    out = tmp_path / "ranks"
    cfg = config(out, probes, minilm_folder, tars=key)
    for rank in (2, 0, 3, 1):
        r = run_precompute(binary, tmp_path, cfg, "--rank", str(rank), "--world-size", "4")
    assert f"merged 4 rank(s) into {out}" in r.stderr
    assert_same_embeddings(one, out)
    inputs = [flag for tar in tars for flag in ("--input", tar)]
    v = subprocess.run([str(binary), "verify", str(out), *inputs], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


def test_kept_columns_come_from_the_json_members(binary, probes, minilm_folder, media, shards,
                                                 tmp_path):
    pattern = str(shards / "{000000..000002}.tar")
    cfg = config(tmp_path / "out", probes, minilm_folder, tars=pattern)
    cfg["output"]["keep_columns"] = ["i"]
    run_precompute(binary, tmp_path, cfg)
    import h5py
    values = {}
    for shard in sorted((tmp_path / "out").glob("shard-*.h5")):
        with h5py.File(shard) as f:
            values.update(zip(f["ids"].asstr()[:], f["columns/i"].asstr()[:]))
    assert values == {key_of(i): str(i) for i in range(len(COLOURS))}
    v = subprocess.run([str(binary), "verify", str(tmp_path / "out"), "--input", pattern],
                       capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr

    cfg["output"]["keep_columns"] = ["label"]
    r = run_precompute(binary, tmp_path, cfg, "--overwrite", expect=65)
    assert "no sample's .json member has the field 'label'" in r.stderr
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        tar.add(media / "clip0.mp4", arcname="k.mp4")
        add_bytes(tar, "k.json", b'{"i": 1, "i": 2}')
    cfg = config(tmp_path / "out2", probes, minilm_folder, tars=str(bad))
    cfg["output"]["keep_columns"] = ["i"]
    r = run_precompute(binary, tmp_path, cfg, expect=65)
    assert "member 'k.json'" in r.stderr and "appears twice" in r.stderr


def test_a_member_that_crashes_the_decoder_is_pinned_on_its_sample(binary, probes, minilm_folder,
                                                                    shards, tmp_path):
    """The supervisor's crash containment with tar input: a decoder that crashes on one member
    (a test fault keyed on TAR:MEMBER) restarts the run, which records that sample as crashed and
    embeds the others as a clean run does."""
    pattern = str(shards / "{000000..000002}.tar")
    clean = tmp_path / "clean"
    run_precompute(binary, tmp_path, config(clean, probes, minilm_folder, tars=pattern))
    out = tmp_path / "out"
    r = run_precompute(binary, tmp_path, config(out, probes, minilm_folder, tars=pattern),
                       "--max-failures", "10",
                       env={"PRECOMPUTE_TEST_DECODER_FAULT": "crash:000001.tar:clip4.mp4"})
    assert "the run died (" in r.stderr
    got, want = read_output(out), read_output(clean)
    assert failures_by_id(got) == {"clip4": {"video": "crash", "audio": "crash"}}
    assert got.ids_in_order == want.ids_in_order
    for key, sample in want.samples.items():
        if key == "clip4":
            continue
        for m in ("video", "audio", "text"):
            field = "vector" if "vector" in sample[m] else "rows"
            np.testing.assert_array_equal(got.samples[key][m][field], sample[m][field])


def test_a_range_the_shell_expanded_gets_a_hint_to_quote_it(binary, shards):
    """`--input shards/{000000..000002}.tar` unquoted reaches precompute as three arguments."""
    r = subprocess.run([str(binary), "run", "--input", *(str(p) for p in
                        sorted(shards.glob("*.tar"))), "--output", "/nonexistent/out"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Quote it, as in --input 'shards/{000000..000099}.tar'" in r.stderr, r.stderr


def test_an_audio_member_feeds_audio_in_place_of_the_video_track(binary, probes, minilm_folder,
                                                                  media, tmp_path):
    """KEY.wav beside KEY.mp4 is the sample's audio (the clip's own track is not read); a key
    with only KEY.flac is an audio sample; its embedding equals the same file's via a manifest."""
    sine = tmp_path / "tone.flac"
    ffmpeg("-f", "lavfi", "-i", "sine=frequency=1000:sample_rate=16000:duration=2", str(sine))
    tar_path = tmp_path / "av.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(media / "clip0.mp4", arcname="both.mp4")
        tar.add(sine, arcname="both.flac")
        tar.add(sine, arcname="sound.flac")
        add_bytes(tar, "sound.txt", b"a tone")
    cfg = config(tmp_path / "tars", probes, minilm_folder, tars=str(tar_path))
    run_precompute(binary, tmp_path, cfg)
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "both", "video": str(media / "clip0.mp4"), "audio": str(sine)},
        {"id": "sound", "audio": str(sine), "text": "a tone"}])
    run_precompute(binary, tmp_path, config(tmp_path / "files", probes, minilm_folder,
                                            manifest=str(manifest)))
    assert_same_embeddings(tmp_path / "files", tmp_path / "tars")
    out = read_output(tmp_path / "tars")
    assert set(out.samples["sound"]) >= {"audio", "text"} and "video" not in out.samples["sound"]
    np.testing.assert_array_equal(out.samples["both"]["audio"]["vector"],
                                  out.samples["sound"]["audio"]["vector"])


def test_a_rerun_reads_the_kept_tar_indexes_and_a_rewritten_tar_afresh(binary, probes,
                                                                          minilm_folder, media,
                                                                          tmp_path):
    """Note [Tar indexes kept in the output folder]: the tars' indexes are kept in the output
    folder, and a resumed run reads no header of an unchanged tar. A tar rewritten in place with
    the same size and modification time passes the kept index's file checks; its captions' headers
    are not where the index says, so the tar is scanned again, and the changed input is found."""
    tars = tmp_path / "tars"
    tars.mkdir()
    write_tar(tars / "000000.tar", media, [0, 1, 2], tarfile.GNU_FORMAT)
    write_tar(tars / "000001.tar", media, [3, 4], tarfile.PAX_FORMAT)
    out = tmp_path / "out"
    cfg = config(out, probes, minilm_folder, tars=str(tars))
    r = run_precompute(binary, tmp_path, cfg, "--no-supervisor", expect=None,
                       env={"PRECOMPUTE_CRASH_AT": "shard-before-rename@2"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    assert "tar indexes: 0 kept from an earlier run, 2 read from the tars" in r.stderr
    assert len(list(out.glob(".precompute.tar-index.*"))) == 2

    # The same members in another order, written over the tar in place (same inode), its
    # modification time set back: only the members' places differ.
    tar = tars / "000000.tar"
    before = tar.stat()
    reordered = tmp_path / "reordered.tar"
    with tarfile.open(reordered, "w", format=tarfile.GNU_FORMAT) as t:
        for i in (0, 1, 2):
            add_bytes(t, f"{key_of(i)}.json", json.dumps({"i": i}).encode())
            add_bytes(t, f"{key_of(i)}.txt", caption(i).encode() + b"\n")
            t.add(media / f"clip{i}.mp4", arcname=f"{key_of(i)}.mp4")
    assert reordered.stat().st_size == before.st_size
    with open(tar, "r+b") as f:
        f.write(reordered.read_bytes())
    os.utime(tar, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert tar.stat().st_ino == before.st_ino and tar.stat().st_mtime_ns == before.st_mtime_ns

    # The resume finds the captions through the tar's headers again, and the members' new
    # places make another input than the one the committed shards hold: refused, as any
    # changed input is, instead of reading other members' bytes as these samples'.
    r = run_precompute(binary, tmp_path, cfg, expect=2)
    assert "the tar changed since its headers were read; reading its headers again" in r.stderr
    assert "tar indexes: 2 kept from an earlier run, 1 read from the tars" in r.stderr
    assert "the input changed since the run" in r.stderr, r.stderr[-2000:]
    # --overwrite starts the output over; the kept indexes describe the tars, not the output,
    # so they stay, and the one read again replaces the stale one.
    r = run_precompute(binary, tmp_path, cfg, "--overwrite")
    assert "tar indexes: 2 kept from an earlier run, 1 read from the tars" in r.stderr
    assert len(list(out.glob(".precompute.tar-index.*"))) == 2
    clean = tmp_path / "clean"
    run_precompute(binary, tmp_path, config(clean, probes, minilm_folder, tars=str(tars)))
    assert_same_embeddings(clean, out)
    r = run_precompute(binary, tmp_path, cfg)
    assert "tar indexes: 2 kept from an earlier run, 0 read from the tars" in r.stderr
    assert "reading its headers again" not in r.stderr
    v = subprocess.run([str(binary), "verify", str(out), "--input", str(tars)],
                       capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr
