"""The convolutional stem: a vision adapter whose output the PaliGemma core adds to SigLIP's patch embedding."""

import math

import torch
import torch.nn.functional as F
from torch import nn

GROUPS = 4  # GroupNorm groups per stem convolution (fewer where the channels do not divide)


class ConvStem(nn.Module):
    """Early convolutions (Xiao et al. 2021; docs/architecture.md, departure 1), then a 1x1 projection to the encoder
    width: ``[N, C, H, W]`` -> ``[N, D, H/2**stages, W/2**stages]`` and each stage's ``[N, channels[i], ...]``."""

    def __init__(self, in_channels: int, channels: list[int], out_channels: int):
        super().__init__()
        layers: list[nn.Module] = []
        self.stage_ends: list[int] = []  # index in self.layers after which each stage's output is ready
        for c in channels:
            for stride in (2, 1):
                layers += [nn.Conv2d(in_channels, c, 3, stride=stride, padding=1, bias=False),
                           nn.GroupNorm(math.gcd(GROUPS, c), c), nn.ReLU()]
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


class StemPyramid(nn.Module):
    """A small feature pyramid over the stem's stages (Lin et al. 2017, "Feature Pyramid Networks"): the last to stride
    2f plus the stride-2f stage, then to stride f beside that stage: ``[N, width, H/f, W/f]``, what fine heads read
    (f = ``stride``, a power of two; 4 by default: ``model.perception.fine_stride``)."""

    def __init__(self, channels: list[int], width: int, stride: int = 4):
        super().__init__()
        self.index = stride.bit_length() - 2  # the stride-f stage's (stage i has stride 2**(i+1))
        fine, coarse, top = channels[self.index], channels[self.index + 1], channels[-1]  # strides f, 2f, the last's
        self.lateral = nn.Conv2d(top, coarse, kernel_size=1)
        # smooth8 works at stride 2f and smooth4 at f: their names are checkpoint keys, so they stay
        self.smooth8 = nn.Sequential(nn.Conv2d(coarse, width, 3, padding=1), nn.ReLU())
        self.smooth4 = nn.Sequential(nn.Conv2d(width + fine, width, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(width, width, 3, padding=1), nn.ReLU())

    def forward(self, stem_features: list[torch.Tensor]) -> torch.Tensor:
        fine, coarse, top = stem_features[self.index], stem_features[self.index + 1], stem_features[-1]
        hidden = coarse + F.interpolate(self.lateral(top), size=coarse.shape[-2:], mode="nearest")  # [N, C, H/2f, W/2f]
        hidden = self.smooth8(hidden)  # [N, width, H/2f, W/2f]
        hidden = F.interpolate(hidden, size=fine.shape[-2:], mode="nearest")  # [N, width, H/f, W/f]
        return self.smooth4(torch.cat([hidden, fine], dim=1))  # [N, width, H/f, W/f]
