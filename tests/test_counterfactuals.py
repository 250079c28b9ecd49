"""Counterfactual edits: each changes the answers its definition says, touches only the pixels of what it
edits, the images reach the model as the packed data holds them, and the consistency metrics count what
they say."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from vlm import counterfactuals
from vlm.commands import rules
from vlm.commands.generate import BalancedCommands, CommandsConfig
from vlm.commands.types import candidates
from vlm.config import ParamError
from vlm.counterfactuals import (
    AskedPair,
    CounterfactualsConfig,
    CounterfactualsPaths,
    consistency_table,
    pair_questions,
    summarize,
)
from vlm.io import read_json
from vlm.processor import Processor
from vlm.scene_edits import EDITS, SWITCHED, Pair, _things, make_pairs, render
from vlm.scenes import render as render_module
from vlm.scenes.generate import ScenesConfig, ScenesRuntime, generate_synthetic, image_name, load_raw
from vlm.scenes.render import RenderConfig

CONFIG = RenderConfig(width=640, height=360, max_count=6)
SCENES = range(56)


def _pairs() -> list[Pair]:
    labels = {image_name(i).removesuffix(".jpg"): render(np.random.SeedSequence([3, i]), image_name(i), CONFIG).scene
              for i in SCENES}
    return list(make_pairs(sorted(labels), 3, labels, CONFIG, list(EDITS), seed=0))


@pytest.fixture(scope="module")
def pairs() -> list[Pair]:
    return _pairs()


@pytest.fixture(scope="module")
def drawn_pairs() -> list[Pair]:
    """The pairs as drawn, before the camera (whose blur, glare and compression spread any change a few pixels)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render_module, "apply_camera", lambda image, camera: image)
        return _pairs()


def _by_edit(pairs, edit):
    found = [p for p in pairs if p.edit == edit]
    assert len(found) >= 5, f"{edit} applied to only {len(found)} of {len(SCENES)} scenes"
    return found


def test_make_pairs_refuses_scenes_rendered_with_other_params():
    labels = {"000000": render(np.random.SeedSequence([3, 0]), "000000.jpg", CONFIG).scene}
    with pytest.raises(ValueError, match="scene 000000: re-rendering with the scenes params"):
        list(make_pairs(["000000"], 4, labels, CONFIG, ["mirror"], seed=0))


def test_make_pairs_renders_one_scene_at_a_time():
    """The pairs come scene by scene, so that the stage holds one scene's full-size images at a time: the first
    scene's are given before the second scene is rendered (and found not to be the labelled one)."""
    labels = {"000000": render(np.random.SeedSequence([3, 0]), "000000.jpg", CONFIG).scene,
              "000001": render(np.random.SeedSequence([4, 1]), "000001.jpg", CONFIG).scene}
    pairs = make_pairs(sorted(labels), 3, labels, CONFIG, ["mirror"], seed=0)
    assert next(pairs).original.scene.image_id == "000000"
    with pytest.raises(ValueError, match="scene 000001"):
        next(pairs)


def test_each_edit_changes_the_answers_it_is_about(pairs):
    w, h = CONFIG.width, CONFIG.height
    for pair in _by_edit(pairs, "remove_category"):
        category = pair.description.removeprefix("every ").removesuffix(" removed")
        assert rules.count(pair.original.scene, category) > 0 and rules.count(pair.edited_scene, category) == 0
    for pair in _by_edit(pairs, "add_pedestrian"):
        manoeuvre = next(m for m, action in (("left", "turn left"), ("straight", "go straight"),
                                             ("right", "turn right")) if pair.description.endswith(action))
        assert rules.safety(pair.edited_scene, manoeuvre, w, h) == rules.NO
        assert rules.count(pair.edited_scene, "pedestrian") == rules.count(pair.original.scene, "pedestrian") + 1
    for pair in _by_edit(pairs, "switch_light"):
        before = rules.light_color(pair.original.scene)
        assert rules.light_color(pair.edited_scene) == SWITCHED[before]
    for pair in _by_edit(pairs, "move_left_to_right"):
        category = pair.description.split()[1]
        assert rules.on_side(pair.edited_scene, category, "right", w) == rules.YES
    for pair in _by_edit(pairs, "night_to_day"):
        assert (pair.original.scene.timeofday, pair.edited_scene.timeofday) == ("night", "daytime")
    for pair in _by_edit(pairs, "toggle_fog"):
        assert {pair.original.scene.weather, pair.edited_scene.weather} == {"clear", "foggy"}
    for pair in _by_edit(pairs, "mirror"):
        for category in ("car", "pedestrian", "truck", "bus"):
            assert (rules.on_side(pair.edited_scene, category, "left", w)
                    == rules.on_side(pair.original.scene, category, "right", w))


