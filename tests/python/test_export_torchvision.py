"""`python -m precompute.export torchvision NAME OUT.pt2 --weights ...`: a torchvision classifier
without its last Linear layer, from a state_dict file or random weights (no download). The
package returns what the eager model without its head returns, declares the input size and
normalisation of the weights' eval transform, takes clips for video models, and `precompute run`
stores what the same module traced to TorchScript stores with every setting stated. Mistakes
(a name torchvision lacks, no --weights, weights of another model, a model with no Linear head)
are refused in one line before anything is compiled."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, colour_clip, read_output, run_precompute, write_manifest
from test_export_recipes import declaration


def export(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "precompute.export", "torchvision", *args],
                          capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """A random ResNet-18 saved the way a training job saves it (a checkpoint dict, the keys
    prefixed by DistributedDataParallel, a 10-class head), and its package."""
    import torch
    import torchvision
    root = tmp_path_factory.mktemp("torchvision")
    torch.manual_seed(1)
    model = torchvision.models.resnet18(num_classes=10)
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    weights = root / "finetuned.pth"
    torch.save({"epoch": 3, "state_dict": state}, weights)
    package = root / "resnet18.pt2"
    r = export("resnet18", str(package), "--weights", str(weights))
    assert r.returncode == 0, r.stderr[-3000:]
    body = {k: v for k, v in model.state_dict().items() if not k.startswith("fc.")}
    eager = torchvision.models.resnet18()
    eager.fc = torch.nn.Identity()
    eager.load_state_dict(body)
    return eager.eval(), package


def test_the_package_returns_the_features_before_the_head(resnet):
    import torch
    eager, package = resnet
    x = torch.randn(3, 3, 224, 224)
    with torch.no_grad():
        expected = eager(x)
        got = torch._inductor.aoti_load_package(str(package))(x)
    assert got.shape == (3, 512)
    assert (got - expected).abs().max().item() < 1e-4


def test_it_declares_the_weights_eval_transform(resnet):
    stated = declaration(resnet[1])
    assert stated["inputs"] == [{"shape": [-1, 3, 224, 224], "dtype": "float32"}]
    assert stated["video"] == {"size": [224, 224], "mean": [0.485, 0.456, 0.406],
                               "std": [0.229, 0.224, 0.225], "resize": "shorter_side_crop",
                               "layout": "frames"}


def test_a_video_model_takes_clips_in_precomputes_order(tmp_path):
    """precompute sends clips [B, T, 3, H, W]; torchvision's video models take [B, 3, T, H, W]."""
    import torch
    import torchvision
    torch.manual_seed(2)
    model = torchvision.models.video.r3d_18()
    weights = tmp_path / "r3d.pth"
    torch.save(model.state_dict(), weights)
    package = tmp_path / "r3d.pt2"
    r = export("r3d_18", str(package), "--weights", str(weights), "--frames", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    stated = declaration(package)
    assert stated["inputs"] == [{"shape": [-1, 4, 3, 112, 112], "dtype": "float32"}]
    assert stated["video"]["layout"] == "clips" and stated["video"]["frames"] == 4
    assert stated["video"]["mean"] == pytest.approx([0.43216, 0.394666, 0.37645])
    model.fc = torch.nn.Identity()
    clips = torch.randn(2, 4, 3, 112, 112)
    with torch.no_grad():
        expected = model.eval()(clips.permute(0, 2, 1, 3, 4))
        got = torch._inductor.aoti_load_package(str(package))(clips)
    assert got.shape == (2, 512)
    assert (got - expected).abs().max().item() < 1e-4


@pytest.mark.parametrize("args,message", [
    (["resnet1000", "x.pt2", "--weights", "none"], "is not a torchvision classifier; one of:"),
    (["fasterrcnn_resnet50_fpn", "x.pt2", "--weights", "none"],
     "is not a torchvision classifier"),
    (["resnet18", "x.pt2"], "say which weights with --weights"),
    (["resnet18", "x.pt2", "--weights", "IMAGENET9K"],
     "neither a file nor one of resnet18's weights (IMAGENET1K_V1, DEFAULT), nor none"),
    (["s3d", "x.pt2", "--weights", "none"], "ends in no Linear layer"),
    (["resnet18", "x.pt2", "--weights", "none", "--frames", "4"], "--frames is for video"),
    (["r3d_18", "x.pt2", "--weights", "none", "--frames", "-1"], "frames per clip are 1 to 4096"),
    (["r3d_18", "x.pt2", "--weights", "none", "--frames", "99999"], "frames per clip are 1 to"),
    (["resnet18", "x.pt2", "--weights", ""], "not a PyTorch state_dict file"),
])
def test_mistakes_are_refused_in_one_line(tmp_path, args, message):
    args = [str(tmp_path / a) if a == "x.pt2" else a for a in args]
    r = export(*args)
    assert r.returncode == 1 and message in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "x.pt2").exists()


