"""Teacher clips for tests/test_default_codec.py: four plain sentences (never in
training: training/plain_sentences.txt, lines 13-16), two by the teacher (speaker 0),
two by pseudo-speaker 4, as Ogg Opus at 32 kbit/s (the data's own format) with a JSON
index. Needs the `train` extra (Piper teacher, espeak-ng).

    python training/recipe/make_codec_fixtures.py      # writes tests/fixtures/voice/plain-*.ogg, plain.json
"""

from __future__ import annotations

import json
from pathlib import Path

from training.corpus import plain_sentences
from training.opus_io import OggOpusWriter
from training.phonemes import Espeak, phoneme_ids
from training.speakers import SPEAKERS
from training.teacher import PiperVoice

OUT = Path(__file__).parents[2] / "tests/fixtures/voice"
PLAIN = [item["text"] for item in plain_sentences()]


def main() -> int:
    voice, espeak = PiperVoice(threads=2), Espeak()
    rows = []
    for i, (speaker, text) in enumerate(zip((0, 0, 4, 4), PLAIN[12:16])):
        y = voice.speak(phoneme_ids(espeak.phonemize(text), voice.id_map), SPEAKERS[speaker])
        name = f"plain-{i}.ogg"
        writer = OggOpusWriter(OUT / name, voice.sample_rate)
        writer.write(y)
        writer.close()
        rows.append({"speaker": speaker, "file": name, "text": text, "seconds": round(len(y) / voice.sample_rate, 2)})
    (OUT / "plain.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
