import json
import logging
import multiprocessing
import os
import random
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import vlm.optim
import vlm.traffic_vlm
import vlm.train
from tiny_project import FRAME_SIZE, TINY_MODEL, TINY_RUNTIME, paths_for, tiny_train_config
from vlm import checkpoint
from vlm.checkpoint import load_model
from vlm.cli import run
from vlm.config import ParamError, build_config
from vlm.models.paligemma import PaliGemma
from vlm.optim import lr_factor
from vlm.train import NonFiniteLossError, TrainConfig, TrainRuntime, train

pytestmark = pytest.mark.xdist_group("tiny_project")  # one worker builds the shared tiny project


@pytest.fixture
def processed(tiny_project):
    return tiny_project.processed


def _train(config, paths, model=TINY_MODEL, **kwargs):
    """A tiny run in-process, quietly, at the tiny runtime (one thread, a resume checkpoint every 3 steps)."""
    return train(model, config, paths, progress=False, frame_size=FRAME_SIZE, **{"runtime": TINY_RUNTIME, **kwargs})


def _last(paths):
    """The resume checkpoint a killed run left (named by the run's fingerprint; a finished run removes it)."""
    (path,) = paths.checkpoints.glob(f"{paths.model.stem}-*.pt")
    return checkpoint.read(path)


@pytest.fixture
def saved(monkeypatch):
    """Every resume checkpoint written, as (state, weights) by file, in order: a finished run removes its file,
    and its last checkpoint holds its final state and weights."""
    written = {}
    original = checkpoint.save_resume

    def recording(path, fingerprint, model, optimizer, scheduler, state):
        weights = {key: value.detach().clone() for key, value in model.state_dict().items()}
        written.setdefault(Path(path), []).append((state, weights))  # state: asdict's copy
        return original(path, fingerprint, model, optimizer, scheduler, state)

    monkeypatch.setattr(checkpoint, "save_resume", recording)
    return written


def _final(saved, paths):
    """The state and weights of the last resume checkpoint the run of ``paths`` wrote."""
    (path,) = [path for path in saved if path.parent == paths.checkpoints]
    return saved[path][-1]


def test_trains_writes_model_metrics_and_curves(processed, tmp_path):
    paths = paths_for(processed, tmp_path)
    metrics = _train(tiny_train_config(), paths)
    assert metrics["epochs"] == 2 and metrics["steps"] == metrics["planned_steps"]
    assert 0 <= metrics["val_accuracy"] <= 1 and metrics["best_epoch"] in (1, 2)
    headline, timing = json.loads(paths.metrics.read_text()), json.loads(paths.timing.read_text())
    assert {**headline, **timing} == metrics and list(headline)[0] == "val_accuracy"
    assert set(timing) == {"seconds", "questions_per_s", "planned_steps"} and timing["seconds"] > 0
    loaded = load_model(paths.model, processed / "vocab.json")
    assert loaded.model.config.vision == "siglip" and loaded.image_size == 32
    assert set(loaded.answers) >= {"yes", "no"}
    curves = paths.live / "plots" / "metrics"
    loss_rows = (curves / "train" / "loss.tsv").read_text().splitlines()
    assert len(loss_rows) == 1 + metrics["steps"]  # header + one row per optimizer step
    assert len((curves / "val" / "accuracy.tsv").read_text().splitlines()) == 1 + 2


def test_training_reduces_the_loss(processed, tmp_path, saved):
    paths = paths_for(processed, tmp_path)
    _train(tiny_train_config(epochs=4), paths)
    history = _final(saved, paths)[0]["history"]
    first, last = history[0]["train/loss"], history[-1]["train/loss"]
    assert last < 0.6 * first
    # each loss of the model's loss dict (the answer's, each perception head's) is logged on its own curve, and
    # the training loss is their weighted sum (model.perception.heads); the heads learn too
    weights = {"answer": 1.0, **TINY_MODEL["perception"]["heads"]}
    for record in history:
        weighted = sum(weight * record[f"train/{name}_loss"] for name, weight in weights.items())
        assert record["train/loss"] == pytest.approx(weighted)
    quarter = len(history) // 4  # a head's loss per batch is noisy: the first and the last quarter's means
    for head in ("grounding", "centres", "counts"):
        losses = [record[f"train/{head}_loss"] for record in history]
        assert np.mean(losses[-quarter:]) < 0.9 * np.mean(losses[:quarter]), head


def test_the_curves_move_at_every_step(processed, tmp_path, monkeypatch):
    """dvclive's files are written as the run trains (what `dvc exp show`, VS Code's DVC extension and DVC Studio show
    live): read at each optimizer step, the summary holds the step before it and the loss curve a row per step."""
    paths = paths_for(processed, tmp_path)
    original_step = torch.optim.AdamW.step
    seen = []

    def watching_step(self, *args, **kwargs):
        summary, loss = paths.live / "metrics.json", paths.live / "plots" / "metrics" / "train" / "loss.tsv"
        seen.append((json.loads(summary.read_text())["step"] if summary.exists() else 0,
                     len(loss.read_text().splitlines()) - 1 if loss.exists() else 0))
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", watching_step)
    metrics = _train(tiny_train_config(), paths)
    assert metrics["steps"] > 3 and seen == [(step, step) for step in range(metrics["steps"])]


