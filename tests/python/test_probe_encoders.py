"""Probe encoders through the real CLI: clips of known solid colours per second and audio of known
sine frequencies go in; the stored vectors must say exactly what was generated. This proves frame
sampling, colour conversion, normalisation, batching, pooling and storage end to end."""

import numpy as np
import pytest
from transformers import BertTokenizerFast

from conftest import (colour_clip, ffmpeg, read_output, run_precompute, sine_file,
                      write_manifest)

MEAN = [0.5, 0.25, 0.75]
STD = [0.25, 0.5, 0.125]
RGB = {"red": (255, 0, 0), "lime": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255),
       "black": (0, 0, 0), "0x8040C0": (128, 64, 192), "yellow": (255, 255, 0)}
TOLERANCE = 6.0  # 8-bit levels: yuv420p round trip of a flat colour


def to_rgb(row):
    """Inverts the configured normalisation of a probe row (channel means) to 8-bit RGB."""
    return np.array([(row[c] * STD[c] + MEAN[c]) * 255.0 for c in range(3)])


def video_config(probes, manifest, out, **video):
    section = {"encoder": {"path": str(probes / "video_probe.pt")},
               "sampling": {"fps": 1.0}, "size": [32, 48], "mean": MEAN, "std": STD,
               "pooling": "none", "batch_size": 3}
    section.update(video)
    return {"input": {"manifest": str(manifest)},
            "output": {"path": str(out), "shard_size": 4, "dtype": "float32"},
            "video": section}


@pytest.fixture(scope="module")
def colour_clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("colours")
    clips = {
        "rgbw": ["red", "lime", "blue", "white"],
        "kpy": ["black", "0x8040C0", "yellow"],
        "vp9": ["blue", "red"],
        "mpeg4": ["lime", "0x8040C0"],
    }
    colour_clip(d / "rgbw.mp4", clips["rgbw"])
    colour_clip(d / "kpy.mp4", clips["kpy"], size="160x90", rate=30)
    colour_clip(d / "vp9.webm", clips["vp9"], codec=["-c:v", "libvpx-vp9", "-lossless", "1"])
    colour_clip(d / "mpeg4.avi", clips["mpeg4"], codec=["-c:v", "mpeg4", "-q:v", "1"])
    files = {"rgbw": "rgbw.mp4", "kpy": "kpy.mp4", "vp9": "vp9.webm", "mpeg4": "mpeg4.avi"}
    manifest = write_manifest(d / "m.jsonl", [{"id": k, "video": v} for k, v in files.items()])
    return manifest, clips


def test_fps_sampling_gives_one_frame_per_second_with_the_right_colour(binary, probes,
                                                                      colour_clips, tmp_path):
    manifest, clips = colour_clips
    run_precompute(binary, tmp_path, video_config(probes, manifest, tmp_path / "out"))
    out = read_output(tmp_path / "out")
    assert sorted(out.samples) == sorted(clips)
    for sample_id, colours in clips.items():
        video = out.samples[sample_id]["video"]
        assert video["steps"] == len(colours)
        assert video["rows"].shape == (len(colours), 3)
        for k, name in enumerate(colours):
            got = to_rgb(video["rows"][k])
            assert np.abs(got - RGB[name]).max() <= TOLERANCE, (sample_id, k, name, got)
            # The frame on screen at the centre of second k.
            assert abs(video["timestamps"][k] - (k + 0.5)) <= 0.05, video["timestamps"]


def test_num_frames_spreads_frames_over_the_clip(binary, probes, colour_clips, tmp_path):
    manifest, clips = colour_clips
    run_precompute(binary, tmp_path,
                   video_config(probes, manifest, tmp_path / "out", sampling={"num_frames": 8}))
    out = read_output(tmp_path / "out")
    for sample_id, colours in clips.items():
        video = out.samples[sample_id]["video"]
        duration = float(len(colours))
        assert video["rows"].shape == (8, 3)
        for k in range(8):
            t = (k + 0.5) * duration / 8
            expected = RGB[colours[int(t)]]
            assert np.abs(to_rgb(video["rows"][k]) - expected).max() <= TOLERANCE, (sample_id, k)
            assert abs(video["timestamps"][k] - t) <= 0.05


