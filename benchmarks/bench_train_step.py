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
   the best of several sizes) with the same threads: MFU = FLOPs per second achieved in step 1 / peak.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from vlm.data.loader import set_epoch
from vlm.io import write_json
from vlm.params import build_config, load_params, section
from vlm.scenes.generate import ScenesConfig
from vlm.train import Run, StepWindow, TrainConfig, TrainPaths, autocast, forward_backward, optimizer_step, setup

# (row, module path in TrafficVLM): forward regions that do not nest; absent modules are skipped
REGIONS = [
    ("vision: conv stem", "vision_tower.embeddings.conv_stem"),
    ("vision: patch embedding", "vision_tower.embeddings.patch_embedding"),
    ("vision: encoder layers", "vision_tower.encoder"),
    ("heads: centre head", "heads.centres"),
    ("heads: grounding head", "heads.grounding"),
    ("connector", "multi_modal_projector"),
    ("decoder layers", "language_model.model"),
    ("lm head", "language_model.lm_head"),
]


def build_run(params_path: str, data: Path, workdir: Path, overrides: dict[str, object]) -> Run:
    params = load_params(params_path)
    config = build_config(TrainConfig, {**section(params, "train"), **overrides}, "train")
    scenes = section(params, "scenes")
    frame = build_config(ScenesConfig, {key: scenes[key] for key in ("width", "height") if key in scenes}, "scenes")
    paths = TrainPaths(data=data, model=workdir / "vlm.pt", checkpoints=workdir / "checkpoints",
                       metrics=workdir / "train.json", timing=workdir / "timing.json", live=workdir / "live")
    return setup(section(params, "model"), config, paths, blind=False, frame_size=(frame.width, frame.height))


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


def time_steps(run: Run, source, steps: int) -> dict[str, float]:
    """Seconds per step (median), data seconds per step (median) and questions/s over ``steps`` steps."""
    window = StepWindow()
    totals, data_times, questions = [], [], 0
    for _ in range(steps):
        started = time.perf_counter()
        batch = next(source).to(run.device)
        fetched = time.perf_counter()
        output = forward_backward(run, batch, sync_grads=True, where="the benchmark")
        window.add(output, batch)
        optimizer_step(run)
        window.pop()
        synchronize(run.device)
        ended = time.perf_counter()
        totals.append(ended - started)
        data_times.append(fetched - started)
        questions += len(batch)
    return {"seconds_per_step": statistics.median(totals), "data_seconds_per_step": statistics.median(data_times),
            "questions_per_s": questions / sum(totals), "questions_per_step": questions / steps}


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
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            with torch.profiler.record_function("data"):
                batch = next(source).to(run.device)
            with torch.profiler.record_function("forward"), autocast(run.device):
                output = run.model(batch)
                synchronize(run.device)
            with torch.profiler.record_function("backward"):
                output.loss.backward()
                synchronize(run.device)
            with torch.profiler.record_function("optimizer"):
                optimizer_step(run)
                synchronize(run.device)
    hooks.remove()
    averages = {event.key: event for event in prof.key_averages()}

    def ms(key: str) -> float:
        return averages[key].cpu_time_total / 1e3 / steps if key in averages else 0.0

    regions = {row: ms(row) for row in hooks.rows}
    rest = ms("forward") - sum(regions.values())
    breakdown = {"data (loader, targets, to device)": ms("data"), **regions,
                 "forward: the rest (embedding, heads' losses and counts, cross-entropy)": rest,
                 "backward": ms("backward"), "optimizer (clip, AdamW, schedule)": ms("optimizer")}
    total = sum(breakdown.values())
    labels = {"data", "forward", "backward", "optimizer", *hooks.rows}
    operators = sorted((e for e in prof.key_averages() if e.key not in labels and not e.key.startswith("ProfilerStep")),
                       key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "ms_per_step": {row: round(value, 2) for row, value in breakdown.items()},
        "share": {row: round(value / total, 4) for row, value in breakdown.items()},
        "top_operators": [{"name": e.key, "self_ms_per_step": round(e.self_cpu_time_total / 1e3 / steps, 2),
                           "calls_per_step": e.count / steps} for e in operators],
    }


def count_flops(run: Run, source) -> dict[str, float]:
    """FLOPs of one forward and backward pass, per question (FlopCounterMode: matmul, conv, attention)."""
    batch = next(source).to(run.device)
    counter = FlopCounterMode(display=False)
    with counter, autocast(run.device):
        output = run.model(batch)
    forward = counter.get_total_flops()
    with counter:  # counts on: the totals now include the backward pass
        output.loss.backward()
    run.optimizer.zero_grad(set_to_none=True)
    total = counter.get_total_flops()
    return {"forward_flops_per_question": forward / len(batch), "train_flops_per_question": total / len(batch)}


def matmul_peak(device: torch.device, sizes=(256, 512, 1024, 2048), repeats: int = 5) -> dict[str, float]:
    """The best fp32 matmul FLOP/s over square sizes: the machine's practical peak at these threads."""
    best = {"flops_per_s": 0.0, "size": 0}
    for size in sizes:
        a = torch.randn(size, size, device=device)
        b = torch.randn(size, size, device=device)
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


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data", type=Path, default=Path("data/processed"), help="the packed data (pack_hdf5)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=40, help="timed steps")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=15, help="operators listed by self time")
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as workdir:
        run = build_run(args.params, args.data, Path(workdir), {})
        run.model.train()
        source = batches(run)
        time_steps(run, source, args.warmup)
        timing = time_steps(run, source, args.steps)
        profile = profile_steps(run, source, args.profile_steps, args.top)
        flops = count_flops(run, source)
        run.curves.close()
    peak = matmul_peak(run.device)
    achieved = flops["train_flops_per_question"] * timing["questions_per_s"]
    report = {
        "machine": {"device": str(run.device), "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "processor": platform.processor() or platform.machine()},
        "batch_questions": timing["questions_per_step"],
        "questions_per_s": round(timing["questions_per_s"], 1),
        "ms_per_step": round(timing["seconds_per_step"] * 1e3, 2),
        "data_ms_per_step": round(timing["data_seconds_per_step"] * 1e3, 2),
        "profile": profile,
        "forward_gflops_per_question": round(flops["forward_flops_per_question"] / 1e9, 4),
        "train_gflops_per_question": round(flops["train_flops_per_question"] / 1e9, 4),
        "achieved_gflops_per_s": round(achieved / 1e9, 2),
        "matmul_peak_gflops_per_s": round(peak["flops_per_s"] / 1e9, 1),
        "matmul_peak_size": peak["size"],
        "mfu": round(achieved / peak["flops_per_s"], 4),
    }
    print(f"{report['questions_per_s']} questions/s, {report['ms_per_step']} ms per step of "
          f"{report['batch_questions']:.0f} questions on {report['machine']['device']} "
          f"({report['machine']['threads']} threads)")
    for row, value in profile["ms_per_step"].items():
        print(f"  {row:72} {value:8.2f} ms  {profile['share'][row]:6.1%}")
    print(f"{report['train_gflops_per_question']} GFLOP per question (forward + backward), "
          f"{report['achieved_gflops_per_s']} GFLOP/s achieved, fp32 matmul peak "
          f"{report['matmul_peak_gflops_per_s']} GFLOP/s: MFU {report['mfu']:.1%}")
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
