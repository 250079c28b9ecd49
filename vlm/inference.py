"""Running a trained model over a dataset: constrained answers in the dataset's record order."""

from __future__ import annotations

import numpy as np
import torch

from vlm.data.collate import collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.sampler import GroupedBatchSampler


@torch.no_grad()
def predict_dataset(model, dataset: TrafficVQADataset, candidates: list[list[int]], batch_size: int,
                    device: torch.device, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """Index of the most probable candidate ``[Q]`` and the candidate probabilities ``[Q, C]`` per question.

    Questions of one image share a batch, so each image is encoded once.
    """
    probs = np.zeros((len(dataset), len(candidates)), dtype=np.float32)
    sampler = GroupedBatchSampler(dataset.image_rows, batch_size, shuffle=False)
    for indices in sampler:
        batch = collate_questions(dataset.__getitems__(indices), dataset.pad_token_id).to(device)
        p = model.answer(batch, candidates)  # [B, C]
        probs[np.asarray(indices)] = p.float().cpu().numpy()
        if progress is not None:
            progress.update(len(indices))
    return probs.argmax(1), probs
