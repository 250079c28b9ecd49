"""Where a training step's time goes: one default training step broken down by module with torch.profiler,
the model's FLOPs per question and its FLOP utilisation (MFU) against this machine's fp32 matmul peak.

    PYTHONPATH=. python benchmarks/bench_train_step.py --data data/processed --out metrics/bench_train_step.json

It builds the run exactly as the train stage does (:func:`vlm.train.setup` with params.yaml's ``model`` and
``train`` sections, the packed data under ``--data``), then:

1. times ``--steps`` training steps (after ``--warmup``) with the training loop's own code (batch from the
   loader to the device, :func:`vlm.train.forward_backward`, the step's bookkeeping,
   :func:`vlm.train.optimizer_step`): questions/s and seconds per step, data included;
2. profiles ``--profile-steps`` more steps with ``torch.profiler``, each module of interest wrapped in a
   ``record_function`` range by forward hooks: milliseconds per step for the data, each module's forward,
   the rest of the forward (embedding, the heads' losses and peak counts, the cross-entropy), the backward
   pass and the optimizer, plus the operators with the most self time;
3. counts the FLOPs of one forward and backward pass (``torch.utils.flop_counter``; matmuls, convolutions
   and attention, as MFU counts them) per question, and measures the fp32 matmul peak (square matmuls,
   the best of several sizes) with the same threads: MFU = FLOPs per second achieved in step 1 / peak;
4. counts the ATen operators of a step, views excluded, by phase (``operators_per_step``): on a GPU each is a
   kernel launch, and a step of a model this small is bound by its launches, not its arithmetic.

With ``--compare TWEAK ...`` it measures changes to the run instead (:data:`TWEAKS`), each against the run
as ``vlm/train.py`` builds it: the median over interleaved rounds of the paired ratio baseline step time /
tweaked step time, the operators per step, and the largest per-step loss difference over ``--check-steps`` steps
from the same weights and batches:

    PYTHONPATH=. python benchmarks/bench_train_step.py --compare before_answer_only_and_fused \
        all_text_positions default_adamw compile_layers channels_last --out metrics/bench_train_tweaks.json

With ``--against PARAMS DATA`` the baseline is another design's run (its params file and packed data, e.g. the
previous defaults'), and the run of ``--params``/``--data`` joins the comparison as ``params``; each run's
whole training (its steps per epoch times its epochs) then gives the ratio of training times, step time times
steps (``training_time_ratio``), what "the new defaults train no longer than the old ones" is measured by:

    PYTHONPATH=. python benchmarks/bench_train_step.py --compare --against old/params.yaml old/data/processed \
        --check-steps 20

Without ``--compare``, ``--against`` adds that comparison to the breakdown's report (``against``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import platform
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from vlm.config import build_config
from vlm.data.loader import set_epoch
from vlm.device import autocast
from vlm.io import write_json
from vlm.optim import Optimizers, make_optimizer
from vlm.params import load_params, runtime_section, section
from vlm.scenes.generate import ScenesConfig
from vlm.train import (
    VLM_TRAIN_KEYS,
    Run,
    StepWindow,
    TrainConfig,
    TrainPaths,
    TrainRuntime,
    forward_backward,
    optimizer_step,
    record_pass,
    setup,
    weighted_loss,
)

OPERATOR_STEPS = 2  # steps whose operators are counted (the same count each step on the default run)

# (row, module path in the model): forward regions that do not nest; absent modules are skipped
REGIONS = [
    ("vision: conv stem", "extension.stem"),
    ("vision: patch embedding", "vision_tower.embeddings.patch_embedding"),
    ("vision: encoder layers", "vision_tower.encoder"),
    ("heads: stride-4 map", "extension.pyramid"),
    ("heads: centre head", "extension.heads.centres"),
    ("heads: counts head", "extension.heads.counts"),
    ("heads: grounding head", "extension.heads.grounding"),
    ("connector", "multi_modal_projector"),
    ("decoder layers", "language_model.model"),
    ("lm head", "language_model.lm_head"),
]


def build_run(params_path: str, data: Path, workdir: Path, runtime_overrides: dict[str, object]) -> Run:
    """The train stage's run of params.yaml (its ``runtime.train`` updated with ``runtime_overrides``)."""
    params = load_params(params_path)
    config = build_config(TrainConfig, section(params, "train"), "train", keys=VLM_TRAIN_KEYS)
    runtime = build_config(TrainRuntime, {**runtime_section(params, "train"), **runtime_overrides}, "runtime.train")
    frame = build_config(ScenesConfig, section(params, "scenes"), "scenes", keys=("width", "height"))
    paths = TrainPaths(data=data, model=workdir / "vlm.pt", checkpoints=workdir / "checkpoints",
                       metrics=workdir / "train.json", timing=workdir / "timing.json", live=workdir / "live")
    return setup(section(params, "model"), config, paths, frame_size=(frame.width, frame.height), runtime=runtime)


