"""The model and KV state are batch-ready: streams at different positions in different
KV rows, decoded together, give exactly the tokens each gives alone (greedy), also when
a stream joins mid-flight and the batch is padded with the scratch row."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from conftest import UPSTREAM
from engine.checkpoint import load_checkpoint
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.kv_cache import FastCache, KVCache
from engine.prompt import PromptBuilder
from engine.sampling import SamplingParams, SamplingTensors
from test_checkpoint import greedy_frames

GREEDY = SamplingParams(temperature=0.0)
N_FRAMES = 10


@dataclass
class Stream:
    prompt: torch.Tensor
    slot: int
    join_step: int
    window: torch.Tensor
    frames: list = field(default_factory=list)
    pos: int = 0

    @property
    def last(self):
        return self.frames[-1][None]


def test_batched_greedy_equals_each_stream_alone():
    model, tok = load_checkpoint(UPSTREAM / "s2", "cpu", torch.float32)
    c, builder = model.config, PromptBuilder(tok, model.config)
    texts = ["Hello there.", "A somewhat longer sentence, with a clause.", "Short!"]
    prompts = [builder.full(None, t) for t in texts]
    alone = [greedy_frames(model, p, N_FRAMES) for p in prompts]
    assert all(a.shape[1] == N_FRAMES for a in alone)  # no early end with these weights

    kv = KVCache.allocate(c, max_running=4, max_len=c.max_seq_len, device="cpu", dtype=torch.float32)
    fast = FastCache.allocate(c, 4, "cpu", torch.float32)  # decode batch scratch
    prefill_fast = FastCache.allocate(c, 1, "cpu", torch.float32)
    win = lambda: new_window(1, c.sampling_window, c.num_codebooks, "cpu")
    # arbitrary KV rows; the third stream joins after 4 steps
    streams = [Stream(prompts[0], 2, 0, win()), Stream(prompts[1], 0, 0, win()), Stream(prompts[2], 3, 4, win())]
    one = SamplingTensors.from_params([GREEDY], "cpu")
    for step in range(N_FRAMES + 4):
        for s in streams:
            if step == s.join_step:  # prefill: the first frame comes from the prompt
                head, fast_in = model.prefill(s.prompt, s.slot, 0, kv)
                s.frames.append(sample_frame(model, prefill_fast, head, fast_in, one, s.window, torch.zeros(1, dtype=torch.long))[0])
                s.pos = s.prompt.shape[1]
        live = [s for s in streams if s.join_step < step and len(s.frames) < N_FRAMES]
        if not live:
            continue
        for s in live:
            push_window(s.window, s.last[:, 1:])
        # pad the batch by one row that writes only into the scratch KV row
        tokens = torch.cat([s.last for s in live] + [torch.zeros_like(live[0].last)])
        slots = torch.tensor([s.slot for s in live] + [kv.scratch_row])
        positions = torch.tensor([s.pos for s in live] + [7])
        windows = torch.cat([s.window for s in live] + [live[0].window])
        frame_index = torch.tensor([len(s.frames) for s in live] + [0]) - 1
        params = SamplingTensors.from_params([GREEDY] * (len(live) + 1), "cpu")
        out = decode_frame(model, kv, fast, tokens, slots, positions, int(positions.max()) + 1, params, windows, frame_index)
        for j, s in enumerate(live):
            s.frames.append(out[j])
            s.pos += 1
    for i, s in enumerate(streams):
        assert torch.equal(torch.stack(s.frames, dim=1), alone[i]), f"stream {i} differs"
