"""Auxiliary vision heads: the task-specific additions to the PaliGemma design, behind one interface.

A head reads the encoder's patch features and its conv stem's stage outputs, predicts dense maps of
what the labels say the image shows, and learns them with an auxiliary loss. The decoder may read
what the heads predict (``to_decoder``): their per-patch maps beside the patch features (the connector's
input grows), and their image summaries as one more image token after the connector's.

Every head implements :class:`AuxiliaryHead`; :class:`VisionHeads` runs the enabled ones with one contract,
``(patch_features, stem_features, targets) -> (extra_patch_features, extra_tokens, aux_loss)``, so the
VLM holds no per-head code. With every head off, ``VisionHeads`` has no parameters and adds nothing:
the model is PaliGemma's (SigLIP -> connector -> Gemma).

The heads never see the question rules: the targets' channel names (``channels``) and the image regions
in which objects are counted come from the data side (:func:`vlm.data.grounding.head_layout`) and are
stored in the model config, so a checkpoint rebuilds its heads on its own.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from vlm.models.heads.base import AuxiliaryHead, HeadsConfig
from vlm.models.heads.centres import CentreHead
from vlm.models.heads.grounding import GroundingHead
from vlm.models.siglip import SiglipVisionConfig

HEADS: dict[str, type[AuxiliaryHead]] = {"grounding": GroundingHead, "centres": CentreHead}


class HeadsOutput(NamedTuple):
    extra_patch_features: torch.Tensor  # [N, P, E] read by the connector beside the patch features (E may be 0)
    extra_tokens: torch.Tensor  # [N, T, D] image tokens after the connector's (T may be 0)
    aux_loss: torch.Tensor | None  # the weighted sum of the heads' losses, given targets and a head


class VisionHeads(nn.Module):
    def __init__(self, config: HeadsConfig, vision: SiglipVisionConfig, text_hidden_size: int):
        super().__init__()
        self.config = config
        self.text_hidden_size = text_hidden_size
        for name in config.enabled:  # heads.grounding.*, heads.centres.*
            self.add_module(name, HEADS[name](config, vision))
        num_token_features = sum(head.num_token_features for _, head in self.items())
        self.token_projector = nn.Linear(num_token_features, text_hidden_size) \
            if config.to_decoder and num_token_features else None

    @staticmethod
    def patch_width(config: HeadsConfig) -> int:
        """Width the connector's input grows by."""
        return sum(HEADS[name].patch_width(config.channels) for name in config.enabled) if config.to_decoder else 0

    def items(self) -> list[tuple[str, AuxiliaryHead]]:
        """The enabled heads, in ``HEADS``' order."""
        return [(name, getattr(self, name)) for name in self.config.enabled]

    def target_grid(self, image_size: int) -> int | None:
        """Cells per side of the targets the heads learn (the finest any head reads); None without heads."""
        if not self.config.enabled:
            return None
        return image_size // min(head.target_stride for _, head in self.items())

    def forward(self, patch_features: torch.Tensor, stem_features: list[torch.Tensor] | None,
                targets: torch.Tensor | None = None) -> HeadsOutput:
        """``patch_features`` ``[N, P, Dv]``, ``stem_features`` (the conv stem's stage outputs), ``targets``
        ``[N, G*G, C]`` (for the loss) -> :class:`HeadsOutput`."""
        num, patches, _ = patch_features.shape
        logits = {name: head(patch_features, stem_features) for name, head in self.items()}
        maps, summaries = [], []
        if self.config.to_decoder:
            for name, head in self.items():
                patch_maps, summary = head.decoder_features(logits[name])
                maps += [] if patch_maps is None else [patch_maps.to(patch_features.dtype)]
                summaries += [] if summary is None else [summary]
        extra_patch_features = torch.cat(maps, dim=-1) if maps else patch_features.new_zeros(num, patches, 0)
        tokens = patch_features.new_zeros(num, 0, self.text_hidden_size)
        if self.token_projector is not None:
            tokens = self.token_projector(torch.cat(summaries, dim=-1).to(patch_features.dtype))[:, None]  # [N, 1, D]
        aux_loss = None
        if targets is not None:
            for name, head in self.items():
                term = head.loss_weight * head.loss(logits[name], targets)
                aux_loss = term if aux_loss is None else aux_loss + term
        return HeadsOutput(extra_patch_features, tokens, aux_loss)
