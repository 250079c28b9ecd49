"""Training under load: the train stage twice on the same data and params, once alone and once beside busy
processes (one per core by default), and whether the two model files are the same bytes.

    PYTHONPATH=. .venv/bin/python benchmarks/under_load.py --data data/processed --epochs 1 --out /tmp/under_load.json

Same params, same machine, same bytes, also when the machine is busy: a kernel whose result depends on how its
threads are scheduled would make the busy run's weights drift (docs/experiments.md, "Run-to-run spread"). Each run
is ``python -m stages.train`` in a folder of its own, with params.yaml's values and ``train.epochs`` set; the busy
processes spin in Python until the loaded run ends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from vlm.io import write_json

ROOT = Path(__file__).resolve().parents[1]


def train(params: Path, data: Path, out: Path) -> float:
    """The train stage into ``out``; its wall seconds."""
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "stages.train", "--params", str(params), "--data", str(data),
                             "--model", str(out / "vlm.pt"), "--checkpoints", str(out / "checkpoints"),
                             "--metrics", str(out / "train.json"), "--timing", str(out / "timing.json"),
                             "--live", str(out / "live")],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:  # the stage's own message (its last lines), not only its exit status
        raise SystemExit(f"the train stage ({out.name}) exited {result.returncode}:\n"
                         + "\n".join(result.stderr.strip().splitlines()[-5:]))
    return time.perf_counter() - started


def code_version() -> str | None:
    """The checkout's commit, ``-dirty`` with uncommitted changes (``git describe``); None outside a git checkout."""
    try:
        result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                                check=False)
    except OSError:  # no git
        return None
    return result.stdout.strip() or None


def compare(a: Path, b: Path) -> dict[str, object]:
    """Whether two model files are the same bytes, and by how much their weights differ if not."""
    if a.read_bytes() == b.read_bytes():
        return {"identical": True, "differing_tensors": 0, "max_abs_diff": 0.0}
    first, second = (torch.load(path, weights_only=True)["state_dict"] for path in (a, b))
    diffs = [(first[k].float() - second[k].float()).abs().max().item() for k in first
             if not torch.equal(first[k], second[k])]
    return {"identical": False, "differing_tensors": len(diffs), "max_abs_diff": max(diffs, default=0.0)}


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "processed", help="the packed data")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--busy", type=int, default=len(os.sched_getaffinity(0)),
                        help="busy processes beside the loaded run (default: one per core)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report")
    args = parser.parse_args(argv)
    commit = code_version()
    params = yaml.safe_load(args.params.read_text())
    params["train"]["epochs"] = args.epochs
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        idle = train(work / "params.yaml", args.data.resolve(), work / "idle")
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            loaded = train(work / "params.yaml", args.data.resolve(), work / "loaded")
        finally:
            for process in busy:
                process.kill()
                process.wait()
        report = {"commit": commit, "epochs": args.epochs, "busy_processes": args.busy, "idle_seconds": round(idle, 1),
                  "loaded_seconds": round(loaded, 1), **compare(work / "idle" / "vlm.pt", work / "loaded" / "vlm.pt")}
    if args.out:
        write_json(args.out, report)
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
