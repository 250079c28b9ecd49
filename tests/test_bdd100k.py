import json
import shutil

import pytest

from vlm.scenes.bdd100k import MissingImagesError, match_images, read_labels
from vlm.scenes.schema import LabelError, scene_from_frame, scene_to_frame


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def test_det20_fixture_ignored_category_null_labels_capitalised_keys(bdd_fixture_dir):
    path = bdd_fixture_dir / "det20_ignored_and_null_labels.json"
    # neither frame's labels decide every answer: an "other person" is somewhere, or labels: null (not annotated)
    assert read_labels(path) == ([], {"unlabelled": 1, "ignored_regions": 1, "crowd": 0})
    first, second = (scene_from_frame(frame) for frame in json.loads(path.read_text()))
    # "other person" is ignored; "person" (2018 name) becomes pedestrian; "Occluded" is read.
    assert [o.category for o in first.objects] == ["pedestrian"]
    assert first.objects[0].occluded is True and first.objects[0].truncated is False
    assert first.weather == first.scene == first.timeofday == "undefined"
    assert second.objects == ()  # labels: null


def test_det20_fixture_real_frame(bdd_fixture_dir):
    (scene,), _ = read_labels(bdd_fixture_dir / "det20_one_frame_trimmed.json")
    assert (scene.weather, scene.scene, scene.timeofday) == ("overcast", "city street", "daytime")
    assert [o.category for o in scene.objects] == ["traffic sign"] * 4
    assert all(o.light_color is None for o in scene.objects)
    # the file's 1000.698742, 281.992415, 1040.626872, 326.91156 held to 1/1000 px
    assert scene.objects[0].box == (1000.699, 281.992, 1040.627, 326.912)


