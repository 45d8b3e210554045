"""CausalLM: the Llama family (Llama, Mistral, Qwen2, Qwen3) as one module.

Qwen2's q/k/v biases and Qwen3's per-head q/k RMSNorm are config flags (`ModelConfig`),
not subclasses. Parameter names follow Hugging Face (`model.layers.0.self_attn.q_proj`,
`lm_head`), so checkpoint tensor names map onto module paths with no renaming table.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from edgellm.model.config import ModelConfig
from edgellm.model.forward_context import ForwardContext
from edgellm.model.layers import MLP, Attention, QuantLinear, RMSNorm


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: Tensor, positions: Tensor, ctx: ForwardContext | None = None, kv_cache: Tensor | None = None
    ) -> Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, ctx, kv_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    """HF's `model.*`: embeddings, decoder layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext | None = None) -> Tensor:
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, positions, ctx, None if ctx is None else ctx.kv_caches[i])
        return self.norm(x)


class CausalLM(nn.Module):
    """`forward(input_ids [B, T]) -> logits [B, T, V]` in the model's dtype; plain causal, no KV cache.

    The engine's entry is `forward_flat(input_ids [T], positions [T], ctx) -> hidden [T, H]` over a
    flat batch with a paged KV cache (design §5.1), then `compute_logits` at the rows it samples:
    the same layers and weights, only attention reads and writes the cache.

    Tied embeddings (`tie_word_embeddings`): the loader makes `lm_head.weight` the same
    Parameter as `model.embed_tokens.weight`.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = QuantLinear(config.hidden_size, config.vocab_size, bias=False)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor) -> Tensor:
        T = input_ids.shape[-1]
        window = self.config.sliding_window
        if window is not None and T > window:
            raise ValueError(f"input_ids: {T} tokens exceed sliding_window {window}, which plain causal attention does not apply")
        positions = torch.arange(T, device=input_ids.device)  # [T]
        return self.lm_head(self.model(input_ids, positions))  # [B, T, V]

    @torch.inference_mode()
    def forward_flat(self, input_ids: Tensor, positions: Tensor, ctx: ForwardContext) -> Tensor:
        return self.model(input_ids, positions, ctx)  # [T, H]

    @torch.inference_mode()
    def compute_logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)  # [R, V]
