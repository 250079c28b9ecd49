import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image
from sklearn.metrics import f1_score

from tiny_project import FRAME_SIZE, TINY_MODEL, TINY_RUNTIME, paths_for, tiny_train_config
from vlm import counterfactuals, predict
from vlm.checkpoint import load_model
from vlm.commands.generate import CommandsConfig
from vlm.config import ParamError, build_config
from vlm.counterfactuals import CounterfactualsConfig, CounterfactualsPaths
from vlm.data.dataset import TrafficVQADataset
from vlm.data.mirror import swap_left_right
from vlm.evaluate import EvaluateConfig, EvaluatePaths, calibration, evaluate, summarize, yes_no_maybe_pairs
from vlm.inference import answer_questions, perception_metrics, predict_dataset
from vlm.models.paligemma import PaliGemma
from vlm.scenes.generate import ScenesConfig
from vlm.traffic_vlm import VLMConfig
from vlm.train import train

pytestmark = pytest.mark.xdist_group("tiny_project")  # one worker builds the shared tiny project


@pytest.fixture(scope="module")
def trained(tiny_project, tmp_path_factory):
    root, processed = tiny_project.root, tiny_project.processed
    models = tmp_path_factory.mktemp("evaluate_models")
    for blind in (False, True):
        name = "blind" if blind else "vlm"
        train(TINY_MODEL, tiny_train_config(epochs=2), paths_for(processed, models, name), blind=blind, progress=False,
              frame_size=FRAME_SIZE, runtime=TINY_RUNTIME)
    return root, processed, models


def test_summarize_on_a_hand_built_table():
    table = pd.DataFrame({
        "command_type": ["detection", "detection", "counting", "counting", "safety"],
        "answer": ["yes", "no", "3", "2", "maybe"],
        "prediction": ["yes", "yes", "3", "3", "maybe"],
        "probability": [0.9, 0.6, 0.7, 0.55, 0.4],
    })
    table["correct"] = table["answer"] == table["prediction"]
    s = summarize(table)
    assert s["accuracy"] == 0.6
    assert s["per_type"] == {"counting": 0.5, "detection": 0.5, "safety": 1.0}
    assert s["per_answer"] == {"2": 0.0, "3": 1.0, "maybe": 1.0, "no": 0.0, "yes": 1.0}
    expected_f1 = f1_score(table["answer"], table["prediction"], labels=sorted(set(table["answer"])), average="macro")
    assert s["macro_f1"] == pytest.approx(expected_f1, abs=1e-4)
    assert s["confusion_yes_no_maybe"] == {"actual": ["yes", "no", "maybe"],
                                           "predicted": ["yes", "no", "maybe", "other"],
                                           "matrix": [[1, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]}
    # bins [0.9, 1): right at 0.9; [0.7, 0.8): right at 0.7; [0.6, 0.7): wrong at 0.6; [0.5, 0.6): wrong at 0.55;
    # [0.4, 0.5): right at 0.4 -> ECE = (0.1 + 0.3 + 0.6 + 0.55 + 0.6) / 5
    assert s["ece"] == pytest.approx((0.1 + 0.3 + 0.6 + 0.55 + 0.6) / 5, abs=1e-4)
    assert [r["questions"] for r in s["reliability"]] == [1, 1, 1, 1, 1]


def test_calibration_of_perfectly_calibrated_answers_is_zero():
    """Answers given with probability 0.75 and right 3 times in 4, and with 1.0 and always right: ECE 0."""
    confidence = np.array([0.75] * 400 + [1.0] * 100)
    correct = np.array(([True] * 3 + [False]) * 100 + [True] * 100)
    result = calibration(confidence, correct)
    assert result["ece"] == 0
    assert [(r["low"], r["questions"], r["accuracy"]) for r in result["reliability"]] == [(0.7, 400, 0.75),
                                                                                           (0.9, 100, 1.0)]


def test_predictions_outside_yes_no_maybe_are_counted_as_other():
    """A yes/no/maybe question answered with a colour or a count lands in the ``other`` column, not nowhere."""
    table = pd.DataFrame({
        "command_type": ["traffic_light", "traffic_light", "safety", "counting", "counting"],
        "answer": ["yes", "no", "maybe", "yes", "3"],
        "prediction": ["yellow", "no", "2", "yes", "yes"],
        "probability": [0.5] * 5,
    })
    table["correct"] = table["answer"] == table["prediction"]
    matrix = summarize(table)["confusion_yes_no_maybe"]["matrix"]
    assert matrix == [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1]]
    assert sum(map(sum, matrix)) == 4  # every yes/no/maybe question, the count question left out
    pairs = yes_no_maybe_pairs(table)
    assert pairs.to_dict("records") == [{"actual": "yes", "predicted": "other"},
                                        {"actual": "no", "predicted": "no"},
                                        {"actual": "maybe", "predicted": "other"},
                                        {"actual": "yes", "predicted": "yes"}]


