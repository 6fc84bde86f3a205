"""Model configuration of the DualAR family: one dataclass, named presets, and the
two public checkpoint `config.json` layouts (`dual_ar` and `fish_qwen3_omni`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from engine.tokenizer import TINY_LAYOUT

PromptFormat = Literal["s1", "s2"]


def _round_up(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclass(slots=True)
class ModelConfig:
    """Shape and token layout of a DualAR model (slow transformer + fast transformer).

    The slow transformer reads one token per position (text, or a semantic token whose
    frame codes are summed into its embedding) and emits one semantic token per audio
    frame; the fast transformer, driven by the slow hidden state, emits that frame's
    remaining codebooks.
    """

    # slow transformer
    vocab_size: int = 32000
    n_layer: int = 32
    n_head: int = 32
    n_local_heads: int = -1
    head_dim: int | None = 64
    dim: int = 4096
    intermediate_size: int | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 2048
    tie_word_embeddings: bool = True
    attention_qkv_bias: bool = False
    attention_o_bias: bool = False
    attention_qk_norm: bool = False

    # audio tokens
    codebook_size: int = 4096
    num_codebooks: int = 10  # semantic codebook + residual codebooks
    semantic_begin_id: int = 0  # token id of <|semantic:0|>
    semantic_end_id: int = 0  # token id of the last semantic token (inclusive)
    im_end_id: int = 0  # <|im_end|>: the end-of-speech token
    scale_codebook_embeddings: bool = False
    # Upstream S1 samples the residual codes from the first 1024 fast logits only
    # (its codec's residual codebooks hold 1024 entries); None samples all rows.
    fast_sample_limit: int | None = None

    # fast transformer (None copies the slow value)
    n_fast_layer: int = 4
    fast_dim: int | None = None
    fast_n_head: int | None = None
    fast_n_local_heads: int | None = None
    fast_head_dim: int | None = None
    fast_intermediate_size: int | None = None
    fast_attention_qkv_bias: bool | None = None
    fast_attention_qk_norm: bool | None = None
    fast_attention_o_bias: bool | None = None
    norm_fastlayer_input: bool = False

    prompt_format: PromptFormat = "s2"

    def __post_init__(self) -> None:
        if self.n_local_heads == -1:
            self.n_local_heads = self.n_head
        if self.head_dim is None:
            self.head_dim = self.dim // self.n_head
        if self.intermediate_size is None:
            self.intermediate_size = _round_up(int(2 * 4 * self.dim / 3), 256)
        self.fast_dim = self.fast_dim or self.dim
        self.fast_n_head = self.fast_n_head or self.n_head
        self.fast_n_local_heads = self.fast_n_local_heads or self.n_local_heads
        self.fast_head_dim = self.fast_head_dim or self.head_dim
        self.fast_intermediate_size = self.fast_intermediate_size or self.intermediate_size
        if self.fast_attention_qkv_bias is None:
            self.fast_attention_qkv_bias = self.attention_qkv_bias
        if self.fast_attention_qk_norm is None:
            self.fast_attention_qk_norm = self.attention_qk_norm
        if self.fast_attention_o_bias is None:
            self.fast_attention_o_bias = self.attention_o_bias
        self._validate()

    def _validate(self) -> None:
        if self.n_head % self.n_local_heads or self.fast_n_head % self.fast_n_local_heads:
            raise ValueError("n_head must be a multiple of n_local_heads (slow and fast)")
        if self.num_codebooks < 1 or self.codebook_size < 1:
            raise ValueError("num_codebooks and codebook_size must be positive")
        n_semantic = self.semantic_end_id - self.semantic_begin_id + 1
        if self.semantic_end_id and n_semantic > self.codebook_size:
            raise ValueError(
                f"{n_semantic} semantic token ids do not fit codebook_size {self.codebook_size}"
            )
        for name in ("semantic_begin_id", "semantic_end_id", "im_end_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name}={getattr(self, name)} is outside vocab_size {self.vocab_size}")
        if self.fast_sample_limit is not None and not 0 < self.fast_sample_limit <= self.codebook_size:
            raise ValueError("fast_sample_limit must be in 1..codebook_size")
        if self.prompt_format not in ("s1", "s2"):
            raise ValueError(f"unknown prompt_format {self.prompt_format!r}")

    @property
    def num_semantic(self) -> int:
        """Number of semantic token ids (the slow head's sampleable audio rows)."""
        return self.semantic_end_id - self.semantic_begin_id + 1

    @property
    def sampling_window(self) -> int:
        """Previous frames the sampler looks at: S2's repetition-aware resampling checks
        the last 10 semantic tokens; S1's repetition penalty used a 16-frame window."""
        return 16 if self.prompt_format == "s1" else 10

    @property
    def uses_repetition_penalty(self) -> bool:
        """S1 penalizes recent codes per codebook; S2 uses repetition-aware resampling
        instead (upstream), so its frame step skips the penalty."""
        return self.prompt_format == "s1"

    @property
    def fast_vocab(self) -> int:
        return self.fast_sample_limit or self.codebook_size

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def num_parameters(self) -> int:
        """Parameter count, computed from the shapes (no model needed)."""

        def block(dim: int, heads: int, kv: int, hd: int, inter: int, qkn: bool) -> int:
            attn = dim * (heads + 2 * kv) * hd + heads * hd * dim + (2 * hd if qkn else 0)
            return attn + 3 * dim * inter + 2 * dim

        slow = self.n_layer * block(
            self.dim, self.n_head, self.n_local_heads, self.head_dim,
            self.intermediate_size, self.attention_qk_norm,
        )
        fast = self.n_fast_layer * block(
            self.fast_dim, self.fast_n_head, self.fast_n_local_heads, self.fast_head_dim,
            self.fast_intermediate_size, self.fast_attention_qk_norm,
        )
        emb = self.vocab_size * self.dim + self.codebook_size * self.num_codebooks * self.dim
        out = 0 if self.tie_word_embeddings else self.vocab_size * self.dim
        fast_io = self.codebook_size * self.fast_dim * 2 + (
            self.dim * self.fast_dim + self.fast_dim if self.fast_dim != self.dim else 0
        )
        return slow + fast + emb + out + fast_io + self.dim + self.fast_dim


# --- checkpoint config.json layouts -------------------------------------------------

_FLAT_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}


