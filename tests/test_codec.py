"""The modded-DAC codec: parity with upstream on a recorded fixture, checkpoint loading and
its errors, streaming decode == whole decode, and the presets' shapes."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.flop_counter import FlopCounterMode

from engine.codec.config import CodecConfig, codec_preset
from engine.codec.loader import CodecLoadError, is_encode_only, load_codec
from engine.codec.model import Codec
from engine.codec.streaming import StreamingDecoder

FIXTURE = Path(__file__).parent / "fixtures" / "upstream" / "codec"
CHECKPOINT = FIXTURE / "codec.pth"


@pytest.fixture(scope="module")
def expected() -> dict[str, torch.Tensor]:
    return load_file(FIXTURE / "expected.safetensors")


@pytest.fixture(scope="module")
def upstream_codec() -> Codec:
    return load_codec(CHECKPOINT)


@pytest.fixture(scope="module")
def upstream_state() -> dict[str, torch.Tensor]:
    return torch.load(CHECKPOINT, weights_only=True)


def random_codec(config: CodecConfig, seed: int = 0) -> Codec:
    """Default init leaves biases ~0 and layer scales at 1e-2 / 1e-6, which would hide a
    double-added bias or a broken transformer; give them values that matter."""
    torch.manual_seed(seed)
    codec = Codec(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in codec.named_parameters():
            if name.endswith("gamma"):
                p.uniform_(0.1, 0.5, generator=gen)
            elif name.endswith("alpha"):
                p.uniform_(0.5, 1.5, generator=gen)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1, generator=gen)
    return codec


def relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y - ref).abs().max() / ref.abs().max()).item()


def save(tmp_path: Path, obj, name: str = "codec.pth") -> Path:
    """A checkpoint in its own folder, with the fixture's codec_config.json beside it."""
    shutil.copy(FIXTURE / "codec_config.json", tmp_path / "codec_config.json")
    torch.save(obj, tmp_path / name)
    return tmp_path / name


# -- parity with upstream ---------------------------------------------------------------


def test_decode_matches_upstream(upstream_codec, expected):
    audio = upstream_codec.decode(expected["decode_codes"])  # includes out-of-range codes
    assert audio.shape == expected["decoded"].shape
    assert relative_error(audio, expected["decoded"]) < 1e-4


def test_encode_matches_upstream(upstream_codec, expected):
    codes = upstream_codec.encode(expected["audio"])
    assert codes.dtype == torch.long
    assert torch.equal(codes, expected["codes"])


def test_streaming_decode_matches_upstream(upstream_codec, expected):
    codes, ref = expected["decode_codes"], expected["decoded"]
    stream = StreamingDecoder(upstream_codec, max_streams=2)
    chunks, t = [], 0
    for n in (1, 3, 7, 3):  # 14 frames; the window is 6
        chunks.append(stream.decode(torch.tensor([1, 0]), codes[:, :, t:t + n]))
        t += n
    assert relative_error(torch.cat(chunks, dim=-1), ref) < 1e-4


# -- loading ----------------------------------------------------------------------------


def test_fixture_covers_both_weight_norm_styles(upstream_state):
    keys = list(upstream_state)
    assert any(k.endswith(".weight_g") for k in keys)  # dac's WNConv1d (VQ projections)
    assert any(k.endswith(".parametrizations.weight.original0") for k in keys)  # causal convs


def test_training_checkpoint_layout_loads_the_same(tmp_path, upstream_state, upstream_codec, expected):
    wrapped = {f"generator.{k}": v for k, v in upstream_state.items()}
    wrapped["discriminator.conv.weight"] = torch.zeros(3)  # other sub-models are dropped
    # the release carries upstream's runtime buffers; they are rebuilt, not loaded
    wrapped["generator.quantizer.post_module.freqs_cis"] = torch.zeros(4, 2, 2)
    wrapped["generator.quantizer.post_module.causal_mask"] = torch.ones(4, 4, dtype=torch.bool)
    codec = load_codec(save(tmp_path, {"state_dict": wrapped}))
    codes = expected["decode_codes"]
    assert torch.equal(codec.decode(codes), upstream_codec.decode(codes))