def test_interrupted_run_resumes_to_the_same_weights(processed, tmp_path, monkeypatch, saved):
    straight = paths_for(processed, tmp_path / "straight")
    _train(tiny_train_config(), straight)

    resumed = paths_for(processed, tmp_path / "resumed")
    original_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def dying_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:  # after the checkpoint at step 6, mid second epoch or later
            raise KeyboardInterrupt("killed")
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny_train_config(), resumed)
    killed = _last(resumed)["state"]
    assert killed["step"] == 6 and killed["seconds"] > 0
    assert not resumed.model.exists() and not resumed.metrics.exists()
    # the curves are live: dvclive's summary (what `dvc exp show` reads) is the last step's
    assert json.loads((resumed.live / "metrics.json").read_text())["step"] == 6
    monkeypatch.setattr(torch.optim.AdamW, "step", original_step)
    metrics = _train(tiny_train_config(), resumed)

    (a, a_weights), (b, b_weights) = _final(saved, straight), _final(saved, resumed)
    assert a["step"] == b["step"] == metrics["steps"]
    for key, value in a_weights.items():
        assert torch.equal(value, b_weights[key]), key
    assert [r["train/loss"] for r in a["history"]] == [r["train/loss"] for r in b["history"]]
    assert not list(resumed.checkpoints.iterdir())  # the finished run removed its checkpoint
    assert straight.model.read_bytes() == resumed.model.read_bytes()  # the same model file, byte for byte
    assert straight.metrics.read_bytes() == resumed.metrics.read_bytes()
    # The timing counts the killed process's checkpointed seconds too, over the same questions.
    assert metrics["seconds"] > killed["seconds"] and a["samples"] == b["samples"]
    # The curves of the resumed run are the uninterrupted run's: complete, not restarted at the interruption,
    # each step once (the saved history written once, then appended), the summary's step the steps done.
    files = sorted(p.relative_to(straight.live) for p in straight.live.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(resumed.live) for p in resumed.live.rglob("*") if p.is_file())
    for name in files:
        assert (straight.live / name).read_bytes() == (resumed.live / name).read_bytes(), name
    rows = (resumed.live / "plots" / "metrics" / "train" / "loss.tsv").read_text().splitlines()
    assert len(rows) == 1 + metrics["steps"]
    assert json.loads((resumed.live / "metrics.json").read_text())["step"] == metrics["steps"]


def _kill_at_step(monkeypatch, step: int) -> None:
    """The optimizer's step number ``step`` raises KeyboardInterrupt, as a kill there would stop the run (its last
    resume checkpoint is the one before)."""
    original = torch.optim.AdamW.step
    calls = {"n": 0}

    def dying_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == step:
            raise KeyboardInterrupt("killed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", dying_step)


@pytest.mark.parametrize("name", ["muon", "muon_conv"])
def test_muon_takes_the_layer_matrices_learns_and_resumes(processed, tmp_path, monkeypatch, saved, name):
    """train.optimizer: muon: Muon updates exactly the 2-D matrices of the encoder's and decoder's layers (muon_conv:
    and the perception's 3x3 conv filters), AdamW the rest; the loss falls, and a killed run resumes to the
    uninterrupted run's model file (both optimizers' states are in the checkpoint)."""
    config = tiny_train_config(optimizer=name)
    model = vlm.train.build_vlm(vlm.traffic_vlm.VLMConfig.from_params(TINY_MODEL, 60, 32, [0.5] * 3, [0.2] * 3))
    optimizer = vlm.optim.make_optimizer(model, config.optimizer, config.lr, config.weight_decay)
    muon, adamw = optimizer.optimizers
    by_id = {id(p): name for name, p in model.named_parameters()}
    expected = {name for name, p in model.named_parameters() if p.dim() == 2 and ".layers." in name}
    filters = {name for name, p in model.named_parameters() if name.startswith("extension.") and p.dim() == 4
               and p.shape[-1] == 3}
    assert filters
    assert {by_id[id(p)] for p in muon.originals} == (expected | filters if name == "muon_conv" else expected)
    assert any("embed_tokens" in by_id[id(p)] for group in adamw.param_groups for p in group["params"])
    # Muon steps flat views of the parameters: each shares its parameter's storage
    flats = [flat for group in muon.param_groups for flat in group["params"]]
    assert all(flat.dim() == 2 and flat.data_ptr() == p.data_ptr() for flat, p in zip(flats, muon.originals))
    assert optimizer.param_groups == [*muon.param_groups, *adamw.param_groups]  # one schedule over all

    straight = paths_for(processed, tmp_path / "straight")
    _train(config, straight)
    history = _final(saved, straight)[0]["history"]
    # the answer's loss (the heads' losses with tens of objects in 32 px frames are noisier than a few steps show)
    assert history[-1]["train/answer_loss"] < 0.8 * history[0]["train/answer_loss"]
    resumed = paths_for(processed, tmp_path / "resumed")
    with monkeypatch.context() as patch:
        _kill_at_step(patch, 5)
        with pytest.raises(KeyboardInterrupt):
            _train(config, resumed)
    _train(config, resumed)
    assert straight.model.read_bytes() == resumed.model.read_bytes()


