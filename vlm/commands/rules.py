"""Every answer rule in one place, from a normalised :class:`~vlm.scenes.Scene` only: the same rules answer questions
about synthetic scenes and BDD100K frames, so nothing here looks at pixels; geometry is in fractions of the image."""

from vlm.scenes.schema import UNDEFINED, Scene, SceneObject

ROAD_USERS = frozenset({"pedestrian", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle"})
VULNERABLE = frozenset({"pedestrian", "rider"})
TWO_WHEELERS = frozenset({"motorcycle", "bicycle"})

# a road user is in a manoeuvre's path when its box's bottom-centre is in its band of columns, below PATH_MIN_Y
PATHS = {"left": (0.0, 0.5), "straight": (1 / 3, 2 / 3), "right": (0.5, 1.0)}
PATH_MIN_Y = 0.6
SIDES = {"left": (0.0, 1 / 3), "right": (2 / 3, 1.0)}  # "on the left side": the box centre in the left third

YES, NO, MAYBE = "yes", "no", "maybe"


def count(scene: Scene, category: str) -> int:
    return sum(1 for o in scene.objects if o.category == category)


def is_present(scene: Scene, category: str) -> str:
    return YES if count(scene, category) else NO


def on_side(scene: Scene, category: str, side: str, width: float) -> str:
    lo, hi = SIDES[side]
    hit = any(o.category == category and lo * width <= o.center_x <= hi * width for o in scene.objects)
    return YES if hit else NO


def readable(obj: SceneObject) -> bool:
    """A traffic light whose colour can be read: its lit lamp is in view, whatever hides the rest of its housing
    (the labels give no colour where no lit lamp is seen: BDD100K's NA, a rendered light's hidden lamp)."""
    return obj.category == "traffic light" and obj.light_color is not None


def governing_light(scene: Scene) -> SceneObject | None:
    """The light that governs the car: the largest (nearest; ties: leftmost) readable one."""
    return max((o for o in scene.objects if readable(o)), key=lambda o: (o.area, -o.box[0]), default=None)


def ground_y(scene: Scene, obj: SceneObject) -> float:
    """The row where ``obj`` meets the road: its box's bottom, but for a rider (whose box ends at the saddle) the
    bottom of the two-wheeler under it (whose box spans the rider's centre column and bottom row), if any."""
    if obj.category != "rider":
        return obj.bottom
    under = [o.bottom for o in scene.objects if o.category in TWO_WHEELERS
             and o.box[0] <= obj.center_x <= o.box[2] and o.box[1] <= obj.bottom <= o.box[3]]
    return max(under, default=obj.bottom)


def occlusion_labelled(scene: Scene) -> bool:
    """Whether every road user's label says if it is occluded (what :func:`safety` reads)."""
    return all(o.occluded is not None for o in scene.objects if o.category in ROAD_USERS)


def light_colors_labelled(scene: Scene) -> bool:
    """Whether the labels decide the light's colour: every light's label gives its colour (NA included), or a readable
    light is larger than each light whose label gives none (a set that colours only the larger lights)."""
    unlabelled = [o.area for o in scene.objects if o.category == "traffic light" and not o.light_labelled]
    light = governing_light(scene) if unlabelled else None
    return not unlabelled or (light is not None and light.area > max(unlabelled))


def light_color(scene: Scene) -> str:
    """'red' | 'yellow' | 'green', or 'maybe' when no light's colour can be determined."""
    light = governing_light(scene)
    return light.light_color if light else MAYBE


def light_is(scene: Scene, color: str) -> str:
    actual = light_color(scene)
    if actual == MAYBE:
        return MAYBE
    return YES if actual == color else NO


def safety(scene: Scene, manoeuvre: str, width: float, height: float) -> str:
    """Can the car safely make ``manoeuvre`` ('left' | 'straight' | 'right')? The rule: docs/architecture.md."""
    light, (lo, hi) = light_color(scene), PATHS[manoeuvre]
    blocking = [o for o in scene.objects if o.category in ROAD_USERS and ground_y(scene, o) >= PATH_MIN_Y * height
                and lo * width <= o.center_x <= hi * width]
    if light == "red" or any(o.category in VULNERABLE for o in blocking):
        return NO
    if light == "yellow" or any(o.occluded for o in blocking):
        return MAYBE
    return YES


# Frame attributes asked about: attribute -> (scene field, value that makes the answer yes).
FRAME_ATTRIBUTES = {"night": ("timeofday", "night"), "rain": ("weather", "rainy"),
                    "fog": ("weather", "foggy"), "highway": ("scene", "highway")}


def scene_attribute(scene: Scene, attribute: str) -> str | None:
    """Answers for frame-attribute questions; None when the attribute is undefined (no question)."""
    field, value = FRAME_ATTRIBUTES[attribute]
    actual = getattr(scene, field)
    if actual == UNDEFINED:
        return None
    return YES if actual == value else NO