def test_already_folded_weights_load(tmp_path, upstream_codec, expected):
    path = save(tmp_path, upstream_codec.state_dict())
    codec = load_codec(path)
    assert torch.equal(codec.encode(expected["audio"]), expected["codes"])


def test_legacy_torch_save_format_loads(tmp_path, upstream_state, upstream_codec, expected):
    path = tmp_path / "codec.pth"
    shutil.copy(FIXTURE / "codec_config.json", tmp_path / "codec_config.json")
    torch.save(upstream_state, path, _use_new_zipfile_serialization=False)  # cannot be mmapped
    codes = expected["decode_codes"]
    assert torch.equal(load_codec(path).decode(codes), upstream_codec.decode(codes))


def test_missing_key_is_named(tmp_path, upstream_state):
    state = dict(upstream_state)
    del state["decoder.model.0.conv.bias"]
    path = save(tmp_path, state)
    with pytest.raises(CodecLoadError) as err:
        load_codec(path)
    assert str(path) in str(err.value)
    assert "1 missing keys: decoder.model.0.conv.bias" in str(err.value)


def test_unexpected_key_is_named(tmp_path, upstream_state):
    state = dict(upstream_state)
    state["decoder.model.9.conv.bias"] = torch.zeros(2)
    path = save(tmp_path, state)
    with pytest.raises(CodecLoadError, match=r"1 unexpected keys: decoder\.model\.9\.conv\.bias") as err:
        load_codec(path)
    assert str(path) in str(err.value)


def test_shape_mismatch_is_named(tmp_path, upstream_state):
    state = dict(upstream_state)
    key = "quantizer.semantic_quantizer.quantizers.0.codebook.weight"
    state[key] = torch.zeros(99, 8)
    path = save(tmp_path, state)
    with pytest.raises(CodecLoadError) as err:
        load_codec(path)
    assert f"{key}: checkpoint (99, 8) vs model (128, 8)" in str(err.value)


def test_unpaired_weight_norm_is_an_error(tmp_path, upstream_state):
    state = dict(upstream_state)
    del state["decoder.model.0.conv.parametrizations.weight.original1"]
    with pytest.raises(CodecLoadError, match="decoder.model.0.conv"):
        load_codec(save(tmp_path, state))


@pytest.mark.parametrize("content", [b"not a checkpoint at all", b""])
def test_wrong_file_names_the_file(tmp_path, content):
    path = tmp_path / "codec.pth"
    path.write_bytes(content)
    with pytest.raises(CodecLoadError, match="not a readable torch checkpoint") as err:
        load_codec(path, config=codec_preset("tiny"))
    assert str(path) in str(err.value)


def test_not_a_state_dict(tmp_path):
    path = tmp_path / "codec.pth"
    torch.save([torch.zeros(2)], path)
    with pytest.raises(CodecLoadError, match="expected a state dict"):
        load_codec(path, config=codec_preset("tiny"))


def test_missing_file(tmp_path):
    with pytest.raises(CodecLoadError, match="no such codec checkpoint"):
        load_codec(tmp_path / "nope.pth")


def test_without_config_file_the_release_shape_is_expected(tmp_path, upstream_state):
    path = tmp_path / "codec.pth"
    torch.save(upstream_state, path)  # no codec_config.json beside it -> "fish" preset
    with pytest.raises(CodecLoadError, match=r"hop 2048, 10 codebooks, latent 1024"):
        load_codec(path)


