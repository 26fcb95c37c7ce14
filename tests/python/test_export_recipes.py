"""`python -m precompute.export RECIPE FOLDER OUT.pt2` on Hugging Face folders (random weights
from transformers' config classes, no download): each package returns what the eager model
returns on the same tensors, declares the input and preprocessing its folder implies, and, run by
`precompute run` with a config that states none of them, stores what the same model traced to
TorchScript stores with them stated."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, colour_clip, read_output, run_precompute, write_manifest
from tiny_vision_models import SIZE, tiny_vision_folder as tiny_folder


def export(recipe: str, folder: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    return subprocess.run([sys.executable, "-m", "precompute.export", recipe, str(folder),
                           str(out)], capture_output=True, text=True, env=env, timeout=900)


def declaration(package: Path) -> dict:
    with zipfile.ZipFile(package) as z:
        name = next(n for n in z.namelist() if n.endswith("wrapper_metadata.json"))
        return json.loads(json.loads(z.read(name))["precompute.encoder"])


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """recipe -> (eager model, folder, package)."""
    root = tmp_path_factory.mktemp("recipes")
    made = {}
    for recipe in ("clip-vision", "siglip-vision", "videomae"):
        folder = root / recipe
        model = tiny_folder(recipe, folder)
        r = export(recipe, folder, root / f"{recipe}.pt2")
        assert r.returncode == 0, r.stderr[-3000:]
        made[recipe] = (model, folder, root / f"{recipe}.pt2")
    return made


@pytest.mark.parametrize("recipe,shape,output", [
    ("clip-vision", (5, 3, SIZE, SIZE), "pooler_output"),
    ("siglip-vision", (5, 3, SIZE, SIZE), "pooler_output"),
    ("videomae", (3, 4, 3, SIZE, SIZE), "last_hidden_state")])
def test_a_package_returns_what_the_eager_model_returns(packages, recipe, shape, output):
    import torch
    model, _, package = packages[recipe]
    x = torch.randn(*shape)
    with torch.no_grad():
        expected = getattr(model(pixel_values=x), output)
        if recipe == "videomae":
            expected = expected.mean(dim=1)
        got = torch._inductor.aoti_load_package(str(package))(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-4


def test_each_package_declares_what_its_folder_implies(packages):
    clip = declaration(packages["clip-vision"][2])
    assert clip["inputs"] == [{"shape": [-1, 3, SIZE, SIZE], "dtype": "float32"}]
    assert clip["video"] == {"size": [SIZE, SIZE], "mean": [0.48, 0.46, 0.41],
                             "std": [0.27, 0.26, 0.28], "resize": "shorter_side_crop",
                             "layout": "frames"}
    siglip = declaration(packages["siglip-vision"][2])["video"]
    assert siglip["resize"] == "stretch" and siglip["mean"] == [0.5] * 3
    mae = declaration(packages["videomae"][2])
    assert mae["inputs"] == [{"shape": [-1, 4, 3, SIZE, SIZE], "dtype": "float32"}]
    assert mae["video"]["layout"] == "clips" and mae["video"]["frames"] == 4


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    r = export("clip-vision", tmp_path, tmp_path / "x.pt2")
    assert r.returncode != 0 and "holds no config.json" in r.stderr


class Traced:
    """The recipe's module traced to TorchScript: the same computation as a file precompute
    loads the classic way."""

    @staticmethod
    def save(recipe: str, model, path: Path) -> None:
        import torch
        sys.path.insert(0, str(ROOT / "python"))
        from precompute.export import _Pooled, _TokenMean
        wrapped = _TokenMean(model) if recipe == "videomae" else _Pooled(model, "pooler_output")
        shape = (2, 4, 3, SIZE, SIZE) if recipe == "videomae" else (2, 3, SIZE, SIZE)
        with torch.no_grad():
            torch.jit.trace(wrapped.eval(), torch.randn(*shape), strict=False).save(str(path))


@pytest.mark.parametrize("recipe", ["clip-vision", "videomae"])
def test_precompute_stores_what_torchscript_stores_without_restating_preprocessing(
        binary, packages, recipe, tmp_path):
    model, _, package = packages[recipe]
    clips = []
    for i, colours in enumerate([["red", "blue", "white"], ["green", "black"]]):
        clips.append({"id": f"c{i}", "video": str(tmp_path / f"c{i}.mp4")})
        colour_clip(Path(clips[-1]["video"]), colours, size="96x64")
    manifest = write_manifest(tmp_path / "m.jsonl", clips)
    stated = declaration(package)["video"]
    traced = tmp_path / "traced.pt"
    Traced.save(recipe, model, traced)
    sampling = {"num_frames": 4} if recipe == "videomae" else {"fps": 2}
    pooling = "model" if recipe == "videomae" else "none"
    bare = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "pt2")},
            "video": {"encoder": {"path": str(package)}, "pooling": pooling}}
    if recipe != "videomae":
        bare["video"]["sampling"] = sampling
    r = run_precompute(binary, tmp_path, bare)
    assert f"video.size: [{SIZE},{SIZE}] (model package)" in r.stderr, r.stderr[-2500:]
    full = {"input": {"manifest": str(manifest)}, "output": {"path": str(tmp_path / "ts")},
            "video": {"encoder": {"path": str(traced)}, "pooling": pooling,
                      "sampling": sampling, "size": stated["size"], "mean": stated["mean"],
                      "std": stated["std"], "resize": stated["resize"],
                      "layout": stated["layout"]}}
    run_precompute(binary, tmp_path, full)
    a, b = read_output(tmp_path / "pt2"), read_output(tmp_path / "ts")
    for sample in ("c0", "c1"):
        key = "vector" if recipe == "videomae" else "rows"
        x = np.atleast_2d(a.samples[sample]["video"][key])
        y = np.atleast_2d(b.samples[sample]["video"][key])
        assert x.shape == y.shape
        cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
        assert cos.min() >= 0.9999, (recipe, sample, cos)


def test_lists_of_dtypes_make_one_build_each(packages, tmp_path):
    """--dtype float32,bfloat16: one package, a build per dtype, each declaring its own input
    dtype and both the folder's preprocessing (Note [Builds in one package])."""
    import torch
    model, folder, _ = packages["clip-vision"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    out = tmp_path / "both.pt2"
    r = subprocess.run([sys.executable, "-m", "precompute.export", "clip-vision", str(folder),
                        str(out), "--dtype", "float32,bfloat16"], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "builds cpu_float32, cpu_bfloat16" in r.stdout
    with zipfile.ZipFile(out) as z:
        declared = {}
        for name in z.namelist():
            if name.endswith("wrapper_metadata.json"):
                build = name.split("/")[3]
                declared[build] = json.loads(json.loads(z.read(name))["precompute.encoder"])
    assert declared["cpu_float32"]["inputs"][0]["dtype"] == "float32"
    assert declared["cpu_bfloat16"]["inputs"][0]["dtype"] == "bfloat16"
    assert declared["cpu_float32"]["video"] == declared["cpu_bfloat16"]["video"]
    from torch._inductor.package import load_package
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        expected = model(pixel_values=x).pooler_output
        got = load_package(str(out), "cpu_float32")(x)
    assert (got - expected).abs().max().item() < 1e-4


def test_a_traced_tower_runs_in_bfloat16_with_its_integer_buffers(binary, packages, tmp_path):
    """A traced transformers tower keeps its position ids as an int64 buffer that indexes its
    position embedding. Running it in bfloat16 casts the module's floating-point tensors only
    (Note [Casting a TorchScript model to the compute dtype]); casting the ids too failed every
    batch. The bfloat16 rows are the float32 rows within bfloat16's precision."""
    import copy

    import torch
    sys.path.insert(0, str(ROOT / "python"))
    from precompute.export import _Pooled
    model, _, package = packages["clip-vision"]
    assert any(not b.is_floating_point() for b in model.buffers())  # the case in point
    stated = declaration(package)["video"]
    clips = []
    for i, colours in enumerate([["red", "blue", "white"], ["green", "black"]]):
        clips.append({"id": f"c{i}", "video": str(tmp_path / f"c{i}.mp4")})
        colour_clip(Path(clips[-1]["video"]), colours, size="96x64")
    manifest = write_manifest(tmp_path / "m.jsonl", clips)
    rows = {}
    for dtype in ("float32", "bfloat16"):
        kind = getattr(torch, dtype)
        traced = tmp_path / f"{dtype}.pt"
        # Traced in the dtype it runs in: a float32 trace records transformers' cast of the
        # input to the weights' dtype as a float32 constant.
        wrapped = _Pooled(copy.deepcopy(model).to(kind), "pooler_output").eval()
        with torch.no_grad():
            example = torch.randn(2, 3, SIZE, SIZE, dtype=kind)
            torch.jit.trace(wrapped, example, strict=False).save(str(traced))
        out = tmp_path / f"out-{dtype}"
        config = {"input": {"manifest": str(manifest)}, "output": {"path": str(out)},
                  "video": {"encoder": {"path": str(traced)}, "pooling": "none",
                            "sampling": {"fps": 2}, "dtype": dtype, "size": stated["size"],
                            "mean": stated["mean"], "std": stated["std"],
                            "resize": stated["resize"]}}
        run_precompute(binary, tmp_path, config)
        got = read_output(out)
        rows[dtype] = np.concatenate([np.atleast_2d(got.samples[s]["video"]["rows"])
                                      for s in ("c0", "c1")]).astype(np.float64)
    x, y = rows["float32"], rows["bfloat16"]
    assert x.shape == y.shape and x.shape[0] >= 4
    x, y = x - x.mean(0), y - y.mean(0)  # a random tower's rows are alike across frames
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    assert cos.min() >= 0.98, cos
    # The float32 trace run in bfloat16 casts its input back to float32 inside: refused at the
    # warm-up with the fix named (Note [Two dtypes inside a model]).
    config["video"]["encoder"]["path"] = str(tmp_path / "float32.pt")
    config["output"]["path"] = str(tmp_path / "out-mixed")
    r = run_precompute(binary, tmp_path, config, expect=2)
    assert "Tensors of two dtypes met inside the model" in r.stderr, r.stderr[-2000:]
    assert "trace it in the dtype video.dtype sets" in r.stderr, r.stderr[-2000:]