@pytest.fixture
def bf16_muon(monkeypatch):
    """FlatMuon's Newton-Schulz in bf16 on the CPU too, as torch's Muon runs it everywhere: the same bits."""
    monkeypatch.setattr(vlm.optim, "newton_schulz_dtype", lambda device: torch.bfloat16)


def test_flat_muon_steps_conv_filters_as_their_matrix(bf16_muon):
    """FlatMuon updates a conv's [out, in, k, k] filters exactly as torch's Muon updates their [out, in * k * k]
    matrix, and still reaches them after the conv is moved to channels-last memory (up to bf16 rounding)."""
    x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(0))
    options = {"lr": 0.01, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}
    conv = torch.nn.Conv2d(4, 8, 3)
    matrix = torch.nn.Parameter(conv.weight.detach().flatten(1).clone())
    moved = torch.nn.Conv2d(4, 8, 3)
    moved.load_state_dict(conv.state_dict())
    initial = conv.weight.detach().clone()
    optimizers = [vlm.optim.FlatMuon([conv.weight], **options), torch.optim.Muon([matrix], **options),
                  vlm.optim.FlatMuon([moved.weight], **options)]
    moved.to(memory_format=torch.channels_last)
    for _ in range(3):
        for loss in (conv(x), torch.nn.functional.conv2d(x, matrix.view(8, 4, 3, 3), conv.bias), moved(x)):
            loss.square().mean().backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    assert torch.equal(conv.weight.detach().flatten(1), matrix.detach())
    assert conv.weight.grad is None
    conv(x).sum().backward()
    optimizers[0].zero_grad(set_to_none=False)  # zeroed in place, as torch's optimizers do
    assert conv.weight.grad is not None and not conv.weight.grad.any()
    torch.testing.assert_close(moved.weight.detach(), conv.weight.detach(), atol=3e-3, rtol=0)
    assert (moved.weight.detach() - initial).abs().max() > 1e-3  # stepped, not left behind by the move


@pytest.mark.parametrize("precision", ["bf16", "cpu_float32"])
def test_flat_muon_steps_stacked_matrices_as_torch_muon_steps_each(precision, request):
    """FlatMuon stacks the matrices of one shape (wide, tall, square, several of each) into one Newton-Schulz
    iteration: the same bits as torch's Muon stepping each matrix on its own, over steps with momentum, in bf16;
    on the CPU it iterates in float32, within bf16's rounding of torch's."""
    if precision == "bf16":
        request.getfixturevalue("bf16_muon")
    generator = torch.Generator().manual_seed(0)
    shapes = [(16, 16), (64, 16), (16, 16), (16, 64), (64, 16), (8, 36), (16, 16)]
    ours = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    options = {"lr": 0.01, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}
    optimizers = [vlm.optim.FlatMuon(ours, **options), torch.optim.Muon(theirs, **options)]
    for _ in range(3):
        for mine, reference in zip(ours, theirs, strict=True):
            mine.grad = torch.randn(mine.shape, generator=generator)
            reference.grad = mine.grad.clone()
        for optimizer in optimizers:
            optimizer.step()
    if precision == "cpu_float32":
        for mine, reference in zip(ours, theirs, strict=True):
            torch.testing.assert_close(mine, reference, atol=2e-3, rtol=0)
        assert any(not torch.equal(mine, reference) for mine, reference in zip(ours, theirs, strict=True))
        return
    assert all(torch.equal(mine, reference) for mine, reference in zip(ours, theirs, strict=True))
    assert all(torch.equal(optimizers[0].state[a]["momentum_buffer"], optimizers[1].state[b]["momentum_buffer"])
               for a, b in zip(optimizers[0].param_groups[0]["params"], theirs, strict=True))


