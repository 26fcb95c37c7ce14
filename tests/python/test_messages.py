"""What a run says about its models and their settings, tried as a new user would: an encoder
that fails on every sample names its file, the input it was given and the config keys that
shaped it, with the model's own message on one line (the traceback only at debug level); a
model returning a tuple is refused at start-up; captions the vocabulary cannot spell warn once;
a copy of configs/reference.yaml keeps a model folder's own settings, and the run says where
each came from."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ROOT, read_output, run_precompute, sine_file, write_manifest


def save_scripted(module: torch.nn.Module, path: Path) -> Path:
    torch.jit.script(module.eval()).save(str(path))
    return path


class WholeSecondAudio(torch.nn.Module):
    """A projection of exactly one second at 16 kHz: the mistake of a model made for fixed
    windows, run with whole-clip windows (audio.window_s 0)."""

    def __init__(self):
        super().__init__()
        self.project = torch.nn.Linear(16000, 8)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        return self.project(wave)


class ImageNetSizedVideo(torch.nn.Module):
    """A head that takes 224 x 224 frames only."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3 * 224 * 224, 4)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.head(frames.flatten(1))


class TupleVideo(torch.nn.Module):
    """Returns (per-frame means, a scalar), as a model returning extra outputs does."""

    def forward(self, frames: torch.Tensor):
        return frames.mean(dim=[2, 3]), frames.sum()


class ListVideo(torch.nn.Module):
    def forward(self, frames: torch.Tensor) -> list[torch.Tensor]:
        return [frames.mean(dim=[2, 3])]


def audio_job(tmp_path: Path, model: Path) -> dict:
    """A one-second clip (what the model takes) and two two-second ones (what it does not)."""
    sine_file(tmp_path / "one.wav", 440, 1.0)
    sine_file(tmp_path / "two.wav", 440, 2.0)
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "one", "audio": str(tmp_path / "one.wav")},
        {"id": "two-a", "audio": str(tmp_path / "two.wav")},
        {"id": "two-b", "audio": str(tmp_path / "two.wav")}])
    return {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "out")},
            "audio": {"encoder": {"path": str(model)}, "batch_size": 4}}


def test_an_encoder_failure_names_the_file_the_input_and_the_keys_in_one_line(tmp_path,
                                                                               binary):
    """Every failure record and the batch's warning carry the model file, the input shape and
    dtype sent, the keys that set them and the model's own message, each on one line: no
    traceback at the default log level, the whole one at debug level."""
    model = save_scripted(WholeSecondAudio(), tmp_path / "whole_second.pt")
    config = audio_job(tmp_path, model)
    r = run_precompute(binary, tmp_path, config, "--max-failures", "2")
    out = read_output(tmp_path / "out")
    assert set(out.samples) == {"one"}
    assert [(f["id"], f["category"]) for f in out.failures] == [
        ("two-a", "encode_error"), ("two-b", "encode_error")]
    for f in out.failures:
        message = f["message"]
        assert "\n" not in message and "Traceback" not in message, message
        assert f'audio model "{model}" failed on cpu' in message, message
        assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x32000 and 16000x8)" \
            in message, message
        assert "It was given [1, 32000] float32, shaped by audio.sample_rate 16000, " \
            "audio.window_s 0 (the whole clip), audio.dtype float32" in message, message
    warning = [line for line in r.stderr.splitlines() if "audio batch of 3 samples failed" in line]
    assert len(warning) == 1, r.stderr[-3000:]
    assert "cannot be multiplied (2x32000 and 16000x8)" in warning[0]
    assert warning[0].endswith("retrying them one by one"), warning[0]
    assert "Traceback" not in r.stderr

    r = run_precompute(binary, tmp_path, config, "--max-failures", "2", "--overwrite",
                       "--log-level", "debug")
    assert "Traceback of TorchScript" in r.stderr
    assert "self.project(wave)" in r.stderr  # the model's own code, in its traceback


