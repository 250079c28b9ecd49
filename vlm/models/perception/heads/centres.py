"""Object-centre heatmaps for counting (CenterNet: Zhou et al. 2019, "Objects as Points"): from the stem's fine map,
a heatmap per category (``heat``) and footpoint group (``foot``), CenterNet's focal loss; the decoder reads the peaks
(local maxima above 0.5) per channel and region, thermometer-coded (why: docs/architecture.md, departure 2)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from vlm.models.perception.heads.base import AuxiliaryHead
from vlm.models.perception.stem import PYRAMID_WIDTH
from vlm.models.perception.targets import CENTRE_REGIONS, CHANNELS, FOOT_REGIONS, GROUPS, channels, region_masks
from vlm.models.siglip import SiglipVisionConfig

PEAK_THRESHOLD = 0.5
PRIOR = 0.1  # initial heatmap probability (CenterNet's bias init -2.19)
NUM_COUNT_THRESHOLDS = 10  # peak counts thermometer-coded: > 0, > 1, ..., > 9


class CentreHead(AuxiliaryHead):
    name = "centres"
    reads_fine = True  # heatmap cells: the fine map's (self.grid)

    def __init__(self, config, vision: SiglipVisionConfig):
        super().__init__(config, vision)
        self.channels = channels("heat", "foot")  # of the targets
        heat_channels = CHANNELS[self.channels]
        self.out = nn.Conv2d(PYRAMID_WIDTH, len(heat_channels), kernel_size=1)
        nn.init.constant_(self.out.bias, math.log(PRIOR / (1 - PRIOR)))
        self.register_buffer("thresholds", torch.arange(NUM_COUNT_THRESHOLDS) + 0.5, persistent=False)
        regions = [CENTRE_REGIONS if name in GROUPS["heat"] else FOOT_REGIONS for name in heat_channels]
        self.register_buffer("masks", region_masks(regions, self.grid), persistent=False)  # [C, R, H/f, W/f]
        self.num_token_features = len(heat_channels) * len(CENTRE_REGIONS) * NUM_COUNT_THRESHOLDS

    def forward(self, patch_features: torch.Tensor, fine_features: torch.Tensor) -> torch.Tensor:
        """The fine map -> heatmap logits ``[N, H/f * W/f, C_heat]`` (row-major cells)."""
        return self.out(fine_features).flatten(2).transpose(1, 2)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """CenterNet's focal loss (alpha 2, beta 4) per object on the ``heat``/``foot`` channels of all ``targets``."""
        heat = targets[..., self.channels].float()
        prob = logits.float().sigmoid().clamp(1e-4, 1 - 1e-4)
        centre = heat == 1
        positive = -((1 - prob) ** 2) * torch.log(prob) * centre
        negative = -((1 - heat) ** 4) * prob ** 2 * torch.log(1 - prob) * ~centre
        return (positive.sum() + negative.sum()) / centre.sum().clamp(min=1)

    def oracle(self, targets: torch.Tensor) -> torch.Tensor:
        """The label heatmaps as logits ``[N, H/f * W/f, C_heat]`` (each object's cell a peak)."""
        return torch.logit(targets[..., self.channels].float().clamp(1e-4, 1 - 1e-4))

    def peak_counts(self, logits: torch.Tensor) -> torch.Tensor:
        """Peaks (3x3 local maxima above 0.5) per channel and region: ``[N, C_heat, R]``."""
        num, _, channels = logits.shape
        prob = logits.detach().float().sigmoid().transpose(1, 2).reshape(num, channels, *self.grid)
        peaks = (prob > PEAK_THRESHOLD) & (prob == F.max_pool2d(prob, 3, stride=1, padding=1))  # [N, C, H/f, W/f]
        return (peaks[:, :, None] & self.masks).sum(dim=(3, 4)).float()

    def decoder_features(self, logits: torch.Tensor) -> tuple[None, torch.Tensor]:
        """No per-patch maps (finer than the patches); the peak counts thermometer-coded (count > 0 ... > 9)."""
        counts = self.peak_counts(logits)  # [N, C_heat, R]
        return None, (counts[..., None] > self.thresholds).flatten(1).float()
