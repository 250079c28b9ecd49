"""Turning labelled scenes into balanced question/answer records, split by image. Balancing follows CLEVR
(docs/architecture.md, generate_commands): greedy picks per image (:func:`_pick`), then rejection (:func:`_trim`)."""

import contextlib
import dataclasses
import math
import os
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from vlm.commands import rules
from vlm.commands.templates import TEMPLATES, Candidate
from vlm.commands.types import QUESTION_TYPES, candidates
from vlm.config import build_config, check
from vlm.data.commands import SPLITS
from vlm.io import atomic_path, json_list_writer
from vlm.scenes.generate import load_raw
from vlm.scenes.schema import Scene


@dataclass
class CommandsConfig:
    seed: int = 0
    questions_per_image: int = 8
    # the share of train images whose spatial "no" questions are preferably about a category the image has elsewhere
    # (hard negatives: not on the asked side) rather than an absent one; 0 = no preference
    train_hard_negatives: float = 0.5
    splits: dict = field(default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1})
    balance_tolerance: float = 1.1
    # the question types asked (vlm/commands/types, one file each), in this order, each with its options
    types: dict = field(default_factory=lambda: {name: dataclasses.asdict(t.options())
                                                 for name, t in QUESTION_TYPES.items()})
    # a held-out combination (CLEVR-CoGenT), e.g. {timeofday: night}: its frames are the test split and in no
    # other (train and val share the rest in proportion); {}: off, a random test split
    holdout: dict = field(default_factory=dict)

    def validate(self, prefix: str = "commands") -> None:
        check(self.questions_per_image >= 1, f"{prefix}.questions_per_image",
              f"must be at least 1, got {self.questions_per_image}")
        check(bool(self.types), f"{prefix}.types", f"asks no question type (known: {', '.join(QUESTION_TYPES)})")
        for t, options in self.types.items():
            check(t in QUESTION_TYPES, f"{prefix}.types", f"unknown type {t!r} (known: {', '.join(QUESTION_TYPES)})")
            check(options is None or isinstance(options, Mapping), f"{prefix}.types.{t}",
                  f"must be a mapping of the type's options ({{}}: none or their defaults), got {options!r}")
            build_config(QUESTION_TYPES[t].options, options, f"{prefix}.types.{t}")
        check(set(self.splits) == set(SPLITS), f"{prefix}.splits",
              f"must name exactly {', '.join(SPLITS)}, got {', '.join(self.splits)}")
        for name, frac in self.splits.items():
            check(not isinstance(frac, bool) and isinstance(frac, (int, float)) and 0 < frac < 1,
                  f"{prefix}.splits.{name}", f"must be a fraction in (0, 1), got {frac!r}")
        check(math.isclose(sum(self.splits.values()), 1.0, abs_tol=1e-6), f"{prefix}.splits",
              f"fractions must sum to 1, got {sum(self.splits.values()):g}")
        check(not isinstance(self.train_hard_negatives, bool) and 0 <= self.train_hard_negatives <= 1,
              f"{prefix}.train_hard_negatives", f"must be a share in [0, 1], got {self.train_hard_negatives!r}")
        check(self.balance_tolerance >= 1.0, f"{prefix}.balance_tolerance",
              f"must be >= 1.0, got {self.balance_tolerance}")
        for attribute, value in self.holdout.items():
            check(attribute in HOLDOUT_ATTRIBUTES, f"{prefix}.holdout",
                  f"unknown frame attribute {attribute!r} (one of {', '.join(HOLDOUT_ATTRIBUTES)})")
            check(isinstance(value, str) and bool(value), f"{prefix}.holdout.{attribute}",
                  f"must be a value such as {HOLDOUT_ATTRIBUTES[attribute]!r}, got {value!r}")

    @cached_property
    def asked(self) -> dict[str, Any]:
        """The asked types' options (each type's options dataclass), by type name, in the order asked."""
        return {t: build_config(QUESTION_TYPES[t].options, options, f"commands.types.{t}")
                for t, options in self.types.items()}


