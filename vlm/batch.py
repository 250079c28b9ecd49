"""``Batch``: the tensors the loader hands to the model (docs/architecture.md, data path), each distinct image once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

IGNORE_INDEX = -100  # label of positions that carry no loss (HF convention)


@dataclass
class Batch:
    images: torch.Tensor | None  # uint8 [N_img, 3, H, W]; None for a model without vision
    image_index: torch.Tensor  # [B] row of each question's image in `images`
    input_ids: torch.Tensor  # [B, L] [SOS] question [SEP] answer [EOS], right-padded
    attention_mask: torch.Tensor  # [B, L] 1 on tokens, 0 on padding
    prefix_lengths: torch.Tensor  # [B] tokens up to and including [SEP]
    labels: torch.Tensor | None = None  # [B, L] answer tokens, IGNORE_INDEX elsewhere
    targets: torch.Tensor | None = None  # [N_img, Gh*Gw, C] what the perception learns (vlm.models.perception.targets)
    # Per question, for tables and metrics (never moved to a device).
    question_id: list[str] = field(default_factory=list)
    image_id: list[str] = field(default_factory=list)
    command_type: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _map_tensors(self, fn) -> Batch:
        return dataclasses.replace(self, **{f.name: fn(value) for f in dataclasses.fields(self)
                                            if isinstance(value := getattr(self, f.name), torch.Tensor)})

    def to(self, device: torch.device | str) -> Batch:
        return self._map_tensors(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True) in its pinning thread."""
        return self._map_tensors(torch.Tensor.pin_memory)
