"""`dvc exp show` stays readable: the metrics declared in dvc.yaml make a few dozen columns, the test accuracies
first; the slices and the counterfactuals' summary are outputs beside them, compared on request."""

from __future__ import annotations

import json

import yaml

from dvc_graph import ROOT
from vlm.commands.types import QUESTION_TYPES
from vlm.counterfactuals import headline as counterfactuals_headline
from vlm.evaluate import split_metrics
from vlm.real import MODELS
from vlm.scene_edits import EDITS
from vlm.slices import DIMENSIONS

MAX_METRIC_COLUMNS = 40  # metric columns of `dvc exp show`: what a person compares at a glance
DVC_YAML = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
DECLARED = DVC_YAML["metrics"]


def leaves(data, prefix: str = "") -> list[str]:
    """The dotted names of a metrics file's values, as `dvc exp show` makes its columns (in the file's key order,
    the files in the order of dvc.yaml's `metrics:`)."""
    if not isinstance(data, dict):
        return [prefix]
    return [name for key, value in data.items() for name in leaves(value, f"{prefix}.{key}" if prefix else key)]


def _evaluation() -> dict:
    """Every metric evaluate computes, at its largest: every command type, a few values per slice dimension."""
    model = {"accuracy": 0.5, "per_type": dict.fromkeys(QUESTION_TYPES, 0.5), "macro_f1": 0.5,
             "per_answer": {"yes": 0.5, "no": 0.5}, "confusion_yes_no_maybe": {}, "ece": 0.1, "reliability": []}
    slices = {dimension: {"a": 0.5, "b": 0.5, "c": 0.5} for dimension in DIMENSIONS}
    return {"split": "test", "questions": 10, "vlm": model, "blind": model,
            "gain_from_vision": {"accuracy": 0.0, "per_type": dict.fromkeys(QUESTION_TYPES, 0.0)},
            "questions_per_type": dict.fromkeys(QUESTION_TYPES, 1), "slices": {"vlm": slices, "blind": slices},
            "slice_questions": {dimension: {"a": 1, "b": 1, "c": 1} for dimension in DIMENSIONS}}


def _counterfactuals() -> dict:
    rates = {"pairs": 1, "questions": 2, "must_change": 1, "accuracy_original": 0.5, "accuracy_edited": 0.5,
             "consistency": 0.5, "changed_when_it_must": 0.5, "stayed_when_it_must": 0.5}
    return counterfactuals_headline(dict.fromkeys(EDITS, rates))


def test_dvc_exp_show_has_a_few_dozen_metric_columns_the_test_accuracies_first():
    assert DECLARED == ["metrics/eval.json", "dvclive/vlm/metrics.json", "metrics/real.json",
                        "metrics/counterfactuals.json"]
    evaluation, _, _ = split_metrics(_evaluation())
    # dvclive's summary of the training (its keys: the model's losses, which the heads decide): the committed run's
    train = json.loads((ROOT / "dvclive" / "vlm" / "metrics.json").read_text(encoding="utf-8"))
    real = {"real": dict.fromkeys(MODELS, 0.5)}  # measured (real.root set): each model's accuracy on real frames
    columns = leaves(evaluation) + leaves(train) + leaves(real) + leaves(_counterfactuals())
    assert len(columns) <= MAX_METRIC_COLUMNS, (len(columns), columns)
    assert len(set(columns)) == len(columns)
    lead = ["vlm.accuracy", *(f"vlm.per_type.{t}" for t in QUESTION_TYPES), "vlm.macro_f1", "vlm.ece",
            "blind.accuracy", *(f"blind.per_type.{t}" for t in QUESTION_TYPES), "blind.macro_f1", "blind.ece",
            "gain_from_vision.accuracy"]
    assert sorted(columns[:len(lead)]) == sorted(lead) and columns[0] == "vlm.accuracy"
    assert columns[-len(EDITS):] == [f"consistency.{edit}" for edit in EDITS]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"`dvc exp show` has {len(columns)} metric columns" in readme


def test_the_details_are_outputs_beside_the_declared_metrics():
    """The slices and the counterfactuals' summary are tracked outputs (`dvc metrics show/diff --targets`), not
    columns; each declared metrics file is a stage's output (or in one: dvclive's folder) that git tracks."""
    outs = {next(iter(out)) if isinstance(out, dict) else out: out for stage in DVC_YAML["stages"].values()
            for out in stage.get("outs", [])}
    for path in (*DECLARED, "metrics/eval/slices.json", "metrics/counterfactuals/summary.json"):
        out = path if path in outs else path.rsplit("/", 1)[0]
        assert outs[out] == {out: {"cache": False}}, path
    assert not {"metrics/eval/slices.json", "metrics/counterfactuals/summary.json"} & set(DECLARED)