def test_decoder_only_checkpoint(tmp_path, upstream_state, upstream_codec, expected):
    state = {k: v for k, v in upstream_state.items() if not is_encode_only(k)}
    path = save(tmp_path, state)
    with pytest.raises(CodecLoadError, match="decoder_only=True"):
        load_codec(path)
    codec = load_codec(path, decoder_only=True)
    codes = expected["decode_codes"]
    assert torch.equal(codec.decode(codes), upstream_codec.decode(codes))
    assert sum(p.numel() for p in codec.parameters()) < sum(
        p.numel() for p in upstream_codec.parameters())
    with pytest.raises(RuntimeError, match="decoder_only"):
        codec.encode(expected["audio"])
    # a full checkpoint loads decoder-only too: the encoder keys are simply not read
    full = load_codec(CHECKPOINT, decoder_only=True)
    assert torch.equal(full.decode(codes), upstream_codec.decode(codes))


def test_bf16_load(expected):
    codec = load_codec(CHECKPOINT, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in codec.parameters())
    audio = codec.decode(expected["decode_codes"]).float()
    ref = expected["decoded"]
    assert torch.corrcoef(torch.stack([audio.flatten(), ref.flatten()]))[0, 1] > 0.9


def test_release_shape_matches_upstream_names():
    """The "fish" preset expects exactly upstream's keys (weight norm folded)."""
    import json

    upstream = json.loads((FIXTURE / "fish_keys.json").read_text())
    folded = {}
    for key, shape in upstream.items():
        for stem_end in (".weight_g", ".parametrizations.weight.original0"):
            if key.endswith(stem_end):
                break
        else:
            key = key.replace(".parametrizations.weight.original1", ".weight").replace(
                ".weight_v", ".weight")
            folded[key] = tuple(shape)
    with torch.device("meta"):
        codec = Codec(codec_preset("fish"))
    ours = {k: tuple(v.shape) for k, v in codec.state_dict().items()}
    assert ours == folded
    assert 391e6 < sum(p.numel() for p in codec.parameters()) < 392e6


# -- streaming ----------------------------------------------------------------------------

WINDOW = 4  # a small post_module window so that "beyond the window" is cheap


@pytest.fixture(scope="module", params=["dac", "istft"])
def small_codec(request) -> Codec:
    """The tiny codec with each decoder kind: every streaming test runs on both."""
    return random_codec(codec_preset("tiny", quantizer_window=WINDOW, decoder_kind=request.param, decoder_layers=2))


def random_codes(codec: Codec, batch: int, frames: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, codec.num_codebooks, frames), generator=gen)


def stream_in_chunks(stream: StreamingDecoder, slot: int, codes: torch.Tensor, sizes) -> torch.Tensor:
    out, t = [], 0
    for n in sizes:
        out.append(stream.decode(torch.tensor([slot]), codes[:, :, t:t + n]))
        t += n
    assert t == codes.shape[-1]
    return torch.cat(out, dim=-1)


@pytest.mark.parametrize("sizes", [[1] * 15, [3, 7, 5], [15], [2, 1, 9, 3], [5, 5, 5]])
def test_streaming_equals_whole_decode(small_codec, sizes):
    codes = random_codes(small_codec, 1, sum(sizes), seed=1)  # 15 frames > 3 windows
    ref = small_codec.decode(codes)
    assert ref.std() > 1e-2  # the comparison below means something
    stream = StreamingDecoder(small_codec, max_streams=2)
    y = stream_in_chunks(stream, 1, codes, sizes)
    assert y.shape == ref.shape
    assert (y - ref).abs().max() < 1e-4


def test_batched_streams_with_different_histories(small_codec):
    codes = random_codes(small_codec, 3, 16, seed=2)
    ref = small_codec.decode(codes)
    hop = small_codec.hop_length
    stream = StreamingDecoder(small_codec, max_streams=5)
    slots = [4, 0, 2]  # stream i lives in slot slots[i]
    out = [[] for _ in slots]
    done = [0, 0, 0]

    def step(which: list[int], n: int) -> None:
        y = stream.decode(torch.tensor([slots[i] for i in which]),
                          torch.stack([codes[i, :, done[i]:done[i] + n] for i in which]))
        assert y.shape == (len(which), n * hop)
        for row, i in enumerate(which):
            out[i].append(y[row])
            done[i] += n

    step([0], 6)  # stream 0 runs ahead past the window
    step([1], 1)
    step([0, 1, 2], 3)  # three streams at positions 6, 1 and 0 in one call
    step([2, 0], 7)
    step([1, 2], 5)
    step([1], 6)
    step([2, 1], 1)  # slots given in another order
    assert done == [16, 16, 16]
    for i in range(3):
        assert (torch.cat(out[i]) - ref[i]).abs().max() < 1e-4


