"""The linear connector: PaliGemma's multi-modal projector, with optional pixel shuffle (each r x r block of
neighbouring patch features concatenated into one token; r = 1 is PaliGemma's; docs/architecture.md, departure 4)."""

import torch
from torch import nn

from vlm.models.attention import init_weights


def pixel_shuffle(features: torch.Tensor, factor: int, grid: tuple[int, int]) -> torch.Tensor:
    """Patch features ``[N, gh*gw, D]`` (row-major ``grid`` (gh, gw)) -> ``[N, (gh/r)*(gw/r), r*r*D]``."""
    if factor == 1:
        return features
    batch, _, dim = features.shape
    rows, columns = grid[0] // factor, grid[1] // factor
    blocks = features.view(batch, rows, factor, columns, factor, dim)  # [N, gh/r, r, gw/r, r, D]
    blocks = blocks.permute(0, 1, 3, 2, 4, 5)  # [N, gh/r, gw/r, r, r, D]
    return blocks.reshape(batch, rows * columns, factor * factor * dim)


class LinearConnector(nn.Module):
    """Vision features ``[N, P, Dv]`` -> image tokens ``[N, P / r^2, D_text]`` (``multi_modal_projector.linear``)."""

    def __init__(self, vision_hidden_size: int, text_hidden_size: int, grid: tuple[int, int], pixel_shuffle: int = 1):
        super().__init__()
        self.grid = grid  # the patch grid (gh, gw)
        self.pixel_shuffle = pixel_shuffle
        self.linear = nn.Linear(vision_hidden_size * pixel_shuffle * pixel_shuffle, text_hidden_size)
        init_weights(self.linear)

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:
        return self.linear(pixel_shuffle(image_features, self.pixel_shuffle, self.grid))
