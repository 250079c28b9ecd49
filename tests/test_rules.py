"""Every answer rule on hand-built frames, edge cases included."""

import pytest

from vlm.commands import rules
from vlm.commands.generate import CommandsConfig
from vlm.commands.types import candidates
from vlm.scenes.schema import Scene, SceneObject

W, H = 1280, 720


def obj(category, cx=640.0, bottom=700.0, w=40.0, h=80.0, occluded=False, color=None):
    return SceneObject(id="0", category=category, box=(cx - w / 2, bottom - h, cx + w / 2, bottom),
                       occluded=occluded, light_color=color)


def light(color, cx=640.0, size=20.0, occluded=False):
    return obj("traffic light", cx=cx, bottom=200.0, w=size, h=size * 2.5, occluded=occluded, color=color)


def scene(*objects, **attrs):
    return Scene(name="x.jpg", objects=tuple(objects), **attrs)


def test_empty_scene():
    s = scene()
    assert rules.count(s, "car") == 0
    assert rules.is_present(s, "car") == "no"
    assert rules.on_side(s, "car", "left", W) == "no"
    assert rules.light_color(s) == "maybe"
    assert rules.light_is(s, "red") == "maybe"
    assert all(rules.safety(s, m, W, H) == "yes" for m in rules.PATHS)


def test_count_and_presence_include_occluded_objects():
    s = scene(obj("car"), obj("car", occluded=True), obj("pedestrian"))
    assert rules.count(s, "car") == 2
    assert rules.is_present(s, "pedestrian") == "yes"
    assert rules.is_present(s, "bus") == "no"


@pytest.mark.parametrize("cx, left, right", [(100, "yes", "no"), (420, "yes", "no"), (430, "no", "no"),
                                             (850, "no", "no"), (860, "no", "yes"), (W - 1, "no", "yes")])
def test_sides_are_thirds_of_the_width(cx, left, right):
    s = scene(obj("car", cx=cx))
    assert rules.on_side(s, "car", "left", W) == left
    assert rules.on_side(s, "car", "right", W) == right
    assert rules.on_side(s, "bus", "left", W) == "no"


def test_light_colour_rules():
    assert rules.light_color(scene(light("green"))) == "green"
    assert rules.light_color(scene(light(None))) == "maybe"  # unlit or unknown
    # a light partly hidden whose lit lamp is labelled (in view) is read: readability is the lamp's, not the housing's
    assert rules.light_color(scene(light("red", occluded=True))) == "red"
    # Several lights of different colours: the largest readable one governs.
    mixed = scene(light("green", cx=300, size=15), light("red", cx=700, size=30), light("yellow", cx=900, size=20))
    assert rules.light_color(mixed) == "red"
    assert rules.light_is(mixed, "red") == "yes" and rules.light_is(mixed, "green") == "no"
    # An unlit (or hidden-lamp: no colour) larger light does not govern; an occluded one with its lamp in view does.
    assert rules.light_color(scene(light("green", size=15), light("red", size=40, occluded=True))) == "red"
    assert rules.light_color(scene(light("yellow", size=15), light(None, size=40))) == "yellow"
    # Equal sizes: the leftmost, so the answer never depends on label order.
    assert rules.light_color(scene(light("green", cx=800), light("red", cx=200))) == "red"
    assert rules.light_color(scene(light("red", cx=200), light("green", cx=800))) == "red"


def test_safety_priorities():
    ped_straight = obj("pedestrian", cx=640)
    assert rules.safety(scene(light("red")), "straight", W, H) == "no"
    assert rules.safety(scene(light("green"), ped_straight), "straight", W, H) == "no"
    assert rules.safety(scene(light("green"), obj("rider", cx=640)), "straight", W, H) == "no"
    assert rules.safety(scene(light("yellow")), "left", W, H) == "maybe"
    assert rules.safety(scene(light("green"), obj("car", cx=640, occluded=True)), "straight", W, H) == "maybe"
    assert rules.safety(scene(light("green"), obj("car", cx=640)), "straight", W, H) == "yes"  # a visible car: yes
    # NO beats MAYBE: yellow light and a pedestrian in the path.
    assert rules.safety(scene(light("yellow"), ped_straight), "straight", W, H) == "no"
    # An occluded pedestrian in the path is still a pedestrian in the path.
    assert rules.safety(scene(obj("pedestrian", cx=640, occluded=True)), "straight", W, H) == "no"
    # Unlit or missing lights do not matter; a partly hidden one with its lit lamp in view does.
    assert rules.safety(scene(light(None)), "left", W, H) == "yes"
    assert rules.safety(scene(light("red", occluded=True)), "left", W, H) == "no"


