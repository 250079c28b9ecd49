"""A queued experiment runs the code it was queued with, not the workspace's (`python -m stages.<name>` puts
the experiment's own copy of the repository first on the import path)."""

import json
import time

import pytest

from pipeline import DvcProject

pytestmark = pytest.mark.pipeline

MARKER = '''

_generate_scenes = generate_scenes


def generate_scenes(*args, **kwargs):  # the queued code marks its metrics
    return {**_generate_scenes(*args, **kwargs), "marker": "queued code"}
'''


def test_queued_experiment_runs_its_own_code(tmp_path):
    project = DvcProject(tmp_path, {"scenes": {"num_images": 4}, "runtime": {"scenes": {"workers": 1}}})
    del project.env["PYTHONPATH"]  # the installed package points at the developer's checkout, not this one
    source = project.path / "vlm" / "scenes" / "generate.py"
    original = source.read_text()
    source.write_text(original + MARKER)
    project.run("dvc", "exp", "run", "--queue", "-n", "marked", "generate_scenes")
    source.write_text(original)  # the workspace goes back before the queue runs
    project.run("dvc", "queue", "start")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = project.run("dvc", "queue", "status").stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(2)
    assert "Success" in status, status
    show = json.loads(project.run("dvc", "exp", "show", "--json").stdout)
    runs = [rev for entry in show for experiment in entry.get("experiments") or [] for rev in experiment["revs"]]
    marked = next(rev for rev in runs if rev["name"] == "marked")
    scenes = json.loads(project.run("git", "show", f"{marked['rev']}:metrics/scenes.json").stdout)
    assert scenes["marker"] == "queued code"
