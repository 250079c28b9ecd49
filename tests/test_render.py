import dataclasses
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from vlm.scenes import render, statistics
from vlm.scenes.generate import ScenesConfig, ScenesRuntime, generate_synthetic, load_raw
from vlm.scenes.render import render_scene, sample_layout, settle_occlusion
from vlm.scenes.schema import CATEGORIES, scene_from_frame, scene_to_frame

DEFAULTS = ScenesConfig().render_config  # the frames of params.yaml's scenes: section
W, H = DEFAULTS.width, DEFAULTS.height


@pytest.fixture(scope="module")
def scenes():
    return [render_scene(np.random.SeedSequence([7, i]), f"{i:06d}.jpg", DEFAULTS) for i in range(160)]


def test_same_seed_same_pixels_and_labels():
    a_img, a = render_scene(np.random.SeedSequence([3, 5]), "a.jpg", DEFAULTS)
    b_img, b = render_scene(np.random.SeedSequence([3, 5]), "a.jpg", DEFAULTS)
    assert a_img.tobytes() == b_img.tobytes() and a == b
    c_img, _ = render_scene(np.random.SeedSequence([3, 6]), "a.jpg", DEFAULTS)
    assert c_img.tobytes() != a_img.tobytes()


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_stage_output_is_byte_identical_whatever_the_worker_count(tmp_path):
    config = ScenesConfig(num_images=12, seed=1)
    one = generate_synthetic(config, tmp_path / "one", progress=False, runtime=ScenesRuntime(workers=1))
    two = generate_synthetic(config, tmp_path / "two", progress=False, runtime=ScenesRuntime(workers=2))
    assert one["images"] == two["images"] == 12
    digest_one = _tree_digest(tmp_path / "one")
    digest_two = _tree_digest(tmp_path / "two")
    # source.json names its own folder; everything else must match byte for byte.
    digest_one.pop("source.json"), digest_two.pop("source.json")
    assert digest_one == digest_two and len(digest_one) == 13
    raw = load_raw(tmp_path / "one")
    assert (raw.width, raw.height, raw.source) == (W, H, "synthetic")
    assert raw.image_dir == tmp_path / "one" / "images"
    assert [s.name for s in raw.scenes] == [f"{i:06d}.jpg" for i in range(12)]


def _die(job) -> None:
    os._exit(1)


def test_a_render_process_that_dies_fails_the_stage_and_leaves_no_folder(tmp_path, monkeypatch):
    """A worker killed (the OOM killer, say) stops the stage with one line, not a wait forever for its images."""
    from vlm.scenes import generate

    monkeypatch.setattr(generate, "_render_one", _die)
    with pytest.raises(ChildProcessError, match="a render process died .* lower runtime.scenes.workers"):
        generate_synthetic(ScenesConfig(num_images=12), tmp_path / "raw", progress=False,
                           runtime=ScenesRuntime(workers=2))
    assert list(tmp_path.iterdir()) == []