def test_the_oracle_probe_answers_from_the_label_maps_of_each_image(trained, tmp_path, monkeypatch):
    """``model.perception.oracle`` through training, evaluate (its split and attention sheet) and the counterfactuals:
    each image the model is asked about comes with its labels' maps, the edited scenes' own (and, answering with
    ``model.mirror_answers``, the mirror images with their mirrored maps)."""
    root, processed, models = trained
    oracle = {**TINY_MODEL, "perception": {**TINY_MODEL["perception"], "oracle": True}, "mirror_answers": True}
    train(oracle, tiny_train_config(epochs=1), paths_for(processed, tmp_path, "vlm"), progress=False,
          frame_size=FRAME_SIZE, runtime=TINY_RUNTIME)
    read = []  # the label maps each answering batch carried
    answer = PaliGemma.answer
    monkeypatch.setattr(PaliGemma, "answer", lambda self, batch, candidates: read.append(batch.targets) or
                        answer(self, batch, candidates))
    paths = EvaluatePaths(model=tmp_path / "vlm.pt", blind=models / "blind.pt", data=processed,
                          raw=root / "data" / "raw", metrics=tmp_path / "eval.json", tables=tmp_path / "eval",
                          plots=tmp_path / "plots")
    assert 0 <= evaluate(EvaluateConfig(attention_examples=2, failure_examples=2), paths)["vlm"]["accuracy"] <= 1
    assert (paths.plots / "attention.png").is_file()
    assert read and all(targets is not None for targets in read)  # (the attention sheet's too, or it would stop)
    read.clear()
    edits = CounterfactualsPaths(model=tmp_path / "vlm.pt", data=processed, raw=root / "data" / "raw",
                                 metrics=tmp_path / "cf.json", details=tmp_path / "cf" / "summary.json",
                                 table=tmp_path / "cf" / "questions.csv", plot=tmp_path / "cf.png",
                                 sheet=tmp_path / "sheet.png")
    assert counterfactuals.run(CounterfactualsConfig(samples=4, sheet_examples=0), ScenesConfig(num_images=40),
                               CommandsConfig(questions_per_image=6), edits, progress=False)
    assert read and all(targets is not None for targets in read)


