"""Built-in decoder-only transformers built from a :class:`~tuner.workload.ModelSpec`, with random weights.

One short file in the spirit of nanoGPT. The same module builds GPT-2 style models (learned positions, LayerNorm,
GELU MLP, fused biased QKV) and LLaMA style models (rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention),
switching on the spec's fields, so its parameter count equals ``spec.n_params``. Models never download anything.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tuner.workload import ModelSpec


class RMSNorm(nn.Module):
    """Root-mean-square norm (LLaMA), computed in fp32 like transformers does."""

    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary position embedding to ``x`` of shape (batch, heads, seq, head_dim)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Causal self-attention with optional grouped-query heads, rotary positions and eager or SDPA kernels."""

    def __init__(self, spec: ModelSpec, attention: str) -> None:
        super().__init__()
        self.spec, self.attention = spec, attention
        q_out, kv_out = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        self.fused = spec.family in ("gpt2", "gpt_neox") and q_out == kv_out
        if self.fused:
            self.qkv = nn.Linear(spec.hidden_size, 3 * q_out, bias=spec.qkv_bias)
        else:
            self.q = nn.Linear(spec.hidden_size, q_out, bias=spec.qkv_bias)
            self.k = nn.Linear(spec.hidden_size, kv_out, bias=spec.qkv_bias)
            self.v = nn.Linear(spec.hidden_size, kv_out, bias=spec.qkv_bias)
        self.out = nn.Linear(q_out, spec.hidden_size, bias=spec.out_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        b, s, _ = x.shape
        heads, kv_heads, dim = self.spec.num_heads, self.spec.num_kv_heads, self.spec.head_dim
        if self.fused:
            q, k, v = self.qkv(x).split(heads * dim, dim=-1)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        q = q.view(b, s, heads, dim).transpose(1, 2)
        k = k.view(b, s, kv_heads, dim).transpose(1, 2)
        v = v.view(b, s, kv_heads, dim).transpose(1, 2)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        if kv_heads != heads:
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
        if self.attention == "eager":
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(dim)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = probs @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, heads * dim))


class MLP(nn.Module):
    """GELU MLP (GPT-2) or gated SiLU MLP (LLaMA)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gated = spec.gated_mlp
        self.up = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=spec.mlp_bias)
        if self.gated:
            self.gate = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=spec.mlp_bias)
        self.down = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def make_norm(spec: ModelSpec) -> nn.Module:
    """LayerNorm with bias (GPT-2, GPT-NeoX) or RMSNorm (LLaMA family)."""
    return nn.LayerNorm(spec.hidden_size) if spec.norm == "layernorm" else RMSNorm(spec.hidden_size)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, spec: ModelSpec, attention: str) -> None:
        super().__init__()
        self.norm1, self.attn = make_norm(spec), Attention(spec, attention)
        self.norm2, self.mlp = make_norm(spec), MLP(spec)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class CausalLM(nn.Module):
    """Decoder-only language model; ``forward(tokens, targets)`` returns the mean cross-entropy loss.

    Logits are upcast to fp32 before the loss, as Hugging Face models do.
    """

    def __init__(self, spec: ModelSpec, attention: str = "sdpa", checkpointing: bool = False) -> None:
        super().__init__()
        if spec.is_bare:
            raise ValueError("model: a bare parameter count has no architecture to build")
        self.spec, self.checkpointing = spec, checkpointing
        self.chunked_loss = False  # DeepSpeed's chunked cross-entropy (tuner.measure.rank.chunked_loss)
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.positions = nn.Embedding(spec.max_positions, spec.hidden_size) if spec.learned_positions else None
        self.blocks = nn.ModuleList(Block(spec, attention) for _ in range(spec.num_layers))
        self.norm = make_norm(spec)
        self.head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        if spec.tie_embeddings:
            self.head.weight = self.embed.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            bias = getattr(module, "bias", None)
            if isinstance(bias, torch.Tensor):
                nn.init.zeros_(bias)

    def rope(self, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary cos/sin tables for ``seq_len`` positions."""
        dim = self.spec.head_dim
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
        angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        seq_len = tokens.shape[1]
        if self.positions is not None:
            x = x + self.positions(torch.arange(seq_len, device=tokens.device))
            rope = None
        else:
            rope = self.rope(seq_len, tokens.device, x.dtype)
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope)
        logits = self.head(self.norm(x))
        if self.chunked_loss:  # DeepSpeed's chunked cross-entropy: fp32 maths, no fp32 [tokens, vocab] tensors
            from deepspeed.runtime.chunked_cross_entropy import chunked_cross_entropy

            return chunked_cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def build_model(spec: ModelSpec, attention: str = "sdpa", checkpointing: bool = False) -> CausalLM:
    """Build the built-in model for ``spec`` with random weights (fp32; DeepSpeed casts it)."""
    return CausalLM(spec, attention=attention, checkpointing=checkpointing)


def synthetic_batch(
    spec: ModelSpec, micro_batch: int, seq_len: int, device: torch.device | str = "cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets of shape (micro_batch, seq_len)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, spec.vocab_size, (micro_batch, seq_len + 1), generator=generator)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


class TransformersCausalLM(nn.Module):
    """A Hugging Face causal LM built ``from_config`` (random weights, no download) behind the built-in interface."""

    def __init__(self, hf_config: dict, attention: str | None = None, checkpointing: bool = False) -> None:
        """``attention``: the workload's (None: as transformers resolves it); one the class cannot run is refused."""
        super().__init__()
        from tuner.profile.hf import build, enable_checkpointing

        self.model = build(hf_config, attention=attention, bounded=False)  # the model the profile traces, real
        if checkpointing:
            enable_checkpointing(self.model)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token loss; transformers shifts the labels itself, so the labels are the tokens. Called as a
        training loop calls it (the config's ``use_cache``), as the profile traced it."""
        del targets
        return self.model(input_ids=tokens, labels=tokens).loss


def build_transformers_model(hf_config: dict, attention: str | None = None, checkpointing: bool = False) -> nn.Module:
    """Build a transformers model from a ``config.json`` dict with random weights."""
    return TransformersCausalLM(hf_config, attention=attention, checkpointing=checkpointing)
