"""The normalised scene record every downstream stage sees, read from both BDD100K dialects (2018 and det_20;
docs/architecture.md, generate_scenes) by :func:`scene_from_frame` and written as det_20 by :func:`scene_to_frame`."""

import math
from dataclasses import dataclass
from typing import Any

# det_20 detection categories, in the order of the BDD100K documentation.
CATEGORIES = ("pedestrian", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle",
              "traffic light", "traffic sign")
CATEGORY_ALIASES = {"person": "pedestrian", "bike": "bicycle", "motor": "motorcycle"}  # 2018 names -> det_20 names
# Labelled in BDD100K but not part of the det_20 benchmark: skipped, as the official evaluation does.
IGNORED_CATEGORIES = frozenset({"other person", "other vehicle", "trailer"})
# 2018 segmentation-style labels (poly2d only, no box): skipped.
AREA_CATEGORIES = frozenset({"drivable area", "lane", "area/drivable", "area/alternative", "area/unknown"})

# Limits a label file must keep (BDD100K frames have at most a few hundred labels, boxes inside 1280 x 720):
# past them a frame is refused as malformed rather than slowing or overflowing the answer rules.
MAX_LABELS_PER_FRAME = 10_000
MAX_COORDINATE = 100_000.0  # |x|, |y| of a box corner, in pixels

LIGHT_COLORS = ("red", "yellow", "green")
_LIGHT_COLOR_IN = {"r": "red", "red": "red", "y": "yellow", "yellow": "yellow", "g": "green", "green": "green",
                   "na": None, "none": None, "": None}
_LIGHT_COLOR_OUT = {"red": "R", "yellow": "Y", "green": "G", None: "NA"}

UNDEFINED = "undefined"
_ATTRIBUTE_FIELDS = ("weather", "scene", "timeofday")  # a frame's attributes, kept as the Scene fields of those names


class LabelError(ValueError):
    """Malformed labels; the message names the file, the frame and the field."""


@dataclass(frozen=True)
class SceneObject:
    id: str
    category: str  # one of CATEGORIES
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels
    occluded: bool | None = False  # None: the label does not say (no ``occluded`` attribute)
    truncated: bool = False
    light_color: str | None = None  # "red" | "yellow" | "green" for a lit traffic light, else None
    light_labelled: bool = True  # False for a traffic light whose label gives no colour (not even NA)

    @property
    def center_x(self) -> float:
        return (self.box[0] + self.box[2]) / 2

    @property
    def bottom(self) -> float:
        return self.box[3]

    @property
    def area(self) -> float:
        return (self.box[2] - self.box[0]) * (self.box[3] - self.box[1])


@dataclass(frozen=True)
class Scene:
    name: str  # image file name, e.g. "000123.jpg"
    weather: str = UNDEFINED  # clear | rainy | foggy | overcast | snowy | partly cloudy | undefined
    scene: str = UNDEFINED  # city street | highway | residential | ... | undefined
    timeofday: str = UNDEFINED  # daytime | dawn/dusk | night | undefined
    objects: tuple[SceneObject, ...] = ()

    @property
    def image_id(self) -> str:
        return self.name.rsplit(".", 1)[0]


def _attributes(container: dict, where: str) -> dict:
    """The ``attributes`` object of a frame or label (absent or null: empty), its keys in lower case."""
    attributes = container.get("attributes") or {}
    if not isinstance(attributes, dict):
        raise LabelError(f"{where}.attributes: must be an object")
    return {str(k).lower(): v for k, v in attributes.items()}


def _as_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise LabelError(f"{where}: expected true/false, got {value!r}")


