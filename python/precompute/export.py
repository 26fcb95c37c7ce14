"""Package a PyTorch module, a Hugging Face folder (`python -m precompute.export RECIPE FOLDER
OUT.pt2`: clip-vision, siglip-vision, videomae; wav2vec2, hubert, whisper-encoder for audio) or
a torchvision classifier (`torchvision NAME OUT.pt2 --weights ...`) as an AOTInductor `.pt2`
encoder that `precompute run` loads natively (`encoder: {path: model.pt2}` under `video` or
`audio`), with no Python at run time.

    from precompute.export import package
    package(module, [InputSpec((-1, 3, 224, 224))], "clip.pt2")          # frames [N, 3, H, W]
    package(module, [InputSpec((-1, 16000)), InputSpec((-1,), "int64")], "audio.pt2")

An AOTInductor package runs whatever it is given: a 96x96 image into a model exported at 112x112,
or fp16 into an fp32 model, gives wrong vectors without a word. So the package carries what it
takes (each input's shape, -1 where it is dynamic, and dtype) in its metadata, under
"precompute.encoder"; `precompute run` refuses a package without it and checks every call
against it (docs/encoders.md). A build holds code for one device kind and one dtype: export one
per device (`device="cuda"` on a machine with a GPU) and dtype, or put several builds in one
package with `package_builds` (docs/pt2_encoders.md, "Several builds in one package").
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
    min_size: int = 1   # the smallest size its dynamic dimensions other than the batch take

    def example(self, device: str, dynamic_size: int = 2) -> torch.Tensor:
        sizes = [d if d != -1 else dynamic_size if k == 0 else max(dynamic_size, self.min_size)
                 for k, d in enumerate(self.shape)]
        if self.dtype.startswith("int") or self.dtype == "uint8":
            return torch.full(sizes, 4, dtype=DTYPES[self.dtype], device=device)
        return torch.randn(sizes, device=device).to(DTYPES[self.dtype])


def _export(module: torch.nn.Module, inputs: Sequence[InputSpec], device: str,
            max_batch: int, examples: Optional[Sequence[torch.Tensor]]):
    """`module` exported with every -1 dimension of `inputs` dynamic (torch.export)."""
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
                # DYNAMIC, not a named Dim: a model whose shape arithmetic the solver cannot
                # prove for every size (wav2vec2's strided convolutions) still exports; the
                # range it ends with is checked when the package runs, and reported below.
                dims[d] = torch.export.Dim.DYNAMIC(min=spec.min_size, max=1 << 24)
        dynamic.append(dims)
    if examples is None:
        examples = tuple(spec.example(device) for spec in inputs)
    examples = tuple(x.to(device) for x in examples)
    with torch.no_grad():
        program = torch.export.export(module, examples, dynamic_shapes=tuple(dynamic))
    _report_narrowed_ranges(program, inputs)
    return program


def package(module: torch.nn.Module, inputs: Sequence[InputSpec], out: Union[str, Path],
            device: str = "cpu", max_batch: int = 65535,
            settings: Optional[Dict[str, dict]] = None,
            examples: Optional[Sequence[torch.Tensor]] = None) -> Path:
    """Exports `module` (eval mode, on `device`) with every -1 dimension dynamic and dimension 0
    shared by all inputs (the batch), compiles it with AOTInductor and writes `out` (.pt2) with
    the inputs declared in its metadata. `settings` are the preprocessing the model expects,
    which `precompute run` takes for every key its config file leaves out:
    {"video": {"size": [224, 224], "mean": [...], "std": [...], "resize": "shorter_side_crop",
    "layout": "frames" or "clips", "frames": 16}} or {"audio": {"sample_rate": 16000,
    "window_s": 30.0}}. `examples` are the inputs it is traced with (default: random ones of
    the specs' shapes, size 2 for each dynamic dimension, or its `min_size`). Returns `out`."""
    program = _export(module, inputs, device, max_batch, examples)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch._inductor.aoti_compile_and_package(
        program, package_path=str(out),
        inductor_configs={"aot_inductor.metadata": {METADATA_KEY: _declaration(inputs,
                                                                               settings)}})
    return out


def build_name(device: str, dtype: str) -> str:
    """The name of a package's build for a device kind and dtype, as `precompute run` looks for
    it: "cuda_float16", "cpu_float32"."""
    return f"{device}_{dtype}"


@dataclass
class Build:
    """One build of a multi-build package: the module in its dtype, its inputs, its device."""
    module: torch.nn.Module
    inputs: Sequence[InputSpec]
    device: str = "cpu"
    examples: Optional[Sequence[torch.Tensor]] = None


def package_builds(builds: Dict[str, Build], out: Union[str, Path],
                   settings: Optional[Dict[str, dict]] = None, max_batch: int = 65535) -> Path:
    """Several builds of one model in one package, each under its name (`build_name(device,
    dtype)`), so that one file serves every device and dtype it was built for: `precompute run`
    loads the build named after its section's device kind and dtype. Returns `out`."""
    from torch._inductor.package import package_aoti
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, build in builds.items():
        program = _export(build.module, build.inputs, build.device, max_batch, build.examples)
        args, kwargs = program.example_inputs
        options = {"aot_inductor.package": True,
                   "aot_inductor.metadata": {METADATA_KEY: _declaration(build.inputs, settings)}}
        files[name] = torch._inductor.aot_compile(program.module(check_guards=False), args,
                                                  kwargs, options=options)
    package_aoti(str(out), files)
    return out


def _declaration(inputs: Sequence[InputSpec], settings: Optional[Dict[str, dict]]) -> str:
    return json.dumps({"inputs": [{"shape": list(s.shape), "dtype": s.dtype} for s in inputs],
                       **(settings or {})})


def _report_narrowed_ranges(program, inputs: Sequence[InputSpec]) -> None:
    """Prints a warning for each dynamic dimension that export could only make dynamic over a
    narrower range than asked: the package refuses other sizes when it runs."""
    import sys
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"
                    and n.name not in program.graph_signature.inputs_to_parameters
                    and n.name not in program.graph_signature.inputs_to_buffers
                    and n.name not in program.graph_signature.inputs_to_lifted_tensor_constants]
    for k, (node, spec) in enumerate(zip(placeholders, inputs)):
        value = node.meta.get("val")
        for d, size in enumerate(spec.shape[1:], start=1):
            if size != -1 or value is None or not isinstance(value.shape[d], torch.SymInt):
                continue
            r = program.range_constraints.get(value.shape[d].node.expr)
            if r is not None and (int(r.lower) > spec.min_size or int(r.upper) < 1 << 24):
                print(f"warning: input {k} dimension {d} takes sizes {r.lower} to {r.upper} only",
                      file=sys.stderr)