HOLDOUT_ATTRIBUTES = {"timeofday": "night", "weather": "rainy", "scene": "highway"}  # with an example value


def held_out(scene: Scene, holdout: dict) -> bool:
    return all(getattr(scene, attribute) == value for attribute, value in holdout.items())


def split_images(image_ids: list[str], fractions: dict, seed: int) -> dict[str, list[str]]:
    """Each image in one split: a seeded permutation of the sorted ids cut by ``fractions``; the last takes the rest."""
    ids = sorted(image_ids)
    order = np.random.default_rng([seed, 1]).permutation(len(ids))
    splits, start = {}, 0
    for k, (split, fraction) in enumerate(fractions.items()):
        end = len(ids) if k == len(fractions) - 1 else start + round(fraction * len(ids))
        splits[split] = sorted(ids[i] for i in order[start:end])
        start = end
    return splits


def pick_images(image_ids: list[str], n: int = 16, seed: int = 0) -> list[str]:
    """``n`` of the sorted ``image_ids`` picked at random (seeded), in id order: the images of the contact sheet."""
    ids = sorted(image_ids)
    return [ids[i] for i in sorted(np.random.default_rng(seed).choice(len(ids), size=min(n, len(ids)), replace=False))]


def _deficit(counts: Counter, answer: str) -> int:
    """How far ``answer`` is behind the most common answer of ``counts``."""
    return max(counts.values(), default=0) - counts[answer]


def hard_negatives(scene: Scene, pool: list[Candidate]) -> set[Candidate]:
    """The spatial questions of ``pool`` answered "no" although the scene has the category elsewhere: only the
    object's side tells them from a "yes", where "no" for an absent category can be told from presence alone."""
    return {c for c in pool if c.template == "spatial/on_side" and c.answer == rules.NO
            and rules.count(scene, dict(c.params)["category"])}


def _pick(scene_candidates: list[Candidate], n: int, key_counts, type_counts, types: tuple[str, ...],
          rng: np.random.Generator, preferred: set[Candidate] = frozenset()) -> list[Candidate]:
    """Greedy, balance-seeking choice of ``n`` distinct questions for one image, the types sharing its slots evenly;
    of the questions as far behind in their key's answers, the ``preferred`` first."""
    by_type: dict[str, list[Candidate]] = defaultdict(list)
    for c in scene_candidates:
        by_type[c.command_type].append(c)
    chosen: list[Candidate] = []
    order = [str(t) for t in rng.permutation(types) if by_type[str(t)]]  # tie-break between types
    while len(chosen) < n and order:
        # The slot goes to the type asked least so far: types that only some images can answer (traffic lights)
        # get more of those images' slots, so every type ends up near its share.
        t = min(order, key=lambda name: sum(type_counts[name].values()))
        pool, type_count = by_type[t], type_counts[t]
        scores = [(_deficit(key_counts[c.key], c.answer), c in preferred, _deficit(type_count, c.answer))
                  for c in pool]
        best = max(scores)
        ties = [i for i, s in enumerate(scores) if s == best]
        c = pool.pop(ties[int(rng.integers(len(ties)))])
        chosen.append(c)
        key_counts[c.key][c.answer] += 1
        type_counts[t][c.answer] += 1
        if not pool:
            order.remove(t)
    return chosen


@dataclass
class _Picker:
    """The greedy choice's state in one split: its random stream and the answers picked so far."""

    rng: np.random.Generator
    key_counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    type_counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))


def _trim(groups: np.ndarray, answers: np.ndarray, answer_names: list[str], keep: np.ndarray, tolerance: float,
          rng: np.random.Generator) -> None:
    """Clear ``keep`` of questions until in every group (``groups``, ``answers``: codes) the top answer is at most
    ``tolerance`` x the runner-up; groups in order of first occurrence, answer ties to the name sorting first."""
    kept = np.flatnonzero(keep)
    group_of_kept = groups[kept]
    _, first = np.unique(group_of_kept, return_index=True)
    for group in group_of_kept[np.sort(first)]:
        members = kept[group_of_kept == group]
        answer_of_member = answers[members]
        codes, counts = np.unique(answer_of_member, return_counts=True)
        ranked = sorted(zip(counts.tolist(), codes.tolist()), key=lambda cc: (-cc[0], answer_names[cc[1]]))
        second = ranked[1][0] if len(ranked) > 1 else 0
        top = members[answer_of_member == ranked[0][1]]
        cap = math.floor(tolerance * second + 1e-9)
        if len(top) > cap:
            keep[rng.choice(top, size=len(top) - cap, replace=False)] = False


