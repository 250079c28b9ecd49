"""Procedural traffic scenes: a road in perspective seen from a car, with labelled road users (what is drawn:
docs/architecture.md, generate_scenes).

A scene is drawn in three steps. :func:`sample_layout` draws everything random from a ``numpy`` generator (the
scene's attributes, the road and the objects); nothing after it is random, so a seed fixes the image.
:func:`settle_occlusion` measures from the silhouettes how much of each object nearer ones hide and removes the
ambiguous and the almost hidden. :func:`render_layout` paints the image far to near, then fog and rain.

Geometry is a pinhole camera over a flat road: a point at ground depth ``z`` metres projects to the
row ``y = horizon + s * (H - horizon)`` with ``s = Z_BOTTOM / z``, and a width of ``w`` metres at that
depth spans ``w * PX_PER_M * s`` pixels."""

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from vlm.scenes import statistics
from vlm.scenes.camera import apply_camera, sample_camera
from vlm.scenes.schema import Scene, SceneObject
from vlm.scenes.statistics import SCENE_TYPES

Z_BOTTOM = 5.0  # metres from the camera to the ground seen at the bottom row
PX_PER_M = 150.0  # pixels per metre at s = 1 (the bottom row)
LANE_M = 3.5
OCCLUDED_MIN = 0.2  # hidden fraction from which an object is labelled occluded
AMBIGUOUS = (0.04, 0.2)  # hidden fractions removed so the occluded flag is unambiguous
HIDDEN_MAX = 0.7  # objects hidden more than this are removed
TRUNCATED_MIN_VISIBLE = 0.4  # objects with less of their silhouette inside the image are removed
# Labelled objects stand MIN_Z to MAX_Z metres ahead, at the depths that give BDD100K's box sizes (_depth); an object
# at MIN_Z ends above the bottom 17% of the frame, where the bonnet and dashboard may be (camera.BONNET_MAX)
MIN_Z, MAX_Z = 7.5, 150.0
LIGHT_M = (0.45, 1.0)  # a traffic light's head, width and height; LAMP_M its lamps' diameter
LAMP_M = 0.22
LAMP_HIDDEN_MAX = 0.5  # a light whose lit lamp is hidden more than this is labelled without a colour
# What the renderer draws of BDD100K's frame attributes (their shares: vlm/scenes/bdd100k_statistics.json)
TIMES_OF_DAY = ("daytime", "night", "dawn/dusk")
WEATHERS = ("clear", "overcast", "snowy", "rainy", "partly cloudy", "foggy")
COUNTED = ("car", "pedestrian", "truck", "bus", "motorcycle", "bicycle", "traffic light", "traffic sign")
# Of the pedestrians not on a crosswalk, the share crossing the road anywhere ahead, by scene (without them the
# model never sees a pedestrian in a highway's road, and misses one put there: docs/experiments.md)
ROAD_CROSSING = {"city street": 0.1, "residential": 0.15, "highway": 0.5}

RGB = tuple[int, int, int]

CAR_COLORS: tuple[RGB, ...] = ((235, 235, 235), (30, 30, 32), (150, 155, 160), (170, 25, 30), (30, 60, 150),
                               (90, 95, 100), (40, 90, 60), (200, 170, 40), (110, 60, 30), (240, 120, 20))
TRUCK_COLORS: tuple[RGB, ...] = ((240, 240, 240), (200, 60, 40), (60, 90, 160), (230, 200, 60), (90, 90, 90))
BUS_COLORS: tuple[RGB, ...] = ((250, 190, 20), (200, 40, 40), (30, 90, 170), (40, 140, 80))
VEHICLE_COLORS: dict[str, tuple[RGB, ...]] = {"car": CAR_COLORS, "truck": TRUCK_COLORS, "bus": BUS_COLORS}
VEHICLE_M = {"car": (1.8, 4.4, 1.5), "truck": (2.5, 8.0, 3.4), "bus": (2.55, 11.0, 3.2)}  # width, length, height
TWO_WHEELER_M = {"motorcycle": (2.1, 1.05, 0.65), "bicycle": (1.75, 1.0, 0.7)}  # length, height, wheel diameter
CLOTHES: tuple[RGB, ...] = ((200, 40, 40), (40, 70, 160), (30, 30, 30), (230, 230, 230), (60, 140, 70),
                            (240, 180, 40), (130, 60, 140), (240, 110, 30), (90, 60, 40), (30, 150, 170))
SKIN: tuple[RGB, ...] = ((240, 200, 170), (200, 150, 110), (140, 95, 60), (90, 60, 40))
BUILDING_COLORS: tuple[RGB, ...] = ((160, 80, 60), (200, 185, 160), (120, 120, 125), (90, 110, 130),
                                    (180, 160, 120), (140, 100, 80), (210, 210, 200))
LAMP_COLORS: dict[str, RGB] = {"red": (255, 40, 30), "yellow": (255, 200, 0), "green": (40, 255, 110)}
AMBIENT = {  # per-channel gain and bias of the light on non-emissive surfaces
    "daytime": ((1.0, 1.0, 1.0), (0, 0, 0)),
    "dawn/dusk": ((0.72, 0.6, 0.56), (14, 6, 8)),
    "night": ((0.26, 0.26, 0.3), (4, 4, 7)),  # a dashcam's night: dark but for lamps (BDD100K's mean luma 33)
}

SKY = {  # (top, horizon) colours
    ("daytime", "clear"): ((70, 130, 205), (175, 205, 235)),
    ("daytime", "rainy"): ((95, 100, 110), (150, 155, 160)),
    ("daytime", "foggy"): ((175, 180, 185), (205, 208, 210)),
    ("dawn/dusk", "clear"): ((55, 60, 115), (250, 150, 85)),
    ("dawn/dusk", "rainy"): ((60, 60, 75), (150, 120, 110)),
    ("dawn/dusk", "foggy"): ((130, 120, 125), (200, 170, 150)),
    ("night", "clear"): ((9, 8, 8), (38, 33, 30)),  # a dashcam's night sky: near black, a warm city glow low down
    ("night", "rainy"): ((14, 13, 13), (44, 40, 38)),  # clouds give back the city's light: as warm, brighter
    ("night", "foggy"): ((30, 29, 28), (62, 59, 57)),
    ("daytime", "overcast"): ((150, 155, 165), (195, 198, 202)),
    ("dawn/dusk", "overcast"): ((90, 88, 100), (175, 150, 140)),
    ("night", "overcast"): ((14, 13, 13), (48, 43, 40)),
    ("daytime", "snowy"): ((170, 175, 182), (215, 218, 222)),
    ("dawn/dusk", "snowy"): ((110, 108, 118), (190, 175, 170)),
    ("night", "snowy"): ((21, 20, 20), (60, 57, 56)),
}
SKY.update({(time, "partly cloudy"): SKY[(time, "clear")] for time in TIMES_OF_DAY})
# the light on non-emissive surfaces: weather's gain on AMBIENT's
WEATHER_GAIN = {"clear": 1.0, "partly cloudy": 0.95, "overcast": 0.85, "snowy": 0.9, "rainy": 0.8, "foggy": 0.9}


@dataclass(frozen=True)
class RenderConfig:
    """What a scene is drawn with: from the ``scenes:`` params (``ScenesConfig.render_config``)."""

    width: int
    height: int
    max_count: int  # most objects of a category in one scene (their counts are drawn from BDD100K's, capped here)
    statistics: Path = statistics.PACKAGED  # BDD100K's statistics, which the world is drawn from


@dataclass
class Thing:
    """One labelled object as laid out: its full (unclipped) box and how to draw it."""

    category: str
    kind: str  # drawing routine, e.g. "car_rear", "pedestrian", "bicycle"
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 before clipping to the image
    depth: float  # s: 1 at the bottom row, smaller is farther; draw order far to near
    style: dict = field(default_factory=dict)
    group: int = -1  # rider and its bike share a group: they do not occlude each other
    light_color: str | None = None


@dataclass
class Layout:
    timeofday: str
    weather: str
    scene: str
    horizon: float
    vanish_x: float
    lanes_left: int  # lanes left of the ego lane's left edge (oncoming on a two-way street)
    lanes_right: int
    crosswalk_z: float | None  # depth of the crosswalk's near edge, metres
    cross_street_z: tuple[float, float] | None  # near and far depth of the cross street
    things: list[Thing]
    decor: dict
    targets: dict[str, int] = field(default_factory=dict)  # most objects kept per counted category


