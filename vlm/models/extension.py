"""The one interface through which a task adds to the PaliGemma core (:mod:`vlm.models.paligemma`).

The core runs SigLIP -> connector -> Gemma and knows no more of a :class:`VisionExtension` than its three optional
points: it may **adapt** the pixels (a residual added to SigLIP's patch embedding), **read** the encoder's patch
features (features the connector reads beside SigLIP's, image tokens after the connector's, losses) and **learn**
from ``Batch.targets``, built by the transform it declares, its losses weighted by ``loss_weights`` beside the
answer's. Without an extension the model is PaliGemma; an extension's parameters live under ``extension.*``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn


class ExtensionOutput(NamedTuple):
    patch_features: torch.Tensor  # [N, P, patch_width] read by the connector beside SigLIP's (width may be 0)
    tokens: torch.Tensor  # [N, num_tokens, D_text] image tokens after the connector's (may be 0)
    losses: dict[str, torch.Tensor]  # name -> loss, given targets (else empty)


class VisionExtension(nn.Module):
    """The contract; a subclass sets ``patch_width``, ``num_tokens`` and ``loss_weights`` in its ``__init__``."""

    patch_width: int = 0
    num_tokens: int = 0
    loss_weights: dict[str, float]  # the weight of each loss forward() returns, in training's weighted sum

    def targets(self, image_size: int | tuple[int, int], frame_size: tuple[float, float]) -> Any:
        """The transform that builds each image's ``Batch.targets`` from the label frame stored with it (label
        boxes in frames of ``frame_size`` pixels, images of ``image_size``: a side, or ``(H, W)``), or None when
        it learns none."""
        return None

    def adapt(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor | None, Any]:
        """Normalised pixels ``[N, 3, H, W]`` -> a residual ``[N, Dv, h, w]`` for the patch embedding (or None)
        and the state :meth:`forward` receives."""
        return None, None

    def forward(self, patch_features: torch.Tensor, state: Any, targets: torch.Tensor | None) -> ExtensionOutput:
        """SigLIP's patch features ``[N, P, Dv]``, :meth:`adapt`'s state and the batch's targets (or None)."""
        raise NotImplementedError
