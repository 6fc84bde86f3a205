"""Resumable training state in pieces small enough to come back from the GPU machine
(at most 8 files of 16 MiB per call there): parameters in fp32 (or fp16 with
`half_params`: half the bytes, so that a resumed call's upload has room for more audio;
the resume rounds each trained weight once, ~5e-4 relative; frozen ones stay fp32),
optionally the AdamW moments in bf16 (bf16 keeps fp32's exponent range, so tiny second
moments survive), split into files of at most `max_file_bytes`, plus `state.json` (step,
config, extras). Buffers that are not floating point (counters) keep their dtype: exact.

A later call resumes from the folder; without moments (a checkpoint that had to be
smaller) the optimizer restarts its moments and the trainer re-warms the learning rate.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

MAX_FILE_BYTES = 15 * 2**20
STATE_FILE = "state.json"


def _pack(tensors: dict[str, Tensor], prefix: str, folder: Path, max_bytes: int) -> list[str]:
    from safetensors.torch import save_file

    files, part, size = [], {}, 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if part and size + nbytes > max_bytes:
            files.append(part)
            part, size = {}, 0
        part[name] = t.detach().contiguous().cpu()
        size += nbytes
    if part:
        files.append(part)
    names = []
    for i, part in enumerate(files):
        name = f"{prefix}-{i:02d}.safetensors"
        save_file(part, str(folder / name))
        names.append(name)
    return names


def _unpack(folder: Path, names: list[str]) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    out: dict[str, Tensor] = {}
    for name in names:
        out.update(load_file(str(folder / name)))
    return out


FP16_MAX = 65504.0


def _stored(t: Tensor, half: bool) -> Tensor:
    """fp16 when asked and the tensor fits it, else fp32; other dtypes (counters) as they are."""
    if not t.is_floating_point():
        return t
    fits = t.numel() == 0 or float(t.detach().abs().max()) <= FP16_MAX  # NaN: not
    return t.half() if half and fits else t.float()


def save(folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, step: int,
         extra: dict | None = None, moments: bool = True, max_file_bytes: int = MAX_FILE_BYTES,
         half_params: bool = False) -> None:
    """Write the state into `folder` (replacing an older one there, atomically per file set).

    Frozen parameters (requires_grad False: a decoder_only codec run's encoding side) stay
    fp32 with half_params: they came from an export whose weight-norm factors (norm,
    direction) are not fp16 values, so rounding them moved the frozen weights by a rounding
    step at the next export, and with them the codes (measured: a GPU run's export differed
    from its start in 8 encoder and quantizer tensors)."""
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    params = {k: _stored(v, half_params and k not in frozen) for k, v in model.state_dict().items()}
    state = {"step": step, "extra": extra or {}}
    _write(Path(folder), state, params, _moments(model, optimizer) if moments and optimizer is not None else {},
           max_file_bytes)


def _write(folder: Path, state: dict, params: dict[str, Tensor], moments: dict[str, Tensor], max_bytes: int) -> dict:
    """Replace the state in `folder`: params (and moments) packed into files, `state` (step,
    extra) with their file names as state.json. Returns what state.json holds."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.safetensors"):
        old.unlink()
    state = dict(state, params=_pack(params, "params", folder, max_bytes),
                 moments=_pack(moments, "moments", folder, max_bytes) if moments else [])
    (folder / STATE_FILE).write_text(json.dumps(state, indent=1))
    return state


def halve(folder: str | Path, to: str | Path, max_file_bytes: int = MAX_FILE_BYTES) -> dict:
    """A copy of the state in `folder` with its parameters in fp16 (as `half_params`) and no
    moments, written into `to`: a state returned in fp32 becomes small enough to travel
    beside more data in the next call (the resume re-warms the learning rate)."""
    folder, to = Path(folder), Path(to)
    if folder.resolve() == to.resolve():
        raise ValueError("halve writes a new folder; it does not overwrite its source")
    state = json.loads((folder / STATE_FILE).read_text())
    params = {k: _stored(v, True) for k, v in _unpack(folder, state["params"]).items()}
    return _write(to, state, params, {}, max_file_bytes)


def _moments(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    out = {}
    for name, p in model.named_parameters():
        st = optimizer.state.get(p)
        if st and "exp_avg" in st:
            out[f"{name}.exp_avg"] = st["exp_avg"].to(torch.bfloat16)
            out[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].to(torch.bfloat16)
            out[f"{name}.step"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1)
    return out


def exists(folder: str | Path) -> bool:
    return (Path(folder) / STATE_FILE).is_file()


def load(folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Restore parameters (and moments, when saved); returns the state dict (step, extra,
    has_moments)."""
    folder = Path(folder)
    state = json.loads((folder / STATE_FILE).read_text())
    params = _unpack(folder, state["params"])
    own = model.state_dict()
    missing = sorted(set(own) - set(params))
    if missing:
        raise ValueError(f"{folder}: checkpoint lacks {missing[:5]} (+{max(0, len(missing) - 5)} more)")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(params[k].to(v.dtype))
    state["has_moments"] = bool(state["moments"]) and optimizer is not None
    if state["has_moments"]:
        moments = _unpack(folder, state["moments"])
        # fused/capturable AdamW keeps its step counter on the parameter's device
        on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
        for name, p in model.named_parameters():
            if f"{name}.exp_avg" in moments:
                optimizer.state[p] = {
                    "step": moments[f"{name}.step"].reshape(()).to(p.device if on_device else "cpu"),
                    "exp_avg": moments[f"{name}.exp_avg"].to(p.device, torch.float32),
                    "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(p.device, torch.float32),
                }
    return state


def config_sets(cls, items: list[str]) -> dict:
    """A command line's `--set FIELD=VALUE` items -> {field: value} for the training-config
    dataclass `cls`, each value of its field's default's type. A boolean takes true/false or
    1/0 (bool("0") is True, so a plain cast would turn `--set flag=0` on), a tuple a JSON
    list; an unknown field or a value of the wrong form is an error naming it."""
    defaults = cls()
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not hasattr(defaults, name):
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD a field of {cls.__name__}")
        kind = type(getattr(defaults, name))
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--set {item!r}: {name} takes true/false or 1/0")
            out[name] = text.lower() in ("true", "1")
        elif kind in (tuple, list):  # JSON: --set guide_layers=[3,4,5]
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"--set {item!r}: {name} takes a JSON list") from e
            if not isinstance(value, list):
                raise ValueError(f"--set {item!r}: {name} takes a JSON list")
            out[name] = kind(value)
        else:
            try:
                out[name] = kind(text)
            except ValueError as e:
                raise ValueError(f"--set {item!r}: {name} takes a {kind.__name__}") from e
    return out


def resumed_config(cls, saved: dict, overrides: dict | None):
    """A training config from a checkpoint's `saved` fields, with this call's explicit
    overrides (the command line's --set) on top. A resumed run keeps what it was started
    with, except what the caller sets: before, a resumed codec run silently kept the GPU
    run's batch of 32 x 2 s when `--set batch=2` asked for a CPU-sized one, and its
    activations grew past 24 GB."""
    import dataclasses
    import sys

    cfg = cls(**saved)
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
        print(f"resumed; overriding the saved training config with {overrides}", file=sys.stderr)
    return cfg
