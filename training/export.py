"""Write a trained voice as a checkpoint folder in the layout engine/checkpoint.py loads:

    config.json        model_type fish_qwen3_omni (text_config + audio_decoder_config)
    model.safetensors  the DualAR weights (bf16 or fp16), engine parameter names
    tokenizer.json     the byte-level tokenizer with its special and semantic tokens
    codec.pth          the codec's state dict (fp16), weight norm folded
    codec_config.json  its CodecConfig

`--model <folder>` serves it; copied to engine/assets/default/ it is `--model default`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.model import DualARModel
from engine.tokenizer import TinyLayout, build_tiny_tokenizer


def fish_qwen3_omni_json(c: ModelConfig) -> dict:
    """The S2 config.json of `c` (token ids are not stored: the loader takes them from the
    tokenizer). S2 configs always scale codebook embeddings and norm the fast input."""
    if not (c.scale_codebook_embeddings and c.norm_fastlayer_input and c.prompt_format == "s2"):
        raise ValueError("the fish_qwen3_omni layout implies scaled codebook embeddings, a normed "
                         "fast input and the S2 prompt")
    if c.fast_sample_limit is not None:
        raise ValueError("fast_sample_limit has no place in the fish_qwen3_omni layout")
    return {
        "model_type": "fish_qwen3_omni",
        "text_config": {
            "vocab_size": c.vocab_size, "n_layer": c.n_layer, "n_head": c.n_head,
            "n_local_heads": c.n_local_heads, "head_dim": c.head_dim, "dim": c.dim,
            "intermediate_size": c.intermediate_size, "rope_base": c.rope_base, "norm_eps": c.norm_eps,
            "max_seq_len": c.max_seq_len, "tie_word_embeddings": c.tie_word_embeddings,
            "attention_qkv_bias": c.attention_qkv_bias, "attention_o_bias": c.attention_o_bias,
            "attention_qk_norm": c.attention_qk_norm,
        },
        "audio_decoder_config": {
            "vocab_size": c.codebook_size, "num_codebooks": c.num_codebooks, "n_layer": c.n_fast_layer,
            "dim": c.fast_dim, "n_head": c.fast_n_head, "n_local_heads": c.fast_n_local_heads,
            "head_dim": c.fast_head_dim, "intermediate_size": c.fast_intermediate_size,
            "attention_qkv_bias": c.fast_attention_qkv_bias, "attention_qk_norm": c.fast_attention_qk_norm,
            "attention_o_bias": c.fast_attention_o_bias,
        },
    }


def write_tokenizer(layout: TinyLayout, path: Path) -> None:
    build_tiny_tokenizer(layout).save(str(path))


def write_model(model: DualARModel, layout: TinyLayout, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fish_qwen3_omni_json(model.config), indent=2))
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    write_tokenizer(layout, folder / "tokenizer.json")


def copy_codec(codec_folder: Path, folder: Path) -> None:
    for name in ("codec.pth", "codec_config.json"):
        shutil.copyfile(codec_folder / name, folder / name)


def folder_bytes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
