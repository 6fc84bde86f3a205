"""Builds tests/fixtures/upstream/{s1,s2}: small random DualAR checkpoints in the two
public layouts, plus what the upstream fish-speech code computes on them.

This script runs upstream's own modules (it contains none of their code) in a
throwaway environment that can import them, e.g.:

    git -C fish-speech archive 3dd1f85 fish_speech | tar -x -C /tmp/fs       # S2-era code
    git -C fish-speech archive 80db25e fish_speech | tar -x -C /tmp/fs_s1    # S1-era tokenizer/prompt
    PYTHONPATH=/tmp/stubs:/tmp/fs python scripts/upstream_parity/make_model_fixture.py --s1-src /tmp/fs_s1

(/tmp/stubs holds an import-only `torchaudio` stub; the model never calls it.)

Per layout it writes the checkpoint folder (config.json, weights, tokenizer files) and
`expected.pt`: the prompt upstream builds for a reference voice + text, the logits of
upstream's `forward_generate` over that prompt (fp32, all positions, whole vocabulary),
and the frames of upstream's `generate` loop with top_k=1 (greedy).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from engine.tokenizer import _byte_level_chars  # noqa: E402  (stdlib-only module)

OUT = ROOT / "tests" / "fixtures" / "upstream"
CODEBOOK, NUM_CODEBOOKS = 64, 4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|text|>", "<|voice|>", "<|interleave|>"]
SPEAKERS = [f"<|speaker:{i}|>" for i in range(4)]
SEMANTIC = [f"<|semantic:{i}|>" for i in range(CODEBOOK)]
VOCAB = 256 + len(SPECIALS) + len(SPEAKERS) + len(SEMANTIC)
SEMANTIC_BEGIN = 256 + len(SPECIALS) + len(SPEAKERS)
TEXT = "Hello world, 42 times! Ça va? 你好。"
REFERENCES = [("The quick brown fox.", 7), ("Numbers like 3.14 stay.", 5)]
GREEDY_FRAMES = 12


def reference_codes(seed: int, frames: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEBOOK, (NUM_CODEBOOKS, frames), generator=g)


# --- tokenizers -----------------------------------------------------------------------

def write_hf_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    chars = _byte_level_chars()  # byte b -> GPT-2 printable char, ranked at id b
    tok = Tokenizer(models.BPE(vocab={c: b for b, c in chars.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS + SPEAKERS + SEMANTIC)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


def write_tiktoken(folder: Path) -> None:
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    (folder / "tokenizer.tiktoken").write_text("\n".join(lines) + "\n")
    special = {t: 256 + i for i, t in enumerate(SPECIALS + SPEAKERS + SEMANTIC)}
    (folder / "special_tokens.json").write_text(json.dumps(special, indent=1))


# --- configs --------------------------------------------------------------------------

def s2_config() -> dict:
    return {
        "model_type": "fish_qwen3_omni",
        "semantic_start_token_id": SEMANTIC_BEGIN,
        "semantic_end_token_id": SEMANTIC_BEGIN + CODEBOOK - 1,
        "text_config": {
            "vocab_size": VOCAB, "n_layer": 2, "n_head": 4, "n_local_heads": 2, "head_dim": 16,
            "dim": 64, "intermediate_size": 160, "rope_base": 10000, "norm_eps": 1e-6,
            "max_seq_len": 512, "tie_word_embeddings": True, "attention_qk_norm": True,
        },
        "audio_decoder_config": {
            "vocab_size": CODEBOOK, "num_codebooks": NUM_CODEBOOKS, "n_layer": 2, "dim": 48,
            "n_head": 4, "n_local_heads": 2, "head_dim": 12, "intermediate_size": 96,
            "attention_qk_norm": False,
        },
    }


def s1_config() -> dict:
    return {
        "model_type": "dual_ar", "vocab_size": VOCAB, "n_layer": 2, "n_head": 4, "n_local_heads": 4,
        "head_dim": 16, "dim": 64, "intermediate_size": 176, "rope_base": 10000, "norm_eps": 1e-5,
        "max_seq_len": 512, "tie_word_embeddings": False, "attention_qkv_bias": True,
        "codebook_size": CODEBOOK, "num_codebooks": NUM_CODEBOOKS, "n_fast_layer": 1,
    }


# --- upstream model -------------------------------------------------------------------

def randomize(model: torch.nn.Module, seed: int) -> None:
    # Larger than upstream's 0.02 init so that logits are well separated and greedy
    # choices are not decided by rounding; norm scales near 1 so their use is visible.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def s2_key(key: str) -> str:
    if key.startswith("fast_"):
        return "audio_decoder." + key[len("fast_"):]
    if key.startswith("codebook_embeddings."):
        return "audio_decoder." + key
    return "text_model.model." + key


class _TokenIds:
    """What upstream's generate() asks of model.tokenizer."""

    def __init__(self, im_end: int) -> None:
        self.im_end = im_end

    def get_token_id(self, token: str) -> int:
        assert token == "<|im_end|>"
        return self.im_end


