"""Loading a DualAR checkpoint folder in either public layout.

A folder holds `config.json` (`model_type` dual_ar or fish_qwen3_omni), the tokenizer
files, and the weights as `model.safetensors.index.json` + shards, or
`model.safetensors`, or `model.pth` (maybe wrapped in `state_dict`, maybe with a
`model.` prefix). S2 keys are remapped (`text_model.model.X` -> `X`,
`audio_decoder.codebook_embeddings.*` kept, other `audio_decoder.Y` -> `fast_Y`) and
separate wq/wk/wv projections are fused into wqkv.

The model is built on the meta device and the loaded tensors are assigned to it, each
converted to the target device/dtype as it is read, so a 4B model never sits in memory
twice. Any missing, unexpected or mis-shaped key is an error naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from engine.config import ModelConfig, from_checkpoint_json
from engine.model import DualARModel
from engine.tokenizer import TextTokenizer


class CheckpointError(ValueError):
    pass


def read_config(folder: Path) -> ModelConfig:
    path = folder / "config.json"
    if not path.exists():
        raise CheckpointError(f"{path}: missing (a checkpoint folder needs config.json)")
    try:
        data = json.loads(path.read_text())
        return from_checkpoint_json(data)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid model config ({e})") from e


def with_tokenizer_ids(config: ModelConfig, tok: TextTokenizer) -> ModelConfig:
    """Semantic and end-of-speech ids come from the tokenizer, as upstream injects them."""
    return config.replace(
        semantic_begin_id=tok.semantic_begin_id,
        semantic_end_id=tok.semantic_end_id,
        im_end_id=tok.im_end_id,
    )


# --- reading tensors --------------------------------------------------------------------

def weight_files(folder: Path) -> tuple[str, list[Path]]:
    """(layout name, files) of the weights in `folder`, in the upstream order of preference."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: invalid index ({e})") from e
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [s.name for s in shards if not s.exists()]
        if missing:
            raise CheckpointError(f"{index}: shards listed but missing: {missing}")
        return "sharded safetensors", shards
    if (folder / "model.safetensors").exists():
        return "safetensors", [folder / "model.safetensors"]
    if (folder / "model.pth").exists():
        return "pth", [folder / "model.pth"]
    raise CheckpointError(f"{folder}: no model.safetensors.index.json, model.safetensors or model.pth")


def _iter_safetensors(path: Path) -> Iterator[tuple[str, Tensor]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)
    except Exception as e:  # SafetensorError derives from Exception only
        raise CheckpointError(f"{path}: cannot read safetensors ({e})") from e


def _iter_pth(path: Path) -> Iterator[tuple[str, Tensor]]:
    try:
        data = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # pickle/zip errors have many types
        raise CheckpointError(f"{path}: cannot read torch checkpoint ({e})") from e
    if isinstance(data, dict) and "state_dict" in data:
        data = data["state_dict"]
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a state dict, found {type(data).__name__}")
    for key, value in data.items():
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{path}: entry {key!r} is not a tensor")
        yield (key[len("model."):] if key.startswith("model.") else key), value


def remap_key(key: str) -> str:
    if key.startswith("text_model.model."):
        return key[len("text_model.model."):]
    if key.startswith("audio_decoder."):
        rest = key[len("audio_decoder."):]
        return rest if rest.startswith("codebook_embeddings.") else "fast_" + rest
    return key


def _ignored(key: str) -> bool:
    # Upstream drops "audio_*" modules (an audio-input projector the TTS path never uses).
    return "audio_" in key


def read_state_dict(folder: Path, device: torch.device | str, dtype: torch.dtype) -> tuple[dict[str, Tensor], str]:
    layout, files = weight_files(folder)
    state: dict[str, Tensor] = {}
    for path in files:
        reader = _iter_pth if path.suffix == ".pth" else _iter_safetensors
        for key, value in reader(path):
            key = remap_key(key)
            if _ignored(key):
                continue
            if key in state:
                raise CheckpointError(f"{path}: key {key!r} appears twice")
            cast = dtype if value.is_floating_point() else value.dtype
            state[key] = value.to(device=device, dtype=cast)
    return _fuse_qkv(state), ", ".join(str(f) for f in files) + f" ({layout})"


def _fuse_qkv(state: dict[str, Tensor]) -> dict[str, Tensor]:
    for key in [k for k in state if k.endswith(".wq.weight") or k.endswith(".wq.bias")]:
        prefix, kind = key.rsplit(".wq.", 1)
        parts = [f"{prefix}.{name}.{kind}" for name in ("wq", "wk", "wv")]
        if all(p in state for p in parts):
            state[f"{prefix}.wqkv.{kind}"] = torch.cat([state.pop(p) for p in parts])
    return state


# --- assembling the model -------------------------------------------------------------------

def check_state_dict(model: DualARModel, state: dict[str, Tensor], source: str) -> None:
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = [
        f"{k}: checkpoint {list(state[k].shape)} vs model {list(expected[k])}"
        for k in sorted(set(expected) & set(state))
        if tuple(state[k].shape) != tuple(expected[k])
    ]
    problems = []
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", mismatched)):
        if items:
            shown = ", ".join(items[:12]) + (f" (+{len(items) - 12} more)" if len(items) > 12 else "")
            problems.append(f"{title}: {shown}")
    if problems:
        raise CheckpointError(f"{source}: checkpoint does not fit the model config; " + "; ".join(problems))


def assemble(config: ModelConfig, state: dict[str, Tensor], source: str) -> DualARModel:
    with torch.device("meta"):
        model = DualARModel(config)
    check_state_dict(model, state, source)
    model.load_state_dict(state, strict=True, assign=True)
    return model.finish_loading().eval()


def load_checkpoint(
    folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16
) -> tuple[DualARModel, TextTokenizer]:
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder")
    tokenizer = TextTokenizer.from_folder(folder)
    config = with_tokenizer_ids(read_config(folder), tokenizer)
    state, source = read_state_dict(folder, device, dtype)
    return assemble(config, state, source), tokenizer
