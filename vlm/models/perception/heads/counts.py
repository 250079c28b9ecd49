"""Counts the losses reach: a density map per category (``centre`` targets) and footpoint group (``feet``) at a quarter
of the image size, Poisson per cell and per region sum; the decoder reads the region sums thermometer-coded, not
detached, a token per channel (Lempitsky & Zisserman 2010; Zhang et al. 2018; docs/architecture.md, departure 2)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from vlm.models.perception.heads.base import NONE, AuxiliaryHead
from vlm.models.perception.stem import PYRAMID_WIDTH
from vlm.models.perception.targets import CENTRE_REGIONS, CHANNELS, FOOT_REGIONS, channels, region_masks
from vlm.models.siglip import SiglipVisionConfig

PRIOR = 1e-3  # initial expected count per cell
MAX_LOG_COUNT = 4.0  # log-counts are clamped before exp (at most e^4 ~ 55 per cell)
NUM_THRESHOLDS = 10  # region sums thermometer-coded at 0.5, 1.5, ..., 9.5
WINDOW = 5  # cells: the density's sums over every WINDOW x WINDOW window are trained against the labels' too


class CountHead(AuxiliaryHead):
    name = "counts"
    reads_fine = True  # density cells: the fine map's (self.grid)
    mirror_averaged = True

    def __init__(self, config, vision: SiglipVisionConfig):
        super().__init__(config, vision)
        self.centres, self.feet = channels("centre"), channels("feet")  # of the targets
        names = CHANNELS[self.centres] + CHANNELS[self.feet]
        self.out = nn.Sequential(nn.Conv2d(PYRAMID_WIDTH, PYRAMID_WIDTH, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(PYRAMID_WIDTH, len(names), kernel_size=1))
        nn.init.constant_(self.out[-1].bias, math.log(PRIOR))
        regions = [CENTRE_REGIONS if name in CHANNELS[self.centres] else FOOT_REGIONS for name in names]
        self.register_buffer("masks", region_masks(regions, self.grid).float(), persistent=False)  # [C, R, h, w]
        self.register_buffer("thresholds", torch.arange(NUM_THRESHOLDS) + 0.5, persistent=False)  # [K]
        self.token_shape = (len(names), len(CENTRE_REGIONS) * NUM_THRESHOLDS)  # a token per channel

    def forward(self, patch_features: torch.Tensor, fine_features: torch.Tensor) -> torch.Tensor:
        """The fine map -> log expected counts ``[N, h*w, C]`` (row-major cells, h x w = H/f x W/f)."""
        return self.out(fine_features).flatten(2).transpose(1, 2)

    def average_mirrored(self, logits: torch.Tensor, mirrored: torch.Tensor) -> torch.Tensor:
        """The mean of the image's density and its mirror image's, mirrored back: log expected counts ``[N, h*w, C]``
        whose region sums swap left and right exactly when the image is mirrored."""
        rows, columns = self.grid
        mirrored = mirrored.reshape(-1, rows, columns, mirrored.shape[-1]).flip(2).reshape(mirrored.shape)
        return torch.logaddexp(logits.float(), mirrored.float()) - math.log(2)

    def counts(self, targets: torch.Tensor) -> torch.Tensor:
        """The ``centre`` and ``feet`` channels of targets ``[N, h*w, C_all]``: counts per cell ``[N, h*w, C]``."""
        return torch.cat([targets[..., self.centres], targets[..., self.feet]], dim=-1).float()

    def region_sums(self, counts: torch.Tensor) -> torch.Tensor:
        """Counts per cell ``[N, h*w, C]`` -> their sums over each channel's regions ``[N, C, R]``, in float32 also
        under autocast (whose bf16 matmul would round a sum of 6.51 to 6.5)."""
        with torch.autocast(counts.device.type, enabled=False):
            return torch.einsum("npc,crp->ncr", counts.float(), self.masks.flatten(2))

    def density(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().clamp(max=MAX_LOG_COUNT).exp()  # [N, h*w, C]

    def window_sums(self, counts: torch.Tensor) -> torch.Tensor:
        """Counts per cell ``[N, h*w, C]`` -> their sums over the WINDOW x WINDOW window around each cell
        ``[N, C, h, w]`` (cells outside the map count 0)."""
        rows, columns = self.grid
        maps = counts.transpose(1, 2).reshape(counts.shape[0], -1, rows, columns)
        return F.avg_pool2d(maps, WINDOW, stride=1, padding=WINDOW // 2) * WINDOW ** 2

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Poisson per cell (summed over cells, averaged over images and channels), Poisson per region sum, and the
        squared error of the window sums (summed over windows, averaged over images, channels and a window's cells):
        the region sums alone let one object's mass make up for another's, the windows hold each near one."""
        counts = self.counts(targets)
        logits = logits.float()
        num, _, channels = logits.shape
        per_cell = F.poisson_nll_loss(logits, counts, log_input=True, full=False, reduction="sum") / (num * channels)
        density = self.density(logits)
        sums, exact = self.region_sums(density), self.region_sums(counts)  # [N, C, R]
        per_region = F.poisson_nll_loss(sums, exact, log_input=False, full=False, eps=1e-6)
        per_window = (self.window_sums(density) - self.window_sums(counts)).pow(2).sum()
        per_window = per_window / (num * channels * WINDOW ** 2)
        return per_cell + per_region + per_window

    def oracle(self, targets: torch.Tensor) -> torch.Tensor:
        """The labels' counts per cell as log counts ``[N, h*w, C]``: region sums exactly the labels' counts."""
        return self.counts(targets).clamp(min=NONE).log()

    def metrics(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per image: the share of its region counts whose rounded sum is exact, and whether all of them are."""
        counts = self.counts(targets)  # each region's sum a whole count, in float sums of shares (targets._spread)
        exact = self.region_sums(self.density(logits)).round() == self.region_sums(counts).round()  # [N, C, R]
        return {"counts/exact": exact.float().mean(dim=(1, 2)), "counts/all_exact": exact.flatten(1).all(1).float()}

    def decoder_features(self, logits: torch.Tensor) -> tuple[None, None]:
        return None, None

    def tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """The region sums thermometer-coded, a row per channel: ``[N, C, R * K]``."""
        sums = self.region_sums(self.density(logits))  # [N, C, R]
        return torch.sigmoid(4.0 * (sums[..., None] - self.thresholds)).flatten(2)
