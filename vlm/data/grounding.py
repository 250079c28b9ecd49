"""Grounding targets: what each image patch shows, from the same labels that answer the questions.

The question-answer loss alone reaches the vision encoder as a weak, indirect signal; a from-scratch
encoder then learns where the objects are far too slowly. The labels behind every answer also say,
for each patch of the encoder's grid, which categories cover it, where each object's centre lies,
which colour a readable traffic light there shows and whether an occluded object is there.
Predicting these per patch (the auxiliary heads, :mod:`vlm.models.heads`) trains the encoder densely;
the answers still come only from the decoder (which may read the predicted maps: ``model.heads.to_decoder``).

Channels of a target map ``[G*G, C]`` (row-major patches, C = ``len(GROUNDING_CHANNELS)``):
``box/{category}`` (1 where the patch overlaps a box of that category), ``centre/{category}`` (how many
box centres of that category fall in the patch: a count, as neighbouring objects share patches),
``light/{colour}`` (1 where the patch overlaps a readable light of that colour), ``occluded`` (1 where
the patch overlaps the box of an object labelled occluded: the safety rule's "maybe"), ``heat/{category}``
(CenterNet's object-centre heatmap: 1 in the cell of each box centre, a Gaussian of a sixth of the box's
smaller side around it, the maximum where objects meet), ``foot/{group}`` (the same around the bottom-centre
of the boxes of road users, of pedestrians and riders, and of occluded road users: where the safety rule
looks) and, last, ``frame/{attribute}`` (night, rain,
fog, highway: 1 or 0 as the scene questions' answer, -1 where the labels leave it undefined), the same
in every patch: the head predicts these once per image. The grid may be finer than the encoder's patch
grid (``model.heads.centres``: the heatmaps at a quarter of the image size); the grounding head then
pools the patch channels to its grid (``GroundingHead.patch_targets``).

The heads never import the rules: :func:`head_layout` hands them the channel names and the regions in
which the object-centre head counts peaks, and the model config stores them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vlm.commands import rules
from vlm.scenes.schema import CATEGORIES, LIGHT_COLORS, Scene, scene_from_frame

PATCH_CHANNELS = (*(f"box/{c}" for c in CATEGORIES), *(f"centre/{c}" for c in CATEGORIES),
                  *(f"light/{c}" for c in LIGHT_COLORS), "occluded")  # what the grounding head maps per patch
# Object-centre heatmaps (vlm.models.centres) per category, then footpoint heatmaps (the bottom-centre of
# a box, where the safety rule looks) of road users, of pedestrians and riders, and of occluded road users.
FOOT_GROUPS = ("road_user", "vulnerable", "occluded")
HEAT_CHANNELS = (*(f"heat/{c}" for c in CATEGORIES), *(f"foot/{g}" for g in FOOT_GROUPS))
FRAME_CHANNELS = tuple(f"frame/{a}" for a in rules.FRAME_ATTRIBUTES)  # image-level
GROUNDING_CHANNELS = (*PATCH_CHANNELS, *HEAT_CHANNELS, *FRAME_CHANNELS)
_HEAT = len(PATCH_CHANNELS)  # index of the first heatmap channel
# Regions (x from, x to, y from; fractions of the image) in which the object-centre head counts peaks: for
# the object centres the image and its left and right thirds ("on the left side"), for the footpoints the
# near part of each manoeuvre's path (the safety rule's bands, bottom below PATH_MIN_Y).
CENTRE_REGIONS = ((0.0, 1.0, 0.0), *((lo, hi, 0.0) for lo, hi in rules.SIDES.values()))
FOOT_REGIONS = tuple((lo, hi, rules.PATH_MIN_Y) for lo, hi in rules.PATHS.values())


def head_layout() -> dict[str, list]:
    """What the auxiliary heads need to know of the targets (``model.heads``' data-given fields)."""
    return {"channels": list(GROUNDING_CHANNELS), "centre_regions": [list(r) for r in CENTRE_REGIONS],
            "foot_regions": [list(r) for r in FOOT_REGIONS]}


@dataclass(frozen=True)
class HeadTargets:
    """The targets a model's heads learn: ``grid`` x ``grid`` cells (``VisionHeads.target_grid``), label
    boxes given in frames of ``frame_size`` (width, height) pixels."""

    grid: int
    frame_size: tuple[float, float]

    @property
    def bytes_per_image(self) -> int:
        """What one image's targets take in RAM (float32 ``[grid*grid, C]``)."""
        return self.grid * self.grid * len(GROUNDING_CHANNELS) * 4

    def of(self, annotation: str, where: str) -> np.ndarray:
        """float32 ``[grid*grid, C]`` of one label frame stored beside a packed image (a JSON string)."""
        return grounding_targets(scene_from_frame(json.loads(annotation), where=where), *self.frame_size, self.grid)

    def from_annotations(self, annotations: Sequence[str], source: str) -> np.ndarray:
        """float32 ``[N, grid*grid, C]`` of the label frames ``annotations``; errors name ``source``, their file."""
        out = np.zeros((len(annotations), self.grid * self.grid, len(GROUNDING_CHANNELS)), dtype=np.float32)
        for i, annotation in enumerate(annotations):
            out[i] = self.of(annotation, where=f"{source}: annotation[{i}]")
        return out

    @staticmethod
    def check(annotations: Sequence[str], source: str) -> None:
        """Raise the reader's error, naming ``source`` (the file they come from), for the first label frame in
        ``annotations`` that is not a valid scene."""
        for i, annotation in enumerate(annotations):
            scene_from_frame(json.loads(annotation), where=f"{source}: annotation[{i}]")

    def mirror(self, targets: np.ndarray) -> np.ndarray:
        """The targets of the horizontally flipped image: cell columns reversed, ``[G*G, C]``."""
        return targets.reshape(self.grid, self.grid, -1)[:, ::-1].reshape(self.grid * self.grid, -1)


def grounding_targets(scene: Scene, width: float, height: float, grid: int) -> np.ndarray:
    """float32 ``[grid*grid, C]`` targets of one scene whose frame is ``width`` x ``height`` pixels."""
    targets = np.zeros((grid, grid, len(GROUNDING_CHANNELS)), dtype=np.float32)  # [G, G, C]
    num = len(CATEGORIES)

    def cell(value: float, size: float) -> int:
        return min(grid - 1, max(0, int(value / size * grid)))

    for obj in scene.objects:
        x1, y1, x2, y2 = obj.box
        c0, c1, r0, r1 = cell(x1, width), cell(x2, width), cell(y1, height), cell(y2, height)
        k = CATEGORIES.index(obj.category)
        targets[r0:r1 + 1, c0:c1 + 1, k] = 1
        targets[cell((y1 + y2) / 2, height), cell((x1 + x2) / 2, width), num + k] += 1
        if obj.light_color and not obj.occluded:  # the lights the answer rules can read
            targets[r0:r1 + 1, c0:c1 + 1, 2 * num + LIGHT_COLORS.index(obj.light_color)] = 1
        if obj.occluded:
            targets[r0:r1 + 1, c0:c1 + 1, GROUNDING_CHANNELS.index("occluded")] = 1
        sigma = max(0.5, min((x2 - x1) / width, (y2 - y1) / height) * grid / 6)  # in cells
        _splat(targets[:, :, _HEAT + k], (x1 + x2) / 2 / width * grid, (y1 + y2) / 2 / height * grid, sigma)
        road_user = obj.category in rules.ROAD_USERS
        in_group = {"road_user": road_user, "vulnerable": obj.category in rules.VULNERABLE,
                    "occluded": road_user and obj.occluded}
        for index, group in enumerate(FOOT_GROUPS, start=_HEAT + len(CATEGORIES)):
            if in_group[group]:
                _splat(targets[:, :, index], (x1 + x2) / 2 / width * grid, y2 / height * grid, sigma)
    for k, attribute in enumerate(rules.FRAME_ATTRIBUTES, start=len(GROUNDING_CHANNELS) - len(FRAME_CHANNELS)):
        answer = rules.scene_attribute(scene, attribute)
        targets[:, :, k] = -1 if answer is None else float(answer == rules.YES)
    return targets.reshape(grid * grid, -1)


def _splat(heat: np.ndarray, x: float, y: float, sigma: float) -> None:
    """Draws into ``heat`` ``[G, G]`` (in place, keeping the maximum) a Gaussian around the point ``(x, y)``
    in cells, and 1 in the point's cell."""
    grid = heat.shape[0]
    cells = np.arange(grid) + 0.5
    np.maximum(heat, np.exp(-((cells[None, :] - x) ** 2 + (cells[:, None] - y) ** 2) / (2 * sigma ** 2)), out=heat)
    heat[min(grid - 1, max(0, int(y))), min(grid - 1, max(0, int(x)))] = 1
