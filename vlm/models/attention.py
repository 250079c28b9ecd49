"""What the SigLIP encoder, the Gemma decoder and the connectors share: the attention core and the weight init."""

import torch
import torch.nn.functional as F
from torch import nn


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
              output_attentions: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled dot-product attention of ``query`` ``[B, H, Q, Dh]`` over ``key``/``value`` ``[B, H_kv, K, Dh]`` (grouped
    when H_kv < H) with a boolean ``mask`` (True: visible): the output ``[B, H, Q, Dh]`` and, with
    ``output_attentions``, an explicit softmax's probabilities (float32, cast back), else None."""
    groups = query.shape[1] // key.shape[1]
    if not output_attentions:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=groups > 1), None
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * query.shape[-1] ** -0.5  # [B, H, Q, K]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value), weights


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Truncated-normal weights (``std``, cut at 2 std), zero biases, unit LayerNorms (Gemma's RMSNorm: built at 0)."""
    if isinstance(module, (nn.Linear, nn.Conv2d, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
