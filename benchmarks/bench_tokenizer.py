"""Throughput of TrafficCommandTokenizer.batch_encode on realistic commands, on one CPU core.

    PYTHONPATH=. python benchmarks/bench_tokenizer.py --out metrics/bench_tokenizer.json
    PYTHONPATH=. python benchmarks/bench_tokenizer.py --commands data/processed/commands/train.json

Measured in the same process, interleaved (a round calls each once), the best of ``--repeats`` rounds each:
- ``batch_encode``: the project's path (per-string cache, numpy padding), its cache warm (a
  pipeline encodes the same templates over and over) and cold (a fresh tokenizer per run);
- ``batch_encode_no_cache``: the same with the cache switched off, every command tokenized;
- ``textbook``: the per-command recipe (normalise, split, look up, pad Python lists, one
  ``torch.tensor``), the baseline the ratios are taken against;
- ``collate_batch_64``: one training batch of 64 commands, to judge whether pre-encoding the
  splits would speed training up.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

import torch

import vlm.tokenizer as tokenizer_module
from vlm.data.commands import read_commands
from vlm.io import write_json
from vlm.tokenizer import TrafficCommandTokenizer

OBJECTS = {
    "car": "cars", "truck": "trucks", "bus": "buses", "pedestrian": "pedestrians", "person": "people",
    "rider": "riders", "bicycle": "bicycles", "motorcycle": "motorcycles", "train": "trains",
    "traffic sign": "traffic signs", "traffic light": "traffic lights",
}
PHRASINGS = {
    "detection": ("Is there a {obj}?", "Are there any {objs}?", "Can you see a {obj}?",
                  "Is there a {obj} in the image?", "Do you see any {objs} in this scene?"),
    "counting": ("How many {objs} are there?", "How many {objs} can you see?", "Count the {objs}.",
                 "What is the number of {objs}?", "Are there more than {n} {objs}?",
                 "Are there fewer than {n} {objs} in the scene?"),
    "traffic_light": ("What color is the traffic light?", "What colour is the nearest traffic light?",
                      "Is the traffic light {colour}?", "Which color does the traffic light show?"),
    "spatial": ("Is there a {obj} on the {side} side?", "Is the {obj} to the {side} of the {other}?",
                "Is there a {obj} on the {side} of the road?", "Which side is the {obj} on?"),
    "safety": ("Can the car safely turn {side}?", "Is it safe to proceed?", "Should the car stop?",
               "Is it safe to change lanes to the {side}?", "Can the car go straight?"),
    "scene": ("Is it night?", "Is it daytime?", "Is this a highway?", "Is this a city street?",
              "Is it raining?", "Is the weather {weather}?", "Is this scene in a {scene}?"),
}


def realistic_commands(n: int, seed: int = 0) -> list[str]:
    """Commands from the question templates, with objects, counts, colours and sides filled in."""
    rng = random.Random(seed)
    commands = []
    for _ in range(n):
        obj = rng.choice(list(OBJECTS))
        template = rng.choice(PHRASINGS[rng.choice(list(PHRASINGS))])
        commands.append(template.format(
            obj=obj, objs=OBJECTS[obj], other=rng.choice(list(OBJECTS)), n=rng.randrange(1, 6),
            colour=rng.choice(("red", "yellow", "green")), side=rng.choice(("left", "right")),
            weather=rng.choice(("clear", "rainy", "snowy", "foggy", "overcast")),
            scene=rng.choice(("residential area", "parking lot", "tunnel", "gas station")),
        ))
    return commands


def textbook_batch_encode(tokenizer: TrafficCommandTokenizer, texts: list[str]) -> torch.Tensor:
    """The per-command recipe: normalise, split, look up each word, pad Python lists, one tensor."""
    vocab = tokenizer.vocab
    rows = []
    for text in texts:
        words = re.findall(r"[?.,!]|[^\s?.,!]+", unicodedata.normalize("NFKC", text).lower())
        ids = [tokenizer.sos_token_id]
        for word in words:
            if word in ("yes", "no", "maybe"):
                word = f"[{word.upper()}]"
            ids.append(vocab.get(word, tokenizer.unk_token_id))
        ids.append(tokenizer.eos_token_id)
        rows.append(ids)
    longest = max(len(ids) for ids in rows)
    return torch.tensor([ids + [tokenizer.pad_token_id] * (longest - len(ids)) for ids in rows])


def best_seconds(run, repeats: int) -> float:
    return interleaved_best_seconds({"run": run}, repeats)["run"]


def interleaved_best_seconds(runs: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Each run's best of ``repeats`` timings, taken in rounds of one call of each (the order reversed every other
    round), so that a slow spell of the machine hits every run alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for round_index in range(repeats):
        for name in list(runs)[::1 if round_index % 2 == 0 else -1]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    return {name: min(seconds) for name, seconds in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="commands per batch_encode call")
    parser.add_argument("--commands", type=Path, help="a commands JSON file to draw from (default: generated)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)

    if args.commands:
        pool = [record["command"] for record in read_commands(args.commands, ("command",))]
        texts = [pool[i % len(pool)] for i in range(args.n)]
    else:
        texts = realistic_commands(args.n)
    records = [{"command": text, "answer": "yes"} for text in texts]
    tokenizer = TrafficCommandTokenizer.build_vocab(records)

    ours = tokenizer.batch_encode(texts)
    reference = textbook_batch_encode(tokenizer, texts)
    width = min(ours["input_ids"].shape[1], reference.shape[1])
    assert torch.equal(ours["input_ids"][:, :width], reference[:, :width]), "textbook and batch_encode disagree"

    def without_cache() -> None:  # every command tokenized on every call
        cache_size = tokenizer_module.ENCODE_CACHE_SIZE
        tokenizer_module.ENCODE_CACHE_SIZE = 0
        try:
            TrafficCommandTokenizer(tokenizer.vocab).batch_encode(texts)
        finally:
            tokenizer_module.ENCODE_CACHE_SIZE = cache_size

    seconds = interleaved_best_seconds({
        "batch_encode": lambda: tokenizer.batch_encode(texts),
        "batch_encode_cold_cache": lambda: TrafficCommandTokenizer(tokenizer.vocab).batch_encode(texts),
        "textbook": lambda: textbook_batch_encode(tokenizer, texts),
        "batch_encode_no_cache": without_cache,
    }, args.repeats)
    batch_64 = texts[:64]
    collate_seconds = best_seconds(lambda: [tokenizer.batch_encode(batch_64) for _ in range(100)], args.repeats) / 100

    results = {
        "num_commands": args.n,
        "distinct_commands": len(set(texts)),
        "source": str(args.commands) if args.commands else "generated templates",
        "commands_per_s": {name: round(args.n / s) for name, s in seconds.items()},
        "speedup_vs_textbook": {name: round(seconds["textbook"] / s, 2) for name, s in seconds.items()},
        "collate_batch_64_us": round(collate_seconds * 1e6, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(f"{args.n:,} commands ({results['distinct_commands']:,} distinct, {results['source']}), one core:")
    for name, rate in results["commands_per_s"].items():
        print(f"  {name:<24} {rate:>12,} commands/s  {results['speedup_vs_textbook'][name]:>6.2f}x textbook")
    print(f"  one collate batch of 64: {results['collate_batch_64_us']} us")
    if args.out:
        write_json(args.out, results)
    return results


if __name__ == "__main__":
    main()