def _changed_pixels(pair: Pair) -> np.ndarray:
    before = np.asarray(pair.original.image, dtype=np.int16)
    after = np.asarray(pair.edited_image, dtype=np.int16)
    return np.abs(after - before).max(axis=2) > 0  # [H, W]


def _region(things, margin_of) -> np.ndarray:
    mask = np.zeros((CONFIG.height, CONFIG.width), dtype=bool)
    for t in things:
        x1, y1, x2, y2 = t.box
        margin = margin_of(t)
        mask[max(0, int(y1 - margin)):int(y2 + margin) + 1, max(0, int(x1 - margin)):int(x2 + margin) + 1] = True
    return mask


def _margin(thing) -> float:
    """2 px of anti-aliasing and what a drawing reaches beyond its labelled box: a pedestrian's stride and arms,
    the halo of a vehicle's lamps (each at most a quarter of the box width)."""
    return 2 + 0.25 * (thing.box[2] - thing.box[0])


def test_an_edit_touches_only_the_pixels_of_what_it_edits(drawn_pairs):
    """Removing road users, adding a pedestrian, moving an object, switching a light: every changed pixel of the
    drawn frame lies in the boxes of the things edited, with their anti-aliasing, limbs and lamp halos."""
    checked = 0
    for pair in drawn_pairs:
        before = _things(pair.original)
        if pair.edit == "remove_category" and pair.description.split()[1] in ("car", "truck", "bus", "pedestrian"):
            region = _region([t for t in before if t.category == pair.description.split()[1]], _margin)
        elif pair.edit in ("add_pedestrian", "move_left_to_right"):
            # the thing as it was (moved) and as it is (added or moved): the boxes the edit changed
            after = {t.box: t for t in pair.edited_things}
            changed = [t for t in before if t.box not in after] + [t for box, t in after.items()
                                                                    if box not in {b.box for b in before}]
            region = _region(changed, _margin)
        elif pair.edit == "switch_light":  # a lit lamp's halo reaches a box width around the light
            lights = [t for t in before if t.category == "traffic light"]
            region = _region(lights, lambda t: 1.5 * (t.box[2] - t.box[0]))
        else:
            continue
        changed = _changed_pixels(pair)
        assert changed.any(), pair.description
        assert not (changed & ~region).any(), f"{pair.description}: {int((changed & ~region).sum())} pixels outside"
        checked += 1
    assert checked >= 20


def test_questions_must_change_exactly_where_the_rules_answer_differently(pairs):
    options = CommandsConfig().asked
    answers = {"yes", "no", "maybe", "red", "yellow", "green", *map(str, range(10))}
    for pair in (p for p in pairs if p.edit == "mirror"):
        everything = {(c.template, frozenset(c.params))
                      for c in candidates(pair.original.scene, CONFIG.width, CONFIG.height, options)}
        rows = pair_questions(pair, CONFIG.width, CONFIG.height, options, everything, answers, 3,
                              np.random.default_rng(0))
        changing = [r for r in rows if r["must_change"]]
        if changing:  # a scene with something on one side only
            break
    assert changing and all(r["answer_before"] != r["answer_after"] for r in changing)
    assert len(rows) - len(changing) == 3 and all(r["command_type"] in ("spatial", "safety") for r in changing)


def test_summary_counts_what_it_says():
    pair = AskedPair("mirror", "mirrored", "000001", "000001/0")
    questions = [[{"key": "a", "command": "q1", "command_type": "spatial", "answer_before": "yes",
                   "answer_after": "no", "must_change": True},
                  {"key": "b", "command": "q2", "command_type": "spatial", "answer_before": "no",
                   "answer_after": "yes", "must_change": True},
                  {"key": "c", "command": "q3", "command_type": "scene", "answer_before": "no",
                   "answer_after": "no", "must_change": False}]]
    # right on every original; q1 followed the edit, q2 did not change (wrong after), q3 stayed (right on both)
    predictions = [(["yes", "no", "no"], ["no", "no", "no"])]
    table = consistency_table([pair], questions, predictions)
    assert isinstance(table, pd.DataFrame)
    summary = summarize(table, ["mirror", "toggle_fog"])
    assert list(summary) == ["mirror"]
    assert summary["mirror"] == {"pairs": 1, "questions": 3, "must_change": 2,
                                 "accuracy_original": 1.0, "accuracy_edited": pytest.approx(2 / 3, abs=1e-4),
                                 "consistency": pytest.approx(2 / 3, abs=1e-4), "changed_when_it_must": 0.5,
                                 "stayed_when_it_must": 1.0}


