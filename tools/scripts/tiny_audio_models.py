"""Random-weight audio models of the export recipes' families (wav2vec2, hubert,
whisper-encoder), saved as Hugging Face folders with their feature extractor's config: small,
but with the real front ends (7 strided convolutions; 128 mel bins over 30-s windows). No
download. Used by tests/python/test_export_audio_recipes.py on the CPU and by
tests/gpu/export_recipes_cuda.py on a GPU."""

from pathlib import Path


def tiny_audio_folder(recipe: str, folder: Path, width: int = 32):
    """Saves the model to `folder` and returns it (eval mode). wav2vec2: group-norm feature
    encoder, waveform normalised; hubert: layer-norm feature encoder (so an attention mask), not
    normalised; whisper: 128 mel bins, 30-s windows. `width` is the hidden size (the feed-forward
    twice it, the convolutions half of it)."""
    import torch
    torch.manual_seed(0)
    if recipe == "whisper-encoder":
        from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperModel
        model = WhisperModel(WhisperConfig(
            d_model=width, encoder_layers=2, encoder_attention_heads=2,
            encoder_ffn_dim=2 * width, decoder_layers=1, decoder_attention_heads=2,
            decoder_ffn_dim=64, vocab_size=64, num_mel_bins=128, max_source_positions=1500,
            max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1))
        model.eval().save_pretrained(folder)
        WhisperFeatureExtractor(feature_size=128).save_pretrained(folder)
        return model
    from transformers import Wav2Vec2FeatureExtractor
    common = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                  num_attention_heads=2, conv_dim=(width // 2,) * 7, num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=2)
    if recipe == "wav2vec2":
        from transformers import Wav2Vec2Config, Wav2Vec2Model
        model = Wav2Vec2Model(Wav2Vec2Config(**common, feat_extract_norm="group"))
    else:
        from transformers import HubertConfig, HubertModel
        model = HubertModel(HubertConfig(**common, feat_extract_norm="layer",
                                         do_stable_layer_norm=True))
    model.eval().save_pretrained(folder)
    layer = model.config.feat_extract_norm == "layer"
    Wav2Vec2FeatureExtractor(do_normalize=recipe == "wav2vec2",
                             return_attention_mask=layer).save_pretrained(folder)
    return model