def _files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_runtime_settings_change_neither_the_files_nor_the_checkpoint(processed, tmp_path, monkeypatch, caplog):
    """runtime.train is speed only: a run killed under one runtime resumes under another (the fingerprint leaves
    runtime out, so its checkpoint is kept) and ends with the files of an uninterrupted run under the first, byte
    for byte: DataLoader workers, checkpoint spacing, images in RAM or read from HDF5 and the val batch size change
    none of them (threads, which changes the rounding, is the exception: TrainRuntime)."""
    first = replace(TINY_RUNTIME, in_memory=True)
    other = TrainRuntime(threads=1, num_workers=1, eval_batch_size=5, checkpoint_every=4, in_memory=False)
    straight = paths_for(processed, tmp_path / "straight")
    _train(tiny_train_config(), straight, runtime=first)

    switched = paths_for(processed, tmp_path / "switched")
    with monkeypatch.context() as patch:
        _kill_at_step(patch, 5)
        with pytest.raises(KeyboardInterrupt):
            _train(tiny_train_config(), switched, runtime=first)
    with caplog.at_level(logging.INFO, logger="vlm.train"):
        metrics = _train(tiny_train_config(), switched, runtime=other)
    assert "resuming vlm" in caplog.text and "batch 3, step 3" in caplog.text  # the checkpoint of step 3 was kept
    assert straight.model.read_bytes() == switched.model.read_bytes()
    assert straight.metrics.read_bytes() == switched.metrics.read_bytes()
    assert _files(straight.live) == _files(switched.live)
    assert json.loads(straight.timing.read_text())["planned_steps"] == metrics["planned_steps"]


def test_a_resumed_run_reads_none_of_the_batches_it_trained(processed, tmp_path, monkeypatch):
    """Resume starts the epoch's sampler at the checkpoint's batch: the batches trained before the kill are not
    loaded again (only skipped), and every other batch is loaded once."""
    from vlm.data.dataset import TrafficVQADataset

    fetched = []
    original = TrafficVQADataset.__getitems__

    def recording(self, indices):
        if self.augment is not None:  # the train split's (the val split is not augmented)
            fetched.append((self.epoch, tuple(indices)))
        return original(self, indices)

    monkeypatch.setattr(TrafficVQADataset, "__getitems__", recording)
    paths = paths_for(processed, tmp_path)
    with monkeypatch.context() as patch:
        _kill_at_step(patch, 8)  # the checkpoint of step 6 (every 3 steps), in the first epoch (14 batches)
        with pytest.raises(KeyboardInterrupt):
            _train(tiny_train_config(), paths)
    killed = list(fetched)  # epoch 0's batches 0 to 7, the 8th loaded and trained but not stepped
    assert [epoch for epoch, _ in killed] == [0] * 8 and _last(paths)["state"]["batch"] == 6
    fetched.clear()
    metrics = _train(tiny_train_config(), paths)
    assert fetched[:2] == killed[6:8]  # from the checkpoint's batch on
    assert len(fetched) == metrics["steps"] - 6  # every batch of both epochs but the 6 trained before, once
    assert not set(killed[:6]) & set(fetched)


def test_a_killed_runs_checkpoint_waits_for_the_same_params_and_code(processed, tmp_path, monkeypatch, caplog):
    """Each run's checkpoint is named by its fingerprint: a run of other params or other code neither resumes a
    killed run's checkpoint nor removes it, and the killed run, run again, resumes from it."""
    paths = paths_for(processed, tmp_path)
    with monkeypatch.context() as patch:
        _kill_at_step(patch, 4)  # the checkpoint of step 3
        with pytest.raises(KeyboardInterrupt):
            _train(tiny_train_config(epochs=1), paths)
    with caplog.at_level(logging.INFO, logger="vlm.train"):
        for other in ({"lr": 1e-3}, {}):
            with monkeypatch.context() as patch:
                if not other:  # the same params, other code
                    patch.setattr(vlm.train, "code_sha256", lambda: "0" * 64)  # as if vlm/ had been edited
                metrics = _train(tiny_train_config(epochs=1, **other), paths)
            assert "resuming" not in caplog.text and metrics["steps"] == metrics["planned_steps"]
            assert _last(paths)["state"]["step"] == 3  # the killed run's, still there
        _train(tiny_train_config(epochs=1), paths)
    assert "resuming vlm" in caplog.text and "batch 3, step 3" in caplog.text
    assert not list(paths.checkpoints.iterdir())  # each finished run removed its own


def test_non_finite_loss_stops_with_a_clear_error_and_keeps_the_checkpoint(processed, tmp_path, monkeypatch):
    paths = paths_for(processed, tmp_path)
    original = PaliGemma.forward
    calls = {"n": 0}

    def poisoned(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 5:
            output.losses["answer"] = output.losses["answer"] * float("nan")
        return output

    monkeypatch.setattr(PaliGemma, "forward", poisoned)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 1, batch 5 \(step 4\); stopped\. The last good "
                       r"checkpoint is kept at .*vlm-\w+\.pt; lower train\.lr"):
        _train(tiny_train_config(), paths)
    assert _last(paths)["state"]["step"] == 3  # checkpoint_every=3: the last good one survives
    # before the first checkpoint there is none to name (the message named one)
    calls["n"] = 3
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 1, batch 2 \(step 1\); stopped\. No checkpoint "
                       r"was written \(the first comes at step 3\); lower train\.lr"):
        _train(tiny_train_config(), paths_for(processed, tmp_path / "first"))