def upstream_outputs(model, prompt: torch.Tensor) -> dict:
    from fish_speech.models.text2semantic.inference import generate
    from fish_speech.models.text2semantic.llama import BaseTransformer

    im_end = 256 + SPECIALS.index("<|im_end|>")
    model.tokenizer = _TokenIds(im_end)
    model.eval()
    with torch.inference_mode():
        model.setup_caches(max_batch_size=1, max_seq_len=model.config.max_seq_len, dtype=torch.float32)
        # the slow model's own forward_generate (the DualAR override drops return_all)
        out = BaseTransformer.forward_generate(model, prompt[None], torch.arange(prompt.shape[1]), return_all=True)
        logits = out.logits[0].clone()
        model._cache_setup_done = True
        seq = generate(
            model=model, prompt=prompt, max_new_tokens=GREEDY_FRAMES, audio_masks=None, audio_parts=None,
            temperature=0.7, top_p=0.7, top_k=1,
        )
    return {"logits": logits, "greedy": seq[:, prompt.shape[1]:].clone()}


def build(layout: str, s1_src: str) -> None:
    from fish_speech.models.text2semantic.llama import BaseModelArgs, DualARTransformer

    folder = OUT / layout
    folder.mkdir(parents=True, exist_ok=True)
    config = s2_config() if layout == "s2" else s1_config()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if layout == "s2":
        write_hf_tokenizer(folder)
    else:
        write_tiktoken(folder)

    args = BaseModelArgs.from_pretrained(str(folder))
    args.semantic_begin_id, args.semantic_end_id = SEMANTIC_BEGIN, SEMANTIC_BEGIN + CODEBOOK - 1
    torch.manual_seed(0)
    model = DualARTransformer(args)
    randomize(model, seed=1 if layout == "s2" else 2)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if layout == "s2":
        from safetensors.torch import save_file

        save_file({s2_key(k): v for k, v in state.items()}, str(folder / "model.safetensors"))
        # reload through upstream's own loader, so the fixture is proven upstream-readable
        model = DualARTransformer.from_pretrained(str(folder), load_weights=True)
    else:
        torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()}}, folder / "model.pth")
        model = DualARTransformer.from_pretrained(str(folder), load_weights=True)
        model.config.semantic_begin_id, model.config.semantic_end_id = args.semantic_begin_id, args.semantic_end_id
    model = model.float()

    prompt = build_prompt(layout, folder, s1_src)
    expected = {"prompt": prompt, **upstream_outputs(model, prompt)}
    expected["references"] = [(t, reference_codes(s, n)) for (t, n), s in zip(REFERENCES, (11, 12))]
    expected["text"] = TEXT
    torch.save(expected, folder / "expected.pt")
    print(f"{layout}: prompt {list(prompt.shape)}, greedy frames {expected['greedy'].shape[1]}")


def build_prompt(layout: str, folder: Path, s1_src: str) -> torch.Tensor:
    if layout == "s1":  # the S1-era package shares the name fish_speech: run it apart
        env = dict(os.environ, PYTHONPATH=f"/tmp/stubs:{s1_src}")
        subprocess.run([sys.executable, __file__, "--s1-prompt", str(folder)], check=True, env=env)
        return torch.load(folder / "_prompt.pt")
    from fish_speech.content_sequence import TextPart, VQPart
    from fish_speech.conversation import Conversation, Message
    from fish_speech.tokenizer import FishTokenizer

    tok = FishTokenizer.from_pretrained(str(folder))
    refs = [(t, reference_codes(s, n)) for (t, n), s in zip(REFERENCES, (11, 12))]
    tagged = "\n".join(f"<|speaker:{i}|>{t}" for i, (t, _) in enumerate(refs))
    conv = Conversation()
    conv.append(Message(role="system", parts=[
        TextPart(text="convert the provided text to speech reference to the following:\n\nText:\n"),
        TextPart(text=tagged), TextPart(text="\n\nSpeech:\n"),
        VQPart(codes=torch.cat([c for _, c in refs], dim=1)),
    ], add_im_start=True, add_im_end=True))
    conv.append(Message(role="user", parts=[TextPart(text=TEXT)], add_im_start=True, add_im_end=True))
    conv.append(Message(role="assistant", parts=[], modality="voice", add_im_start=True, add_im_end=False))
    values, _, _ = conv.encode_for_inference(tok, num_codebooks=NUM_CODEBOOKS)
    return values


def s1_prompt(folder: Path) -> None:
    from fish_speech.content_sequence import ContentSequence, TextPart, VQPart
    from fish_speech.tokenizer import FishTokenizer

    tok = FishTokenizer.from_pretrained(str(folder))
    seq = ContentSequence(modality="interleave")
    for (t, n), s in zip(REFERENCES, (11, 12)):
        seq.append([TextPart(text=t), VQPart(codes=reference_codes(s, n))], add_end=True, speaker=0)
    seq.append([TextPart(text=TEXT)], add_end=False, speaker=0)
    values, _, _ = seq.encode_for_inference(tok, num_codebooks=NUM_CODEBOOKS)
    torch.save(values, folder / "_prompt.pt")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--s1-src", default="/tmp/fs_s1")
    p.add_argument("--s1-prompt", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.s1_prompt:
        s1_prompt(Path(args.s1_prompt))
        return
    for layout in ("s2", "s1"):
        build(layout, args.s1_src)
    (OUT / "s1" / "_prompt.pt").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
