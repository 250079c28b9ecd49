"""The convolutional stem: a vision adapter whose output the PaliGemma core adds to SigLIP's patch embedding."""

from __future__ import annotations

import math

import torch
from torch import nn


class ConvStem(nn.Module):
    """Early convolutions (Xiao et al. 2021, "Early Convolutions Help Transformers See Better"): per stage a
    stride-2 and a stride-1 3x3 convolution, each with GroupNorm and ReLU, then a 1x1 projection to the
    encoder width. ``[N, C, S, S]`` -> ``[N, D, S / 2**stages, S / 2**stages]``, and each stage's output
    (``[N, channels[i], S / 2**(i+1), S / 2**(i+1)]``: an object-centre head reads them). GroupNorm, not BatchNorm:
    a sample's features never depend on the rest of its batch."""

    def __init__(self, in_channels: int, channels: list[int], out_channels: int, groups: int = 4):
        super().__init__()
        layers: list[nn.Module] = []
        self.stage_ends: list[int] = []  # index in self.layers after which each stage's output is ready
        for c in channels:
            for stride in (2, 1):
                layers += [nn.Conv2d(in_channels, c, 3, stride=stride, padding=1, bias=False),
                           nn.GroupNorm(math.gcd(groups, c), c), nn.ReLU()]
                in_channels = c
            self.stage_ends.append(len(layers) - 1)
        self.layers = nn.Sequential(*layers)
        self.proj = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        stages, hidden = [], pixel_values
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden)
            if index in self.stage_ends:
                stages.append(hidden)
        return self.proj(hidden), stages