def test_clips_layout_and_mean_pooling(binary, probes, colour_clips, tmp_path):
    manifest, clips = colour_clips
    config = video_config(probes, manifest, tmp_path / "out", sampling={"num_frames": 4},
                          layout="clips", pooling="mean")
    config["video"]["encoder"]["path"] = str(probes / "video_clip_probe.pt")
    run_precompute(binary, tmp_path, config)
    out = read_output(tmp_path / "out")
    for sample_id, colours in clips.items():
        duration = float(len(colours))
        expected = np.mean([RGB[colours[int((k + 0.5) * duration / 4)]] for k in range(4)], axis=0)
        got = to_rgb(out.samples[sample_id]["video"]["vector"])
        assert np.abs(got - expected).max() <= TOLERANCE, (sample_id, got, expected)


def test_shorter_side_crop_and_stretch(binary, probes, tmp_path):
    # 640x240: white bands in the left and right quarters, black centre.
    clip = tmp_path / "bands.mp4"
    ffmpeg("-f", "lavfi", "-i", "color=c=black:s=640x240:r=25:d=1", "-vf",
           "drawbox=x=0:y=0:w=160:h=240:color=white:t=fill,"
           "drawbox=x=480:y=0:w=160:h=240:color=white:t=fill",
           "-c:v", "libx264", "-qp", "0", "-pix_fmt", "yuv420p", str(clip))
    manifest = write_manifest(tmp_path / "m.jsonl", [{"id": "bands", "video": str(clip)}])
    results = {}
    for resize in ("shorter_side_crop", "stretch"):
        out = tmp_path / resize
        run_precompute(binary, tmp_path, video_config(probes, manifest, out, resize=resize,
                                                      size=[64, 64]))
        results[resize] = to_rgb(read_output(out).samples["bands"]["video"]["rows"][0])
    # The centred 240x240 crop is all black; stretching keeps the bands: half the area is white.
    assert results["shorter_side_crop"].max() <= TOLERANCE, results
    assert np.abs(results["stretch"] - 127.5).max() <= 3 * TOLERANCE, results


@pytest.fixture(scope="module")
def sines(tmp_path_factory):
    d = tmp_path_factory.mktemp("sines")
    sine_file(d / "a440.wav", 440, 3.0)
    sine_file(d / "a1000.m4a", 1000, 2.5, rate=48000, codec=["-c:a", "aac", "-b:a", "192k"])
    # A video whose audio track is a 2500 Hz sine: audio comes from the video's track.
    ffmpeg("-f", "lavfi", "-i", "color=c=red:s=64x48:r=25:d=2", "-f", "lavfi", "-i",
           "sine=frequency=2500:sample_rate=22050:duration=2", "-c:v", "libx264",
           "-pix_fmt", "yuv420p", "-c:a", "aac", "-b:a", "192k", "-shortest", str(d / "v.mp4"))
    manifest = write_manifest(d / "m.jsonl", [
        {"id": "a440", "audio": "a440.wav"},
        {"id": "a1000", "audio": "a1000.m4a"},
        {"id": "v2500", "video": "v.mp4"},
    ])
    return manifest, {"a440": (440, 3.0), "a1000": (1000, 2.5), "v2500": (2500, 2.0)}


def audio_config(probes, manifest, out, **audio):
    section = {"encoder": {"path": str(probes / "audio_probe.pt")}, "sample_rate": 16000,
               "window_s": 1.0, "pooling": "none", "batch_size": 2}
    section.update(audio)
    return {"input": {"manifest": str(manifest)},
            "output": {"path": str(out), "dtype": "float32"}, "audio": section}