class RaisingAudio(torch.nn.Module):
    """Checks its input and raises with a message of two lines."""

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        if wave.size(1) != 16000:
            raise ValueError("expected windows of 16000 samples,\n  got another length")
        return wave[:, :4]


@pytest.mark.parametrize("kind", ["traced", "raising"])
def test_a_traced_or_raising_models_failure_is_one_line_too(tmp_path, binary, kind):
    """A traced module's traceback lists its Python frames at the start of lines, a `raise`
    names Python's module of the exception and may span lines; the message is still the
    exception alone, on one line."""
    model = tmp_path / f"{kind}.pt"
    if kind == "traced":
        torch.jit.trace(WholeSecondAudio().eval(), torch.zeros(2, 16000)).save(str(model))
        expected = ": RuntimeError: mat1 and mat2 shapes cannot be multiplied (1x32000 and " \
            "16000x8). It was given"
    else:
        save_scripted(RaisingAudio(), model)
        expected = ": ValueError: expected windows of 16000 samples, got another length. It " \
            "was given"
    run_precompute(binary, tmp_path, audio_job(tmp_path, model), "--max-failures", "2")
    messages = [f["message"] for f in read_output(tmp_path / "out").failures]
    assert len(messages) == 2
    for message in messages:
        assert "\n" not in message and "Traceback" not in message and ".py(" not in message
        assert expected in message, message


def test_a_video_model_that_takes_another_size_is_refused_naming_video_size(tmp_path, binary,
                                                                            probes):
    """The warm-up pass runs the model on one input of the configured size: a model made for
    224 x 224 frames under video.size 32 stops the run before any output, naming the key."""
    model = save_scripted(ImageNetSizedVideo(), tmp_path / "imagenet_head.pt")
    from conftest import colour_clip
    colour_clip(tmp_path / "v.mp4", ["red"])
    config = {"input": {"manifest": str(write_manifest(tmp_path / "m.jsonl", [
                  {"id": "v", "video": str(tmp_path / "v.mp4")}]))},
              "output": {"path": str(tmp_path / "out")},
              "video": {"encoder": {"path": str(model)}, "sampling": {"fps": 1}, "size": 32}}
    r = run_precompute(binary, tmp_path, config, expect=2)
    assert f'video model "{model}" failed on cpu: RuntimeError: mat1 and mat2 shapes cannot be ' \
        "multiplied (1x3072 and 150528x4). It was given [1, 3, 32, 32] float32, shaped by " \
        "video.size [32, 32], video.layout frames, video.dtype float32" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "index.json").exists()


@pytest.mark.parametrize("module,returned", [
    (TupleVideo(), "a Tuple ([1, 3] float32, [] float32)"),
    (ListVideo(), "a GenericList ([1, 3] float32)")], ids=["tuple", "list"])
def test_a_model_returning_a_tuple_or_a_list_is_refused_at_start_up(tmp_path, binary, module,
                                                                     returned):
    """Which element to store would be a guess: exit 2 before the output exists, naming the
    file, what it returned and the fix."""
    model = save_scripted(module, tmp_path / "several_outputs.pt")
    from conftest import colour_clip
    colour_clip(tmp_path / "v.mp4", ["red"])
    config = {"input": {"manifest": str(write_manifest(tmp_path / "m.jsonl", [
                  {"id": "v", "video": str(tmp_path / "v.mp4")}]))},
              "output": {"path": str(tmp_path / "out")},
              "video": {"encoder": {"path": str(model)}, "sampling": {"fps": 1}, "size": 32}}
    r = run_precompute(binary, tmp_path, config, expect=2)
    assert f'video model "{model}" returned {returned} for input [1, 3, 32, 32] float32; ' \
        "precompute stores one tensor per call: make forward() return the tensor to store" \
        in r.stderr, r.stderr
    assert not (tmp_path / "out" / "index.json").exists()


