"""What every request handler needs: the engine, the config, metrics, stored voices,
and the mapping of a Fish `TTSRequest` onto engine settings."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from engine.engine import Engine, StreamParams
from engine.sampling import SamplingParams
from engine.voice import ReferenceInput, VoiceInput
from realtime import protocol as P
from realtime.config import ServiceConfig
from realtime.mailbox import LoopMailbox
from realtime.metrics import Metrics
from realtime.voices import VoiceStore


@dataclass
class Services:
    config: ServiceConfig
    engine: Engine
    metrics: Metrics
    voices: VoiceStore
    _mailbox: LoopMailbox | None = field(default=None, init=False, repr=False)

    def mailbox(self) -> LoopMailbox:
        """The running loop's mailbox for engine events (one per loop, shared by sessions)."""
        loop = asyncio.get_running_loop()
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._mailbox = LoopMailbox(loop)
        return self._mailbox

    def resolve_voice(self, req: P.TTSRequest) -> VoiceInput:
        if req.reference_id:
            stored = self.voices.get(req.reference_id)
            if stored is not None:
                return stored.as_input()
            if self.config.unknown_voice == "error":
                raise P.ProtocolError(P.ErrorCode.UNKNOWN_VOICE, f"no stored voice with id {req.reference_id!r}")
            self.voices.warn_unknown(req.reference_id)  # --unknown-voice default: e.g. a hosted library id
        return VoiceInput(tuple(ReferenceInput(r.text, audio=r.audio) for r in req.references))

    def stream_params(self, req: P.TTSRequest) -> StreamParams:
        """Fish request fields -> engine settings. The S2 models use repetition-aware
        resampling instead of a repetition penalty (upstream S2 behaviour); S1 models
        use the penalty. top_p 0 means greedy, as upstream's sampler then keeps one token."""
        s2 = self.engine.bundle.config.prompt_format == "s2"
        greedy = req.temperature == 0.0 or req.top_p == 0.0
        sampling = SamplingParams(
            temperature=0.0 if greedy else req.temperature,
            top_p=req.top_p if req.top_p > 0 else 1.0,
            top_k=req.top_k,
            repetition_penalty=1.0 if s2 else req.repetition_penalty,
            ras=s2,
            seed=req.seed if req.seed is not None else random.randrange(2**31),
            allow_end=not (req.ignore_end or self.config.engine.bench.ignore_end),
        )
        return StreamParams(sampling, frame_budget=req.max_new_tokens, condition_on_previous=req.condition_on_previous_chunks)