def test_failed_render_leaves_no_output(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(render, "render_scene", boom)
    monkeypatch.setattr("vlm.scenes.generate.render_scene", boom)
    with pytest.raises(RuntimeError):
        generate_synthetic(ScenesConfig(num_images=3), tmp_path / "raw", progress=False,
                           runtime=ScenesRuntime(workers=1))
    assert list(tmp_path.iterdir()) == []


def test_labels_are_valid_det20(scenes):
    for image, scene in scenes:
        assert image.size == (W, H) and image.mode == "RGB"
        frame = json.loads(json.dumps(scene_to_frame(scene)))
        assert scene_from_frame(frame) == scene
        assert scene.weather in render.WEATHERS
        assert scene.scene in {"city street", "highway", "residential"}
        assert scene.timeofday in {"daytime", "dawn/dusk", "night"}
        for o in scene.objects:
            x1, y1, x2, y2 = o.box
            assert o.category in CATEGORIES
            assert 0 <= x1 < x2 <= W and 0 <= y1 < y2 <= H
            assert o.light_color is None or o.category == "traffic light"
        ids = [o.id for o in scene.objects]
        assert len(set(ids)) == len(ids)


def test_variety(scenes):
    counts = {c: Counter(sum(o.category == c for o in s.objects) for _, s in scenes) for c in ("car", "pedestrian")}
    assert min(counts["pedestrian"]) == 0  # BDD100K: a third of frames hold a pedestrian, nearly all a car
    for category, histogram in counts.items():
        assert max(histogram) >= 10, f"scenes need at least 10 {category}s at times, got {sorted(histogram)}"
    present = Counter(o.category for _, s in scenes for o in s.objects)
    for category in CATEGORIES:
        if category not in ("train", "motorcycle"):  # in under 3% of BDD100K's frames, so of these 160 too
            assert present[category] > 0, category
    assert {s.timeofday for _, s in scenes} == {"daytime", "dawn/dusk", "night"}
    assert {s.weather for _, s in scenes} >= {"clear", "overcast", "snowy", "rainy", "partly cloudy"}
    assert {s.scene for _, s in scenes} == {"city street", "highway", "residential"}
    lights = Counter(o.light_color for _, s in scenes for o in s.objects if o.category == "traffic light")
    assert set(lights) == {"red", "yellow", "green", None}
    assert any(o.occluded for _, s in scenes for o in s.objects)
    assert any(o.truncated for _, s in scenes for o in s.objects)


def test_occlusion_flags_are_unambiguous():
    for i in range(40):
        layout = sample_layout(np.random.default_rng([9, i]), DEFAULTS)
        for _, hidden in settle_occlusion(layout.things, W, H):
            assert not (render.AMBIGUOUS[0] < hidden < render.AMBIGUOUS[1])
            assert hidden <= render.HIDDEN_MAX


def test_lit_traffic_lights_show_their_colour(scenes):
    """The label matches the pixels: a labelled light's box holds a pixel of its lamp's hue, through the camera's
    blur, white balance, noise and compression (lights at least 20 px high, BDD100K's median: a lamp of 4 px)."""
    hue = {"red": lambda p: p[:, 0] - np.maximum(p[:, 1], p[:, 2]), "green": lambda p: p[:, 1] - p[:, 0],
           "yellow": lambda p: np.minimum(p[:, 0], p[:, 1]) - p[:, 2]}
    checked = 0
    for image, scene in scenes:
        if scene.weather not in ("clear", "partly cloudy", "overcast"):
            continue
        pixels = np.asarray(image, dtype=np.int16)
        for o in scene.objects:
            x1, y1, x2, y2 = (int(v) for v in o.box)
            if o.light_color is None or y2 - y1 < 20:
                continue
            crop = pixels[y1:y2 + 1, x1:x2 + 1].reshape(-1, 3)
            assert hue[o.light_color](crop).max() > 20, (scene.name, o)  # another colour's lamp: at most about 0
            checked += 1
    assert checked >= 5


def test_a_light_is_read_from_its_lit_lamp_not_its_housing():
    """A nearer sign hides the bottom of a light's housing: lit red (the top lamp) it is read, though occluded; lit
    green (the bottom lamp, hidden) it has no colour."""
    layout = sample_layout(np.random.default_rng(3), DEFAULTS)
    style = {"overhead": False, "pole_x": 615.0, "ground_y": 400.0, "lamp_d": 20.0, "facing": True}
    red = render.Thing("traffic light", "traffic_light", (600.0, 100.0, 630.0, 170.0), 0.2, style, light_color="red")
    cover = render.Thing("traffic sign", "traffic_sign", (590.0, 140.0, 640.0, 190.0), 0.3,
                         {"shape": "rect_blue", "ground_y": 400.0, "pole_x": 615.0})
    for light, expected in ((red, "red"), (dataclasses.replace(red, light_color="green"), None)):
        _, scene = render.render_layout(layout, render.with_visibility([light, cover], W, H), "x.jpg", DEFAULTS)
        (labelled,) = [o for o in scene.objects if o.category == "traffic light"]
        assert labelled.occluded and labelled.light_color == expected


def test_night_to_day_turns_the_vehicles_lamps_off():
    from vlm import scene_edits as edits

    originals = (edits.render(np.random.SeedSequence([5, i]), "x.jpg", DEFAULTS) for i in range(60))
    original = next(r for r in originals if r.layout.timeofday == "night"
                    and any(t.style.get("lights_on") for t, _ in r.settled))
    _, scene, things, _ = edits.night_to_day(original, np.random.default_rng(0), DEFAULTS)
    assert scene.timeofday == "daytime"
    assert not any(t.style.get("lights_on") for t in things)


def test_objects_take_life_size_from_bdd100k_statistics(scenes):
    """The rendered boxes' median heights are within 35% of BDD100K's (the committed statistics), cars per frame
    within 3 of BDD100K's median of 9."""
    world = statistics.load()
    middle = world["quantiles"].index(0.5)
    for category in ("car", "pedestrian", "traffic light", "traffic sign"):
        heights = [o.box[3] - o.box[1] for _, s in scenes for o in s.objects if o.category == category]
        real = world["box_height"][category][middle]
        assert abs(np.median(heights) / real - 1) < 0.35, (category, np.median(heights), real)
    cars = [sum(o.category == "car" for o in s.objects) for _, s in scenes]
    assert abs(np.median(cars) - 9) <= 3, np.median(cars)


def test_night_skies_are_not_blue_whatever_the_weather():
    """A dashcam's night sky is near black with a warm city glow, clear or not: a blue clear night would make a grey
    one (a real night's) read as rain or fog."""
    for (timeofday, weather), colours in render.SKY.items():
        if timeofday == "night":
            assert all(blue <= red for red, _, blue in colours), (weather, colours)
