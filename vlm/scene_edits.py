"""Edits of a rendered scene: one thing changes, the rest of the layout is drawn again as it was (occlusion is
measured again). What each edit does: docs/architecture.md (counterfactuals); one that cannot apply returns None."""

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from vlm.commands import rules
from vlm.commands.templates import ACTIONS
from vlm.scenes.generate import image_name
from vlm.scenes.render import (
    PX_PER_M,
    Camera,
    Layout,
    RenderConfig,
    Thing,
    pedestrian,
    render_layout,
    sample_layout,
    settle_occlusion,
    with_visibility,
)
from vlm.scenes.schema import Scene

REMOVABLE = ("car", "truck", "bus", "pedestrian", "traffic light", "traffic sign")  # no rider/bike pairs
MOVABLE = ("car", "truck", "bus", "pedestrian")
SWITCHED = {"red": "green", "green": "red", "yellow": "red"}


@dataclass
class Rendered:
    """A scene as drawn: its layout, the objects drawn (far to near, with their hidden fraction), pixels, labels."""

    layout: Layout
    settled: list[tuple[Thing, float]]
    image: Image.Image
    scene: Scene


@dataclass
class Pair:
    edit: str
    description: str
    original: Rendered
    edited_image: Image.Image
    edited_scene: Scene
    edited_things: list[Thing] | None  # as drawn (None: the mirror image, drawn by flipping the pixels)


# an edit: the original, its seeded generator, the render config -> (image, labels, things drawn, description) or None
Edit = Callable[[Rendered, np.random.Generator, RenderConfig],
                "tuple[Image.Image, Scene, list[Thing] | None, str] | None"]


def render(seed: np.random.SeedSequence, name: str, config: RenderConfig) -> Rendered:
    layout = sample_layout(np.random.default_rng(seed), config)
    settled = settle_occlusion(layout.things, config.width, config.height, layout.targets)
    return Rendered(layout, settled, *render_layout(layout, settled, name, config))


def _redraw(original: Rendered, things: list[Thing], config: RenderConfig, description: str, **layout_changes
            ) -> tuple[Image.Image, Scene, list[Thing], str]:
    """The original's layout, with ``layout_changes``, drawn with ``things``: an edit's result."""
    layout = dataclasses.replace(original.layout, **layout_changes)
    settled = with_visibility(things, config.width, config.height)
    return (*render_layout(layout, settled, original.scene.name, config), things, description)


def _things(original: Rendered) -> list[Thing]:
    return [thing for thing, _ in original.settled]


def remove_category(original: Rendered, rng: np.random.Generator, config: RenderConfig):
    present = sorted({t.category for t in _things(original)} & set(REMOVABLE))
    if not present:
        return None
    category = present[int(rng.integers(len(present)))]
    kept = [t for t in _things(original) if t.category != category]
    return _redraw(original, kept, config, f"every {category} removed")


def _clear_of(box: tuple[float, float, float, float], things: list[Thing]) -> bool:
    """``box`` meets no other thing's box: placing something there hides nothing and nothing hides it."""
    x1, y1, x2, y2 = box
    return not any(t.box[0] < x2 and t.box[2] > x1 and t.box[1] < y2 and t.box[3] > y1 for t in things)


def add_pedestrian(original: Rendered, rng: np.random.Generator, config: RenderConfig, tries: int = 20):
    """A pedestrian 7 to 12 m ahead in one manoeuvre's band, hiding nothing and hidden by nothing; None if none fits."""
    manoeuvre = ("left", "straight", "right")[int(rng.integers(3))]
    cam = Camera(config.width, config.height, original.layout.horizon, original.layout.vanish_x)
    low, high = rules.PATHS[manoeuvre]
    things = _things(original)
    for _ in range(tries):
        z = float(rng.uniform(7.0, 12.0))
        column = config.width * (low + (high - low) * float(rng.uniform(0.3, 0.7)))
        added = pedestrian(rng, cam, z, (column - cam.vx) / (PX_PER_M * cam.s_of_z(z)))
        if _clear_of(added.box, things):
            return _redraw(original, [*things, added], config, f"a pedestrian in the path to {ACTIONS[manoeuvre]}")
    return None


