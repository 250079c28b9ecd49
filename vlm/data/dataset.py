"""``TrafficVQADataset``: one sample per question over a split's commands and its packed images; text tokenised once
at construction, each distinct image of a batch read and augmented once (docs/architecture.md, data path)."""

import copy
import os
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset

from vlm.data.augment import (
    AugmentConfig,
    augment_image,
    sample_augment_params,
    single_threaded_torch,
    transforms,
)
from vlm.data.commands import read_commands
from vlm.data.h5file import PackedImageReader
from vlm.data.mirror import swap_left_right
from vlm.processor import QATokenizer

_RECORD_FIELDS = ("question_id", "image_id", "command", "answer", "command_type", "metadata")
# the "augmentation" of TrafficVQADataset.mirrored: every image flipped, nothing else
MIRROR = AugmentConfig.mirror_only()


class Targets(Protocol):
    """What the dataset needs of a target transform (:class:`vlm.models.perception.TargetTransform`)."""

    def of(self, annotation: str, where: str) -> np.ndarray: ...

    def from_annotations(self, annotations: Sequence[str], source: str) -> np.ndarray: ...

    def check(self, annotations: Sequence[str], source: str) -> None: ...

    def mirror(self, targets: np.ndarray) -> np.ndarray: ...


class TokenTable:
    """Token ids of a list of texts in one flat int64 tensor; each distinct text encoded once."""

    def __init__(self, texts: Sequence[str], encode: Callable[[str], list[int]]):
        slot_of_text = {text: k for k, text in enumerate(dict.fromkeys(texts))}  # the distinct texts, in order
        encoded = [list(encode(text)) for text in slot_of_text]
        slots = np.array([slot_of_text[text] for text in texts], dtype=np.int64)  # [T] index into `encoded`
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(ids) for ids in encoded], out=offsets[1:])
        self.ids = torch.tensor(list(chain.from_iterable(encoded)), dtype=torch.int64)  # [sum of lengths]
        self.starts = offsets[slots].tolist()  # per text
        self.ends = offsets[slots + 1].tolist()

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.ids[self.starts[index]:self.ends[index]]  # a view, no copy


