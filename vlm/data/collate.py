"""Collate samples into a :class:`vlm.batch.Batch`, with dynamic padding and one copy per image."""

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vlm.batch import Batch
from vlm.processor import make_batch


def collate_questions(samples: Sequence[dict[str, Any]], pad_token_id: int = 0) -> Batch:
    """Samples of ``TrafficVQADataset`` -> Batch; those of one ``image_id`` share one stored image and its targets."""
    if not samples:
        raise ValueError("collate_questions: empty batch")
    slot_of_image: dict[str, int] = {}
    distinct = []  # the first sample of each distinct image
    for sample in samples:
        if sample["image_id"] not in slot_of_image:
            slot_of_image[sample["image_id"]] = len(distinct)
            distinct.append(sample)
    # numpy's copies run on this thread; torch.stack's intra-op threads contend with training.
    return make_batch(
        torch.from_numpy(np.stack([s["image"].numpy() for s in distinct])),  # uint8 [N_img, 3, H, W]
        [slot_of_image[s["image_id"]] for s in samples],  # image_index [B]
        [s["question_ids"] for s in samples], [s["answer_ids"] for s in samples], pad_token_id,
        targets=torch.from_numpy(np.stack([s["targets"] for s in distinct])) if "targets" in samples[0] else None,
        **{field: [s[field] for s in samples] for field in ("question_id", "image_id", "command_type", "answer")},
    )