class Camera:
    def __init__(self, width: int, height: int, horizon: float, vanish_x: float):
        self.w, self.h, self.horizon, self.vx = width, height, horizon, vanish_x

    def s_of_z(self, z: float) -> float:
        return Z_BOTTOM / z

    def y(self, s: float) -> float:
        return self.horizon + s * (self.h - self.horizon)

    def x(self, lateral_m: float, s: float) -> float:
        """Image column of a point ``lateral_m`` metres right of the camera axis at scale ``s``."""
        return self.vx + lateral_m * PX_PER_M * s

    def px(self, metres: float, s: float) -> float:
        return metres * PX_PER_M * s

    def upright_box(self, lateral_m: float, s: float, width_m: float, height_m: float
                    ) -> tuple[float, float, float, float]:
        """The box of a ``width_m`` x ``height_m`` m object standing at scale ``s``, ``lateral_m`` right of the axis."""
        x, y = self.x(lateral_m, s), self.y(s)
        half = self.px(width_m, s) / 2
        return (x - half, y - self.px(height_m, s), x + half, y)

    def ground_quad(self, lat0: float, lat1: float, z0: float, z1: float) -> list[tuple[float, float]]:
        s0, s1 = self.s_of_z(z0), self.s_of_z(z1)
        return [(self.x(lat0, s0), self.y(s0)), (self.x(lat1, s0), self.y(s0)),
                (self.x(lat1, s1), self.y(s1)), (self.x(lat0, s1), self.y(s1))]


# Layout sampling (all randomness lives here)
def _choice(rng: np.random.Generator, options, p=None):
    return options[int(rng.choice(len(options), p=p))]


def sample_layout(rng: np.random.Generator, config: RenderConfig) -> Layout:
    world = statistics.load(config.statistics)
    timeofday, weather, scene = (_share(rng, world["attributes"][key], drawn)
                                 for key, drawn in (("timeofday", TIMES_OF_DAY), ("weather", WEATHERS),
                                                    ("scene", SCENE_TYPES)))
    w, h = config.width, config.height
    horizon = float(rng.uniform(0.38, 0.48) * h)
    vanish_x = float(w / 2 + rng.uniform(-60, 60))
    cam = Camera(w, h, horizon, vanish_x)
    urban = scene != "highway"
    lanes_left = int(rng.integers(1, 3)) if scene != "residential" else 1
    lanes_right = int(rng.integers(0, 2)) if urban else int(rng.integers(1, 3))
    crosswalk_z = float(rng.uniform(8.0, 30.0)) if scene == "city street" and rng.random() < 0.7 else None
    cross_street_z = (crosswalk_z + 3.5, crosswalk_z + 3.5 + 2 * LANE_M) if crosswalk_z else None
    decor = {"buildings": _sample_buildings(rng, cross_street_z, scene) if urban else [],
             "trees": _sample_trees(rng) if scene != "city street" else [],
             "lamps": [(side, float(z)) for side in (-1, 1) for z in rng.uniform(14, 90, size=int(rng.integers(1, 5)))],
             "clouds": [(float(rng.uniform(0, w)), float(rng.uniform(0.05, 0.8) * horizon), float(rng.uniform(60, 200)))
                        for _ in range(int(rng.integers(0, 5) if weather != "partly cloudy" else rng.integers(4, 10)))],
             "rain_seed": int(rng.integers(2**31)),
             "hills": [float(v) for v in rng.uniform(0.0, 1.0, size=8)],
             "road": _jitter(rng, (78, 78, 82), 18),
             "clutter_seed": int(rng.integers(2**31)),  # unlabelled clutter and surface texture (_draw_clutter)
             "camera": sample_camera(rng, timeofday)}
    layout = Layout(timeofday, weather, scene, horizon, vanish_x, lanes_left, lanes_right, crosswalk_z,
                    cross_street_z, [], decor, {})
    # every labelled object, each step drawing from rng in a fixed order, so the seed fixes every object
    counts = {category: _count(rng, world, scene, category, config.max_count) for category in COUNTED}
    cars_crossing = _sample_lane_vehicles(rng, layout, cam, counts, world)
    _sample_crossing_vehicles(rng, layout, cam, cars_crossing)
    _sample_two_wheelers(rng, layout, cam, counts, world)
    _sample_pedestrians(rng, layout, cam, counts["pedestrian"], world)
    _sample_traffic_lights(rng, layout, cam, counts["traffic light"], world)
    _sample_traffic_signs(rng, layout, cam, counts["traffic sign"], world)
    return layout


def _share(rng: np.random.Generator, shares: dict[str, float], drawn: tuple[str, ...]) -> str:
    """One of ``drawn`` with BDD100K's ``shares`` of them (renormalised over those the renderer draws)."""
    p = np.array([shares.get(value, 0.0) for value in drawn])
    return drawn[int(rng.choice(len(drawn), p=p / p.sum()))]


def _count(rng: np.random.Generator, world: dict, scene: str, category: str, cap: int) -> int:
    """How many objects of ``category`` a frame of ``scene`` holds: drawn from BDD100K's frames, at most ``cap``."""
    p = np.asarray(world["objects_per_frame"][scene][category], dtype=np.float64)
    return min(int(rng.choice(len(p), p=p / p.sum())), cap)


def _depth(rng: np.random.Generator, world: dict, category: str, height_m: float, cam: Camera,
           near: float = MIN_Z) -> float:
    """Metres ahead at which an object ``height_m`` tall has a box as high as one drawn from BDD100K's boxes of
    ``category`` (its quantiles, interpolated; the 2% at either end left out: truncated or stray boxes)."""
    box_height = float(np.interp(rng.uniform(0.02, 0.98), world["quantiles"], world["box_height"][category]))
    box_height *= cam.h / world["frame_size"][1]
    return float(np.clip(height_m * PX_PER_M * Z_BOTTOM / max(box_height, 1.0), near, MAX_Z))