def test_evaluate_writes_metrics_tables_and_pictures(trained, tmp_path):
    root, processed, models = trained
    paths = EvaluatePaths(model=models / "vlm.pt", blind=models / "blind.pt", data=processed, raw=root / "data" / "raw",
                          metrics=tmp_path / "eval.json", tables=tmp_path / "eval", plots=tmp_path / "plots")
    metrics = evaluate(EvaluateConfig(attention_examples=4, failure_examples=4), paths)
    test_records = json.loads((processed / "commands" / "test.json").read_text())
    types = {r["command_type"] for r in test_records}
    # The headline file (a DVC metric: a column each in `dvc exp show`): accuracy overall and per type first.
    headline = json.loads(paths.metrics.read_text())
    assert list(headline) == ["vlm", "blind", "gain_from_vision"]  # the slices are beside it (slices.json)
    for model in ("vlm", "blind"):
        assert list(headline[model]) == ["accuracy", "per_type", "macro_f1", "ece"]
        assert {k: metrics[model][k] for k in headline[model]} == headline[model]
        assert 0 <= headline[model]["accuracy"] <= 1
        assert set(headline[model]["per_type"]) == types
    assert headline["gain_from_vision"] == {"accuracy": pytest.approx(
        metrics["vlm"]["accuracy"] - metrics["blind"]["accuracy"], abs=1e-3)}
    # The detail beside it (not a metric): counts, per answer, confusion matrices, gain per type.
    details = json.loads(paths.details.read_text())
    assert paths.details == paths.tables / "details.json"
    assert details["questions"] == metrics["questions"] == len(test_records)
    assert sum(details["questions_per_type"].values()) == len(test_records)
    assert set(details["gain_from_vision"]["per_type"]) == types
    yes_no_maybe = sum(r["answer"] in ("yes", "no", "maybe") for r in test_records)
    for model in ("vlm", "blind"):
        assert details[model]["per_answer"] == metrics[model]["per_answer"]
        assert sum(map(sum, details[model]["confusion_yes_no_maybe"]["matrix"])) == yes_no_maybe
    # Slices: every question in one value of each frame dimension, each light question in one light condition,
    # each detection / counting question under its category; the same slices for both models.
    light_questions = sum(r["command_type"] in ("traffic_light", "safety") for r in test_records)
    expected = {"timeofday": len(test_records), "weather": len(test_records), "scene": len(test_records),
                "objects": len(test_records), "light": light_questions, "occluded_light": light_questions,
                "detection_category": sum(r["command_type"] == "detection" for r in test_records),
                "counting_category": sum(r["command_type"] == "counting" for r in test_records),
                "spatial_sides": sum(r["command_type"] == "spatial" for r in test_records)}
    counts = details["questions_per_slice"]
    assert {d: sum(values.values()) for d, values in counts.items()} == {d: n for d, n in expected.items() if n}
    slices = json.loads(paths.slices.read_text())
    assert paths.slices == paths.tables / "slices.json" and list(slices) == ["vlm", "blind"]
    for model in ("vlm", "blind"):
        assert {d: set(v) for d, v in slices[model].items()} == {d: set(v) for d, v in counts.items()}
    per_slice = pd.read_csv(paths.tables / "slices.csv")  # the same numbers, a bar each in `dvc plots`
    assert len(per_slice) == 2 * sum(map(len, counts.values()))
    for row in per_slice.itertuples():
        dimension, value = row.slice.split("=", 1)
        assert slices[row.model][dimension][value] == pytest.approx(row.accuracy)
    predictions = pd.read_csv(paths.tables / "predictions.csv")
    assert len(predictions) == len(test_records)
    assert {"question_id", "answer", "prediction", "probability", "blind_prediction", "correct"} <= set(predictions)
    assert predictions["correct"].mean() == pytest.approx(metrics["vlm"]["accuracy"], abs=1e-3)
    per_type = pd.read_csv(paths.tables / "per_type.csv")
    assert set(per_type["model"]) == {"vlm", "blind"}
    assert set(per_type["command_type"]) == types and len(per_type) == 2 * len(types)
    confusion = pd.read_csv(paths.tables / "confusion.csv", dtype=str)
    assert len(confusion) == yes_no_maybe
    assert set(confusion["actual"]) <= {"yes", "no", "maybe"}
    assert set(confusion["predicted"]) <= {"yes", "no", "maybe", "other"}
    for picture in ("eval.png", "slices.png", "calibration.png", "attention.png", "failures.png"):
        with Image.open(paths.plots / picture) as image:
            assert image.width > 400 and image.height > 200


def test_evaluate_writes_every_declared_picture_when_it_has_nothing_to_draw(trained, tmp_path):
    """attention.png and failures.png are outputs of the stage in dvc.yaml: with no examples asked, or a model
    that reads no image, a note stands in for each (DVC fails a stage whose declared output is missing)."""
    root, processed, models = trained
    for model in ("vlm", "blind"):
        paths = EvaluatePaths(model=models / f"{model}.pt", blind=models / "blind.pt", data=processed,
                              raw=root / "data" / "raw", metrics=tmp_path / model / "eval.json",
                              tables=tmp_path / model / "eval", plots=tmp_path / model / "plots")
        evaluate(EvaluateConfig(attention_examples=0 if model == "vlm" else 4, failure_examples=0), paths)
        for picture in ("attention.png", "failures.png"):
            with Image.open(paths.plots / picture) as image:
                assert image.width > 100, (model, picture)


