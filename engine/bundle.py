"""A loaded model: transformer + tokenizer + codec + prompt builder, from one name.

`--model` takes:
- `default`: the voice that ships with the package (engine/assets/default), or the
  `tiny` preset while no trained voice is packaged;
- a preset name (`tiny`, `s1-mini`, `s2-pro`): that shape with seeded random weights;
- a path to a checkpoint folder (config.json, weights, tokenizer files, codec.pth).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.checkpoint import CheckpointError, load_checkpoint
from engine.codec.config import codec_preset
from engine.codec.loader import load_codec
from engine.codec.model import Codec
from engine.config import PRESETS, ModelConfig, preset
from engine.model import DualARModel
from engine.prompt import PromptBuilder
from engine.quant import quantize_model_
from engine.tokenizer import IM_END, IM_START, INTERLEAVE, VOICE, TextTokenizer, semantic_token, speaker_token

ASSETS = Path(__file__).parent / "assets"
DEFAULT_FOLDER = ASSETS / "default"


@dataclass
class ModelBundle:
    name: str
    model: DualARModel
    tokenizer: TextTokenizer
    codec: Codec
    prompts: PromptBuilder
    load_seconds: float

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embeddings.weight.dtype


def default_dtype(device: torch.device | str) -> torch.dtype:
    # bf16 on GPUs (the released weights' dtype); fp32 on CPUs, where it is faster.
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def resolve_device(device: str | None) -> str:
    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


QUANT_MODES = ("none", "fp8")


def load_bundle(
    spec: str = "default",
    device: str | None = None,
    dtype: torch.dtype | None = None,
    seed: int = 0,
    quant: str = "none",
) -> ModelBundle:
    """`quant="fp8"` swaps every linear layer of the slow and fast transformers for
    block-scaled FP8 (engine/quant.py; the kernel plan picks the Triton kernels or their
    PyTorch references)."""
    if quant not in QUANT_MODES:
        raise ValueError(f"unknown quantization {quant!r}; known: {', '.join(QUANT_MODES)}")
    device = resolve_device(device)
    dtype = dtype or default_dtype(device)
    t0 = time.perf_counter()
    if spec == "default":
        spec = str(DEFAULT_FOLDER) if (DEFAULT_FOLDER / "config.json").exists() else "tiny"
    if spec in PRESETS:
        model, tokenizer, codec = random_preset(spec, device, dtype, seed)
    else:
        folder = Path(spec)
        if not folder.is_dir():
            raise CheckpointError(
                f"--model {spec!r} is neither 'default', a preset ({', '.join(PRESETS)}) nor a checkpoint folder"
            )
        model, tokenizer = load_checkpoint(folder, device, dtype)
        if not (folder / "codec.pth").exists():
            raise CheckpointError(f"{folder}: missing codec.pth (needed to turn codes into audio)")
        codec = load_codec(folder / "codec.pth", device=device, dtype=dtype)
    _check_codec_fits(model.config, codec, spec)
    if quant == "fp8":
        quantize_model_(model)
    return ModelBundle(
        name=spec,
        model=model,
        tokenizer=tokenizer,
        codec=codec,
        prompts=PromptBuilder(tokenizer, model.config),
        load_seconds=time.perf_counter() - t0,
    )


def _check_codec_fits(config: ModelConfig, codec: Codec, spec: str) -> None:
    if codec.num_codebooks != config.num_codebooks:
        raise CheckpointError(
            f"{spec}: the codec has {codec.num_codebooks} codebooks but the model expects {config.num_codebooks}"
        )


# --- random weights ---------------------------------------------------------------------

def randomize_(module: nn.Module, seed: int, device: str, dtype: torch.dtype, std: float = 0.02) -> nn.Module:
    """Materialize a meta-built module on `device` with seeded random weights, allocating
    each tensor once in its final dtype: N(0, std) for linear and embedding weights (the
    upstream init), N(0, 1/fan_in) for convolutions (so a random codec keeps its signal
    level through its ~40 layers instead of fading to silence), zero biases and unit
    vectors (norm scales, LayerScale, Snake alphas)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for mod in module.modules():
        conv = isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d))
        for name, p in list(mod.named_parameters(recurse=False)):
            t = torch.empty(p.shape, device=device, dtype=dtype)
            if name == "bias":
                t.zero_()
            elif p.numel() == max(p.shape):
                t.fill_(1.0)
            else:
                t.normal_(0.0, (p.numel() / p.shape[0]) ** -0.5 if conv else std, generator=gen)
            setattr(mod, name, nn.Parameter(t, requires_grad=False))
    return module


def random_preset(
    name: str, device: str, dtype: torch.dtype, seed: int,
    config: ModelConfig | None = None, codec_name: str | None = None,
):
    """(model, tokenizer, codec) of preset `name` with seeded random weights; `config` and
    `codec_name` override the preset's shapes (benchmarks of its structure at other sizes)."""
    config = config or preset(name)
    tokenizer = TextTokenizer.tiny() if name == "tiny" else synthetic_tokenizer(config)
    with torch.device("meta"):
        model = DualARModel(config)
        codec = Codec(codec_preset(codec_name or ("tiny" if name == "tiny" else "fish")))
    model = randomize_(model, seed, device, dtype).finish_loading().eval()
    codec = randomize_(codec, seed + 1, device, dtype).eval()
    if hasattr(codec, "finish_loading"):
        codec.finish_loading()
    return model, tokenizer, codec


def synthetic_tokenizer(config: ModelConfig) -> TextTokenizer:
    """A byte-level tokenizer whose special ids sit where a preset's config puts them,
    for random-weight benchmark presets (their text ids only need to be consistent)."""
    vocab = {semantic_token(i): config.semantic_begin_id + i for i in range(config.num_semantic)}
    vocab[IM_END] = config.im_end_id
    used = set(vocab.values())
    free = (i for i in range(256, config.vocab_size) if i not in used)
    for tok in [IM_START, VOICE, INTERLEAVE] + [speaker_token(i) for i in range(8)]:
        vocab[tok] = next(free)
    special = re.compile("(" + "|".join(re.escape(t) for t in vocab) + ")")

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        for piece in special.split(text):
            ids.extend([vocab[piece]] if piece in vocab else piece.encode("utf-8"))
        return ids

    return TextTokenizer(encode, vocab, f"synthetic-{config.vocab_size}")
