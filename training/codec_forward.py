"""The codec's training forward: the engine's `Codec` modules, run with straight-through
vector quantization, commitment/codebook losses, quantizer dropout and dead-code restarts.

Inference (`Codec.encode`) picks each code by cosine distance between the L2-normalised
projected latent and the normalised codebook, and decodes the raw codebook row; training
does the same choice, so the exported codec encodes exactly as it was trained. The
straight-through estimator passes the decoder's gradient to the encoder; the codebook
moves by its own loss (DAC's recipe: commitment 0.25, codebook 1.0).

Convolutions train under weight normalization (as DAC and the released codec do);
`fold_weight_norm_` turns them back into plain weights, the layout the loader reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrizations, parametrize

from engine.codec.model import Codec, SpectralDecoder
from engine.codec.quantizer import VectorQuantizer
from training.phone_targets import BLANK


@dataclass
class VQOut:
    codes: Tensor  # [B, 1 + N, frames]
    commitment: Tensor
    codebook: Tensor
    entropy: Tensor  # usage loss: per-latent entropy minus batch entropy of soft assignments
    spread: Tensor  # squared norm of the mean normalized latent (0: directions spread evenly)
    # the "istft" head's log-magnitude [B, frames, bins] (None for other decoders)
    head_log_magnitude: Tensor | None = None
    head_phase: Tensor | None = None  # and its phase [B, frames, bins]


ENTROPY_TEMPERATURE = 0.05  # on cosine similarities in [-1, 1]


def add_weight_norm_(codec: Codec) -> Codec:
    for m in codec.modules():
        if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)) and not parametrize.is_parametrized(m):
            parametrizations.weight_norm(m, name="weight", dim=0)
    return codec


def fold_weight_norm_(codec: Codec) -> Codec:
    for m in codec.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
    return codec


def use_fused_snake_(codec: Codec) -> Codec:
    """Every Snake1d of the codec computes itself and its gradient with
    training/snake_train.py (one pass each way, instead of ~15 PyTorch passes; Triton, so a
    GPU or the interpreter). Training only: the parameters and their names are unchanged,
    so checkpoints and exports do not see it."""
    from engine.codec.layers import Snake1d
    from training.snake_train import snake_train

    for m in codec.modules():
        if isinstance(m, Snake1d):
            m.forward = lambda x, m=m: snake_train(x, m.alpha.view(-1))
    return codec


def codec_vqs(codec: Codec) -> list[VectorQuantizer]:
    """Every quantizer of the codec: the semantic one first, then the residual ones."""
    q = codec.quantizer
    return [*q.semantic_quantizer.quantizers, *q.quantizer.quantizers]


@torch.no_grad()
def normalize_codebooks_(codec: Codec) -> Codec:
    """Every codebook row at unit length: a codec trained with unit codes
    (CodecTrainer.unit_codes) decodes normalized rows, and the inference quantizer
    (engine/codec/quantizer.py) looks its rows up as they are stored."""
    for vq in codec_vqs(codec):
        vq.codebook.weight.copy_(F.normalize(vq.codebook.weight.float()).to(vq.codebook.weight.dtype))
    return codec


def init_codec_(codec: Codec, seed: int = 0) -> Codec:
    """Weights for training from scratch: PyTorch's defaults for the convolutions (with the
    VQ input projections' biases zeroed: at init a bias dominates the projected latent's
    direction and every frame picks the same code), N(0, 0.02) for the transformers'
    linears; the codebooks are seeded from data at the first step (CodecTrainer)."""
    gen = torch.Generator().manual_seed(seed)
    for vq in codec_vqs(codec):
        if vq.in_proj is not None:
            nn.init.zeros_(vq.in_proj.bias)
    for m in codec.modules():
        if isinstance(m, nn.Linear):
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * 0.02)
                if m.bias is not None:
                    m.bias.zero_()
        elif isinstance(m, nn.Embedding):
            with torch.no_grad():
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen))
    return codec


def _usage_entropy(enc: Tensor, book: Tensor) -> Tensor:
    """Entropy loss against codebook collapse (as MAGVIT-v2's): soft assignments of the
    normalized latents to the normalized codebook should each be sharp (low per-latent
    entropy) and together cover the codebook (high entropy of their mean)."""
    p = torch.softmax(enc @ book.t() / ENTROPY_TEMPERATURE, dim=-1)  # [N, K]
    per_latent = -(p * torch.log(p.clamp(min=1e-8))).sum(-1).mean()
    mean = p.mean(0)
    return per_latent + (mean * torch.log(mean.clamp(min=1e-8))).sum()


def _quantize(vq: VectorQuantizer, z: Tensor, unit: bool = False) -> tuple[Tensor, ...]:
    """z: [B, D, T] -> (codes [B, T], quantized [B, D, T], commitment, codebook loss,
    usage entropy loss, spread loss, z_e [B*T, d]). `unit`: the latent and the codebook
    rows are taken at unit length in the losses and the straight-through path too, not
    only in the search (CodecTrainConfig.unit_codes)."""
    z_e = vq.in_proj(z).float()  # [B, d, T]
    B, d, T = z_e.shape
    flat = z_e.mT.reshape(B * T, d)
    enc, book = F.normalize(flat), F.normalize(vq.codebook.weight.float())
    entropy = _usage_entropy(enc, book)
    # the codes are chosen by direction only: a latent component common to all frames
    # (large at init) puts every frame in one narrow cone, i.e. on the same few codes
    spread = enc.mean(0).pow(2).sum()
    with torch.no_grad():
        dist = enc.pow(2).sum(1, keepdim=True) - 2 * enc @ book.t() + book.pow(2).sum(1)[None]
        codes = (-dist).max(1).indices
    if unit:
        # a latent's length does not choose its code, so in the raw form below nothing but
        # the commitment term holds it, and the decoder's straight-through gradient makes
        # it drift (2026-12-02: commitment 2 -> 150 and the gradient norm 15 -> 220 over
        # steps 2,000-3,000 in every arm, the mel rising): on the unit sphere it cannot
        z_e = enc.view(B, T, d).mT
        z_q = book[codes].view(B, T, d).mT
    else:
        z_q = vq.codebook(codes).float().view(B, T, d).mT
    commitment = F.mse_loss(z_e, z_q.detach())
    codebook = F.mse_loss(z_q, z_e.detach())
    z_st = z_e + (z_q - z_e).detach()
    return codes.view(B, T), vq.out_proj(z_st.to(z.dtype)), commitment, codebook, entropy, spread, flat.detach()


class CodecTrainer(nn.Module):
    """Wraps a `Codec` for training: forward(audio) -> (reconstruction, VQOut)."""

    def __init__(self, codec: Codec, quantizer_dropout: float = 0.5, restart_every: int = 50,
                 unit_codes: bool = False) -> None:
        super().__init__()
        self.codec = codec
        # codes at unit length (_quantize); the export then stores the rows normalized
        # (normalize_codebooks_), which is what the codec was trained to decode
        self.unit_codes = unit_codes
        self.quantizer_dropout = quantizer_dropout
        self.restart_every = restart_every
        vqs = self.vqs()
        # codes used since the last restart check, per codebook (not part of the codec)
        self.register_buffer("usage", torch.zeros(len(vqs), max(v.codebook_size for v in vqs)),
                             persistent=False)
        self._latents: list[Tensor | None] = [None] * len(vqs)
        self.steps = 0

    def add_phone_head(self, classes: int) -> None:
        """A linear CTC head over the quantized semantic latent (phone_targets.py says why).
        Training only: the exported codec is `self.codec`, without it, and checkpoints hold
        the codec alone (a resumed run starts the head afresh; it is one linear layer)."""
        self.phone_head = nn.Linear(self.vqs()[0].out_proj.out_channels, classes)

    def phone_log_probs(self, audio: Tensor) -> Tensor:
        """audio [B, T] -> log-probabilities [frames, B, classes] (F.ctc_loss's layout) from
        the semantic codebook's straight-through quantized latent alone."""
        zq = _quantize(self.vqs()[0], self._latent(audio), self.unit_codes)[1]  # [B, D, frames]
        return self.phone_head(zq.mT.float()).log_softmax(-1).transpose(0, 1)

    def phone_loss(self, audio: Tensor, frames: Tensor, targets: Tensor, lengths: Tensor) -> Tensor:
        """CTC loss of the phone head on whole utterances (audio_data.UtteranceSampler's
        batch). An utterance too fast for its frames counts 0, not inf."""
        return F.ctc_loss(self.phone_log_probs(audio), targets.to(audio.device), frames, lengths, blank=BLANK,
                          zero_infinity=True)

    def _latent(self, audio: Tensor) -> Tensor:
        """audio [B, T] -> the quantizers' input [B, D, frames]."""
        q = self.codec.quantizer
        return q.pre_module(q.downsample(self.codec.encoder(audio[:, None])))

    def vqs(self) -> list[VectorQuantizer]:
        return codec_vqs(self.codec)

    def forward(self, audio: Tensor) -> tuple[Tensor, VQOut]:
        # audio: [B, T] with T a multiple of hop_length -> reconstruction [B, T]
        q = self.codec.quantizer
        z = self._latent(audio)
        codes, z_sum = [], 0.0
        commitment, codebook, entropy, spread = (z.new_zeros((), dtype=torch.float32) for _ in range(4))
        residual = z
        keep = self._kept_codebooks(audio.shape[0], audio.device)  # [B, n_vq] bool
        for i, vq in enumerate(self.vqs()):
            c, zq, commit, book, ent, spr, latent = _quantize(vq, residual, self.unit_codes)
            self._record(i, c, latent)
            mask = keep[:, i, None, None].to(zq.dtype)
            z_sum = z_sum + zq * mask
            residual = residual - zq
            codes.append(c)
            commitment, codebook, entropy, spread = commitment + commit, codebook + book, entropy + ent, spread + spr
        decoder_in = q.upsample(q.post_module(z_sum))
        head_log_magnitude = head_phase = None
        if isinstance(self.codec.decoder, SpectralDecoder):
            h = self.codec.decoder.hidden(decoder_in)
            spectrum = self.codec.decoder.head.spectrum(h)
            head_log_magnitude, head_phase = spectrum
            y = self.codec.decoder.synthesize(h, spectrum)[:, 0]
        else:
            y = self.codec.decoder(decoder_in)[:, 0]
        return y, VQOut(torch.stack(codes, 1), commitment, codebook, entropy, spread, head_log_magnitude, head_phase)

    def _kept_codebooks(self, batch: int, device) -> Tensor:
        """Quantizer dropout: for a random `quantizer_dropout` share of the batch, decode
        from the semantic codebook and only the first k residual ones (k uniform), so the
        first codebooks carry the most (DAC's recipe)."""
        n = len(self.vqs())
        keep = torch.ones(batch, n, dtype=torch.bool, device=device)
        if not self.training or self.quantizer_dropout <= 0:
            return keep
        drop = torch.rand(batch, device=device) < self.quantizer_dropout
        k = torch.randint(1, n + 1, (batch,), device=device)  # codebooks kept, >= 1
        kept = torch.arange(n, device=device)[None] < k[:, None]
        return torch.where(drop[:, None], kept, keep)

    @torch.no_grad()
    def _record(self, i: int, codes: Tensor, latent: Tensor) -> None:
        if not self.training:
            return
        self.usage[i].index_add_(0, codes.reshape(-1), torch.ones_like(codes.reshape(-1), dtype=self.usage.dtype))
        self._latents[i] = latent

    @torch.no_grad()
    def seed_codebooks(self, audio: Tensor) -> None:
        """Data-dependent init (EnCodec's k-means init, without the iterations): the rows of
        each codebook become latents of this batch chosen at random, codebook by codebook
        (each residual codebook sees what the ones before it, already seeded, leave), so that
        codes start where the encoder's outputs are (at init they fill a narrow cone)."""
        was_training, self.training = self.training, True
        for i, vq in enumerate(self.vqs()):
            self.forward(audio)
            # center the projected latents (their common component would make every
            # frame choose the same codes), then seed the codebook with them
            vq.in_proj.bias -= self._latents[i].mean(0).to(vq.in_proj.bias.dtype)
            self.forward(audio)
            latent = self._latents[i]
            pick = torch.randint(0, latent.shape[0], (vq.codebook_size,), device=latent.device)
            noise = 0.01 * latent.std() * torch.randn_like(latent[pick])
            vq.codebook.weight.copy_((latent[pick] + noise).to(vq.codebook.weight.dtype))
        self.training = was_training
        self.usage.zero_()

    @torch.no_grad()
    def restart_dead_codes(self) -> int:
        """Every `restart_every` steps, once at least 2 latents per code were seen since the
        last check: codebook rows unused since then take the value of random latents of the
        last batch (plus a little noise). Returns how many."""
        self.steps += 1
        seen = float(self.usage[0].sum())
        if self.steps % self.restart_every or seen < 2 * self.usage.shape[1]:
            return 0
        restarted = 0
        for i, vq in enumerate(self.vqs()):
            latent = self._latents[i]
            dead = (self.usage[i, : vq.codebook_size] == 0).nonzero().reshape(-1)
            if latent is None or dead.numel() == 0:
                continue
            pick = torch.randint(0, latent.shape[0], (dead.numel(),), device=latent.device)
            new = latent[pick] + 0.01 * latent.std() * torch.randn_like(latent[pick])
            vq.codebook.weight[dead] = new.to(vq.codebook.weight.dtype)
            restarted += dead.numel()
        self.usage.zero_()
        return restarted

    def perplexity(self) -> list[float]:
        """Codebook usage perplexity per codebook since the last restart check."""
        p = self.usage / self.usage.sum(1, keepdim=True).clamp(min=1)
        return torch.exp(-(p * torch.log(p.clamp(min=1e-10))).sum(1)).tolist()
