"""The traffic perception beside the PaliGemma core, plugged in through
:class:`vlm.models.extension.VisionExtension` (the core never imports it): a conv stem (:mod:`.stem`), heads
(:mod:`.heads`, one file each, learning the maps of :mod:`.targets`) and what of them reaches the decoder
(``to_decoder``). What each part does and why: docs/architecture.md ("Where it departs from PaliGemma", points 1 to
3); adding a head: its worked example."""

from dataclasses import dataclass, field
from numbers import Real

import torch
from torch import nn

from vlm.config import check
from vlm.models.extension import ExtensionOutput, VisionExtension
from vlm.models.perception.heads import HEADS, AuxiliaryHead
from vlm.models.perception.stem import PYRAMID_WIDTH, ConvStem, StemPyramid
from vlm.models.perception.targets import TargetTransform
from vlm.models.siglip import SiglipVisionConfig


@dataclass
class PerceptionConfig:
    stem_channels: list[int] = field(default_factory=list)  # a stride-2 stage each (2**len = patch size); [] = none
    heads: dict[str, float] = field(default_factory=dict)  # head name -> weight of its loss in training; 0 = off
    fine_stride: int = 4  # image pixels per cell of the stem's fine map that the centres and counts heads read
    to_decoder: bool = False  # the decoder reads the heads' maps per patch and their summaries as one more token
    # probe: the decoder reads the label maps, not the heads' predictions (which still learn): perfect perception
    oracle: bool = False
    # in training the decoder reads the label maps, as the oracle does; answering, the heads' predictions: it learns
    # what each map means from exact maps, and on real frames trusts what the heads see (docs/experiments.md)
    label_maps_in_training: bool = False
    # in evaluation, the heads that allow it (the counts head) predict the mean of the image's maps and its mirror
    # image's, mirrored back: one more pass of the stem and the fine map per image, none in training
    mirror_average: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.stem_channels or self.active_heads)

    @property
    def active_heads(self) -> list[str]:
        """The heads on, in the order params.yaml lists them."""
        return [name for name, weight in self.heads.items() if weight]

    def validate(self, prefix: str = "model.perception", patch_size: int | None = None) -> None:
        """``patch_size``: the encoder's (None when the section is read on its own)."""
        check(all(isinstance(c, int) and c > 0 for c in self.stem_channels), f"{prefix}.stem_channels",
              f"must be positive channel counts, got {self.stem_channels}")
        if self.stem_channels and patch_size is not None:
            check(2 ** len(self.stem_channels) == patch_size, f"{prefix}.stem_channels",
                  f"{len(self.stem_channels)} stride-2 stages reduce by {2 ** len(self.stem_channels)}, not by the "
                  f"patch size ({patch_size}); give log2(patch_size) channel counts or none")
        check(isinstance(self.fine_stride, int) and self.fine_stride >= 2
              and self.fine_stride & (self.fine_stride - 1) == 0, f"{prefix}.fine_stride",
              f"must be a power of two >= 2 (a stem stage's stride), got {self.fine_stride!r}")
        for name, weight in self.heads.items():
            check(name in HEADS, f"{prefix}.heads.{name}", f"unknown head (known: {', '.join(HEADS)})")
            check(isinstance(weight, Real) and not isinstance(weight, bool) and weight >= 0,
                  f"{prefix}.heads.{name}", f"must be a loss weight >= 0 (0 = off), got {weight!r}")
        check(not self.to_decoder or self.active_heads, f"{prefix}.to_decoder",
              f"needs a head ({prefix}.heads: {', '.join(HEADS)})")
        check(not self.label_maps_in_training or self.to_decoder, f"{prefix}.label_maps_in_training",
              f"replaces what the decoder reads of the heads in training: needs {prefix}.to_decoder: true")
        check(not self.oracle or self.to_decoder, f"{prefix}.oracle",
              f"replaces what the decoder reads of the heads: needs {prefix}.to_decoder: true")
        check(not self.mirror_average or any(HEADS[name].mirror_averaged for name in self.active_heads),
              f"{prefix}.mirror_average", "needs a head that averages over the mirror image (counts)")
        for name in self.active_heads:
            HEADS[name].validate(self, prefix)