def test_2018_dialect_names_and_colours():
    frame = {"name": "a.jpg", "attributes": {"weather": "rainy", "scene": "highway", "timeofday": "night"},
             "labels": [
                 {"category": "person", "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 2}},
                 {"category": "bike", "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 2}},
                 {"category": "motor", "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 2}},
                 {"category": "traffic light", "attributes": {"trafficLightColor": "red"},
                  "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 2}},
                 {"category": "traffic light", "attributes": {"trafficLightColor": "none"},
                  "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 2}},
                 {"category": "drivable area", "poly2d": [[0, 0]]},
                 {"category": "lane", "poly2d": [[0, 0]]},
             ]}
    scene = scene_from_frame(frame)
    assert [o.category for o in scene.objects] == ["pedestrian", "bicycle", "motorcycle", "traffic light",
                                                   "traffic light"]
    assert [o.light_color for o in scene.objects[3:]] == ["red", None]


@pytest.mark.parametrize("code, colour", [("G", "green"), ("R", "red"), ("Y", "yellow"), ("NA", None)])
def test_det20_colour_codes(code, colour):
    frame = {"name": "a.jpg", "labels": [{"category": "traffic light", "attributes": {"trafficLightColor": code},
                                          "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 2}}]}
    assert scene_from_frame(frame).objects[0].light_color == colour


def test_round_trip_through_det20():
    frame = {"name": "a.jpg", "attributes": {"weather": "clear", "scene": "highway", "timeofday": "daytime"},
             "labels": [{"id": "7", "category": "traffic light", "attributes": {"occluded": True, "truncated": False,
                                                                               "trafficLightColor": "Y"},
                         "box2d": {"x1": 1.5, "y1": 2.0, "x2": 3.25, "y2": 4.0}}]}
    scene = scene_from_frame(frame)
    assert scene_to_frame(scene) == frame
    assert scene_from_frame(scene_to_frame(scene)) == scene


@pytest.mark.parametrize("label, message", [
    ({"category": "car"}, "labels[0].box2d: missing"),
    ({"category": "car", "box2d": {"x1": 0, "y1": 0, "x2": "wide", "y2": 1}}, "box2d.x2: expected a finite number"),
    ({"category": "car", "box2d": {"x1": 5, "y1": 0, "x2": 1, "y2": 1}}, "x2 < x1"),
    ({"category": "spaceship", "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 1}}, "unknown category 'spaceship'"),
    ({"category": "traffic light", "attributes": {"trafficLightColor": "blue"},
      "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 1}}, "trafficLightColor: unknown colour 'blue'"),
    ({"category": "car", "attributes": {"occluded": "sometimes"}, "box2d": {"x1": 0, "y1": 0, "x2": 1, "y2": 1}},
     "attributes.occluded: expected true/false"),
])
def test_malformed_label_names_file_frame_and_field(tmp_path, label, message):
    frames = [{"name": "ok.jpg", "labels": []}, {"name": "bad.jpg", "labels": [label]}]
    path = write_json(tmp_path / "labels.json", frames)
    with pytest.raises(LabelError) as err:
        read_labels(path)
    text = str(err.value)
    assert str(path) in text and "frame[1] (bad.jpg)" in text and message in text


def test_malformed_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="labels file not found"):
        read_labels(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "a.jpg",]')
    with pytest.raises(ValueError, match=r"bad.json: invalid JSON at line 1, column \d+"):
        read_labels(bad)
    with pytest.raises(LabelError, match="expected a JSON list of frames"):
        read_labels(write_json(tmp_path / "obj.json", {"name": "a.jpg"}))
    with pytest.raises(LabelError, match="frame\\[0\\].name: missing"):
        read_labels(write_json(tmp_path / "noname.json", [{"labels": []}]))
    with pytest.raises(LabelError, match="duplicate image name 'a.jpg'"):
        read_labels(write_json(tmp_path / "dup.json", [{"name": "a.jpg"}, {"name": "a.jpg"}]))


def test_missing_images_error_or_skip(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "f0.jpg").write_bytes(b"x")
    frames = [{"name": f"f{i}.jpg", "labels": []} for i in range(8)]
    scenes, _ = read_labels(write_json(tmp_path / "labels.json", frames))
    with pytest.raises(MissingImagesError) as err:
        match_images(scenes, tmp_path / "img")
    assert "7 of 8 labelled images are missing" in str(err.value)
    assert "f1.jpg, f2.jpg, f3.jpg, f4.jpg, f5.jpg, ..." in str(err.value)
    kept, report = match_images(scenes, tmp_path / "img", on_missing="skip")
    assert [s.name for s in kept] == ["f0.jpg"]
    assert report.missing_images == 7 and report.missing_examples[0] == "f1.jpg"
    with pytest.raises(FileNotFoundError, match="images folder not found"):
        match_images(scenes, tmp_path / "nothing")


def test_scalabel_wrapper_is_accepted(tmp_path):
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"frames": [{"name": "a.jpg", "labels": []}]}))
    assert [s.name for s in read_labels(path)[0]] == ["a.jpg"]


def test_generate_scenes_from_bdd100k_folder(tmp_path, bdd_fixture_dir):
    from PIL import Image

    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes, load_raw

    images = tmp_path / "images"
    images.mkdir()
    for name in ("00091078-875c1f73-0000166.jpg", "00091078-875c1f73-0000167.jpg"):
        Image.new("RGB", (1280, 720), (90, 90, 90)).save(images / name)
    shutil.copy(bdd_fixture_dir / "det20_answerable.json", tmp_path / "labels.json")
    config = ScenesConfig(source="bdd100k",
                          bdd100k=BDD100KConfig(root=str(tmp_path), images="images", labels="labels.json"))
    stats = generate_scenes(config, tmp_path / "raw")
    assert stats == {"source": "bdd100k", "images": 2, "frames_in_labels": 2, "missing_images": 0,
                     "unlabelled_frames": 0, "frames_with_ignored_regions": 0, "frames_with_crowd_boxes": 0}
    raw = load_raw(tmp_path / "raw")
    assert raw.source == "bdd100k" and raw.image_dir == images and (raw.width, raw.height) == (1280, 720)
    assert [o.category for o in raw.scenes[0].objects] == ["pedestrian"]  # normalised from the 2018 "person"
    assert not (tmp_path / "raw" / "images").exists()  # BDD100K images are read in place, not copied

    (images / "00091078-875c1f73-0000167.jpg").unlink()
    with pytest.raises(MissingImagesError, match="1 of 2 labelled images are missing"):
        generate_scenes(config, tmp_path / "raw2")
    assert not (tmp_path / "raw2").exists()
    config.bdd100k.on_missing = "skip"
    assert generate_scenes(config, tmp_path / "raw2")["missing_images"] == 1
    assert [s.name for s in load_raw(tmp_path / "raw2").scenes] == ["00091078-875c1f73-0000166.jpg"]


def test_bdd100k_frames_the_labels_cannot_answer_are_skipped_and_counted(tmp_path, bdd_fixture_dir):
    """An unlabelled frame (labels: null), one with an ignored region ("other person") or a crowd box gives no
    questions."""
    from PIL import Image

    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes, load_raw

    (tmp_path / "images").mkdir()
    frames = [*json.loads((bdd_fixture_dir / "det20_ignored_and_null_labels.json").read_text()),
              *json.loads((bdd_fixture_dir / "det20_one_frame_trimmed.json").read_text())]
    crowd = json.loads(json.dumps(frames[2]))  # the same frame, one of its boxes a crowd's
    crowd["name"], crowd["labels"][0]["attributes"]["crowd"] = "crowd.jpg", True
    frames.append(crowd)
    for frame in frames:
        Image.new("RGB", (1280, 720)).save(tmp_path / "images" / frame["name"])
    write_json(tmp_path / "labels.json", frames)
    config = ScenesConfig(source="bdd100k",
                          bdd100k=BDD100KConfig(root=str(tmp_path), images="images", labels="labels.json"))
    stats = generate_scenes(config, tmp_path / "raw")
    assert (stats["images"], stats["frames_in_labels"]) == (1, 4)
    skipped = ("unlabelled_frames", "frames_with_ignored_regions", "frames_with_crowd_boxes")
    assert [stats[key] for key in skipped] == [1, 1, 1]
    assert [s.name for s in load_raw(tmp_path / "raw").scenes] == [frames[2]["name"]]


def test_bdd100k_images_of_another_size_than_the_frame_stop_the_stage(tmp_path, bdd_fixture_dir):
    """The boxes are read in scenes.width x scenes.height: an image of another size would make every side and
    path answer wrong, so the stage stops naming it."""
    from PIL import Image

    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes

    root = _bdd_root(tmp_path, bdd_fixture_dir)
    small = root / "images" / "100k" / "train" / "00091078-875c1f73-0000167.jpg"
    Image.new("RGB", (640, 360)).save(small)
    config = ScenesConfig(source="bdd100k", bdd100k=BDD100KConfig(root=str(root)))
    with pytest.raises(ValueError, match=r"0000167.jpg: 640x360 pixels, but scenes.width x scenes.height is 1280x720"):
        generate_scenes(config, tmp_path / "raw")
    assert not (tmp_path / "raw").exists()


def test_bdd100k_subset_follows_the_labels_and_seed_not_the_images_on_disk():
    """scenes.bdd100k.max_images: an image missing outside the subset leaves the subset as it was."""
    from vlm.scenes.generate import pick_frames
    from vlm.scenes.schema import Scene

    scenes = [Scene(f"{i:03d}.jpg") for i in range(40)]
    present = {s.name for s in scenes}
    chosen = pick_frames(scenes, present, 8, seed=3)
    assert len(chosen) == 8 and chosen == sorted(chosen, key=scenes.index) == pick_frames(scenes, present, 8, seed=3)
    outside = next(s.name for s in scenes if s not in chosen)
    assert pick_frames(scenes, present - {outside}, 8, seed=3) == chosen
    inside = chosen[0].name  # a missing chosen image: the next of the shuffle takes its place, the rest stay
    assert len(set(pick_frames(scenes, present - {inside}, 8, seed=3)) & set(chosen)) == 7
    assert pick_frames(scenes, present, None, seed=3) == scenes


def _bdd_root(tmp_path, bdd_fixture_dir):
    """A BDD100K folder in the official layout with the fixture's two frames."""
    from PIL import Image

    root = tmp_path / "bdd100k"
    (root / "images" / "100k" / "train").mkdir(parents=True)
    (root / "labels" / "det_20").mkdir(parents=True)
    for name in ("00091078-875c1f73-0000166.jpg", "00091078-875c1f73-0000167.jpg"):
        Image.new("RGB", (1280, 720), (90, 90, 90)).save(root / "images" / "100k" / "train" / name)
    shutil.copy(bdd_fixture_dir / "det20_answerable.json", root / "labels" / "det_20" / "det_train.json")
    return root


def test_a_changed_bdd100k_image_changes_the_raw_folder(tmp_path, bdd_fixture_dir):
    """The stages after generate_scenes read BDD100K images in place: source.json carries their digest, so
    data/raw (their dependency) changes with an image and they re-run."""
    from PIL import Image

    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes

    root = _bdd_root(tmp_path, bdd_fixture_dir)
    config = ScenesConfig(source="bdd100k", bdd100k=BDD100KConfig(root=str(root)))
    generate_scenes(config, tmp_path / "raw1")
    generate_scenes(config, tmp_path / "raw2")
    assert (tmp_path / "raw1" / "source.json").read_text() == (tmp_path / "raw2" / "source.json").read_text()
    image = root / "images" / "100k" / "train" / "00091078-875c1f73-0000166.jpg"
    Image.new("RGB", (1280, 720), (10, 200, 90)).save(image)
    generate_scenes(config, tmp_path / "raw3")
    assert (tmp_path / "raw1" / "labels.json").read_text() == (tmp_path / "raw3" / "labels.json").read_text()
    assert (json.loads((tmp_path / "raw1" / "source.json").read_text())["images_md5"]
            != json.loads((tmp_path / "raw3" / "source.json").read_text())["images_md5"])


@pytest.mark.parametrize("key, value", [("images", "/datasets/bdd100k/images/100k/train"),
                                        ("labels", "../labels/det_20/det_train.json")])
def test_bdd100k_images_and_labels_stay_inside_the_tracked_root(key, value):
    from vlm.config import ParamError, build_config
    from vlm.scenes.generate import ScenesConfig

    with pytest.raises(ParamError, match=rf"scenes.bdd100k.{key}: must be a path inside scenes.bdd100k.root"):
        build_config(ScenesConfig, {"source": "bdd100k", "bdd100k": {key: value}}, "scenes")


def test_missing_bdd100k_root_names_the_param(tmp_path):
    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes

    config = ScenesConfig(source="bdd100k", bdd100k=BDD100KConfig(root=str(tmp_path / "nowhere")))
    with pytest.raises(FileNotFoundError, match=r"BDD100K folder not found: .*nowhere \(scenes.bdd100k.root"):
        generate_scenes(config, tmp_path / "raw")
    config.bdd100k.root = str(tmp_path)  # there, but without the dataset (as in a fresh checkout)
    with pytest.raises(FileNotFoundError, match=r"labels file not found: .*\(scenes.bdd100k.root \+ scenes.bdd100k"
                                                r".labels\): put BDD100K there"):
        generate_scenes(config, tmp_path / "raw")


def test_a_bdd100k_root_set_one_folder_too_high_or_a_path_of_the_wrong_kind_says_so(tmp_path, bdd_fixture_dir):
    """BDD100K's zip files unpack into a bdd100k/ folder of their own: unzipped into data/bdd100k they leave the
    dataset one level down, which the error names, as it names a labels path that is a folder."""
    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes

    top = tmp_path / "top"
    dataset = _bdd_root(top, bdd_fixture_dir)  # top/bdd100k/images/..., top/bdd100k/labels/...
    config = ScenesConfig(source="bdd100k", bdd100k=BDD100KConfig(root=str(top)))
    with pytest.raises(FileNotFoundError, match=rf"but it is at {dataset}/labels/det_20/det_train.json: the zip files "
                                                rf"unpack .* set scenes.bdd100k.root to {dataset} or move"):
        generate_scenes(config, tmp_path / "raw")
    config = ScenesConfig(source="bdd100k", bdd100k=BDD100KConfig(root=str(dataset), labels="labels/det_20"))
    with pytest.raises(FileNotFoundError, match=r"labels file expected at .*det_20 \(scenes.bdd100k.root \+ "
                                                r"scenes.bdd100k.labels\), but it is a folder"):
        generate_scenes(config, tmp_path / "raw")
    (dataset / "labels" / "det_20" / "det_train.json").write_bytes(b"")
    config = ScenesConfig(source="bdd100k", bdd100k=BDD100KConfig(root=str(dataset)))
    with pytest.raises(ValueError, match=r"det_train.json: the BDD100K labels file is empty \(0 bytes\)"):
        generate_scenes(config, tmp_path / "raw")
    assert not (tmp_path / "raw").exists()


def test_a_linked_folder_inside_the_bdd100k_root_is_an_error(tmp_path, bdd_fixture_dir):
    """DVC does not look inside a linked folder of a dependency: its images would be untracked."""
    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes

    dataset = _bdd_root(tmp_path, bdd_fixture_dir)
    root = tmp_path / "linked"
    root.mkdir()
    (root / "images").symlink_to(dataset / "images")
    (root / "labels").symlink_to(dataset / "labels")
    config = ScenesConfig(source="bdd100k", bdd100k=BDD100KConfig(root=str(root)))
    with pytest.raises(ValueError, match=r"linked/images is a symbolic link inside scenes.bdd100k.root"):
        generate_scenes(config, tmp_path / "raw")
    (tmp_path / "dataset-link").symlink_to(dataset)  # the root itself may be a link: DVC follows it
    config.bdd100k.root = str(tmp_path / "dataset-link")
    assert generate_scenes(config, tmp_path / "raw")["images"] == 2


def test_real_labels_as_a_training_source_ask_only_what_they_decide(tmp_path):
    """What real BDD100K label sets hold, through generate_scenes and generate_commands' questions: a file mixing the
    2018 and det_20 dialects, a pedestrian signal labelled ``traffic light`` (NA), 40 cars in a frame, and a
    hand-labelled set that colours no light of a frame and leaves occlusion unsaid: that frame gets no traffic-light
    or safety question (it answered "maybe" to every one before)."""
    from PIL import Image

    from vlm.commands.generate import BalancedCommands, CommandsConfig
    from vlm.scenes.generate import BDD100KConfig, ScenesConfig, generate_scenes, load_raw

    def box(k):
        return {"x1": 20.0 * (k % 60), "y1": 400.0, "x2": 20.0 * (k % 60) + 30, "y2": 430.0}

    cars = [{"category": "car", "attributes": {"occluded": k % 2 == 0}, "box2d": box(k)} for k in range(40)]
    signal = {"category": "traffic light", "attributes": {"occluded": False, "trafficLightColor": "NA"},
              "box2d": box(41)}
    frames = []
    for k in range(40):
        light = {"category": "traffic light", "attributes": {"occluded": False}, "box2d": box(42)}
        person = {"category": "person" if k % 2 else "pedestrian", "box2d": box(43),
                  "attributes": {"occluded": False}}  # the 2018 name in odd frames
        if k < 20:  # hand-labelled: no light coloured, occlusion unsaid
            del person["attributes"]["occluded"]
        else:
            light["attributes"]["trafficLightColor"] = "green" if k % 2 else "R"  # 2018 and det_20 colours
        frames.append({"name": f"{k:03d}.jpg", "labels": [*cars[: k + 1], signal, light, person],
                       "attributes": {"weather": "clear", "scene": "highway" if k % 3 else "city street",
                                      "timeofday": "night" if k % 2 else "daytime"}})
    (tmp_path / "images").mkdir()
    for frame in frames:
        Image.new("RGB", (1280, 720)).save(tmp_path / "images" / frame["name"])
    write_json(tmp_path / "labels.json", frames)
    config = ScenesConfig(source="bdd100k",
                          bdd100k=BDD100KConfig(root=str(tmp_path), images="images", labels="labels.json"))
    assert generate_scenes(config, tmp_path / "raw")["images"] == 40
    raw = load_raw(tmp_path / "raw")
    scenes = {s.name: s for s in raw.scenes}
    assert sum(o.category == "car" for o in scenes["039.jpg"].objects) == 40
    assert {o.category for o in scenes["001.jpg"].objects} == {"car", "traffic light", "pedestrian"}
    assert [o.light_color for o in scenes["021.jpg"].objects if o.category == "traffic light"] == [None, "green"]
    assert scenes["000.jpg"].objects[-1].occluded is None  # unsaid, and so written back to data/raw

    records = BalancedCommands(raw.iter_scenes, raw.width, raw.height, CommandsConfig(questions_per_image=40))
    records.write(tmp_path / "commands")
    asked = [r for split in ("train", "val", "test") for r in json.loads((tmp_path / "commands" / f"{split}.json")
                                                                         .read_text())]
    light_or_safety = {int(r["image_id"]) for r in asked if r["command_type"] in ("traffic_light", "safety")}
    assert light_or_safety and min(light_or_safety) >= 20
    colours = {r["answer"] for r in asked if r["template"] == "traffic_light/color"}
    assert colours <= {"red", "green"}  # the governing light is the coloured one, never the NA signal: no "maybe"
