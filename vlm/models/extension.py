"""The one interface through which a task adds to the PaliGemma core: **adapt** the pixels, **read** the patch
features, **learn** from ``Batch.targets`` (docs/architecture.md, "Where it departs"); parameters: ``extension.*``."""

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
    reads_targets: bool = False  # it reads Batch.targets when answering too (a probe), not only for its losses

    def targets(self, image_size: int | tuple[int, int], frame_size: tuple[float, float]) -> Any:
        """The transform that builds each image's ``Batch.targets`` from the label frame stored with it (boxes in
        frames of ``frame_size`` pixels, images of ``image_size``: a side, or ``(H, W)``); None: it learns none."""
        return None

    def adapt(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor | None, Any]:
        """Normalised pixels ``[N, 3, H, W]`` -> a residual ``[N, Dv, h, w]`` for the patch embedding (or None)
        and the state :meth:`forward` receives."""
        return None, None

    def forward(self, patch_features: torch.Tensor, state: Any, targets: torch.Tensor | None) -> ExtensionOutput:
        """SigLIP's patch features ``[N, P, Dv]``, :meth:`adapt`'s state and the batch's targets (or None)."""
        raise NotImplementedError
