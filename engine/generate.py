"""Single-stream generation (eager, CPU or GPU): text + voice -> code frames -> audio,
streamed frame by frame. The batched scheduler serves many streams with the same model
calls; this path is the reference it is tested against, and what the CLI uses.

The context keeps growing turn by turn (voice prefix, then for each segment its user
turn, its generated codes and the turn's end), as upstream appends each generated
segment; when the next segment would not fit the KV length, the context restarts from
the voice prefix.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from engine.audio import load_reference
from engine.bundle import ModelBundle
from engine.codec.streaming import StreamingDecoder
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.kernel_plan import KernelPlan
from engine.kv_cache import FastCache, KVCache
from engine.prompt import Reference, Voice
from engine.quant import is_quantized
from engine.sampling import SamplingParams, SamplingTensors


@dataclass(slots=True)
class GenerateOptions:
    max_frames: int = 1024  # per segment; a segment that reaches it is cut there
    chunk_frames: int = 4  # frames per audio chunk handed out by `audio()`

    def __post_init__(self) -> None:
        if self.max_frames < 1 or self.chunk_frames < 1:
            raise ValueError("max_frames and chunk_frames must be positive")


class Synthesizer:
    def __init__(self, bundle: ModelBundle, max_len: int = 4096, plan: KernelPlan | None = None) -> None:
        """`plan` None: the PyTorch path, but FP8 weights through their GEMM on a GPU."""
        self.bundle = bundle
        self.plan = plan or KernelPlan(fp8=bundle.device.type == "cuda" and is_quantized(bundle.model))
        self.model = bundle.model
        self.config = bundle.config
        self.max_len = min(max_len, self.config.max_seq_len)
        self.kv = KVCache.allocate(self.config, 1, self.max_len, bundle.device, bundle.dtype)
        self.fast = FastCache.allocate(self.config, 1, bundle.device, bundle.dtype)
        self.decoder = StreamingDecoder(bundle.codec, 1)
        self._slot = torch.zeros(1, dtype=torch.long, device=bundle.device)
        # a cut segment's last frame + the turn's end tokens
        self._closing_room = 1 + bundle.prompts.segment_end().shape[1]

    # --- voices ------------------------------------------------------------------------

    @torch.inference_mode()
    def encode_reference(self, audio: bytes | str | Path, text: str, max_seconds: float = 60.0) -> Reference:
        codec = self.bundle.codec
        wav = load_reference(audio, codec.sample_rate, max_seconds=max_seconds)
        x = torch.from_numpy(wav).to(self.bundle.device, codec_dtype(codec))[None]
        codes = codec.encode(x)[0].cpu()  # [C, frames]
        return Reference(text=text, codes=codes)

    # --- generation --------------------------------------------------------------------

    def _prefill(self, tokens: Tensor, start: int) -> tuple[Tensor, Tensor]:
        if start + tokens.shape[1] > self.max_len:
            raise ValueError(f"prompt of {start + tokens.shape[1]} positions exceeds the KV length {self.max_len}")
        return self.model.prefill(tokens.to(self.bundle.device), 0, start, self.kv, self.plan)

    @torch.inference_mode()
    def frames(
        self,
        segments: Iterable[str],
        voice: Voice | None = None,
        params: SamplingParams | None = None,
        options: GenerateOptions | None = None,
    ) -> Iterator[Tensor]:
        """Yields the code frames ([C] int64, on the CPU) of every segment in order."""
        params, options = params or SamplingParams(), options or GenerateOptions()
        prompts, device = self.bundle.prompts, self.bundle.device
        sampling = SamplingTensors.from_params([params], device)
        prefix = prompts.voice_prefix(voice)
        self._prefill(prefix, 0)
        pos = prefix.shape[1]
        for text in segments:
            segment = prompts.segment(text)
            # a segment takes ~1.4 frames per character of text; restart the context from
            # the voice prefix when the next one would probably not fit
            expected_frames = min(options.max_frames, 2 * len(text) + 32)
            if pos + segment.shape[1] + expected_frames + self._closing_room > self.max_len:
                pos = prefix.shape[1]
            head, fast_in = self._prefill(segment, pos)
            pos += segment.shape[1]
            # room left for frames, keeping space for the turn's closing tokens
            budget = min(options.max_frames, self.max_len - pos - self._closing_room)
            if budget < 1:
                raise ValueError(f"segment of {segment.shape[1]} tokens leaves no room in the KV length {self.max_len}")
            window = new_window(1, self.config.sampling_window, self.config.num_codebooks, device)
            frame_index = torch.zeros(1, dtype=torch.long, device=device)
            frame = sample_frame(self.model, self.fast, head, fast_in, sampling, window, frame_index, self.plan)
            for n in range(budget):
                if int(frame[0, 0]) == self.config.im_end_id:
                    break
                yield frame[0, 1:].cpu()
                if n + 1 == budget:
                    break
                push_window(window, frame[:, 1:])
                frame_index += 1
                positions = torch.tensor([pos], device=device)
                frame = decode_frame(
                    self.model, self.kv, self.fast, frame, self._slot, positions, pos + 1, sampling, window, frame_index,
                    self.plan,
                )
                pos += 1
            closing = prompts.segment_end()
            if int(frame[0, 0]) != self.config.im_end_id:  # cut at the frame budget: keep its last frame
                closing = torch.cat([frame[0].cpu()[:, None], closing], dim=1)
            self._prefill(closing, pos)
            pos += closing.shape[1]

    @torch.inference_mode()
    def audio(
        self,
        segments: Iterable[str],
        voice: Voice | None = None,
        params: SamplingParams | None = None,
        options: GenerateOptions | None = None,
    ) -> Iterator[np.ndarray]:
        """Yields float32 audio chunks at the codec's sample rate as frames are produced."""
        options = options or GenerateOptions()
        self.decoder.reset(0)
        pending: list[Tensor] = []
        for frame in self.frames(segments, voice, params, options):
            pending.append(frame)
            if len(pending) == options.chunk_frames:
                yield self._decode(pending)
                pending = []
        if pending:
            yield self._decode(pending)

    def _decode(self, frames: list[Tensor]) -> np.ndarray:
        codes = torch.stack(frames, dim=1)[None].to(self.bundle.device)  # [1, C, n]
        return self.decoder.decode(self._slot, codes)[0].float().cpu().numpy()


def codec_dtype(codec: torch.nn.Module) -> torch.dtype:
    return next(codec.parameters()).dtype