def test_captions_the_vocabulary_cannot_spell_warn_once(tmp_path, binary, minilm_folder):
    """Captions in capitals under an uncased vocabulary with lower_case: false are mostly
    [UNK]: one warning with the share and the settings to check. The folder's own setting
    (lower_case: true) gives none."""
    captions = ["A DOG CATCHES A FRISBEE", "TWO CATS ON A SOFA", "a quiet street at night"]
    manifest = write_manifest(tmp_path / "m.jsonl",
                              [{"id": f"t{i}", "text": t} for i, t in enumerate(captions)])
    config = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "out")},
              "text": {"encoder": {"type": "bert", "path": str(minilm_folder)},
                       "tokenizer": {"lower_case": False}}}
    r = run_precompute(binary, tmp_path, config)
    warnings = [line for line in r.stderr.splitlines() if "[UNK]" in line]
    assert len(warnings) == 1, r.stderr[-3000:]
    # Each of the 10 words in capitals is one [UNK]; the last caption is 5 known tokens.
    assert "of the caption tokens (10 of 15) are [UNK]" in warnings[0], warnings[0]
    assert "text.tokenizer.lower_case false" in warnings[0]
    assert f"text.tokenizer.vocab from the model folder {minilm_folder}" in warnings[0]

    del config["text"]["tokenizer"]
    r = run_precompute(binary, tmp_path, config, "--overwrite")
    assert "[UNK]" not in r.stderr, r.stderr[-3000:]


def test_a_copy_of_the_reference_config_keeps_the_model_folders_settings(tmp_path, binary,
                                                                         minilm_folder):
    """The README's way in: copy configs/reference.yaml, keep the text section, point its
    encoder at a Hugging Face folder. all-MiniLM-L6-v2's sentence-transformers settings hold
    (256 tokens, mean pooling, normalised vectors, as its authors publish them); the run logs
    each setting with its value and source once, and index.json keeps them. A value the config
    sets is the config's, and says so."""
    import yaml
    config = yaml.safe_load((ROOT / "configs" / "reference.yaml").read_text())
    del config["video"], config["audio"]
    long_caption = " ".join(["word"] * 200)  # 202 tokens: past 128, within 256
    manifest = write_manifest(tmp_path / "m.jsonl", [
        {"id": "short", "text": "A dog catches a frisbee."}, {"id": "long", "text": long_caption}])
    config["input"] = {"manifest": str(manifest)}
    config["output"]["path"] = str(tmp_path / "out")
    config["text"]["encoder"] = {"type": "bert", "path": str(minilm_folder)}
    config["text"]["device"] = "cpu"
    r = run_precompute(binary, tmp_path, config)
    for line in ["text.tokenizer.max_length: 256 (model folder)",
                 'text.pooling: "mean" (model folder)', "text.normalize: true (model folder)",
                 "text.tokenizer.lower_case: true (model folder)",
                 f'text.tokenizer.vocab: "{minilm_folder}" (model folder)']:
        assert r.stderr.count(line) == 1, (line, r.stderr[-3000:])
    out = read_output(tmp_path / "out")
    for sample in out.samples.values():
        assert abs(np.linalg.norm(sample["text"]["vector"]) - 1.0) < 2e-3
    assert not out.samples["long"]["text"]["truncated"]
    settings = out.index["model_settings"]
    assert settings["text.normalize"] == {"value": True, "source": "model folder"}
    assert settings["text.tokenizer.max_length"] == {"value": 256, "source": "model folder"}
    assert settings["text.pooling"] == {"value": "mean", "source": "model folder"}

    config["text"]["normalize"] = False
    config["output"]["path"] = str(tmp_path / "out2")
    r = run_precompute(binary, tmp_path, config)
    assert "text.normalize: false (config file)" in r.stderr
    out = read_output(tmp_path / "out2")
    assert out.index["model_settings"]["text.normalize"] == {"value": False,
                                                             "source": "config file"}
    assert abs(np.linalg.norm(out.samples["short"]["text"]["vector"]) - 1.0) > 0.1