def replace_optimizer(run: Run, **options) -> None:
    """The run's AdamW (with ``optimizer: muon``, the one beside Muon) rebuilt with ``options`` (e.g. ``fused=True``)
    over the same groups and schedule."""
    muon = run.optimizer.optimizers[:-1] if isinstance(run.optimizer, Optimizers) else ()
    adamw = run.optimizer.optimizers[-1] if muon else run.optimizer
    groups = [{key: value for key, value in group.items() if key not in ("fused", "foreach")}
              for group in adamw.param_groups]
    defaults = {key: adamw.defaults[key] for key in ("lr", "betas", "eps")}
    adamw = torch.optim.AdamW(groups, **defaults, **options)
    run.optimizer = Optimizers(*muon, adamw) if muon else adamw
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, run.scheduler.lr_lambdas[0])


def rebuild_optimizer(run: Run, optimizer: str) -> None:
    """The run's optimizer built anew as ``train.optimizer: <optimizer>``, under the same schedule."""
    run.config = dataclasses.replace(run.config, optimizer=optimizer)
    run.optimizer = make_optimizer(run.model, run.config.optimizer, run.config.lr, run.config.weight_decay)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, run.scheduler.lr_lambdas[0])


class AllTextPositions(torch.nn.Module):
    """The model with the last decoder layer and the LM head over every text position (as before
    ``answer_only``), its logits then cut to the answer positions that the step's bookkeeping reads."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch, answer_only: bool = False):
        output = self.model(batch)
        start = batch.prefix_lengths[:, None] - 1  # [B, 1]: the position predicting the first answer token
        output.logits = output.logits.gather(1, start[..., None].expand(-1, -1, output.logits.shape[-1]))
        return output


class CpuBf16(torch.nn.Module):
    """The model's forward under bf16 autocast on the CPU (``vlm.device.autocast`` keeps the CPU in float32: slower in
    bf16 on a CPU without AMX, no faster on one with it; docs/experiments.md, "Lessons from probes")."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch, answer_only: bool = False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(batch, answer_only=answer_only)


def per_matrix_muon(muon: torch.optim.Optimizer) -> None:
    """``muon`` (a FlatMuon) stepping through ``torch.optim.Muon.step``: a loop over the matrices, each iterated in
    bf16 (FlatMuon: the same bits in bf16; on the CPU it iterates in float32)."""
    def step(closure=None):  # pylint: disable=unused-argument
        muon.point_views()
        torch.optim.Muon.step(muon)
    muon.step = step


