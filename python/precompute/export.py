"""Package a PyTorch module or a Hugging Face folder (`python -m precompute.export RECIPE FOLDER
OUT.pt2`: clip-vision, siglip-vision, videomae) as an AOTInductor `.pt2` encoder that
`precompute run` loads natively
(`encoder: {path: model.pt2}` under `video` or `audio`), with no Python at run time.

    from precompute.export import package
    package(module, [InputSpec((-1, 3, 224, 224))], "clip.pt2")          # frames [N, 3, H, W]
    package(module, [InputSpec((-1, 16000)), InputSpec((-1,), "int64")], "audio.pt2")

An AOTInductor package runs whatever it is given: a 96x96 image into a model exported at 112x112,
or fp16 into an fp32 model, gives wrong vectors without a word. So the package carries what it
takes (each input's shape, -1 where it is dynamic, and dtype) in its metadata, under
"precompute.encoder"; `precompute run` refuses a package without it and checks every call
against it (docs/encoders.md). A package holds code for one device kind and one dtype: export one
per device (`device="cuda"` on the GPU machine) and dtype.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple, Union

import torch

METADATA_KEY = "precompute.encoder"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}


@dataclass(frozen=True)
class InputSpec:
    """One input of forward(): its shape (-1: dynamic; dimension 0, the batch, always is) and
    dtype name."""
    shape: Tuple[int, ...]
    dtype: str = "float32"

    def example(self, device: str, dynamic_size: int = 2) -> torch.Tensor:
        sizes = [dynamic_size if d == -1 else d for d in self.shape]
        if self.dtype.startswith("int") or self.dtype == "uint8":
            return torch.full(sizes, 4, dtype=DTYPES[self.dtype], device=device)
        return torch.randn(sizes, device=device).to(DTYPES[self.dtype])


def package(module: torch.nn.Module, inputs: Sequence[InputSpec], out: Union[str, Path],
            device: str = "cpu", max_batch: int = 65535,
            settings: Optional[Dict[str, dict]] = None) -> Path:
    """Exports `module` (eval mode, on `device`) with every -1 dimension dynamic and dimension 0
    shared by all inputs (the batch), compiles it with AOTInductor and writes `out` (.pt2) with
    the inputs declared in its metadata. `settings` are the preprocessing the model expects,
    which `precompute run` takes for every key its config file leaves out:
    {"video": {"size": [224, 224], "mean": [...], "std": [...], "resize": "shorter_side_crop",
    "layout": "frames" or "clips", "frames": 16}} or {"audio": {"sample_rate": 16000,
    "window_s": 30.0}}. Returns `out`."""
    for spec in inputs:
        if spec.dtype not in DTYPES:
            raise ValueError(f"dtype {spec.dtype!r} is not one of {sorted(DTYPES)}")
        if not spec.shape or spec.shape[0] != -1:
            raise ValueError(f"shape {spec.shape}: dimension 0 is the batch and must be -1")
    module = module.eval().to(device)
    # 65535: on cuda, Inductor's kernels put the batch on a grid dimension of at most 2^16 - 1
    # blocks, and export refuses a range its guards do not cover.
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    dynamic = []
    for k, spec in enumerate(inputs):
        dims = {0: batch}
        for d, size in enumerate(spec.shape[1:], start=1):
            if size == -1:
                dims[d] = torch.export.Dim(f"input{k}_dim{d}", min=1, max=1 << 24)
        dynamic.append(dims)
    examples = tuple(spec.example(device) for spec in inputs)
    with torch.no_grad():
        program = torch.export.export(module, examples, dynamic_shapes=tuple(dynamic))
    declared = {"inputs": [{"shape": list(s.shape), "dtype": s.dtype} for s in inputs],
                **(settings or {})}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(out),
        inductor_configs={"aot_inductor.metadata": {METADATA_KEY: json.dumps(declared)}})
    return out


# --------------------------------------------------------------------------------------------
# Recipes: a Hugging Face folder in, a package that returns one tensor out.
#
#     python -m precompute.export clip-vision FOLDER OUT.pt2 [--projection] [--device cuda]
#     python -m precompute.export siglip-vision FOLDER OUT.pt2 [--dtype float16]
#     python -m precompute.export videomae FOLDER OUT.pt2 [--frames 16]

class _Pooled(torch.nn.Module):
    """A vision tower's pooled output for frames [N, 3, H, W] (`attribute` of its output)."""

    def __init__(self, model: torch.nn.Module, attribute: str):
        super().__init__()
        self.model, self.attribute = model, attribute

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(pixel_values=frames), self.attribute)


