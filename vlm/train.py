"""The training loop: AdamW (or Muon), warmup + cosine, clipping, accumulation, checkpoints, resume, DDP. Read it top
to bottom in :func:`train`: :func:`setup`, :func:`resume`, :func:`train_epoch` and :func:`end_epoch` for each epoch,
:func:`finish`. What it writes, how it resumes and runs under ``torchrun``: docs/architecture.md (train, Training)."""

import hashlib
import json
import logging
import math
import multiprocessing
import os
import random
import time
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from dvclive import Live
from vlm import checkpoint
from vlm.batch import Batch
from vlm.config import check
from vlm.data.augment import AugmentConfig
from vlm.data.dataset import TrafficVQADataset
from vlm.data.h5file import PackedImageReader
from vlm.data.loader import build_loader, set_epoch
from vlm.device import autocast, pick_device
from vlm.inference import perception_metrics, predict_dataset
from vlm.io import check_writable, write_json
from vlm.models.gemma import GemmaDecoderLayer
from vlm.models.paligemma import PaliGemma, VLMOutput
from vlm.models.siglip import SiglipEncoderLayer
from vlm.optim import lr_factor, make_optimizer
from vlm.params import available_cpus
from vlm.tokenizer import TrafficCommandTokenizer
from vlm.traffic_vlm import VLMConfig, build_vlm

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """What a run learns: params.yaml's ``train`` (how fast it goes is :class:`TrainRuntime`)."""

    seed: int = 0
    epochs: int = 6
    blind_epochs: int | None = 1  # epochs of the blind baseline (train_blind); None = epochs
    batch_size: int = 64  # questions per forward pass (per process under DDP)
    grad_accum: int = 1  # forward passes per optimizer step
    lr: float = 2e-3
    min_lr_ratio: float = 0.05  # the cosine ends at lr * min_lr_ratio
    warmup_steps: int = 100  # optimizer steps of linear warmup
    weight_decay: float = 0.05
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    # muon_conv: Muon on the layers' matrices and the perception's 3x3 filters, AdamW on the rest; muon: the matrices
    optimizer: Literal["adamw", "muon", "muon_conv"] = "muon_conv"
    early_stopping_patience: int = 0  # epochs without a better val accuracy before stopping; 0 = never
    nproc: int = 1  # DDP processes on this machine: the stage relaunches itself under torchrun when > 1
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def validate(self, prefix: str = "train") -> None:
        for name in ("epochs", "batch_size", "grad_accum", "nproc"):
            check(getattr(self, name) >= 1, f"{prefix}.{name}", f"must be >= 1, got {getattr(self, name)}")
        check(self.blind_epochs is None or self.blind_epochs >= 1, f"{prefix}.blind_epochs",
              f"must be >= 1 or null (= epochs), got {self.blind_epochs}")
        check(math.isfinite(self.lr) and self.lr > 0, f"{prefix}.lr", f"must be a finite number > 0, got {self.lr}")
        check(0 <= self.min_lr_ratio <= 1, f"{prefix}.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("warmup_steps", "weight_decay", "grad_clip", "early_stopping_patience"):
            value = getattr(self, name)
            check(math.isfinite(value) and value >= 0, f"{prefix}.{name}", f"must be a finite number >= 0, got {value}")
        self.augment.validate(f"{prefix}.augment")


# The keys of params.yaml's ``train`` that each stage reads, as dvc.yaml declares them (docs/architecture.md, train).
VLM_TRAIN_KEYS = tuple(f.name for f in fields(TrainConfig) if f.name != "blind_epochs")
BLIND_TRAIN_KEYS = (*(name for name in VLM_TRAIN_KEYS if name != "augment"), "blind_epochs", "augment.hflip_prob")


@dataclass
class TrainRuntime:
    """How fast a run goes, never what it learns: params.yaml's ``runtime.train`` (docs/architecture.md, "Speed
    settings"), which the resume fingerprint leaves out."""

    threads: int = 0  # torch CPU threads per process; 0 = the cores shared among the processes
    num_workers: int = 0  # DataLoader workers; 0 loads in the training process
    eval_batch_size: int = 256  # questions per batch of the val accuracy
    checkpoint_every: int = 200  # optimizer steps between resume checkpoints (and at each epoch end)
    # the train and val images and the heads' targets in RAM; auto: when they fit in_memory_budget_mb, once per
    # process on this machine (else read from the HDF5 files, targets built per batch)
    in_memory: bool | Literal["auto"] = "auto"
    in_memory_budget_mb: int = 4096
    compile: bool = False  # torch.compile each encoder and decoder layer (dynamic shapes: the rows' lengths vary)

    def validate(self, prefix: str = "runtime.train") -> None:
        for name in ("eval_batch_size", "checkpoint_every"):
            check(getattr(self, name) >= 1, f"{prefix}.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("threads", "num_workers", "in_memory_budget_mb"):
            check(getattr(self, name) >= 0, f"{prefix}.{name}", f"must be >= 0, got {getattr(self, name)}")


@dataclass
class TrainPaths:
    data: Path  # commands/{split}.json, vocab.json and {split}_images.h5
    model: Path  # the best model; its stem names the run
    checkpoints: Path  # resume checkpoints, one file per run fingerprint
    metrics: Path  # headline metrics (dvc.yaml declares them as metrics)
    timing: Path  # seconds and questions/s: compared by the profile and the benchmarks, not as metrics
    live: Path  # dvclive folder

    @property
    def vocab(self) -> Path:
        return self.data / "vocab.json"

    def split(self, name: str) -> tuple[Path, Path]:
        return self.data / "commands" / f"{name}.json", self.data / f"{name}_images.h5"


@dataclass
class TrainState:
    """A run's progress: what a resume checkpoint restores besides the weights and the optimizer."""

    epoch: int = 0  # epochs finished
    batch: int = 0  # batches of the current epoch already trained
    step: int = 0  # optimizer steps
    best_accuracy: float = -1.0
    best: dict[str, Any] | None = None  # the best model's checkpoint payload (vlm.checkpoint.model_payload)
    bad_epochs: int = 0  # epochs since the best
    stopped_early: bool = False
    history: list[dict[str, Any]] = field(default_factory=list)  # one record per optimizer step
    seconds: float = 0.0  # training time, validation excluded
    samples: int = 0  # questions trained on, all processes


class NonFiniteLossError(FloatingPointError):
    pass


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # the run's processes on this machine (torchrun's LOCAL_WORLD_SIZE)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def compile_layers(model: torch.nn.Module) -> None:
    """``torch.compile`` each encoder and decoder layer in place (``nn.Module.compile``: the parameter names, so the
    checkpoints, stay), as torchtitan does; the code between them stays eager. Dynamic: question lengths vary."""
    for module in model.modules():
        if isinstance(module, (SiglipEncoderLayer, GemmaDecoderLayer)):
            module.compile(dynamic=True)


class Curves:
    """The run's per-step curves through dvclive (rank 0): each history record at its step, then ``next_step``,
    which rewrites the summary and tells DVC's VS Code extension and DVC Studio that a step ended (their live view).
    The stages' own dvc.yaml declares the curves and the model, so dvclive writes none."""

    def __init__(self, folder: Path):
        self.live = Live(str(folder), dvcyaml=False, save_dvc_exp=False)  # a new run: the folder starts empty
        self.logged = 0

    def update(self, history: list[dict[str, Any]]) -> None:
        for record in history[self.logged:]:
            self.live.step = record["step"]
            for key, value in record.items():
                if key not in ("step", "epoch"):
                    self.live.log_metric(key, value)
            self.live.next_step()
        self.logged = len(history)


@dataclass
class Run:
    """Everything :func:`setup` builds for one training run."""

    name: str  # "vlm" or "blind": the model file's stem
    config: TrainConfig
    runtime: TrainRuntime
    paths: TrainPaths
    dist: Distributed
    device: torch.device
    model: PaliGemma
    ddp_model: torch.nn.Module  # the model, wrapped in DistributedDataParallel under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: torch.utils.data.DataLoader
    val_set: TrafficVQADataset
    answers: list[str]  # the answer set of constrained decoding
    candidates: list[list[int]]  # their token ids
    total_steps: int  # what the LR schedule spans
    fingerprint: str  # a resume checkpoint is used only by a run with the same
    model_info: dict[str, Any]  # what the model checkpoint stores beside the weights
    curves: Curves | None  # rank 0's

    @property
    def last_path(self) -> Path:
        """The resume checkpoint, named by the fingerprint: runs of other params, data or code never take it."""
        return self.paths.checkpoints / f"{self.name}-{self.fingerprint[:16]}.pt"


# The loop
def train(model_params: Mapping[str, Any], config: TrainConfig, paths: TrainPaths, *, blind: bool = False,
          progress: bool = True, frame_size: tuple[float, float] | None = None,
          runtime: TrainRuntime | None = None) -> dict[str, Any]:
    """Train a VLM (or its :func:`blind_baseline`); return its metrics. ``frame_size``: the label boxes' frame size."""
    if blind:
        model_params, config = blind_baseline(model_params, config)
    run = setup(model_params, config, paths, frame_size, runtime)
    state = resume(run)
    run.model.train()
    while state.epoch < run.config.epochs and not state.stopped_early:
        train_epoch(run, state, progress)
        end_epoch(run, state)
    return finish(run, state)


def blind_baseline(model_params: Mapping[str, Any], config: TrainConfig) -> tuple[dict[str, Any], TrainConfig]:
    """The text-only baseline (docs/architecture.md, train_blind): the same decoder, no image, of the augmentation
    only the mirror, ``train.blind_epochs`` epochs."""
    params = {"vision": "none", "gemma": model_params.get("gemma", {}),
              "decoder_checkpoint": model_params.get("decoder_checkpoint")}
    augment = AugmentConfig.mirror_only(config.augment.hflip_prob)
    epochs = config.epochs if config.blind_epochs is None else config.blind_epochs
    return params, replace(config, epochs=epochs, augment=augment)


def check_inputs(model_params: Mapping[str, Any], config: TrainConfig, paths: TrainPaths, *, blind: bool) -> None:
    """What :func:`setup` checks before any weight (the model params against the vocabulary and the packed images),
    for a stage to check before it starts torchrun's processes: each would print the error, in torchrun's traceback."""
    if blind:
        model_params, config = blind_baseline(model_params, config)
    model_config_of(model_params, TrafficCommandTokenizer.from_file(paths.vocab), paths)


def setup(model_params: Mapping[str, Any], config: TrainConfig, paths: TrainPaths,
          frame_size: tuple[float, float] | None, runtime: TrainRuntime | None = None) -> Run:
    """Processes, inputs (checked before any weight is built), model, data and optimizer."""
    runtime = runtime or TrainRuntime()
    dist_info = start_processes(config, runtime, paths)
    device = pick_device(dist_info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tokenizer = TrafficCommandTokenizer.from_file(paths.vocab)
    model_config, resample = model_config_of(model_params, tokenizer, paths)
    model = build_vlm(model_config).to(device)
    if runtime.compile:
        compile_layers(model)
    train_set, val_set = load_splits(model, config, runtime, paths, tokenizer, frame_size, dist_info.local_world_size)
    answers = sorted({r["answer"] for r in train_set.records})
    loader = build_loader(train_set, config.batch_size, shuffle=True, num_workers=runtime.num_workers,
                          seed=config.seed, rank=dist_info.rank, world_size=dist_info.world_size)
    total_steps = planned_steps(loader, config)
    optimizer = make_optimizer(model, config.optimizer, config.lr, config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, config.warmup_steps, total_steps, config.min_lr_ratio))
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if dist_info.world_size > 1 else model
    model_info = {"config": model_config.to_dict(), "vocab": json.loads(paths.vocab.read_text(encoding="utf-8")),
                  "vocab_sha256": checkpoint.file_sha256(paths.vocab), "answers": answers,
                  "image_size": model_config.siglip.image_size, "image_width": model_config.siglip.image_width,
                  "frame_size": frame_size, "resample": resample, "blind": model_config.vision == "none"}
    return Run(name=paths.model.stem, config=config, runtime=runtime, paths=paths, dist=dist_info, device=device,
               model=model, ddp_model=ddp_model, optimizer=optimizer, scheduler=scheduler, loader=loader,
               val_set=val_set, answers=answers, candidates=[tokenizer.encode_answer(a) for a in answers],
               total_steps=total_steps,
               fingerprint=fingerprint(model_config, config, paths, dist_info.world_size, frame_size),
               model_info=model_info, curves=Curves(paths.live) if dist_info.is_main else None)


def start_processes(config: TrainConfig, runtime: TrainRuntime, paths: TrainPaths) -> Distributed:
    """This process's place in the run (the DDP group joined under torchrun), its CPU threads and seeds; on
    rank 0 an unwritable output folder fails now, not at the first checkpoint."""
    dist_info = Distributed(*(int(os.environ.get(name, default)) for name, default in
                              (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0), ("LOCAL_WORLD_SIZE", 1))))
    if dist_info.is_main:
        check_writable(paths.model, paths.checkpoints / "last.pt", paths.metrics, paths.timing, paths.live)
    if dist_info.world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    # 0: the usable cores shared among this machine's processes of the run
    torch.set_num_threads(runtime.threads or max(1, available_cpus() // dist_info.local_world_size))
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    return dist_info


def model_config_of(model_params: Mapping[str, Any], tokenizer: TrafficCommandTokenizer,
                    paths: TrainPaths) -> tuple[VLMConfig, str]:
    """The model config (params plus what the data fixes: vocabulary, image size, pixel stats), the packing filter."""
    header = PackedImageReader(paths.split("train")[1])
    config = VLMConfig.from_params(model_params, tokenizer.vocab_size, header.image_size, header.mean.tolist(),
                                   header.std.tolist(), image_width=header.image_width)
    return config, header.resample


def load_splits(model: PaliGemma, config: TrainConfig, runtime: TrainRuntime, paths: TrainPaths,
                tokenizer: TrafficCommandTokenizer,
                frame_size: tuple[float, float] | None,
                processes_here: int) -> tuple[TrafficVQADataset, TrafficVQADataset]:
    """The train split (augmented, with the extension's targets) and val, in RAM per ``runtime.train.in_memory``
    (``processes_here``: the run's processes on this machine, each holding its copy)."""
    (train_commands, train_h5), (val_commands, val_h5) = paths.split("train"), paths.split("val")
    targets = None
    if model.extension is not None:
        targets = model.extension.targets(model.config.siglip.height_width, frame_size)
        if targets is not None and frame_size is None:
            raise ValueError("train(): a model with perception heads needs the frame size its labels' boxes are "
                             "given in")
    # the blind model reads no pixel: its images are never worth RAM
    in_memory = model.config.vision != "none" and hold_in_memory(
        runtime, [train_h5, val_h5], processes_here,
        0 if targets is None else targets.bytes_per_image * sum(len(PackedImageReader(f)) for f in (train_h5, val_h5)))
    train_set = TrafficVQADataset(train_commands, train_h5, tokenizer, augment=config.augment,
                                  in_memory=in_memory, seed=config.seed, targets=targets)
    return train_set, TrafficVQADataset(val_commands, val_h5, tokenizer, in_memory=in_memory, targets=targets)


def planned_steps(loader: torch.utils.data.DataLoader, config: TrainConfig) -> int:
    """Optimizer steps over all epochs, what the LR schedule spans (an image's questions share a batch: epochs vary)."""
    total_steps = 0
    for epoch in range(config.epochs):
        set_epoch(loader, epoch)
        total_steps += math.ceil(len(loader) / config.grad_accum)
    return total_steps


def resume(run: Run) -> TrainState:
    """The state of the last checkpoint of the same run (weights, optimizer and RNG restored), else a new one."""
    saved = checkpoint.read_resume(run.last_path, run.fingerprint)
    if run.dist.world_size > 1:  # each process reads its own disk: the nodes of a run must find the same checkpoint
        steps: list[int | None] = [None] * run.dist.world_size
        dist.all_gather_object(steps, None if saved is None else saved["state"]["step"])
        check_same_resume(steps, run.last_path)
    if saved is None:
        return TrainState()
    run.model.load_state_dict(saved["model"])
    run.optimizer.load_state_dict(saved["optimizer"])
    run.scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["torch_rng"])
    state = TrainState(**saved["state"])
    log.info("resuming %s from %s: epoch %d, batch %d, step %d", run.name, run.last_path, state.epoch + 1,
             state.batch, state.step)
    return state


def check_same_resume(steps: list[int | None], path: Path) -> None:
    """Stop unless every process found the same resume checkpoint (``steps``: each rank's step, None: none found); a
    process starting afresh beside one resuming would train other weights and hang in the collectives."""
    if len(set(steps)) > 1:
        found = ", ".join(f"rank {rank}: {'none' if step is None else f'step {step}'}" for rank, step in
                          enumerate(steps))
        raise ValueError(f"{path}: the processes found different resume checkpoints ({found}): put the checkpoints "
                         f"folder on storage every node shares, or delete it to start again")


def train_epoch(run: Run, state: TrainState, progress: bool) -> None:
    """The optimizer steps of epoch ``state.epoch``, from batch ``state.batch`` on (a resumed run starts the sampler
    there: the batches it trained before are not read); a resume checkpoint every ``checkpoint_every`` steps."""
    config, loader = run.config, run.loader
    set_epoch(loader, state.epoch, start=state.batch)
    batches = state.batch + len(loader)  # in the whole epoch
    bar = tqdm(total=batches, initial=state.batch, desc=f"{run.name} epoch {state.epoch + 1}/{config.epochs}",
               unit="batch", disable=not (progress and run.dist.is_main), leave=False)
    started = time.perf_counter()
    window = StepWindow()
    for index, batch in enumerate(loader, start=state.batch):
        batch = batch.to(run.device)
        last_batch = index + 1 == batches
        boundary = (index + 1) % config.grad_accum == 0 or last_batch
        output, loss = forward_backward(run, batch, sync_grads=boundary,
                                        passes=window_passes(index, batches, config.grad_accum))
        record_pass(run, window, output, loss, batch,
                    where=f"epoch {state.epoch + 1}, batch {index + 1} (step {state.step})", state=state)
        state.samples += len(batch) * run.dist.world_size
        if not boundary:
            continue
        optimizer_step(run)
        state.step += 1
        state.batch = index + 1
        record = {"step": state.step, "epoch": state.epoch + 1, **window.pop(), "lr": run.scheduler.get_last_lr()[0]}
        bar.update(index + 1 - bar.n)
        bar.set_postfix(loss=f"{record['train/loss']:.3f}", acc=f"{record['train/accuracy']:.2f}")
        state.history.append(record)
        if last_batch:  # end_epoch completes the record with the val accuracy
            break
        if run.curves:
            run.curves.update(state.history)
        if state.step % run.runtime.checkpoint_every == 0:
            state.seconds += time.perf_counter() - started
            started = time.perf_counter()
            save_resume(run, state)
    state.seconds += time.perf_counter() - started
    bar.close()


def end_epoch(run: Run, state: TrainState) -> None:
    """Val accuracy, the best model so far, early stopping, the resume checkpoint."""
    record = state.history[-1]
    record.update(validate(run))
    accuracy = record["val/accuracy"]
    if accuracy > state.best_accuracy:
        state.best_accuracy, state.bad_epochs = accuracy, 0
        state.best = checkpoint.model_payload(run.model, run.model_info,
                                              {"epoch": record["epoch"], "step": state.step, "val_accuracy": accuracy})
    else:
        state.bad_epochs += 1
        patience = run.config.early_stopping_patience
        if patience and state.bad_epochs >= patience:
            state.stopped_early = True
            log.info("early stopping after epoch %d: no better val accuracy for %d epochs", record["epoch"],
                     state.bad_epochs)
    state.epoch, state.batch = state.epoch + 1, 0
    save_resume(run, state)


def finish(run: Run, state: TrainState) -> dict[str, Any]:
    """The best model and the metrics, written only by a finished run, which removes its resume checkpoint."""
    metrics = {}
    if run.dist.is_main:
        run.curves.update(state.history)  # a run resumed at its end has logged nothing yet
        checkpoint.save(run.paths.model, state.best)
        metrics, timing = train_metrics(state, run.model), train_timing(state, run.total_steps)
        write_json(run.paths.metrics, metrics)
        write_json(run.paths.timing, timing)
        metrics = {**metrics, **timing}
        run.last_path.unlink(missing_ok=True)  # every output is written: nothing left to resume
    if run.dist.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return metrics


# The loop's helpers
def window_passes(index: int, batches: int, grad_accum: int) -> int:
    """The forward passes of the accumulation window that batch ``index`` of an epoch of ``batches`` is in:
    ``grad_accum``, fewer in the epoch's last window when ``grad_accum`` does not divide ``batches``."""
    return min(grad_accum, batches - (index - index % grad_accum))


def forward_backward(run: Run, batch: Batch, *, sync_grads: bool, passes: int) -> tuple[VLMOutput, torch.Tensor]:
    """Forward and backward pass of one batch, its gradient divided by its window's ``passes`` (the step takes their
    mean); under DDP the gradients sync only at the window's end. Its loss is checked by :func:`record_pass`, before
    the optimizer step, in the one sync of the step's record."""
    sync = nullcontext() if sync_grads or run.dist.world_size == 1 else run.ddp_model.no_sync()
    with sync, autocast(run.device):
        output = run.ddp_model(batch, answer_only=True)
    loss = weighted_loss(output.losses, run.model.loss_weights)
    (loss / passes).backward()
    return output, loss


def weighted_loss(losses: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """The training loss: each loss of the model's loss dict (the answer's, each head's) times its weight, summed."""
    return sum(weights[name] * loss for name, loss in losses.items())


def optimizer_step(run: Run) -> None:
    """Gradient clipping, the AdamW step, the learning-rate schedule's step."""
    if run.config.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.config.grad_clip)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)


class StepWindow:
    """Means over the forward passes of one optimizer step (and under DDP over the processes) for its record."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, output: VLMOutput, loss: torch.Tensor, batch: Batch, world_size: int = 1) -> float:
        """Add a forward pass's losses and accuracy, read from the device in one sync; -> its loss (under DDP the
        processes' mean, non-finite where any process's is)."""
        # the share of questions whose first answer token (the answer of a one-word one) is the argmax
        rows = torch.arange(len(batch.labels), device=batch.labels.device)
        first_token = output.logits.detach()[:, 0].argmax(-1)  # [B] (answer_only logits [B, A, V])
        accuracy = (first_token == batch.labels[rows, batch.prefix_lengths]).float().mean()
        named = {"train/loss": loss, **{f"train/{name}_loss": value for name, value in output.losses.items()},
                 "train/accuracy": accuracy}
        values = torch.stack([v.detach().float() for v in named.values()])
        if world_size > 1:
            dist.all_reduce(values)
            values /= world_size
        values = values.tolist()
        for key, value in zip(named, values):
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.count += 1
        return values[0]

    def pop(self) -> dict[str, float]:
        record = {key: total / self.count for key, total in self.sums.items()}
        self.__init__()
        return record


def record_pass(run: Run, window: StepWindow, output: VLMOutput, loss: torch.Tensor, batch: Batch, *,
                where: str, state: TrainState | None) -> None:
    """The pass's losses and accuracy into ``window`` (one read from the device); a non-finite loss stops the run
    there, before the optimizer step, so the weights stay as they were (the message says what ``state``'s run
    keeps)."""
    loss = window.add(output, loss, batch, run.dist.world_size)
    if not math.isfinite(loss):
        raise NonFiniteLossError(f"{run.name}: loss is {loss} at {where}; stopped. {kept_checkpoint(run, state)}; "
                                 f"lower train.lr or raise train.warmup_steps (a new run, from step 0)")


def kept_checkpoint(run: Run, state: TrainState | None) -> str:
    """What a stopped run keeps to resume from, for its error message."""
    if state is None or not run.last_path.is_file():
        return f"No checkpoint was written (the first comes at step {run.runtime.checkpoint_every})"
    best = f", which holds the best model so far (epoch {state.best['metrics']['epoch']})," if state.best else ""
    return f"The last good checkpoint{best} is kept at {run.last_path}"


def save_resume(run: Run, state: TrainState) -> None:
    """The resume checkpoint, and the curves up to here."""
    if run.dist.is_main:
        checkpoint.save_resume(run.last_path, run.fingerprint, run.model, run.optimizer, run.scheduler, asdict(state))
        run.curves.update(state.history)


def validate(run: Run) -> dict[str, float]:
    """``val/accuracy`` (computed on rank 0, broadcast) and, on rank 0, the perception heads' own val measures."""
    accuracy, measures = torch.zeros(1, device=run.device), {}
    if run.dist.is_main:
        run.model.eval()
        with autocast(run.device):
            predicted, _ = predict_dataset(run.model, run.val_set, run.candidates, run.runtime.eval_batch_size,
                                           run.device)
            measures = perception_metrics(run.model, run.val_set, run.runtime.eval_batch_size, run.device)
        run.model.train()
        truth = [r["answer"] for r in run.val_set.records]
        accuracy[0] = float(np.mean([run.answers[p] == t for p, t in zip(predicted, truth)]))
    if run.dist.world_size > 1:
        dist.broadcast(accuracy, src=0)
    return {"val/accuracy": float(accuracy.item()), **{f"val/{name}": value for name, value in measures.items()}}


