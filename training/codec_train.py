"""Train the small causal codec on the teacher audio, resumably, then export it and encode
the data set into codes for the DualAR model.

    # train (time-bounded; checkpoints every --save-minutes into --out/state, resumes from it)
    python -m training.codec_train train --data data/voice/audio --out runs/codec --minutes 8
    # export codec.pth + codec_config.json (fp16) from the latest state
    python -m training.codec_train export --out runs/codec --to runs/codec/export
    # encode every utterance (train + held-out) into codes.npz for the model's training
    python -m training.codec_train encode --codec runs/codec/export --data data/voice/audio \
        --to runs/codec/codes.npz
    # more teacher data later: encode only the new folder and add it to the codes made
    python -m training.codec_train encode --codec runs/codec/export --data data/voice/audio3 \
        --append runs/codec/codes.npz --to runs/codec/codes-more.npz

Losses: multi-scale log-mel L1 (x15, DAC's weight), multi-resolution STFT (x1), VQ
commitment (x0.25) and codebook (x1), and a small codebook-usage entropy loss (x0.1). No
adversarial loss: a GAN needs far more steps than the GPU minutes this voice is trained
with, and its early phase degrades intelligibility; the mel loss alone gives an
intelligible, somewhat buzzy codec.

Codebook collapse is the failure to watch (`perplexity` in the log, per codebook, over the
steps since the last restart check; 1024 is the most): at init the encoder's latents fill a
narrow cone and every frame picks the same few codes. Against it: codebooks seeded from
the data at step 0, the VQ input biases zeroed, dead codes restarted on live latents every
`restart_every` steps, quantizer dropout, and the entropy loss. On the 2-core CPU, 60 steps
of batch 8 x 1 s kept 15-26 of each codebook's codes in use; a GPU run should climb well
above 100 within its first thousand steps, else raise `entropy_weight` (`--set
entropy_weight=0.5`) or lower `lr`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from engine.codec.config import CodecConfig
from engine.codec.model import Codec
from training import checkpoints
from training.best import BestKeeper
from training.codec_forward import (CodecTrainer, add_weight_norm_, fold_weight_norm_, init_codec_,
                                        normalize_codebooks_, use_fused_snake_)
from training.codec_losses import ReconstructionLoss, head_phase_loss, head_spectrum_loss, snr_db
from training.phone_targets import NUM_CLASSES
from training.presets import VOICE_CODEC
from training.schedule import Clock, lr_at, plan_steps

MEL_WEIGHT, STFT_WEIGHT, COMMIT_WEIGHT, CODEBOOK_WEIGHT = 15.0, 1.0, 0.25, 1.0


@dataclasses.dataclass
class CodecTrainConfig:
    batch: int = 32
    segment_seconds: float = 2.0
    lr: float = 3e-4
    warmup: int = 500
    min_lr_ratio: float = 0.1
    quantizer_dropout: float = 0.5
    restart_every: int = 50  # steps between dead-code restarts
    entropy_weight: float = 0.1  # codebook-usage entropy loss
    spread_weight: float = 1.0  # keeps the VQ latents' directions spread (no common component)
    grad_clip: float = 10.0
    seed: int = 0
    # CTC on the semantic codebook (phone_targets.py): 0 turns it off; used when the data
    # folder has phones.json. Whole utterances up to phone_max_seconds, phone_batch a step.
    phone_weight: float = 2.0
    phone_batch: int = 16
    phone_max_seconds: float = 6.0
    # Snake and its gradient as one Triton pass each (codec_forward.use_fused_snake_): the
    # DAC-style codec's step 8.53 -> 10.12 per second on an H200 (batch 32 x 2 s, 2026-12-01).
    # The shipped codec (stft encoder, istft decoder) has no Snake, so its recipe leaves it off.
    fused_snake: bool = False
    # the best parameters by the mel L1 of each log window (training/best.py): a window
    # above best * rollback_ratio puts them back (0: never), and with keep_best the run
    # ends on them when its last window is worse by more than 5%
    keep_best: bool = True
    rollback_ratio: float = 1.3
    # the "istft" decoder's head log-magnitude against the target's on the same frames
    # (codec_losses.head_spectrum_loss); 0: off, as every run before 2026-12-02
    head_spectrum_weight: float = 0.0
    # the head's phase derivatives against the target's (codec_losses.head_phase_loss);
    # 0: off, as every run before 2026-12-05
    head_phase_weight: float = 0.0
    # the quantizers' latents and codes at unit length in the losses and the straight-
    # through path, not only in the search (codec_forward._quantize says why); False as
    # every run before 2026-12-02
    unit_codes: bool = False
    # fine-tune the decoding side only (the quantizer's post-module and upsampling, the
    # decoder): the encoder, the quantizers' projections and codebooks stay as they are,
    # so every code keeps its meaning and a DualAR model trained on the codec's codes
    # needs no retraining. No dead-code restarts, quantizer dropout or phone head then
    # (each would move or train the frozen side). For a resumed or `state-from-export` run
    # (`--set decoder_only=true`).
    decoder_only: bool = False


# the codec's modules a decoder_only run trains (under codec.): everything else is frozen
DECODING_SIDE = ("quantizer.post_module", "quantizer.upsample", "decoder")


def freeze_encoding_side_(trainer: CodecTrainer) -> list[str]:
    """decoder_only: no gradient for (and eval mode in) every codec module outside
    DECODING_SIDE. Returns the trainable parameters' names."""
    trainable = []
    for name, p in trainer.codec.named_parameters():
        train = name.startswith(DECODING_SIDE)
        p.requires_grad_(train)
        if train:
            trainable.append(name)
    return trainable


