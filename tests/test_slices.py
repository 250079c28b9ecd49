"""Robustness slices: question parameters recovered from the text, conditions computed from the labels."""

import pandas as pd
import pytest

from vlm.commands.generate import CommandsConfig
from vlm.commands.templates import TEMPLATES, Candidate
from vlm.commands.types import candidates
from vlm.commands.types.traffic_light import FAR_LIGHT
from vlm.scenes.schema import CATEGORIES, Scene, SceneObject
from vlm.slices import DIMENSIONS, object_bin, question_conditions, slice_accuracy

WIDTH, HEIGHT = 1280, 720
OPTIONS = CommandsConfig(types={"detection": {"categories": list(CATEGORIES)}, "counting": {
    "categories": list(CATEGORIES), "more_than": [1, 2, 3, 12], "max_count": 9}, "traffic_light": {},
    "spatial": {"categories": list(CATEGORIES)}, "safety": {}, "scene": {}}).asked


def light(height: float, color: str | None = "red", occluded: bool = False, x: float = 600) -> SceneObject:
    return SceneObject("l", "traffic light", (x, 100, x + height / 2, 100 + height), occluded=occluded,
                       light_color=color)


def test_every_phrasing_parses_back_to_its_parameters():
    """Candidate.text and Template.parse are inverses, for every template, phrasing and parameter value."""
    scene = Scene("a.jpg", weather="rainy", scene="highway", timeofday="night",
                  objects=(light(100), SceneObject("c", "car", (0, 500, 100, 600))))
    checked = 0
    for candidate in candidates(scene, WIDTH, HEIGHT, OPTIONS):
        expected = dict(candidate.params)
        for phrasing in range(len(TEMPLATES[candidate.template].phrasings)):
            assert TEMPLATES[candidate.template].parse(candidate.text(phrasing)) == expected
            checked += 1
    assert checked > 300


def test_parse_refuses_other_text():
    with pytest.raises(ValueError, match="no phrasing of the template 'detection/present'"):
        TEMPLATES["detection/present"].parse("Is there a zeppelin?")


def test_conditions_follow_the_labels():
    height = HEIGHT * FAR_LIGHT
    scenes = {
        "near": Scene("n.jpg", objects=(light(2 * height),)),
        "far": Scene("f.jpg", objects=(light(height / 2),)),
        # the governing light is the largest readable one: a big light whose lamp is hidden (no colour) does not
        "far behind an unreadable one": Scene("o.jpg", objects=(light(height / 2),
                                                                 light(4 * height, color=None, occluded=True))),
        "unreadable": Scene("u.jpg", objects=(light(2 * height, color=None),)),
        "no light": Scene("x.jpg", objects=tuple(SceneObject(str(i), "car", (0, 0, 1, 1)) for i in range(12))),
    }
    record = {"command_type": "traffic_light", "template": "traffic_light/color", "command": "What color is the light?"}
    got = {name: question_conditions(record, scene, WIDTH, HEIGHT) for name, scene in scenes.items()}
    assert {name: c["light"] for name, c in got.items()} == {
        "near": "near", "far": "far", "far behind an unreadable one": "far", "unreadable": "unreadable",
        "no light": "no light"}
    assert got["far behind an unreadable one"]["occluded_light"] == "yes" and got["near"]["occluded_light"] == "no"
    assert got["no light"]["objects"] == "10-19" and got["near"]["objects"] == "0-4"
    assert got["near"]["detection_category"] is None and got["near"]["timeofday"] == "undefined"
    detection = {"command_type": "detection", "template": "detection/present",
                 "command": Candidate("detection/present", (("category", "traffic sign"),), "no").text(3)}
    conditions = question_conditions(detection, scenes["near"], WIDTH, HEIGHT)
    assert conditions["detection_category"] == "traffic sign"
    assert conditions["light"] is None and conditions["counting_category"] is None
    cars = (SceneObject("a", "car", (10, 500, 110, 600)), SceneObject("b", "car", (1200, 500, 1270, 600)))
    spatial = {"command_type": "spatial", "template": "spatial/on_side", "command": "Is there a car on the left?"}
    for objects, expected in ((cars, "both"), (cars[:1], "one side"), ((), "neither")):
        assert question_conditions(spatial, Scene("s.jpg", objects=objects), WIDTH, HEIGHT)["spatial_sides"] == expected


@pytest.mark.parametrize(("count", "expected"), [(0, "0-4"), (4, "0-4"), (5, "5-9"), (19, "10-19"), (20, "20+"),
                                                 (10_000, "20+")])
def test_object_bins_cover_every_count(count, expected):
    assert object_bin(count) == expected


def test_slice_accuracy_counts_add_up():
    table = pd.DataFrame({d: None for d in DIMENSIONS}, index=range(6))
    table["weather"] = ["rainy", "rainy", "clear", "clear", "clear", "foggy"]
    table["objects"] = ["10-19", "5-9", "0-4", "20+", "5-9", "0-4"]
    table["ok"] = [True, False, True, True, False, True]
    table["blind_ok"] = [False] * 6
    accuracy, counts = slice_accuracy(table, {"vlm": "ok", "blind": "blind_ok"})
    assert counts == {"weather": {"clear": 3, "foggy": 1, "rainy": 2},
                      "objects": {"0-4": 2, "5-9": 2, "10-19": 1, "20+": 1}}
    assert list(counts["objects"]) == ["0-4", "5-9", "10-19", "20+"]  # bins in numeric order
    assert accuracy["vlm"]["weather"] == {"clear": pytest.approx(2 / 3, abs=1e-4), "foggy": 1.0, "rainy": 0.5}
    assert all(v == 0 for values in accuracy["blind"].values() for v in values.values())
