"""Collate samples into a :class:`vlm.batch.Batch`, with dynamic padding and one copy per image."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vlm.batch import IGNORE_INDEX, Batch


def collate_questions(samples: Sequence[dict[str, Any]], pad_token_id: int = 0) -> Batch:
    """Samples of ``TrafficVQADataset`` -> Batch.

    ``input_ids`` = question ids + answer ids, right-padded to the longest sequence of the batch;
    ``labels`` = ``input_ids`` on the answer tokens (and their [EOS]), ``IGNORE_INDEX`` elsewhere.
    Samples with the same ``image_id`` share one stored image (the dataset gives all questions
    of an image in an epoch the same augmented image).
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

    question_lengths = torch.tensor([len(s["question_ids"]) for s in samples], dtype=torch.int64)  # [B]
    answer_lengths = torch.tensor([len(s["answer_ids"]) for s in samples], dtype=torch.int64)  # [B]
    lengths = question_lengths + answer_lengths  # [B]
    positions = torch.arange(int(lengths.max()))  # [L]
    attention_mask = positions[None, :] < lengths[:, None]  # [B, L] bool
    # Row-major order of the mask's True cells == the order of the concatenated token ids.
    tokens = torch.cat([ids for s in samples for ids in (s["question_ids"], s["answer_ids"])])
    input_ids = torch.full(attention_mask.shape, pad_token_id, dtype=torch.int64)  # [B, L]
    input_ids[attention_mask] = tokens
    is_answer = attention_mask & (positions[None, :] >= question_lengths[:, None])  # [B, L]
    labels = torch.where(is_answer, input_ids, IGNORE_INDEX)  # [B, L]

    targets = None
    if "targets" in samples[0]:
        targets = torch.from_numpy(np.stack([s["targets"] for s in distinct]))  # float32 [N_img, G*G, C]
    return Batch(
        # numpy's copy runs on this thread; torch.stack's intra-op threads contend with training.
        images=torch.from_numpy(np.stack([s["image"].numpy() for s in distinct])),  # uint8 [N_img, 3, S, S]
        image_index=torch.tensor(image_index, dtype=torch.int64),  # [B]
        input_ids=input_ids,
        attention_mask=attention_mask.to(torch.int64),
        prefix_lengths=question_lengths,  # [B] text tokens up to and including [SEP]
        labels=labels,
        targets=targets,
        question_id=[s["question_id"] for s in samples],
        image_id=[s["image_id"] for s in samples],
        command_type=[s["command_type"] for s in samples],
        answer=[s["answer"] for s in samples],
    )
