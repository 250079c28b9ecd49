"""Reading a real BDD100K labels file and matching it against the images on disk."""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from vlm.io import read_json
from vlm.scenes.schema import LabelError, Scene, scene_from_frame, unanswerable

log = logging.getLogger(__name__)


class MissingImagesError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class ReadReport:
    frames: int  # frames in the labels file
    missing_images: int  # frames whose image is not on disk (skipped when allowed)
    missing_examples: tuple[str, ...]


def read_labels(path: str | os.PathLike) -> tuple[list[Scene], dict[str, int]]:
    """A BDD100K labels JSON (2018 or det_20) as scenes, and how many frames were skipped for each reason of
    :func:`~vlm.scenes.schema.unanswerable` (frames whose labels cannot decide every answer); a malformed label
    raises :class:`LabelError` naming it."""
    path = Path(path)
    frames = read_json(path, what="BDD100K labels file")
    if isinstance(frames, dict) and "frames" in frames:  # scalabel export wrapper
        frames = frames["frames"]
    if not isinstance(frames, list):
        raise LabelError(f"{path}: expected a JSON list of frames, got {type(frames).__name__}")
    scenes: list[Scene] = []  # in the file's order
    names: set[str] = set()
    skipped = {"unlabelled": 0, "ignored_regions": 0, "crowd": 0}
    for i, frame in enumerate(frames):
        try:
            scene = scene_from_frame(frame, where=f"frame[{i}]")
        except LabelError as e:
            raise LabelError(f"{path}: {e}") from None
        if scene.name in names:
            raise LabelError(f"{path}: frame[{i}].name: duplicate image name {scene.name!r}")
        names.add(scene.name)
        reason = unanswerable(frame)
        if reason is None:
            scenes.append(scene)
        else:
            skipped[reason] += 1
    return scenes, skipped


def match_images(scenes: list[Scene], image_dir: str | os.PathLike, on_missing: str = "error",
                 show: int = 5) -> tuple[list[Scene], ReadReport]:
    """Keep the scenes whose image is in ``image_dir``; for the others, ``on_missing``: raise (``"error"``) or skip."""
    image_dir = Path(image_dir)
    if not image_dir.is_dir():
        raise FileNotFoundError(f"BDD100K images folder not found: {image_dir}")
    on_disk = {entry.name for entry in os.scandir(image_dir) if entry.is_file()}
    kept = [s for s in scenes if s.name in on_disk]
    missing = [s.name for s in scenes if s.name not in on_disk]
    report = ReadReport(frames=len(scenes), missing_images=len(missing), missing_examples=tuple(missing[:show]))
    if missing:
        listed = ", ".join(missing[:show]) + (", ..." if len(missing) > show else "")
        message = f"{len(missing)} of {len(scenes)} labelled images are missing from {image_dir}: {listed}"
        if on_missing == "error":
            raise MissingImagesError(message + " (set scenes.bdd100k.on_missing: skip to skip them)")
        log.warning("%s; skipped", message)
    return kept, report