class TrafficPerception(VisionExtension):
    def __init__(self, config: PerceptionConfig, vision: SiglipVisionConfig, text_hidden_size: int):
        super().__init__()
        config.validate(patch_size=vision.patch_size)
        self.config = config
        self.stem = ConvStem(vision.num_channels, config.stem_channels, vision.hidden_size) \
            if config.stem_channels else None
        # the fine map of the stem's stages (stride fine_stride), computed once for every head that reads it
        self.pyramid = StemPyramid(config.stem_channels, PYRAMID_WIDTH, config.fine_stride) \
            if any(HEADS[name].reads_fine for name in config.active_heads) else None
        self.heads = nn.ModuleDict({name: HEADS[name](config, vision) for name in config.active_heads})
        self.loss_weights = {name: float(config.heads[name]) for name in config.active_heads}
        self.reads_targets = config.oracle
        heads = list(self.heads.values()) if config.to_decoder else []
        self.patch_width = sum(head.patch_width for head in heads)
        num_token_features = sum(head.num_token_features for head in heads)
        self.token_projector = nn.Linear(num_token_features, text_hidden_size) if num_token_features else None
        self.head_tokens = nn.ModuleDict({head.name: HeadTokens(*head.token_shape, text_hidden_size)
                                          for head in heads if head.token_shape is not None})
        self.num_tokens = int(self.token_projector is not None) + sum(t.num for t in self.head_tokens.values())
        self.text_hidden_size = text_hidden_size

    def targets(self, image_size: int | tuple[int, int], frame_size: tuple[float, float]) -> TargetTransform | None:
        """The transform that builds what the heads learn, at the finest grid any of them reads, for images of
        ``image_size`` (a side, or ``(H, W)``) from label boxes in ``frame_size`` frames; None without heads."""
        if not self.heads:
            return None
        stride = min(head.target_stride for head in self.heads.values())
        grid = image_size // stride if isinstance(image_size, int) else (image_size[0] // stride,
                                                                          image_size[1] // stride)
        return TargetTransform(grid, frame_size)

    @property
    def mirrors(self) -> bool:
        """Whether this pass averages the ``mirror_averaged`` heads over the image and its mirror image."""
        return self.config.mirror_average and not self.training  # validate: a mirror_averaged head is on

    def adapt(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor | None, tuple | None]:
        """-> the stem's output ``[N, Dv, h, w]`` and the state :meth:`forward` reads: the stem's stage outputs, and
        when :attr:`mirrors` those of the mirror image (else None); (None, None) without a stem."""
        if self.stem is None:
            return None, None
        residual, stages = self.stem(pixel_values)
        return residual, (stages, self.stem(pixel_values.flip(-1))[1] if self.mirrors else None)

    def head_logits(self, patch_features: torch.Tensor, state: tuple | None) -> dict[str, torch.Tensor]:
        """Each head's logits from the patch features ``[N, P, Dv]`` and :meth:`adapt`'s state."""
        stages, mirrored = (None, None) if state is None else state
        fine = None if self.pyramid is None else self.pyramid(stages)  # [N, PYRAMID_WIDTH, H/f, W/f]
        logits = {name: head(patch_features, fine) for name, head in self.heads.items()}
        if mirrored is not None:
            fine = self.pyramid(mirrored)  # of the mirror image
            logits.update({name: head.average_mirrored(logits[name], head(patch_features, fine))
                           for name, head in self.heads.items() if head.mirror_averaged})
        return logits

    def forward(self, patch_features: torch.Tensor, state: tuple | None,
                targets: torch.Tensor | None) -> ExtensionOutput:
        """``patch_features`` ``[N, P, Dv]``, :meth:`adapt`'s state, ``targets`` ``[N, Gh*Gw, C]`` (losses: by
        head)."""
        num, patches, _ = patch_features.shape
        logits = self.head_logits(patch_features, state)
        # what the decoder reads: the predictions, or the labels' maps (``oracle``; in training with
        # ``label_maps_in_training``)
        read = logits
        if self.config.oracle or (self.config.label_maps_in_training and self.training):
            if targets is None:
                key = "oracle" if self.config.oracle else "label_maps_in_training"
                raise ValueError(f"model.perception.{key}: the decoder reads the label maps, and this batch has no "
                                 f"targets (Batch.targets)")
            read = {name: head.oracle(targets).to(patch_features.dtype) for name, head in self.heads.items()}
        maps, summaries = [], []
        if self.config.to_decoder:
            for name, head in self.heads.items():
                patch_maps, summary = head.decoder_features(read[name])
                maps += [] if patch_maps is None else [patch_maps.to(patch_features.dtype)]
                summaries += [] if summary is None else [summary]
        extra_patch_features = torch.cat(maps, dim=-1) if maps else patch_features.new_zeros(num, patches, 0)
        tokens = [patch_features.new_zeros(num, 0, self.text_hidden_size)]
        if self.token_projector is not None:
            tokens.append(self.token_projector(torch.cat(summaries, dim=-1).to(patch_features.dtype))[:, None])
        for name, embed in self.head_tokens.items():
            tokens.append(embed(self.heads[name].tokens(read[name]).to(patch_features.dtype)))  # [N, T_h, D]
        losses = {} if targets is None else {name: head.loss(logits[name], targets)
                                             for name, head in self.heads.items()}
        return ExtensionOutput(extra_patch_features, torch.cat(tokens, dim=1), losses)


@torch.no_grad()
def image_head_logits(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each perception head's logits for uint8 images ``[N, 3, H, W]``, through the core's encoder as the model
    computes them, the decoder left out."""
    extension = model.extension
    pixel_values = torch.addcmul(model.pixel_shift, images.float(), model.pixel_scale)  # [N, 3, H, W]
    residual, state = extension.adapt(pixel_values)
    features = model.vision_tower(pixel_values, patch_residual=residual).last_hidden_state  # [N, P, Dv]
    return extension.head_logits(features, state)


@torch.no_grad()
def head_metrics(model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """The perception heads' own measures per image ``[N]`` (:meth:`AuxiliaryHead.metrics`) for uint8 images
    ``[N, 3, H, W]`` and their targets (:func:`image_head_logits`)."""
    logits = image_head_logits(model, images)
    return {name: values for name, head in model.extension.heads.items()
            for name, values in head.metrics(logits[name], targets).items()}


class HeadTokens(nn.Module):
    """A head's own image tokens ``[N, T, D]``: its features ``[N, T, F]`` projected, plus an embedding per token."""

    def __init__(self, num: int, features: int, hidden_size: int):
        super().__init__()
        self.num = num
        self.projector = nn.Linear(features, hidden_size)
        self.embedding = nn.Parameter(torch.randn(num, hidden_size) * 0.1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.projector(features) + self.embedding


__all__ = ["AuxiliaryHead", "PerceptionConfig", "TargetTransform", "TrafficPerception", "head_metrics",
           "image_head_logits"]
