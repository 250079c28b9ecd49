"""The heads' config and the contract every auxiliary head implements (see :mod:`vlm.models.heads`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vlm.params import check

HEAD_NAMES = ("grounding", "centres")  # in this order: parameters, maps and summaries


@dataclass
class HeadsConfig:
    grounding: bool = False  # per-patch maps of boxes, object centres, light colours, occlusion; frame attributes
    centres: bool = False  # CenterNet heatmaps of object centres and footpoints from the conv stem
    loss_weight: float = 0.0  # weight of the heads' summed auxiliary loss in training
    to_decoder: bool = False  # the decoder reads the heads' maps per patch and their summaries as one more token
    # Set from the data (vlm.data.grounding.head_layout), never in params.yaml:
    channels: list[str] = field(default_factory=list)  # the target maps' channels, in order
    centre_regions: list[list[float]] = field(default_factory=list)  # (x0, x1, y0) fractions: centre peaks counted
    foot_regions: list[list[float]] = field(default_factory=list)  # (x0, x1, y0) fractions: footpoint peaks counted

    @property
    def enabled(self) -> list[str]:
        return [name for name in HEAD_NAMES if getattr(self, name)]

    def validate(self, prefix: str = "model.heads", stem_channels: list[int] | None = None) -> None:
        """Every rule between the heads' options, in one place. ``stem_channels``: the encoder's conv stem
        (None: not known yet, when the section is read on its own)."""
        check(self.loss_weight >= 0, f"{prefix}.loss_weight", f"must be >= 0, got {self.loss_weight}")
        if not self.enabled:
            check(not self.to_decoder, f"{prefix}.to_decoder", "needs a head (model.heads.grounding or .centres)")
            return
        check(self.loss_weight > 0, f"{prefix}.loss_weight",
              f"must be > 0 with heads on ({', '.join(self.enabled)}): they learn only from their loss")
        check(bool(self.channels), f"{prefix}.channels", "must name the target channels (set from the data)")
        if self.centres and stem_channels is not None:
            check(len(stem_channels) >= 3, f"{prefix}.centres",
                  f"needs a conv stem of at least 3 stages (model.siglip.stem_channels), got {stem_channels}")
            check(len(self.centre_regions) == len(self.foot_regions) > 0, f"{prefix}.centre_regions",
                  f"must be as many as the foot regions (set from the data), got {len(self.centre_regions)} and "
                  f"{len(self.foot_regions)}")


def channel_slice(channels: list[str], prefixes: tuple[str, ...]) -> slice:
    """The contiguous run of ``channels`` whose names start with one of ``prefixes``."""
    index = [i for i, name in enumerate(channels) if name.startswith(prefixes)]
    if not index or index != list(range(index[0], index[-1] + 1)):
        raise ValueError(f"target channels {prefixes} must be present and contiguous in {channels}")
    return slice(index[0], index[-1] + 1)


class AuxiliaryHead(nn.Module):
    """The contract of one head. ``target_stride``: image pixels per cell of the targets it reads;
    ``num_token_features``: the width of the image summary :meth:`decoder_features` gives the decoder (0: none);
    ``loss_weight``: its share of the heads' loss."""

    target_stride: int
    num_token_features: int = 0
    loss_weight: float = 1.0

    @staticmethod
    def patch_width(channels: list[str]) -> int:
        """Width of the per-patch maps :meth:`decoder_features` gives the connector, from the target channels
        (known before the head is built: the connector is built first)."""
        return 0

    def forward(self, patch_features: torch.Tensor, stem_features: list[torch.Tensor] | None) -> torch.Tensor:
        """-> the head's logits."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Against all target channels ``[N, G*G, C]``."""
        raise NotImplementedError

    def decoder_features(self, logits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """-> per-patch maps ``[N, P, num_patch_features]`` and an image summary ``[N, num_token_features]``."""
        raise NotImplementedError
