"""The audio recipes of `python -m precompute.export` (wav2vec2, hubert, whisper-encoder) on
Hugging Face folders of random-weight models built from transformers' config classes (no
download): each package returns, on a batch of zero-padded windows and their lengths, what the
eager transformers model returns on each clip; whisper-encoder's log-mel front end is
WhisperFeatureExtractor's; `precompute run` with a config that names only the package stores
what the eager model gives for each window; and a folder of another model is refused with one
line that names it and the model type the recipe takes."""

import json
import math
import os
import subprocess
import sys
import wave
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, read_output, run_precompute, sine_file, write_manifest

RATE = 16000
RECIPES = ("wav2vec2", "hubert", "whisper-encoder")


def tiny_folder(recipe: str, folder: Path):
    """A random-weight model of the recipe's family, saved with its feature extractor's config
    (tools/scripts/tiny_audio_models.py)."""
    from tiny_audio_models import tiny_audio_folder
    return tiny_audio_folder(recipe, folder)


def export(recipe: str, folder: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "precompute.export", recipe, str(folder),
                           str(out), *flags], capture_output=True, text=True, env=env,
                          timeout=900)


def declaration(package: Path) -> dict:
    with zipfile.ZipFile(package) as z:
        name = next(n for n in z.namelist() if n.endswith("wrapper_metadata.json"))
        return json.loads(json.loads(z.read(name))["precompute.encoder"])


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """recipe -> (eager model, folder, package); the three exports run side by side."""
    root = tmp_path_factory.mktemp("audio recipes")
    models, running = {}, {}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    for recipe in RECIPES:
        models[recipe] = tiny_folder(recipe, root / recipe)
        running[recipe] = subprocess.Popen(
            [sys.executable, "-m", "precompute.export", recipe, str(root / recipe),
             str(root / f"{recipe}.pt2")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env)
    for recipe, process in running.items():
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, (recipe, stderr[-3000:])
    return {r: (models[r], root / r, root / f"{r}.pt2") for r in RECIPES}


def speech_like(n: int, seed: int):
    """n samples of tones and noise, amplitude about 0.1, float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / RATE
    x = sum(0.03 * np.sin(2 * np.pi * f * t + p) for f, p in zip(rng.uniform(80, 4000, 5),
                                                                   rng.uniform(0, 6, 5)))
    return (x + 0.01 * rng.standard_normal(n)).astype(np.float32)


def batch(size: int, lengths):
    """What `precompute run` sends: rows of `size` samples, zero past each length."""
    import torch
    waveform = torch.zeros(len(lengths), size)
    for i, n in enumerate(lengths):
        waveform[i, :n] = torch.from_numpy(speech_like(n, seed=i))
    return waveform, torch.tensor(lengths, dtype=torch.int64)


def eager(recipe: str, model, folder: Path, waveform, lengths, padded: bool = True):
    """The eager transformers model on each row: its feature extractor on the row's valid
    samples, then (padded) the row zero-padded to the window, with an attention mask over the
    valid samples for a layer-norm feature encoder, or (not padded) the valid samples alone;
    the last hidden state averaged over the frames that hold audio."""
    import torch
    from transformers import AutoFeatureExtractor
    extractor = AutoFeatureExtractor.from_pretrained(folder)
    size, out = waveform.shape[1], []
    with torch.no_grad():
        for row, n in zip(waveform, lengths.tolist()):
            if recipe == "whisper-encoder":
                features = extractor(row[:n].numpy(), sampling_rate=RATE,
                                     return_tensors="pt").input_features
                hidden = model.encoder(features).last_hidden_state[0]
                out.append(hidden[:max(1, math.ceil(n / 320))].mean(0))
                continue
            x = extractor(row[:n].numpy(), sampling_rate=RATE, return_tensors="pt").input_values
            mask = None
            if padded:
                x = torch.nn.functional.pad(x, (0, size - n))
                if model.config.feat_extract_norm == "layer":
                    mask = (torch.arange(size) < n).long()[None]
            hidden = model(x, attention_mask=mask).last_hidden_state[0]
            frames = int(model._get_feat_extract_output_lengths(torch.tensor(n)))
            out.append(hidden[:frames].mean(0))
    return torch.stack(out)


@pytest.mark.parametrize("recipe,size,lengths", [
    ("wav2vec2", 24000, [24000, 9001, 400]),        # S fixed by no window: any size runs
    ("wav2vec2", 32007, [32007]),
    ("hubert", 24000, [24000, 9001, 400]),
    ("hubert", 16640, [3200, 16640]),
    ("whisper-encoder", 480000, [480000, 70001, 1])])
def test_a_package_returns_what_the_eager_model_returns(packages, recipe, size, lengths):
    import torch
    model, folder, package = packages[recipe]
    waveform, lengths = batch(size, lengths)
    expected = eager(recipe, model, folder, waveform, lengths)
    with torch.no_grad():
        got = torch._inductor.aoti_load_package(str(package))(waveform, lengths)
    assert got.shape == expected.shape == (len(lengths), 32)
    assert (got - expected).abs().max().item() < 2e-5, (got - expected).abs().max().item()


def test_a_layer_norm_model_gives_each_clip_what_it_gives_unpadded(packages):
    """With the attention mask, the zero padding of a window changes nothing (hubert here has a
    layer-norm feature encoder; a group-norm one, as in wav2vec2-base, sees the padding, as it
    does in transformers)."""
    import torch
    model, folder, package = packages["hubert"]
    waveform, lengths = batch(24000, [24000, 9001, 2000])
    alone = eager("hubert", model, folder, waveform, lengths, padded=False)
    with torch.no_grad():
        got = torch._inductor.aoti_load_package(str(package))(waveform, lengths)
    assert (got - alone).abs().max().item() < 2e-5


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_length_of_0_counts_as_1(packages, recipe):
    import torch
    _, _, package = packages[recipe]
    size = 480000 if recipe == "whisper-encoder" else 8000
    waveform, lengths = batch(size, [1, 1])
    waveform[1], lengths[1] = waveform[0], 0
    with torch.no_grad():
        got = torch._inductor.aoti_load_package(str(package))(waveform, lengths)
    assert torch.isfinite(got).all()
    assert (got[0] - got[1]).abs().max().item() < 1e-6


def test_whisper_front_end_is_the_feature_extractors(packages):
    """The log-mel features the whisper-encoder package computes (its module, eager) are
    WhisperFeatureExtractor's, for a clip shorter than the window (zero-padded to 30 s)."""
    import torch
    from transformers import WhisperFeatureExtractor
    from precompute.export import _WhisperMean
    extractor = WhisperFeatureExtractor(feature_size=128)
    front = _WhisperMean(torch.nn.Linear(1, 1), extractor.mel_filters, extractor.n_fft,
                         extractor.hop_length, 320)
    n = 7 * RATE + 123
    clip = speech_like(n, seed=5)
    expected = extractor(clip, sampling_rate=RATE, return_tensors="pt").input_features
    waveform = torch.zeros(1, extractor.n_samples)
    waveform[0, :n] = torch.from_numpy(clip)
    got = front.log_mel(waveform, torch.tensor([n]))
    assert got.shape == expected.shape == (1, 128, 3000)
    assert (got - expected).abs().max().item() < 1e-5, (got - expected).abs().max().item()


def test_each_package_declares_its_input_and_audio_settings(packages):
    for recipe in ("wav2vec2", "hubert"):
        declared = declaration(packages[recipe][2])
        assert declared["inputs"] == [{"shape": [-1, -1], "dtype": "float32"},
                                      {"shape": [-1], "dtype": "int64"}]
        assert declared["audio"] == {"sample_rate": RATE, "window_s": 10.0}
    declared = declaration(packages["whisper-encoder"][2])
    assert declared["inputs"] == [{"shape": [-1, 480000], "dtype": "float32"},
                                  {"shape": [-1], "dtype": "int64"}]
    assert declared["audio"] == {"sample_rate": RATE, "window_s": 30.0}


@pytest.mark.parametrize("recipe,folder_of,expected", [
    ("whisper-encoder", "wav2vec2", "'whisper'"),
    ("wav2vec2", "hubert", "'wav2vec2'"),
    ("hubert", "whisper-encoder", "'hubert'")])
def test_a_folder_of_another_model_is_refused(packages, tmp_path, recipe, folder_of, expected):
    folder = packages[folder_of][1]
    r = export(recipe, folder, tmp_path / "x.pt2")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert str(folder) in r.stderr and expected in r.stderr, r.stderr
    assert f"{recipe} recipe takes a" in r.stderr, r.stderr
    assert not (tmp_path / "x.pt2").exists()


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    r = export("wav2vec2", tmp_path / "missing", tmp_path / "x.pt2")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"{tmp_path / 'missing'} holds no config.json" in r.stderr


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert w.getframerate() == RATE and w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2") / 32768.0


def test_precompute_stores_what_the_eager_model_gives_each_window(binary, packages, tmp_path):
    """wav2vec2's package under `audio` with nothing else stated: it runs at the package's
    16 kHz and 10-s windows; a 12-s clip makes a full window and one of 2 s (zero-padded), and
    each stored row is the eager model's vector for that window."""
    import torch
    model, folder, package = packages["wav2vec2"]
    clips = []
    for i, (frequency, seconds) in enumerate([(220.0, 12.0), (523.0, 3.0)]):
        path = tmp_path / f"a{i}.wav"
        sine_file(path, frequency, seconds, rate=RATE, codec=["-c:a", "pcm_s16le"])
        clips.append({"id": f"a{i}", "audio": str(path)})
    manifest = write_manifest(tmp_path / "m.jsonl", clips)
    config = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "out")},
              "audio": {"encoder": {"path": str(package)}, "pooling": "none"}}
    r = run_precompute(binary, tmp_path, config)
    assert "audio.window_s: 10.0 (model package)" in r.stderr, r.stderr[-2500:]
    assert "audio.sample_rate: 16000 (model package)" in r.stderr, r.stderr[-2500:]
    stored = read_output(tmp_path / "out")
    window = 10 * RATE
    for clip in clips:
        samples = read_wav(Path(clip["audio"]))
        starts = list(range(0, len(samples), window))
        waveform, lengths = torch.zeros(len(starts), window), []
        for k, start in enumerate(starts):
            piece = samples[start:start + window]
            waveform[k, :len(piece)] = torch.from_numpy(piece.astype(np.float32))
            lengths.append(len(piece))
        expected = eager("wav2vec2", model, folder, waveform, torch.tensor(lengths)).numpy()
        got = stored.samples[clip["id"]]["audio"]["rows"]
        assert got.shape == expected.shape, (clip["id"], got.shape, expected.shape)
        cos = (got * expected).sum(1) / (np.linalg.norm(got, axis=1)
                                         * np.linalg.norm(expected, axis=1))
        assert cos.min() >= 0.9999, (clip["id"], cos)