def test_a_non_finite_loss_is_one_line_from_the_stage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(lambda: (_ for _ in ()).throw(NonFiniteLossError("vlm: loss is nan at epoch 1; stopped")))
    assert exit_info.value.code == 1 and capsys.readouterr().err == "error: vlm: loss is nan at epoch 1; stopped\n"


def test_early_stopping(processed, tmp_path):
    paths = paths_for(processed, tmp_path)
    config = tiny_train_config(epochs=6, lr=1e-9, early_stopping_patience=1)
    metrics = _train(config, paths)
    assert metrics["stopped_early"] and metrics["epochs"] == 2


def test_the_metrics_are_the_saved_models_the_best_epochs(processed, tmp_path, monkeypatch):
    """The heads' val measures in metrics/train.json are of the best epoch, the model saved, as its val accuracy."""
    measures = iter([{"val/accuracy": 0.5, "val/counts/exact": 0.9}, {"val/accuracy": 0.4, "val/counts/exact": 0.1}])
    monkeypatch.setattr(vlm.train, "validate", lambda run: next(measures))
    metrics = _train(tiny_train_config(epochs=2), paths_for(processed, tmp_path))
    assert (metrics["best_epoch"], metrics["epochs"]) == (1, 2)
    assert (metrics["val_accuracy"], metrics["val_counts_exact"]) == (0.5, 0.9)


def test_gradient_accumulation_and_blind(processed, tmp_path):
    paths = paths_for(processed, tmp_path, "blind")
    metrics = _train(tiny_train_config(epochs=3, blind_epochs=1, grad_accum=2), paths, blind=True)
    assert metrics["epochs"] == 1 and metrics["steps"] == metrics["planned_steps"]  # train.blind_epochs
    loaded = load_model(paths.model)
    assert loaded.model.config.vision == "none" and loaded.model.num_image_tokens == 0


