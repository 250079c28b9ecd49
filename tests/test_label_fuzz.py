"""Fuzzed BDD100K labels: whatever a labels file holds, the reader either refuses it with a ``LabelError``
naming the file, the frame and the field, or returns scenes the answer rules handle."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vlm.commands.generate import CommandsConfig
from vlm.commands.types import candidates
from vlm.io import iter_json_list, read_json, write_json_list
from vlm.scenes.bdd100k import read_labels
from vlm.scenes.schema import (
    CATEGORIES,
    CATEGORY_ALIASES,
    IGNORED_CATEGORIES,
    MAX_COORDINATE,
    MAX_LABELS_PER_FRAME,
    LabelError,
    scene_from_frame,
    scene_to_frame,
)

OPTIONS = CommandsConfig().asked

# Any JSON value, NaN and infinities included (Python's json reads and writes them).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6)
coordinate = st.floats() | st.integers(-10**12, 10**12) | st.floats(-2000, 3000) | json_values
box = st.fixed_dictionaries({"x1": coordinate, "y1": coordinate, "x2": coordinate, "y2": coordinate}) | json_values
category = (st.sampled_from([*CATEGORIES, *CATEGORY_ALIASES, *IGNORED_CATEGORIES, "drivable area", " Car ", "BUS"])
            | st.text(max_size=12) | json_values)
flag = st.booleans() | st.sampled_from([0, 1, "true", "False"]) | json_values
colour = st.sampled_from(["R", "G", "Y", "NA", "red", "none", ""]) | json_values
label_attributes = st.fixed_dictionaries(
    {}, optional={"occluded": flag, "Truncated": flag, "trafficLightColor": colour}) | json_values
label = st.fixed_dictionaries({"category": category, "box2d": box},
                              optional={"id": json_values, "attributes": label_attributes}) | json_values
attribute = st.sampled_from(["rainy", "night", "highway", "undefined"]) | st.text(max_size=8) | json_values
frame_attributes = st.fixed_dictionaries(
    {}, optional={"weather": attribute, "Scene": attribute, "timeofday": attribute}) | json_values
name = st.text(min_size=1, max_size=16) | st.sampled_from(["a.jpg", "b.jpg", "../c.jpg", "d/e.jpg"]) | json_values
frame = st.fixed_dictionaries({"name": name},
                              optional={"attributes": frame_attributes,
                                        "labels": st.lists(label, max_size=6) | json_values}) | json_values
labels_file = st.lists(frame, max_size=4) | st.fixed_dictionaries({"frames": st.lists(frame, max_size=3)}) | json_values


# Derandomized so that CI sees the same 400 examples every run; the examples below are failures that random
# runs found (a control character in a name, a coordinate finer than the 1/1000 px written back).
@settings(max_examples=400, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=labels_file)
@example(content=[{"name": "\n", "labels": [{"category": "car", "box2d": {"x1": 0, "y1": 1, "x2": 0, "y2": 0}}]}])
@example(content=[{"name": "a\u2028b", "labels": []}])
@example(content=[{"name": "0", "labels": [{"category": "pedestrian",
                                            "box2d": {"x1": 0.0, "y1": -0.0625, "x2": 0.0, "y2": 0.0}}]}])
def test_fuzzed_labels_are_refused_clearly_or_handled(tmp_path, content):
    path = tmp_path / "labels.json"
    path.write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    try:
        scenes, _ = read_labels(path)
    except LabelError as e:
        message = str(e)
        assert message.startswith(f"{path}: ") and "\n" not in message
        assert "frame[" in message or "expected a JSON list of frames" in message
        return
    for scene in scenes:
        assert "/" not in scene.name and scene.name not in (".", "..")
        assert all(abs(v) <= MAX_COORDINATE for obj in scene.objects for v in obj.box)
        for candidate in candidates(scene, 1280, 720, OPTIONS):
            assert isinstance(candidate.answer, str) and candidate.answer
        assert scene_from_frame(scene_to_frame(scene)) == scene  # what the pipeline writes, it reads back


def test_a_million_labels_in_one_frame_are_refused_before_any_is_read():
    frame = {"name": "a.jpg", "labels": [{"category": "car", "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 1}}]
             * 1_000_000}
    with pytest.raises(LabelError, match=rf"frame \(a.jpg\)\.labels: 1,000,000 labels, more than the "
                                         rf"{MAX_LABELS_PER_FRAME:,} a frame may have"):
        scene_from_frame(frame)
    frame["labels"] = frame["labels"][:MAX_LABELS_PER_FRAME]
    assert len(scene_from_frame(frame).objects) == MAX_LABELS_PER_FRAME


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(json_values, max_size=5))
@example(items=["a\u2028b", "c\rd\ne", {"\u0085": []}])
def test_a_json_list_written_one_item_per_line_reads_back_item_by_item(tmp_path, items):
    path = tmp_path / "list.json"
    assert write_json_list(path, iter(items)) == len(items)
    assert json.dumps(list(iter_json_list(path))) == json.dumps(items)
    assert json.dumps(read_json(path)) == json.dumps(items)  # and the file is one JSON document
