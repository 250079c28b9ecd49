"""Turning labelled scenes into balanced question/answer records, split by image.

Balancing follows CLEVR: questions are picked so that, within every question key (template plus
parameters) and within every command type, no answer dominates. Picking is greedy (each slot of an
image goes to the command type asked least so far, and within it to the candidate whose answer is
furthest behind in its key and type), then a rejection pass
drops questions until no answer is more than ``balance_tolerance`` times the next most common one, in
every key and every type. Keys whose answer never varies (``Is there a train?`` on data without
trains) are dropped entirely: a text-only model must not be able to answer from the question.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from vlm.commands.templates import COMMAND_TYPES, PLURALS, TEMPLATES, Candidate, TemplateOptions, candidates
from vlm.data.commands import SPLITS
from vlm.params import ParamError
from vlm.scenes.schema import CATEGORIES, Scene


@dataclass
class CommandsConfig:
    seed: int = 0
    questions_per_image: int = 8
    splits: dict = field(default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1})
    balance_tolerance: float = 1.1
    command_types: list[str] = field(default_factory=lambda: list(COMMAND_TYPES))
    detection_categories: list[str] = field(default_factory=lambda: list(CATEGORIES))
    counting_categories: list[str] = field(default_factory=lambda: ["car", "pedestrian"])
    spatial_categories: list[str] = field(default_factory=lambda: ["car", "pedestrian", "truck", "bus"])
    more_than: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    max_count: int = 9
    # A held-out combination (CLEVR-CoGenT style), e.g. {timeofday: night, weather: rainy}: the frames with
    # every one of these attributes form the test split and no other split; train and val share the rest in
    # the proportion of their fractions. Empty = off (a random test split).
    holdout: dict = field(default_factory=dict)

    def validate(self, prefix: str = "commands") -> None:
        if self.questions_per_image < 1:
            raise ParamError(f"{prefix}.questions_per_image: must be at least 1, got {self.questions_per_image}")
        if set(self.splits) != set(SPLITS):
            raise ParamError(f"{prefix}.splits: must name exactly {', '.join(SPLITS)}, got {', '.join(self.splits)}")
        for name, frac in self.splits.items():
            if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac < 1:
                raise ParamError(f"{prefix}.splits.{name}: must be a fraction in (0, 1), got {frac!r}")
        if not math.isclose(sum(self.splits.values()), 1.0, abs_tol=1e-6):
            raise ParamError(f"{prefix}.splits: fractions must sum to 1, got {sum(self.splits.values()):g}")
        if self.balance_tolerance < 1.0:
            raise ParamError(f"{prefix}.balance_tolerance: must be >= 1.0, got {self.balance_tolerance}")
        for t in self.command_types:
            if t not in COMMAND_TYPES:
                raise ParamError(f"{prefix}.command_types: unknown type {t!r} (known: {', '.join(COMMAND_TYPES)})")
        for key in ("detection_categories", "counting_categories", "spatial_categories"):
            for c in getattr(self, key):
                if c not in PLURALS:
                    raise ParamError(f"{prefix}.{key}: unknown category {c!r} (known: {', '.join(CATEGORIES)})")
        if not 0 <= self.max_count <= 9:
            raise ParamError(f"{prefix}.max_count: must be in 0..9 (answers are single digits), got {self.max_count}")
        for k in self.more_than:
            if k < 0:
                raise ParamError(f"{prefix}.more_than: thresholds must be >= 0, got {k}")
        for attribute, value in self.holdout.items():
            if attribute not in HOLDOUT_ATTRIBUTES:
                raise ParamError(f"{prefix}.holdout: unknown frame attribute {attribute!r} "
                                 f"(one of {', '.join(HOLDOUT_ATTRIBUTES)})")
            if not isinstance(value, str) or not value:
                raise ParamError(f"{prefix}.holdout.{attribute}: must be a value such as "
                                 f"{HOLDOUT_ATTRIBUTES[attribute]!r}, got {value!r}")

    @property
    def template_options(self) -> TemplateOptions:
        return TemplateOptions(tuple(self.detection_categories), tuple(self.counting_categories),
                               tuple(self.spatial_categories), tuple(self.more_than), self.max_count)


HOLDOUT_ATTRIBUTES = {"timeofday": "night", "weather": "rainy", "scene": "highway"}  # with an example value


def held_out(scene: Scene, holdout: dict) -> bool:
    return all(getattr(scene, attribute) == value for attribute, value in holdout.items())


def split_images(image_ids: list[str], fractions: dict, seed: int) -> dict[str, list[str]]:
    """Assign every image to exactly one split: a seeded permutation of the sorted ids, cut by fraction in the
    order of ``fractions``; the last split takes what the rounding leaves."""
    ids = sorted(image_ids)
    order = np.random.default_rng([seed, 1]).permutation(len(ids))
    splits, start = {}, 0
    for k, (split, fraction) in enumerate(fractions.items()):
        end = len(ids) if k == len(fractions) - 1 else start + round(fraction * len(ids))
        splits[split] = sorted(ids[i] for i in order[start:end])
        start = end
    return splits


def _deficit(counts: Counter, answer: str) -> int:
    """How far ``answer`` is behind the most common answer of ``counts``."""
    return max(counts.values(), default=0) - counts[answer]


def _pick(scene_candidates: list[Candidate], n: int, key_counts, type_counts, types: tuple[str, ...],
          rng: np.random.Generator) -> list[Candidate]:
    """Greedy, balance-seeking choice of ``n`` distinct questions for one image."""
    by_type: dict[str, list[Candidate]] = defaultdict(list)
    for c in scene_candidates:
        by_type[c.command_type].append(c)
    chosen: list[Candidate] = []
    order = [str(t) for t in rng.permutation(types) if by_type[str(t)]]  # tie-break between types
    while len(chosen) < n and order:
        # The slot goes to the type asked least so far: types that only some images can answer (traffic
        # lights) get more of those images' slots, so every type ends up with about as many questions.
        t = min(order, key=lambda name: sum(type_counts[name].values()))
        pool, type_count = by_type[t], type_counts[t]
        scores = [(_deficit(key_counts[c.key], c.answer), _deficit(type_count, c.answer)) for c in pool]
        best = max(scores)
        ties = [i for i, s in enumerate(scores) if s == best]
        c = pool.pop(ties[int(rng.integers(len(ties)))])
        chosen.append(c)
        key_counts[c.key][c.answer] += 1
        type_counts[t][c.answer] += 1
        if not pool:
            order.remove(t)
    return chosen


def _trim(records: list[dict], group_of, tolerance: float, rng: np.random.Generator) -> list[dict]:
    """Drop records until, in every group, the top answer is at most ``tolerance`` x the runner-up."""
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, r in enumerate(records):
        groups[group_of(r)][r["answer"]].append(i)
    drop: set[int] = set()
    for answers in groups.values():
        ranked = sorted(answers.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        second = len(ranked[1][1]) if len(ranked) > 1 else 0
        top_answer, top = ranked[0]
        cap = math.floor(tolerance * second + 1e-9)
        if len(top) > cap:
            drop.update(rng.choice(top, size=len(top) - cap, replace=False).tolist())
    return [r for i, r in enumerate(records) if i not in drop]


def generate_split(scenes: list[Scene], width: float, height: float, config: CommandsConfig,
                   split: str) -> list[dict]:
    """Balanced question records for the scenes of one split."""
    rng = np.random.default_rng([config.seed, SPLITS.index(split), 2])
    types = tuple(t for t in COMMAND_TYPES if t in config.command_types)
    options = config.template_options
    key_counts: dict[str, Counter] = defaultdict(Counter)
    type_counts: dict[str, Counter] = defaultdict(Counter)
    records = []
    for i in rng.permutation(len(scenes)):
        scene = scenes[i]
        pool = candidates(scene, width, height, options, types)
        for slot, c in enumerate(_pick(pool, config.questions_per_image, key_counts, type_counts, types, rng)):
            records.append({
                "question_id": f"{scene.image_id}_{slot}",
                "image_id": scene.image_id,
                "command": c.text(int(rng.integers(len(TEMPLATES[c.template].phrasings)))),
                "answer": c.answer,
                "command_type": c.command_type,
                "template": c.template,
                "key": c.key,
                "metadata": {"scene_type": scene.scene, "weather": scene.weather, "timeofday": scene.timeofday,
                             "num_objects": len(scene.objects)},
            })
    while True:  # trimming a type can unbalance a key and vice versa: repeat until both hold
        before = len(records)
        records = _trim(records, lambda r: r["key"], config.balance_tolerance, rng)
        records = _trim(records, lambda r: r["command_type"], config.balance_tolerance, rng)
        if len(records) == before:
            break
    for r in records:
        del r["key"]
    return sorted(records, key=lambda r: (r["image_id"], int(r["question_id"].rsplit("_", 1)[1])))


def generate_commands(scenes: list[Scene], width: float, height: float, config: CommandsConfig
                      ) -> dict[str, list[dict]]:
    by_id = {s.image_id: s for s in scenes}
    if len(by_id) != len(scenes):
        raise ValueError("scenes: two frames share an image id (file name without extension)")
    if config.holdout:
        rest = [i for i, scene in by_id.items() if not held_out(scene, config.holdout)]
        share = config.splits["train"] / (config.splits["train"] + config.splits["val"])
        assignment = split_images(rest, {"train": share, "val": 1 - share}, config.seed)
        assignment["test"] = sorted(set(by_id) - set(rest))
        if not assignment["test"]:
            raise ValueError(f"commands.holdout: no frame has {config.holdout}, so the test split would be empty")
    else:
        assignment = split_images(list(by_id), config.splits, config.seed)
    splits = {split: generate_split([by_id[i] for i in ids], width, height, config, split)
              for split, ids in assignment.items()}
    for split, records in splits.items():
        if not records:
            raise ValueError(f"commands: no question of split '{split}' survived answer balancing "
                             f"({len(assignment[split])} of {len(scenes)} images); use more images")
    return splits


def command_stats(splits: dict[str, list[dict]]) -> dict:
    """Counts per split, command type and answer (the content of ``metrics/commands.json``)."""
    out = {}
    for split, records in splits.items():
        per_type: dict[str, Counter] = defaultdict(Counter)
        for r in records:
            per_type[r["command_type"]][r["answer"]] += 1
        out[split] = {
            "images": len({r["image_id"] for r in records}),
            "questions": len(records),
            "types": {t: {"questions": sum(per_type[t].values()), "answers": dict(sorted(per_type[t].items()))}
                      for t in COMMAND_TYPES if t in per_type},
        }
    return out