def test_images_reach_the_model_as_the_scenes_stage_saved_them(tmp_path, monkeypatch):
    """The re-rendered originals are JPEG-encoded with ``scenes.jpeg_quality``: the model is handed exactly the
    pixels the packed data holds for the stored images (decoded as the pack stage does)."""
    scenes = ScenesConfig(num_images=40, jpeg_quality=40)
    raw, processed = tmp_path / "raw", tmp_path / "processed"
    generate_synthetic(scenes, raw, progress=False, runtime=ScenesRuntime(workers=1))
    data = load_raw(raw)
    commands = CommandsConfig(questions_per_image=6)
    BalancedCommands(data.iter_scenes, data.width, data.height, commands).write(processed / "commands")
    processor = Processor(tokenizer=None, image_size=64, resample="bicubic")
    answers = sorted({r["answer"] for r in read_json(processed / "commands" / "train.json")})
    loaded = SimpleNamespace(model=None, processor=processor, answers=answers, candidates=lambda: [],
                             label_maps=lambda scenes: None)
    monkeypatch.setattr(counterfactuals, "load_model", lambda *args: loaded)
    handed = {}

    def answer_questions(model, processor, images, questions, candidates, batch_size, device, targets, mirror_targets):
        assert targets is None and mirror_targets is None  # the label maps only for a model that reads them (oracle)
        handed.update(images)
        return np.zeros((len(questions), len(answers)), dtype=np.float32)  # [Q, C]: the first answer everywhere

    monkeypatch.setattr(counterfactuals, "answer_questions", answer_questions)
    sheet = []
    drawn = counterfactuals.plots.counterfactual_sheet
    monkeypatch.setattr(counterfactuals.plots, "counterfactual_sheet",
                        lambda shown: sheet.extend(shown) or drawn(shown))
    paths = CounterfactualsPaths(model=tmp_path / "vlm.pt", data=processed, raw=raw, metrics=tmp_path / "cf.json",
                                 details=tmp_path / "summary.json", table=tmp_path / "cf.csv", plot=tmp_path / "cf.png",
                                 sheet=tmp_path / "sheet.png")
    summary = counterfactuals.run(CounterfactualsConfig(), scenes, commands, paths, progress=False)
    # the headline (a DVC metric): the consistency per edit; the whole summary beside it
    assert summary and read_json(paths.details) == {"counterfactuals": summary}
    assert read_json(paths.metrics) == {"consistency": {edit: rates["consistency"] for edit, rates in summary.items()}}
    originals = [key for key in handed if "/" not in key]  # edited images are keyed "{image id}/{pair}"
    assert originals and len(handed) > len(originals)
    for image_id in originals:
        assert torch.equal(handed[image_id], processor.image(data.image_dir / image_name(int(image_id))))
    # the sheet's pairs, rendered again at full size once the answers are in, are the pairs the model was shown
    assert sheet
    for pair, row in sheet:
        assert torch.equal(processor.rendered(pair.original.image, scenes.jpeg_quality), handed[row.image_id])
        assert torch.equal(processor.rendered(pair.edited_image, scenes.jpeg_quality),
                           handed[f"{row.image_id}/{row.pair}"])
    # no pairs asked for the sheet: its note says so, not that every edit was followed
    notes, note_figure = [], counterfactuals.plots.note_figure
    monkeypatch.setattr(counterfactuals.plots, "note_figure", lambda text: notes.append(text) or note_figure(text))
    counterfactuals.run(CounterfactualsConfig(sheet_examples=0), scenes, commands, paths, progress=False)
    assert notes == ["no pairs asked for the sheet (counterfactuals.sheet_examples: 0)"]


@pytest.mark.parametrize("edits, message", [
    (["mirror", "mirror"], r"counterfactuals\.edits: names an edit twice: \['mirror', 'mirror'\]"),
    (["flip"], r"counterfactuals\.edits: must name some of remove_category, .*got \['flip'\]"),
    ([], r"counterfactuals\.edits: must name some of"),
])
def test_impossible_edits_are_named(edits, message):
    with pytest.raises(ParamError, match=message):
        CounterfactualsConfig(edits=edits).validate()


def test_the_stage_prints_n_a_for_a_rate_that_no_question_measured(tmp_path, monkeypatch, capsys):
    """``summarize`` gives None where an edit had no question of the kind (``unchanged_per_pair: 0``): the stage's
    line says n/a there, not 0.0%."""
    from stages import counterfactuals as stage

    rates = {"pairs": 3, "consistency": 1.0, "changed_when_it_must": 0.5, "stayed_when_it_must": None}
    monkeypatch.setattr(stage, "run_counterfactuals", lambda *args: {"mirror": rates})
    params = Path(__file__).parents[1] / "params.yaml"
    stage.main(["--params", str(params), *[f"--{name}={tmp_path / name}" for name in
                                           ("model", "data", "raw", "metrics", "details", "table", "plot", "sheet",
                                                        "statistics")]])
    assert capsys.readouterr().out.split() == "mirror: 3 pairs, consistency 100.0%, changed when it must 50.0%, " \
                                              "stayed when it must n/a".split()