def test_reset_gives_a_fresh_stream(small_codec):
    first, second = random_codes(small_codec, 1, 9, seed=3), random_codes(small_codec, 1, 7, seed=4)
    stream = StreamingDecoder(small_codec, max_streams=1)
    stream_in_chunks(stream, 0, first, [4, 5])
    stream.reset(0)
    y = stream_in_chunks(stream, 0, second, [2, 5])
    assert (y - small_codec.decode(second)).abs().max() < 1e-4
    with pytest.raises(IndexError):
        stream.reset(1)


def test_each_frame_costs_one_frame_of_work(small_codec):
    """Same FLOPs and same state size for frame 1 and frame 30 of a stream: the past is
    summarised, never re-decoded."""
    codes = random_codes(small_codec, 1, 30, seed=5)
    stream = StreamingDecoder(small_codec, max_streams=2)
    state_bytes = stream.state_bytes()
    flops = []
    for t in range(30):
        with FlopCounterMode(display=False) as counter:
            y = stream.decode(torch.tensor([0]), codes[:, :, t:t + 1])
        assert y.shape == (1, small_codec.hop_length)
        flops.append(counter.get_total_flops())
    assert flops[0] > 0 and len(set(flops)) == 1
    assert stream.state_bytes() == state_bytes


def test_streaming_rejects_bad_shapes(small_codec):
    stream = StreamingDecoder(small_codec, max_streams=2)
    with pytest.raises(ValueError):
        stream.decode(torch.tensor([0]), torch.zeros(1, 3, 2, dtype=torch.long))
    with pytest.raises(ValueError):
        stream.decode(torch.tensor([0, 1]), torch.zeros(1, 4, 2, dtype=torch.long))


