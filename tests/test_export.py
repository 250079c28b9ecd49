"""vlm.export: a trained model as a folder transformers loads and that answers as the project does; the one-line
refusal of a model transformers' PaliGemma does not compute; a failed export leaves no folder."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from tiny_project import TINY_MODEL
from vlm import checkpoint, export, predict
from vlm.cli import run
from vlm.hub import vendor
from vlm.processor import Processor
from vlm.tokenizer import TrafficCommandTokenizer
from vlm.traffic_vlm import VLMConfig, build_vlm

transformers = pytest.importorskip("transformers", reason="transformers (test extra) loads the exported folder")

IMAGE_SIZE = 32
PLAIN_MODEL = {key: value for key, value in TINY_MODEL.items() if key != "perception"}  # PaliGemma's design
# Three questions, one per image, whose answers the tiny model is taught: the second differs from the first by the
# image alone.
QUESTIONS = [("Is there a bus?", "yes"), ("Is there a bus?", "no"), ("What color is the traffic light?", "red")]
RECORDS = [{"command": q, "answer": a} for q, a in
           [*QUESTIONS, ("How many cars are there?", "2"), ("Can the car safely turn left?", "maybe")]]


def write_checkpoint(path: Path, model_section: dict, train_on: list[tuple[Path, str, str]] = (),
                     image_width: int | None = None) -> Path:
    """A model checkpoint of the ``model:`` section ``model_section``, as the train stage writes it, its weights
    random or, given ``(image, question, answer)`` triples, taught those answers in a few steps; ``image_width``:
    images of IMAGE_SIZE x that (H x W) from frames of that aspect, as ``pack.aspect: native`` packs them."""
    tokenizer = TrafficCommandTokenizer.build_vocab(RECORDS)
    vocab = path.with_suffix(".vocab.json")
    tokenizer.save_vocab(vocab)
    config = VLMConfig.from_params(model_section, tokenizer.vocab_size, IMAGE_SIZE, [0.4, 0.45, 0.5], [0.2, 0.25, 0.3],
                                   image_width)
    torch.manual_seed(0)
    model = build_vlm(config, pretrained=False)
    if train_on:
        processor = Processor(tokenizer, IMAGE_SIZE, "bicubic")
        images, questions, answers = zip(*train_on)
        batch = processor([processor.image(image) for image in images], questions, answers=answers)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(40):
            optimizer.zero_grad()
            model(batch).losses["answer"].backward()
            optimizer.step()
    info = {"config": config.to_dict(), "vocab": json.loads(vocab.read_text(encoding="utf-8")),
            "vocab_sha256": checkpoint.file_sha256(vocab), "answers": sorted({r["answer"] for r in RECORDS} | {"3"}),
            "image_size": IMAGE_SIZE, "resample": "bicubic", "blind": config.vision == "none"}
    if image_width is not None:
        info |= {"image_width": image_width, "frame_size": [image_width * 10, IMAGE_SIZE * 10]}
    checkpoint.save(path, checkpoint.model_payload(model.eval(), info, {"epoch": 3, "step": 40, "val_accuracy": 0.75}))
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The model is tiny: intra-op threads only add synchronisation (and the cores are shared)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def exported(tmp_path_factory, one_thread):
    """A plain tiny model taught the three answers, its checkpoint, the images asked about, and its export."""
    root = tmp_path_factory.mktemp("export")
    rng = np.random.default_rng(0)
    images = []
    for i in range(len(QUESTIONS)):  # at the packed size: vlm.predict and the image processor read the same pixels
        images.append(root / f"image{i}.png")
        Image.fromarray(rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)).save(images[-1])
    model = write_checkpoint(root / "vlm.pt", PLAIN_MODEL, [(image, q, a) for image, (q, a) in zip(images, QUESTIONS)])
    return model, images, export.export(model, root / "hf")


def hf_constrained_answers(model, processor, images: list[Image.Image], answers: list[str]) -> list[str]:
    """The most likely of ``answers`` to each of QUESTIONS about ``images`` by transformers' PaliGemma: the summed
    log-probabilities of an answer's tokens and [EOS] after the prompt, as ``vlm.predict`` scores them."""
    best = []
    for image, (question, _) in zip(images, QUESTIONS):
        inputs = processor(images=[image] * len(answers), text=[f"<image>{question}"] * len(answers), suffix=answers,
                           padding="longest", return_tensors="pt")
        labels = inputs.pop("labels")  # the answer tokens and [EOS]; -100 on the prompt and the padding
        with torch.no_grad():
            log_probs = model(**inputs).logits[:, :-1].log_softmax(-1)  # position t predicts token t + 1
        targets = torch.as_tensor(labels)[:, 1:]
        picked = log_probs.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
        best.append(answers[int(torch.where(targets >= 0, picked, 0).sum(1).argmax())])
    return best