class _TokenMean(torch.nn.Module):
    """A video model's last hidden state averaged over its tokens: clips [B, T, 3, H, W] ->
    [B, D]."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=clips).last_hidden_state.mean(dim=1)


def _processor(folder: Path) -> dict:
    path = folder / "preprocessor_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _side(value, default: int) -> Tuple[int, int]:
    """(height, width) of a processor's `size` / `crop_size` entry."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, dict):
        if "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        if "shortest_edge" in value:
            return int(value["shortest_edge"]), int(value["shortest_edge"])
    return default, default


def _image_settings(folder: Path, image_size: int, crop: bool) -> dict:
    """The video settings a processor folder implies: input size, mean/std, and whether it
    crops the centre after resizing the shorter side (CLIP, VideoMAE) or resizes the whole
    frame (SigLIP)."""
    p = _processor(folder)
    crop = bool(p.get("do_center_crop", crop))
    size = _side(p.get("crop_size") if crop else p.get("size"), image_size)
    return {"size": list(size), "mean": [float(x) for x in p.get("image_mean", [0.5] * 3)],
            "std": [float(x) for x in p.get("image_std", [0.5] * 3)],
            "resize": "shorter_side_crop" if crop else "stretch", "layout": "frames"}


def _clip_vision(folder: Path, args) -> tuple:
    from transformers import CLIPVisionModel, CLIPVisionModelWithProjection
    if args.projection:
        model = _Pooled(CLIPVisionModelWithProjection.from_pretrained(folder), "image_embeds")
    else:
        model = _Pooled(CLIPVisionModel.from_pretrained(folder), "pooler_output")
    size = model.model.config.image_size
    settings = _image_settings(folder, size, crop=True)
    return model, [InputSpec((-1, 3, *settings["size"]), args.dtype)], {"video": settings}


def _siglip_vision(folder: Path, args) -> tuple:
    from transformers import SiglipVisionModel
    model = _Pooled(SiglipVisionModel.from_pretrained(folder), "pooler_output")
    settings = _image_settings(folder, model.model.config.image_size, crop=False)
    return model, [InputSpec((-1, 3, *settings["size"]), args.dtype)], {"video": settings}


def _videomae(folder: Path, args) -> tuple:
    from transformers import VideoMAEModel
    inner = VideoMAEModel.from_pretrained(folder)
    frames = args.frames or inner.config.num_frames
    if frames != inner.config.num_frames:
        raise SystemExit(f"{folder} is a VideoMAE for {inner.config.num_frames} frames per "
                         f"clip; --frames {frames} would not match its position embeddings")
    settings = {**_image_settings(folder, inner.config.image_size, crop=True),
                "layout": "clips", "frames": frames}
    spec = InputSpec((-1, frames, 3, *settings["size"]), args.dtype)
    return _TokenMean(inner), [spec], {"video": settings}


RECIPES = {"clip-vision": _clip_vision, "siglip-vision": _siglip_vision, "videomae": _videomae}


def main(argv: Optional[Sequence[str]] = None) -> None:
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m precompute.export",
        description="Package a Hugging Face model folder as a .pt2 encoder for precompute. The "
                    "package declares its input and preprocessing, which `precompute run` "
                    "takes for every key the config leaves out (docs/pt2_encoders.md).")
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("folder", type=Path, help="the model folder (config.json, weights, "
                                                  "preprocessor_config.json)")
    parser.add_argument("out", type=Path, help="the package to write (.pt2)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="the device it will run on: a package holds code for one")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="the dtype it computes in (video.dtype must match)")
    parser.add_argument("--projection", action="store_true",
                        help="clip-vision: the projected image_embeds, not pooler_output")
    parser.add_argument("--frames", type=int, default=0,
                        help="videomae: frames per clip (default: the model's)")
    args = parser.parse_args(argv)
    if not (args.folder / "config.json").exists():
        raise SystemExit(f"{args.folder} holds no config.json: pass a Hugging Face model folder")
    module, inputs, settings = RECIPES[args.recipe](args.folder, args)
    module = module.eval().to(DTYPES[args.dtype])
    out = package(module, inputs, args.out, device=args.device, settings=settings)
    print(f"wrote {out}: takes {[list(i.shape) for i in inputs]} {args.dtype} on {args.device}; "
          f"settings {json.dumps(settings)}")


if __name__ == "__main__":
    main()