def test_streaming_decode_with_the_kernels_matches_without(small_codec):
    """kernels=True (every codec Triton kernel: Snake folded into the convs, conv state,
    attention over the rings, time-major activations; the interpreter on a CPU) against
    kernels=False (the PyTorch path): chunks of several sizes, a stream joining late, one
    reset midway, rings wrapped (a window of 4 frames); every call's audio the same."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    codec = small_codec.to(device)
    tf32 = torch.backends.cudnn.allow_tf32  # cuDNN's NHWC and NCHW algorithms differ under TF32
    torch.backends.cudnn.allow_tf32 = False
    try:
        plain, fused = StreamingDecoder(codec, 3, kernels=False), StreamingDecoder(codec, 3, kernels=True)
        gen = torch.Generator().manual_seed(1)
        for call in [([0, 1], 1), ([1, 0], 3), ([2], 2), ([0, 2, 1], 1), ("reset", 1), ([1, 2], 4)]:
            if call[0] == "reset":
                plain.reset(call[1]), fused.reset(call[1])
                continue
            slots, n = torch.tensor(call[0], device=device), call[1]
            codes = torch.randint(0, 256, (len(call[0]), codec.num_codebooks, n), generator=gen).to(device)
            want, got = plain.decode(slots, codes), fused.decode(slots, codes)
            assert got.shape == want.shape == (len(call[0]), n * codec.hop_length)
            assert relative_error(got, want) < 1e-5, call
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
        small_codec.to("cpu")
    assert StreamingDecoder(small_codec, 1).kernels is False  # None: the PyTorch path off a GPU


# -- presets and shapes -------------------------------------------------------------------


def test_istft_decoder_is_causal_and_loads_from_its_config(tmp_path):
    """The "istft" decoder: an output sample never depends on a later code frame (so the
    stream needs no look-ahead), and a codec.pth + codec_config.json of it loads and
    decodes the same."""
    from engine.codec.loader import CONFIG_FILE, load_codec

    config = codec_preset("tiny", decoder_kind="istft", decoder_layers=2, istft_window=4)
    codec = random_codec(config)
    codes = random_codes(codec, 1, 8, seed=7)
    changed = codes.clone()
    changed[:, :, 5:] = (changed[:, :, 5:] + 17) % 256  # frames 5.. differ
    a, b = codec.decode(codes), codec.decode(changed)
    hop = codec.hop_length
    assert torch.equal(a[:, : 5 * hop], b[:, : 5 * hop]) and not torch.allclose(a[:, 5 * hop:], b[:, 5 * hop:])
    torch.save(codec.state_dict(), tmp_path / "codec.pth")
    (tmp_path / CONFIG_FILE).write_text(config.to_json())
    loaded = load_codec(tmp_path / "codec.pth")
    assert loaded.config.decoder_kind == "istft"
    assert torch.allclose(loaded.decode(codes), a, atol=1e-6)
    with pytest.raises(ValueError, match="decoder_kind"):
        codec_preset("tiny", decoder_kind="vocos")


def lookahead_codec(window: int, lookahead: int) -> tuple[Codec, int]:
    """A random small "istft" codec with this head window and lookahead, and its lag in samples."""
    config = codec_preset("tiny", quantizer_window=WINDOW, decoder_kind="istft", decoder_layers=2,
                          istft_window=window, istft_lookahead=lookahead)
    codec = random_codec(config)
    return codec, lookahead * codec.decoder.head.hop


@pytest.mark.parametrize("window, lookahead", [(4, 3), (2, 1)])
def test_istft_lookahead_stream_lags_and_decode_is_aligned(window, lookahead):
    """CodecConfig.istft_lookahead = L: the offline decode is the stream's audio advanced
    by L head hops (ending on the overlap-add tail), so it lines up with the codes' audio;
    a stream gives the same samples L hops later, in chunks of any size, and is still
    causal: its audio up to a code frame's end never depends on a later frame."""
    codec, lag = lookahead_codec(window, lookahead)
    codes = random_codes(codec, 1, 9, seed=3)
    ref = codec.decode(codes)
    y = stream_in_chunks(StreamingDecoder(codec, max_streams=1), 0, codes, [2, 1, 6])
    assert y.shape == ref.shape and ref.std() > 1e-2
    assert (y[:, lag:] - ref[:, :-lag]).abs().max() < 1e-4
    changed = codes.clone()
    changed[:, :, 5:] = (changed[:, :, 5:] + 17) % 256
    z = stream_in_chunks(StreamingDecoder(codec, max_streams=1), 0, changed, [2, 1, 6])
    hop = codec.hop_length
    assert (y[:, : 5 * hop] - z[:, : 5 * hop]).abs().max() < 1e-6
    assert (y[:, 5 * hop:] - z[:, 5 * hop:]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="istft_lookahead"):
        codec_preset("tiny", decoder_kind="istft", istft_window=window, istft_lookahead=window)


@pytest.mark.parametrize("window, lookahead", [(4, 3), (2, 1)])
def test_drain_completes_a_segment_and_the_next_starts_from_silence(window, lookahead):
    """At a segment's end `drain` gives the L hops the stream still held back: the stream's
    audio plus them is the whole-sequence decode, whole, L hops later. The tail is then
    clear: a second drain is silence, and a decoder without lookahead holds nothing."""
    codec, lag = lookahead_codec(window, lookahead)
    codes = random_codes(codec, 1, 9, seed=5)
    ref = codec.decode(codes)
    stream = StreamingDecoder(codec, max_streams=2)
    assert stream.drain_samples == lag
    y = stream_in_chunks(stream, 1, codes, [4, 5])
    held = stream.drain(1)
    assert held.shape == (lag,) and held.abs().max() > 1e-3
    whole = torch.cat([y[0], held])
    assert (whole[lag:] - ref[0]).abs().max() < 1e-4
    assert stream.drain(1).abs().max() == 0 and stream.drain(0).abs().max() == 0
    with pytest.raises(IndexError):
        stream.drain(2)
    no_lookahead = StreamingDecoder(lookahead_codec(window, 0)[0], max_streams=1)
    assert no_lookahead.drain(0) is None and no_lookahead.drain_samples == 0