class TrafficVQADataset(Dataset):
    """Samples: ``image`` uint8 ``[3, S, W]``, ``question_ids`` / ``answer_ids`` int64, the record's fields and, given a
    transform, the image's ``targets``; ``augment``: training's (``set_epoch`` each epoch); ``in_memory``: all in RAM.
    Questions of images skipped as corrupt are dropped (``num_dropped``), others without one fail."""

    def __init__(self, commands_path: str | os.PathLike, h5_path: str | os.PathLike, tokenizer: QATokenizer,
                 augment: AugmentConfig | None = None, in_memory: bool = False, seed: int = 0,
                 targets: Targets | None = None):
        self.commands_path = Path(commands_path)
        self.images = PackedImageReader(h5_path)
        self.augment = augment
        if augment is not None and augment.jitters:
            transforms()  # imported here, before any DataLoader worker forks from this process
        self.seed = seed
        self.epoch = 0
        self.pad_token_id = tokenizer.pad_token_id
        self.in_memory = in_memory
        self.targets = targets
        self.tokenizer = tokenizer
        self.records, self.image_rows, self.num_dropped = self._match_records()
        self._tokenise(tokenizer)
        self._ram_targets, self._annotations = self._prepare_targets()
        self._ram_images: np.ndarray | None = None  # uint8 [N, 3, S, W] when held in RAM
        if in_memory:
            self._ram_images = self._read_all_images()
            self.images.close()

    def _match_records(self) -> tuple[list[dict[str, Any]], np.ndarray, int]:
        """The records whose image is packed, each one's image row ``[Q]``, and how many the pack stage left out."""
        row_of_image = {image_id: row for row, image_id in enumerate(self.images.image_ids)}
        skipped = set(self.images.skipped_image_ids)
        records, rows, dropped = [], [], 0
        for index, record in enumerate(read_commands(self.commands_path, _RECORD_FIELDS)):
            row = row_of_image.get(record["image_id"])
            if row is None:
                if record["image_id"] in skipped:
                    dropped += 1
                    continue
                raise ValueError(f"{self.commands_path}: record {index}: image '{record['image_id']}' "
                                 f"is not in {self.images.path} (packed from another commands file?)")
            records.append(record)
            rows.append(row)
        return records, np.array(rows, dtype=np.int64), dropped

    def _tokenise(self, tokenizer: QATokenizer) -> None:
        """Token tables of the questions and answers, and of their mirrored text when images may be flipped."""
        commands = [r["command"] for r in self.records]
        answers = [r["answer"] for r in self.records]
        self._question_ids = TokenTable(commands, tokenizer.encode_question)
        self._answer_ids = TokenTable(answers, tokenizer.encode_answer)
        if self.augment is not None and self.augment.hflip_prob > 0:
            mirror = {text: swap_left_right(text) for text in {*commands, *answers}}
            self._mirrored_commands = [mirror[c] for c in commands]
            self._mirrored_answers = [mirror[a] for a in answers]
            self._mirrored_question_ids = TokenTable(self._mirrored_commands, tokenizer.encode_question)
            self._mirrored_answer_ids = TokenTable(self._mirrored_answers, tokenizer.encode_answer)

    def _prepare_targets(self) -> tuple[np.ndarray | None, list[str] | None]:
        """In RAM, every image's targets ``[N, Gh*Gw, C]``; else their label frames, checked now (not mid-epoch)."""
        if self.targets is None:
            return None, None
        annotations = self.images.read_annotations()
        if self.in_memory:
            return self.targets.from_annotations(annotations, str(self.images.path)), None
        self.targets.check(annotations, str(self.images.path))
        return None, annotations

    def mirrored(self) -> "TrafficVQADataset":
        """The same questions about every image mirrored, "left" and "right" swapped in their text and the targets
        mirrored, nothing else changed (the records, their order and the image rows are this dataset's): what a model
        with ``model.mirror_answers`` is asked too. It shares this dataset's images (in RAM or the open file)."""
        view = copy.copy(self)
        view.augment = MIRROR
        view._tokenise(self.tokenizer)
        return view

    def set_epoch(self, epoch: int) -> None:
        """Selects the augmentation draw; call before iterating each epoch (with non-persistent workers)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Batched fetch: each distinct image read (and augmented) once, shared by its questions."""
        rows = self.image_rows[np.asarray(indices, dtype=np.int64)]  # [B]
        distinct_rows, slot_of_question = np.unique(rows, return_inverse=True)  # sorted: sequential reads
        chw_images = torch.from_numpy(self._read_images(distinct_rows))  # uint8 [n, 3, S, W]
        mirrored = [False] * len(distinct_rows)
        targets = self._read_targets(distinct_rows)  # n x [Gh*Gw, C], or None
        if self.augment is not None:
            augmented = []
            with single_threaded_torch():
                for slot, row in enumerate(distinct_rows.tolist()):
                    params = sample_augment_params(self.augment, self.seed, self.epoch, row)
                    augmented.append(augment_image(chw_images[slot], params))
                    mirrored[slot] = params.hflip
                    if params.hflip and targets is not None:
                        targets[slot] = self.targets.mirror(targets[slot])
            chw_images = augmented

        samples = []
        for index, slot in zip(indices, slot_of_question.tolist()):
            record = self.records[index]
            if mirrored[slot]:
                command, answer = self._mirrored_commands[index], self._mirrored_answers[index]
                question_ids, answer_ids = self._mirrored_question_ids[index], self._mirrored_answer_ids[index]
            else:
                command, answer = record["command"], record["answer"]
                question_ids, answer_ids = self._question_ids[index], self._answer_ids[index]
            sample = {
                "image": chw_images[slot],  # uint8 [3, S, W]
                "question_ids": question_ids,  # int64 [Lq]: [SOS] words [SEP]
                "answer_ids": answer_ids,  # int64 [La]: answer tokens [EOS]
                "question_id": record["question_id"], "image_id": record["image_id"], "command": command,
                "answer": answer, "command_type": record["command_type"], "metadata": record["metadata"],
            }
            if targets is not None:
                sample["targets"] = targets[slot]  # float32 numpy [Gh*Gw, C], shared by the image's questions
            samples.append(sample)
        return samples

    # The image copies below use numpy on purpose: numpy copies run on the calling thread, while torch's intra-op
    # threads contend with the training step (num_workers=0) and get several times slower on a loaded machine.

    def _read_images(self, rows: np.ndarray) -> np.ndarray:
        """uint8 ``[len(rows), 3, S, W]`` (C-contiguous) of the images at ``rows``."""
        if self._ram_images is not None:
            return self._ram_images[rows]
        size = self.images.image_size
        hwc = self.images.read_into(rows.tolist(), np.empty((len(rows), size, self.images.image_width, 3),
                                                            dtype=np.uint8))
        return np.ascontiguousarray(hwc.transpose(0, 3, 1, 2))

    def _read_targets(self, rows: np.ndarray) -> list[np.ndarray] | None:
        """The heads' targets float32 ``[Gh*Gw, C]`` of the images at ``rows`` (None without targets)."""
        if self._ram_targets is not None:
            return list(self._ram_targets[rows])
        if self._annotations is not None:
            return [self.targets.of(self._annotations[row], where=f"{self.images.path}: annotation[{row}]")
                    for row in rows.tolist()]
        return None

    def _read_all_images(self, block: int = 256) -> np.ndarray:
        """The whole split as uint8 ``[N, 3, S, W]``, read block by block (no second full copy)."""
        size = self.images.image_size
        out = np.empty((len(self.images), 3, size, self.images.image_width), dtype=np.uint8)
        for start in range(0, len(self.images), block):
            rows = np.arange(start, min(start + block, len(self.images)))
            out[start:start + len(rows)] = self._read_images(rows)
        return out