def set_train_mode_(trainer: CodecTrainer, decoder_only: bool) -> None:
    """trainer.train(); with decoder_only the frozen modules stay in eval mode (their
    dropout, if any, off), so the decoder learns from the codes inference makes."""
    trainer.train()
    if decoder_only:
        for name, module in trainer.codec.named_modules():
            if name and not name.startswith(DECODING_SIDE) and not any(
                    side.startswith(name + ".") for side in DECODING_SIDE):
                module.eval()


def build(config: CodecConfig, device: str, cfg: CodecTrainConfig | None = None) -> CodecTrainer:
    cfg = cfg or CodecTrainConfig()
    torch.manual_seed(cfg.seed)
    codec = init_codec_(Codec(config), cfg.seed)
    if cfg.fused_snake:
        use_fused_snake_(codec)
    trainer = CodecTrainer(add_weight_norm_(codec), 0.0 if cfg.decoder_only else cfg.quantizer_dropout,
                           cfg.restart_every, cfg.unit_codes)
    if cfg.phone_weight > 0 and not cfg.decoder_only:
        trainer.add_phone_head(NUM_CLASSES)
    if cfg.decoder_only:
        freeze_encoding_side_(trainer)
    return trainer.to(device)


def loss_terms(trainer: CodecTrainer, losses: ReconstructionLoss, x: torch.Tensor,
               entropy_weight: float = 0.1, spread_weight: float = 1.0,
               head_spectrum_weight: float = 0.0, head_phase_weight: float = 0.0) -> dict[str, torch.Tensor]:
    y, vq = trainer(x)
    terms = {"mel": losses.mel(y, x), "stft": losses.stft(y, x), "commit": vq.commitment, "codebook": vq.codebook,
             "entropy": vq.entropy, "spread": vq.spread}
    terms["loss"] = (MEL_WEIGHT * terms["mel"] + STFT_WEIGHT * terms["stft"] + COMMIT_WEIGHT * terms["commit"]
                     + CODEBOOK_WEIGHT * terms["codebook"] + entropy_weight * terms["entropy"]
                     + spread_weight * terms["spread"])
    if (head_spectrum_weight > 0 or head_phase_weight > 0) and vq.head_log_magnitude is None:
        raise ValueError("head_spectrum_weight and head_phase_weight need the istft decoder (decoder_kind 'istft')")
    if vq.head_log_magnitude is not None:
        # logged whatever its weight: unlike the mel, it is not saturated by the phase
        decoder = trainer.codec.decoder
        terms["head"] = head_spectrum_loss(vq.head_log_magnitude, x, decoder.head.analysis_window(x.device),
                                           decoder.head.hop, decoder.lookahead)
        if head_spectrum_weight > 0:
            terms["loss"] = terms["loss"] + head_spectrum_weight * terms["head"]
        if head_phase_weight > 0:
            terms["phase"] = head_phase_loss(vq.head_phase, x, decoder.head.analysis_window(x.device),
                                             decoder.head.hop, decoder.lookahead)
            terms["loss"] = terms["loss"] + head_phase_weight * terms["phase"]
    terms["_y"] = y
    return terms


