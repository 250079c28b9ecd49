"""With `scenes.source: bdd100k` the dataset folder is a tracked input: a changed labels file or image makes
`dvc status` report generate_scenes, and a changed image changes data/raw, so the stages after it re-run."""

import shutil

import pytest
import yaml
from PIL import Image

from pipeline import DvcProject

pytestmark = pytest.mark.pipeline

FRAMES = ("00091078-875c1f73-0000166.jpg", "00091078-875c1f73-0000167.jpg")


def test_changed_bdd100k_labels_or_image_make_generate_scenes_stale(tmp_path, bdd_fixture_dir):
    project = DvcProject(tmp_path, {"scenes": {"source": "bdd100k"}})
    root = project.path / "data" / "bdd100k"
    (root / "images" / "100k" / "train").mkdir(parents=True)
    (root / "labels" / "det_20").mkdir(parents=True)
    for name in FRAMES:
        Image.new("RGB", (1280, 720), (90, 90, 90)).save(root / "images" / "100k" / "train" / name)
    labels = root / "labels" / "det_20" / "det_train.json"
    shutil.copy(bdd_fixture_dir / "det20_answerable.json", labels)
    project.run("dvc", "repro", "generate_scenes")
    assert "generate_scenes" not in project.run("dvc", "status", "generate_scenes").stdout

    labels.write_text(labels.read_text().replace('"person"', '"rider"', 1))
    assert "generate_scenes" in project.run("dvc", "status", "generate_scenes").stdout
    project.run("dvc", "repro", "generate_scenes")
    raw = _raw_hash(project)
    Image.new("RGB", (1280, 720), (10, 200, 90)).save(root / "images" / "100k" / "train" / FRAMES[0])
    assert "generate_scenes" in project.run("dvc", "status", "generate_scenes").stdout
    project.run("dvc", "repro", "generate_scenes")
    assert _raw_hash(project) != raw  # pack_hdf5 and the others read the image through data/raw's source.json


def _raw_hash(project: DvcProject) -> str:
    lock = yaml.safe_load((project.path / "dvc.lock").read_text())
    return next(out["md5"] for out in lock["stages"]["generate_scenes"]["outs"] if out["path"] == "data/raw")