def test_perception_metrics_count_each_image_once_whatever_the_batch(trained, tmp_path):
    """Val's perception measures (metrics/train.json, dvclive) do not move with runtime.train.eval_batch_size: an
    image whose questions a small batch splits is counted once, not once per batch."""
    _, processed, models = trained
    vlm = load_model(models / "vlm.pt", processed / "vocab.json")
    records = json.loads((processed / "commands" / "val.json").read_text())
    first = {}
    for record in records:
        first.setdefault(record["image_id"], record)
    halves = sorted(first)[: len(first) // 2]  # half the images keep one question, the others all theirs
    uneven = [r for r in records if r["image_id"] not in halves or r is first[r["image_id"]]]
    (tmp_path / "val.json").write_text(json.dumps(uneven))
    model = vlm.model
    targets = model.extension.targets(model.config.siglip.height_width, FRAME_SIZE)  # as training builds val's
    dataset = TrafficVQADataset(tmp_path / "val.json", processed / "val_images.h5", vlm.tokenizer, in_memory=True,
                                targets=targets)
    whole = perception_metrics(model, dataset, 256, torch.device("cpu"))
    assert whole and perception_metrics(model, dataset, 2, torch.device("cpu")) == pytest.approx(whole, abs=1e-6)


def test_evaluate_params_are_checked():
    with pytest.raises(ParamError, match="evaluate.split: must be train, val or test"):
        build_config(EvaluateConfig, {"split": "holdout"}, "evaluate")


def test_predict_on_any_image(trained, tmp_path, capsys):
    _, processed, models = trained
    big = tmp_path / "street.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 500, 3), dtype=np.uint8)).save(big)
    predict.main(["--checkpoint", str(models / "vlm.pt"), "--image", str(big), "--question", "Is it night?",
                  "--vocab", str(processed / "vocab.json"), "--top", "3"])
    out = capsys.readouterr()
    line = out.out.strip()
    assert line.startswith(f"{big}: ") and line.count("%") == 2  # --top 3 of a yes/no question: its two answers
    answer = line.split(": ", 1)[1].split(" (")[0]
    assert answer in {"yes", "no"}
    assert out.err == ""


def test_predict_reads_many_images_a_batch_at_a_time(trained, tmp_path, capsys, monkeypatch):
    """A long list of images is answered a batch at a time, each as alone; --top counts at least one answer."""
    _, processed, models = trained
    images = []
    for seed in range(3):
        images.append(tmp_path / f"{seed}.png")
        Image.fromarray(np.random.default_rng(seed).integers(0, 255, (90, 160, 3), dtype=np.uint8)).save(images[-1])
    args = ["--checkpoint", str(models / "vlm.pt"), "--question", "Is it night?", "--top", "2"]
    predict.main([*args, "--image", *map(str, images)])
    together = capsys.readouterr().out
    monkeypatch.setattr(predict, "BATCH", 2)
    predict.main([*args, "--image", *map(str, images)])
    assert capsys.readouterr().out == together and together.count("\n") == 3
    with pytest.raises(SystemExit):
        predict.main([*args[:-1], "0", "--image", str(images[0])])
    assert "argument --top: must be at least 1, got 0" in capsys.readouterr().err


def test_predict_warns_about_unknown_words(trained, tmp_path, caplog):
    _, _, models = trained
    image = tmp_path / "x.jpg"
    Image.new("RGB", (64, 48), (10, 20, 30)).save(image)
    predict.main(["--checkpoint", str(models / "vlm.pt"), "--image", str(image), "--question", "Is there a zeppelin?"])
    assert "unknown word 'zeppelin' encoded as [UNK]" in caplog.text and "text-only" not in caplog.text
    predict.main(["--checkpoint", str(models / "blind.pt"), "--image", str(image), "--question", "Is it night?"])
    assert "blind.pt is the text-only baseline: it answers from the question alone" in caplog.text


def test_predict_errors_name_the_file(trained, tmp_path):
    _, processed, models = trained
    corrupt = tmp_path / "broken.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(ValueError, match="broken.jpg: cannot decode image"):
        predict.main(["--checkpoint", str(models / "vlm.pt"), "--image", str(corrupt), "--question", "Is it night?"])
    other_vocab = tmp_path / "vocab.json"
    vocab = json.loads((processed / "vocab.json").read_text())
    vocab["statistics"] = {"changed": True}
    other_vocab.write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match="vocab.json: vocabulary does not match the checkpoint"):
        predict.main(["--checkpoint", str(models / "vlm.pt"), "--image", str(corrupt), "--question", "Is it night?",
                      "--vocab", str(other_vocab)])
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        predict.main(["--checkpoint", str(tmp_path / "none.pt"), "--image", str(corrupt), "--question", "Is it night?"])
    payload = torch.load(models / "vlm.pt", weights_only=True)
    payload["state_dict"].popitem()  # a weight lost: the file is whole, its contents are not
    torch.save(payload, tmp_path / "partial.pt")
    with pytest.raises(ValueError, match="partial.pt: its weights do not fit the model its config describes: Missing "
                                         "key") as error:
        load_model(tmp_path / "partial.pt")
    assert "\n" not in str(error.value)  # one line from the CLI (torch's message has a line per key)


