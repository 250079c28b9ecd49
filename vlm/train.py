"""The training loop: AdamW, warmup + cosine, clipping, accumulation, checkpoints, resume, DDP.

Read it top to bottom in :func:`train`. One run writes:

- ``models/{name}.pt``: the best model on the val split (see :mod:`vlm.checkpoint`);
- ``models/checkpoints/{name}-last.pt``: everything needed to resume (model, optimizer, scheduler,
  position in the data, history), written every ``checkpoint_every`` optimizer steps and at the end
  of each epoch. A rerun with the same params and data resumes from it and ends with the same
  weights as an uninterrupted run (the data order and augmentation are functions of seed and epoch);
- ``metrics/train.json`` and per-step curves through dvclive (``dvclive/{name}/plots``).

Under ``torchrun`` (``WORLD_SIZE`` > 1) each process trains on its share of the images with
DistributedDataParallel (NCCL on GPUs, gloo on CPU); rank 0 evaluates and writes every file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from vlm import checkpoint
from vlm.commands.templates import COMMAND_TYPES
from vlm.data.augment import AugmentConfig
from vlm.data.dataset import TrafficVQADataset
from vlm.data.h5file import PackedImageReader
from vlm.data.loader import build_loader, set_epoch
from vlm.inference import predict_dataset, to_device
from vlm.io import write_json
from vlm.models import VLMConfig, build_vlm
from vlm.models.centres import STRIDE as CENTRE_STRIDE
from vlm.params import check
from vlm.tokenizer import TrafficCommandTokenizer

log = logging.getLogger(__name__)


@dataclass
class CurriculumConfig:
    """Optimizer steps on easy, globally visible questions before the full mix.

    Trained from scratch on the full mix, the decoder first learns each question's answer prior from
    the text alone; the image tokens then only add noise to that prior, and the vision tower learns
    to make them constant (measured: the spread of image features across images collapses and the
    vision gradients vanish). A few hundred steps on questions that a global look answers (night,
    rain, fog, highway) make the image tokens useful first, and the pathway stays open.
    """

    command_types: list[str] = field(default_factory=lambda: ["scene"])
    steps: int = 0  # 0: no curriculum

    def validate(self, prefix: str = "train.curriculum") -> None:
        check(self.steps >= 0, f"{prefix}.steps", f"must be >= 0, got {self.steps}")
        for t in self.command_types:
            check(t in COMMAND_TYPES, f"{prefix}.command_types", f"unknown type {t!r} (known: {', '.join(COMMAND_TYPES)})")
        check(bool(self.command_types) or not self.steps, f"{prefix}.command_types", "must not be empty")


@dataclass
class TrainConfig:
    seed: int = 0
    epochs: int = 8
    blind_epochs: int | None = None  # epochs of the blind baseline (train_blind); None = epochs
    batch_size: int = 64  # questions per forward pass (per process under DDP)
    grad_accum: int = 1  # forward passes per optimizer step
    lr: float = 1e-3
    min_lr_ratio: float = 0.05  # the cosine ends at lr * min_lr_ratio
    warmup_steps: int = 100  # optimizer steps of linear warmup
    weight_decay: float = 0.05
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    checkpoint_every: int = 200  # optimizer steps between resume checkpoints (and at each epoch end)
    early_stopping_patience: int = 0  # epochs without a better val accuracy before stopping; 0 = never
    eval_batch_size: int = 256
    num_workers: int = 0  # DataLoader workers; 0 loads in the training process
    in_memory: bool = True  # hold the packed splits in RAM
    threads: int = 0  # torch CPU threads per process; 0 = the cores shared among processes
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    def validate(self, prefix: str = "train") -> None:
        for name in ("epochs", "batch_size", "grad_accum", "checkpoint_every", "eval_batch_size"):
            check(getattr(self, name) >= 1, f"{prefix}.{name}", f"must be >= 1, got {getattr(self, name)}")
        check(self.blind_epochs is None or self.blind_epochs >= 1, f"{prefix}.blind_epochs",
              f"must be >= 1 or null (= epochs), got {self.blind_epochs}")
        check(self.lr > 0, f"{prefix}.lr", f"must be > 0, got {self.lr}")
        check(0 <= self.min_lr_ratio <= 1, f"{prefix}.min_lr_ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("warmup_steps", "weight_decay", "grad_clip", "early_stopping_patience", "num_workers", "threads"):
            check(getattr(self, name) >= 0, f"{prefix}.{name}", f"must be >= 0, got {getattr(self, name)}")
        self.augment.validate(f"{prefix}.augment")
        self.curriculum.validate(f"{prefix}.curriculum")


@dataclass
class TrainPaths:
    commands_dir: Path = Path("data/processed/commands")
    vocab: Path = Path("data/processed/vocab.json")
    images_dir: Path = Path("data/processed")  # {split}_images.h5
    model: Path = Path("models/vlm.pt")
    checkpoint_dir: Path = Path("models/checkpoints")
    metrics: Path = Path("metrics/train.json")
    live_dir: Path = Path("dvclive/vlm")

    def split(self, name: str) -> tuple[Path, Path]:
        return self.commands_dir / f"{name}.json", self.images_dir / f"{name}_images.h5"


class NonFiniteLossError(FloatingPointError):
    pass


@dataclass
class Phase:
    """A stretch of training over one loader: a number of epochs, or a number of optimizer steps."""

    name: str
    loader: Any
    epochs: int | None = None
    max_steps: int | None = None  # the phase ends when the global step count reaches this


# ----------------------------------------------------------------------------------------------------
# Small pieces


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls) -> Distributed:
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))


def pick_device(dist_info: Distributed) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", dist_info.local_rank)
    return torch.device("cpu")


def autocast(device: torch.device):
    """bf16 autocast on CUDA; float32 on the CPU (bf16 there is slower, measured)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine down to ``min_ratio`` at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases), as in nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))