def _jitter(rng: np.random.Generator, color: RGB, spread: int) -> RGB:
    """``color`` with each channel moved by up to ``spread`` (one draw shifts all three, one more each)."""
    common = int(rng.integers(-spread, spread + 1))
    return tuple(int(np.clip(c + common + rng.integers(-spread // 3, spread // 3 + 1), 0, 255)) for c in color)


def road_extent(layout: Layout) -> tuple[float, float]:
    """Lateral metres of the road's left and right edges (ego lane is [-LANE_M/2, LANE_M/2])."""
    return (-LANE_M / 2 - layout.lanes_left * LANE_M - 0.5, LANE_M / 2 + layout.lanes_right * LANE_M + 0.5)


def _beside_road(layout: Layout, side: int, offset_m: float) -> float:
    """Lateral metres of a point ``offset_m`` outside the road's left (``side`` < 0) or right edge."""
    left, right = road_extent(layout)
    return left - offset_m if side < 0 else right + offset_m


def _sample_buildings(rng, cross_street_z, scene):
    """Facades along both sides: city blocks, or (residential) low houses set back from the road."""
    low, high = (7, 30) if scene == "city street" else (4, 9)
    buildings = []
    for side in (-1, 1):
        z = 3.0
        while z < 110:
            length = float(rng.uniform(8, 22))
            if cross_street_z and z < cross_street_z[1] and z + length > cross_street_z[0]:
                if z < cross_street_z[0]:
                    length = cross_street_z[0] - z
                else:
                    z = cross_street_z[1]
                    continue
            buildings.append({"side": side, "z0": z, "z1": z + length, "height": float(rng.uniform(low, high)),
                              "color": _jitter(rng, _choice(rng, BUILDING_COLORS), 24),
                              "floors": int(rng.integers(2, 8)) if scene == "city street" else int(rng.integers(1, 3)),
                              "cols": int(rng.integers(2, 6)), "lit": rng.random(64).tolist(),
                              "setback": 3.5 if scene == "city street" else float(rng.uniform(6, 12))})
            z += length + float(rng.uniform(0, 2) if scene == "city street" else rng.uniform(3, 10))
    return buildings


def _sample_trees(rng):
    return [{"side": int(side), "z": float(z), "offset": float(rng.uniform(2, 9)), "height": float(rng.uniform(5, 11)),
             "shade": float(rng.uniform(0.7, 1.1))}
            for side in (-1, 1) for z in rng.uniform(6, 80, size=int(rng.integers(3, 9)))]


def pedestrian(rng: np.random.Generator, cam: Camera, z: float, lateral: float) -> Thing:
    """A pedestrian ``z`` metres ahead, ``lateral`` metres right of the camera axis (height, clothes from ``rng``)."""
    s = cam.s_of_z(z)
    height_m = float(rng.uniform(1.55, 1.95))
    return Thing("pedestrian", "pedestrian", cam.upright_box(lateral, s, height_m * 0.32, height_m), s,
                 {"shirt": _jitter(rng, _choice(rng, CLOTHES), 20),
                  "trousers": _choice(rng, CLOTHES[2:5] + CLOTHES[8:9]),
                  "skin": _choice(rng, SKIN), "stride": float(rng.uniform(0.0, 0.35)),
                  "bag": rng.random() < 0.3,
                  "hair": _choice(rng, ((30, 20, 10), (90, 60, 30), (200, 170, 90), (20, 20, 20)))})


def _sample_lane_vehicles(rng: np.random.Generator, layout: Layout, cam: Camera, counts: dict[str, int],
                          world: dict) -> int:
    """Cars, trucks and buses in the lanes, seen from behind (oncoming on a two-way street: from the front), and
    (city and residential) cars parked along both kerbs. Set the car target; return how many cars go to the cross
    street instead (:func:`_sample_crossing_vehicles`)."""
    urban = layout.scene != "highway"
    lanes = list(range(-layout.lanes_left, layout.lanes_right + 1))  # lane 0 is the ego lane, negative to the left
    # The counted categories' targets follow BDD100K's counts; extra objects are placed for settle_occlusion, which
    # cuts the surplus (and the almost hidden)
    target_cars = counts["car"]
    layout.targets["car"] = target_cars
    n_cars = target_cars + (target_cars + 1) // 2
    cars_crossing = int(rng.integers(0, min(n_cars, 2) + 1)) if layout.cross_street_z else 0
    vehicles = ["car"] * (n_cars - cars_crossing) + ["truck"] * counts["truck"] + ["bus"] * counts["bus"]
    parked_share = float(rng.uniform(0.2, 0.6)) if urban else 0.0
    for category in vehicles:
        width_m, _, height_m = VEHICLE_M[category]
        width_m *= float(rng.uniform(0.95, 1.08))
        height_m *= float(rng.uniform(0.95, 1.08))
        s = cam.s_of_z(_depth(rng, world, category, height_m, cam))
        if category == "car" and rng.random() < parked_share:  # parked along a kerb, seen from behind
            side = int(rng.choice((-1, 1)))
            lateral, kind = _beside_road(layout, side, -1.0 - float(rng.uniform(0.0, 0.3))), "car_rear"
        else:
            lane = int(rng.choice(lanes))
            lateral = lane * LANE_M + float(rng.uniform(-0.5, 0.5))  # about the lane's centre
            kind = f"{category}_{'front' if urban and lane < 0 else 'rear'}"
        box = cam.upright_box(lateral, s, width_m, height_m)
        style = {"color": _jitter(rng, _choice(rng, VEHICLE_COLORS[category]), 16),
                 "lights_on": layout.timeofday != "daytime" or rng.random() < 0.3}
        layout.things.append(Thing(category, kind, box, s, style))
    return cars_crossing


def _sample_crossing_vehicles(rng: np.random.Generator, layout: Layout, cam: Camera, cars_crossing: int) -> None:
    """Vehicles crossing at the intersection, side view: ``cars_crossing`` cars, perhaps a bus and a truck."""
    if not layout.cross_street_z:
        return
    z_near, z_far = layout.cross_street_z
    crossing = (["car"] * cars_crossing + (["bus"] if rng.random() < 0.15 else [])
                + (["truck"] if rng.random() < 0.15 else []))
    for category in crossing:
        s = cam.s_of_z(float(rng.uniform(z_near + 1.0, z_far - 1.0)))
        _, length_m, height_m = VEHICLE_M[category]
        x1, y2 = float(rng.uniform(-0.2 * cam.w, 1.0 * cam.w)), cam.y(s)
        box = (x1, y2 - cam.px(height_m, s), x1 + cam.px(length_m, s), y2)
        layout.things.append(Thing(category, f"{category}_side", box, s,
                                   {"color": _jitter(rng, _choice(rng, VEHICLE_COLORS[category]), 16),
                                    "facing": int(rng.choice((-1, 1))), "lights_on": layout.timeofday != "daytime"}))


def _sample_two_wheelers(rng: np.random.Generator, layout: Layout, cam: Camera, counts: dict[str, int],
                         world: dict) -> None:
    """Motorcycles and bicycles, side view, half of them ridden; a bike and its rider share a group."""
    left, right = road_extent(layout)
    for g, category in enumerate(["motorcycle"] * counts["motorcycle"] + ["bicycle"] * counts["bicycle"], start=1):
        length_m, height_m, wheel_m = TWO_WHEELER_M[category]
        s = cam.s_of_z(_depth(rng, world, category, height_m, cam))
        x, y2 = cam.x(float(rng.uniform(left + 0.6, right - 0.6)), s), cam.y(s)
        length, bike_h = cam.px(length_m, s), cam.px(height_m, s)
        facing = int(rng.choice((-1, 1)))
        bike = Thing(category, category, (x - length / 2, y2 - bike_h, x + length / 2, y2), s,
                     {"color": _choice(rng, CAR_COLORS if category == "motorcycle" else CLOTHES), "facing": facing,
                      "wheel": cam.px(wheel_m, s), "lights_on": layout.timeofday != "daytime"}, group=g)
        layout.things.append(bike)
        if rng.random() < 0.5:
            continue  # parked
        rx, rider_w = x + facing * length * 0.05, cam.px(0.55, s)
        rider_box = (rx - rider_w / 2, y2 - bike_h - cam.px(1.05, s) * 0.55, rx + rider_w / 2, y2 - bike_h * 0.45)
        layout.things.append(Thing("rider", "rider", rider_box, s + 1e-4,
                                   {"shirt": _choice(rng, CLOTHES), "skin": _choice(rng, SKIN), "facing": facing,
                                    "helmet": category == "motorcycle" or rng.random() < 0.5,
                                    "helmet_color": _choice(rng, CLOTHES)}, group=g))


def _sample_pedestrians(rng: np.random.Generator, layout: Layout, cam: Camera, target: int, world: dict) -> None:
    """Pedestrians (counted, with a target) on the sidewalks and the crosswalk, or beside a highway; some of those not
    on a crosswalk cross the road anywhere (:data:`ROAD_CROSSING`)."""
    urban = layout.scene != "highway"
    left, right = road_extent(layout)
    n_ped = target + (target + 1) // 2  # extras for occlusion, as for cars
    layout.targets["pedestrian"] = target
    for _ in range(n_ped):
        z = _depth(rng, world, "pedestrian", 1.75, cam)
        if layout.crosswalk_z is not None and rng.random() < 0.3:  # on the crosswalk
            z = layout.crosswalk_z + float(rng.uniform(0.3, 2.7))
            lateral = float(rng.uniform(left - 1.5, right + 1.5))
        elif rng.random() < ROAD_CROSSING[layout.scene]:  # in the road, off any crosswalk
            lateral = float(rng.uniform(left + 0.3, right - 0.3))
        elif urban:
            lateral = _beside_road(layout, int(rng.choice((-1, 1))), float(rng.uniform(0.5, 2.8)))
        else:
            lateral = float(rng.choice((left - 1.2, right + 1.2)))
        layout.things.append(pedestrian(rng, cam, z, lateral))


def _sample_traffic_lights(rng: np.random.Generator, layout: Layout, cam: Camera, count: int, world: dict) -> None:
    """Traffic lights at life size, overhead or on poles, at the depths of BDD100K's: one phase (or dark) for all,
    some seen from the side or back (no lamp to read, as BDD100K's ``NA``)."""
    if not count:
        return
    left, right = road_extent(layout)
    phase = _choice(rng, ("red", "yellow", "green", None), p=(0.22, 0.34, 0.24, 0.2))
    for _ in range(count):
        z = _depth(rng, world, "traffic light", LIGHT_M[1], cam, near=8.0)
        s = cam.s_of_z(z)
        lateral = float(rng.uniform(left - 2.5, right + 2.5))
        x = cam.x(lateral, s)
        head_w, head_h = cam.px(LIGHT_M[0], s), cam.px(LIGHT_M[1], s)
        y1 = cam.y(s) - cam.px(float(rng.uniform(4.6, 6.0)), s)
        overhead = left < lateral < right  # hung over the road from a pole beside it
        pole_x = x if not overhead else cam.x(right + 1.0 if lateral > 0 else left - 1.0, s)
        box = (x - head_w / 2, y1, x + head_w / 2, y1 + head_h)
        facing = rng.random() >= 0.25  # else seen from the side or back
        layout.things.append(Thing("traffic light", "traffic_light", box, s,
                                   {"overhead": overhead, "pole_x": pole_x, "ground_y": cam.y(s),
                                    "lamp_d": cam.px(LAMP_M, s), "facing": facing},
                                   light_color=phase if facing else None))


def _sample_traffic_signs(rng: np.random.Generator, layout: Layout, cam: Camera, count: int, world: dict) -> None:
    """Traffic signs on poles beside the road, of a random shape, at the depths of BDD100K's."""
    for _ in range(count):
        shape = _choice(rng, ("circle", "triangle", "octagon", "rect_blue", "diamond", "rect_green"))
        size_m = 0.75 if shape != "rect_green" else 2.2
        aspect = 0.6 if shape == "rect_green" else 1.0
        s = cam.s_of_z(_depth(rng, world, "traffic sign", size_m * aspect, cam, near=7.0))
        x = cam.x(_beside_road(layout, int(rng.choice((-1, 1))), float(rng.uniform(0.6, 2.0))), s)
        size = cam.px(size_m, s)
        y1 = cam.y(s) - cam.px(float(rng.uniform(2.2, 3.0)), s)
        box = (x - size / 2, y1, x + size / 2, y1 + size * aspect)
        layout.things.append(Thing("traffic sign", "traffic_sign", box, s,
                                   {"shape": shape, "ground_y": cam.y(s), "pole_x": x}))


# Drawing objects: in colour on the image, or as silhouettes for occlusion
class Pen:
    """Draws an object's primitives in colour (``shade`` applies the ambient light to non-emissive ones), or, with
    no ``shade``, the solid ones as its silhouette (255) into a mask whose top-left pixel is image pixel ``offset``."""

    def __init__(self, draw: ImageDraw.ImageDraw, shade=None, offset: tuple[int, int] = (0, 0)):
        self.draw, self.shade, self.offset = draw, shade, offset

    def _paint(self, method: str, geometry, color: RGB, solid: bool, emissive: bool, **kw) -> None:
        boxed = method in ("rectangle", "ellipse")  # geometry (x1, y1, x2, y2), else a list of points
        if boxed and not (geometry[2] - geometry[0] >= 0.5 and geometry[3] - geometry[1] >= 0.5):
            return  # under half a pixel across: not drawn
        if self.shade is not None:
            getattr(self.draw, method)(geometry, fill=color if emissive else self.shade(color), **kw)
        elif solid:
            dx, dy = self.offset
            if boxed:
                geometry = (geometry[0] - dx, geometry[1] - dy, geometry[2] - dx, geometry[3] - dy)
            else:
                geometry = [(x - dx, y - dy) for x, y in geometry]
            getattr(self.draw, method)(geometry, fill=255, **kw)

    def polygon(self, points, color: RGB, solid: bool = True, emissive: bool = False) -> None:
        self._paint("polygon", [(float(x), float(y)) for x, y in points], color, solid, emissive)

    def rect(self, box, color: RGB, solid: bool = True, emissive: bool = False) -> None:
        self._paint("rectangle", tuple(box), color, solid, emissive)

    def ellipse(self, box, color: RGB, solid: bool = True, emissive: bool = False) -> None:
        self._paint("ellipse", tuple(box), color, solid, emissive)

    def line(self, points, color: RGB, width: float, solid: bool = True, emissive: bool = False) -> None:
        self._paint("line", [(float(x), float(y)) for x, y in points], color, solid, emissive,
                    width=max(1, round(width)))

    def glow(self, cx: float, cy: float, r: float, color: RGB, strength: float = 1.0) -> None:
        """A halo around a light source (colour only, not part of any silhouette)."""
        if self.shade is None:
            return
        for k, f in ((2.6, 0.25), (1.8, 0.5)):
            c = tuple(int(v * f * strength + 30 * (1 - f)) for v in color)
            self.draw.ellipse((cx - r * k, cy - r * k, cx + r * k, cy + r * k), fill=c)


def make_shade(timeofday: str, weather: str):
    """The colour transform of the ambient light for non-emissive surfaces."""
    gain, bias = AMBIENT[timeofday]
    gain = tuple(g * WEATHER_GAIN[weather] for g in gain)

    def shade(color: RGB) -> RGB:
        return tuple(int(c * g + b) for c, g, b in zip(color, gain, bias))

    return shade


def draw_vehicle_end(pen: Pen, t: Thing) -> None:
    """A car, truck or bus seen from behind (``*_rear``) or from the front (``*_front``)."""
    x1, y1, x2, y2 = t.box
    w, h = x2 - x1, y2 - y1
    color = t.style["color"]
    front = t.kind.endswith("front")
    dark = (25, 25, 28)
    wheel_h = h * 0.12
    pen.rect((x1 + w * 0.06, y2 - wheel_h, x1 + w * 0.24, y2), dark)
    pen.rect((x2 - w * 0.24, y2 - wheel_h, x2 - w * 0.06, y2), dark)
    if t.category == "car":
        body_top = y1 + h * 0.45
        pen.polygon([(x1 + w * 0.14, body_top), (x1 + w * 0.24, y1), (x2 - w * 0.24, y1), (x2 - w * 0.14, body_top)],
                    color)
        pen.polygon([(x1 + w * 0.2, body_top - h * 0.02), (x1 + w * 0.27, y1 + h * 0.07),
                     (x2 - w * 0.27, y1 + h * 0.07), (x2 - w * 0.2, body_top - h * 0.02)],
                    (60, 75, 90) if front else (45, 55, 65))
        pen.rect((x1, body_top, x2, y2 - wheel_h * 0.6), color)
        pen.rect((x1 + w * 0.38, y2 - h * 0.33, x2 - w * 0.38, y2 - h * 0.22), (225, 225, 215))
        lamp_y = body_top + h * 0.08
    elif t.category == "truck":
        pen.rect((x1, y1, x2, y2 - wheel_h * 0.6), color)
        if front:
            pen.rect((x1 + w * 0.1, y1 + h * 0.15, x2 - w * 0.1, y1 + h * 0.42), (60, 75, 90))
            pen.rect((x1 + w * 0.2, y1 + h * 0.55, x2 - w * 0.2, y1 + h * 0.7), (60, 60, 60))
        else:
            pen.line([((x1 + x2) / 2, y1 + h * 0.04), ((x1 + x2) / 2, y2 - wheel_h * 1.3)], (70, 70, 70), w * 0.02)
            pen.rect((x1, y2 - wheel_h * 1.6, x2, y2 - wheel_h * 1.2), (50, 50, 50))
        lamp_y = y2 - wheel_h * 2.0
    else:  # bus
        pen.rect((x1, y1, x2, y2 - wheel_h * 0.6), color)
        pen.rect((x1 + w * 0.06, y1 + h * 0.1, x2 - w * 0.06, y1 + h * (0.5 if front else 0.38)), (50, 65, 80))
        pen.rect((x1 + w * 0.25, y1 + h * 0.02, x2 - w * 0.25, y1 + h * 0.08), (255, 170, 40), emissive=True)
        lamp_y = y2 - wheel_h * 2.2
    lit = t.style["lights_on"]
    r = max(1.0, w * 0.06)
    on, off = ((255, 250, 220), (200, 200, 190)) if front else ((255, 30, 30), (150, 20, 20))  # head or tail lamps
    for cx in (x1 + w * 0.12, x2 - w * 0.12):
        if lit:
            pen.glow(cx, lamp_y, r, on, 0.8)
        pen.ellipse((cx - r, lamp_y - r * 0.7, cx + r, lamp_y + r * 0.7), on if lit else off, emissive=lit)


def draw_vehicle_side(pen: Pen, t: Thing) -> None:
    """A car, truck or bus crossing at the intersection, seen from the side."""
    x1, y1, x2, y2 = t.box
    w, h = x2 - x1, y2 - y1
    color = t.style["color"]
    facing = t.style["facing"]
    r = h * (0.22 if t.category == "car" else 0.17)
    glass = (50, 65, 80)
    if t.category == "car":
        roof0, roof1 = (0.25, 0.78) if facing > 0 else (0.22, 0.75)
        pen.rect((x1, y1 + h * 0.42, x2, y2 - r * 0.6), color)
        pen.polygon([(x1 + w * (roof0 - 0.08), y1 + h * 0.45), (x1 + w * roof0, y1), (x1 + w * roof1, y1),
                     (x1 + w * (roof1 + 0.08), y1 + h * 0.45)], color)
        pen.polygon([(x1 + w * (roof0 - 0.04), y1 + h * 0.42), (x1 + w * (roof0 + 0.02), y1 + h * 0.08),
                     (x1 + w * (roof1 - 0.02), y1 + h * 0.08), (x1 + w * (roof1 + 0.04), y1 + h * 0.42)], glass)
    elif t.category == "truck":
        cab = w * 0.24
        cab_x0 = x2 - cab if facing > 0 else x1
        box_x0, box_x1 = (x1, x2 - cab - w * 0.01) if facing > 0 else (x1 + cab + w * 0.01, x2)
        pen.rect((box_x0, y1, box_x1, y2 - r * 0.8), color)
        darker = tuple(int(c + (40 - c) * 0.4) for c in color)
        pen.rect((cab_x0, y1 + h * 0.3, cab_x0 + cab, y2 - r * 0.6), darker)
        win_x = cab_x0 + cab * (0.45 if facing > 0 else 0.1)
        pen.rect((win_x, y1 + h * 0.36, win_x + cab * 0.45, y1 + h * 0.58), glass)
    else:  # bus
        pen.rect((x1, y1, x2, y2 - r * 0.6), color)
        for i in range(6):  # windows
            wx = x1 + w * (0.05 + i * 0.9 / 6)
            pen.rect((wx, y1 + h * 0.15, wx + w * 0.9 / 6 * 0.8, y1 + h * 0.5), glass)
        pen.rect((x1, y1 + h * 0.62, x2, y1 + h * 0.68), (240, 240, 240))
    for cx in (x1 + w * 0.18, x2 - w * 0.18):
        pen.ellipse((cx - r, y2 - 2 * r, cx + r, y2), (20, 20, 22))
        pen.ellipse((cx - r * 0.45, y2 - r * 1.45, cx + r * 0.45, y2 - r * 0.55), (150, 150, 155))
    if t.style["lights_on"]:
        hx, hy = x2 - w * 0.02 if facing > 0 else x1 + w * 0.02, y2 - h * 0.45  # headlamp
        pen.glow(hx, hy, h * 0.08, (255, 250, 220), 0.8)
        pen.ellipse((hx - h * 0.06, hy - h * 0.04, hx + h * 0.06, hy + h * 0.04), (255, 250, 220), emissive=True)


def draw_two_wheeler(pen: Pen, t: Thing) -> None:
    x1, y1, x2, y2 = t.box
    w = x2 - x1
    r = t.style["wheel"] / 2
    facing = t.style["facing"]
    back, front = (x1 + r, x2 - r) if facing > 0 else (x2 - r, x1 + r)
    cy = y2 - r
    tire = max(1.0, r * (0.35 if t.category == "motorcycle" else 0.18))
    for cx in (back, front):
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), (15, 15, 15))
        pen.ellipse((cx - r + tire, cy - r + tire, cx + r - tire, cy + r - tire),
                    (120, 120, 120) if t.category == "bicycle" else (60, 60, 60), solid=False)
    color = t.style["color"]
    seat = (back + (front - back) * 0.35, y1 + (y2 - y1) * 0.1)
    bar = (back + (front - back) * 0.85, y1)
    crank = (back + (front - back) * 0.45, cy)
    if t.category == "motorcycle":
        pen.polygon([(back + (front - back) * 0.15, cy - r * 0.9), seat,
                     (back + (front - back) * 0.75, y1 + (y2 - y1) * 0.15), (front, cy - r * 0.3), crank], color)
        if t.style["lights_on"]:
            pen.glow(bar[0] + facing * w * 0.05, bar[1] + r * 0.4, r * 0.25, (255, 250, 220), 0.8)
    else:
        lw = max(1.0, w * 0.03)
        down_tube = (crank, (bar[0] - (front - back) * 0.05, bar[1] + (y2 - y1) * 0.2))
        for a, b in ((back, cy), crank), (crank, seat), (seat, (back, cy)), (seat, bar), (bar, (front, cy)), down_tube:
            pen.line([a, b], color, lw)


def draw_person(pen: Pen, t: Thing, riding: bool = False) -> None:
    x1, y1, x2, y2 = t.box
    w, h = x2 - x1, y2 - y1
    cx = (x1 + x2) / 2
    st = t.style
    if riding:
        head = h * 0.28
        pen.rect((x1 + w * 0.15, y1 + head, x2 - w * 0.15, y2), st["shirt"])
        pen.line([(cx, y1 + head * 1.3), (cx + st["facing"] * w * 0.9, y1 + head * 2.0)], st["shirt"], w * 0.22)
    else:
        head = h * 0.14
        legs_top = y1 + h * 0.5
        stride = st["stride"] * w
        pen.polygon([(cx - w * 0.2, legs_top), (cx - w * 0.02, legs_top), (cx - w * 0.1 - stride, y2),
                     (cx - w * 0.35 - stride, y2)], st["trousers"])
        pen.polygon([(cx + w * 0.02, legs_top), (cx + w * 0.2, legs_top), (cx + w * 0.35 + stride, y2),
                     (cx + w * 0.1 + stride, y2)], st["trousers"])
        pen.rect((x1 + w * 0.12, y1 + head * 1.05, x2 - w * 0.12, legs_top + h * 0.03), st["shirt"])
        pen.line([(x1 + w * 0.14, y1 + head * 1.3), (x1, y1 + h * 0.5)], st["shirt"], w * 0.16)
        pen.line([(x2 - w * 0.14, y1 + head * 1.3), (x2, y1 + h * 0.5)], st["shirt"], w * 0.16)
        if st["bag"]:
            pen.rect((x2 - w * 0.1, y1 + h * 0.4, x2 + w * 0.05, y1 + h * 0.55), (80, 50, 30))
    hr, hy = head * 0.55, y1 + head * 0.55  # head radius and centre
    pen.ellipse((cx - hr, hy - hr, cx + hr, hy + hr), st["skin"])
    if riding and st["helmet"]:
        pen.ellipse((cx - hr * 1.1, hy - hr * 1.15, cx + hr * 1.1, hy + hr * 0.2), st["helmet_color"])
    elif not riding:
        pen.ellipse((cx - hr, hy - hr * 1.05, cx + hr, hy - hr * 0.1), st["hair"])


def lamp_box(t: Thing, color: str) -> tuple[float, float, float, float]:
    """The box of traffic light ``t``'s lamp of ``color`` (red at the top, green at the bottom)."""
    x1, y1, x2, y2 = t.box
    cx, cy = (x1 + x2) / 2, y1 + (y2 - y1) * (0.2 + 0.3 * list(LAMP_COLORS).index(color))
    d = min(t.style["lamp_d"], (x2 - x1) * 0.8)
    return (cx - d / 2, cy - d / 2, cx + d / 2, cy + d / 2)


def draw_traffic_light(pen: Pen, t: Thing) -> None:
    x1, y1, x2, y2 = t.box
    w, h = x2 - x1, y2 - y1
    st = t.style
    pole = (70, 72, 75)
    pw = max(1.5, w * 0.18)
    cx = (x1 + x2) / 2
    if st["overhead"]:
        # The arm and pole are not part of the light's silhouette (BDD boxes the head only).
        pen.line([(st["pole_x"], y1 + h * 0.1), (cx, y1 + h * 0.1)], pole, pw * 0.8, solid=False)
        pen.line([(st["pole_x"], y1 + h * 0.1), (st["pole_x"], st["ground_y"])], pole, pw, solid=False)
    else:
        pen.line([(cx, y2), (cx, st["ground_y"])], pole, pw, solid=False)
    pen.rect((x1, y1, x2, y2), (35, 35, 30))
    if not st["facing"]:  # its side or back: no lamp to see
        pen.rect((x1 + w * 0.3, y1 + h * 0.05, x2 - w * 0.3, y2 - h * 0.05), (55, 55, 50))
        return
    for color in LAMP_COLORS:
        box = lamp_box(t, color)
        cy = (box[1] + box[3]) / 2
        if t.light_color == color:
            pen.glow(cx, cy, (box[2] - box[0]) / 2, LAMP_COLORS[color], 0.9)
            pen.rect((x1, cy - h * 0.14, x2, cy + h * 0.14), (35, 35, 30))
            pen.ellipse(box, LAMP_COLORS[color], emissive=True)
        else:
            pen.ellipse(box, (60, 60, 55))


def draw_traffic_sign(pen: Pen, t: Thing) -> None:
    x1, y1, x2, y2 = t.box
    w, h = x2 - x1, y2 - y1
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    pen.line([(cx, y2), (cx, t.style["ground_y"])], (130, 130, 135), max(1.0, w * 0.06), solid=False)
    shape = t.style["shape"]
    if shape == "circle":
        pen.ellipse((x1, y1, x2, y2), (200, 20, 20))
        pen.ellipse((x1 + w * 0.14, y1 + h * 0.14, x2 - w * 0.14, y2 - h * 0.14), (245, 245, 245))
        pen.rect((cx - w * 0.2, cy - h * 0.12, cx + w * 0.2, cy + h * 0.12), (20, 20, 20))
    elif shape == "triangle":
        pen.polygon([(cx, y1), (x2, y2), (x1, y2)], (200, 20, 20))
        pen.polygon([(cx, y1 + h * 0.25), (x2 - w * 0.15, y2 - h * 0.08), (x1 + w * 0.15, y2 - h * 0.08)],
                    (245, 245, 245))
    elif shape == "octagon":
        k = 0.29
        pen.polygon([(x1 + w * k, y1), (x2 - w * k, y1), (x2, y1 + h * k), (x2, y2 - h * k), (x2 - w * k, y2),
                     (x1 + w * k, y2), (x1, y2 - h * k), (x1, y1 + h * k)], (200, 20, 20))
        pen.rect((x1 + w * 0.2, cy - h * 0.08, x2 - w * 0.2, cy + h * 0.08), (245, 245, 245))
    elif shape == "rect_blue":
        pen.rect((x1, y1, x2, y2), (20, 70, 170))
        pen.rect((cx - w * 0.15, y1 + h * 0.2, cx + w * 0.15, y2 - h * 0.2), (245, 245, 245))
    elif shape == "diamond":  # yellow, with a black border inset
        for k, color, solid in ((0.0, (240, 200, 20), True), (0.1, (20, 20, 20), False), (0.16, (240, 200, 20), True)):
            pen.polygon([(cx, y1 + h * k), (x2 - w * k, cy), (cx, y2 - h * k), (x1 + w * k, cy)], color, solid=solid)
    else:  # rect_green: a guide sign
        pen.rect((x1, y1, x2, y2), (20, 110, 60))
        for i in range(2):
            yy = y1 + h * (0.3 + 0.35 * i)
            pen.line([(x1 + w * 0.15, yy), (x2 - w * 0.15, yy)], (240, 240, 240), max(1.0, h * 0.1))


DRAW = {
    **{f"{vehicle}_{view}": draw_vehicle_end for vehicle in VEHICLE_M for view in ("rear", "front")},
    **{f"{vehicle}_side": draw_vehicle_side for vehicle in VEHICLE_M},
    "motorcycle": draw_two_wheeler, "bicycle": draw_two_wheeler,
    "pedestrian": draw_person, "rider": lambda pen, t: draw_person(pen, t, riding=True),
    "traffic_light": draw_traffic_light, "traffic_sign": draw_traffic_sign,
}


# Occlusion
def _silhouettes(things: list[Thing], origin: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """bool ``[h, w]``: the silhouettes of ``things`` in a mask of ``size`` whose top-left is image pixel ``origin``."""
    mask = Image.new("L", size, 0)
    for t in things:
        DRAW[t.kind](Pen(ImageDraw.Draw(mask), offset=origin), t)
    return np.asarray(mask, dtype=bool)


def _visibility(things: list[Thing], width: int, height: int) -> list[float]:
    """Fraction of each thing's silhouette hidden by nearer things of other groups (``things`` far to near)."""
    boxes = np.array([t.box for t in things], dtype=np.float64).reshape(-1, 4)
    hidden = []
    for k, t in enumerate(things):
        x1, y1, x2, y2 = boxes[k]
        nearer = boxes[k + 1:]
        overlap = (nearer[:, 0] < x2) & (nearer[:, 2] > x1) & (nearer[:, 1] < y2) & (nearer[:, 3] > y1)
        occluders = [things[k + 1 + j] for j in np.flatnonzero(overlap)
                     if t.group < 0 or things[k + 1 + j].group != t.group]
        if not occluders and x1 >= 0 and y1 >= 0 and x2 <= width and y2 <= height:  # fully visible
            hidden.append(0.0)
            continue
        ox, oy = int(math.floor(x1)), int(math.floor(y1))
        size = (int(math.ceil(x2)) + 1 - ox, int(math.ceil(y2)) + 1 - oy)
        own = _silhouettes([t], (ox, oy), size)
        total = int(own.sum())
        cx1, cy1 = max(0, -ox), max(0, -oy)  # outside the image: truncation, not occlusion
        cx2, cy2 = min(size[0], width - ox), min(size[1], height - oy)
        own_in = own[cy1:cy2, cx1:cx2] if cx2 > cx1 and cy2 > cy1 else own[:0, :0]
        visible_total = int(own_in.sum())
        if total == 0 or visible_total < TRUNCATED_MIN_VISIBLE * total:  # mostly outside the image
            hidden.append(1.0)
        elif not occluders:
            hidden.append(0.0)
        else:
            covered = _silhouettes(occluders, (ox, oy), size)[cy1:cy2, cx1:cx2]
            hidden.append(float((own_in & covered).sum()) / visible_total)
    return hidden


def _lamp_hidden(things: list[Thing], k: int) -> float:
    """Fraction of the lit lamp of the traffic light ``things[k]`` (``things`` far to near) that nearer things hide."""
    x1, y1, x2, y2 = lamp_box(things[k], things[k].light_color)
    occluders = [t for t in things[k + 1:] if t.box[0] < x2 and t.box[2] > x1 and t.box[1] < y2 and t.box[3] > y1]
    if not occluders:
        return 0.0
    ox, oy = int(math.floor(x1)), int(math.floor(y1))
    size = (int(math.ceil(x2)) + 1 - ox, int(math.ceil(y2)) + 1 - oy)
    lamp = Image.new("L", size, 0)
    ImageDraw.Draw(lamp).ellipse((x1 - ox, y1 - oy, x2 - ox, y2 - oy), fill=255)
    lit = np.asarray(lamp, dtype=bool)
    return float((lit & _silhouettes(occluders, (ox, oy), size)).sum()) / max(1, int(lit.sum()))


def settle_occlusion(things: list[Thing], width: int, height: int, targets: dict[str, int] | None = None
                     ) -> list[tuple[Thing, float]]:
    """Remove things that are almost hidden or ambiguously occluded, and per category the farthest beyond its
    ``targets`` cap; return (thing, hidden fraction)."""
    things = sorted(things, key=lambda t: t.depth)
    while True:
        hidden = _visibility(things, width, height)
        drop = {id(t) for t, f in zip(things, hidden) if f > HIDDEN_MAX or AMBIGUOUS[0] < f < AMBIGUOUS[1]}
        for category, cap in (targets or {}).items():
            kept = [t for t in things if t.category == category and id(t) not in drop]  # far to near
            drop |= {id(t) for t in kept[:max(0, len(kept) - cap)]}
        # A rider never survives without its bike and vice versa.
        dropped_groups = {t.group for t in things if id(t) in drop and t.group >= 0}
        drop |= {id(t) for t in things if t.group in dropped_groups and t.group >= 0}
        if not drop:
            return list(zip(things, hidden))
        things = [t for t in things if id(t) not in drop]


# Background
@lru_cache(maxsize=32)
def _sky(width: int, height: int, timeofday: str, weather: str) -> Image.Image:
    top, bottom = SKY[(timeofday, weather)]
    t = np.linspace(0.0, 1.0, height)[:, None]
    column = (np.array(top)[None, :] * (1 - t) + np.array(bottom)[None, :] * t).astype(np.uint8)
    return Image.fromarray(column[:, None, :]).resize((width, height), Image.NEAREST)


def _draw_background(img: Image.Image, layout: Layout, cam: Camera, shade) -> None:
    d = ImageDraw.Draw(img)
    w, h, hz = cam.w, cam.h, cam.horizon
    night = layout.timeofday == "night"
    city, urban = layout.scene == "city street", layout.scene != "highway"
    snow = layout.weather == "snowy"
    if not night:
        for cx, cy, r in layout.decor["clouds"]:
            c = shade((235, 235, 240) if layout.weather in ("clear", "partly cloudy") else (120, 122, 128))
            d.ellipse((cx - r, cy - r * 0.35, cx + r, cy + r * 0.35), fill=c)
    hills = layout.decor["hills"]  # distant hills or a skyline on the horizon
    if city:
        for i, v in enumerate(hills):
            bx = w * i / len(hills)
            d.rectangle((bx, hz - 20 - v * 70, bx + w / len(hills) * 0.8, hz), fill=shade((120, 125, 135)))
    else:
        pts = [(0, hz)] + [(w * i / (len(hills) - 1), hz - 10 - v * 45) for i, v in enumerate(hills)] + [(w, hz)]
        d.polygon(pts, fill=shade((80, 110, 80)))
    ground = (225, 228, 232) if snow else (150, 150, 145) if city else (95, 130, 70)
    d.rectangle((0, hz, w, h), fill=shade(ground))
    left, right = road_extent(layout)
    far = 400.0
    road = layout.decor["road"]
    d.polygon(cam.ground_quad(left, right, Z_BOTTOM * 0.5, far), fill=shade(road))
    if layout.cross_street_z:
        d.polygon(cam.ground_quad(-200, 200, *layout.cross_street_z), fill=shade(road))
    if urban:  # curbs
        for lat in (left, right):
            d.polygon(cam.ground_quad(lat - 0.15, lat + 0.15, Z_BOTTOM * 0.5, far), fill=shade((185, 185, 180)))
    else:  # guard rails and verges
        for lat in (left - 0.6, right + 0.6):
            s0, s1 = cam.s_of_z(Z_BOTTOM * 0.5), cam.s_of_z(far)
            pts = [(cam.x(lat, s0), cam.y(s0) - cam.px(0.8, s0)), (cam.x(lat, s1), cam.y(s1) - cam.px(0.8, s1))]
            d.line(pts, fill=shade((170, 170, 175)), width=6)
    _draw_markings(d, layout, cam, shade)
    if urban:
        _draw_buildings(d, layout, cam, shade, night)
    if layout.scene != "city street":
        for tree in sorted(layout.decor["trees"], key=lambda t: -t["z"]):
            s = cam.s_of_z(tree["z"])
            x, y = cam.x(_beside_road(layout, tree["side"], tree["offset"]), s), cam.y(s)
            th, cr = cam.px(tree["height"], s), cam.px(tree["height"] * 0.3, s)
            d.rectangle((x - cr * 0.12, y - th * 0.6, x + cr * 0.12, y), fill=shade((90, 65, 40)))
            g = tuple(int(c * tree["shade"]) for c in (50, 110, 50))
            d.ellipse((x - cr, y - th, x + cr, y - th + 2 * cr), fill=shade(g))
    for side, z in layout.decor["lamps"]:
        s = cam.s_of_z(z)
        x, y = cam.x(_beside_road(layout, side, 0.4), s), cam.y(s)
        top = y - cam.px(7, s)
        d.line([(x, y), (x, top)], fill=shade((90, 90, 95)), width=max(1, round(cam.px(0.15, s))))
        hx = x - side * cam.px(1.2, s)
        d.line([(x, top), (hx, top)], fill=shade((90, 90, 95)), width=max(1, round(cam.px(0.12, s))))
        r = cam.px(0.25, s)
        if night:
            Pen(d, shade).glow(hx, top + r, r, (255, 220, 150), 0.9)
        d.ellipse((hx - r, top, hx + r, top + r * 1.2), fill=(255, 230, 170) if night else shade((200, 200, 190)))
    _draw_clutter(d, layout, cam, shade)


def _draw_clutter(d: ImageDraw.ImageDraw, layout: Layout, cam: Camera, shade) -> None:
    """Unlabelled things beside the road, far to near, under every labelled object (drawn after them, which they
    never hide): poles, boxes and bins, bushes, bollards, fences and billboards. Real frames are full of detail
    that is no object of the ten categories; without it a model learns that any detail is one (structured domain
    randomisation's distractors)."""
    rng = np.random.default_rng(layout.decor["clutter_seed"])
    items = []
    for _ in range(int(rng.integers(10, 60))):
        kind = _choice(rng, ("pole", "box", "bush", "bollard", "fence", "billboard"), p=(0.3, 0.2, 0.2, 0.1, 0.1, 0.1))
        side, z = int(rng.choice((-1, 1))), float(rng.uniform(MIN_Z, 90.0))
        lateral = _beside_road(layout, side, float(rng.uniform(0.2, 6.0)))
        color = tuple(int(v) for v in rng.integers(20, 235, size=3))
        size = {"pole": (rng.uniform(0.08, 0.3), rng.uniform(2.0, 9.0)), "box": (rng.uniform(0.4, 1.6),
                rng.uniform(0.5, 1.6)), "bush": (rng.uniform(0.8, 3.0), rng.uniform(0.5, 2.0)),
                "bollard": (rng.uniform(0.12, 0.3), rng.uniform(0.6, 1.1)), "fence": (rng.uniform(3.0, 15.0),
                rng.uniform(0.7, 1.3)), "billboard": (rng.uniform(2.0, 6.0), rng.uniform(1.0, 3.0))}[kind]
        items.append((z, kind, lateral, color, tuple(float(v) for v in size), float(rng.uniform(3.0, 7.0))))
    for z, kind, lateral, color, (width_m, height_m), lift_m in sorted(items, reverse=True):
        s = cam.s_of_z(z)
        x, y = cam.x(lateral, s), cam.y(s)
        if kind == "fence":  # along the road: from z to z + its length
            quad = [(x, y), (x, y - cam.px(height_m, s))]
            s1 = cam.s_of_z(z + width_m)
            x1, y1 = cam.x(lateral, s1), cam.y(s1)
            d.polygon(quad + [(x1, y1 - cam.px(height_m, s1)), (x1, y1)], fill=shade(color))
            continue
        half, top = cam.px(width_m, s) / 2, y - cam.px(height_m, s)
        if kind == "bush":
            d.ellipse((x - half, top, x + half, y + cam.px(0.1, s)), fill=shade((color[0] // 3, 60 + color[1] // 3,
                                                                                  color[2] // 4)))
        elif kind == "billboard":  # a board on a post, its face in stripes of colour
            post = y - cam.px(lift_m, s)
            d.line([(x, y), (x, post)], fill=shade((80, 80, 85)), width=max(1, round(cam.px(0.2, s))))
            d.rectangle((x - half, post - cam.px(height_m, s), x + half, post), fill=shade(color))
            d.rectangle((x - half * 0.8, post - cam.px(height_m * 0.7, s), x + half * 0.3, post - cam.px(height_m * 0.4,
                                                                                                       s)),
                        fill=shade(tuple(255 - c for c in color)))
        else:
            d.rectangle((x - half, top, x + half, y), fill=shade(color))


def _texture(img: Image.Image, seed: int) -> Image.Image:
    """The background with a blotchy texture on every surface (asphalt, facades, grass): its light varied by up to
    about 12% in patches of a few to tens of pixels. Labelled objects are drawn after it."""
    w, h = img.size
    rng = np.random.default_rng(seed)
    fine = Image.fromarray(rng.normal(1.0, 0.06, (h // 4, w // 4)).astype(np.float32)).resize((w, h), Image.BILINEAR)
    coarse = Image.fromarray(rng.normal(1.0, 0.06, (h // 32, w // 32)).astype(np.float32)).resize((w, h),
                                                                                                 Image.BICUBIC)
    gain = np.asarray(fine) * np.asarray(coarse)  # [H, W]
    return Image.fromarray(np.clip(np.asarray(img, dtype=np.float32) * gain[..., None], 0, 255).astype(np.uint8))


def _draw_markings(d: ImageDraw.ImageDraw, layout: Layout, cam: Camera, shade) -> None:
    white, yellow = shade((230, 230, 225)), shade((230, 190, 40))
    left, right = road_extent(layout)
    urban = layout.scene != "highway"
    boundaries = [(-LANE_M / 2 - i * LANE_M) for i in range(layout.lanes_left)] + \
                 [(LANE_M / 2 + i * LANE_M) for i in range(layout.lanes_right)]
    center = -LANE_M / 2 if urban else None  # two-way street: double yellow left of the ego lane
    for lat in boundaries:
        z = Z_BOTTOM * 0.6
        while z < 120:
            if layout.cross_street_z and layout.cross_street_z[0] - 4 < z < layout.cross_street_z[1]:
                z += 3
                continue
            if lat == center:
                d.polygon(cam.ground_quad(lat - 0.22, lat - 0.08, z, z + 3), fill=yellow)
                d.polygon(cam.ground_quad(lat + 0.08, lat + 0.22, z, z + 3), fill=yellow)
                z += 3
            else:
                d.polygon(cam.ground_quad(lat - 0.08, lat + 0.08, z, z + 3), fill=white)
                z += 12
    for lat in (left + 0.3, right - 0.3):
        d.polygon(cam.ground_quad(lat - 0.08, lat + 0.08, Z_BOTTOM * 0.6, 150), fill=white)
    if layout.crosswalk_z:
        z = layout.crosswalk_z
        lat = left
        while lat < right:
            d.polygon(cam.ground_quad(lat, min(lat + 0.5, right), z, z + 3.0), fill=white)
            lat += 1.0
        d.polygon(cam.ground_quad(-LANE_M / 2, right, z - 0.8, z - 0.4), fill=white)  # stop line


def _draw_buildings(d: ImageDraw.ImageDraw, layout: Layout, cam: Camera, shade, night: bool) -> None:
    # in front of the facades: a sidewalk, or (residential) lawns
    front = (160, 160, 155) if layout.scene == "city street" else (95, 130, 70)
    if layout.weather == "snowy":
        front = (225, 228, 232)
    for b in sorted(layout.decor["buildings"], key=lambda b: -b["z0"]):
        lat, curb = _beside_road(layout, b["side"], b["setback"]), _beside_road(layout, b["side"], 0.0)
        s0, s1 = cam.s_of_z(b["z0"]), cam.s_of_z(b["z1"])
        xa, xb = cam.x(lat, s0), cam.x(lat, s1)
        ya, yb = cam.y(s0), cam.y(s1)
        ha, hb = cam.px(b["height"], s0), cam.px(b["height"], s1)
        d.polygon([(xa, ya), (xb, yb), (xb, yb - hb), (xa, ya - ha)], fill=shade(b["color"]))
        d.polygon([(cam.x(curb, s0), ya), (cam.x(curb, s1), yb), (xb, yb), (xa, ya)], fill=shade(front))
        floors, cols = b["floors"], b["cols"]
        for i in range(floors):
            for j in range(cols):
                u0, u1 = (j + 0.2) / cols, (j + 0.8) / cols
                v0, v1 = (i + 0.25) / floors, (i + 0.7) / floors
                # u runs along the facade, v down from the roof line: interpolate its x, base y and height
                quad = [(xa + (xb - xa) * u, ya + (yb - ya) * u - (ha + (hb - ha) * u) * (1 - v))
                        for u, v in ((u0, v0), (u1, v0), (u1, v1), (u0, v1))]
                lit = night and b["lit"][(i * cols + j) % 64] < 0.45
                d.polygon(quad, fill=(255, 210, 120) if lit else shade((40, 50, 60)))


def _apply_weather(img: Image.Image, layout: Layout, cam: Camera) -> Image.Image:
    w, h = cam.w, cam.h
    if layout.weather == "foggy":
        fog_rgb = {"daytime": (205, 208, 210), "dawn/dusk": (195, 175, 160), "night": (70, 70, 76)}[layout.timeofday]
        rows = np.arange(h, dtype=np.float64)
        depth = np.clip((rows - cam.horizon) / (h - cam.horizon), 0.0, 1.0)
        alpha = np.where(rows < cam.horizon, 0.7, 0.5 * np.exp(-3.5 * depth) + 0.1)
        mask = Image.fromarray((np.clip(alpha, 0, 1) * 255).astype(np.uint8)[:, None]).resize((w, h), Image.NEAREST)
        img = Image.composite(Image.new("RGB", (w, h), fog_rgb), img, mask)
    elif layout.weather == "rainy":
        rng = np.random.default_rng(layout.decor["rain_seed"])
        xs, ys, lengths = rng.uniform(-100, w, 700), rng.uniform(-50, h, 700), rng.uniform(15, 45, 700)  # 700 streaks
        c = (150, 155, 165) if layout.timeofday != "night" else (80, 85, 95)
        d = ImageDraw.Draw(img)
        for x, y, ln in zip(xs, ys, lengths):
            d.line([(x, y), (x + ln * 0.25, y + ln)], fill=c, width=1)
    elif layout.weather == "snowy":
        rng = np.random.default_rng(layout.decor["rain_seed"])
        xs, ys, radii = rng.uniform(0, w, 900), rng.uniform(0, h, 900), rng.uniform(0.8, 3.0, 900)  # flakes
        c = (235, 235, 240) if layout.timeofday != "night" else (120, 120, 128)
        d = ImageDraw.Draw(img)
        for x, y, r in zip(xs, ys, radii):
            d.ellipse((x - r, y - r, x + r, y + r), fill=c)
    return img


# Public entry point
def render_scene(seed: int | np.random.SeedSequence, name: str, config: RenderConfig) -> tuple[Image.Image, Scene]:
    """Render one scene from ``seed``; return the RGB image and its normalised labels."""
    layout = sample_layout(np.random.default_rng(seed), config)
    return render_layout(layout, settle_occlusion(layout.things, config.width, config.height, layout.targets),
                         name, config)


def with_visibility(things: list[Thing], width: int, height: int) -> list[tuple[Thing, float]]:
    """``things`` far to near, each with the fraction of it that nearer things hide; none is removed."""
    things = sorted(things, key=lambda t: t.depth)
    return list(zip(things, _visibility(things, width, height)))


def render_layout(layout: Layout, settled: list[tuple[Thing, float]], name: str, config: RenderConfig
                  ) -> tuple[Image.Image, Scene]:
    """Paint ``layout`` with the ``settled`` things (far to near, with hidden fractions); return image and labels."""
    w, h = config.width, config.height
    cam = Camera(w, h, layout.horizon, layout.vanish_x)
    shade = make_shade(layout.timeofday, layout.weather)
    img = _sky(w, h, layout.timeofday, layout.weather).copy()
    _draw_background(img, layout, cam, shade)
    img = _texture(img, layout.decor["clutter_seed"])
    canvas = ImageDraw.Draw(img)
    for thing, _ in settled:
        DRAW[thing.kind](Pen(canvas, shade), thing)
    img = apply_camera(_apply_weather(img, layout, cam), layout.decor["camera"])

    drawn = [t for t, _ in settled]
    lamp_hidden = {id(t): _lamp_hidden(drawn, k) for k, t in enumerate(drawn) if t.light_color}
    objects = []
    for k, (t, hidden) in enumerate(sorted(settled, key=lambda th: (th[0].box[0], th[0].box[1]))):
        x1, y1, x2, y2 = t.box
        clipped = tuple(round(v, 3) for v in (max(0.0, x1), max(0.0, y1), min(float(w), x2), min(float(h), y2)))
        objects.append(SceneObject(
            id=str(k), category=t.category, box=clipped, occluded=hidden >= OCCLUDED_MIN,
            truncated=x1 < 0 or y1 < 0 or x2 > w or y2 > h,
            light_color=t.light_color if lamp_hidden.get(id(t), 1.0) <= LAMP_HIDDEN_MAX else None))
    return img, Scene(name=name, weather=layout.weather, scene=layout.scene, timeofday=layout.timeofday,
                      objects=tuple(objects))