class BalancedCommands:
    """The balanced question records of every split, from scenes read as a stream, three times (docs/architecture.md,
    generate_commands): ``scenes`` is called for each read and must give the same scenes in the same order."""

    def __init__(self, scenes: Callable[[], Iterable[Scene]], width: float, height: float, config: CommandsConfig):
        self._scenes, self._width, self._height, self._config = scenes, width, height, config
        self._types = tuple(config.types)
        self._image_ids, self._split_of = self._assign_splits()  # ids in the scenes' order; id -> split
        self._picked, self._keep, self._names = self._balance()

    def _assign_splits(self) -> tuple[list[str], dict[str, str]]:
        holdout, image_ids, rest = self._config.holdout, [], []
        for scene in self._scenes():
            image_ids.append(scene.image_id)
            if holdout and not held_out(scene, holdout):
                rest.append(scene.image_id)
        if len(set(image_ids)) != len(image_ids):
            raise ValueError("scenes: two frames share an image id (file name without extension)")
        if holdout:
            share = self._config.splits["train"] / (self._config.splits["train"] + self._config.splits["val"])
            assignment = split_images(rest, {"train": share, "val": 1 - share}, self._config.seed)
            assignment["test"] = sorted(set(image_ids) - set(rest))
            if not assignment["test"]:
                raise ValueError(f"commands.holdout: no frame has {holdout}, so the test split would be empty")
        else:
            assignment = split_images(image_ids, self._config.splits, self._config.seed)
        return image_ids, {image_id: split for split, ids in assignment.items() for image_id in ids}

    def _pick_all(self, pickers: dict[str, _Picker]) -> Iterator[tuple[str, int, Scene, int, Candidate, int]]:
        """``(split, image position, scene, slot, candidate, phrasing)`` for every question picked, before
        balancing, in the order of the scenes; the same on every call with fresh ``pickers``."""
        for position, scene in enumerate(self._scenes()):
            if position >= len(self._image_ids) or scene.image_id != self._image_ids[position]:
                raise ValueError(f"scenes: frame {position} changed while the questions were generated")
            split = self._split_of[scene.image_id]
            picker = pickers[split]
            pool = candidates(scene, self._width, self._height, self._config.asked)
            config = self._config
            share = config.train_hard_negatives if split == "train" else 0.0
            hard = share == 1.0 or (share > 0 and picker.rng.random() < share)  # a draw only for a share in (0, 1)
            preferred = hard_negatives(scene, pool) if hard else set()
            chosen = _pick(pool, config.questions_per_image, picker.key_counts, picker.type_counts, self._types,
                           picker.rng, preferred)
            for slot, c in enumerate(chosen):
                yield split, position, scene, slot, c, int(picker.rng.integers(len(TEMPLATES[c.template].phrasings)))

    def _pickers(self) -> dict[str, _Picker]:
        return {split: _Picker(np.random.default_rng([self._config.seed, SPLITS.index(split), 2])) for split in SPLITS}

    def _balance(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, list[str]]]:
        """Each split's picked questions in the order picked, int32 rows ``(image position, key, command type,
        answer)`` (the last three codes, whose values the third dict lists), and which of them balancing keeps."""
        codes: dict[str, dict[str, int]] = {"key": {}, "command_type": {}, "answer": {}}
        rows = {split: array("i") for split in SPLITS}  # four small integers per question, none held as an object
        pickers = self._pickers()
        for split, position, _, _, c, _ in self._pick_all(pickers):
            values = {"key": c.key, "command_type": c.command_type, "answer": c.answer}
            rows[split].extend([position, *(codes[k].setdefault(v, len(codes[k])) for k, v in values.items())])
        names = {column: list(values) for column, values in codes.items()}
        picked, keep = {}, {}
        for split in SPLITS:
            picked[split] = np.frombuffer(rows[split], dtype=np.int32).reshape(-1, 4)
            _, key, command_type, answer = picked[split].T
            keep[split] = np.ones(len(answer), dtype=bool)
            rng = pickers[split].rng  # balancing goes on with the split's stream after its picks
            while True:  # trimming a type can unbalance a key and vice versa: repeat until both hold
                before = int(keep[split].sum())
                for groups in (key, command_type):
                    _trim(groups, answer, names["answer"], keep[split], self._config.balance_tolerance, rng)
                if int(keep[split].sum()) == before:
                    break
            if not keep[split].any():
                images = sum(s == split for s in self._split_of.values())
                raise ValueError(f"commands: no question of split '{split}' survived answer balancing "
                                 f"({images} of {len(self._image_ids)} images); use more images")
        return picked, keep, names

    def images(self, split: str) -> list[str]:
        """The sorted ids of the split's images that kept at least one question."""
        positions = self._picked[split][self._keep[split], 0]
        return sorted(self._image_ids[i] for i in np.unique(positions).tolist())

    @property
    def stats(self) -> dict:
        """Counts per split, command type and answer (the content of ``metrics/commands.json``)."""
        out = {}
        for split, table in self._picked.items():
            keep = self._keep[split]
            per_type: dict[str, Counter] = defaultdict(Counter)
            for t, a in table[keep, 2:].tolist():
                per_type[self._names["command_type"][t]][self._names["answer"][a]] += 1
            out[split] = {
                "images": len(self.images(split)), "questions": int(keep.sum()),
                "types": {t: {"questions": sum(per_type[t].values()), "answers": dict(sorted(per_type[t].items()))}
                          for t in self._types if t in per_type},
            }
        return out

    def write(self, folder: str | os.PathLike, collect: Collection[str] = ()) -> list[tuple[str, list[dict]]]:
        """Write each split's records to ``folder/{split}.json``; return ``(file name, records)`` of ``collect``'s."""
        collected: dict[str, tuple[str, list[dict]]] = {}
        position_in_split: Counter = Counter()
        with contextlib.ExitStack() as stack:
            writers = {split: stack.enter_context(json_list_writer(Path(folder) / f"{split}.json")) for split in SPLITS}
            for split, _, scene, slot, c, phrasing in self._pick_all(self._pickers()):
                position_in_split[split] += 1
                if not self._keep[split][position_in_split[split] - 1]:
                    continue
                record = {"question_id": f"{scene.image_id}_{slot}", "image_id": scene.image_id,
                          "command": c.text(phrasing), "answer": c.answer, "command_type": c.command_type,
                          "template": c.template,
                          "metadata": {"scene_type": scene.scene, "weather": scene.weather,
                                       "timeofday": scene.timeofday, "num_objects": len(scene.objects)}}
                writers[split](record)
                if scene.image_id in collect:
                    collected.setdefault(scene.image_id, (scene.name, []))[1].append(record)
        return [collected[image_id] for image_id in sorted(collected)]


def generate_commands(config: CommandsConfig, raw_dir: str | os.PathLike, out_dir: str | os.PathLike,
                      shown: int = 16) -> tuple[dict, list[tuple[Path, list[dict]]]]:
    """The generate_commands stage: the balanced questions of ``raw_dir``'s scenes written to ``out_dir/{split}.json``
    (the folder appears whole or not at all). Returns the per-split counts and, for the contact sheet, ``shown`` test
    images (seeded) as ``(image path, their questions)``."""
    raw = load_raw(raw_dir)
    commands = BalancedCommands(raw.iter_scenes, raw.width, raw.height, config)
    picked = pick_images(commands.images("test"), n=shown, seed=config.seed)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        sheet = commands.write(tmp, collect=set(picked))
    return commands.stats, [(raw.image_dir / name, records) for name, records in sheet]
