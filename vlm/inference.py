"""Running a trained model over a dataset: constrained answers in the dataset's record order."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vlm.data.collate import collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.sampler import GroupedBatchSampler

TENSOR_KEYS = ("images", "image_index", "input_ids", "attention_mask", "prefix_lengths", "labels", "grounding")


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: batch[k].to(device, non_blocking=True) for k in TENSOR_KEYS if k in batch}


@torch.no_grad()
def predict_dataset(model, dataset: TrafficVQADataset, candidates: list[list[int]], batch_size: int,
                    device: torch.device, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Index of the most probable candidate ``[Q]`` and the candidate probabilities ``[Q, C]`` per question.

    Questions of one image share a batch, so each image is encoded once.
    """
    probs = np.zeros((len(dataset), len(candidates)), dtype=np.float32)
    sampler = GroupedBatchSampler(dataset.image_rows, batch_size, shuffle=False)
    for indices in sampler:
        batch = to_device(collate_questions(dataset.__getitems__(indices), dataset.pad_token_id), device)
        p = model.answer(batch["images"], batch["image_index"], batch["input_ids"], batch["attention_mask"],
                         batch["prefix_lengths"], candidates)  # [B, C]
        probs[np.asarray(indices)] = p.float().cpu().numpy()
        if progress is not None:
            progress.update(len(indices))
    return probs.argmax(1), probs
