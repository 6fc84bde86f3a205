"""Pseudo-speakers: distinct voices made from the one teacher voice, so that the model
learns to continue in the voice of its reference prompt (voice cloning).

Each speaker is a "tape" factor (FFmpeg's asetrate: pitch and formants both scaled by
`tape`, as when a recording is played faster), a speaking rate (Piper's length_scale, so
no time-stretching artefacts: the synthesis is made slower or faster and the tape shift
then brings it to `rate`) and a spectral tilt (shelf filters: brighter or darker). Speaker
0 is the teacher unchanged: the voice the model speaks when no reference is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np


@dataclass(frozen=True, slots=True)
class Speaker:
    name: str
    tape: float = 1.0  # pitch and formant factor (>1: higher, smaller-sounding)
    rate: float = 1.0  # speaking rate relative to the teacher (>1: faster)
    bass_db: float = 0.0  # low shelf at 300 Hz
    treble_db: float = 0.0  # high shelf at 3 kHz
    noise_w: float = 0.8  # Piper's duration noise (prosody variability)

    @property
    def length_scale(self) -> float:
        """Piper's length_scale that, after the tape shift, gives the speaking rate."""
        return self.tape / self.rate

    def filters(self, rate: int) -> list[tuple[str, str]]:
        chain: list[tuple[str, str]] = []
        if self.tape != 1.0:
            chain += [("asetrate", f"r={round(rate * self.tape)}"), ("aresample", f"{rate}")]
        if self.bass_db:
            chain.append(("lowshelf", f"g={self.bass_db}:f=300"))
        if self.treble_db:
            chain.append(("highshelf", f"g={self.treble_db}:f=3000"))
        return chain


# Six voices on a grid: three pitch/formant levels (tape 1.0, 1.14, 1.28: ~2.3 semitones
# apart) by two spectral tilts (neutral, or +-8 dB treble with -+4 dB bass), each with its
# own speaking rate. Lower tapes were tried and dropped: at tape 0.9 pocketsphinx's WER on
# the teacher doubles (0.25 -> 0.53; the teacher is already a low voice), while 1.28 costs
# little (0.30). Measured separability (training.evaluate's speaker space, 40 held-out
# sentences per speaker): 92% of single utterances nearest to their own speaker, 98% of
# those of 3 s or more, 100% of those of 5 s or more.
SPEAKERS: tuple[Speaker, ...] = (
    Speaker("teacher"),
    Speaker("dark", tape=1.0, rate=0.9, bass_db=4.0, treble_db=-8.0, noise_w=0.7),
    Speaker("mid", tape=1.14, rate=1.05),
    Speaker("mid-bright", tape=1.14, rate=0.95, bass_db=-4.0, treble_db=8.0, noise_w=0.9),
    Speaker("high", tape=1.28, rate=1.1),
    Speaker("high-dark", tape=1.28, rate=0.92, bass_db=4.0, treble_db=-8.0, noise_w=0.7),
)


def apply(x: np.ndarray, rate: int, speaker: Speaker) -> np.ndarray:
    """float32 mono [T] at `rate` -> the speaker's version at `rate` (PyAV filter graph)."""
    chain = speaker.filters(rate)
    if not chain or x.size == 0:
        return x.astype(np.float32, copy=False)
    import av

    graph = av.filter.Graph()
    node = graph.add_abuffer(format="flt", sample_rate=rate, layout="mono", time_base=Fraction(1, rate))
    for name, args in chain:
        nxt = graph.add(name, args)
        node.link_to(nxt)
        node = nxt
    # the sink fixes the output format: asetrate changes the rate label, aresample restores it
    sink = graph.add("aformat", f"sample_fmts=flt:sample_rates={rate}:channel_layouts=mono")
    node.link_to(sink)
    sink.link_to(graph.add("abuffersink"))
    graph.configure()
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x, dtype=np.float32)[None], format="flt", layout="mono")
    frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
    graph.push(frame)
    graph.push(None)
    out = []
    while True:
        try:
            out.append(graph.pull().to_ndarray()[0])
        except (av.error.BlockingIOError, av.error.EOFError):
            break
    y = np.concatenate(out) if out else np.zeros(0, np.float32)
    return np.clip(y, -1.0, 1.0).astype(np.float32, copy=False)
