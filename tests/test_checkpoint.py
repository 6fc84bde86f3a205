"""Loading both public checkpoint layouts in every file form, parity with upstream
fish-speech on them, and the errors a wrong checkpoint gets."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import UPSTREAM
from engine.checkpoint import CheckpointError, load_checkpoint, read_state_dict
from engine.frame import decode_frame, new_window, push_window, sample_frame
from engine.kv_cache import FastCache, KVCache
from engine.prompt import PromptBuilder, Reference, Voice
from engine.sampling import SamplingParams, SamplingTensors

LAYOUTS = ["s1", "s2"]


def expected(layout):
    return torch.load(UPSTREAM / layout / "expected.pt")


def greedy_frames(model, prompt, n):
    c = model.config
    kv = KVCache.allocate(c, 1, c.max_seq_len, "cpu", torch.float32)
    fast = FastCache.allocate(c, 1, "cpu", torch.float32)
    params = SamplingTensors.from_params([SamplingParams(temperature=0.0)], "cpu")
    window = new_window(1, c.sampling_window, c.num_codebooks, "cpu")
    frame_index = torch.zeros(1, dtype=torch.long)
    head, fast_in = model.prefill(prompt, 0, 0, kv)
    frame = sample_frame(model, fast, head, fast_in, params, window, frame_index)
    frames, pos = [frame[0]], prompt.shape[1]
    while len(frames) < n and int(frame[0, 0]) != c.im_end_id:
        push_window(window, frame[:, 1:])
        frame = decode_frame(model, kv, fast, frame, torch.tensor([0]), torch.tensor([pos]), pos + 1, params, window, frame_index)
        frames.append(frame[0])
        pos += 1
    return torch.stack(frames, dim=1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_prompt_matches_upstream(layout):
    model, tok = load_checkpoint(UPSTREAM / layout, "cpu", torch.float32)
    exp = expected(layout)
    voice = Voice([Reference(text, codes) for text, codes in exp["references"]])
    prompt = PromptBuilder(tok, model.config).full(voice, exp["text"])
    assert torch.equal(prompt, exp["prompt"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_match_upstream(layout):
    model, _ = load_checkpoint(UPSTREAM / layout, "cpu", torch.float32)
    exp = expected(layout)
    logits = model.full_logits(exp["prompt"])
    rel = (logits - exp["logits"]).norm() / exp["logits"].norm()
    assert rel < 1e-4, f"relative logit error {rel:.2e}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sampling_head_is_the_semantic_rows_of_the_full_logits(layout):
    model, _ = load_checkpoint(UPSTREAM / layout, "cpu", torch.float32)
    c, prompt = model.config, expected(layout)["prompt"]
    kv = KVCache.allocate(c, 1, c.max_seq_len, "cpu", torch.float32)
    head, _ = model.prefill(prompt, 0, 0, kv)
    full = model.full_logits(prompt)[-1]
    rows = torch.cat([full[c.semantic_begin_id : c.semantic_end_id + 1], full[c.im_end_id : c.im_end_id + 1]])
    torch.testing.assert_close(head[0], rows, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_frames_match_upstream(layout):
    model, _ = load_checkpoint(UPSTREAM / layout, "cpu", torch.float32)
    exp = expected(layout)
    frames = greedy_frames(model, exp["prompt"], exp["greedy"].shape[1])
    assert torch.equal(frames, exp["greedy"])


# --- every file form -------------------------------------------------------------------

def s2_state():
    return load_file(str(UPSTREAM / "s2" / "model.safetensors"))


def copy_folder(layout, tmp_path, weights=True):
    dst = tmp_path / layout
    shutil.copytree(UPSTREAM / layout, dst)
    (dst / "expected.pt").unlink()
    if not weights:
        for name in ("model.safetensors", "model.pth"):
            (dst / name).unlink(missing_ok=True)
    return dst


def assert_same_logits(folder, layout):
    model, _ = load_checkpoint(folder, "cpu", torch.float32)
    exp = expected(layout)
    torch.testing.assert_close(model.full_logits(exp["prompt"]), exp["logits"], rtol=1e-4, atol=1e-4)


def test_sharded_safetensors_with_index(tmp_path):
    folder = copy_folder("s2", tmp_path, weights=False)
    state = s2_state()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for name, part in shards.items():
        save_file({k: state[k] for k in part}, str(folder / name))
        weight_map.update({k: name for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert_same_logits(folder, "s2")


@pytest.mark.parametrize("form", ["plain", "state_dict", "prefixed"])
def test_model_pth_forms(tmp_path, form):
    folder = copy_folder("s1", tmp_path, weights=False)
    state = {k[len("model."):]: v for k, v in torch.load(UPSTREAM / "s1" / "model.pth")["state_dict"].items()}
    if form == "prefixed":
        state = {f"model.{k}": v for k, v in state.items()}
    torch.save({"state_dict": state} if form == "state_dict" else state, folder / "model.pth")
    assert_same_logits(folder, "s1")


def test_separate_qkv_weights_are_fused(tmp_path):
    folder = copy_folder("s2", tmp_path, weights=False)
    state = {}
    for key, value in s2_state().items():
        if key.endswith("attention.wqkv.weight"):
            cfg = json.loads((folder / "config.json").read_text())
            sub = cfg["audio_decoder_config"] if key.startswith("audio_decoder.") else cfg["text_config"]
            hd = sub["head_dim"]
            q, kv = sub["n_head"] * hd, sub["n_local_heads"] * hd
            wq, wk, wv = value.split([q, kv, kv])
            base = key[: -len("wqkv.weight")]
            state.update({base + "wq.weight": wq, base + "wk.weight": wk, base + "wv.weight": wv})
        else:
            state[key] = value
    save_file(state, str(folder / "model.safetensors"))
    assert_same_logits(folder, "s2")


def test_weights_load_in_place_without_a_second_copy(tmp_path):
    """Tensors read from the file are assigned to the meta-built model, not copied."""
    from engine.checkpoint import assemble, read_config, with_tokenizer_ids
    from engine.tokenizer import TextTokenizer

    folder = UPSTREAM / "s2"
    config = with_tokenizer_ids(read_config(folder), TextTokenizer.from_folder(folder))
    state, source = read_state_dict(folder, "cpu", torch.float32)
    pointers = {k: v.data_ptr() for k, v in state.items()}
    model = assemble(config, state, source)
    for name, p in model.state_dict().items():
        assert p.device.type == "cpu"
        assert p.data_ptr() == pointers[name], name


# --- errors -----------------------------------------------------------------------------

def broken_s2(tmp_path, edit):
    folder = copy_folder("s2", tmp_path, weights=False)
    state = s2_state()
    edit(state)
    save_file(state, str(folder / "model.safetensors"))
    return folder


def test_missing_key_is_named(tmp_path):
    folder = broken_s2(tmp_path, lambda s: s.pop("text_model.model.layers.1.feed_forward.w2.weight"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing keys: layers\.1\.feed_forward\.w2\.weight"):
        load_checkpoint(folder)


def test_unexpected_key_is_named(tmp_path):
    folder = broken_s2(tmp_path, lambda s: s.update({"text_model.model.layers.9.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unexpected keys: layers\.9\.extra\.weight"):
        load_checkpoint(folder)


def test_shape_mismatch_is_named(tmp_path):
    def shrink(s):
        s["audio_decoder.output.weight"] = s["audio_decoder.output.weight"][:-1]

    folder = broken_s2(tmp_path, shrink)
    with pytest.raises(CheckpointError, match=r"shape mismatches: fast_output\.weight: checkpoint \[63, 48\] vs model \[64, 48\]"):
        load_checkpoint(folder)


def test_missing_config_weights_and_corrupt_files(tmp_path):
    folder = copy_folder("s2", tmp_path, weights=False)
    with pytest.raises(CheckpointError, match="no model.safetensors.index.json, model.safetensors or model.pth"):
        load_checkpoint(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read safetensors"):
        load_checkpoint(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        load_checkpoint(folder)


def test_unknown_model_type(tmp_path):
    folder = copy_folder("s1", tmp_path)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="unsupported model_type 'llama'"):
        load_checkpoint(folder)


def test_index_naming_a_missing_shard(tmp_path):
    folder = copy_folder("s2", tmp_path, weights=False)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "gone.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"shards listed but missing: \['gone\.safetensors'\]"):
        load_checkpoint(folder)