def test_stft_encoder_is_causal_and_loads_from_its_config(tmp_path):
    """The "stft" encoder: a latent frame never depends on later samples, encode gives one
    code frame per hop, and a codec.pth + codec_config.json of it encodes the same."""
    from engine.codec.loader import CONFIG_FILE, load_codec

    config = codec_preset("tiny", encoder_kind="stft", encoder_layers=2, stft_window=4)
    codec = random_codec(config)
    enc_hop = math.prod(config.encoder_rates)
    x = 0.1 * torch.randn(1, 1, 12 * enc_hop, generator=torch.Generator().manual_seed(3))
    later = x.clone()
    later[..., 7 * enc_hop:] += 0.2  # samples from hop 7 on differ
    with torch.no_grad():
        a, b = codec.encoder(x), codec.encoder(later)
    assert a.shape == (1, config.latent_dim, 12)
    assert torch.equal(a[..., :7], b[..., :7]) and not torch.allclose(a[..., 7:], b[..., 7:])
    audio = 0.1 * torch.randn(2, 3 * codec.hop_length)
    codes = codec.encode(audio)
    assert codes.shape == (2, codec.num_codebooks, 3)
    torch.save(codec.state_dict(), tmp_path / "codec.pth")
    (tmp_path / CONFIG_FILE).write_text(config.to_json())
    loaded = load_codec(tmp_path / "codec.pth")
    assert loaded.config.encoder_kind == "stft" and torch.equal(loaded.encode(audio), codes)
    with pytest.raises(ValueError, match="encoder_kind"):
        codec_preset("tiny", encoder_kind="mel")


def test_tiny_preset_round_trip_shapes():
    config = codec_preset("tiny")
    assert (config.sample_rate, config.hop_length, config.num_codebooks) == (44100, 2048, 4)
    codec = random_codec(config)
    assert (codec.sample_rate, codec.hop_length, codec.num_codebooks) == (44100, 2048, 4)
    for samples, frames in ((44100, 22), (2048, 1), (2049, 2), (1, 1)):
        audio = 0.1 * torch.randn(2, samples)
        codes = codec.encode(audio)
        assert codes.shape == (2, 4, frames) and codes.dtype == torch.long
        assert 0 <= codes.min() and codes.max() < 256
        decoded = codec.decode(codes)
        assert decoded.shape == (2, frames * 2048)
        assert decoded.abs().max() <= 1.0


def test_fish_preset_shape():
    config = codec_preset("fish")
    assert (config.hop_length, config.num_codebooks, config.frame_rate) == (2048, 10, 44100 / 2048)
    assert config.semantic_codebook_size == 4096 and config.codebook_size == 1024


def test_config_json_round_trip():
    config = codec_preset("tiny", quantizer_window=7)
    assert CodecConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="unknown codec config fields"):
        CodecConfig.from_json('{"sample_rate": 44100, "bogus": 1}')


@pytest.mark.parametrize("overrides", [
    {"decoder_rates": (8, 8, 4)},  # decode would not give hop_length samples per frame
    {"encoder_transformer_layers": (0, 0, 1)},
    {"sample_rate": 1000},
    {"codebook_size": 0},
    {"quantizer_head_dim": 7},
])
def test_invalid_config_is_rejected(overrides):
    with pytest.raises(ValueError, match="CodecConfig"):
        codec_preset("tiny", **overrides)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown codec preset"):
        codec_preset("huge")
