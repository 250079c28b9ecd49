"""The contract every perception head implements, and the registry a head joins by subclassing."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from vlm.config import check
from vlm.models.siglip import SiglipVisionConfig

if TYPE_CHECKING:
    from vlm.models.perception import PerceptionConfig

HEADS: dict[str, type[AuxiliaryHead]] = {}  # name (its key under model.perception.heads) -> head class
# The oracle's logits (model.perception.oracle): +-SURE for a label that is 1 or 0 (sigmoid(20) = 1 - 2e-9), and the
# log of a count, NONE in place of a count of 0 (exp(log 1e-6): nothing there)
SURE = 20.0
NONE = 1e-6


class AuxiliaryHead(nn.Module):
    """One head (the contract: docs/architecture.md, departure 2): it reads the patch features, or with ``reads_fine``
    the stem's fine map (:class:`~vlm.models.perception.stem.StemPyramid`; its stride f is
    ``model.perception.fine_stride``, 4 by default), and learns target maps. A subclass names
    itself, joining :data:`HEADS`, and sets the fields below (``reads_fine``: ``target_stride``, ``grid`` set here)."""

    name: ClassVar[str]  # its key under model.perception.heads
    reads_fine: ClassVar[bool] = False
    # with model.perception.mirror_average, in evaluation: its logits averaged with the mirror image's
    # (average_mirrored; only for a head that reads the fine map alone)
    mirror_averaged: ClassVar[bool] = False
    target_stride: int  # image pixels per cell of the targets it reads
    patch_width: int = 0  # the per-patch maps decoder_features() gives the connector
    num_token_features: int = 0  # the width of the image summary it gives the shared extra token
    token_shape: tuple[int, int] | None = None  # image tokens of its own: T tokens of F features (tokens())

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.mirror_averaged and not cls.reads_fine:
            raise TypeError(f"{cls.__name__}: mirror_averaged needs reads_fine (the mirror image's fine map is what "
                            "it averages over)")
        HEADS[cls.name] = cls

    def __init__(self, config: PerceptionConfig, vision: SiglipVisionConfig):
        super().__init__()
        if self.reads_fine:
            rows, columns = vision.height_width
            self.target_stride = config.fine_stride
            self.grid = (rows // self.target_stride, columns // self.target_stride)  # the fine map's cells

    @classmethod
    def validate(cls, config: PerceptionConfig, prefix: str) -> None:
        """Raise a ``ParamError`` naming the key when ``config`` cannot give this head what it reads."""
        if cls.reads_fine:
            stages = config.fine_stride.bit_length()  # up to the stride-2f stage (stage i has stride 2**(i+1))
            check(len(config.stem_channels) >= stages, f"{prefix}.heads.{cls.name}",
                  f"needs a conv stem of at least {stages} stages at {prefix}.fine_stride "
                  f"{config.fine_stride} ({prefix}.stem_channels), got {config.stem_channels}")

    def forward(self, patch_features: torch.Tensor, fine_features: torch.Tensor | None) -> torch.Tensor:
        """Patch features ``[N, P, Dv]`` and, with ``reads_fine``, the fine map (else None) -> the head's logits."""
        raise NotImplementedError

    def average_mirrored(self, logits: torch.Tensor, mirrored: torch.Tensor) -> torch.Tensor:
        """With ``mirror_averaged``: the logits of an image and those of its mirror image, both ``[N, cells, C]``
        (row-major cells of ``grid``), as one prediction for the image."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Against all target channels ``[N, G*G, C]``."""
        raise NotImplementedError

    def oracle(self, targets: torch.Tensor) -> torch.Tensor:
        """The logits that say exactly what targets ``[N, cells, C]`` say: what ``model.perception.oracle`` reads."""
        raise NotImplementedError

    def decoder_features(self, logits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """-> per-patch maps ``[N, P, patch_width]`` and an image summary ``[N, num_token_features]``."""
        raise NotImplementedError

    def tokens(self, logits: torch.Tensor) -> torch.Tensor:
        """-> the features of the head's own image tokens ``[N, *token_shape]`` (with ``token_shape``)."""
        raise NotImplementedError

    def metrics(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-image measures ``[N]`` against targets ``[N, G*G, C]``, the decoder left out; none by default."""
        return {}