def first_answer_accuracy(logits: torch.Tensor, labels: torch.Tensor, prefix_lengths: torch.Tensor) -> float:
    """Share of questions whose first answer token is the argmax (the answer itself for one-word answers)."""
    rows = torch.arange(len(labels), device=labels.device)
    predicted = logits[rows, prefix_lengths - 1].argmax(-1)  # the logits at [SEP] predict the answer
    return (predicted == labels[rows, prefix_lengths]).float().mean().item()


def fingerprint(model_config: VLMConfig, config: TrainConfig, paths: TrainPaths, world_size: int,
                frame_size: tuple[float, float] = (1280, 720)) -> str:
    """Identifies a run: a resume checkpoint is used only by a run with the same fingerprint."""
    files = [paths.vocab, *paths.split("train"), *paths.split("val")]
    payload = {"model": model_config.to_dict(), "train": asdict(config), "world_size": world_size,
               "frame_size": list(frame_size),
               "files": {str(p): checkpoint.file_sha256(p) for p in files}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


class CurveLogger:
    """Per-step curves through dvclive, rebuilt from the history on resume."""

    def __init__(self, live_dir: Path | None):
        self.live = None
        if live_dir is not None:
            from dvclive import Live

            self.live = Live(dir=str(live_dir), save_dvc_exp=False, dvcyaml=None)

    def log(self, record: dict[str, Any]) -> None:
        if self.live is None:
            return
        for key, value in record.items():
            if key not in ("step", "epoch"):
                self.live.log_metric(key, value, plot=True)
        self.live.next_step()

    def close(self) -> None:
        if self.live is not None:
            self.live.end()


# ----------------------------------------------------------------------------------------------------
# The loop


def train(model_params: dict, config: TrainConfig, paths: TrainPaths = TrainPaths(), *, blind: bool = False,
          progress: bool = True, frame_size: tuple[float, float] = (1280, 720)) -> dict[str, Any]:
    """Train a VLM (or, with ``blind``, the same decoder without an image) and return its metrics.

    ``frame_size``: width and height of the original frames, in which the label boxes behind the
    grounding targets are given (``model.grounding_weight`` > 0)."""
    if blind and config.blind_epochs is not None:
        config = replace(config, epochs=config.blind_epochs)
    dist_info = Distributed.from_env()
    name = paths.model.stem
    if dist_info.world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = pick_device(dist_info)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // dist_info.world_size))
    seed_everything(config.seed)

    # Everything that can be wrong with the inputs is checked before any weight is built.
    tokenizer = TrafficCommandTokenizer.from_file(paths.vocab)
    train_commands, train_h5 = paths.split("train")
    val_commands, val_h5 = paths.split("val")
    header = PackedImageReader(train_h5)
    model_params = {**model_params, "vision": "none"} if blind else model_params
    model_config = VLMConfig.from_params(model_params, tokenizer.vocab_size, header.image_size,
                                         header.mean.tolist(), header.std.tolist())
    resample = header.resample
    header.close()
    grounding_grid = None  # targets on the patch grid, or finer for the object-centre heatmaps
    if model_config.vision == "siglip" and model_config.grounding_weight > 0:
        grounding_grid = model_config.siglip.image_size // (
            CENTRE_STRIDE if model_config.object_centres else model_config.siglip.patch_size)
    train_set = TrafficVQADataset(train_commands, train_h5, tokenizer, augment=config.augment,
                                  in_memory=config.in_memory, seed=config.seed, grounding_grid=grounding_grid,
                                  frame_size=frame_size)
    val_set = TrafficVQADataset(val_commands, val_h5, tokenizer, in_memory=config.in_memory)
    answers = sorted({r["answer"] for r in train_set.records})
    candidates = [tokenizer.encode_answer(a) for a in answers]
    loader = build_loader(train_set, config.batch_size, shuffle=True, num_workers=config.num_workers,
                          seed=config.seed, rank=dist_info.rank, world_size=dist_info.world_size)
    phases = [Phase("train", loader, epochs=config.epochs)]
    if config.curriculum.steps and not blind:
        easy_set = TrafficVQADataset(train_commands, train_h5, tokenizer, augment=config.augment,
                                     in_memory=config.in_memory, seed=config.seed,
                                     command_types=config.curriculum.command_types,
                                     grounding_grid=grounding_grid, frame_size=frame_size)
        easy_loader = build_loader(easy_set, config.batch_size, shuffle=True, num_workers=config.num_workers,
                                   seed=config.seed, rank=dist_info.rank, world_size=dist_info.world_size)
        phases.insert(0, Phase("curriculum", easy_loader, max_steps=config.curriculum.steps))
    total_steps = sum(p.max_steps or 0 for p in phases)
    for epoch in range(config.epochs):  # an image's questions share a batch: batch counts vary by epoch
        set_epoch(loader, epoch)
        total_steps += math.ceil(len(loader) / config.grad_accum)

    model = build_vlm(model_config).to(device)
    optimizer = make_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, config.warmup_steps, total_steps, config.min_lr_ratio))
    run_id = fingerprint(model_config, config, paths, dist_info.world_size, frame_size)
    vocab_payload = json.loads(paths.vocab.read_text(encoding="utf-8"))
    vocab_sha = checkpoint.file_sha256(paths.vocab)

    # Resume from the last checkpoint of the same run, if any.
    state = {"phase": 0, "epoch": 0, "batch": 0, "step": 0, "best_accuracy": -1.0, "best": None, "bad_epochs": 0,
             "history": [], "seconds": 0.0, "samples": 0, "stopped_early": False}
    last_path = paths.checkpoint_dir / f"{name}-last.pt"
    if last_path.is_file():
        saved = checkpoint.read(last_path, "resume checkpoint")
        if saved.get("fingerprint") == run_id:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            torch.set_rng_state(saved["torch_rng"])
            state = saved["state"]
            log.info("resuming %s from %s: %s epoch %d, batch %d, step %d", name, last_path,
                     phases[min(state["phase"], len(phases) - 1)].name, state["epoch"] + 1, state["batch"],
                     state["step"])
        else:
            log.info("ignoring %s: it belongs to a run with other params or data", last_path)

    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if dist_info.world_size > 1 else model
    curves = CurveLogger(paths.live_dir if dist_info.is_main else None)
    for record in state["history"]:
        curves.log(record)

    def best_payload(epoch: int, val_accuracy: float) -> dict[str, Any]:
        return {"format_version": checkpoint.FORMAT_VERSION, "config": model_config.to_dict(),
                "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                "vocab": vocab_payload, "vocab_sha256": vocab_sha, "answers": answers,
                "image_size": model_config.siglip.image_size, "resample": resample,
                "metrics": {"epoch": epoch, "step": state["step"], "val_accuracy": val_accuracy},
                "blind": blind}

    def save_last() -> None:
        if dist_info.is_main:
            checkpoint.save(last_path, {"fingerprint": run_id, "model": model.state_dict(),
                                        "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                        "torch_rng": torch.get_rng_state(), "state": state})

    model.train()
    while state["phase"] < len(phases) and not state["stopped_early"]:
        phase = phases[state["phase"]]
        epoch = state["epoch"]
        set_epoch(phase.loader, epoch)
        label = f"{name} {phase.name}" + (f" epoch {epoch + 1}/{config.epochs}" if phase.epochs else "")
        bar = tqdm(total=len(phase.loader), initial=state["batch"], desc=label, unit="batch",
                   disable=not (progress and dist_info.is_main), leave=False)
        started = time.perf_counter()
        window_loss, window_acc, window_grounding, window_n = 0.0, 0.0, 0.0, 0
        for index, batch in enumerate(phase.loader):
            if index < state["batch"]:  # already trained before the interruption
                continue
            tensors = to_device(batch, device)
            last_batch = index + 1 == len(phase.loader)
            boundary = (index + 1) % config.grad_accum == 0 or last_batch
            sync = nullcontext() if boundary or dist_info.world_size == 1 else ddp_model.no_sync()
            with sync, autocast(device):
                output = ddp_model(tensors["images"], tensors["image_index"], tensors["input_ids"],
                                   tensors["attention_mask"], tensors["prefix_lengths"], labels=tensors["labels"],
                                   grounding=tensors.get("grounding"))
            loss = output.loss
            if not torch.isfinite(loss):
                raise NonFiniteLossError(
                    f"{name}: loss is {loss.item()} at {phase.name} epoch {epoch + 1}, batch {index + 1} "
                    f"(step {state['step']}); stopped. The last good checkpoint is kept at {last_path} and the "
                    f"best model at {paths.model}; lower train.lr or raise train.warmup_steps")
            (loss / config.grad_accum).backward()
            window_loss += loss.item()
            if output.grounding_loss is not None:
                window_grounding += output.grounding_loss.item()
            window_acc += first_answer_accuracy(output.logits.detach(), tensors["labels"], tensors["prefix_lengths"])
            window_n += 1
            state["samples"] += len(batch["answer"]) * dist_info.world_size
            if not boundary:
                continue
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["batch"] = index + 1
            record = {"step": state["step"], "epoch": epoch + 1 if phase.epochs else 0,
                      "train/loss": window_loss / window_n, "train/accuracy": window_acc / window_n,
                      "lr": scheduler.get_last_lr()[0]}
            if grounding_grid is not None:
                record["train/grounding_loss"] = window_grounding / window_n
            window_loss, window_acc, window_grounding, window_n = 0.0, 0.0, 0.0, 0
            bar.update(index + 1 - bar.n)
            bar.set_postfix(loss=f"{record['train/loss']:.3f}", acc=f"{record['train/accuracy']:.2f}")
            phase_over = phase.max_steps is not None and state["step"] >= phase.max_steps
            if phase.epochs and last_batch:  # an epoch of the full mix ends: evaluate on val
                state["seconds"] += time.perf_counter() - started
                record["val/accuracy"] = _val_accuracy(model, val_set, candidates, answers, config, device, dist_info)
                _end_of_epoch(state, record, config, paths, best_payload, dist_info)
                started = time.perf_counter()
            state["history"].append(record)
            curves.log(record)
            if last_batch or phase_over:
                state["epoch"], state["batch"] = epoch + 1, 0
                if phase_over or (phase.epochs and state["epoch"] == phase.epochs):
                    state["phase"], state["epoch"] = state["phase"] + 1, 0
                save_last()
                break
            if state["step"] % config.checkpoint_every == 0:
                save_last()
        if not phase.epochs:  # (main epochs count their time before evaluating)
            state["seconds"] += time.perf_counter() - started
        bar.close()

    if dist_info.is_main:
        if not paths.model.exists():  # a finished run resumed after models/ was cleaned (dvc repro)
            checkpoint.save(paths.model, state["best"])
        metrics = _metrics(state, model, total_steps)
        write_json(paths.metrics, metrics)
    else:
        metrics = {}
    curves.close()
    if dist_info.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return metrics


def _val_accuracy(model, val_set, candidates, answers, config, device, dist_info: Distributed) -> float:
    """Exact-match accuracy on val (rank 0 computes, every rank receives it)."""
    accuracy = torch.zeros(1, device=device)
    if dist_info.is_main:
        model.eval()
        with autocast(device):
            predicted, _ = predict_dataset(model, val_set, candidates, config.eval_batch_size, device)
        model.train()
        truth = [r["answer"] for r in val_set.records]
        accuracy[0] = float(np.mean([answers[p] == t for p, t in zip(predicted, truth)]))
    if dist_info.world_size > 1:
        dist.broadcast(accuracy, src=0)
    return float(accuracy.item())


def _end_of_epoch(state, record, config: TrainConfig, paths: TrainPaths, best_payload, dist_info) -> None:
    accuracy = record["val/accuracy"]
    if accuracy > state["best_accuracy"]:
        state["best_accuracy"] = accuracy
        state["bad_epochs"] = 0
        state["best"] = best_payload(record["epoch"], accuracy)
        if dist_info.is_main:
            checkpoint.save(paths.model, state["best"])
    else:
        state["bad_epochs"] += 1
        if config.early_stopping_patience and state["bad_epochs"] >= config.early_stopping_patience:
            state["stopped_early"] = True
            log.info("early stopping after epoch %d: no better val accuracy for %d epochs", record["epoch"],
                     state["bad_epochs"])


def _metrics(state, model: torch.nn.Module, planned_steps: int) -> dict[str, Any]:
    evals = [r for r in state["history"] if "val/accuracy" in r]
    last_epoch = [r for r in state["history"] if r["epoch"] == state["history"][-1]["epoch"]]
    return {
        "epochs": evals[-1]["epoch"] if evals else 0,
        "steps": state["step"],
        "best_epoch": state["best"]["metrics"]["epoch"] if state["best"] else None,
        "val_accuracy": round(state["best_accuracy"], 4),
        "train_loss": round(float(np.mean([r["train/loss"] for r in last_epoch])), 4),
        "train_accuracy": round(float(np.mean([r["train/accuracy"] for r in last_epoch])), 4),
        "stopped_early": state["stopped_early"],
        "parameters": sum(p.numel() for p in model.parameters()),
        "planned_steps": planned_steps,  # curriculum + every epoch: what the LR schedule spans
        "seconds": round(state["seconds"], 1),
        "questions_per_s": round(state["samples"] / max(state["seconds"], 1e-9), 1),
    }
