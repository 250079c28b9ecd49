import re
from collections import Counter, defaultdict

import numpy as np
import pytest

from vlm.commands import generate
from vlm.commands.generate import BalancedCommands, CommandsConfig, split_images
from vlm.commands.templates import ACTIONS, PLURALS, TEMPLATES
from vlm.commands.types import QUESTION_TYPES
from vlm.config import ParamError, build_config
from vlm.data.commands import SPLITS
from vlm.io import read_json
from vlm.scenes.generate import ScenesConfig, ScenesRuntime, generate_scenes
from vlm.scenes.schema import CATEGORIES, Scene, SceneObject

W, H = ScenesConfig().width, ScenesConfig().height
SINGULAR = {plural: category for category, plural in PLURALS.items()}
VALUES = {"category": CATEGORIES, "plural": tuple(PLURALS.values()), "k": tuple("0123456789"),
          "color": ("red", "yellow", "green"), "side": ("left", "right"), "action": tuple(ACTIONS.values())}
FIELDS = {"question_id", "image_id", "command", "answer", "command_type", "template", "metadata"}


def random_scenes(n: int, seed: int = 0) -> list[Scene]:
    """Label-only scenes with every category, colour and attribute, drawn at random."""
    rng = np.random.default_rng(seed)
    scenes = []
    for i in range(n):
        objects = []
        for k in range(int(rng.integers(0, 14))):
            category = str(rng.choice([c for c in CATEGORIES if c != "train"]))
            cx, bottom = rng.uniform(0, W), rng.uniform(H * 0.4, H)
            w, h = rng.uniform(10, 200), rng.uniform(10, 200)
            color = str(rng.choice(["red", "yellow", "green", "none"])) if category == "traffic light" else "none"
            box = (max(0, cx - w / 2), max(0, bottom - h), min(W, cx + w / 2), bottom)
            objects.append(SceneObject(str(k), category, box, occluded=bool(rng.random() < 0.2),
                                       light_color=None if color == "none" else color))
        scenes.append(Scene(f"img{i:04d}.jpg", weather=str(rng.choice(["clear", "rainy", "foggy"])),
                            scene=str(rng.choice(["city street", "highway"])),
                            timeofday=str(rng.choice(["daytime", "night", "dawn/dusk"])), objects=tuple(objects)))
    return scenes


def generate_commands(scenes: list[Scene], config: CommandsConfig, folder) -> dict[str, list[dict]]:
    """Every split's records as the stage writes them (the scenes given as a stream)."""
    BalancedCommands(lambda: iter(scenes), W, H, config).write(folder)
    return {split: read_json(folder / f"{split}.json") for split in SPLITS}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    return generate_commands(random_scenes(600), CommandsConfig(), tmp_path_factory.mktemp("commands"))


def test_records_follow_the_contract(splits):
    for split, records in splits.items():
        assert records, split
        for r in records:
            assert set(r) == FIELDS
            assert r["command_type"] in QUESTION_TYPES and r["template"] in TEMPLATES
            assert set(r["metadata"]) == {"scene_type", "weather", "timeofday", "num_objects"}
            assert r["command"][0].isupper() and r["command"].endswith(("?", "."))
            assert "{" not in r["command"]
        ids = [r["question_id"] for r in records]
        assert len(ids) == len(set(ids))


def test_splits_are_disjoint_by_image(splits):
    images = {split: {r["image_id"] for r in records} for split, records in splits.items()}
    assert not images["train"] & images["val"]
    assert not images["train"] & images["test"]
    assert not images["val"] & images["test"]
    assert len(images["train"]) > 4 * len(images["test"])


def test_split_images_partition():
    ids = [f"i{k}" for k in range(101)]
    parts = split_images(ids, {"train": 0.8, "val": 0.1, "test": 0.1}, seed=3)
    assert sorted(parts["train"] + parts["val"] + parts["test"]) == sorted(ids)
    assert (len(parts["train"]), len(parts["val"])) == (81, 10)
    assert parts == split_images(list(reversed(ids)), {"train": 0.8, "val": 0.1, "test": 0.1}, seed=3)


def _top_two(counter: Counter) -> tuple[int, int]:
    ranked = sorted(counter.values(), reverse=True) + [0]
    return ranked[0], ranked[1]


