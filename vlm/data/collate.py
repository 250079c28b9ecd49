"""Collate samples into a :class:`vlm.batch.Batch`, with dynamic padding and one copy per image."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vlm.batch import Batch
from vlm.processor import make_batch


def collate_questions(samples: Sequence[dict[str, Any]], pad_token_id: int = 0) -> Batch:
    """Samples of ``TrafficVQADataset`` -> Batch (:func:`vlm.processor.make_batch`).

    Samples with the same ``image_id`` share one stored image (the dataset gives all questions of an image in
    an epoch the same augmented image), and the same targets when the samples carry them.
    """
    if not samples:
        raise ValueError("collate_questions: empty batch")
    slot_of_image: dict[str, int] = {}
    distinct = []  # the first sample of each distinct image
    image_index = []
    for sample in samples:
        slot = slot_of_image.get(sample["image_id"])
        if slot is None:
            slot = slot_of_image[sample["image_id"]] = len(distinct)
            distinct.append(sample)
        image_index.append(slot)

    targets = None
    if "targets" in samples[0]:
        targets = torch.from_numpy(np.stack([s["targets"] for s in distinct]))  # float32 [N_img, ...]
    return make_batch(
        # numpy's copy runs on this thread; torch.stack's intra-op threads contend with training.
        torch.from_numpy(np.stack([s["image"].numpy() for s in distinct])),  # uint8 [N_img, 3, H, W]
        image_index, [s["question_ids"] for s in samples], [s["answer_ids"] for s in samples], pad_token_id,
        targets=targets,
        question_id=[s["question_id"] for s in samples],
        image_id=[s["image_id"] for s in samples],
        command_type=[s["command_type"] for s in samples],
        answer=[s["answer"] for s in samples],
    )
