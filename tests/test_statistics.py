"""BDD100K's statistics: derived from a labels file by a command, and the committed file the renderer reads."""

import json

import pytest

from vlm.scenes import statistics
from vlm.scenes.schema import CATEGORIES


def frame(name, timeofday, scene, cars, light_height=None):
    labels = [{"category": "car", "box2d": {"x1": 10.0 * i, "y1": 300.0, "x2": 10.0 * i + 40, "y2": 330.0}}
              for i in range(cars)]
    if light_height:
        labels.append({"category": "traffic light", "box2d": {"x1": 600.0, "y1": 100.0, "x2": 610.0,
                                                              "y2": 100.0 + light_height}})
    return {"name": name, "attributes": {"weather": "clear", "timeofday": timeofday, "scene": scene},
            "labels": labels}


def test_derived_from_a_labels_file_by_its_command(tmp_path):
    frames = [frame("a.jpg", "night", "city street", 2, 20.0), frame("b.jpg", "daytime", "city street", 4),
              frame("c.jpg", "daytime", "highway", 0, 30.0), frame("d.jpg", "undefined", "tunnel", 1)]
    labels = tmp_path / "det_val.json"
    labels.write_text(json.dumps(frames))
    occlusion = tmp_path / "frames.csv"
    occlusion.write_text("name,object_count,occluded_ratio\na.jpg,10,0.5\nb.jpg,30,0.3\n")
    out = tmp_path / "stats.json"
    statistics.main([str(labels), "--occlusion", str(occlusion), "--out", str(out)])
    stats = json.loads(out.read_text())
    assert stats["frames"] == 4
    assert stats["attributes"]["timeofday"] == {"daytime": pytest.approx(2 / 3, abs=1e-4),
                                                "night": pytest.approx(1 / 3, abs=1e-4)}  # undefined left out
    assert stats["objects_per_frame"]["city street"]["car"] == [0, 0, 0.5, 0, 0.5]  # one frame of 2, one of 4
    assert stats["objects_per_frame"]["highway"]["car"] == [1.0]
    assert stats["box_height"]["traffic light"][0] == 20.0 and stats["box_height"]["traffic light"][-1] == 30.0
    assert stats["occluded_share"] == pytest.approx((5 + 9) / 40, abs=1e-4)
    assert stats["source"]["command"] == ("python -m vlm.scenes.statistics /path/to/det_val.json "
                                          "--occlusion /path/to/frames.csv")
    assert "a.jpg" not in out.read_text()  # statistics, not the labels


def test_the_committed_statistics_hold_what_the_renderer_reads():
    stats = statistics.load()
    assert stats["frames"] >= 1000 and stats["source"]["command"].startswith("python -m vlm.scenes.statistics")
    for scene_type in statistics.SCENE_TYPES:
        for category in CATEGORIES:
            shares = stats["objects_per_frame"][scene_type][category]
            assert sum(shares) == pytest.approx(1.0, abs=1e-3), (scene_type, category)
    for category in CATEGORIES:
        assert len(stats["box_height"][category]) == len(stats["quantiles"])
    assert 0.3 < stats["occluded_share"] < 0.6
