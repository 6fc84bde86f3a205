"""The blocks' small ops as Triton kernels (TransformerBlock.forward_kernels: residual add
+ RMSNorm, SwiGLU, fast-transformer attention) against the PyTorch path, in the model:
the same greedy frames from the runner's step, and the same logits."""

from __future__ import annotations

import pytest
import torch

from engine.bundle import load_bundle
from engine.kernel_plan import REFERENCE, KernelPlan
from engine.kv_cache import FastCache, KVCache
from engine.runner import Runner
from engine.sampling import SamplingParams

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def decoded_frames(step_kernels: bool, gpu_path: bool, frames: int = 4, temperature: float = 0.0) -> list[torch.Tensor]:
    bundle = load_bundle("tiny", DEVICE, torch.float32)
    plan = KernelPlan(attention=gpu_path, fused_qkv=gpu_path, step=step_kernels)
    runner = Runner(bundle, max_running=3, max_len=128, plan=plan, cuda_graphs=False)
    prompt = bundle.prompts.segment("Hello there.")
    for slot in range(3):
        runner.prefill_segment(slot, 8 * slot, prompt, SamplingParams(temperature=temperature, seed=slot))
    return [runner.read(runner.launch([0, 1, 2], 64)) for _ in range(frames)]


@pytest.mark.parametrize("gpu_path", [False, True], ids=["pytorch-attention", "triton-attention"])
def test_decode_steps_give_the_same_greedy_frames(gpu_path):
    for a, b in zip(decoded_frames(False, gpu_path), decoded_frames(True, gpu_path)):
        assert (a == b).all()


def test_sampled_frames_are_the_same_draws():
    """With the kernels the draws are kernels/sample.py's, noise for noise the same as
    engine/sampling.py's: a seeded run gives the same frames either way."""
    for a, b in zip(decoded_frames(False, True, temperature=0.8), decoded_frames(True, True, temperature=0.8)):
        assert (a == b).all()


def test_logits_match_in_prefill_decode_and_every_fast_step():
    bundle = load_bundle("tiny", DEVICE, torch.float32)
    model, c = bundle.model, bundle.config
    model.layers.apply(lambda m: m.fuse_gate_up_() if hasattr(m, "fuse_gate_up_") else None)
    tokens = bundle.prompts.segment("A short prompt for both paths.").to(DEVICE)
    outs = []
    for plan in (REFERENCE, KernelPlan(step=True)):
        kv = KVCache.allocate(c, 1, 64, DEVICE, torch.float32)
        fast = FastCache.allocate(c, 1, DEVICE, torch.float32)
        with torch.no_grad():
            head, fast_in = model.prefill(tokens, 0, 0, kv, plan)
            model.fast_step(fast_in, 0, fast, plan)
            logits = [head] + [model.fast_step(model.fast_embeddings(torch.tensor([i], device=DEVICE)), i, fast, plan)
                               for i in range(1, c.num_codebooks)]
            frame = torch.zeros(1, 1 + c.num_codebooks, dtype=torch.long, device=DEVICE)
            frame[0, 0] = c.semantic_begin_id
            pos = torch.tensor([tokens.shape[1]], device=DEVICE)
            logits.append(model.decode_slow(frame, torch.tensor([0], device=DEVICE), pos, int(pos) + 1, kv, plan)[0])
        outs.append(logits)
    for a, b in zip(*outs):
        assert ((a - b).norm() / b.norm()).item() < 1e-5