# transformers' processor builds the labels of a suffix with np.array on torch tensors
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
def test_transformers_answers_as_vlm_predict(exported):
    """PaliGemmaForConditionalGeneration and AutoProcessor load the export; over the answer set they give the
    answers of vlm.predict, and greedy generate (batched, left-padded) the tokens of the project's generate."""
    source, image_paths, folder = exported
    loaded = checkpoint.load_model(source)
    expected = [predict.answer_images(loaded, [str(path)], question)[0][0][0]
                for path, (question, _) in zip(image_paths, QUESTIONS)]
    assert expected == [answer for _, answer in QUESTIONS]  # taught: the comparison is not between constant answers

    model, info = transformers.PaliGemmaForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    processor = transformers.AutoProcessor.from_pretrained(folder)
    images = [Image.open(path) for path in image_paths]
    for image, path, (question, _) in zip(images, image_paths, QUESTIONS):  # the same logits at the question
        with torch.no_grad():
            theirs = model.eval()(**processor(images=image, text=f"<image>{question}", return_tensors="pt")).logits
            ours = loaded.model(loaded.processor([loaded.processor.image(path)], [question])).logits[0]
        torch.testing.assert_close(theirs[0, loaded.model.num_image_tokens:], ours, atol=1e-4, rtol=0)
    assert hf_constrained_answers(model, processor, images, loaded.answers) == expected

    inputs = processor(images=images, text=[f"<image>{q}" for q, _ in QUESTIONS], padding="longest",
                       return_tensors="pt")
    generated = model.generate(**inputs)[:, inputs["input_ids"].shape[1]:]
    batch = loaded.processor([loaded.processor.image(path) for path in image_paths], [q for q, _ in QUESTIONS])
    ours = loaded.model.generate(batch, eos_token_id=loaded.tokenizer.eos_token_id, max_new_tokens=generated.shape[1])
    assert generated.tolist() == ours.tolist()
    assert processor.batch_decode(generated, skip_special_tokens=True) == expected


def test_tokenizer_is_the_project_tokenizer(exported):
    """AutoTokenizer alone encodes a question as encode_question does ([SOS] words [SEP]) and decodes answers as
    decode_answer; the normalisation is the same (NFKC, lower case, ``? . , !`` apart, any whitespace)."""
    source, _, folder = exported
    ours = checkpoint.load_model(source).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    spaces = [chr(c) for c in range(0x3001) if chr(c).isspace() and chr(c) != "\n"]  # "\n" is [SEP] there
    texts = ["Is there a bus?", "IS THERE A BUS ?", "ｉｓ ｔｈｅｒｅ a ｂｕｓ？", "Yes, no! maybe.",
             "is there a zebra?", "What color is the traffic-light?!", "", *(f"how{s}many cars{s}?" for s in spaces)]
    for text in texts:
        assert theirs(text)["input_ids"] == ours.encode_question(text), repr(text)
    for answer in ("yes", "no", "maybe", "red", "2"):
        ids = ours.encode_answer(answer)
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode_answer(ids) == answer
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id, theirs.sep_token_id) == (2, 3, 0, 7)


def test_model_card(exported):
    source, _, folder = exported
    assert sorted(p.name for p in folder.iterdir()) == sorted(export.FILES)
    card = (folder / "README.md").read_text(encoding="utf-8")
    parameters = sum(p.numel() for p in checkpoint.load_model(source).model.parameters())
    for text in (f"{parameters:,} parameters", "| val_accuracy | 0.7500 |", "| epoch | 3 |", "5 training questions",
                 "Answers: 6, one word each: 2, 3, maybe, no, red, yes", f"from_pretrained(\"{folder}\")"):
        assert text in card, text


