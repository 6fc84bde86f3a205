"""GPU-only checks (skipped without CUDA): the CUDA-graph decode step gives exactly the
eager reference's frames, the decode loop never synchronizes the host, and the engine
with graphs gives each stream its single-stream frames."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import UPSTREAM
from engine.bundle import ModelBundle, load_bundle
from engine.checkpoint import load_checkpoint
from engine.engine import Engine, EngineConfig, StreamParams
from engine.prompt import PromptBuilder
from engine.runner import Runner
from engine.sampling import SamplingParams
from engine.voice import VoiceInput

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0, allow_end=False)


def s2_fixture(dtype: torch.dtype) -> ModelBundle:
    """The upstream S2 fixture checkpoint on the GPU in `dtype`, with the tiny codec."""
    model, tok = load_checkpoint(UPSTREAM / "s2", "cuda", dtype)
    codec = load_bundle("tiny", "cuda", torch.float32).codec
    return ModelBundle("s2-fixture", model, tok, codec, PromptBuilder(tok, model.config), 0.0)


@pytest.fixture(scope="module")
def bundle():
    return s2_fixture(torch.float32)


def run_streams(runner: Runner, bundle: ModelBundle, texts: list[str], steps: int) -> list[list[np.ndarray]]:
    """Prefill each text into its own slot, then decode all of them together."""
    frames = []
    slots = []
    for i, text in enumerate(texts):
        slot = 2 * i + 1  # not 0..n-1: slots are arbitrary rows
        first = runner.prefill_segment(slot, 0, bundle.prompts.full(None, text), GREEDY)
        frames.append([first])
        slots.append(slot)
    length = max(int(runner.state.positions[s]) for s in slots) + steps + 1
    pending = None
    for _ in range(steps):
        handle = runner.launch(slots, length)
        if pending is not None:
            for i, row in enumerate(runner.read(pending)):
                frames[i].append(row)
        pending = handle
    for i, row in enumerate(runner.read(pending)):
        frames[i].append(row)
    return frames


TEXTS = ["Hello there.", "A longer sentence, with a clause in it.", "Short!"]


def test_graphs_and_kernel_match_the_eager_reference(bundle):
    graphed_runner = Runner(bundle, 8, 512, cuda_graphs=True)
    # eager: the same kernels but PyTorch's attention and q/k/v writes
    plan = dataclasses.replace(graphed_runner.plan, attention=False, fused_qkv=False, pdl=False)
    eager = run_streams(Runner(bundle, 8, 512, plan, cuda_graphs=False), bundle, TEXTS, 24)
    graphed = run_streams(graphed_runner, bundle, TEXTS, 24)
    for a, b in zip(eager, graphed):
        assert np.array_equal(np.stack(a), np.stack(b))


def test_decode_loop_never_syncs_the_host(bundle):
    runner = Runner(bundle, 8, 512, cuda_graphs=True)
    slots = []
    for i, text in enumerate(TEXTS):
        runner.prefill_segment(i, 0, bundle.prompts.full(None, text), GREEDY)
        slots.append(i)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        handles = [runner.launch(slots, 400) for _ in range(3)]  # launching never waits
        for _ in range(20):
            handles.append(runner.launch(slots, 400))
            runner.read(handles.pop(0))  # waits on that step's event only
        runner.launch(slots[:2], 400)  # a membership change goes through the pinned staging buffer
    finally:
        torch.cuda.set_sync_debug_mode("default")


class _Sink:
    """An engine stream's sink that counts frames' worth of audio and turn ends."""

    def __init__(self) -> None:
        import threading

        self.ready, self.done = threading.Event(), threading.Event()
        self.samples, self.errors = 0, []

    def on_ready(self, voice_cached, prefill_ms):
        self.ready.set()

    def on_audio(self, turn, pcm):
        self.samples += len(pcm)

    def on_segment_end(self, turn, reason):
        self.done.set()

    def on_error(self, code, message):
        self.errors.append((code, message))
        self.done.set()


def test_the_engines_decode_loop_never_syncs_the_host(bundle):
    """The engine's real decode thread, not the runner alone: while every stream decodes,
    20 of its steps run under torch.cuda.set_sync_debug_mode("error"), which raises on a
    synchronizing CUDA call (an .item(), a pageable copy, a stream synchronize). The mode
    is process-wide, so the codec thread's calls in that window are checked too (they wait
    on events); the prefill thread is idle then. A raise fails the streams with `internal`."""
    import time

    engine = Engine(bundle, EngineConfig(max_running=4, max_queued=0, max_len=512, kv_cache_bytes=256 << 20)).start()
    original = engine.runner.launch
    checked = []

    def launch(slots, kv_len, updates=()):
        full = len(slots) == len(TEXTS)
        if full and not checked:  # every segment prefilled: from here the decode loop alone
            torch.cuda.set_sync_debug_mode("error")
        if full and len(checked) < 20:
            checked.append(len(slots))
            if len(checked) == 20:
                handle = original(slots, kv_len, updates)
                torch.cuda.set_sync_debug_mode("default")
                return handle
        return original(slots, kv_len, updates)

    engine.runner.launch = launch
    try:
        sinks = [_Sink() for _ in TEXTS]
        handles = [engine.open(VoiceInput(), StreamParams(GREEDY, frame_budget=64), s) for s in sinks]
        for s in sinks:
            assert s.ready.wait(60)
        for h, text in zip(handles, TEXTS):
            engine.say(h, 1, text)
        for s in sinks:
            assert s.done.wait(120)
        assert [s.errors for s in sinks] == [[], [], []]
        assert all(s.samples == 64 * bundle.codec.hop_length for s in sinks)
        assert len(checked) == 20
    finally:
        torch.cuda.set_sync_debug_mode("default")
        engine.stop()
        time.sleep(0.1)


def test_engine_with_graphs_batched_equals_alone(bundle):
    """Graphs, the blocked prefill attention and the step kernels: each stream gets the
    frames it gets alone in the same engine."""
    from test_engine import check_batched_equals_alone

    check_batched_equals_alone(bundle, alone_in_the_engine=True)


def test_the_prefills_second_frame_graph_is_the_decode_graphs_step(bundle):
    """The prefill stream's second-frame graph against the decode graph: the same frame,
    device state and KV (engine/prefill.py second_frames)."""
    from test_engine import check_second_frame_equals_decode_step

    check_second_frame_equals_decode_step(bundle)  # graphs and kernels: the runner's defaults on a GPU


def test_fp8_engine_with_graphs_batched_equals_alone():
    """--quant fp8 keeps the batching guarantee: the FP8 GEMMs' rows do not depend on the
    batch up to 16 rows (one K split per shape there: kernels/fp8_configs.py), so four
    streams decoding together, two joining mid-flight, get their single-stream frames."""
    from engine.quant import quantize_model_
    from test_engine import check_batched_equals_alone

    model, tok = load_checkpoint(UPSTREAM / "s2", "cuda", torch.float32)
    quantize_model_(model)
    codec = load_bundle("tiny", "cuda", torch.float32).codec
    check_batched_equals_alone(ModelBundle("s2-fixture-fp8", model, tok, codec, PromptBuilder(tok, model.config), 0.0))


def test_fp8_kv_engine_with_graphs_batched_equals_alone(bundle):
    """--kv-quant fp8 through the graphs, the fused q/k/v write and the decode-attention
    kernel: each stream still gets the frames it gets alone in the same engine."""
    from test_engine import check_batched_equals_alone

    check_batched_equals_alone(bundle, kv_quant="fp8")


class _Listener:
    """A codec-worker owner that keeps what it hears."""

    def __init__(self) -> None:
        self.pcm: list[np.ndarray] = []
        self.ended = __import__("threading").Event()

    def wanted(self, turn: int) -> bool:
        return True

    def audio(self, turn: int, pcm: np.ndarray) -> None:
        self.pcm.append(pcm)

    def segment_end(self, turn: int, reason: str) -> None:
        self.ended.set()


@pytest.mark.parametrize("max_chunk", [4, 8])
def test_codec_graphs_give_the_eager_audio(max_chunk):
    """The codec worker's CUDA graphs (one per batch bucket and chunk size) decode the same
    audio as its eager path, stream by stream, with streams of different lengths sharing
    calls (so chunks of max_chunk, ..., 2 and 1 frames and several buckets are used)."""
    codec = load_bundle("tiny", "cuda", torch.float32).codec
    # the graphs keep the conv kernels cuDNN picked by timing at warm-up; the eager calls
    # use the same ones here (cudnn.benchmark on for the whole test: cuDNN keeps each
    # shape's pick), so the two paths run the same arithmetic: with the eager path on
    # cuDNN's heuristics, this test failed on an H200 once the codec kernels' path ran its
    # convs time-major (NHWC), and passed with the same picks. TF32 is off: with it
    # allowed (PyTorch's default for cuDNN) picks differ by ~1e-3.
    tf32, benchmark = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = False, True
    try:
        _codec_graphs_give_the_eager_audio(codec, max_chunk)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = tf32, benchmark


LENGTHS = {0: 13, 2: 7, 3: 1}  # frames per slot: chunks of every size and several buckets


def _heard(codec, max_chunk: int, **worker_args) -> dict[int, np.ndarray]:
    """Each slot's PCM from one codec worker fed LENGTHS' frames, streams sharing calls."""
    from engine.codec_worker import CodecWorker

    rng = np.random.default_rng(0)
    frames = {s: rng.integers(0, 64, (n, codec.num_codebooks)) for s, n in LENGTHS.items()}
    worker = CodecWorker(codec, 4, hold_lead_s=None, max_chunk=max_chunk, **worker_args)
    worker.warm_up()
    assert bool(worker.codec_calls.graphs) == worker.codec_calls.cuda_graphs
    listeners = {s: _Listener() for s in frames}
    for s in frames:
        worker.reset(s)
    for t in range(max(LENGTHS.values())):
        for s, codes in frames.items():
            if t < len(codes):
                worker.frames([(listeners[s], s, 1, codes[t])])
    for s in frames:
        worker.end(listeners[s], s, 1, "end")
    worker.start()
    for listener in listeners.values():
        assert listener.ended.wait(60)
    worker.stop()
    return {s: np.concatenate(listeners[s].pcm) for s in frames}


def _assert_same_audio(a: dict, b: dict, hop: int) -> None:
    for s, n in LENGTHS.items():
        assert a[s].shape == b[s].shape == (n * hop,)
        # within 1e-3 (-60 dB of full scale): with TF32 off and cuDNN's picks shared, H200
        # runs still failed at 1e-4 now and then (2026-12-03: 39 of 14,336 samples, at most
        # 2.8e-4 off; the cause is not pinned down); a wrong state, chunk or stream order
        # is off by ~0.1
        np.testing.assert_allclose(a[s], b[s], atol=1e-3, rtol=1e-3)


def _codec_graphs_give_the_eager_audio(codec, max_chunk: int) -> None:
    eager = _heard(codec, max_chunk, cuda_graphs=False)
    _assert_same_audio(_heard(codec, max_chunk, cuda_graphs=True), eager, codec.hop_length)


@pytest.mark.parametrize("barge_in", [False, True])
def test_codec_graphs_hand_out_a_replys_held_back_audio(barge_in):
    """The default voice's held-back hops drained at a segment end (and dropped at a
    barge-in) through the worker's CUDA graphs: the drain clears the state the graphs
    read in place, so the next reply starts from silence there too."""
    from test_codec_worker import check_held_back_audio

    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # as above: graph and eager kernels differ under TF32
    try:
        check_held_back_audio(torch.device("cuda"), barge_in, tol=1e-4)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32