# Changes to a training run that --compare measures against the run as vlm/train.py builds it (the
# baseline): each was either adopted in vlm/train.py (its opposite stays here to measure what it gave)
# or measured and not adopted (docs/experiments.md).
TWEAKS = {
    "foreach_adamw": lambda run: replace_optimizer(run, foreach=True),
    "default_adamw": replace_optimizer,  # PyTorch's default AdamW (per-parameter loop on CPU)
    "channels_last": lambda run: run.model.to(memory_format=torch.channels_last),
    "contiguous": lambda run: run.model.to(memory_format=torch.contiguous_format),
    "compile": lambda run: setattr(run, "ddp_model", torch.compile(run.model)),
    "compile_layers": lambda run: [layer.compile() for layer in (*run.model.language_model.model.layers,
                                                                  *run.model.vision_tower.encoder.layers)],
    "all_text_positions": lambda run: setattr(run, "ddp_model", AllTextPositions(run.model)),
    # one decoder row per image (vlm.models.packing); it changes the model (image tokens ignore the question)
    "pack_questions": lambda run: setattr(run.model.config, "pack_questions", True),
    # Muon on the layers' matrices only (undoes train.optimizer: muon_conv's Muon on the perception's filters)
    "muon": lambda run: rebuild_optimizer(run, "muon"),
    # AdamW on every parameter (train.optimizer: adamw), the optimizer of the first GPU run's code (92dabbb)
    "adamw": lambda run: rebuild_optimizer(run, "adamw"),
    # Muon's step as torch.optim.Muon takes it, a Newton-Schulz iteration per matrix (FlatMuon stacks each shape's)
    "per_matrix_muon": lambda run: per_matrix_muon(run.optimizer.optimizers[0]),
    # bf16 autocast on the CPU too (the CPU's matmuls in bf16: AMX where the CPU has it)
    "cpu_bf16": lambda run: setattr(run, "ddp_model", CpuBf16(run.model)),
    # the lights from the patches alone, without the grounding head's convolution of the fine map (before 24d5491)
    "patch_lights": lambda run: setattr(run.model.extension.heads["grounding"], "fine_lights", None),
    # both adopted changes undone: the training step as it was before them
    "before_answer_only_and_fused": lambda run: (TWEAKS["all_text_positions"](run), TWEAKS["default_adamw"](run)),
}


def batches(run: Run):
    """The training loader's batches, epoch after epoch."""
    epoch = 0
    while True:
        set_epoch(run.loader, epoch)
        yield from run.loader
        epoch += 1


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(run: Run, source, steps: int, losses: list[float] | None = None) -> dict[str, float]:
    """Seconds per step (median), data seconds per step (median) and questions/s over ``steps`` steps
    (each step's loss appended to ``losses``)."""
    window = StepWindow()
    totals, data_times, questions = [], [], 0
    for _ in range(steps):
        started = time.perf_counter()
        batch = next(source).to(run.device)
        fetched = time.perf_counter()
        output, loss = forward_backward(run, batch, sync_grads=True, passes=1)
        record_pass(run, window, output, loss, batch, where="the benchmark", state=None)
        optimizer_step(run)
        record = window.pop()
        if losses is not None:
            losses.append(record["train/loss"])
        synchronize(run.device)
        ended = time.perf_counter()
        totals.append(ended - started)
        data_times.append(fetched - started)
        questions += len(batch)
    return {"seconds_per_step": statistics.median(totals), "data_seconds_per_step": statistics.median(data_times),
            "questions_per_s": questions / sum(totals), "questions_per_step": questions / steps}


# Operators whose result a GPU run reads back to the host (a value, or the size of a data-dependent shape): each
# waits for the GPU to finish what is queued before it. Boolean-mask indexing reads the mask's count (nonzero).
READ_BACK = {"_local_scalar_dense", "nonzero", "masked_select", "bincount", "unique_dim", "_unique2",
             "unique_consecutive", "repeat_interleave", "equal"}


