"""engine.train.codec_train's CLI with the LR schedule's progress counted in steps, not
wall minutes: progress = (step - START_STEP) / STEPS. The 2026-12-05 phase-loss run did
2,900 steps (20,958 -> 23,858) in its 60 minutes at a steady ~0.85 steps/s, so its
time-based cosine was, to within a few steps, this step-based one; on a shared machine
the same 60 minutes give far fewer steps, so this reproduces the run by steps instead.
TORCH_THREADS (optional) sets torch's intra-op threads.

Kept as the command that ran; `codec_train train --total-steps STEPS` (from a state at
START_STEP) now does the same without this wrapper (engine/train/schedule.py plan_steps)."""
import os
import sys

import torch

from engine.train import codec_train as ct
from engine.train import schedule

START, N = int(os.environ["START_STEP"]), int(os.environ["STEPS"])


def lr_by_steps(step, progress, *args, **kwargs):
    return schedule.lr_at(step, (step - START) / N, *args, **kwargs)


if __name__ == "__main__":  # not again in the data loader's spawned workers
    ct.lr_at = lr_by_steps
    if os.environ.get("TORCH_THREADS"):
        torch.set_num_threads(int(os.environ["TORCH_THREADS"]))
    print(f"lr schedule by steps: {START} + {N}; torch threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}", file=sys.stderr, flush=True)
    raise SystemExit(ct.main(sys.argv[1:]))