# --------------------------------------------------------------------------------------------
# Recipes: a Hugging Face folder in, a package that returns one tensor out.
#
#     python -m precompute.export clip-vision FOLDER OUT.pt2 [--projection] [--device cuda]
#     python -m precompute.export siglip-vision FOLDER OUT.pt2 [--dtype float16]
#     python -m precompute.export videomae FOLDER OUT.pt2 [--frames 16]
#     python -m precompute.export wav2vec2 FOLDER OUT.pt2 [--window-s 10]   (hubert the same)
#     python -m precompute.export whisper-encoder FOLDER OUT.pt2
#     python -m precompute.export torchvision NAME OUT.pt2 --weights FILE|NAME|none [--frames 16]

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


# Audio recipes. `precompute run` sends an audio encoder windows of `window_s` seconds as a
# waveform [N, S] (float, mono, at `sample_rate`, zeros past the end of the clip) and lengths
# [N] (int64: the samples of each row before that zero padding); it wants [N, D] back
# (docs/encoders.md, "Encoder contracts"). Each recipe averages the model's last hidden state
# over the frames its valid samples make, so that the zero padding of a clip's last window
# weighs nothing in the mean.

def _valid(lengths: torch.Tensor, size) -> torch.Tensor:
    """[N, size] bool: the positions of each row before its length."""
    return torch.arange(size, device=lengths.device)[None, :] < lengths[:, None]