class OperatorCount(TorchDispatchMode):
    """The ATen operators dispatched under it, views excluded, counted per ``phase``: on a GPU, about the kernels
    that a step launches, each one a launch the CPU pays for, however little work it holds. ``reads`` counts, per
    phase, the device reads among them (:data:`READ_BACK`, boolean-mask indexing, ``Tensor.tolist``): an estimate,
    as a CPU run dispatches no copy to the host and CUDA reads inside a few kernels (e.g. a tensor fill value)."""

    def __init__(self):
        super().__init__()
        self.phase, self.counts, self.reads = "", collections.Counter(), collections.Counter()
        self.tolist = None

    def __enter__(self):
        if self.tolist is not None:
            raise RuntimeError("OperatorCount: already counting (one `with` at a time)")
        entered = super().__enter__()
        self.tolist = torch.Tensor.tolist  # a read on a GPU, dispatched as no operator

        def tolist(tensor):
            self.reads[self.phase] += 1
            return self.tolist(tensor)

        torch.Tensor.tolist = tolist
        return entered

    def __exit__(self, *args):
        torch.Tensor.tolist, self.tolist = self.tolist, None
        return super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # not the profiler's own operators; _unsafe_view: a view that its schema does not mark as one
        if func.namespace == "aten" and not func.is_view and func is not torch.ops.aten._unsafe_view.default:
            self.counts[self.phase] += 1
            name = func._opname  # pylint: disable=protected-access
            masks = args[1] if name in ("index", "index_put", "index_put_") else ()
            if name in READ_BACK or any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in masks):
                self.reads[self.phase] += 1
        return func(*args, **(kwargs or {}))


def count_operators(run: Run, source, steps: int) -> dict[str, float]:
    """Operators per training step (:class:`OperatorCount`) of the training loop's own code, by phase, as a GPU run
    dispatches them: under bf16 autocast (on the CPU its casts stand in for CUDA's), after a first step that makes
    the optimizer's state. One forward and backward pass per optimizer step; the batch is built and copied to the
    device before (a GPU run builds it in the loader's worker processes). Compiled code is not counted: Dynamo runs
    eagerly under a dispatch mode. ``device_reads``: how many of them (and ``tolist`` calls) read back from the
    device, whole step."""
    counter, window = OperatorCount(), StepWindow()
    for index in range(steps + 1):
        batch = next(source).to(run.device)
        with counter if index else nullcontext():
            counter.phase = "forward_backward"
            with torch.autocast(run.device.type, dtype=torch.bfloat16):
                output, loss = forward_backward(run, batch, sync_grads=True, passes=1)
            counter.phase = "bookkeeping"
            record_pass(run, window, output, loss, batch, where="the operator count", state=None)
            window.pop()
            counter.phase = "optimizer"
            optimizer_step(run)
    phases = ("forward_backward", "bookkeeping", "optimizer")
    per_step = {phase: counter.counts[phase] / steps for phase in phases}
    return {**per_step, "total": sum(per_step.values()),
            "device_reads": sum(counter.reads[phase] for phase in phases) / steps}