@pytest.mark.parametrize("section, reason, overrides", [
    (TINY_MODEL, "the traffic perception is on (model.perception: conv stem and heads)",
     "dvc exp run -S model.perception.heads.grounding=0 -S model.perception.heads.centres=0 "
     "-S model.perception.heads.counts=0 -S model.perception.to_decoder=false -S 'model.perception.stem_channels=[]'"),
    ({**PLAIN_MODEL, "pixel_shuffle": 2}, "model.pixel_shuffle is 2 (PaliGemma's projector reads one patch per "
                                          "image token)", "dvc exp run -S model.pixel_shuffle=1"),
    ({**PLAIN_MODEL, "connector": "qformer"}, "its connector is 'qformer' (PaliGemma's is linear)",
     "dvc exp run -S model.connector=linear"),
    ({**PLAIN_MODEL, "pack_questions": True}, "model.pack_questions is on (its image tokens ignore the question; "
                                              "PaliGemma's attend to the whole prefix)",
     "dvc exp run -S model.pack_questions=false"),
    ({**PLAIN_MODEL, "mirror_answers": True}, "model.mirror_answers is on (its answers are the mean over the image "
                                              "and its mirror image; transformers' PaliGemma asks once)",
     "dvc exp run -S model.mirror_answers=false"),
    ({"vision": "none", "gemma": PLAIN_MODEL["gemma"], "pack_questions": True, "pixel_shuffle": 2},
     "it is the text-only baseline (model.vision: none), which reads no image; export the VLM (models/vlm.pt) "
     "instead", None),  # alone: no training makes the baseline exportable
], ids=["perception", "pixel_shuffle", "qformer", "pack_questions", "mirror_answers", "blind"])
def test_refuses_a_model_that_is_not_paligemma(tmp_path, capsys, section, reason, overrides):
    """One line on stderr: why it cannot be exported and how to train one that can; no folder is written."""
    model = write_checkpoint(tmp_path / "model.pt", section)
    out = tmp_path / "hf"
    with pytest.raises(SystemExit) as exit_info:
        run(lambda: export.main(["--checkpoint", str(model), "--out", str(out), "--plain"]))
    assert exit_info.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    expected = f"error: {model}: cannot be exported as transformers' PaliGemma: {reason}"
    assert lines == [expected + (f". Train one that can with: {overrides}" if overrides else "")]
    assert not out.exists()


def test_reasons_add_up():
    """Every departure of a model is named, each with its overrides."""
    config = VLMConfig.from_params({**TINY_MODEL, "connector": "qformer", "pixel_shuffle": 2}, 40, IMAGE_SIZE)
    found = export.departures(config)
    assert [d.overrides[-1] for d in found] == ["model.perception.stem_channels=[]", "model.connector=linear",
                                                "model.pixel_shuffle=1"]
    assert export.departures(VLMConfig.from_params(PLAIN_MODEL, 40, IMAGE_SIZE)) == []


def test_refuses_a_model_of_native_aspect_in_one_line():
    """transformers' SigLIP is square: a model trained on pack.aspect native cannot be its PaliGemma."""
    config = VLMConfig.from_params(PLAIN_MODEL, 40, IMAGE_SIZE, image_width=64)
    with pytest.raises(ValueError) as error:
        export.check_exportable(config, "models/vlm.pt")
    assert str(error.value) == ("models/vlm.pt: cannot be exported as transformers' PaliGemma: its images are 32 x 64 "
                                "px (H x W; transformers' SigLIP is square). Train one that can with: dvc exp run "
                                "-S pack.aspect=square")


def test_failed_export_leaves_no_folder(exported, tmp_path, monkeypatch):
    """A failure after some files are written leaves neither the folder nor a temporary; a folder holding other
    files is refused untouched; an earlier export is replaced."""
    source, _, _ = exported

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(export, "model_card", fail)  # the last file written
    with pytest.raises(OSError, match="disk full"):
        export.export(source, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match=r"mine: exists and is not an earlier export"):
        export.export(source, other)
    assert [p.name for p in other.iterdir()] == ["notes.txt"]

    first = export.export(source, tmp_path / "hf")
    (first / "config.json").write_text("{}")
    assert json.loads((export.export(source, first) / "config.json").read_text())["model_type"] == "paligemma"


@pytest.mark.parametrize("perception", [{}, {"oracle": True}], ids=["defaults", "oracle"])
def test_the_defaults_overrides_train_a_model_that_exports(perception):
    """The overrides named for params.yaml's model, applied to it, leave nothing transformers' PaliGemma does not
    compute (the README's "PaliGemma, nothing added" command); with the oracle probe too, which needs the heads."""
    section = yaml.safe_load((Path(__file__).parents[1] / "params.yaml").read_text())["model"]
    section["perception"].update(perception)
    config = VLMConfig.from_params(section, 40, 128, image_width=224)
    overrides = [o for departure in export.departures(config) for o in departure.overrides]
    assert "pack.aspect=square" in overrides  # the one outside model: square images, below
    for key, value in (o.split("=", 1) for o in overrides if o.startswith("model.")):
        *parents, leaf = key.removeprefix("model.").split(".")
        where = section
        for parent in parents:
            where = where[parent]
        where[leaf] = yaml.safe_load(value)
    assert export.departures(VLMConfig.from_params(section, 40, 128)) == []