def hold_in_memory(runtime: TrainRuntime, files: list[Path], processes_here: int, targets_bytes: int = 0) -> bool:
    """``runtime.train.in_memory``, with ``auto`` resolved: the images of ``files`` and the heads' targets
    (``targets_bytes``) fit the budget once per copy on this machine: one per process, and one per DataLoader worker
    where the workers are not forked (spawn, macOS's default: each unpickles the dataset it is sent)."""
    if runtime.in_memory != "auto":
        return runtime.in_memory
    start_method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    copies = processes_here * (1 if start_method == "fork" else 1 + runtime.num_workers)
    needed_mb = copies * (sum(PackedImageReader.image_bytes(f) for f in files) + targets_bytes) / 2**20
    fits = needed_mb <= runtime.in_memory_budget_mb
    log.info("in_memory auto: %d cop(ies) x the train and val images and the heads' targets = %.0f MB %s "
             "runtime.train.in_memory_budget_mb (%d): %s", copies, needed_mb, "<=" if fits else ">",
             runtime.in_memory_budget_mb,
             "held in RAM" if fits else "read from the HDF5 files, targets built per batch")
    return fits


def fingerprint(model_config: VLMConfig, config: TrainConfig, paths: TrainPaths, world_size: int,
                frame_size: tuple[float, float] | None) -> str:
    """Identifies a run (params, data and the ``vlm`` code): only a run with the same uses a resume checkpoint."""
    files = [paths.vocab, *paths.split("train"), *paths.split("val")]
    payload = {"model": model_config.to_dict(), "train": asdict(config), "world_size": world_size,
               "frame_size": frame_size, "code": code_sha256(),
               "files": {str(p): checkpoint.file_sha256(p) for p in files}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def code_sha256() -> str:
    """One hash of every Python file of the ``vlm`` package (paths and contents)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def train_metrics(state: TrainState, model: torch.nn.Module) -> dict[str, Any]:
    """The run's headline numbers, the best epoch's validation accuracy first."""
    evals = [r for r in state.history if "val/accuracy" in r]
    last_epoch = [r for r in state.history if r["epoch"] == state.history[-1]["epoch"]]
    best = next(r for r in evals if r["epoch"] == state.best["metrics"]["epoch"]) if state.best else {}
    return {
        "val_accuracy": round(state.best_accuracy, 4),
        "best_epoch": state.best["metrics"]["epoch"] if state.best else None,
        "epochs": evals[-1]["epoch"] if evals else 0, "stopped_early": state.stopped_early,
        "train_loss": round(float(np.mean([r["train/loss"] for r in last_epoch])), 4),
        "train_accuracy": round(float(np.mean([r["train/accuracy"] for r in last_epoch])), 4),
        "steps": state.step, "parameters": sum(p.numel() for p in model.parameters()),
        # the perception heads' own val measures at the best epoch, the saved model's (e.g. val_counts_exact)
        **{key.replace("/", "_"): round(value, 4) for key, value in best.items()
           if key.startswith("val/") and key != "val/accuracy"},
    }


def train_timing(state: TrainState, planned_steps: int) -> dict[str, Any]:
    """Training time over every process that worked on the run (a resumed run adds its time to the saved)."""
    return {
        "seconds": round(state.seconds, 1),  # validation excluded
        "questions_per_s": round(state.samples / max(state.seconds, 1e-9), 1),
        "planned_steps": planned_steps,  # every epoch: what the LR schedule spans
    }