class RegionHooks:
    """A ``record_function`` range around each region's module forward."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        modules = dict(model.named_modules())
        self.regions = [(row, modules[path]) for row, path in REGIONS if path in modules]
        self.device = device
        self.handles, self.open = [], []
        for row, module in self.regions:
            self.handles.append(module.register_forward_pre_hook(self._enter(row)))
            self.handles.append(module.register_forward_hook(self._exit))

    def _enter(self, row: str):
        def hook(*_):
            synchronize(self.device)
            scope = torch.profiler.record_function(row)
            scope.__enter__()
            self.open.append(scope)
        return hook

    def _exit(self, *_):
        synchronize(self.device)
        self.open.pop().__exit__(None, None, None)

    @property
    def rows(self) -> list[str]:
        return [row for row, _ in self.regions]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def profile_steps(run: Run, source, steps: int, top: int) -> dict[str, object]:
    """Milliseconds per step of each phase and forward region, and the operators with the most self time."""
    hooks = RegionHooks(run.model, run.device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    questions = 0
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            with torch.profiler.record_function("data"):
                batch = next(source).to(run.device)
            questions += len(batch)
            with torch.profiler.record_function("forward"), autocast(run.device):
                output = run.model(batch, answer_only=True)
                synchronize(run.device)
            with torch.profiler.record_function("backward"):
                weighted_loss(output.losses, run.model.loss_weights).backward()
                synchronize(run.device)
            with torch.profiler.record_function("optimizer"):
                optimizer_step(run)
                synchronize(run.device)
    hooks.remove()
    averages = {event.key: event for event in prof.key_averages()}

    def ms(key: str) -> float:
        return averages[key].cpu_time_total / 1e3 / steps if key in averages else 0.0

    forward = {row: ms(row) for row in hooks.rows}
    backward = backward_by_region(prof.events(), set(hooks.rows))
    rest = "the rest (embedding, heads' losses and counts, cross-entropy)"
    forward[rest] = ms("forward") - sum(forward.values())
    backward = {row: backward.get(row, 0.0) / 1e3 / steps for row in forward}
    backward[rest] = ms("backward") - sum(backward[row] for row in hooks.rows)
    rows = [{"part": "data (loader, targets, to device)", "ms": ms("data")}]
    rows += [{"part": row, "forward_ms": forward[row], "backward_ms": backward[row], "ms": forward[row] + backward[row]}
             for row in forward]
    rows += [{"part": "optimizer (clip, step, schedule)", "ms": ms("optimizer")}]
    total = sum(row["ms"] for row in rows)
    for row in rows:
        row.update({key: round(value, 2) for key, value in row.items() if key.endswith("ms")},
                   share=round(row["ms"] / total, 4))
    labels = {"data", "forward", "backward", "optimizer", *hooks.rows}
    operators = sorted((e for e in prof.key_averages() if e.key not in labels and not e.key.startswith("ProfilerStep")),
                       key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "ms_per_step": round(total, 2),
        "questions_per_step": questions / steps,
        "rows": rows,
        "top_operators": [{"name": e.key, "self_ms_per_step": round(e.self_cpu_time_total / 1e3 / steps, 2),
                           "calls_per_step": e.count / steps} for e in operators],
    }


def backward_by_region(events, regions: set[str]) -> dict[str, float]:
    """Microseconds of backward per forward region: each autograd node's backward (``evaluate_function``)
    is charged to the region whose forward created it (the same sequence number)."""
    region_of = {}
    for event in events:
        if event.sequence_nr < 0 or event.name.startswith("autograd::engine"):
            continue
        parent = event.cpu_parent
        while parent is not None and parent.name not in regions:
            parent = parent.cpu_parent
        if parent is not None:
            region_of.setdefault(event.sequence_nr, parent.name)
    totals: dict[str, float] = {}
    for event in events:
        if event.name.startswith("autograd::engine::evaluate_function") and event.sequence_nr in region_of:
            region = region_of[event.sequence_nr]
            totals[region] = totals.get(region, 0.0) + event.cpu_time_total
    return totals


def compare(args, workdir: Path) -> dict[str, object]:
    """Each tweak against the baseline: paired ratios of step time over interleaved rounds (baseline time /
    tweak time, the median round counts), and the per-step losses of ``--check-steps`` steps from the same
    initial weights and batches against the baseline's."""
    names = ["baseline", *(["params"] if args.against else []), *args.compare]
    runs = {}
    for name in names:
        params, data = args.against if args.against and name == "baseline" else (args.params, args.data)
        run = build_run(params, Path(data), workdir / name, {})
        if name in TWEAKS:
            TWEAKS[name](run)
        run.model.train()
        runs[name] = (run, batches(run), [])
    for run, source, losses in runs.values():  # the same batches, the same initial weights
        time_steps(run, source, args.check_steps, losses)
    ratios = {name: [] for name in names}
    seconds = {name: [] for name in names}
    for _ in range(args.rounds):
        timed = {name: time_steps(run, source, args.round_steps)["seconds_per_step"]
                 for name, (run, source, _) in runs.items()}
        for name in names:
            ratios[name].append(timed["baseline"] / timed[name])
            seconds[name].append(timed[name])
    # the decoder's part of a step (its layers under torch.profiler, the packing's layout included in "the
    # rest"), per question: what one decoder row per image saves
    decoder, operators = {}, {}
    for name, (run, source, _) in runs.items():
        profile = profile_steps(run, source, args.profile_steps, top=0)
        rows = {row["part"]: row["ms"] for row in profile["rows"]}
        decoder[name] = rows["decoder layers"] / profile["questions_per_step"]
        # a compiled tweak's count would be its eager code's
        operators[name] = None if name.startswith("compile") else count_operators(run, source, OPERATOR_STEPS)
    reference = torch.tensor(runs["baseline"][2])
    steps = {name: run.config.epochs * len(run.loader) for name, (run, _, _) in runs.items()}  # whole training
    results = {}
    for name in names:
        gap = (torch.tensor(runs[name][2]) - reference).abs()
        results[name] = {"ms_per_step": round(statistics.median(seconds[name]) * 1e3, 2),
                         "speedup": round(statistics.median(ratios[name]), 3),
                         "decoder_ms_per_question": round(decoder[name], 3),
                         "decoder_speedup": round(decoder["baseline"] / decoder[name], 3),
                         "operators_per_step": operators[name],
                         "training_steps": steps[name],
                         # (step time x steps) / the baseline's: the whole training's time against the baseline's
                         "training_time_ratio": round(steps[name] / steps["baseline"]
                                                      / statistics.median(ratios[name]), 3),
                         "speedup_range": [round(min(ratios[name]), 3), round(max(ratios[name]), 3)],
                         "loss_max_abs_diff": float(gap.max()) if len(gap) else 0.0,
                         "loss_last_abs_diff": float(gap[-1]) if len(gap) else 0.0,
                         # the mean loss of the last quarter of the steps: what training reaches, not one batch
                         "loss_tail_mean_diff": tail_mean(runs[name][2]) - tail_mean(runs["baseline"][2])}
        print(f"{name:16} {results[name]['ms_per_step']:8.2f} ms/step  speed-up {results[name]['speedup']:.3f} "
              f"(decoder {results[name]['decoder_speedup']:.2f}x per question) "
              f"({results[name]['speedup_range'][0]:.2f}-{results[name]['speedup_range'][1]:.2f})  loss gap over "
              f"{args.check_steps} steps: max {results[name]['loss_max_abs_diff']:.2e}, "
              f"last {results[name]['loss_last_abs_diff']:.2e}, mean of the last quarter "
              f"{results[name]['loss_tail_mean_diff']:+.2e}")
    return {"rounds": args.rounds, "steps_per_round": args.round_steps, "check_steps": args.check_steps,
            "results": results}