def test_audio_windows_carry_rms_and_frequency(binary, probes, sines, tmp_path):
    manifest, expected = sines
    run_precompute(binary, tmp_path, audio_config(probes, manifest, tmp_path / "out"))
    out = read_output(tmp_path / "out")
    for sample_id, (frequency, seconds) in expected.items():
        audio = out.samples[sample_id]["audio"]
        rows = audio["rows"]
        # Windows of 1 s cover the clip; AAC may decode a few ms beyond the nominal end.
        windows = len(rows)
        assert windows in (int(np.ceil(seconds - 1.0)) + 1, int(np.ceil(seconds - 1.0)) + 2)
        np.testing.assert_allclose(audio["timestamps"], np.arange(windows), atol=0.03)
        covered = (windows - 1) * 16000 + rows[-1][2]
        assert abs(covered - seconds * 16000) <= 0.06 * 16000, (sample_id, covered)
        for k, (rms, peak, length) in enumerate(rows):
            if length < 8000:
                continue  # a short tail window: too few samples for a sharp spectrum
            # lavfi's sine has amplitude 1/8; lossy codecs and resampling keep it within 3%.
            assert abs(rms - 0.125 / np.sqrt(2)) <= 0.03 * 0.125 / np.sqrt(2), (sample_id, k, rms)
            assert abs(peak - frequency) <= 2.0, (sample_id, k, peak)


def test_whole_clip_audio_is_one_window_of_the_clip_length(binary, probes, sines, tmp_path):
    manifest, expected = sines
    run_precompute(binary, tmp_path,
                   audio_config(probes, manifest, tmp_path / "out", window_s=0))
    out = read_output(tmp_path / "out")
    for sample_id, (frequency, seconds) in expected.items():
        rows = out.samples[sample_id]["audio"]["rows"]
        assert rows.shape == (1, 3)
        # AAC may decode a few ms beyond the nominal end (its last frame's padding).
        assert abs(rows[0][2] - seconds * 16000) <= 0.06 * 16000, (sample_id, rows)
        assert abs(rows[0][1] - frequency) <= 2.0


TEXTS = ["A man is playing a guitar.", "Ünïcödé façade, 東京 and emoji 🎸!", "short",
         " ".join(["word"] * 40)]


def text_config(probes, minilm_folder, manifest, out, model="text_probe.pt", **text):
    section = {"encoder": {"path": str(probes / model)},
               "tokenizer": {"vocab": str(minilm_folder / "vocab.txt"), "max_length": 16},
               "pooling": "none", "batch_size": 3}
    section.update(text)
    return {"input": {"manifest": str(manifest)},
            "output": {"path": str(out), "dtype": "float32"}, "text": section}


@pytest.fixture(scope="module")
def text_manifest(tmp_path_factory):
    d = tmp_path_factory.mktemp("texts")
    return write_manifest(d / "m.jsonl", [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)])


def test_token_ids_reach_the_model_as_transformers_makes_them(binary, probes, minilm_folder,
                                                              text_manifest, tmp_path):
    reference = BertTokenizerFast.from_pretrained(str(minilm_folder))
    run_precompute(binary, tmp_path, text_config(probes, minilm_folder, text_manifest,
                                                 tmp_path / "none"))
    run_precompute(binary, tmp_path, text_config(probes, minilm_folder, text_manifest,
                                                 tmp_path / "mean", pooling="mean"))
    run_precompute(binary, tmp_path, text_config(probes, minilm_folder, text_manifest,
                                                 tmp_path / "model", model="text_pooled_probe.pt",
                                                 pooling="model"))
    per_token = read_output(tmp_path / "none")
    mean = read_output(tmp_path / "mean")
    model = read_output(tmp_path / "model")
    for i, text in enumerate(TEXTS):
        ids = reference(text, truncation=True, max_length=16)["input_ids"]
        rows = per_token.samples[f"t{i}"]["text"]["rows"]
        assert rows[:, 1].astype(int).tolist() == ids
        assert (rows[:, 0] == 1).all()  # no padding reaches the stored tokens
        item = mean.samples[f"t{i}"]["text"]
        assert item["steps"] == len(ids)
        assert item["truncated"] == (len(reference(text)["input_ids"]) > 16)
        np.testing.assert_allclose(item["vector"], [1.0, np.mean(ids)], rtol=1e-6)
        np.testing.assert_allclose(model.samples[f"t{i}"]["text"]["vector"],
                                   [len(ids), np.sum(ids)], rtol=1e-6)
    assert mean.samples["t3"]["text"]["truncated"] and not mean.samples["t2"]["text"]["truncated"]