def _object_from_label(label: Any, where: str) -> SceneObject | None:
    if not isinstance(label, dict):
        raise LabelError(f"{where}: a label must be an object, got {type(label).__name__}")
    category = label.get("category")
    if not isinstance(category, str):
        raise LabelError(f"{where}.category: missing or not a string")
    category = category.strip().lower()
    if category in IGNORED_CATEGORIES or category in AREA_CATEGORIES:
        return None
    category = CATEGORY_ALIASES.get(category, category)
    if category not in CATEGORIES:
        raise LabelError(f"{where}.category: unknown category {label['category']!r} "
                         f"(expected one of {', '.join(CATEGORIES)})")
    box = label.get("box2d")
    if not isinstance(box, dict):
        raise LabelError(f"{where}.box2d: missing for a {category!r} label")
    coords = []
    for key in ("x1", "y1", "x2", "y2"):
        v = box.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise LabelError(f"{where}.box2d.{key}: expected a finite number, got {v!r}")
        if abs(v) > MAX_COORDINATE:
            raise LabelError(f"{where}.box2d.{key}: {v!r} is outside +-{MAX_COORDINATE:g} pixels")
        coords.append(round(float(v), 3))  # 1/1000 px, the precision scene_to_frame writes
    x1, y1, x2, y2 = coords
    if x2 < x1 or y2 < y1:
        raise LabelError(f"{where}.box2d: x2 < x1 or y2 < y1 ({x1}, {y1}, {x2}, {y2})")
    attributes = _attributes(label, where)
    color_raw = attributes.get("trafficlightcolor", "NA")
    color_key = str(color_raw).strip().lower() if color_raw is not None else "na"
    if color_key not in _LIGHT_COLOR_IN:
        raise LabelError(f"{where}.attributes.trafficLightColor: unknown colour {color_raw!r}")
    light = category == "traffic light"
    occluded = attributes.get("occluded")
    return SceneObject(id=str(label.get("id", "")), category=category, box=(x1, y1, x2, y2),
                       occluded=None if occluded is None else _as_bool(occluded, f"{where}.attributes.occluded"),
                       truncated=_as_bool(attributes.get("truncated", False), f"{where}.attributes.truncated"),
                       light_color=_LIGHT_COLOR_IN[color_key] if light else None,
                       light_labelled=not light or "trafficlightcolor" in attributes)


def unanswerable(frame: dict) -> str | None:
    """Why the labels of ``frame`` (one :func:`scene_from_frame` has read) cannot decide every answer, or None:
    ``unlabelled`` (``labels`` null or absent: a frame BDD100K did not annotate, not an empty street, which is
    ``labels: []``), ``ignored_regions`` (a box of an ignored category: a person or vehicle is there that no question
    may count or miss) or ``crowd`` (a ``crowd: true`` box, one box for a group, which no count can be read from)."""
    labels = frame.get("labels")
    if labels is None:
        return "unlabelled"
    if any(label["category"].strip().lower() in IGNORED_CATEGORIES for label in labels):
        return "ignored_regions"
    if any(_attributes(label, "").get("crowd") in (True, 1) for label in labels):
        return "crowd"
    return None


def scene_from_frame(frame: Any, where: str = "frame") -> Scene:
    """Normalise one BDD100K frame (2018 or det_20 dialect) into a :class:`Scene`."""
    if not isinstance(frame, dict):
        raise LabelError(f"{where}: a frame must be an object, got {type(frame).__name__}")
    name = frame.get("name")
    if not isinstance(name, str) or not name:
        raise LabelError(f"{where}.name: missing or not a string")
    if name in (".", "..") or any(ch in name for ch in "/\\") or not name.isprintable():
        raise LabelError(f"{where}.name: {name!r} is not a plain file name")
    where = f"{where} ({name})"
    attributes = _attributes(frame, where)
    for key in _ATTRIBUTE_FIELDS:
        if not isinstance(attributes.get(key) or "", str):
            raise LabelError(f"{where}.attributes.{key}: expected a string, got {attributes[key]!r}")
    labels = [] if frame.get("labels") is None else frame["labels"]
    if not isinstance(labels, list):
        raise LabelError(f"{where}.labels: must be a list or null")
    if len(labels) > MAX_LABELS_PER_FRAME:
        raise LabelError(f"{where}.labels: {len(labels):,} labels, more than the {MAX_LABELS_PER_FRAME:,} a frame "
                         "may have")
    objects = [_object_from_label(label, f"{where}.labels[{i}]") for i, label in enumerate(labels)]
    return Scene(name=name, objects=tuple(obj for obj in objects if obj is not None),
                 **{key: str(attributes.get(key) or UNDEFINED).lower() for key in _ATTRIBUTE_FIELDS})


def _label_attributes(obj: SceneObject) -> dict:
    """A label's attributes as det_20 writes them; what the label did not say stays unsaid."""
    attributes = {"occluded": obj.occluded, "truncated": obj.truncated,
                  "trafficLightColor": _LIGHT_COLOR_OUT[obj.light_color]}
    if obj.occluded is None:
        del attributes["occluded"]
    if not obj.light_labelled:
        del attributes["trafficLightColor"]
    return attributes


def scene_to_frame(scene: Scene) -> dict:
    """Serialise a scene as a BDD100K det_20 frame (boxes rounded to 1/1000 px)."""
    labels = [{"id": obj.id, "category": obj.category, "attributes": _label_attributes(obj),
               "box2d": dict(zip(("x1", "y1", "x2", "y2"), (round(v, 3) for v in obj.box)))}
              for obj in scene.objects]
    return {"name": scene.name, "attributes": {key: getattr(scene, key) for key in _ATTRIBUTE_FIELDS}, "labels": labels}
