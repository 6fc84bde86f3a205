"""Train the small DualAR model on (text, codes) sequences in the S2 prompt format with
voice-cloning references, resumably; export it with the codec as a checkpoint folder.

    python -m training.lm_train train --codes runs/codec/codes.npz --out runs/lm --minutes 9
    python -m training.lm_train export --out runs/lm --codec runs/codec/export --to runs/voice
    # to resume with more data in the upload: the state's parameters in fp16, no moments
    python -m training.lm_train half-state --state runs/lm/state --to runs/lm-half

Loss: cross-entropy of the slow head over the semantic rows + <|im_end|> (what the engine
samples) at every assistant position, plus the mean cross-entropy of the fast transformer
over the residual codebooks of every frame. Checkpoints (every --save-minutes, and at the
end) hold fp32 parameters, and the AdamW moments unless --no-moments (the GPU machine
returns at most 64 MiB a call: parameters alone fit, parameters + moments do not).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from engine.config import ModelConfig
from engine.model import DualARModel
from engine.tokenizer import TextTokenizer, TinyLayout, build_tiny_tokenizer
from training import checkpoints
from training.lm_data import BatchStream, CodeSet, SequenceBuilder, SequenceConfig, collate
from training.lm_forward import init_weights_, losses, parameter_groups
from training.presets import VOICE_LAYOUT, voice_model_config
from training.schedule import Clock, lr_at, plan_steps


@dataclasses.dataclass
class LMTrainConfig:
    batch_tokens: int = 32_768
    lr: float = 1e-3
    warmup: int = 300
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    fast_weight: float = 1.0
    max_tokens: int = 1536  # = the model's max_seq_len (presets.voice_model_config)
    max_fast_rows: int = 65_536
    loader_workers: int = 4
    dropout: float = 0.1
    frame_dropout: float = 0.6  # lm_forward.drop_frames: share of frame inputs zeroed in training (0.6 beat 0.3 and 0: README)
    # guided attention (lm_forward.guided_attention_loss): weight 0 turns it off
    guide_weight: float = 1.0
    guide_layers: tuple = (1, 2, 3)
    guide_sigma: float = 0.2
    seed: int = 0

    @property
    def guided(self) -> tuple:
        """The slow layers under the guide (none when its weight is 0)."""
        return tuple(self.guide_layers) if self.guide_weight else ()


def tokenizer_for(layout: TinyLayout) -> TextTokenizer:
    return TextTokenizer._from_hf(build_tiny_tokenizer(layout), f"voice-{layout.codebook_size}")


def build_model(config: ModelConfig, device: str, seed: int) -> DualARModel:
    model = DualARModel(config).to(device)
    return init_weights_(model, seed)


@torch.no_grad()
def held_out_loss(model: DualARModel, seqs: list, device: str, amp: bool, cfg: LMTrainConfig) -> dict:
    model.eval()
    totals = {"slow": 0.0, "fast": 0.0, "slow_accuracy": 0.0, "end_accuracy": 0.0, "guide": 0.0}
    for i in range(0, len(seqs), 8):
        batch = collate(seqs[i : i + 8]).to(device)
        with torch.autocast("cuda", torch.bfloat16, enabled=amp):
            out = losses(model, batch, guide_layers=cfg.guided, guide_sigma=cfg.guide_sigma)
        for k in totals:
            totals[k] += float(getattr(out, k)) * len(seqs[i : i + 8]) / len(seqs)
    model.train()
    return {f"test_{k}": round(v, 4) for k, v in totals.items()}


def train(codes: Path, out: Path, minutes: float, save_minutes: float, cfg: LMTrainConfig, config: ModelConfig,
          layout: TinyLayout, device: str, max_steps: int | None = None, moments: bool = False,
          log_every: int = 50, eval_every: int = 500, total_minutes: float | None = None,
          keep_best: bool = False, overrides: dict | None = None, total_steps: int | None = None) -> dict:
    """Trains for `minutes` of wall clock (this call), on a schedule planned over
    `total_minutes` of training (all calls; default: this call's minutes), or over
    `total_steps` optimizer steps (training/schedule.py plan_steps). Resuming, the
    saved configs apply, with `overrides` (training-config fields the caller set
    explicitly) on top."""
    t_start = time.perf_counter()
    trained_minutes, extra = 0.0, {}
    state_dir = out / "state"
    if checkpoints.exists(state_dir):  # resume with what it was started with
        extra = json.loads((state_dir / checkpoints.STATE_FILE).read_text())["extra"]
        config = ModelConfig(**extra["model_config"])
        cfg = checkpoints.resumed_config(LMTrainConfig, extra["train_config"], overrides)
        layout = TinyLayout(**extra["layout"])
        trained_minutes = extra.get("trained_minutes", 0.0)
        total_minutes = total_minutes or extra.get("total_minutes")
    if cfg.max_tokens > config.max_seq_len:
        raise ValueError(f"max_tokens {cfg.max_tokens} exceeds the model's max_seq_len {config.max_seq_len}")
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(cfg.seed)
    model = build_model(config, device, cfg.seed)
    optimizer = torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95),
                                  fused=cuda)
    step, rewarm = 0, None
    if checkpoints.exists(state_dir):
        st = checkpoints.load(state_dir, model, optimizer)
        step, rewarm = st["step"], None if st["has_moments"] else st["step"]
        print(f"resumed at step {step} (moments: {st['has_moments']})", file=sys.stderr)
    data = CodeSet.load(codes)
    tok = tokenizer_for(layout)
    seq_cfg = SequenceConfig(max_tokens=cfg.max_tokens)
    builder = SequenceBuilder(data, tok, config, seq_cfg, "train", seed=cfg.seed + step)
    test = SequenceBuilder(data, tok, config, seq_cfg, "test", seed=1234)
    test_seqs = [test.sample() for _ in range(64)]
    loader = iter(torch.utils.data.DataLoader(
        BatchStream(builder, cfg.batch_tokens), batch_size=None, num_workers=cfg.loader_workers, pin_memory=cuda,
        prefetch_factor=4 if cfg.loader_workers else None, persistent_workers=cfg.loader_workers > 0))
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "log.jsonl").open("a")
    deadline, last_save, t_log, history = t_start + minutes * 60, time.perf_counter(), time.perf_counter(), []
    clock = Clock(total_minutes or minutes, trained_minutes, plan_steps(extra, total_steps, step))
    clock.warn_if_spent(step)
    model.train()
    tokens_seen = 0
    best = None  # (held-out figures, step, parameters on the CPU) of the best evaluation
    while time.perf_counter() < deadline and (max_steps is None or step < max_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, clock.progress_at(step), cfg.lr, cfg.warmup, cfg.min_lr_ratio, rewarm)
        batch = next(loader).to(device)
        with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
            result = losses(model, batch, cfg.fast_weight, cfg.max_fast_rows, cfg.dropout,
                            cfg.guided, cfg.guide_sigma, cfg.guide_weight, cfg.frame_dropout)
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()
        grad = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += batch.tokens.shape[0] * batch.tokens.shape[-1]
        if step % log_every == 0 or step == 1:
            dt = time.perf_counter() - t_log
            row = {"step": step, **{k: round(float(getattr(result, k).detach()), 4) for k in ("loss", "slow", "fast", "guide")},
                   "per_codebook": [round(v, 3) for v in result.per_codebook.tolist()],
                   "slow_accuracy": round(float(result.slow_accuracy), 4),
                   "end_accuracy": round(float(result.end_accuracy), 4),
                   "lr": optimizer.param_groups[0]["lr"], "grad": round(float(grad), 3),
                   "tokens_per_s": round(tokens_seen / dt), "minutes": round(clock.minutes, 2)}
            if step % eval_every == 0:
                row.update(held_out_loss(model, test_seqs, device, cuda, cfg))
                if keep_best and (best is None or row["test_slow"] < best[0]["test_slow"]):
                    best = ({k: v for k, v in row.items() if k.startswith("test_")}, step,
                            {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
            tokens_seen, t_log = 0, time.perf_counter()
            history.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), file=sys.stderr, flush=True)
        if time.perf_counter() - last_save > save_minutes * 60:
            _save(state_dir, model, optimizer, step, config, cfg, layout, moments, clock)
            last_save = time.perf_counter()
    # save first: the state is what the next call needs, and the evaluation's time is not training time
    _save(state_dir, model, optimizer, step, config, cfg, layout, moments, clock)
    final = held_out_loss(model, test_seqs, device, cuda, cfg)
    if keep_best and best is not None and final["test_slow"] > best[0]["test_slow"]:
        # overfitted since the best evaluation: end on that one's parameters
        model.load_state_dict(best[2])
        _save(state_dir, model, optimizer, step, config, cfg, layout, moments, clock)
        restored = {"restored_best_step": best[1], "at_step": step, "final_test_slow": final["test_slow"]}
        log.write(json.dumps(restored) + "\n")
        log.flush()
        print(json.dumps(restored), file=sys.stderr)
        final = best[0]
    print(json.dumps({"step": step, **final}), file=sys.stderr)
    return {"step": step, "history": history, "final": final}


def _save(state_dir: Path, model, optimizer, step: int, config: ModelConfig, cfg: LMTrainConfig,
          layout: TinyLayout, moments: bool, clock: Clock) -> None:
    t0 = time.perf_counter()
    extra = {"model_config": config.to_dict(), "train_config": dataclasses.asdict(cfg),
             "layout": {"codebook_size": layout.codebook_size, "num_codebooks": layout.num_codebooks},
             **clock.state()}
    checkpoints.save(state_dir, model, optimizer, step, extra, moments=moments)
    print(f"saved step {step} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


def load_trained(out: Path, device: str = "cpu") -> tuple[DualARModel, TinyLayout, int]:
    state_dir = out if checkpoints.exists(out) else out / "state"  # a training folder or its state
    extra = json.loads((state_dir / checkpoints.STATE_FILE).read_text())["extra"]
    config, layout = ModelConfig(**extra["model_config"]), TinyLayout(**extra["layout"])
    model = DualARModel(config).to(device)
    st = checkpoints.load(state_dir, model, None)
    model.refresh_head()
    return model.eval(), layout, st["step"]


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.lm_train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--codes", type=Path, required=True, help="codes.npz from codec_train encode")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--minutes", type=float, default=9.0, help="wall-clock budget of this call")
    t.add_argument("--total-minutes", type=float,
                   help="training minutes planned over all calls (the LR schedule's length; default --minutes)")
    t.add_argument("--total-steps", type=int,
                   help="the LR schedule over this many optimizer steps from this call's first step (saved: later "
                        "calls continue the plan) instead of minutes, for machines whose step rate changes")
    t.add_argument("--save-minutes", type=float, default=3.0)
    t.add_argument("--max-steps", type=int)
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="LMTrainConfig field")
    t.add_argument("--model-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="ModelConfig field over training.presets.voice_model_config")
    t.add_argument("--moments", action="store_true", help="also checkpoint the AdamW moments (2x larger)")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--keep-best", action="store_true",
                   help="end on the parameters of the best held-out slow loss (early stopping)")
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True, help="the training folder")
    e.add_argument("--codec", type=Path, required=True, help="folder with codec.pth + codec_config.json")
    e.add_argument("--to", type=Path, required=True)
    e.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    h = sub.add_parser("half-state", help="a copy of a state with fp16 parameters and no moments (half the upload)")
    h.add_argument("--state", type=Path, required=True, help="a state folder (state.json + params-*)")
    h.add_argument("--to", type=Path, required=True)
    args = p.parse_args(argv)
    if args.command == "half-state":
        state = checkpoints.halve(args.state, args.to)
        size = sum((args.to / name).stat().st_size for name in state["params"])
        print(f"{args.to}: step {state['step']}, {size / 1e6:.1f} MB of parameters", file=sys.stderr)
    elif args.command == "train":
        sets = checkpoints.config_sets(LMTrainConfig, args.set)
        cfg = LMTrainConfig(**sets)
        overrides = {k: _parse_value(v) for k, v in (s.split("=", 1) for s in args.model_set)}
        layout = VOICE_LAYOUT
        config = voice_model_config(layout, **overrides)
        result = train(args.codes, args.out, args.minutes, args.save_minutes, cfg, config, layout, args.device,
                       args.max_steps, args.moments, args.log_every, args.eval_every, args.total_minutes,
                       args.keep_best, overrides=sets, total_steps=args.total_steps)
        print(json.dumps(result["final"]), file=sys.stderr)
    else:
        from training.export import copy_codec, folder_bytes, write_model

        model, layout, step = load_trained(args.out)
        write_model(model, layout, args.to, getattr(torch, args.dtype))
        copy_codec(args.codec, args.to)
        sizes = folder_bytes(args.to)
        print(json.dumps({"step": step, "files": sizes, "total_mb": round(sum(sizes.values()) / 1e6, 2)}),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