def test_every_step_takes_the_mean_gradient_of_its_windows_passes(processed, tmp_path, monkeypatch):
    """Each pass's loss is divided by the passes of its window: grad_accum in the epoch, fewer in its last window when
    grad_accum does not divide the batches (divided by grad_accum, that step's batches counted less)."""
    passes, forward_backward = [], vlm.train.forward_backward
    monkeypatch.setattr(vlm.train, "forward_backward", lambda run, batch, **kw: passes.append(
        (kw["passes"], kw["sync_grads"])) or forward_backward(run, batch, **kw))
    metrics = _train(tiny_train_config(epochs=1, grad_accum=3), paths_for(processed, tmp_path, "blind"), blind=True)
    last = len(passes) % 3
    assert last and metrics["steps"] == -(-len(passes) // 3)  # a shorter last window, a step per window
    assert passes == [(3, (i + 1) % 3 == 0) for i in range(len(passes) - last)] + [(last, i == last) for i in
                                                                                     range(1, last + 1)]


def test_the_blind_model_never_holds_the_images_in_ram(processed, tmp_path):
    from vlm.train import blind_baseline, setup

    config, runtime = tiny_train_config(), replace(TINY_RUNTIME, in_memory=True)
    blind = setup(*blind_baseline(TINY_MODEL, config), paths_for(processed, tmp_path, "blind"), FRAME_SIZE, runtime)
    seeing = setup(TINY_MODEL, config, paths_for(processed, tmp_path), FRAME_SIZE, runtime)
    assert not blind.loader.dataset.in_memory and not blind.val_set.in_memory
    assert seeing.loader.dataset.in_memory and seeing.val_set.in_memory


def test_processes_that_found_different_resume_checkpoints_stop():
    """A node without the checkpoints folder (not on shared storage) would start afresh beside rank 0's resume."""
    from vlm.train import check_same_resume

    check_same_resume([200, 200, 200], Path("c/vlm-1.pt"))
    check_same_resume([None, None], Path("c/vlm-1.pt"))
    with pytest.raises(ValueError, match=r"c/vlm-1\.pt: the processes found different resume checkpoints \(rank 0: "
                                         r"step 200, rank 1: none\): put the checkpoints folder on storage"):
        check_same_resume([200, None], Path("c/vlm-1.pt"))


def test_lr_schedule():
    assert lr_factor(0, 10, 100, 0.1) == pytest.approx(0.1)
    assert lr_factor(9, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_factor(55, 10, 100, 0.1) == pytest.approx(0.55)
    assert lr_factor(100, 10, 100, 0.1) == pytest.approx(0.1)


@pytest.mark.parametrize("values, message", [
    ({"epochs": 0}, "train.epochs: must be >= 1"),
    ({"blind_epochs": 0}, "train.blind_epochs: must be >= 1 or null"),
    ({"lr": -1.0}, "train.lr: must be a finite number > 0"),
    ({"blind_epochs": "all"}, "train.blind_epochs: must be an integer, or null, got 'all'"),  # named only the first
    ({"lr": float("inf")}, "train.lr: must be a finite number > 0, got inf"),  # it passed, then a NaN loss at step 1
    ({"grad_clip": float("inf")}, "train.grad_clip: must be a finite number >= 0, got inf"),
    ({"augment": {"hue": 0.3}}, "train.augment.hue: must be in"),
    ({"optimizer": "sgd"}, "train.optimizer: must be one of 'adamw', 'muon', 'muon_conv', got 'sgd'"),
    ({"optimiser": "adamw"}, "train.optimiser: unknown key"),
])
def test_impossible_train_params(values, message):
    with pytest.raises(ParamError, match=message):
        build_config(TrainConfig, values, "train")


@pytest.mark.parametrize("values, message", [
    ({"threads": -1}, "runtime.train.threads: must be >= 0, got -1"),
    ({"checkpoint_every": 0}, "runtime.train.checkpoint_every: must be >= 1, got 0"),
    ({"in_memory": "sometimes"}, "runtime.train.in_memory: must be true or false, or 'auto', got 'sometimes'"),
    ({"workers": 2}, "runtime.train.workers: unknown key"),
])
def test_impossible_runtime_values(values, message):
    with pytest.raises(ParamError, match=message):
        build_config(TrainRuntime, values, "runtime.train")


def stage_error(tmp_path, monkeypatch, capsys, params: dict) -> str:
    """The train stage's error line on ``params`` (it must exit 1 before reading any data)."""
    import stages.train

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.setattr(sys, "argv", ["stages.train", "--params", str(tmp_path / "params.yaml"), "--data", "d",
                                      "--model", "m.pt", "--checkpoints", "c", "--metrics", "m.json",
                                      "--timing", "t.json", "--live", "l"])
    with pytest.raises(SystemExit) as exit_info:
        run(stages.train.main)
    assert exit_info.value.code == 1
    return capsys.readouterr().err.strip()


def test_an_impossible_runtime_value_stops_the_stage_with_one_line(tmp_path, monkeypatch, capsys):
    error = stage_error(tmp_path, monkeypatch, capsys, {"train": {}, "runtime": {"train": {"threads": -2}}})
    assert error == "error: runtime.train.threads: must be >= 0, got -2"


def test_more_processes_than_gpus_stop_the_stage_with_one_line(tmp_path, monkeypatch, capsys):
    """train.nproc 2 on a one-GPU machine: the second rank would ask for a GPU that is not there."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    error = stage_error(tmp_path, monkeypatch, capsys, {"train": {"nproc": 2}, "runtime": {"train": {}}})
    assert error == ("error: train.nproc: 2 processes, 1 GPU(s) here: one process per GPU "
                     "(CUDA_VISIBLE_DEVICES= trains on the CPU)")


@pytest.mark.parametrize("blind", [False, True])
def test_bad_inputs_stop_the_stage_with_one_line_before_torchrun_starts(processed, tmp_path, monkeypatch, capsys,
                                                                         blind):
    """train.nproc 2: a bad model param or a missing file is one line from the stage, not the same error from each
    of torchrun's processes inside its 40-line traceback."""
    import stages.train

    monkeypatch.setattr(stages.train, "relaunch_distributed", lambda *a: pytest.fail("torchrun started"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    model = {**TINY_MODEL, "connector": "mlp", "gemma": {**TINY_MODEL["gemma"], "num_hidden_layers": 0}}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"train": {"nproc": 2}, "model": model, "runtime": {"train": {}}}))
    argv = ["stages.train", "--params", str(params), "--data", str(processed), "--model", str(tmp_path / "m.pt"),
            "--checkpoints", str(tmp_path / "c"), "--metrics", "m.json", "--timing", "t.json", "--live", "l",
            *(["--blind"] if blind else [])]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit):
        run(stages.train.main)
    error = ("model.gemma.num_hidden_layers: must be positive, got 0" if blind else  # the blind model: no connector
             "model.connector: must be one of 'linear', 'qformer', got 'mlp'")
    assert capsys.readouterr().err == f"error: {error}\n"
    monkeypatch.setattr(sys, "argv", [*argv[:4], str(tmp_path / "nothing"), *argv[5:]])
    with pytest.raises(SystemExit):
        run(stages.train.main)
    assert capsys.readouterr().err == f"error: vocab file not found: {tmp_path / 'nothing' / 'vocab.json'}\n"


def test_bad_model_params_fail_before_training(processed, tmp_path):
    paths = paths_for(processed, tmp_path)
    bad = {**TINY_MODEL, "siglip": {**TINY_MODEL["siglip"], "patch_size": 5}}
    with pytest.raises(ParamError, match="model.siglip.patch_size: must divide the image size"):
        _train(tiny_train_config(), paths, model=bad)
    assert not paths.model.exists() and not paths.checkpoints.exists()


