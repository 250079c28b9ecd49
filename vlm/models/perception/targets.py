"""The target schema: what each cell of an image shows, from the labels that answer the questions (why:
docs/architecture.md, departure 2). The channels are named here only, by :data:`GROUPS` (a group's content: its
comment); a head reads its groups with :func:`channels`. :class:`TargetTransform` builds them at the finest grid the
enabled heads declare from the label frame stored beside each packed image: ``Batch.targets`` ``[N_img, Gh*Gw, C]``."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from itertools import accumulate, chain

import numpy as np
import torch

from vlm.commands.rules import (
    FRAME_ATTRIBUTES,
    PATH_MIN_Y,
    PATHS,
    ROAD_USERS,
    SIDES,
    VULNERABLE,
    YES,
    ground_y,
    readable,
    scene_attribute,
)
from vlm.scenes.schema import CATEGORIES, LIGHT_COLORS, Scene, scene_from_frame

FOOT_GROUPS = ("road_user", "vulnerable", "occluded")
GROUPS: dict[str, tuple[str, ...]] = {
    "box": tuple(f"box/{c}" for c in CATEGORIES),  # 1 where the cell overlaps a box of that category
    "centre": tuple(f"centre/{c}" for c in CATEGORIES),  # box centres per cell, each shared with a neighbour (_spread)
    "light": tuple(f"light/{c}" for c in LIGHT_COLORS),  # 1 where the cell overlaps a readable light of that colour
    "occluded": ("occluded",),  # 1 where the cell overlaps an object labelled occluded (the safety rule's "maybe")
    "heat": tuple(f"heat/{c}" for c in CATEGORIES),  # CenterNet's centre heatmap (_splat), the maximum where they meet
    "foot": tuple(f"foot/{g}" for g in FOOT_GROUPS),  # the same around bottom-centres, where the safety rule looks
    "feet": tuple(f"feet/{g}" for g in FOOT_GROUPS),  # those bottom-centres per cell, shared as the centres are
    "frame": tuple(f"frame/{a}" for a in FRAME_ATTRIBUTES),  # the scene answer 1 / 0 (-1: undefined), every cell
}
CHANNELS = tuple(chain.from_iterable(GROUPS.values()))
START = dict(zip(GROUPS, accumulate((len(g) for g in GROUPS.values()), initial=0)))  # group -> first channel
# Regions (x from, x to, y from; fractions of the image) objects are counted in: centres in the image and its thirds
# ("on the left side"), footpoints in the near part of each manoeuvre's path (the safety rule's bands).
CENTRE_REGIONS = ((0.0, 1.0, 0.0), *((lo, hi, 0.0) for lo, hi in SIDES.values()))
FOOT_REGIONS = tuple((lo, hi, PATH_MIN_Y) for lo, hi in PATHS.values())


def channels(*groups: str) -> slice:
    """The channels of ``groups`` (consecutive in :data:`GROUPS`' order) as a slice of the last target axis."""
    names = list(GROUPS)
    first, last = names.index(groups[0]), names.index(groups[-1])
    if names[first:last + 1] != list(groups):
        raise ValueError(f"target groups {groups} are not consecutive in {names}")
    return slice(START[groups[0]], START[groups[-1]] + len(GROUPS[groups[-1]]))


def region_masks(regions: Sequence[Sequence[tuple[float, float, float]]], grid: tuple[int, int]) -> torch.Tensor:
    """bool ``[C, R, rows, columns]``: which cells of ``grid`` (by their centres) lie in each channel's regions,
    ``regions[c][r]`` = (x from, x to, y from), fractions of the image (:data:`CENTRE_REGIONS`, ``FOOT_REGIONS``)."""
    rows, columns = grid
    ys = (torch.arange(rows) + 0.5) / rows  # [rows] cell centres, 0..1
    xs = (torch.arange(columns) + 0.5) / columns  # [columns]
    bounds = torch.tensor(regions, dtype=torch.float32)  # [C, R, 3]
    x0, x1, y0 = (bounds[..., i, None, None] for i in range(3))  # [C, R, 1, 1]
    return (ys[:, None] >= y0) & (xs[None, :] >= x0) & (xs[None, :] <= x1)


def grid_shape(grid: int | tuple[int, int]) -> tuple[int, int]:
    """``(rows, columns)`` of a grid given as its side (square) or as ``(rows, columns)``."""
    return (grid, grid) if isinstance(grid, int) else (int(grid[0]), int(grid[1]))


@dataclass(frozen=True)
class TargetTransform:
    """The targets on a grid of cells (a side, or ``(rows, columns)``) from label boxes in ``frame_size`` frames."""

    grid: int | tuple[int, int]
    frame_size: tuple[float, float]

    @property
    def num_cells(self) -> int:
        rows, columns = grid_shape(self.grid)
        return rows * columns

    @property
    def bytes_per_image(self) -> int:
        """What one image's targets take in RAM (float32 ``[Gh*Gw, C]``)."""
        return self.num_cells * len(CHANNELS) * 4

    def of(self, annotation: str, where: str) -> np.ndarray:
        """float32 ``[Gh*Gw, C]`` of one label frame stored beside a packed image (a JSON string)."""
        return self.of_scene(scene_from_frame(json.loads(annotation), where=where))

    def of_scene(self, scene: Scene) -> np.ndarray:
        """float32 ``[Gh*Gw, C]`` of one scene's labels."""
        return scene_targets(scene, *self.frame_size, self.grid)

    def from_annotations(self, annotations: Sequence[str], source: str) -> np.ndarray:
        """float32 ``[N, Gh*Gw, C]`` of the label frames ``annotations``; errors name ``source``, their file."""
        out = np.zeros((len(annotations), self.num_cells, len(CHANNELS)), dtype=np.float32)
        for i, annotation in enumerate(annotations):
            out[i] = self.of(annotation, where=f"{source}: annotation[{i}]")
        return out

    @staticmethod
    def check(annotations: Sequence[str], source: str) -> None:
        """The reader's error, naming ``source`` (their file), for the first frame in ``annotations`` not a scene."""
        for i, annotation in enumerate(annotations):
            scene_from_frame(json.loads(annotation), where=f"{source}: annotation[{i}]")

    def mirror(self, targets: np.ndarray) -> np.ndarray:
        """The targets of the horizontally flipped image: cell columns reversed, ``[Gh*Gw, C]``."""
        return targets.reshape(*grid_shape(self.grid), -1)[:, ::-1].reshape(self.num_cells, -1)


def scene_targets(scene: Scene, width: float, height: float, grid: int | tuple[int, int]) -> np.ndarray:
    """float32 ``[Gh*Gw, C]`` targets of a scene whose frame is ``width`` x ``height`` pixels on ``grid``."""
    rows, columns = grid_shape(grid)
    targets = np.zeros((rows, columns, len(CHANNELS)), dtype=np.float32)  # [Gh, Gw, C]

    def cell(value: float, size: float, cells: int) -> int:
        return min(cells - 1, max(0, int(value / size * cells)))

    for obj in scene.objects:
        x1, y1, x2, y2 = obj.box
        c0, c1 = cell(x1, width, columns), cell(x2, width, columns)
        r0, r1 = cell(y1, height, rows), cell(y2, height, rows)
        k = CATEGORIES.index(obj.category)
        targets[r0:r1 + 1, c0:c1 + 1, START["box"] + k] = 1
        centre_x, centre_y = (x1 + x2) / 2 / width * columns, (y1 + y2) / 2 / height * rows  # in cells
        _spread(targets[:, :, START["centre"] + k], centre_x, centre_y, CENTRE_REGIONS)
        if readable(obj):  # the lights the answer rules can read
            targets[r0:r1 + 1, c0:c1 + 1, START["light"] + LIGHT_COLORS.index(obj.light_color)] = 1
        if obj.occluded:
            targets[r0:r1 + 1, c0:c1 + 1, START["occluded"]] = 1
        sigma = max(0.5, min((x2 - x1) / width * columns, (y2 - y1) / height * rows) / 6)  # in cells
        _splat(targets[:, :, START["heat"] + k], centre_x, centre_y, sigma)
        road_user = obj.category in ROAD_USERS
        in_group = {"road_user": road_user, "vulnerable": obj.category in VULNERABLE,
                    "occluded": road_user and bool(obj.occluded)}
        foot_y = ground_y(scene, obj) / height * rows  # in cells
        for index, group in enumerate(FOOT_GROUPS):
            if in_group[group]:
                _splat(targets[:, :, START["foot"] + index], centre_x, foot_y, sigma)
                _spread(targets[:, :, START["feet"] + index], centre_x, foot_y, FOOT_REGIONS)
    for k, attribute in enumerate(FRAME_ATTRIBUTES, start=START["frame"]):
        answer = scene_attribute(scene, attribute)
        targets[:, :, k] = -1 if answer is None else float(answer == YES)
    return targets.reshape(rows * columns, -1)


def _splat(heat: np.ndarray, x: float, y: float, sigma: float) -> None:
    """Draw into ``heat`` ``[Gh, Gw]`` (in place, the maximum kept) a Gaussian around ``(x, y)`` in cells, 1 at it."""
    rows, columns = heat.shape
    xs, ys = np.arange(columns) + 0.5, np.arange(rows) + 0.5  # cell centres
    np.maximum(heat, np.exp(-((xs[None, :] - x) ** 2 + (ys[:, None] - y) ** 2) / (2 * sigma ** 2)), out=heat)
    heat[min(rows - 1, max(0, int(y))), min(columns - 1, max(0, int(x)))] = 1


def _spread(counts: np.ndarray, x: float, y: float, regions: tuple[tuple[float, float, float], ...]) -> None:
    """Add one object at ``(x, y)`` (in cells) to ``counts`` ``[Gh, Gw]`` (in place), split bilinearly between its cell
    and, along each axis, the neighbour it lies towards: its mass moves with it smoothly, not a whole count at a cell's
    edge. Along an axis whose neighbour is off the map or in other ``regions`` than its cell (the regions objects are
    counted in, :data:`CENTRE_REGIONS` or :data:`FOOT_REGIONS`), its mass stays in its cell: every region's sum
    stays the labels' count."""
    rows, columns = counts.shape
    row_regions, column_regions = _cell_regions(regions, rows, columns)
    for r, row_share in _split(y, row_regions):
        for c, column_share in _split(x, column_regions):
            counts[r, c] += row_share * column_share


def _split(position: float, cell_regions: tuple[tuple[bool, ...], ...]) -> list[tuple[int, float]]:
    """A position along one axis, in cells -> (cell, share) pairs: its cell, and the neighbour it lies towards by how
    far it is from its cell's centre (up to 1/2 at the edge) where that neighbour is in the same regions."""
    own = min(len(cell_regions) - 1, max(0, int(position)))
    offset = position - (own + 0.5)
    other = own + (1 if offset > 0 else -1)
    if offset == 0 or not 0 <= other < len(cell_regions) or cell_regions[other] != cell_regions[own]:
        return [(own, 1.0)]
    return [(own, 1.0 - abs(offset)), (other, abs(offset))]


@cache
def _cell_regions(regions: tuple[tuple[float, float, float], ...], rows: int,
                  columns: int) -> tuple[tuple[tuple[bool, ...], ...], tuple[tuple[bool, ...], ...]]:
    """Which of ``regions`` each row and each column of cells lies in, by the cells' centres (as
    :func:`region_masks`): ``([rows][R], [columns][R])``."""
    row_regions = tuple(tuple((r + 0.5) / rows >= y0 for _, _, y0 in regions) for r in range(rows))
    column_regions = tuple(tuple(x0 <= (c + 0.5) / columns <= x1 for x0, x1, _ in regions) for c in range(columns))
    return row_regions, column_regions