def switch_light(original: Rendered, rng: np.random.Generator, config: RenderConfig):
    light = rules.governing_light(original.scene)
    if light is None:
        return None
    old, new = light.light_color, SWITCHED[light.light_color]
    things = [dataclasses.replace(t, light_color=new) if t.category == "traffic light" and t.light_color == old else t
              for t in _things(original)]
    return _redraw(original, things, config, f"the {old} light switched to {new}")


def move_left_to_right(original: Rendered, rng: np.random.Generator, config: RenderConfig):
    """A car, truck, bus or pedestrian of the left third moves to the mirrored column if it meets no other box there."""
    things = _things(original)
    movable = []
    for t in things:
        centre = (t.box[0] + t.box[2]) / 2
        if t.category in MOVABLE and t.group < 0 and centre < config.width / 3:
            shift = config.width - 2 * centre  # centre x -> width - centre x
            box = (t.box[0] + shift, t.box[1], t.box[2] + shift, t.box[3])
            if _clear_of(box, [o for o in things if o is not t]):
                movable.append((t, box))
    if not movable:
        return None
    moved, box = movable[int(rng.integers(len(movable)))]
    moved_things = [dataclasses.replace(t, box=box) if t is moved else t for t in things]
    return _redraw(original, moved_things, config, f"a {moved.category} moved from the left third to the right")


def night_to_day(original: Rendered, rng: np.random.Generator, config: RenderConfig):
    if original.layout.timeofday != "night":
        return None
    things = [dataclasses.replace(t, style={**t.style, "lights_on": False}) if "lights_on" in t.style else t
              for t in _things(original)]  # a vehicle's lamps are on at night
    camera = {**original.layout.decor["camera"], "bloom": 0.0}  # no glare by day
    return _redraw(original, things, config, "night turned to day", timeofday="daytime",
                   decor={**original.layout.decor, "camera": camera})


def toggle_fog(original: Rendered, rng: np.random.Generator, config: RenderConfig):
    weather = {"clear": "foggy", "foggy": "clear"}.get(original.layout.weather)
    if weather is None:
        return None
    return _redraw(original, _things(original), config, f"{original.layout.weather} turned {weather}", weather=weather)


def mirror(original: Rendered, rng: np.random.Generator, config: RenderConfig):
    objects = tuple(dataclasses.replace(o, box=(config.width - o.box[2], o.box[1], config.width - o.box[0], o.box[3]))
                    for o in original.scene.objects)
    return ImageOps.mirror(original.image), dataclasses.replace(original.scene, objects=objects), None, "mirrored"


EDITS: dict[str, Edit] = {edit.__name__: edit for edit in (remove_category, add_pedestrian, switch_light,
                                                           move_left_to_right, night_to_day, toggle_fog, mirror)}


def make_pairs(image_ids: Iterable[str], scenes_seed: int, labels: dict[str, Scene], config: RenderConfig,
               edits: list[str], seed: int) -> Iterator[Pair]:
    """Re-render each scene (checking it is the one labelled in ``labels``) and apply every applicable edit: the
    pairs one scene at a time, so that a caller keeping only what it needs of them holds one scene's images."""
    for image_id in image_ids:
        index = int(image_id)
        original = render(np.random.SeedSequence([scenes_seed, index]), image_name(index), config)
        if original.scene != labels[image_id]:
            raise ValueError(f"scene {image_id}: re-rendering with the scenes params does not give the labelled "
                             "scene: data/raw was generated with other scenes params")
        for k, name in enumerate(edits):
            result = EDITS[name](original, np.random.default_rng([seed, index, k]), config)
            if result is not None:
                yield Pair(name, result[3], original, *result[:3])