def test_weights_of_another_model_are_refused_naming_the_keys(tmp_path):
    import torch
    import torchvision
    weights = tmp_path / "resnet34.pth"
    torch.save(torchvision.models.resnet34().state_dict(), weights)
    r = export("resnet18", str(tmp_path / "x.pt2"), "--weights", str(weights))
    assert r.returncode == 1 and "does not fit torchvision resnet18" in r.stderr, r.stderr
    assert "unexpected ['layer1.2." in r.stderr
    from safetensors.torch import save_file
    save_file(torchvision.models.resnet34().state_dict(), str(tmp_path / "resnet34.safetensors"))
    r = export("resnet18", str(tmp_path / "x.pt2"), "--weights",
               str(tmp_path / "resnet34.safetensors"))
    assert r.returncode == 1 and "does not fit torchvision resnet18" in r.stderr, r.stderr
    for garbage in (tmp_path / "notes.txt", tmp_path / "broken.safetensors"):
        garbage.write_text("not a checkpoint")
        r = export("resnet18", str(tmp_path / "x.pt2"), "--weights", str(garbage))
        assert r.returncode == 1 and "not a PyTorch state_dict file" in r.stderr, r.stderr
    assert not (tmp_path / "x.pt2").exists()


def test_weights_are_for_the_torchvision_recipe_only(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    r = subprocess.run([sys.executable, "-m", "precompute.export", "clip-vision", str(tmp_path),
                        str(tmp_path / "x.pt2"), "--weights", "none"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "--weights is for the torchvision recipe" in r.stderr


def test_precompute_stores_what_torchscript_stores_without_restating_preprocessing(
        binary, resnet, tmp_path):
    import torch
    eager, package = resnet
    clips = []
    for i, colours in enumerate([["red", "blue"], ["green", "white", "black"]]):
        clips.append({"id": f"c{i}", "video": str(tmp_path / f"c{i}.mp4")})
        colour_clip(Path(clips[-1]["video"]), colours, size="160x96")
    manifest = write_manifest(tmp_path / "m.jsonl", clips)
    traced = tmp_path / "traced.pt"
    with torch.no_grad():
        torch.jit.trace(eager, torch.randn(2, 3, 224, 224)).save(str(traced))
    bare = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "pt2")},
            "video": {"encoder": {"path": str(package)}, "pooling": "none",
                      "sampling": {"fps": 2}}}
    r = run_precompute(binary, tmp_path, bare)
    assert "video.size: [224,224] (model package)" in r.stderr, r.stderr[-2500:]
    stated = declaration(package)["video"]
    full = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "ts")},
            "video": {"encoder": {"path": str(traced)}, "pooling": "none",
                      "sampling": {"fps": 2}, **{k: stated[k] for k in
                                                 ("size", "mean", "std", "resize", "layout")}}}
    run_precompute(binary, tmp_path, full)
    a, b = read_output(tmp_path / "pt2"), read_output(tmp_path / "ts")
    for sample in ("c0", "c1"):
        x = np.atleast_2d(a.samples[sample]["video"]["rows"])
        y = np.atleast_2d(b.samples[sample]["video"]["rows"])
        assert x.shape == y.shape and x.shape[1] == 512
        cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        assert cos.min() >= 0.9999, (sample, cos)
