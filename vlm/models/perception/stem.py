"""The convolutional stem: a vision adapter whose output the PaliGemma core adds to SigLIP's patch embedding."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class ConvStem(nn.Module):
    """Early convolutions (Xiao et al. 2021; docs/architecture.md, departure 1), then a 1x1 projection to the encoder
    width: ``[N, C, S, S]`` -> ``[N, D, S/2**stages, S/2**stages]`` and each stage's ``[N, channels[i], ...]``."""

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


PYRAMID_WIDTH = 32  # channels of the fine map the fine heads read
FINE_CELLS = 4  # cells of that map per patch side: its stride is a quarter of the patch size (4 px for 16 px patches)


class StemPyramid(nn.Module):
    """A small feature pyramid over the stem's last three stages (Lin et al. 2017, "Feature Pyramid Networks"), at
    strides p/4, p/2 and p for patches of p px: the last to stride p/2 plus that stage, then to stride p/4 beside
    that stage: ``[N, width, H*4/p, W*4/p]``, what fine heads read (for 16 px patches stride 4: ``[N, width, H/4,
    W/4]``)."""

    def __init__(self, channels: list[int], width: int):
        super().__init__()
        c4, c8, top = channels[-3:]  # strides p/4, p/2 and p (4, 8 and 16 for 16 px patches)
        self.lateral = nn.Conv2d(top, c8, kernel_size=1)
        self.smooth8 = nn.Sequential(nn.Conv2d(c8, width, 3, padding=1), nn.ReLU())
        self.smooth4 = nn.Sequential(nn.Conv2d(width + c4, width, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(width, width, 3, padding=1), nn.ReLU())

    def forward(self, stem_features: list[torch.Tensor]) -> torch.Tensor:
        f4, f8, top = stem_features[-3:]
        hidden = f8 + F.interpolate(self.lateral(top), size=f8.shape[-2:], mode="nearest")  # [N, c8, H*2/p, W*2/p]
        hidden = self.smooth8(hidden)  # [N, width, H*2/p, W*2/p]
        hidden = F.interpolate(hidden, size=f4.shape[-2:], mode="nearest")  # [N, width, H*4/p, W*4/p]
        return self.smooth4(torch.cat([hidden, f4], dim=1))  # [N, width, H*4/p, W*4/p]
