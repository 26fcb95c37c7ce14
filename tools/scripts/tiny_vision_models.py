"""Random-weight vision models of the export recipes' families (clip-vision, siglip-vision,
videomae), saved as Hugging Face folders with their image processor's config: two layers of 32,
patches of 8 on 32x32 images (VideoMAE: 4 frames, tubelets of 2), each family's own resize and
normalisation. No download. Used by tests/python/test_export_recipes.py on the CPU and by
tests/gpu/export_recipes_cuda.py on a GPU."""

import json
from pathlib import Path

SIZE = 32
RECIPES = ("clip-vision", "siglip-vision", "videomae")


def tiny_vision_folder(recipe: str, folder: Path):
    """Saves the model to `folder` and returns it (eval mode)."""
    import torch
    torch.manual_seed(0)
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=SIZE, patch_size=8)
    if recipe == "clip-vision":
        from transformers import CLIPVisionConfig, CLIPVisionModel
        model = CLIPVisionModel(CLIPVisionConfig(**common))
        processor = {"crop_size": {"height": SIZE, "width": SIZE}, "do_center_crop": True,
                     "size": {"shortest_edge": SIZE}, "image_mean": [0.48, 0.46, 0.41],
                     "image_std": [0.27, 0.26, 0.28]}
    elif recipe == "siglip-vision":
        from transformers import SiglipVisionConfig, SiglipVisionModel
        model = SiglipVisionModel(SiglipVisionConfig(**common))
        processor = {"size": {"height": SIZE, "width": SIZE}, "image_mean": [0.5] * 3,
                     "image_std": [0.5] * 3}
    elif recipe == "videomae":
        from transformers import VideoMAEConfig, VideoMAEModel
        model = VideoMAEModel(VideoMAEConfig(**common, num_frames=4, tubelet_size=2))
        processor = {"crop_size": {"height": SIZE, "width": SIZE}, "do_center_crop": True,
                     "size": {"shortest_edge": SIZE}, "image_mean": [0.45, 0.45, 0.45],
                     "image_std": [0.22, 0.22, 0.22]}
    else:
        raise ValueError(f"no tiny vision model for {recipe!r}; one of {', '.join(RECIPES)}")
    model.eval().save_pretrained(folder)
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(processor))
    return model
