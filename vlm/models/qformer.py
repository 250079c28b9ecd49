"""Q-Former connector (BLIP-2 / XrayGPT): learned queries through BERT-style layers, cross-attending to the vision
features every ``cross_attention_freq`` layers, projected to the decoder's width; BLIP-2's parameter names."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vlm.config import check
from vlm.models.attention import init_weights


@dataclass
class QFormerConfig:
    num_query_tokens: int = 16
    hidden_size: int = 192
    num_hidden_layers: int = 2
    num_attention_heads: int = 3
    intermediate_size: int = 768
    cross_attention_freq: int = 1
    layer_norm_eps: float = 1e-12

    def validate(self, prefix: str = "QFormerConfig") -> None:
        for name in ("num_query_tokens", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "cross_attention_freq", "layer_norm_eps"):
            check(getattr(self, name) > 0, f"{prefix}.{name}", f"must be positive, got {getattr(self, name)}")
        check(self.hidden_size % self.num_attention_heads == 0, f"{prefix}.hidden_size",
              f"must be divisible by {prefix}.num_attention_heads "
              f"({self.hidden_size} % {self.num_attention_heads} = {self.hidden_size % self.num_attention_heads})")


class QFormerMultiHeadAttention(nn.Module):
    def __init__(self, config: QFormerConfig, kv_hidden_size: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(kv_hidden_size, config.hidden_size)
        self.value = nn.Linear(kv_hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor, kv_states: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden_states.shape
        query = self.query(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        key = self.key(kv_states).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
        value = self.value(kv_states).view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)
        attn_output = F.scaled_dot_product_attention(query, key, value)  # [N, H, Q, Dh]
        return attn_output.transpose(1, 2).reshape(batch, length, -1)  # [N, Q, Dq]


class QFormerOutput(nn.Module):
    """BERT's output block (after the attention, and after the MLP): dense, residual, post-LayerNorm."""

    def __init__(self, config: QFormerConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(hidden_states) + residual)


class QFormerAttention(nn.Module):
    def __init__(self, config: QFormerConfig, kv_hidden_size: int):
        super().__init__()
        self.attention = QFormerMultiHeadAttention(config, kv_hidden_size)
        self.output = QFormerOutput(config, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor, kv_states: torch.Tensor) -> torch.Tensor:
        return self.output(self.attention(hidden_states, kv_states), hidden_states)


class QFormerIntermediate(nn.Module):
    def __init__(self, config: QFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden_states))


class QFormerLayer(nn.Module):
    def __init__(self, config: QFormerConfig, layer_idx: int, vision_hidden_size: int):
        super().__init__()
        self.attention = QFormerAttention(config, config.hidden_size)
        self.crossattention = QFormerAttention(config, vision_hidden_size) \
            if layer_idx % config.cross_attention_freq == 0 else None
        self.intermediate_query = QFormerIntermediate(config)
        self.output_query = QFormerOutput(config, config.intermediate_size)

    def forward(self, queries: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        queries = self.attention(queries, queries)  # [N, Q, Dq]
        if self.crossattention is not None:
            queries = self.crossattention(queries, image_features)
        return self.output_query(self.intermediate_query(queries), queries)


class QFormerEncoder(nn.Module):
    def __init__(self, config: QFormerConfig, vision_hidden_size: int):
        super().__init__()
        self.layer = nn.ModuleList(QFormerLayer(config, i, vision_hidden_size) for i in range(config.num_hidden_layers))

    def forward(self, queries: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            queries = layer(queries, image_features)
        return queries


class QFormerModel(nn.Module):
    """Input LayerNorm + Q-Former layers over query embeddings ``[N, Q, Dq]`` and image features ``[N, P, Dv]``."""

    def __init__(self, config: QFormerConfig, vision_hidden_size: int):
        super().__init__()
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.encoder = QFormerEncoder(config, vision_hidden_size)

    def forward(self, query_embeds: torch.Tensor, image_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.layernorm(query_embeds), image_features)  # [N, Q, Dq]


class QFormerConnector(nn.Module):
    """Vision features ``[N, P, Dv]`` -> ``num_query_tokens`` image tokens ``[N, Q, D_text]``."""

    def __init__(self, config: QFormerConfig, vision_hidden_size: int, text_hidden_size: int):
        super().__init__()
        config.validate()
        self.query_tokens = nn.Parameter(torch.zeros(1, config.num_query_tokens, config.hidden_size))
        self.qformer = QFormerModel(config, vision_hidden_size)
        self.language_projection = nn.Linear(config.hidden_size, text_hidden_size)
        self.apply(init_weights)  # BERT's init: the same truncated normal, zero biases, unit LayerNorms
        nn.init.trunc_normal_(self.query_tokens, std=0.02, a=-0.04, b=0.04)

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        queries = self.query_tokens.expand(image_features.shape[0], -1, -1)  # [N, Q, Dq]
        return self.language_projection(self.qformer(queries, image_features))  # [N, Q, D_text]