def test_in_memory_auto_holds_the_images_when_they_fit_once_per_copy(processed, caplog, monkeypatch):
    from vlm.data.h5file import PackedImageReader
    from vlm.train import hold_in_memory

    files = [processed / "train_images.h5", processed / "val_images.h5"]
    megabytes = sum(PackedImageReader.image_bytes(f) for f in files) / 2**20  # 40 images of 32 x 32 x 3
    assert megabytes == pytest.approx(40 * 32 * 32 * 3 / 2**20, rel=0.2)
    fits = TrainRuntime(in_memory="auto", in_memory_budget_mb=1)  # 1 MB: one copy fits, eight do not
    with caplog.at_level(logging.INFO, logger="vlm.train"):
        assert hold_in_memory(fits, files, processes_here=1)
        assert not hold_in_memory(fits, files, processes_here=int(1 / megabytes) + 1)
    assert "read from the HDF5 files" in caplog.text
    targets = int(megabytes * 2**20)  # targets as large as the images: two copies do not fit a budget of one
    just_fits = TrainRuntime(in_memory="auto", in_memory_budget_mb=megabytes * 1.5)
    assert hold_in_memory(just_fits, files, 1) and not hold_in_memory(just_fits, files, 1, targets_bytes=targets)
    assert hold_in_memory(TrainRuntime(in_memory=False), files, 1) is False
    assert hold_in_memory(TrainRuntime(in_memory=True, in_memory_budget_mb=0), files, 8) is True
    # two DataLoader workers: forked, they share the process's copy; spawned (macOS), each holds its own
    workers = TrainRuntime(in_memory="auto", in_memory_budget_mb=megabytes * 1.5, num_workers=2)
    for start_method, fits_once in (("fork", True), ("spawn", False)):
        monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False, m=start_method: m)
        assert hold_in_memory(workers, files, 1) is fits_once, start_method


def test_checkpoints_of_a_queued_experiment_go_to_its_repository(tmp_path, monkeypatch):
    """DVC runs a queued experiment in a temporary copy of the repository (deleted when it ends) with DVC_ROOT
    naming the repository: the checkpoint folder, relative to the stage's folder, is placed there."""
    from vlm.cli import in_repository

    repository = tmp_path / "repo"
    copy = repository / ".dvc" / "tmp" / "exps" / "tmp123"
    (copy / ".dvc").mkdir(parents=True)
    monkeypatch.chdir(copy)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert in_repository("models/checkpoints") == Path("models/checkpoints")  # by hand: where it is run
    monkeypatch.setenv("DVC_ROOT", str(repository))
    assert in_repository("models/checkpoints") == repository.resolve() / "models" / "checkpoints"
    (copy / "sub").mkdir()
    monkeypatch.chdir(copy / "sub")  # a stage in a sub-folder of the repository
    assert in_repository("ckpt") == repository.resolve() / "sub" / "ckpt"
    assert in_repository(tmp_path / "abs") == tmp_path / "abs"
    monkeypatch.chdir(repository)  # `dvc repro` or `dvc exp run` in the workspace itself
    assert in_repository("models/checkpoints") == Path("models/checkpoints")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_compiled_packed_training_on_cuda_resumes(processed, tmp_path, monkeypatch, saved):
    """The GPU recipe's path: CUDA, bf16 autocast, fused AdamW, compiled layers, packed rows; a killed run resumes
    (CUDA's atomic adds reorder sums, so the weights agree to rounding, not bit for bit)."""
    model = {**TINY_MODEL, "pack_questions": True}
    runtime = replace(TINY_RUNTIME, compile=True)
    straight = paths_for(processed, tmp_path / "straight")
    metrics = _train(tiny_train_config(), straight, model=model, runtime=runtime)
    history = _final(saved, straight)[0]["history"]
    assert metrics["steps"] == metrics["planned_steps"] and history[-1]["train/loss"] < history[0]["train/loss"]
    resumed = paths_for(processed, tmp_path / "resumed")
    with monkeypatch.context() as patch:
        _kill_at_step(patch, 5)
        with pytest.raises(KeyboardInterrupt):
            _train(tiny_train_config(), resumed, model=model, runtime=runtime)
    _train(tiny_train_config(), resumed, model=model, runtime=runtime)
    a_weights, b_weights = _final(saved, straight)[1], _final(saved, resumed)[1]
    for key, value in a_weights.items():
        torch.testing.assert_close(value, b_weights[key], rtol=1e-2, atol=1e-3, msg=key)


