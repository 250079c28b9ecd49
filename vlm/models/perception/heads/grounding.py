"""The grounding head: patch features -> per-patch maps of what the labels say each patch shows (binary groups: BCE;
``centre`` counts: Poisson; ``frame``: once per image), which the decoder reads per patch, as thermometer-coded totals
and a token per light colour (docs/architecture.md, departures 2 and 3; light tokens: docs/experiments.md)."""

import torch
import torch.nn.functional as F
from torch import nn

from vlm.models.perception.heads.base import HEADS, NONE, SURE, AuxiliaryHead
from vlm.models.perception.stem import PYRAMID_WIDTH
from vlm.models.perception.targets import CHANNELS, GROUPS, channels, grid_shape
from vlm.models.siglip import SiglipVisionConfig

NUM_THRESHOLDS = 10  # totals thermometer-coded at 0.5, 1.5, ..., 9.5
MAX_LOG_COUNT = 4.0  # count logits are log-rates: clamped before exp in the maps (at most e^4 ~ 55 per patch)
FRAME_LOSS_WEIGHT = 0.1  # to the patch loss's scale: else it pulls the encoder off the objects (docs/experiments.md)


class GroundingHead(AuxiliaryHead):
    name = "grounding"

    def __init__(self, config, vision: SiglipVisionConfig):
        super().__init__(config, vision)
        self.target_stride = vision.patch_size
        self.grid = vision.grid  # the patch grid (gh, gw)
        self.patch_channels = channels("box", "centre", "light", "occluded")  # of the targets
        self.frame_channels = channels("frame")
        num_patch = self.patch_channels.stop - self.patch_channels.start
        head_channels = CHANNELS[self.patch_channels] + CHANNELS[self.frame_channels]  # per patch, then per image
        self.patch_width = len(head_channels)  # the maps: the patch channels, then the frame channels
        self.num_token_features = num_patch * NUM_THRESHOLDS  # the patch channels' totals, at every threshold
        self.linear = nn.Linear(vision.hidden_size, num_patch)
        self.frame = nn.Linear(vision.hidden_size, len(head_channels) - num_patch)
        lights = channels("light")
        self.lights = slice(lights.start - self.patch_channels.start, lights.stop - self.patch_channels.start)
        # A lit lamp is a pixel or two of a 16-pixel patch: where the stem's fine map is there (a head reads it), the
        # lights' logits add what a 3x3 convolution sees in it, its highest cell in each patch
        self.fine_lights = nn.Conv2d(PYRAMID_WIDTH, len(GROUPS["light"]), kernel_size=3, padding=1) \
            if any(HEADS[name].reads_fine for name in config.active_heads) else None
        self.fine_per_patch = vision.patch_size // config.fine_stride
        self.token_shape = (len(GROUPS["light"]), 2)  # per colour: its highest probability and its total
        is_count = torch.tensor([name in GROUPS["centre"] for name in head_channels])
        self.register_buffer("is_count", is_count, persistent=False)  # [C_head]
        self.register_buffer("thresholds", torch.arange(NUM_THRESHOLDS) + 0.5, persistent=False)  # [K]

    @property
    def num_patch(self) -> int:
        return self.linear.out_features

    def forward(self, features: torch.Tensor, fine_features: torch.Tensor | None = None) -> torch.Tensor:
        """Patch features ``[N, P, Dv]`` (and the fine map ``[N, W_f, H/f, W/f]``) -> logits ``[N, P, C_head]``: patch
        channels (counts as log-rates), frame."""
        patches = self.linear(features)  # [N, P, C_patch]
        if self.fine_lights is not None and fine_features is not None:
            fine = F.max_pool2d(self.fine_lights(fine_features), self.fine_per_patch)  # [N, 3, gh, gw]
            light = patches[..., self.lights] + fine.flatten(2).transpose(1, 2).to(patches.dtype)  # [N, P, 3]
            patches = torch.cat([patches[..., :self.lights.start], light, patches[..., self.lights.stop:]], dim=-1)
        frame = self.frame(features.mean(dim=1))  # [N, F]
        return torch.cat([patches, frame[:, None].expand(-1, features.shape[1], -1)], dim=-1)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean per-element loss of the patch channels plus mean per-image loss of the frame channels against targets
        ``[N, cells, C]`` (-1: undefined frame channel) on the patch grid or a finer one (pooled to it)."""
        logits, targets = logits.float(), targets.float()
        patch_logits = logits[..., :self.num_patch]  # [N, P, C_patch]
        patch_targets = self.patch_targets(targets, self.grid)  # [N, P, C_patch]
        is_count = self.is_count[:self.num_patch]
        binary = F.binary_cross_entropy_with_logits(patch_logits, patch_targets.clamp(max=1.0), reduction="none")
        counts = F.poisson_nll_loss(patch_logits, patch_targets, log_input=True, full=False, reduction="none")
        frame_logits, frame_targets = logits[:, 0, self.num_patch:], targets[:, 0, self.frame_channels]  # [N, F]
        known = frame_targets >= 0
        frame = F.binary_cross_entropy_with_logits(frame_logits, frame_targets.clamp(min=0.0), reduction="none")
        frame = (frame * known).sum() / known.sum().clamp(min=1)
        return torch.where(is_count, counts, binary).mean() + FRAME_LOSS_WEIGHT * frame

    def patch_targets(self, targets: torch.Tensor, grid: int | tuple[int, int]) -> torch.Tensor:
        """Patch channels of targets ``[N, k*gh * k*gw, C]`` on a grid k times finer than ``grid`` (``(gh, gw)`` or a
        side) -> ``[N, gh*gw, C_patch]``: boxes, lights, occlusion by maximum, centre counts by sum over the patch."""
        num, cells, _ = targets.shape
        rows, columns = grid_shape(grid)
        patch = targets[..., self.patch_channels]
        if cells == rows * columns:
            return patch
        k = round((cells // (rows * columns)) ** 0.5)
        maps = patch.transpose(1, 2).reshape(num, self.num_patch, k * rows, k * columns)  # [N, C_patch, kgh, kgw]
        is_count = self.is_count[:self.num_patch, None, None]
        pooled = torch.where(is_count, F.avg_pool2d(maps, k) * (k * k), F.max_pool2d(maps, k))
        return pooled.flatten(2).transpose(1, 2)  # [N, gh*gw, C_patch]

    def oracle(self, targets: torch.Tensor) -> torch.Tensor:
        """Targets ``[N, cells, C]`` -> logits ``[N, P, C_head]`` of their patch maps (undefined frame channels 0.5)."""
        targets = targets.float()
        patch = self.patch_targets(targets, self.grid)  # [N, P, C_patch]
        patch = torch.where(self.is_count[:self.num_patch], patch.clamp(min=NONE).log(), (2 * patch - 1) * SURE)
        frame = targets[:, :1, self.frame_channels]  # [N, 1, F]: -1 undefined, else 0 / 1
        frame = torch.where(frame >= 0, (2 * frame - 1) * SURE, 0.0).expand(-1, patch.shape[1], -1)
        return torch.cat([patch, frame], dim=-1)

    def maps(self, logits: torch.Tensor) -> torch.Tensor:
        """``[N, P, C]``: probabilities on the binary and frame channels, expected counts on the count channels."""
        return torch.where(self.is_count, logits.clamp(max=MAX_LOG_COUNT).exp(), logits.sigmoid())

    def totals(self, maps: torch.Tensor) -> torch.Tensor:
        """Image totals of the patch maps, thermometer-coded (soft ``total > k + 0.5``): ``[N, C_patch * K]``."""
        totals = maps[..., :self.num_patch].sum(dim=1)  # [N, C_patch]
        return torch.sigmoid(4.0 * (totals[..., None] - self.thresholds)).flatten(1)  # [N, C_patch * K]

    def tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """A token per light colour: the highest probability over the patches and their sum ``[N, 3, 2]``."""
        lights = logits[..., self.lights].float().sigmoid()  # [N, P, 3]
        return torch.stack([lights.amax(dim=1), lights.sum(dim=1)], dim=-1)

    def decoder_features(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The maps per patch ``[N, P, C_head]`` and their totals ``[N, C_patch * K]``."""
        maps = self.maps(logits)
        return maps, self.totals(maps)