def from_dual_ar_json(data: dict[str, Any]) -> ModelConfig:
    """`model_type: dual_ar` (S1-mini era): flat fields, tiktoken tokenizer, S1 prompt."""
    kwargs = {k: v for k, v in data.items() if k in _FLAT_FIELDS}
    kwargs.setdefault("prompt_format", "s1")
    # Upstream S1 inference samples residual codes from the first 1024 fast logits.
    kwargs.setdefault("fast_sample_limit", min(1024, data.get("codebook_size", 4096)))
    return ModelConfig(**_without_token_ids(kwargs))


def from_fish_qwen3_omni_json(data: dict[str, Any]) -> ModelConfig:
    """`model_type: fish_qwen3_omni` (S2): a `text_config` for the slow model and an
    `audio_decoder_config` for the fast one. S2 always scales codebook embeddings and
    norms the fast-layer input."""
    tc, adc = data["text_config"], data["audio_decoder_config"]
    flat: dict[str, Any] = dict(
        vocab_size=tc["vocab_size"],
        n_layer=tc["n_layer"],
        n_head=tc["n_head"],
        n_local_heads=tc.get("n_local_heads", -1),
        head_dim=tc.get("head_dim"),
        dim=tc["dim"],
        intermediate_size=tc.get("intermediate_size"),
        rope_base=tc.get("rope_base", 10000),
        norm_eps=tc.get("norm_eps", 1e-5),
        max_seq_len=tc.get("max_seq_len", 2048),
        tie_word_embeddings=tc.get("tie_word_embeddings", True),
        attention_qkv_bias=tc.get("attention_qkv_bias", False),
        attention_o_bias=tc.get("attention_o_bias", False),
        attention_qk_norm=tc.get("attention_qk_norm", False),
        codebook_size=adc["vocab_size"],
        num_codebooks=adc["num_codebooks"],
        n_fast_layer=adc["n_layer"],
        fast_dim=adc.get("dim"),
        fast_n_head=adc.get("n_head"),
        fast_n_local_heads=adc.get("n_local_heads"),
        fast_head_dim=adc.get("head_dim"),
        fast_intermediate_size=adc.get("intermediate_size"),
        fast_attention_qkv_bias=adc.get("attention_qkv_bias"),
        fast_attention_qk_norm=adc.get("attention_qk_norm"),
        fast_attention_o_bias=adc.get("attention_o_bias"),
        scale_codebook_embeddings=True,
        norm_fastlayer_input=True,
        prompt_format="s2",
    )
    flat = {k: v for k, v in flat.items() if v is not None}
    return ModelConfig(**flat)