def test_a_rider_blocks_a_path_where_its_two_wheeler_meets_the_road():
    """A rider's box ends at the saddle, above the path's rows; the bicycle under it reaches the road in them."""
    bike = obj("bicycle", cx=640, bottom=470, w=90, h=60)  # rows 410-470: it meets the road below PATH_MIN_Y (432)
    rider = SceneObject(id="1", category="rider", box=(630, 355, 660, 425))  # ends at 425, inside the bike's rows
    assert rules.ground_y(scene(bike, rider), rider) == 470
    assert rules.safety(scene(bike, rider), "straight", W, H) == "no"
    assert rules.safety(scene(rider), "straight", W, H) == "yes"  # no two-wheeler under it: its own bottom
    elsewhere = obj("bicycle", cx=200, bottom=470, w=90, h=60)  # not under the rider
    assert rules.ground_y(scene(elsewhere, rider), rider) == 425


def test_only_occluded_objects():
    s = scene(obj("car", cx=600, occluded=True), obj("car", cx=100, occluded=True), light(None, occluded=True))
    assert rules.count(s, "car") == 2
    assert rules.light_color(s) == "maybe"
    assert rules.safety(s, "straight", W, H) == "maybe"
    assert rules.safety(s, "left", W, H) == "maybe"
    assert rules.safety(s, "right", W, H) == "yes"


def test_paths_depend_on_position_and_distance():
    left_ped = scene(obj("pedestrian", cx=200))
    assert [rules.safety(left_ped, m, W, H) for m in ("left", "straight", "right")] == ["no", "yes", "yes"]
    right_ped = scene(obj("pedestrian", cx=1100))
    assert [rules.safety(right_ped, m, W, H) for m in ("left", "straight", "right")] == ["yes", "yes", "no"]
    centre_ped = scene(obj("pedestrian", cx=600))  # in the straight band and the left half
    assert [rules.safety(centre_ped, m, W, H) for m in ("left", "straight", "right")] == ["no", "no", "yes"]
    far_ped = scene(obj("pedestrian", cx=640, bottom=rules.PATH_MIN_Y * H - 1))
    assert rules.safety(far_ped, "straight", W, H) == "yes"
    # Traffic signs and lights are not road users: never in a path.
    assert rules.safety(scene(obj("traffic sign", cx=640, occluded=True)), "straight", W, H) == "yes"


def test_scene_attributes_and_undefined():
    s = scene(weather="rainy", scene="highway", timeofday="night")
    assert [rules.scene_attribute(s, a) for a in ("night", "rain", "fog", "highway")] == ["yes", "yes", "no", "yes"]
    d = scene(weather="foggy", scene="city street", timeofday="dawn/dusk")
    assert [rules.scene_attribute(d, a) for a in ("night", "rain", "fog", "highway")] == ["no", "no", "yes", "no"]
    u = scene()
    assert [rules.scene_attribute(u, a) for a in ("night", "rain", "fog", "highway")] == [None] * 4


def test_candidates_cover_every_type_and_skip_what_cannot_be_asked():
    counting = {"categories": ["car"], "more_than": [1, 3], "max_count": 2}
    options = CommandsConfig(types={"detection": {"categories": ["car", "bus"]}, "counting": counting,
                                    "traffic_light": {}, "spatial": {"categories": ["car"]}, "safety": {},
                                    "scene": {}}).asked
    s = scene(obj("car"), obj("car"), obj("car"), light("red"), weather="clear", scene="highway", timeofday="daytime")
    by_key = {c.key: c.answer for c in candidates(s, W, H, options)}
    assert by_key["detection/present|car"] == "yes" and by_key["detection/present|bus"] == "no"
    assert "counting/how_many|car" not in by_key  # 3 cars > max_count
    assert by_key["counting/more_than|car|1"] == "yes" and by_key["counting/more_than|car|3"] == "no"
    assert by_key["traffic_light/color"] == "red" and by_key["traffic_light/is_color|green"] == "no"
    assert by_key["safety/manoeuvre|left"] == "no"
    assert by_key["scene/highway"] == "yes"
    no_light = {c.key for c in candidates(scene(), W, H, options)}
    assert not any(k.startswith("traffic_light/") for k in no_light)  # nothing to ask about
    assert not any(k.startswith("scene/") for k in no_light)  # undefined attributes