def test_native_aspect_trains_evaluates_saves_and_answers_any_photo(tiny_project, tmp_path):
    """pack.aspect native end to end: 1280x720 frames packed 64 x 32 (a 4 x 8 patch grid, 2 x 4 image tokens), a
    tiny run with both perception heads, its checkpoint round trip, and predict on photos of other aspects."""
    import numpy as np
    import pandas as pd
    from PIL import Image

    from vlm.evaluate import attention_grids
    from vlm.predict import answer_images

    project = tiny_project.copy_to(tmp_path / "project")
    project.pack_native()
    paths = paths_for(project.processed, tmp_path / "out")
    metrics = _train(tiny_train_config(epochs=1), paths, model={**TINY_MODEL, "pixel_shuffle": 2})
    assert metrics["steps"] > 0 and 0.0 <= metrics["val_accuracy"] <= 1.0  # the val accuracy: an evaluation
    loaded = load_model(paths.model, project.processed / "vocab.json")
    siglip = loaded.model.config.siglip
    assert (siglip.height_width, siglip.grid, siglip.num_patches) == ((32, 64), (4, 8), 32)
    assert loaded.model.config.num_image_tokens == 8
    assert (loaded.image_size, loaded.image_width) == (32, 64)
    assert tuple(loaded.checkpoint["frame_size"]) == FRAME_SIZE
    processor = loaded.processor
    assert processor.aspect == FRAME_SIZE[0] / FRAME_SIZE[1]
    frame = next(project.image_dir.glob("*.jpg"))
    assert processor.image(frame).shape == (3, 32, 64)  # the frames' aspect: resized as the pack stage did
    photos = {"four_three.png": (400, 300), "portrait.png": (300, 500)}
    for name, size in photos.items():
        Image.new("RGB", size, (250, 250, 250)).save(tmp_path / name)
        pixels = processor.image(tmp_path / name)  # letterboxed to 16:9 with black bars left and right
        assert pixels.shape == (3, 32, 64)
        assert (pixels[:, :, :2] == 0).all() and (pixels[:, :, -2:] == 0).all() and (pixels[:, :, 31] > 200).all()
    ranked = answer_images(loaded, [str(tmp_path / name) for name in photos], "Is there a car?")
    assert all(sorted(answer for answer, _ in r) == ["no", "yes"] for r in ranked)  # its template's answers only
    assert all(abs(sum(p for _, p in r) - 1) < 1e-4 for r in ranked)
    rows = pd.DataFrame({"image_id": ["a"], "command": ["Is there a car?"]})
    heat = attention_grids(loaded, rows, {"a": frame}, {}, torch.device("cpu"))
    assert heat.shape == (1, 2, 4) and np.isfinite(heat).all()  # the token grid: 4 x 8 patches shuffled by 2


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_one_per_core_counts_the_cores_this_process_may_use(tmp_path, monkeypatch):
    """A ``runtime`` count of 0 ("one per core") counts the cores the process may run on, which taskset, a
    container's cpuset or Slurm narrow below the machine's; training's threads share them among this machine's
    processes of the run (torchrun's LOCAL_WORLD_SIZE), not among all nodes' (WORLD_SIZE)."""
    from vlm.data.pack import PackRuntime
    from vlm.scenes.generate import ScenesRuntime
    from vlm.train import TrainPaths, start_processes

    cpus, threads = os.sched_getaffinity(0), torch.get_num_threads()
    seeds = random.getstate(), np.random.get_state(), torch.get_rng_state()  # start_processes seeds all three
    paths = TrainPaths(*(tmp_path / name for name in ("data", "vlm.pt", "checkpoints", "train.json", "timing.json",
                                                       "live")))
    try:
        os.sched_setaffinity(0, {min(cpus)})
        assert (ScenesRuntime().num_workers, PackRuntime(workers=0).num_workers) == (1, 1)
        start_processes(TrainConfig(), TrainRuntime(), paths)
        assert torch.get_num_threads() == 1
        os.sched_setaffinity(0, cpus)
        start_processes(TrainConfig(), TrainRuntime(), paths)
        assert torch.get_num_threads() == len(cpus)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(len(cpus)))  # one process per usable core on this machine
        start_processes(TrainConfig(), TrainRuntime(), paths)
        assert torch.get_num_threads() == 1
    finally:
        os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)
        random.setstate(seeds[0])
        np.random.set_state(seeds[1])
        torch.set_rng_state(seeds[2])


def test_muon_lr_is_torchs_step_size_to_the_bit():
    """``vlm.optim.muon_lr`` writes out ``torch.optim.Muon``'s per-shape step size (a private function of torch's) with
    its rounding: ``lr * 0.2 * sqrt(n)`` rounds otherwise than ``lr * (0.2 * sqrt(n))`` for 41% of a schedule's steps,
    and the default model ended elsewhere."""
    from torch.optim._muon import _adjust_lr

    shapes = [torch.Size(s) for s in ((128, 128), (512, 128), (128, 512), (128, 1152), (16, 144), (64, 288))]
    for step in range(0, 2400, 7):
        lr = 0.002 * vlm.optim.lr_factor(step, 100, 2400, 0.05)
        for shape in shapes:
            for adjust in ("match_rms_adamw", "original", None):
                assert vlm.optim.muon_lr(lr, adjust, shape) == _adjust_lr(lr, adjust, shape), (step, shape, adjust)