def _without_token_ids(kwargs: dict[str, Any]) -> dict[str, Any]:
    # Token ids come from the tokenizer (as upstream injects them); a stale value in
    # config.json must not fail validation before the tokenizer is read.
    for name in ("semantic_begin_id", "semantic_end_id", "im_end_id"):
        kwargs.pop(name, None)
    return kwargs


def from_checkpoint_json(data: dict[str, Any]) -> ModelConfig:
    model_type = data.get("model_type")
    if model_type == "dual_ar":
        return from_dual_ar_json(data)
    if model_type == "fish_qwen3_omni":
        return from_fish_qwen3_omni_json(data)
    raise ValueError(
        f"unsupported model_type {model_type!r} (expected 'dual_ar' or 'fish_qwen3_omni')"
    )


# --- presets ------------------------------------------------------------------------

def _s2_pro() -> ModelConfig:
    # S2-Pro: Qwen3-4B-shaped slow model + 4 fast layers of the same width.
    return ModelConfig(
        vocab_size=155776, n_layer=36, n_head=32, n_local_heads=8, head_dim=128,
        dim=2560, intermediate_size=9728, rope_base=1e6, norm_eps=1e-6,
        max_seq_len=32768, tie_word_embeddings=True, attention_qk_norm=True,
        codebook_size=4096, num_codebooks=10,
        semantic_begin_id=151678, semantic_end_id=155773, im_end_id=151645,
        scale_codebook_embeddings=True, n_fast_layer=4, fast_attention_qk_norm=False,
        norm_fastlayer_input=True, prompt_format="s2",
    )


def _s1_mini() -> ModelConfig:
    # S1-mini-shaped (about 0.5B): a Qwen3-0.6B-like slow model; used with random
    # weights for benchmarks, so its token ids only need to be self-consistent.
    return ModelConfig(
        vocab_size=155776, n_layer=28, n_head=16, n_local_heads=8, head_dim=128,
        dim=1024, intermediate_size=3072, rope_base=1e6, norm_eps=1e-6,
        max_seq_len=8192, tie_word_embeddings=True, attention_qk_norm=True,
        codebook_size=4096, num_codebooks=10,
        semantic_begin_id=151678, semantic_end_id=155773, im_end_id=151645,
        scale_codebook_embeddings=False, n_fast_layer=4, fast_sample_limit=1024,
        prompt_format="s2",
    )


def _tiny() -> ModelConfig:
    # Test-sized model; its token ids match the tiny tokenizer that ships in
    # engine/assets/tiny (see engine/tokenizer.py: build_tiny_tokenizer).
    return ModelConfig(
        vocab_size=TINY_LAYOUT.vocab_size, n_layer=2, n_head=4, n_local_heads=2,
        head_dim=16, dim=64, intermediate_size=128, rope_base=10000.0, norm_eps=1e-6,
        max_seq_len=4096, attention_qk_norm=True,
        codebook_size=TINY_LAYOUT.codebook_size, num_codebooks=TINY_LAYOUT.num_codebooks,
        semantic_begin_id=TINY_LAYOUT.semantic_begin_id,
        semantic_end_id=TINY_LAYOUT.semantic_end_id, im_end_id=TINY_LAYOUT.im_end_id,
        scale_codebook_embeddings=True, n_fast_layer=2, norm_fastlayer_input=True,
        prompt_format="s2",
    )


PRESETS = {"tiny": _tiny, "s1-mini": _s1_mini, "s2-pro": _s2_pro}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