@pytest.mark.parametrize("question, message", [
    ("", "has no words"),
    ("???", "has no words"),
    ("Wie geht's dir heute?", "none of its words"),
])
def test_predict_refuses_a_question_it_cannot_read(trained, tmp_path, question, message):
    _, _, models = trained
    image = tmp_path / "x.jpg"
    Image.new("RGB", (64, 48), (10, 20, 30)).save(image)
    with pytest.raises(ValueError, match=re.escape(f"--question {question!r}: {message}")):
        predict.main(["--checkpoint", str(models / "vlm.pt"), "--image", str(image), "--question", question])


def test_predict_refuses_an_oversized_image(trained, tmp_path):
    from test_faults import write_png_bomb

    _, _, models = trained
    bomb = tmp_path / "bomb.png"
    write_png_bomb(bomb, 20_000, 20_000)
    with pytest.raises(ValueError, match="bomb.png: image refused: more than 50,000,000 pixels"):
        predict.main(["--checkpoint", str(models / "vlm.pt"), "--image", str(bomb), "--question", "Is it night?"])


def test_mirror_answers_average_the_image_and_its_mirror_image(trained):
    """``model.mirror_answers``: the answers are the mean of those for the image and for its mirror image asked the
    left/right-swapped question (the text's: "right of way" stays), over a dataset and over any images: asking
    about the mirror image with the swapped question gives the same answers, to float tolerance."""
    _, processed, models = trained
    loaded = load_model(models / "vlm.pt", processed / "vocab.json")
    model, candidates = loaded.model, loaded.candidates()
    dataset = TrafficVQADataset(processed / "commands" / "val.json", processed / "val_images.h5", loaded.tokenizer,
                                in_memory=True)
    mirrored = dataset.mirrored()
    assert [s["command"] for s in mirrored.__getitems__(range(len(dataset)))] == \
        [swap_left_right(r["command"]) for r in dataset.records]
    assert any(swap_left_right(r["command"]) != r["command"] for r in dataset.records)
    assert torch.equal(mirrored[0]["image"], dataset[0]["image"].flip(-1))
    plain, flipped = (predict_dataset(model, view, candidates, 4, "cpu")[1] for view in (dataset, mirrored))
    model.config.mirror_answers = True
    np.testing.assert_allclose(predict_dataset(model, dataset, candidates, 4, "cpu")[1], (plain + flipped) / 2,
                               atol=1e-6)

    images = {str(k): dataset[k]["image"] for k in range(len(dataset))}
    questions = [(str(k), r["command"]) for k, r in enumerate(dataset.records)]
    probs = answer_questions(model, loaded.processor, images, questions, candidates, 4, "cpu")
    mirrored_probs = answer_questions(model, loaded.processor, {k: v.flip(-1) for k, v in images.items()},
                                      [(k, swap_left_right(q)) for k, q in questions], candidates, 4, "cpu")
    np.testing.assert_allclose(probs, (plain + flipped) / 2, atol=1e-6)
    np.testing.assert_allclose(mirrored_probs, probs, atol=1e-6)
    with pytest.raises(ParamError, match="model.mirror_answers: a model without vision"):
        VLMConfig.from_params({"vision": "none", "mirror_answers": True}, 50, 32)


def test_answering_imports_no_torchvision():
    """evaluate, the counterfactuals and vlm.predict never jitter an image, so they skip torchvision's import (its
    models and ops, about 2 s of every stage's start); the mirror image they answer (model.mirror_answers) is torch's
    own flip (a flipping dataset: tests/test_data.py), the same pixels as torchvision's horizontal_flip."""
    check = """
import sys, stages.evaluate, stages.counterfactuals, vlm.predict, vlm.export
print(sorted(m for m in sys.modules if m.startswith("torchvision"))[:3])
"""
    result = subprocess.run([sys.executable, "-c", check], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
    from torchvision.transforms.v2 import functional

    image = torch.randint(0, 256, (3, 8, 16), dtype=torch.uint8)
    assert torch.equal(image.flip(-1), functional.horizontal_flip(image))
