"""Package a PyTorch module as an AOTInductor `.pt2` encoder that `precompute run` loads natively
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
            device: str = "cpu", max_batch: int = 65536,
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
