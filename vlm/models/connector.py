"""The linear connector: PaliGemma's multi-modal projector (one linear map per image token)."""

from __future__ import annotations

import torch
from torch import nn


class LinearConnector(nn.Module):
    """Vision features ``[N, P, Dv]`` -> ``P`` image tokens ``[N, P, D_text]`` (``multi_modal_projector.linear``)."""

    def __init__(self, vision_hidden_size: int, text_hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(vision_hidden_size, text_hidden_size)
        nn.init.trunc_normal_(self.linear.weight, std=0.02, a=-0.04, b=0.04)
        nn.init.zeros_(self.linear.bias)

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        return self.linear(image_features)