def _mean_over(hidden: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """hidden [N, T, D] averaged over the first frames[i] (>= 1) frames of row i, in float32."""
    keep = _valid(frames, hidden.shape[1]).to(torch.float32)[:, :, None]
    total = (hidden.to(torch.float32) * keep).sum(dim=1)
    return (total / frames[:, None].to(torch.float32)).to(hidden.dtype)


def _unit_variance(x: torch.Tensor, valid: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Wav2Vec2FeatureExtractor's zero_mean_unit_var_norm with an attention mask: each row minus
    the mean of its valid samples, over the square root of their (population) variance + 1e-7,
    and zero past them."""
    keep = valid.to(x.dtype)
    count = lengths.to(x.dtype)[:, None]
    mean = (x * keep).sum(dim=1, keepdim=True) / count
    var = ((x - mean) * keep).pow(2).sum(dim=1, keepdim=True) / count
    return (x - mean) / torch.sqrt(var + 1e-7) * keep


class _FrameMean(torch.nn.Module):
    """wav2vec2 / HuBERT on the raw waveform (waveform [N, S], lengths [N]) -> [N, D]: samples
    past each length set to zero, normalised over the valid ones when the feature extractor
    normalises, an attention mask over them for models whose feature encoder uses layer norm
    (group-norm models are meant to see zero padding and no mask, as Hugging Face feeds them),
    and last_hidden_state averaged over the frames the valid samples make (the model's
    _get_feat_extract_output_lengths). A length of 0 counts as 1 (one frame is averaged)."""

    def __init__(self, model: torch.nn.Module, normalize: bool, attention_mask: bool):
        super().__init__()
        self.model, self.normalize, self.attention_mask = model, normalize, attention_mask

    def forward(self, waveform: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        size = waveform.shape[1]
        lengths = torch.clamp(lengths, min=1).minimum(torch.full_like(lengths, size))
        valid = _valid(lengths, size)
        x = waveform.to(torch.float32) * valid
        if self.normalize:
            x = _unit_variance(x, valid, lengths)
        mask = valid.to(torch.long) if self.attention_mask else None
        hidden = self.model(x.to(waveform.dtype), attention_mask=mask).last_hidden_state
        frames = self.model._get_feat_extract_output_lengths(lengths)
        frames = torch.clamp(frames, min=1).minimum(torch.full_like(frames, hidden.shape[1]))
        return _mean_over(hidden, frames)


class _WhisperMean(torch.nn.Module):
    """Whisper's encoder on the raw waveform (waveform [N, n_samples], lengths [N]) -> [N, D]:
    WhisperFeatureExtractor's log-mel features computed in the package (float32), the encoder,
    and its output averaged over the first ceil(length / frame_samples) frames, the frames that
    hold audio. A length of 0 counts as 1."""

    def __init__(self, encoder: torch.nn.Module, mel_filters, n_fft: int, hop_length: int,
                 frame_samples: int):
        super().__init__()
        self.model, self.n_fft, self.hop_length = encoder, n_fft, hop_length
        self.frame_samples = frame_samples
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("mel_filters", torch.as_tensor(mel_filters).to(torch.float32))

    def log_mel(self, waveform: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """WhisperFeatureExtractor's input_features: [N, mel bins, S // hop_length] float32
        (its _torch_extract_fbank_features, on the waveform zero past each length)."""
        x = waveform.to(torch.float32) * _valid(lengths, waveform.shape[1])
        stft = torch.stft(x, self.n_fft, self.hop_length, window=self.window.to(torch.float32),
                          return_complex=True)
        magnitudes = stft[..., :-1].abs() ** 2
        mel = self.mel_filters.to(torch.float32).T @ magnitudes
        log_spec = torch.clamp(mel, min=1e-10).log10()
        top = log_spec.amax(dim=(1, 2), keepdim=True)
        log_spec = torch.maximum(log_spec, top - 8.0)
        return (log_spec + 4.0) / 4.0

    def forward(self, waveform: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        size = waveform.shape[1]
        lengths = torch.clamp(lengths, min=1).minimum(torch.full_like(lengths, size))
        dtype = next(self.model.parameters()).dtype
        hidden = self.model(self.log_mel(waveform, lengths).to(dtype)).last_hidden_state
        frames = (lengths + self.frame_samples - 1) // self.frame_samples
        frames = frames.minimum(torch.full_like(frames, hidden.shape[1]))
        return _mean_over(hidden, frames)


def _model_config(folder: Path, recipe: str, model_type: str) -> dict:
    """The folder's config.json, refused (exit 1, one line) unless its model_type is
    `model_type`."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"{folder}/config.json cannot be read as JSON: {e}")
    found = config.get("model_type") if isinstance(config, dict) else None
    if found != model_type:
        raise SystemExit(f"{folder} holds a {found!r} model (config.json model_type), not a "
                         f"{model_type!r} one: the {recipe} recipe takes a {model_type} model "
                         f"folder")
    return config


def _warn(message: str) -> None:
    import sys
    print(f"warning: {message}", file=sys.stderr)


def _wav2vec2_family(folder: Path, args, recipe: str, model_type: str, class_name: str) -> tuple:
    _model_config(folder, recipe, model_type)
    import transformers
    model = getattr(transformers, class_name).from_pretrained(folder)
    processor = _processor(folder)
    if not processor:
        _warn(f"{folder} has no preprocessor_config.json: normalising the waveform as "
              f"Wav2Vec2FeatureExtractor does by default (do_normalize true), at 16000 Hz")
    normalize = bool(processor.get("do_normalize", True))
    rate = int(processor.get("sampling_rate", 16000))
    window_s = 10.0 if args.window_s is None else args.window_s
    # The fewest samples that make two frames (400 + 320 = 720 for wav2vec2-base's encoder): a
    # window of one frame would be a shape of its own to export, so the package refuses it.
    reach = 2
    for kernel, stride in reversed(list(zip(model.config.conv_kernel, model.config.conv_stride))):
        reach = (reach - 1) * stride + kernel
    wrapped = _FrameMean(model, normalize, model.config.feat_extract_norm == "layer")
    # Traced on one second, a full row and a shorter one: S (and the batch) stay dynamic.
    examples = (torch.randn(2, rate).to(DTYPES[args.dtype]), torch.tensor([rate, rate // 2]))
    inputs = [InputSpec((-1, -1), args.dtype, min_size=reach), InputSpec((-1,), "int64")]
    return wrapped, inputs, {"audio": {"sample_rate": rate, "window_s": window_s}}, examples


def _wav2vec2(folder: Path, args) -> tuple:
    return _wav2vec2_family(folder, args, "wav2vec2", "wav2vec2", "Wav2Vec2Model")


def _hubert(folder: Path, args) -> tuple:
    return _wav2vec2_family(folder, args, "hubert", "hubert", "HubertModel")


def _whisper_encoder(folder: Path, args) -> tuple:
    _model_config(folder, "whisper-encoder", "whisper")
    from transformers import WhisperFeatureExtractor, WhisperModel
    encoder = WhisperModel.from_pretrained(folder).encoder
    config = encoder.config
    if (folder / "preprocessor_config.json").exists():
        extractor = WhisperFeatureExtractor.from_pretrained(folder)
    else:
        _warn(f"{folder} has no preprocessor_config.json: using WhisperFeatureExtractor's "
              f"defaults with {config.num_mel_bins} mel bins")
        extractor = WhisperFeatureExtractor(feature_size=config.num_mel_bins)
    if extractor.feature_size != config.num_mel_bins:
        raise SystemExit(f"{folder}: preprocessor_config.json gives {extractor.feature_size} mel "
                         f"bins and config.json num_mel_bins {config.num_mel_bins}")
    strides = encoder.conv1.stride[0] * encoder.conv2.stride[0]
    if extractor.nb_max_frames != config.max_source_positions * strides:
        raise SystemExit(f"{folder}: {extractor.chunk_length} s windows make "
                         f"{extractor.nb_max_frames} mel frames, and the encoder takes "
                         f"{config.max_source_positions * strides}")
    if args.window_s is not None and args.window_s != extractor.chunk_length:
        raise SystemExit(f"whisper-encoder: the encoder takes windows of "
                         f"{extractor.chunk_length} s; --window-s {args.window_s} cannot be")
    if getattr(extractor, "dither", 0.0):
        _warn(f"{folder}: the feature extractor's dither {extractor.dither} is not applied "
              f"(the package is deterministic)")
    wrapped = _WhisperMean(encoder, extractor.mel_filters, extractor.n_fft,
                           extractor.hop_length, extractor.hop_length * strides)
    inputs = [InputSpec((-1, extractor.n_samples), args.dtype), InputSpec((-1,), "int64")]
    settings = {"audio": {"sample_rate": int(extractor.sampling_rate),
                          "window_s": float(extractor.chunk_length)}}
    return wrapped, inputs, settings


# torchvision recipe: a model by its torchvision name rather than a folder. The classifier's
# last Linear layer becomes the identity, so the package returns the features it was fed (the
# pooled vector a linear probe reads), not class logits.

_TORCHVISION_OTHER_TASKS = ("detection", "segmentation", "optical_flow", "quantization")


class _Features(torch.nn.Module):
    """A torchvision classifier without its head: frames [N, 3, H, W] -> [N, D]; a video
    classifier takes clips as precompute sends them, [B, T, 3, H, W], in torchvision's order
    [B, 3, T, H, W]."""

    def __init__(self, model: torch.nn.Module, clips: bool):
        super().__init__()
        self.model, self.clips = model, clips

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.clips:
            x = x.permute(0, 2, 1, 3, 4)
        return self.model(x)


def _torchvision_names() -> Tuple[set, set]:
    """(image classifiers, video classifiers) that torchvision registers."""
    import torchvision.models as models
    video = set(models.list_models(module=models.video))
    other = set()
    for task in _TORCHVISION_OTHER_TASKS:
        other |= set(models.list_models(module=getattr(models, task)))
    return set(models.list_models(module=models)) - video - other, video


def _drop_head(model: torch.nn.Module, name: str) -> str:
    """Replaces the model's last Linear layer (in registration order, where torchvision puts
    the classifier) by the identity; returns its qualified name."""
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        raise SystemExit(f"torchvision {name} ends in no Linear layer: the torchvision recipe "
                         f"takes classifiers whose head is one; package it with "
                         f"precompute.export.package (docs/pt2_encoders.md)")
    head = linears[-1]
    parent = model.get_submodule(head.rpartition(".")[0]) if "." in head else model
    setattr(parent, head.rpartition(".")[2], torch.nn.Identity())
    return head


def _checkpoint(path: Path, head: str) -> dict:
    """A state_dict from a file (torch.save's, or .safetensors): a bare one, or one under
    "state_dict" / "model" (training checkpoints), with DistributedDataParallel's "module."
    prefix removed and the head's entries dropped (the package has no head, so a fine-tuned
    head of any width loads)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any reading error is the file's
        raise SystemExit(f"--weights {path}: not a PyTorch state_dict file nor safetensors "
                         f"({e})")
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise SystemExit(f"--weights {path}: holds no state_dict (a dict of tensors)")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return {k: v for k, v in state.items() if not k.startswith(head + ".")}


def _torchvision(source: Path, args) -> tuple:
    try:
        import torchvision.models as models
    except ImportError:
        raise SystemExit("the torchvision recipe needs torchvision: pip install torchvision "
                         "(the release paired with your torch)")
    name = str(source)
    images, videos = _torchvision_names()
    if name not in images | videos:
        raise SystemExit(f"{name!r} is not a torchvision classifier; one of: "
                         f"{', '.join(sorted(images | videos))}")
    enum = models.get_model_weights(name)
    spec = args.weights
    if spec is None:
        raise SystemExit(f"torchvision {name}: say which weights with --weights: a state_dict "
                         f"file, one of {', '.join(enum.__members__)} (torchvision "
                         f"loads it from its cache, downloading it once), or none (random "
                         f"weights, for tests and speed)")
    named = None
    if spec != "none" and not Path(spec).exists():
        try:
            named = enum[spec]
        except KeyError:
            raise SystemExit(f"--weights {spec}: neither a file nor one of {name}'s weights "
                             f"({', '.join(enum.__members__)}), nor none")
    # torchvision builds a model for named weights itself (class count, input transforms
    # such weights were trained with) and checks the file's hash.
    model = models.get_model(name, weights=named)
    head = _drop_head(model, name)
    if spec != "none" and named is None:
        result = model.load_state_dict(_checkpoint(Path(spec), head), strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise SystemExit(f"--weights {spec} does not fit torchvision {name}: missing "
                             f"{result.missing_keys[:5]}, unexpected "
                             f"{result.unexpected_keys[:5]} (of {len(result.missing_keys)} and "
                             f"{len(result.unexpected_keys)})")
    # The eval transform of the weights (the default weights' for a file or none): its crop
    # size is the input; precompute resizes the shorter side to it and crops the centre.
    transform = (named or enum.DEFAULT).transforms()
    size = [int(x) for x in transform.crop_size]
    size = size * 2 if len(size) == 1 else size
    settings = {"size": size, "mean": [float(x) for x in transform.mean],
                "std": [float(x) for x in transform.std], "resize": "shorter_side_crop"}
    clips = name in videos
    if clips:
        frames = args.frames or 16
        settings.update(layout="clips", frames=frames)
        spec_in = InputSpec((-1, frames, 3, *size), args.dtype)
    else:
        if args.frames:
            raise SystemExit(f"--frames is for video models; torchvision {name} takes frames")
        settings["layout"] = "frames"
        spec_in = InputSpec((-1, 3, *size), args.dtype)
    wrapped = _Features(model, clips).eval()
    with torch.no_grad():
        out = wrapped(spec_in.example("cpu").float())
    if out.dim() != 2:
        raise SystemExit(f"torchvision {name} without its last Linear layer ({head}) returns "
                         f"{list(out.shape)}, not [N, D]: package it with "
                         f"precompute.export.package")
    return wrapped, [spec_in], {"video": settings}


RECIPES = {"clip-vision": _clip_vision, "siglip-vision": _siglip_vision, "videomae": _videomae,
           "wav2vec2": _wav2vec2, "hubert": _hubert, "whisper-encoder": _whisper_encoder,
           "torchvision": _torchvision}


def main(argv: Optional[Sequence[str]] = None) -> None:
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m precompute.export",
        description="Package a Hugging Face model folder as a .pt2 encoder for precompute. The "
                    "package declares its input and preprocessing, which `precompute run` "
                    "takes for every key the config leaves out (docs/pt2_encoders.md).")
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("folder", type=Path, help="the model folder (config.json, weights, "
                                                  "preprocessor_config.json); for torchvision, "
                                                  "the model's name (resnet50, vit_b_16, r3d_18)")
    parser.add_argument("out", type=Path, help="the package to write (.pt2)")
    parser.add_argument("--device", default="cpu",
                        help="the device it will run on (cpu or cuda): a build holds code for "
                             "one; a list (cpu,cuda) makes one build each in the package")
    parser.add_argument("--dtype", default="float32",
                        help="the dtype it computes in (float32, float16 or bfloat16; "
                             "video.dtype must match); a list makes one build each")
    parser.add_argument("--projection", action="store_true",
                        help="clip-vision: the projected image_embeds, not pooler_output")
    parser.add_argument("--frames", type=int, default=0,
                        help="videomae: frames per clip (default: the model's); torchvision "
                             "video models: frames per clip (default 16)")
    parser.add_argument("--weights", default=None,
                        help="torchvision: a state_dict file, a weights name of the model "
                             "(DEFAULT, IMAGENET1K_V2, ...), or none for random weights")
    parser.add_argument("--window-s", type=float, default=None,
                        help="wav2vec2, hubert: the audio.window_s the package declares "
                             "(default 10; 0: each clip whole); the package takes any length")
    args = parser.parse_args(argv)
    if args.weights is not None and args.recipe != "torchvision":
        raise SystemExit(f"--weights is for the torchvision recipe; {args.recipe} reads the "
                         f"weights in its folder")
    if args.recipe != "torchvision" and not (args.folder / "config.json").exists():
        raise SystemExit(f"{args.folder} holds no config.json: pass a Hugging Face model folder")
    if args.window_s is not None and args.recipe not in ("wav2vec2", "hubert", "whisper-encoder"):
        raise SystemExit(f"--window-s is for the audio recipes, not {args.recipe}")
    if args.frames < 0 or args.frames > 4096:
        raise SystemExit(f"--frames {args.frames}: frames per clip are 1 to 4096 "
                         f"(video.max_frames' default)")
    if args.window_s is not None and args.window_s < 0:
        raise SystemExit(f"--window-s {args.window_s}: a window is 0 (whole clips) or longer")
    devices = _choices("--device", args.device, ("cpu", "cuda"))
    dtypes = _choices("--dtype", args.dtype, ("float32", "float16", "bfloat16"))
    if "cuda" in devices and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this machine has no CUDA device PyTorch can use "
                         "(torch.cuda.is_available() is False); compile CUDA builds on the "
                         "machine with the GPU")
    if len(devices) * len(dtypes) == 1:
        args.device, args.dtype = devices[0], dtypes[0]
        module, inputs, settings, examples = _recipe_build(args)
        out = package(module, inputs, args.out, device=args.device, settings=settings,
                      examples=examples)
        print(f"wrote {out}: takes {[list(i.shape) for i in inputs]} {args.dtype} on "
              f"{args.device}; settings {json.dumps(settings)}")
        return
    import copy
    builds, settings = {}, None
    for device in devices:
        for dtype in dtypes:
            one = copy.copy(args)
            one.device, one.dtype = device, dtype
            module, inputs, settings, examples = _recipe_build(one)
            builds[build_name(device, dtype)] = Build(module, inputs, device, examples)
    out = package_builds(builds, args.out, settings=settings)
    print(f"wrote {out}: builds {', '.join(builds)}; settings {json.dumps(settings)}")


def _choices(flag: str, value: str, allowed: Tuple[str, ...]) -> list:
    """A comma-separated list of `allowed` values, each once, in the order given."""
    items = []
    for item in value.split(","):
        item = item.strip()
        if item not in allowed:
            raise SystemExit(f"{flag} {value!r}: {item!r} is not one of {', '.join(allowed)}")
        if item not in items:
            items.append(item)
    return items


def _recipe_build(args) -> tuple:
    """The recipe's module in args.dtype, its inputs, settings and examples (or None)."""
    module, inputs, settings, *examples = RECIPES[args.recipe](args.folder, args)
    # The network in the chosen dtype; a recipe's own buffers (whisper-encoder's mel filters)
    # stay float32, for its front end computes in float32.
    module.model.to(DTYPES[args.dtype])
    return module.eval(), inputs, settings, examples[0] if examples else None


if __name__ == "__main__":
    main()