def test_answers_balanced_per_type(splits):
    for split, records in splits.items():
        per_type = defaultdict(Counter)
        for r in records:
            per_type[r["command_type"]][r["answer"]] += 1
        assert set(per_type) == set(QUESTION_TYPES), split
        for t, answers in per_type.items():
            top, second = _top_two(answers)
            assert top <= 1.1 * second, (split, t, answers)


def test_traffic_lights_asked_as_often_as_other_types_though_only_half_the_images_have_one(tmp_path):
    """Traffic-light questions need a light; the images with one give that type more of their slots."""
    def one_light_in_every_other(scene: Scene, i: int) -> Scene:
        objects = tuple(o for o in scene.objects if o.category != "traffic light")
        if i % 2:
            objects += (SceneObject("light", "traffic light", (600, 100, 620, 160),
                                    light_color=("red", "yellow", "green")[i // 2 % 3]),)
        return Scene(scene.name, scene.weather, scene.scene, scene.timeofday, objects)

    scenes = [one_light_in_every_other(s, i) for i, s in enumerate(random_scenes(600, seed=1))]
    per_type = Counter(r["command_type"] for r in generate_commands(scenes, CommandsConfig(), tmp_path)["train"])
    assert per_type["traffic_light"] >= 0.9 * max(per_type.values()), per_type


def _key(record: dict) -> tuple:
    """Recover the question key (template + parameters) from the phrased command."""
    for phrasing in TEMPLATES[record["template"]].phrasings:
        pattern = re.escape(phrasing)
        for name, options in VALUES.items():
            pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>{'|'.join(options)})")
        match = re.fullmatch(pattern, record["command"])
        if match:
            values = match.groupdict()
            if "plural" in values:
                values["category"] = SINGULAR[values.pop("plural")]
            return (record["template"], *sorted(values.items()))
    raise AssertionError(f"no phrasing of {record['template']} produces {record['command']!r}")


def test_answers_balanced_per_question_key(splits):
    """Within a template and its parameters the answer is never predictable from the question alone."""
    for split, records in splits.items():
        per_key = defaultdict(Counter)
        for r in records:
            per_key[_key(r)][r["answer"]] += 1
        assert len(per_key) > 30
        for key, answers in per_key.items():
            top, second = _top_two(answers)
            assert second > 0 and top <= 1.1 * second, (split, key, answers)


def test_several_questions_per_image_and_phrasings(splits):
    per_image = Counter(r["image_id"] for r in splits["train"])
    assert np.mean(list(per_image.values())) >= 5
    phrasings = defaultdict(set)
    for r in splits["train"]:
        phrasings[r["template"]].add(r["command"].split()[0])
    assert sum(len(v) > 1 for v in phrasings.values()) >= 8


def _spatial_no_present_elsewhere(records: list[dict], scenes: list[Scene]) -> float:
    """The share of spatial "no" questions whose category the image has (elsewhere than on the asked side)."""
    by_id = {scene.image_id: scene for scene in scenes}
    present = []
    for r in records:
        if r["template"] == "spatial/on_side" and r["answer"] == "no":
            category = next(c for c in ("pedestrian", "truck", "bus", "car") if re.search(rf"\b{PLURALS[c]}\b|\b{c}\b",
                                                                                            r["command"]))
            present.append(any(o.category == category for o in by_id[r["image_id"]].objects))
    return float(np.mean(present))


def test_hard_negatives_change_the_train_split_only(tmp_path, splits):
    """commands.train_hard_negatives: the more train images prefer them, the more of the train split's spatial "no"
    questions are about a category the image has elsewhere rather than an absent one; the answers stay balanced,
    and val and test are the same questions whatever the share."""
    scenes = random_scenes(600)
    by_share = {share: generate_commands(scenes, CommandsConfig(train_hard_negatives=share), tmp_path / str(share))
                for share in (0.0, 1.0)}
    by_share[0.5] = splits  # the default
    for records in by_share.values():
        assert records["val"] == splits["val"] and records["test"] == splits["test"]
    none, half, every = (_spatial_no_present_elsewhere(by_share[s]["train"], scenes) for s in (0.0, 0.5, 1.0))
    assert none + 0.1 < half < every - 0.1, (none, half, every)
    hard = by_share[1.0]
    answers = Counter(r["answer"] for r in hard["train"] if r["template"] == "spatial/on_side")
    assert max(answers.values()) <= 1.1 * min(answers.values()) + 1


def test_deterministic(tmp_path):
    scenes = random_scenes(120, seed=4)
    first = generate_commands(scenes, CommandsConfig(), tmp_path / "a")
    assert generate_commands(scenes, CommandsConfig(), tmp_path / "b") == first
    assert (tmp_path / "a" / "train.json").read_bytes() == (tmp_path / "b" / "train.json").read_bytes()
    assert generate_commands(scenes, CommandsConfig(seed=1), tmp_path / "c") != first


def test_stats_count_every_question(tmp_path):
    commands = BalancedCommands(lambda: iter(random_scenes(200, seed=5)), W, H, CommandsConfig())
    commands.write(tmp_path)
    stats = commands.stats
    for split in SPLITS:
        records = read_json(tmp_path / f"{split}.json")
        assert stats[split]["questions"] == len(records)
        assert stats[split]["images"] == len({r["image_id"] for r in records}) == len(commands.images(split))
        per_type = defaultdict(Counter)
        for r in records:
            per_type[r["command_type"]][r["answer"]] += 1
        assert {t: v["answers"] for t, v in stats[split]["types"].items()} == per_type
        assert sum(t["questions"] for t in stats[split]["types"].values()) == len(records)


def test_the_scenes_are_read_three_times_as_a_stream_and_the_collected_images_come_back(tmp_path):
    scenes, reads = random_scenes(150, seed=6), []

    def stream():
        reads.append(1)
        yield from scenes  # a generator: nothing can index or hold it

    commands = BalancedCommands(stream, W, H, CommandsConfig())
    shown = commands.images("test")[:3]
    collected = commands.write(tmp_path, collect=set(shown))
    assert len(reads) == 3
    test = read_json(tmp_path / "test.json")
    assert [name for name, _ in collected] == [f"{image_id}.jpg" for image_id in shown]
    for (_, records), image_id in zip(collected, shown):
        assert records == [r for r in test if r["image_id"] == image_id]
    order = [s.image_id for s in scenes]
    positions = [order.index(r["image_id"]) for r in test]
    assert positions == sorted(positions)  # the order of the scenes, an image's questions together


def test_scenes_that_change_between_reads_are_an_error(tmp_path):
    scenes = random_scenes(60, seed=7)
    commands = BalancedCommands(lambda: iter(scenes), W, H, CommandsConfig())
    scenes.reverse()
    with pytest.raises(ValueError, match="scenes: frame 0 changed while the questions were generated"):
        commands.write(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written is left


@pytest.mark.parametrize("values, message", [
    ({"splits": {"train": 0.8, "val": 0.1}}, "commands.splits: must name exactly train, val, test"),
    ({"splits": {"train": 0.8, "val": 0.3, "test": 0.1}}, "fractions must sum to 1"),
    ({"questions_per_image": 0}, "commands.questions_per_image: must be at least 1"),
    ({"balance_tolerance": 0.5}, "commands.balance_tolerance: must be >= 1.0"),
    ({"types": {"detection": {}, "poetry": {}}}, "commands.types: unknown type 'poetry'"),
    ({"types": {}}, "commands.types: asks no question type"),
    ({"types": {"counting": {"categories": ["unicorn"]}}},
     "commands.types.counting.categories: unknown category 'unicorn'"),
    ({"types": {"counting": {"max_count": 12}}}, "commands.types.counting.max_count: must be in 0..9"),
    ({"types": {"counting": {"more_than": [1, 2, 2]}}},
     "commands.types.counting.more_than: names a value twice: [1, 2, 2]"),
    ({"types": {"counting": {"categories": ["car", "car"]}}},
     "commands.types.counting.categories: names a value twice"),
    ({"types": {"counting": {"categories": []}}}, "commands.types.counting.categories: is empty"),
    ({"types": {"scene": {"categories": ["car"]}}}, "commands.types.scene.categories: unknown key"),
    ({"types": {"scene": []}}, "commands.types.scene: must be a mapping of the type's options"),
    ({"questions_per_image": "many"}, "commands.questions_per_image: must be an integer"),
    ({"train_hard_negatives": 1.5}, "commands.train_hard_negatives: must be a share in .0, 1., got 1.5"),
    ({"colour": 1}, "commands.colour: unknown key"),
    ({"holdout": {"season": "winter"}}, "commands.holdout: unknown frame attribute 'season'"),
    ({"holdout": {"weather": 3}}, "commands.holdout.weather: must be a value such as 'rainy', got 3"),
    ({"holdout": None}, "commands.holdout: must be a mapping, got None"),
    ({"splits": ["train", "val", "test"]}, "commands.splits: must be a mapping, got ['train', 'val', 'test']"),
    ({"seed": -1}, "commands.seed: must be from 0 to 2..32 - 1, got -1"),
])
def test_impossible_params_are_named(values, message):
    escaped = message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ParamError, match=escaped):
        build_config(CommandsConfig, values, "commands")


def test_a_type_asked_with_no_options_takes_its_defaults():
    config = build_config(CommandsConfig, {"types": {"scene": {}, "counting": {"max_count": 5}}}, "commands")
    assert list(config.asked) == ["scene", "counting"]
    assert config.asked["counting"].categories == ["car", "pedestrian"] and config.asked["counting"].max_count == 5
    assert isinstance(build_config(CommandsConfig, {}, "commands").holdout, dict)


def test_empty_scenes_and_a_single_type(tmp_path):
    config = CommandsConfig(types={"scene": {}})
    splits = generate_commands(random_scenes(50, seed=2), config, tmp_path)
    assert {r["command_type"] for rs in splits.values() for r in rs} == {"scene"}
    empty = [Scene(f"e{i}.jpg") for i in range(30)]  # no objects, undefined attributes
    # Nothing about an empty, attribute-less scene has a varying answer: nothing survives balancing.
    with pytest.raises(ValueError, match="no question of split 'train' survived answer balancing"):
        BalancedCommands(lambda: iter(empty), W, H, CommandsConfig())


def test_a_held_out_combination_is_the_test_split_and_nowhere_else(tmp_path):
    scenes = random_scenes(600, seed=4)
    holdout = {"timeofday": "night", "weather": "rainy"}
    splits = generate_commands(scenes, CommandsConfig(holdout=holdout), tmp_path)
    combination = {s.image_id for s in scenes if (s.timeofday, s.weather) == ("night", "rainy")}
    images = {split: {r["image_id"] for r in records} for split, records in splits.items()}
    assert images["test"] and images["test"] <= combination
    assert not (images["train"] | images["val"]) & combination
    assert len(images["train"]) > 6 * len(images["val"])  # 0.8 : 0.1 of the other frames
    with pytest.raises(ValueError, match="commands.holdout: no frame has"):
        BalancedCommands(lambda: iter(scenes), W, H, CommandsConfig(holdout={"weather": "snowy"}))


def test_the_stage_writes_every_split_at_once_and_shows_test_images(tmp_path, monkeypatch):
    """``generate_commands`` on rendered scenes: one file per split, the counts it returns are the files', the sheet's
    images are test images on disk with their questions; a failure while writing leaves no folder behind."""
    raw = tmp_path / "raw"
    generate_scenes(ScenesConfig(num_images=30, width=320, height=180), raw, progress=False,
                    runtime=ScenesRuntime(workers=1))
    stats, shown = generate.generate_commands(CommandsConfig(), raw, tmp_path / "commands", shown=3)
    splits = {split: read_json(tmp_path / "commands" / f"{split}.json") for split in SPLITS}
    assert {split: stats[split]["questions"] for split in SPLITS} == {split: len(r) for split, r in splits.items()}
    test_ids = {r["image_id"] for r in splits["test"]}
    assert len(shown) == min(3, len(test_ids))
    for path, records in shown:
        assert path.is_file() and path.parent == raw / "images"
        assert records and {r["image_id"] for r in records} <= test_ids
        assert records == [r for r in splits["test"] if r["image_id"] == records[0]["image_id"]]

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(BalancedCommands, "write", fail)
    with pytest.raises(OSError, match="disk full"):
        generate.generate_commands(CommandsConfig(), raw, tmp_path / "other")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["commands", "raw"]  # nor a temporary one
