"""The grounding head: patch features -> per-patch maps of what the labels say each patch shows.

Trained with ``model.grounding_weight`` (targets from :mod:`vlm.data.grounding`): binary channels
(``box/*``, ``light/*``) with binary cross-entropy, count channels (``centre/*``: how many object
centres fall in the patch) with a Poisson loss, so that the maps summed over an image are expected
object counts. With ``model.grounding_tokens`` the decoder reads the maps too: per patch beside the
encoder's features, and their image totals as one extra token, thermometer-coded (total > 0.5, > 1.5,
...) so that "how many", "more than k" and "is there" are linear read-outs of it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlm.data.grounding import GROUNDING_CHANNELS, GROUNDING_COUNT_CHANNELS

NUM_THRESHOLDS = 10  # totals thermometer-coded at 0.5, 1.5, ..., 9.5
MAX_LOG_COUNT = 4.0  # count logits are log-rates: clamped before exp in the maps (at most e^4 ~ 55 per patch)


class GroundingHead(nn.Module):
    def __init__(self, vision_hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(vision_hidden_size, len(GROUNDING_CHANNELS))
        is_count = torch.tensor([name in GROUNDING_COUNT_CHANNELS for name in GROUNDING_CHANNELS])
        self.register_buffer("is_count", is_count, persistent=False)  # [C]
        self.register_buffer("thresholds", torch.arange(NUM_THRESHOLDS) + 0.5, persistent=False)  # [K]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Patch features ``[N, P, Dv]`` -> logits ``[N, P, C]`` (log-rates for the count channels)."""
        return self.linear(features)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean per-element loss against targets ``[N, P, C]`` (0/1, or counts on the count channels)."""
        logits, targets = logits.float(), targets.float()
        binary = F.binary_cross_entropy_with_logits(logits, targets.clamp(max=1.0), reduction="none")
        counts = F.poisson_nll_loss(logits, targets, log_input=True, full=False, reduction="none")
        return torch.where(self.is_count, counts, binary).mean()

    def maps(self, logits: torch.Tensor) -> torch.Tensor:
        """``[N, P, C]``: probabilities on the binary channels, expected counts on the count channels."""
        return torch.where(self.is_count, logits.clamp(max=MAX_LOG_COUNT).exp(), logits.sigmoid())

    def totals(self, maps: torch.Tensor) -> torch.Tensor:
        """Image totals of the maps, thermometer-coded: ``[N, C * K]`` (soft ``total > k + 0.5``)."""
        totals = maps.sum(dim=1)  # [N, C]
        return torch.sigmoid(4.0 * (totals[..., None] - self.thresholds)).flatten(1)  # [N, C * K]
