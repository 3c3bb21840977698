"""dstune's built-in ``nn.MultiheadAttention`` transformer (``model_type: "mha_transformer"``), a causal LM that
transformers builds once this module is imported (registered with its Auto classes). Imports torch and transformers.

It is the plain PyTorch transformer training scripts write by hand, as DeepSpeedExamples'
``training/bf16_master_weight/train.py`` builds it (``SimpleTransformerModel``): token and learned position
embeddings, blocks of ``nn.MultiheadAttention(batch_first=True)`` called as ``attention(x, x, x)`` (PyTorch's
default ``need_weights=True``: the attention weights are materialised and averaged over heads), post-norm
LayerNorms around a GELU MLP (``intermediate_size``, by default ``4 * hidden_size``), an untied output projection
with bias, and the loss as such a script computes it: ``cross_entropy(logits.view(-1, vocab), labels.view(-1))``
(no shift). Its activations are traced like any transformers model's (:mod:`tuner.profile.trace`), so what the
attention, the norms and the loss save, under ``torch.autocast`` too, is counted from the module itself. Activation
checkpointing checkpoints each block non-reentrantly, as the script's ``checkpoint(layer, x, use_reentrant=False)``.

Config fields: ``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``max_position_embeddings`` (the position table's rows), ``intermediate_size`` (optional).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import CausalLMOutput

MODEL_TYPE = "mha_transformer"


class MhaTransformerConfig(transformers.PreTrainedConfig):
    """The transformer's shape (module docstring)."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 50000,
        hidden_size: int = 1024,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 16,
        max_position_embeddings: int = 512,
        intermediate_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.intermediate_size = intermediate_size or 4 * hidden_size
        kwargs["tie_word_embeddings"] = False  # the output projection is its own Linear
        super().__init__(**kwargs)


class MhaBlock(GradientCheckpointingLayer):
    """Self-attention and a GELU MLP, each added to its input and LayerNorm-ed after (post-norm)."""

    def __init__(self, config: MhaTransformerConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.attention = nn.MultiheadAttention(hidden, config.num_attention_heads, batch_first=True)
        self.norm1 = nn.LayerNorm(hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(
            nn.Linear(hidden, config.intermediate_size), nn.GELU(), nn.Linear(config.intermediate_size, hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn_out, _ = self.attention(x, x, x)
        x = self.norm1(x + attn_out)
        return self.norm2(x + self.ff(x))


class MhaTransformerForCausalLM(transformers.PreTrainedModel):
    """Embeddings, :class:`MhaBlock` layers and an output projection; the loss over every position, unshifted."""

    config_class = MhaTransformerConfig
    base_model_prefix = "mha_transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["MhaBlock"]  # noqa: RUF012 (transformers declares it an instance attribute)

    def __init__(self, config: MhaTransformerConfig) -> None:
        super().__init__(config)
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.pos_embedding = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layers = nn.ModuleList([MhaBlock(config) for _ in range(config.num_hidden_layers)])
        self.output_proj = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """PyTorch's own initialisation of each module, as the hand-written model has; not for a module whose
        parameters ZeRO-3 has partitioned away (``zero.Init``: dstune's ranks run it again with them gathered)."""
        if any(param.numel() == 0 for param in module.parameters(recurse=False)):
            return
        if isinstance(module, nn.MultiheadAttention):
            module._reset_parameters()
        elif isinstance(module, (nn.Linear, nn.Embedding, nn.LayerNorm)):
            module.reset_parameters()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any) -> CausalLMOutput:
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).unsqueeze(0).expand(batch, -1)
        x = self.embedding(input_ids) + self.pos_embedding(positions)
        for layer in self.layers:
            x = layer(x)
        logits = self.output_proj(x)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.view(-1, self.config.vocab_size), labels.view(-1))
        return CausalLMOutput(loss=loss, logits=logits)


transformers.AutoConfig.register(MODEL_TYPE, MhaTransformerConfig, exist_ok=True)
transformers.AutoModelForCausalLM.register(MhaTransformerConfig, MhaTransformerForCausalLM, exist_ok=True)
