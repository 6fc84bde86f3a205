"""Load an upstream `codec.pth` into `Codec`.

Upstream checkpoints come in a few layouts: a bare state dict or one under "state_dict",
keys maybe prefixed "generator." (a training checkpoint, whose other sub-models are
dropped), and weight norm stored either old-style (`X.weight_g`, `X.weight_v`, as the dac
package's WNConv1d saves it) or new-style (`X.parametrizations.weight.original0/1`), or
already folded into `X.weight`. Weight norm is folded here into plain weights. The
release also carries upstream's runtime buffers (`freqs_cis`, `causal_mask`), which are
recomputed and therefore skipped. Anything else that does not match exactly is an error
naming the file and the keys: a partly loaded codec produces noise, not an exception.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from engine.codec.config import CodecConfig, codec_preset
from engine.codec.model import Codec

CONFIG_FILE = "codec_config.json"
# upstream buffers saved in the release but rebuilt at runtime (RoPE table, causal mask)
RUNTIME_BUFFERS = ("freqs_cis", "causal_mask")
# what decode never reads; a decoder-only codec may lack these keys
ENCODE_ONLY_PREFIXES = ("encoder.", "quantizer.downsample.", "quantizer.pre_module.")
ENCODE_ONLY_PART = ".in_proj."  # the VQ input projections
_LIST_LIMIT = 20


class CodecLoadError(ValueError):
    pass


def load_codec(path: str | Path, config: CodecConfig | None = None, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32, decoder_only: bool = False) -> Codec:
    """Build the codec on the meta device and assign the checkpoint's tensors to it.

    config: None reads `codec_config.json` beside the checkpoint, else the "fish" preset.
    decoder_only: skip everything only encode needs (the checkpoint may lack it).
    """
    path = Path(path)
    if config is None:
        config = _config_beside(path)
    raw = _read_state_dict(path)
    state = fold_weight_norm(_strip_layout(raw), path)
    if decoder_only:
        state = {k: v for k, v in state.items() if not is_encode_only(k)}
    with torch.device("meta"):
        codec = Codec(config, decoder_only=decoder_only)
    _check_keys(codec, state, path, config)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    codec.load_state_dict(state, strict=True, assign=True)
    return codec.eval()


def is_encode_only(key: str) -> bool:
    return key.startswith(ENCODE_ONLY_PREFIXES) or ENCODE_ONLY_PART in key


def _config_beside(path: Path) -> CodecConfig:
    config_path = path.parent / CONFIG_FILE
    if not config_path.is_file():
        return codec_preset("fish")
    try:
        return CodecConfig.from_json(config_path.read_text())
    except ValueError as e:
        raise CodecLoadError(f"{config_path}: {e}") from e


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise CodecLoadError(f"{path}: no such codec checkpoint")
    try:
        # mmap: the release is 1.9 GB; pages are read only as tensors are used
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except Exception:  # legacy (non-zip) files cannot be mapped; retry plainly
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # torch raises several types for a non-checkpoint file
            raise CodecLoadError(
                f"{path}: not a readable torch checkpoint ({type(e).__name__}: {e})") from e
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CodecLoadError(f"{path}: expected a state dict of tensors, got {type(obj).__name__}")
    return obj


def _strip_layout(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Keep the generator of a training checkpoint; drop upstream's runtime buffers."""
    if any(k.startswith("generator.") for k in state):
        state = {k[len("generator."):]: v for k, v in state.items() if k.startswith("generator.")}
    return {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in RUNTIME_BUFFERS}


def fold_weight_norm(state: dict[str, Tensor], path: Path | str = "<state dict>") -> dict[str, Tensor]:
    """Replace each (magnitude g, direction v) pair by weight = g * v / ||v|| (norm over
    every dim but 0, upstream's dim=0), computed in fp32."""
    pairs = {
        ".weight_g": (".weight_v", ".weight"),
        ".parametrizations.weight.original0": (".parametrizations.weight.original1", ".weight"),
    }
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        for g_suffix, (v_suffix, w_suffix) in pairs.items():
            if key.endswith(g_suffix):
                stem = key[: -len(g_suffix)]
                out[stem + w_suffix] = _fold(stem, value, state.get(stem + v_suffix), path)
                break
            if key.endswith(v_suffix):
                if key[: -len(v_suffix)] + g_suffix not in state:
                    raise CodecLoadError(f"{path}: {key} has no matching {g_suffix[1:]}")
                break
        else:
            out[key] = value
    return out


def _fold(stem: str, g: Tensor, v: Tensor | None, path: Path | str) -> Tensor:
    if v is None:
        raise CodecLoadError(f"{path}: weight-norm magnitude of {stem} has no direction tensor")
    if g.numel() != v.shape[0] or g.shape[0] != v.shape[0]:
        raise CodecLoadError(
            f"{path}: weight norm of {stem}: magnitude {tuple(g.shape)} does not match "
            f"direction {tuple(v.shape)} along dim 0")
    # the same kernel upstream's weight_norm runs at every forward: bit-identical weights
    return torch._weight_norm(v.float(), g.float(), 0)


def _check_keys(codec: Codec, state: dict[str, Tensor], path: Path, config: CodecConfig) -> None:
    expected = {k: tuple(v.shape) for k, v in codec.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {expected[k]}"
        for k in set(expected) & set(state) if tuple(state[k].shape) != expected[k])
    if not (missing or unexpected or mismatched):
        return
    lines = [f"{path}: checkpoint does not match the codec config "
             f"(hop {config.hop_length}, {config.num_codebooks} codebooks, latent {config.latent_dim})"]
    for title, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                        ("shape mismatches", mismatched)):
        if keys:
            shown = ", ".join(keys[:_LIST_LIMIT])
            more = f" ... and {len(keys) - _LIST_LIMIT} more" if len(keys) > _LIST_LIMIT else ""
            lines.append(f"  {len(keys)} {title}: {shown}{more}")
    if missing and all(is_encode_only(k) for k in missing):
        lines.append("  (only encoder weights are missing: load it with decoder_only=True)")
    raise CodecLoadError("\n".join(lines))
