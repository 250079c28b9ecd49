"""Object-centre heatmaps for counting (CenterNet: Zhou et al. 2019, "Objects as Points").

The grounding head's per-patch centre counts (16 px patches) count cars exactly in only about 0.4 of
images: neighbouring objects share a patch. This head reads the convolutional stem's stage outputs in a
small feature pyramid (stride 16 -> 8 -> 4) and predicts, per category, a heatmap at a quarter of the
image size (the ``heat`` group of :mod:`vlm.models.perception.targets`), and the same for the footpoints of
road users, pedestrians and riders, and occluded road users (``foot``), trained with CenterNet's focal loss.
An object is a local maximum above 0.5; the counts of those peaks per channel and region (object centres:
``CENTRE_REGIONS``, the whole image, its left and its right third; footpoints: ``FOOT_REGIONS``, the near
part of each manoeuvre's path) are what the decoder reads, thermometer-coded, in the extra token.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vlm.models.perception.heads.base import AuxiliaryHead
from vlm.models.perception.targets import CENTRE_REGIONS, CHANNELS, FOOT_REGIONS, GROUPS, channels
from vlm.models.siglip import SiglipVisionConfig
from vlm.params import check

STRIDE = 4  # heatmap cells per image side = its pixels / STRIDE: the stem's second stage
PEAK_THRESHOLD = 0.5
PRIOR = 0.1  # initial heatmap probability (CenterNet's bias init -2.19)
NUM_COUNT_THRESHOLDS = 10  # peak counts thermometer-coded: > 0, > 1, ..., > 9


class CentreHead(AuxiliaryHead):
    name = "centres"
    target_stride = STRIDE

    def __init__(self, config, vision: SiglipVisionConfig, width: int = 32):
        super().__init__(config, vision)
        self.channels = channels("heat", "foot")  # of the targets
        rows, columns = vision.height_width
        self.grid = (rows // STRIDE, columns // STRIDE)  # heatmap cells (rows, columns)
        heat_channels = CHANNELS[self.channels]
        stem = config.stem_channels
        c4, c8, top = stem[1], stem[2], stem[-1]  # strides 4, 8 and the stem's last
        self.lateral = nn.Conv2d(top, c8, kernel_size=1)
        self.smooth8 = nn.Sequential(nn.Conv2d(c8, width, 3, padding=1), nn.ReLU())
        self.smooth4 = nn.Sequential(nn.Conv2d(width + c4, width, 3, padding=1), nn.ReLU(),
                                     nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(width, len(heat_channels), kernel_size=1)
        nn.init.constant_(self.out.bias, math.log(PRIOR / (1 - PRIOR)))
        self.register_buffer("thresholds", torch.arange(NUM_COUNT_THRESHOLDS) + 0.5, persistent=False)
        regions = [CENTRE_REGIONS if name in GROUPS["heat"] else FOOT_REGIONS for name in heat_channels]
        self.register_buffer("regions", torch.tensor(regions, dtype=torch.float32), persistent=False)  # [C, R, 3]
        self.num_token_features = len(heat_channels) * len(CENTRE_REGIONS) * NUM_COUNT_THRESHOLDS

    @classmethod
    def validate(cls, config, prefix: str) -> None:
        check(len(config.stem_channels) >= 3, f"{prefix}.heads.centres",
              f"needs a conv stem of at least 3 stages ({prefix}.stem_channels), got {config.stem_channels}")

    def forward(self, patch_features: torch.Tensor, stem_features: list[torch.Tensor]) -> torch.Tensor:
        """Stem stage outputs -> heatmap logits ``[N, H/4 * W/4, C_heat]`` (row-major cells)."""
        f4, f8, top = stem_features[1], stem_features[2], stem_features[-1]
        hidden = f8 + F.interpolate(self.lateral(top), size=f8.shape[-2:], mode="nearest")  # [N, c8, H/8, W/8]
        hidden = self.smooth8(hidden)  # [N, W, H/8, W/8]
        hidden = F.interpolate(hidden, size=f4.shape[-2:], mode="nearest")  # [N, W, H/4, W/4]
        logits = self.out(self.smooth4(torch.cat([hidden, f4], dim=1)))  # [N, C_heat, H/4, W/4]
        return logits.flatten(2).transpose(1, 2)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """CenterNet's focal loss (alpha 2, beta 4) per object against the ``heat``/``foot`` channels of targets
        ``[N, H/4 * W/4, C]`` (all target channels)."""
        heat = targets[..., self.channels].float()
        prob = logits.float().sigmoid().clamp(1e-4, 1 - 1e-4)
        centre = heat == 1
        positive = -((1 - prob) ** 2) * torch.log(prob) * centre
        negative = -((1 - heat) ** 4) * prob ** 2 * torch.log(1 - prob) * ~centre
        return (positive.sum() + negative.sum()) / centre.sum().clamp(min=1)

    def peak_counts(self, logits: torch.Tensor) -> torch.Tensor:
        """Peaks (3x3 local maxima above 0.5) per channel and region: ``[N, C_heat, R]``."""
        num, _, channels = logits.shape
        prob = logits.detach().float().sigmoid().transpose(1, 2).reshape(num, channels, *self.grid)
        peaks = (prob > PEAK_THRESHOLD) & (prob == F.max_pool2d(prob, 3, stride=1, padding=1))  # [N, C, H/4, W/4]
        masks = self.region_masks(*self.grid)  # [C, R, H/4, W/4]
        return (peaks[:, :, None] & masks).sum(dim=(3, 4)).float()

    def region_masks(self, rows: int, columns: int) -> torch.Tensor:
        """bool ``[C_heat, R, rows, columns]``: which heatmap cells (by their centres) lie in each channel's
        regions."""
        device = self.regions.device
        ys = (torch.arange(rows, device=device) + 0.5) / rows  # [rows] cell centres, 0..1
        xs = (torch.arange(columns, device=device) + 0.5) / columns  # [columns]
        x0, x1, y0 = (self.regions[..., i, None, None] for i in range(3))  # [C, R, 1, 1]
        return (ys[:, None] >= y0) & (xs[None, :] >= x0) & (xs[None, :] <= x1)

    def decoder_features(self, logits: torch.Tensor) -> tuple[None, torch.Tensor]:
        """No per-patch maps (the heatmaps are finer than the patches); the peak counts thermometer-coded
        (count > k for k = 0 ... 9): ``[N, num_token_features]``."""
        counts = self.peak_counts(logits)  # [N, C_heat, R]
        return None, (counts[..., None] > self.thresholds).flatten(1).float()
