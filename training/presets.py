"""Shapes of the embedded default voice: its codec, its DualAR model and its tokenizer.

Sized for the issue's budget (codec + model <= 40 MB in fp16) and for faster than real
time on 2 CPU cores. The codec runs at the teacher's 22.05 kHz (Piper's medium voices
have nothing above 11 kHz) with a hop of 1024 samples: 21.5 frames/s, the rate of the
released family. Every size here can be overridden from the training commands; what a
checkpoint was trained with travels in its config files.
"""

from __future__ import annotations

from engine.codec.config import CodecConfig
from engine.config import ModelConfig
from engine.tokenizer import TinyLayout

SAMPLE_RATE = 22_050
NUM_CODEBOOKS = 6  # 1 semantic + 5 residual; each fast step costs CPU time per frame
CODEBOOK_SIZE = 1024

VOICE_CODEC = CodecConfig(
    sample_rate=SAMPLE_RATE,
    encoder_dim=16,  # widths 32, 64, 128, 256: the encoder only runs on references
    encoder_rates=(2, 4, 4, 8),
    encoder_transformer_layers=(0, 0, 0, 0),
    encoder_transformer_window=512,
    latent_dim=128,
    decoder_dim=384,  # 384 -> 192 -> 96 -> 48 -> 24 channels; ~0.1 RTF on 2 CPU cores
    decoder_rates=(8, 4, 4, 2),
    n_codebooks=NUM_CODEBOOKS - 1,
    codebook_size=CODEBOOK_SIZE,
    semantic_codebook_size=CODEBOOK_SIZE,
    codebook_dim=8,
    downsample_factors=(2, 2),
    quantizer_layers=2,
    quantizer_dim=192,
    quantizer_heads=3,
    quantizer_head_dim=64,
    quantizer_intermediate=512,
    quantizer_window=128,
)

# The byte-level tokenizer of engine/tokenizer.py (256 byte tokens, the special tokens,
# then one <|semantic:i|> per semantic code): any text round-trips, and the model learns
# spelling-to-sound from characters, which generalizes to unseen words better than
# subwords learned from a few hours of text.
VOICE_LAYOUT = TinyLayout(codebook_size=CODEBOOK_SIZE, num_codebooks=NUM_CODEBOOKS)


def voice_model_config(layout: TinyLayout = VOICE_LAYOUT, **overrides) -> ModelConfig:
    """~11.8M parameters (23.7 MB in bf16; the packaged codec, engine/assets/default, adds
    7.55M, 15.1 MB: 39.0 MB with the tokenizer, of the 40 allowed; the FFN was 768 wide
    until the packaged codec came out 0.8M larger than VOICE_CODEC). On 2 CPU cores the
    eager engine spends ~1.1 ms per slow layer and ~1.6 ms per fast codebook step a frame
    (overhead-bound: measured, 2026-11-29, with random weights), so depth and codebooks,
    not width, set the speed: 6 slow layers + 6 codebooks x 2 fast layers ~ 16 ms a frame
    (21.5 frames/s of audio: ~0.35 real-time factor), plus ~0.1 for the codec.

    max_seq_len is the training sequence length (LMTrainConfig.max_tokens): the engine
    restarts a conversation's context from the voice prompt before it outgrows it, so the
    model never sees a position it was not trained at."""
    base = dict(
        vocab_size=layout.vocab_size, n_layer=6, n_head=6, n_local_heads=2, head_dim=64,
        dim=384, intermediate_size=640, rope_base=10000.0, norm_eps=1e-6,
        max_seq_len=1536, tie_word_embeddings=True, attention_qk_norm=True,
        codebook_size=layout.codebook_size, num_codebooks=layout.num_codebooks,
        semantic_begin_id=layout.semantic_begin_id, semantic_end_id=layout.semantic_end_id,
        im_end_id=layout.im_end_id, scale_codebook_embeddings=True,
        n_fast_layer=2, fast_dim=256, fast_n_head=4, fast_n_local_heads=2, fast_head_dim=64,
        fast_intermediate_size=768, norm_fastlayer_input=True, prompt_format="s2",
    )
    base.update(overrides)
    return ModelConfig(**base)


def codec_parameters(config: CodecConfig) -> int:
    import torch

    from engine.codec.model import Codec

    with torch.device("meta"):
        return sum(p.numel() for p in Codec(config).parameters())