def tail_mean(losses: list[float]) -> float:
    return statistics.fmean(losses[-max(1, len(losses) // 4):]) if losses else 0.0


def count_flops(run: Run, source) -> dict[str, float]:
    """FLOPs of one forward and backward pass, per question (FlopCounterMode: matmul, conv, attention).

    Attention runs as the math kernel here, its matmuls counted as such: FlopCounterMode has no formula for
    the CPU's fused kernel (it would count none of attention's FLOPs) nor for the fused CUDA kernels' grouped
    key/value heads (it stops)."""
    batch = next(source).to(run.device)
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH):
        with counter, autocast(run.device):
            output = run.model(batch, answer_only=True)
        forward = counter.get_total_flops()
        with counter:  # entering clears the counts: this counts the backward pass alone
            weighted_loss(output.losses, run.model.loss_weights).backward()
        backward = counter.get_total_flops()
    run.optimizer.zero_grad(set_to_none=True)
    return {"forward_flops_per_question": forward / len(batch),
            "train_flops_per_question": (forward + backward) / len(batch)}


def matmul_peak(device: torch.device, sizes=(256, 512, 1024, 2048), repeats: int = 5,
                dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """The best matmul FLOP/s over square sizes: the machine's practical peak at these threads."""
    best = {"flops_per_s": 0.0, "size": 0}
    for size in sizes:
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        torch.mm(a, b)  # warm up
        synchronize(device)
        for _ in range(repeats):
            started = time.perf_counter()
            torch.mm(a, b)
            synchronize(device)
            rate = 2 * size ** 3 / (time.perf_counter() - started)
            if rate > best["flops_per_s"]:
                best = {"flops_per_s": rate, "size": size}
    return best


def machine() -> dict[str, object]:
    return {"device": "cuda" if torch.cuda.is_available() else "cpu", "threads": torch.get_num_threads(),
            "torch": torch.__version__, "processor": platform.processor() or platform.machine()}


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data", type=Path, default=Path("data/processed"), help="the packed data (pack_hdf5)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=40, help="timed steps")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=15, help="operators listed by self time")
    parser.add_argument("--compare", nargs="*", choices=sorted(TWEAKS), default=None,
                        help="instead of the breakdown: these tweaks against the baseline, interleaved")
    parser.add_argument("--against", nargs=2, metavar=("PARAMS", "DATA"), default=None,
                        help="the baseline of --compare is the run of this params file and packed data, and the run of "
                             "--params and --data is compared with it as 'params' (the losses then differ by design); "
                             "without --compare the breakdown's report adds that comparison as 'against'")
    parser.add_argument("--rounds", type=int, default=10, help="--compare: interleaved rounds")
    parser.add_argument("--round-steps", type=int, default=5, help="--compare: steps of each run per round")
    parser.add_argument("--check-steps", type=int, default=200, help="--compare: steps whose losses are compared")
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    args = parser.parse_args(argv)
    if args.compare is not None:
        with tempfile.TemporaryDirectory() as workdir:
            report = {"machine": machine(), **({"against": args.against[0]} if args.against else {}),
                      **compare(args, Path(workdir))}
        if args.out:
            write_json(args.out, report)
        return report

    with tempfile.TemporaryDirectory() as workdir:
        run = build_run(args.params, args.data, Path(workdir), {})
        run.model.train()
        source = batches(run)
        time_steps(run, source, args.warmup)
        timing = time_steps(run, source, args.steps)
        profile = profile_steps(run, source, args.profile_steps, args.top)
        operators = count_operators(run, source, OPERATOR_STEPS)
        flops = count_flops(run, source)
    peak = matmul_peak(run.device)
    achieved = flops["train_flops_per_question"] * timing["questions_per_s"]
    report = {
        "machine": machine(),
        "batch_questions": timing["questions_per_step"],
        "questions_per_s": round(timing["questions_per_s"], 1),
        "ms_per_step": round(timing["seconds_per_step"] * 1e3, 2),
        "data_ms_per_step": round(timing["data_seconds_per_step"] * 1e3, 2),
        "profile": profile,
        "operators_per_step": operators,
        "forward_gflops_per_question": round(flops["forward_flops_per_question"] / 1e9, 4),
        "train_gflops_per_question": round(flops["train_flops_per_question"] / 1e9, 4),
        "achieved_gflops_per_s": round(achieved / 1e9, 2),
        "matmul_peak_gflops_per_s": round(peak["flops_per_s"] / 1e9, 1),
        "matmul_peak_size": peak["size"],
        "mfu": round(achieved / peak["flops_per_s"], 4),
    }
    if args.against:  # the run against another design's, interleaved (--compare --against's report)
        args.compare = []
        with tempfile.TemporaryDirectory() as workdir:
            report["against"] = {"params": args.against[0], **compare(args, Path(workdir))}
    print(f"{report['questions_per_s']} questions/s, {report['ms_per_step']} ms per step of "
          f"{report['batch_questions']:.0f} questions on {report['machine']['device']} "
          f"({report['machine']['threads']} threads), {operators['total']:.0f} operators per step")
    print(f"  {'part':64} {'forward':>9} {'backward':>9} {'total':>9}")
    for row in profile["rows"]:
        split = f"{row['forward_ms']:9.2f} {row['backward_ms']:9.2f}" if "forward_ms" in row else " " * 19
        print(f"  {row['part']:64} {split} {row['ms']:9.2f} ms {row['share']:6.1%}")
    print(f"{report['train_gflops_per_question']} GFLOP per question (forward + backward), "
          f"{report['achieved_gflops_per_s']} GFLOP/s achieved, fp32 matmul peak "
          f"{report['matmul_peak_gflops_per_s']} GFLOP/s: MFU {report['mfu']:.1%}")
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