def train(data: list[Path], out: Path, minutes: float, save_minutes: float, cfg: CodecTrainConfig,
          config: CodecConfig, device: str, workers: int, max_steps: int | None = None,
          moments: bool = True, log_every: int = 50, total_minutes: float | None = None,
          overrides: dict | None = None, half_params: bool = False, profile_steps: int = 0,
          total_steps: int | None = None) -> dict:
    """Trains for `minutes` of wall clock (this call, data loading included), on a schedule
    planned over `total_minutes` of training (all calls; default: this call's minutes), or
    over `total_steps` optimizer steps (training/schedule.py plan_steps).
    Resuming, the saved configs apply, with `overrides` (training-config fields the
    caller set explicitly) on top. `profile_steps` > 0: those steps (after 3 of warm-up)
    run under torch.profiler, and its table (by device time) goes to out/profile.txt."""
    from training.audio_data import AudioSet, CropSampler, UtteranceSampler

    t_start = time.perf_counter()
    trained_minutes, saved = 0.0, {}
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    state_dir = out / "state"
    if checkpoints.exists(state_dir):  # resume with the config it was started with
        saved = json.loads((state_dir / checkpoints.STATE_FILE).read_text())["extra"]
        config = CodecConfig(**saved["codec_config"])
        cfg = checkpoints.resumed_config(CodecTrainConfig, saved["train_config"], overrides)
        trained_minutes = saved.get("trained_minutes", 0.0)
        total_minutes = total_minutes or saved.get("total_minutes")
    trainer = build(config, device, cfg)
    optimizer = torch.optim.AdamW(trainer.parameters(), lr=cfg.lr, betas=(0.8, 0.99), weight_decay=0.0,
                                  fused=device.startswith("cuda"))
    step, rewarm = 0, None
    if checkpoints.exists(state_dir):
        st = checkpoints.load(state_dir, trainer.codec, optimizer)
        step = st["step"]
        rewarm = None if st["has_moments"] else step
        print(f"resumed at step {step} (moments: {st['has_moments']})", file=sys.stderr)
    audio = AudioSet(data, config.sample_rate, ("train",), workers)
    print(f"{len(audio.utterances)} utterances, {audio.seconds / 3600:.2f} h, loaded in "
          f"{time.perf_counter() - t_start:.0f} s", file=sys.stderr, flush=True)
    segment = int(cfg.segment_seconds * config.sample_rate) // config.hop_length * config.hop_length
    sampler = CropSampler(audio, segment, device, seed=cfg.seed + step)
    phones = None
    if cfg.decoder_only and step == 0:
        raise ValueError("decoder_only fine-tunes a trained codec: resume a run or start from `state-from-export`")
    if cfg.phone_weight > 0 and not cfg.decoder_only:
        if any(u.phones for u in audio.utterances):
            phones = UtteranceSampler(audio, int(cfg.phone_max_seconds * config.sample_rate), config.hop_length,
                                      device, seed=cfg.seed + step)
        else:
            print("no phones.json in the data: the semantic codebook trains without phone targets",
                  file=sys.stderr)
    losses = ReconstructionLoss(config.sample_rate).to(device)
    if step == 0:  # a fresh codec: codebooks from the data (one larger batch of latents)
        trainer.seed_codebooks(sampler.batch(max(cfg.batch, 64)))
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "log.jsonl").open("a")
    deadline = t_start + minutes * 60
    # the schedule counts training time only (not the data loading above)
    clock = Clock(total_minutes or (deadline - time.perf_counter()) / 60, trained_minutes,
                  plan_steps(saved, total_steps, step))
    clock.warn_if_spent(step)
    last_save, t_log, history = time.perf_counter(), time.perf_counter(), []
    logged_step = step  # the step of the last log row (or of the start): steps_per_s over the real count
    set_train_mode_(trainer, cfg.decoder_only)
    profiling = StepProfile(out / "profile.txt", step + 3, profile_steps, device) if profile_steps > 0 else None
    keeper = BestKeeper(rollback_ratio=cfg.rollback_ratio)
    window_mel, window_steps, last_window = torch.zeros((), device=device), 0, None
    window_head = torch.zeros((), device=device)
    observe_from = (step if rewarm is not None else 0) + cfg.warmup  # past the (re-)warm-up, where the mel only falls
    while time.perf_counter() < deadline and (max_steps is None or step < max_steps):
        if profiling is not None:
            profiling.at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, clock.progress_at(step), cfg.lr, cfg.warmup, cfg.min_lr_ratio, rewarm)
        x = sampler.batch(cfg.batch)
        terms = loss_terms(trainer, losses, x, cfg.entropy_weight, cfg.spread_weight, cfg.head_spectrum_weight,
                             cfg.head_phase_weight)
        if phones is not None:
            terms["phone"] = trainer.phone_loss(*phones.batch(cfg.phone_batch))
            terms["loss"] = terms["loss"] + cfg.phone_weight * terms["phone"]
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        grad = torch.nn.utils.clip_grad_norm_(trainer.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        window_mel += terms["mel"].detach()  # on the device: read at the log step only
        if "head" in terms:
            window_head += terms["head"].detach()
        window_steps += 1
        logging = step % log_every == 0 or step == 1
        perplexity = trainer.perplexity() if logging else None  # usage since the last restart check
        restarted = 0 if cfg.decoder_only else trainer.restart_dead_codes()
        if logging:
            row = {k: round(float(v.detach()), 5) for k, v in terms.items() if not k.startswith("_")}
            row.update(step=step, lr=optimizer.param_groups[0]["lr"], grad=round(float(grad), 3),
                       snr_db=round(snr_db(terms["_y"].detach(), x), 2), restarted=restarted,
                       perplexity=[round(p, 1) for p in perplexity],
                       steps_per_s=round((step - logged_step) / (time.perf_counter() - t_log), 2),
                       minutes=round(clock.minutes, 2))
            t_log, logged_step = time.perf_counter(), step
            last_window = float(window_mel) / window_steps
            row["window_mel"] = round(last_window, 5)
            if "head" in terms:
                row["window_head"] = round(float(window_head) / window_steps, 5)
            window_mel.zero_()
            window_head.zero_()
            window_steps = 0
            if (cfg.keep_best or cfg.rollback_ratio > 0) and step > observe_from:
                if keeper.observe(step, last_window, trainer) == "rollback":
                    # diverging: back to the best parameters, fresh moments, a short re-warm
                    optimizer.state.clear()
                    rewarm = step
                    row["rolled_back_to"] = keeper.best_step
            history.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(json.dumps(row), file=sys.stderr, flush=True)
        if time.perf_counter() - last_save > save_minutes * 60:
            _save(state_dir, trainer, optimizer, step, config, cfg, moments, clock, half_params)
            last_save = time.perf_counter()
    if cfg.keep_best and keeper.finish(last_window, trainer):
        ended = {"ended_on_best_step": keeper.best_step, "best_window_mel": round(keeper.best, 5),
                 "last_window_mel": round(last_window, 5), "at_step": step}
        log.write(json.dumps(ended) + "\n")
        print(json.dumps(ended), file=sys.stderr, flush=True)
    _save(state_dir, trainer, optimizer, step, config, cfg, moments, clock, half_params)
    log.flush()
    return {"step": step, "history": history, "best_step": keeper.best_step, "rollbacks": keeper.rollbacks}


class StepProfile:
    """torch.profiler over steps [start, start + count) of a training loop: where a step's
    time goes (kernels by device time on a GPU, operators by CPU time otherwise)."""

    def __init__(self, path: Path, start: int, count: int, device: str) -> None:
        self.path, self.start, self.end, self.cuda = path, start, start + count, device.startswith("cuda")
        self.prof = None

    def at(self, step: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        if step == self.start:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.prof = profile(activities=activities)
            self.prof.__enter__()
        elif step == self.end and self.prof is not None:
            if self.cuda:
                torch.cuda.synchronize()
            self.prof.__exit__(None, None, None)
            key = "cuda_time_total" if self.cuda else "cpu_time_total"
            table = self.prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70)
            self.path.write_text(f"steps {self.start}..{self.end - 1}\n{table}\n")
            print(table, file=sys.stderr, flush=True)
            self.prof = None


def _save(state_dir: Path, trainer, optimizer, step: int, config: CodecConfig, cfg: CodecTrainConfig,
          moments: bool, clock: Clock, half_params: bool = False) -> None:
    t0 = time.perf_counter()
    extra = {"codec_config": dataclasses.asdict(config), "train_config": dataclasses.asdict(cfg), **clock.state()}
    checkpoints.save(state_dir, trainer.codec, optimizer, step, extra, moments=moments, half_params=half_params)
    print(f"saved step {step} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)


# --- export and encoding --------------------------------------------------------------

def load_trained(out: Path, device: str = "cpu") -> tuple[Codec, int]:
    """The codec of a training folder's latest state, weight norm folded, in eval mode."""
    state_dir = out if checkpoints.exists(out) else out / "state"  # a training folder or its state
    extra = json.loads((state_dir / checkpoints.STATE_FILE).read_text())["extra"]
    config = CodecConfig(**extra["codec_config"])
    codec = add_weight_norm_(Codec(config))
    st = checkpoints.load(state_dir, codec, None)
    # a decoder_only run's codebooks are those of the export it started from, already
    # normalized there: normalizing them again would move rows by a rounding step in the
    # exported fp16 and could flip a code the DualAR model was trained on
    if extra["train_config"].get("unit_codes", False) and not extra["train_config"].get("decoder_only", False):
        normalize_codebooks_(codec)
    return fold_weight_norm_(codec).to(device).eval(), st["step"]


def state_from_export(folder: Path, out: Path, step: int, cfg: CodecTrainConfig, trained_minutes: float = 0.0) -> None:
    """A training state (out/state) from an exported codec (codec.pth + codec_config.json),
    so that a run goes on from the packaged codec when the state it was exported from is
    gone: `train` then resumes it like any state (fresh moments, a short re-warm). `step`
    must be > 0 (the step of the export, for the logs; 0 would seed the codebooks from
    data again). Exports of unit-codes runs store their codebook rows normalized, which
    such a run's search and losses take anyway."""
    from engine.codec.loader import load_codec

    if step < 1:
        raise ValueError("step must be >= 1: a state at step 0 is a fresh codec")
    codec = add_weight_norm_(load_codec(folder / "codec.pth", dtype=torch.float32))
    extra = {"codec_config": dataclasses.asdict(codec.config), "train_config": dataclasses.asdict(cfg),
             "trained_minutes": trained_minutes, "total_minutes": None}
    checkpoints.save(out / "state", codec, None, step, extra, moments=False)


def export(codec: Codec, folder: Path, dtype: torch.dtype = torch.float16) -> None:
    """codec.pth (plain state dict, weight norm folded) + codec_config.json, the layout
    engine/codec/loader.py reads."""
    from engine.codec.loader import CONFIG_FILE

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in codec.state_dict().items()}
    torch.save(state, folder / "codec.pth")
    (folder / CONFIG_FILE).write_text(codec.config.to_json())


def keep_encoding_side(folder: Path, source: Path) -> int:
    """Overwrite, in folder/codec.pth, every tensor outside DECODING_SIDE with the one in
    source/codec.pth (same config and names, else ValueError). For decoder_only states
    saved before checkpoints.save kept frozen parameters in fp32: their weight-norm factors
    had been rounded to fp16, which moved frozen weights by a rounding step. Returns how
    many tensors were taken."""
    from engine.codec.loader import CONFIG_FILE

    if (folder / CONFIG_FILE).read_text() != (source / CONFIG_FILE).read_text():
        raise ValueError(f"{folder} and {source} have different codec configs")
    ours, theirs = torch.load(folder / "codec.pth", weights_only=True), torch.load(source / "codec.pth", weights_only=True)
    if ours.keys() != theirs.keys():
        raise ValueError(f"{folder} and {source} name different tensors")
    frozen = [k for k in ours if not k.startswith(DECODING_SIDE)]
    for k in frozen:
        if theirs[k].shape != ours[k].shape or theirs[k].dtype != ours[k].dtype:
            raise ValueError(f"{k}: {theirs[k].dtype} {list(theirs[k].shape)} in {source}, "
                             f"{ours[k].dtype} {list(ours[k].shape)} here")
        ours[k] = theirs[k]
    torch.save(ours, folder / "codec.pth")
    return len(frozen)


@torch.no_grad()
def encode_set(codec: Codec, data: list[Path], device: str, workers: int = 1, batch_seconds: float = 120.0) -> dict:
    """Codes of every utterance (train and test): {'codes': int16 [C, frames total],
    'offsets': [n + 1], 'ids', 'speakers', 'texts', 'splits'}."""
    from training.audio_data import AudioSet

    audio = AudioSet(data, codec.sample_rate, ("train", "test"), workers)
    hop = codec.hop_length
    order = sorted(range(len(audio.utterances)), key=lambda i: audio.utterances[i].samples)
    codes: list[np.ndarray | None] = [None] * len(order)
    i = 0
    while i < len(order):
        longest = audio.utterances[order[min(len(order) - 1, i)]].samples
        n = max(1, int(batch_seconds * codec.sample_rate // max(longest, 1)))
        group = order[i : i + n]
        length = -(-max(audio.utterances[j].samples for j in group) // hop) * hop
        x = np.zeros((len(group), length), np.float32)
        for row, j in enumerate(group):
            w = audio.waveform(audio.utterances[j])
            x[row, : w.size] = w
        c = codec.encode(torch.from_numpy(x).to(device, next(codec.parameters()).dtype)).cpu().numpy()
        for row, j in enumerate(group):
            frames = -(-audio.utterances[j].samples // hop)
            codes[j] = c[row, :, :frames].astype(np.int16)
        i += n
    offsets = np.cumsum([0] + [c.shape[1] for c in codes])
    us = audio.utterances
    return {"codes": np.concatenate(codes, axis=1), "offsets": offsets,
            "ids": np.array([u.id for u in us]), "speakers": np.array([u.speaker for u in us]),
            "texts": np.array([u.text for u in us]), "splits": np.array([u.split for u in us])}


def refuse_repeated_ids(first, second) -> None:
    """Two sets of utterance ids must not share one (merge_code_sets' rule)."""
    repeated = set(map(str, first)) & set(map(str, second))
    if repeated:
        raise ValueError(f"{len(repeated)} utterance ids are in both sets (e.g. {sorted(repeated)[0]!r})")


def merge_code_sets(first: dict, second: dict) -> dict:
    """One code set of two (encode_set's dicts, or np.load of its files): the utterances of
    `first`, then those of `second`. Lets more teacher data be encoded alone and added to
    codes already made (encode --append). Refuses sets of different codebook counts and
    repeated utterance ids (the same folder encoded twice would weigh its sentences double)."""
    if first["codes"].shape[0] != second["codes"].shape[0]:
        raise ValueError(f"codebook counts differ: {first['codes'].shape[0]} vs {second['codes'].shape[0]}")
    refuse_repeated_ids(first["ids"], second["ids"])
    offsets = np.concatenate([first["offsets"], first["offsets"][-1] + second["offsets"][1:]])
    merged = {"codes": np.concatenate([first["codes"], second["codes"]], axis=1), "offsets": offsets}
    for key in ("ids", "speakers", "texts", "splits"):
        merged[key] = np.concatenate([np.asarray(first[key]), np.asarray(second[key])])
    return merged


# --- command line ----------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.codec_train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", type=Path, action="append", required=True, help="teacher data folder (repeatable)")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of this call")
    t.add_argument("--total-minutes", type=float,
                   help="training minutes planned over all calls (the LR schedule's length; default: this call's)")
    t.add_argument("--total-steps", type=int,
                   help="the LR schedule over this many optimizer steps from this call's first step (saved: later "
                        "calls continue the plan) instead of minutes, for machines whose step rate changes")
    t.add_argument("--save-minutes", type=float, default=2.0)
    t.add_argument("--max-steps", type=int, default=None)
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--workers", type=int, default=4, help="processes decoding the shards")
    t.add_argument("--codec-config", type=Path, help="JSON CodecConfig (default: training.presets.VOICE_CODEC)")
    t.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a CodecTrainConfig field (batch, segment_seconds, lr, steps, ...)")
    t.add_argument("--no-moments", action="store_true", help="checkpoint parameters only (smaller)")
    t.add_argument("--profile-steps", type=int, default=0,
                   help="profile this many steps (after 3 of warm-up) into OUT/profile.txt")
    t.add_argument("--half-state", action="store_true",
                   help="checkpoint parameters in fp16 (half the bytes: room for more audio in a resumed call's upload)")
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True, help="the training folder")
    e.add_argument("--to", type=Path, required=True)
    e.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    e.add_argument("--encoding-from", type=Path, metavar="CODEC_FOLDER",
                   help="a decoder_only run's export: every tensor outside the decoding side taken bit for bit "
                        "from this earlier export (the one the run started from), so the codes stay its codes")
    f = sub.add_parser("state-from-export", help="a training state to resume from an exported codec")
    f.add_argument("--codec", type=Path, required=True, help="folder with codec.pth + codec_config.json")
    f.add_argument("--out", type=Path, required=True, help="the training folder to create (OUT/state)")
    f.add_argument("--step", type=int, required=True, help="the step the codec was exported at (> 0)")
    f.add_argument("--trained-minutes", type=float, default=0.0, help="for the schedule (default: none yet)")
    f.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="the CodecTrainConfig the run was trained with (e.g. unit_codes=1)")
    c = sub.add_parser("encode")
    c.add_argument("--codec", type=Path, required=True, help="folder with codec.pth + codec_config.json")
    c.add_argument("--data", type=Path, action="append", required=True)
    c.add_argument("--to", type=Path, required=True)
    c.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    c.add_argument("--workers", type=int, default=4)
    c.add_argument("--append", type=Path, metavar="CODES_NPZ",
                   help="codes already made: the result is those followed by the new folders' codes")
    args = p.parse_args(argv)
    if args.command == "train":
        config = CodecConfig.from_json(args.codec_config.read_text()) if args.codec_config else VOICE_CODEC
        sets = checkpoints.config_sets(CodecTrainConfig, args.set)
        result = train(args.data, args.out, args.minutes, args.save_minutes, CodecTrainConfig(**sets), config,
                       args.device, args.workers, args.max_steps, moments=not args.no_moments,
                       total_minutes=args.total_minutes, overrides=sets, half_params=args.half_state,
                       profile_steps=args.profile_steps, total_steps=args.total_steps)
        print(json.dumps(result["history"][-1] if result["history"] else {"step": result["step"]}), file=sys.stderr)
    elif args.command == "state-from-export":
        cfg = CodecTrainConfig(**checkpoints.config_sets(CodecTrainConfig, args.set))
        state_from_export(args.codec, args.out, args.step, cfg, args.trained_minutes)
        print(f"{args.out / 'state'}: step {args.step} from {args.codec}", file=sys.stderr)
    elif args.command == "export":
        codec, step = load_trained(args.out)
        export(codec, args.to, getattr(torch, args.dtype))
        if args.encoding_from:
            kept = keep_encoding_side(args.to, args.encoding_from)
            print(f"{kept} encoding-side tensors from {args.encoding_from}", file=sys.stderr)
        print(f"exported step {step} to {args.to}", file=sys.stderr)
    else:
        from engine.codec.loader import load_codec

        codec = load_codec(args.codec / "codec.pth", device=args.device, dtype=torch.float32)
        earlier = None
        if args.append:  # refused before minutes of encoding, not after
            from training.datagen import manifest_ids

            with np.load(args.append) as z:
                earlier = dict(z)
            refuse_repeated_ids(earlier["ids"], manifest_ids(args.data))
        t0 = time.perf_counter()
        result = encode_set(codec, args.data, args.device, args.workers)
        if earlier is not None:
            result = merge_code_sets(earlier, result)
        args.to.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(args.to, **result)
        print(f"{len(result['ids'])} utterances, {result['codes'].shape[1]} frames in "
              f"{time.perf_counter() - t0:.0f} s -> {args.to}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
