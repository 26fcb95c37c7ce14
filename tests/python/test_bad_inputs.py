"""A corpus of bad and odd inputs mixed with good samples, through the real CLI in one run: every
bad sample must get failure records of the right category (and nothing else of it must be
lost), every good or merely odd sample must be embedded with finite values, and the run must
finish: with exit code 3 by default, since most of this corpus fails (more than half of the
samples failing exits 3, docs/usage.md "Bad input"), and 0 under a limit that tolerates it
(docs/reliability.md, "FFmpeg and untrusted files")."""

import csv
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import failures_by_id, ffmpeg, read_output, run_precompute

OK = "ok"  # embedded, as opposed to a failure category
MAX_DURATION_S = 4.0
MAX_TEXT_BYTES = 256
MAX_FILE_BYTES = 1 << 20  # every clip here is a few kB; only "big_file" goes over
FPS = 2
FULL_ROWS = 4  # a 2 s clip sampled at 2 fps

TESTSRC = ["-f", "lavfi", "-i", "testsrc2=s=64x48:r=25:d=2"]
SINE = ["-f", "lavfi", "-i", "sine=frequency=660:sample_rate=16000:duration=2"]
H264 = ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-g", "10"]


def huge_header_avi(path: Path, width: int, height: int) -> None:
    """A two-frame 16x16 raw-video AVI whose headers (avih and the stream's BITMAPINFOHEADER)
    declare width x height. Encoding a real 16384x16384 clip would take seconds and gigabytes;
    the decoder must refuse the file on its header alone, which is what this exercises. (The
    frames do not match the header, so getting past the check would fail to decode instead.)"""
    small = path.with_suffix(".small.avi")
    ffmpeg("-f", "lavfi", "-i", "color=c=red:s=16x16:r=5:d=0.4", "-c:v", "rawvideo",
           "-pix_fmt", "bgr24", str(small))
    data = bytearray(small.read_bytes())
    avih = data.find(b"avih")
    strf = data.find(b"strf")
    assert avih > 0 and strf > 0
    struct.pack_into("<II", data, avih + 8 + 32, width, height)  # dwWidth, dwHeight
    struct.pack_into("<ii", data, strf + 8 + 4, width, height)   # biWidth, biHeight
    path.write_bytes(bytes(data))
    small.unlink()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The media, and the manifest's rows with what each modality must become."""
    d = tmp_path_factory.mktemp("bad inputs")
    ffmpeg(*TESTSRC, *SINE, *H264, "-c:a", "aac", "-shortest", str(d / "av.mp4"))
    ffmpeg(*TESTSRC, *SINE, *H264, "-c:a", "aac", "-shortest", "-movflags", "+faststart",
           str(d / "av_fast.mp4"))
    ffmpeg(*TESTSRC, *SINE, *H264, "-c:a", "aac", "-shortest", str(d / "av.ts"))
    ffmpeg(*SINE, "-c:a", "aac", str(d / "tone.m4a"))
    ffmpeg(*TESTSRC, *H264, str(d / "silent.mp4"))
    ffmpeg(*TESTSRC, *H264, "-frames:v", "1", str(d / "one_frame.mp4"))
    # With no frame to write, the MP4 muxer leaves the track out: a file with no stream at all.
    ffmpeg(*TESTSRC, *H264, "-frames:v", "0", str(d / "no_frames.mp4"))
    # A WAV header announcing an audio stream, and not one sample after it.
    ffmpeg("-f", "lavfi", "-i", "anullsrc=r=16000:cl=mono", "-t", "0", "-c:a", "pcm_s16le",
           str(d / "no_samples.wav"))
    ffmpeg("-f", "lavfi", "-i", f"testsrc2=s=32x32:r=5:d={MAX_DURATION_S + 2}", *H264,
           str(d / "long.mp4"))
    # Variable frame rate: one second at 25 fps, then 5 frames 0.2 s apart.
    ffmpeg("-f", "lavfi", "-i", "testsrc2=s=64x48:r=25:d=1.2",
           "-vf", "setpts='if(lt(N,25),N,25+(N-25)*5)'", "-fps_mode", "vfr", *H264,
           str(d / "vfr.mp4"))
    ffmpeg(*TESTSRC, *H264, "-metadata:s:v:0", "rotate=90", str(d / "rotated.mp4"))
    huge_header_avi(d / "huge_header.avi", 16384, 16384)

    full = (d / "av.mp4").read_bytes()
    assert full.find(b"moov") > len(full) // 2, "av.mp4 should keep its index at the end"
    (d / "cut_before_moov.mp4").write_bytes(full[:len(full) // 2])
    fast = (d / "av_fast.mp4").read_bytes()
    assert fast.find(b"moov") < fast.find(b"mdat"), "av_fast.mp4 should start with its index"
    (d / "cut_mid_gop.mp4").write_bytes(fast[:len(fast) // 2])
    (d / "big_file.mp4").write_bytes(full + bytes(MAX_FILE_BYTES))  # playable, then padding
    (d / "empty.mp4").write_bytes(b"")
    (d / "garbage.mp4").write_bytes(np.random.default_rng(7).bytes(64 * 1024))
    (d / "playlist.mp4").write_text(
        "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXTINF:2.0,\n"
        f"{d / 'av.ts'}\n#EXT-X-ENDLIST\n")
    os.mkfifo(d / "pipe.mp4")
    (d / "folder.mp4").mkdir()
    (d / "dir with space").mkdir()
    odd_name = "dir with space/clip: take 1 — été ✓.mp4"
    shutil.copy(d / "av.mp4", d / odd_name)
    shutil.copy(d / "av.mp4", d / "a:b.mp4")

    av = {"video": OK, "audio": OK, "text": OK}
    rows = [
        # (id, video, audio, text, expected outcome per modality)
        ("good", "av.mp4", "", "a good clip", av),
        ("good audio file", "", "tone.m4a", "a tone", {"audio": OK, "text": OK}),
        ("text only", "", "", "just words", {"text": OK}),
        ("missing", "nope.mp4", "", "gone", {"video": "missing", "audio": "missing", "text": OK}),
        ("zero bytes", "empty.mp4", "", "x",
         {"video": "decode_error", "audio": "decode_error", "text": OK}),
        ("garbage", "garbage.mp4", "", "x",
         {"video": "decode_error", "audio": "decode_error", "text": OK}),
        ("cut before moov", "cut_before_moov.mp4", "", "x",
         {"video": "decode_error", "audio": "decode_error", "text": OK}),
        # Decoded as far as the data goes (checked below).
        ("cut mid gop", "cut_mid_gop.mp4", "", "x", av),
        ("no video stream", "tone.m4a", "", "x", {"video": "no_stream", "audio": OK, "text": OK}),
        ("no audio stream", "", "silent.mp4", "x", {"audio": "no_stream", "text": OK}),
        ("one frame", "one_frame.mp4", "", "x", {"video": OK, "audio": "no_stream", "text": OK}),
        ("no frames", "no_frames.mp4", "", "x",
         {"video": "no_stream", "audio": "no_stream", "text": OK}),
        ("no samples", "", "no_samples.wav", "x", {"audio": "decode_error", "text": OK}),
        ("huge header", "huge_header.avi", "", "x",
         {"video": "too_large", "audio": "no_stream", "text": OK}),
        ("too long", "long.mp4", "", "x", {"video": "too_long", "audio": "no_stream", "text": OK}),
        ("big file", "big_file.mp4", "", "x",
         {"video": "too_large", "audio": "too_large", "text": OK}),
        ("vfr", "vfr.mp4", "", "x", {"video": OK, "audio": "no_stream", "text": OK}),
        ("rotated", "rotated.mp4", "", "x", {"video": OK, "audio": "no_stream", "text": OK}),
        ("hls playlist", "playlist.mp4", "", "x",
         {"video": "decode_error", "audio": "decode_error", "text": OK}),
        ("concat", "concat:av.mp4|av.mp4", "", "x",
         {"video": "unreadable", "audio": "unreadable", "text": OK}),
        ("http", "http://example.com/clip.mp4", "", "x",
         {"video": "unreadable", "audio": "unreadable", "text": OK}),
        ("file protocol", "file:av.mp4", "", "x",
         {"video": "unreadable", "audio": "unreadable", "text": OK}),
        ("pipe protocol", "pipe:0", "", "x",
         {"video": "unreadable", "audio": "unreadable", "text": OK}),
        ("fifo", "pipe.mp4", "", "x", {"video": "unreadable", "audio": "unreadable", "text": OK}),
        ("directory", "folder.mp4", "", "x",
         {"video": "unreadable", "audio": "unreadable", "text": OK}),
        ("dev zero", "/dev/zero", "", "x",
         {"video": "unreadable", "audio": "unreadable", "text": OK}),
        ("odd name", odd_name, "", "an odd name", av),
        ("colon name", "a:b.mp4", "", "a colon", av),
        # Invalid UTF-8 is replaced (U+FFFD, then dropped by BERT's clean-up): the same tokens
        # as the caption without those bytes.
        ("non utf8 text", "", "", b"caf\xe9 \xff ok".decode("utf-8", "surrogateescape"),
         {"text": OK}),
        ("utf8 twin", "", "", "caf ok", {"text": OK}),
        ("empty text", "", "", "", {"text": "bad_text"}),
        ("long text", "", "", "word " * (MAX_TEXT_BYTES // 5 + 1), {"text": "too_large"}),
    ]
    # CSV rather than JSONL: only a delimited manifest can carry bytes that are not UTF-8.
    manifest = d / "manifest.csv"
    with open(manifest, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "video", "audio", "text"])
        for sample_id, video, audio, text, _ in rows:
            writer.writerow([sample_id, video, audio, text])
    return manifest, {r[0]: r[4] for r in rows}


def corpus_config(probes, minilm_folder, manifest, out):
    return {
        "input": {"manifest": str(manifest)},
        "output": {"path": str(out), "shard_size": 16},
        "run": {"decode_threads": 2, "max_file_bytes": MAX_FILE_BYTES},
        "video": {"encoder": {"path": str(probes / "video_probe.pt")}, "sampling": {"fps": FPS},
                  "size": [32, 32], "pooling": "none", "batch_size": 8,
                  "max_duration_s": MAX_DURATION_S},
        "audio": {"encoder": {"path": str(probes / "audio_probe.pt")}, "pooling": "mean",
                  "batch_size": 8},
        "text": {"encoder": {"path": str(probes / "text_pooled_probe.pt")}, "pooling": "model",
                 "tokenizer": {"vocab": str(minilm_folder / "vocab.txt")}, "batch_size": 8,
                 "max_text_bytes": MAX_TEXT_BYTES},
    }


def values(item):
    return item["rows"] if "rows" in item else item["vector"]


def test_bad_inputs_fail_alone_with_the_right_category(binary, probes, minilm_folder, corpus,
                                                      tmp_path):
    manifest, expected = corpus
    kinds = [e for e in expected.values() if any(v != OK for v in e.values())]
    assert len(kinds) >= 22
    out = tmp_path / "out"
    config = corpus_config(probes, minilm_folder, manifest, out)
    r = run_precompute(binary, tmp_path, config, expect=3)
    assert "samples failed, over the limit of 50%" in r.stderr, r.stderr[-2000:]
    assert "embedded nothing" not in r.stderr  # every modality embedded some samples
    r = run_precompute(binary, tmp_path, config, "--max-failures", "100%")
    assert "0 to process" in r.stderr  # the output was whole: the limit only sets the exit code
    output = read_output(out)
    failures = failures_by_id(output)
    assert output.index["total_samples"] == len(expected)

    for sample_id, modalities in expected.items():
        want_failures = {m: c for m, c in modalities.items() if c != OK}
        assert failures.get(sample_id, {}) == want_failures, sample_id
        for m, outcome in modalities.items():
            if outcome != OK:
                continue
            item = output.samples[sample_id].get(m)
            assert item is not None, (sample_id, m)
            assert np.isfinite(values(item)).all(), (sample_id, m)

    video = {i: s["video"] for i, s in output.samples.items() if "video" in s}
    for sample_id in ("good", "odd name", "colon name"):
        assert video[sample_id]["steps"] == FULL_ROWS, sample_id
        np.testing.assert_array_equal(values(video[sample_id]), values(video["good"]))
    assert video["one frame"]["steps"] == 1
    assert video["rotated"]["steps"] == FULL_ROWS
    # Variable frame rate: 2 s long, its frames 0.04 s apart, then 0.2 s apart.
    np.testing.assert_allclose(video["vfr"]["timestamps"], [0.24, 0.72, 1.2, 1.6], atol=1e-6)

    # A faststart MP4 cut in half: its index promises 2 s, so it gets as many rows as the whole
    # clip, but the data ends early: the rows past it repeat the last decoded frame, whose own
    # time they keep, and the audio is shorter.
    cut = video["cut mid gop"]
    assert cut["steps"] == FULL_ROWS
    assert cut["timestamps"][-1] < 1.5 and cut["timestamps"][-1] == cut["timestamps"][-2]
    audio_length = {i: s["audio"]["vector"][2] for i, s in output.samples.items() if "audio" in s}
    assert 0 < audio_length["cut mid gop"] < 0.8 * audio_length["good"]

    text = {i: s["text"]["vector"] for i, s in output.samples.items() if "text" in s}
    np.testing.assert_array_equal(text["non utf8 text"], text["utf8 twin"])

    messages = {(f["id"], f["modality"]): f["message"] for f in output.failures}
    for key, parts in {
        ("missing", "video"): ["nope.mp4", "no such file"],
        ("http", "video"): ["'http:'", "URL or FFmpeg protocol"],
        ("concat", "video"): ["'concat:'", "URL or FFmpeg protocol"],
        ("fifo", "video"): ["FIFO"],
        ("directory", "video"): ["a directory"],
        ("dev zero", "video"): ["/dev/zero", "a character device"],
        ("huge header", "video"): ["16384x16384", "video.max_pixels"],
        ("too long", "video"): ["video.max_duration_s"],
        ("big file", "video"): ["big_file.mp4", str(MAX_FILE_BYTES), "run.max_file_bytes"],
        ("long text", "text"): [str(MAX_TEXT_BYTES), "text.max_text_bytes"],
        ("empty text", "text"): ["empty"],
    }.items():
        for part in parts:
            assert part in messages[key], (key, part, messages[key])

    # `inspect --json` reports the same records.
    report = json.loads(subprocess.run([str(binary), "inspect", "--json", str(out)],
                                       stdout=subprocess.PIPE, text=True, check=True).stdout)
    by_category = {}
    for modalities in expected.values():
        for outcome in modalities.values():
            if outcome != OK:
                by_category[outcome] = by_category.get(outcome, 0) + 1
    assert report["failures_by_category"] == by_category
    assert sorted((f["id"], f["modality"], f["category"]) for f in report["failures"]) == sorted(
        (f["id"], f["modality"], f["category"]) for f in output.failures)


def test_small_max_pixels_refuses_a_real_clip(binary, probes, minilm_folder, tmp_path):
    # A header that is not crafted: an ordinary 64x48 clip over a cap set just under it.
    ffmpeg(*TESTSRC, *H264, str(tmp_path / "clip.mp4"))
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("id,video\nclip,clip.mp4\n")
    config = corpus_config(probes, minilm_folder, manifest, tmp_path / "out")
    del config["audio"], config["text"]
    config["video"]["max_pixels"] = 64 * 48 - 1
    # Its only video failed: a modality that embedded nothing fails the run, naming the cap.
    r = run_precompute(binary, tmp_path, config, expect=3)
    last = r.stderr.strip().splitlines()[-1]
    assert "video: none of the 1 sample(s)" in last and "too_large" in last, last
    assert "video.max_pixels" in last, last
    output = read_output(tmp_path / "out")
    assert failures_by_id(output) == {"clip": {"video": "too_large"}}
    config["video"]["max_pixels"] = 64 * 48
    run_precompute(binary, tmp_path, config, "--overwrite")
    assert read_output(tmp_path / "out").samples["clip"]["video"]["steps"] == FULL_ROWS