# The default's design (params.yaml's model), tiny: the perception, pixel shuffle, packed questions, mirror answers,
# images twice as wide as high
DEFAULT_DESIGN = {**TINY_MODEL, "pixel_shuffle": 2, "pack_questions": True, "mirror_answers": True,
                  "perception": {**TINY_MODEL["perception"], "mirror_average": True}}
REMOTE_QUESTIONS = ["Is there a bus?", "Is there a car on the left side?", "How many cars are there?",
                    "What color is the traffic light?", "Is there a bus near the zebra?"]  # the last: no template
# A fresh interpreter in which `import vlm` fails: transformers alone loads the folder and answers
REMOTE_SCRIPT = """
import json, sys
sys.modules["vlm"] = None
from transformers import AutoModel, AutoTokenizer
folder, images, questions = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
model = AutoModel.from_pretrained(folder, trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
print(json.dumps([[model.answer([image], question, tokenizer)[0] for image in images] for question in questions]))
"""


@pytest.fixture(scope="module")
def remote_exported(tmp_path_factory, one_thread):
    """A tiny model of the default's design, its checkpoint, two image files of other sizes, and its export."""
    root = tmp_path_factory.mktemp("remote")
    rng = np.random.default_rng(1)
    images = [root / "street.jpg", root / "crossing.png"]
    for path, size in zip(images, [(90, 160), (40, 70)]):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    model = write_checkpoint(root / "vlm.pt", DEFAULT_DESIGN, image_width=2 * IMAGE_SIZE)
    return model, images, export.export(model, root / "hf")


def test_the_default_design_loads_with_transformers_alone_and_answers_as_vlm_predict(remote_exported, tmp_path):
    """AutoModel (trust_remote_code) loads the export of a model transformers' PaliGemma does not compute, in an
    interpreter that cannot import vlm, and gives every answer the probability vlm.predict gives it."""
    source, images, folder = remote_exported
    assert sorted(p.name for p in folder.iterdir()) == sorted({*export.REMOTE_FILES, *vendor.sources()})
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", REMOTE_SCRIPT, str(folder), ",".join(map(str, images)),
                           json.dumps(REMOTE_QUESTIONS)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "no phrasing the model was trained on" in done.stderr  # the last question's warning
    theirs = json.loads(done.stdout.splitlines()[-1])  # after transformers' notice of custom code
    loaded = checkpoint.load_model(source)
    for question, answered in zip(REMOTE_QUESTIONS, theirs):
        for image, ranked in zip(images, answered):
            ours = predict.answer_images(loaded, [str(image)], question)[0]
            assert [a for a, _ in ranked] == [a for a, _ in ours], question
            np.testing.assert_allclose([p for _, p in ranked], [p for _, p in ours], rtol=0, atol=1e-6)
    assert [a for a, _ in theirs[2][0]] in (["2", "3"], ["3", "2"])  # "how many": the numbers alone
    assert len(theirs[-1][0]) == len(loaded.answers)  # a question of no template: every answer


def test_the_exported_code_needs_only_what_transformers_needs():
    """The folder's modules import each other relatively, so transformers copies every one, and import nothing
    beyond torch, numpy, Pillow, safetensors and transformers."""
    code = vendor.sources()
    folder_imports = set()
    imported = set()
    for text in code.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                folder_imports.add(f"{node.module}.py")
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
    assert folder_imports == set(code) - {"modeling_traffic_vlm.py"}
    assert imported - set(sys.stdlib_module_names) == {"PIL", "numpy", "safetensors", "torch", "transformers"}


def test_a_model_whose_answers_need_labels_is_not_exported_with_its_code(tmp_path):
    model = write_checkpoint(tmp_path / "oracle.pt", {**DEFAULT_DESIGN, "perception": {
        **DEFAULT_DESIGN["perception"], "oracle": True}})
    with pytest.raises(ValueError, match=r"oracle.pt: its decoder reads the label maps"):
        export.export(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
