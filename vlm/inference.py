"""Running a trained model: constrained answers over a dataset, or over any images and questions."""

from collections.abc import Callable, Hashable, Mapping, Sequence

import numpy as np
import torch

from vlm.data.collate import collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.mirror import swap_left_right
from vlm.data.sampler import GroupedBatchSampler
from vlm.models.perception import head_metrics
from vlm.processor import Processor


def mirrors_answers(model) -> bool:
    """Whether ``model`` answers with the mean over the image and its mirror image (``model.mirror_answers``)."""
    return bool(getattr(model.config, "mirror_answers", False))


def constrain(probs: np.ndarray, fitting: np.ndarray) -> np.ndarray:
    """``probs`` ``[Q, C]`` renormalised over each question's ``fitting`` answers (``templates.fitting_answers``): the
    softmax over those answers alone, as the scores are a softmax over all."""
    kept = np.where(fitting, probs, 0.0)
    return (kept / np.maximum(kept.sum(1, keepdims=True), np.finfo(np.float32).tiny)).astype(np.float32)


@torch.no_grad()
def predict_dataset(model, dataset: TrafficVQADataset, candidates: list[list[int]], batch_size: int,
                    device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """The most probable candidate ``[Q]`` and the probabilities ``[Q, C]`` (each image encoded once per batch); with
    ``model.mirror_answers`` the mean of those of ``dataset`` and of its :meth:`~TrafficVQADataset.mirrored` view."""
    views = [dataset, dataset.mirrored()] if mirrors_answers(model) else [dataset]
    probs = np.zeros((len(dataset), len(candidates)), dtype=np.float32)
    for indices in GroupedBatchSampler(dataset.image_rows, batch_size, shuffle=False):
        for view in views:
            batch = collate_questions(view.__getitems__(indices), view.pad_token_id).to(device)
            probs[np.asarray(indices)] += model.answer(batch, candidates).float().cpu().numpy() / len(views)  # [B, C]
    return probs.argmax(1), probs


@torch.no_grad()
def perception_metrics(model, dataset: TrafficVQADataset, batch_size: int, device: torch.device) -> dict[str, float]:
    """Means over the images of the perception heads' own measures, each image counted once (a batch smaller than
    an image's questions splits them over two batches); empty without heads or targets."""
    if model.extension is None or dataset.targets is None:
        return {}
    totals: dict[str, float] = {}
    seen: set[int] = set()
    for indices in GroupedBatchSampler(dataset.image_rows, batch_size, shuffle=False):
        batch = collate_questions(dataset.__getitems__(indices), dataset.pad_token_id).to(device)
        rows = list(dict.fromkeys(int(dataset.image_rows[i]) for i in indices))  # the batch's images, in its order
        new = torch.tensor([row not in seen for row in rows], device=device)  # [N_img]
        seen.update(rows)
        for name, values in head_metrics(model, batch.images, batch.targets).items():
            # float64 sums of float32 values: exact, so the batch size cannot change the mean's last digits
            totals[name] = totals.get(name, 0.0) + float(values[new].double().sum())
    return {name: total / len(seen) for name, total in totals.items()}


@torch.no_grad()
def answer_questions(model, processor: Processor, images: Mapping[Hashable, torch.Tensor],
                     questions: Sequence[tuple[Hashable, str]], candidates: list[list[int]], batch_size: int,
                     device: torch.device, targets: Mapping[Hashable, torch.Tensor] | None = None,
                     mirror_targets: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """Candidate probabilities ``[Q, C]`` of each ``(image key, question)``, the images uint8 ``[3, H, W]`` by key,
    an image's questions batched together; ``targets``: the label maps by key, for a model that reads them. With
    ``model.mirror_answers`` the mean of those and of the mirror images' asked the left/right-swapped questions (the
    label maps then mirrored by ``mirror_targets``: :meth:`~vlm.models.perception.TargetTransform.mirror`)."""
    if mirrors_answers(model):
        if targets is not None and mirror_targets is None:
            raise ValueError("answer_questions(): a model with model.mirror_answers that reads label maps needs "
                             "mirror_targets")
        mirrored_targets = None if targets is None else {
            key: torch.from_numpy(mirror_targets(maps.numpy()).copy()) for key, maps in targets.items()}
        asked = [(images, questions, targets),
                 ({key: image.flip(-1) for key, image in images.items()},
                  [(key, swap_left_right(question)) for key, question in questions], mirrored_targets)]
    else:
        asked = [(images, questions, targets)]
    order = sorted(range(len(questions)), key=lambda i: str(questions[i][0]))  # an image's questions together
    probs = np.zeros((len(questions), len(candidates)), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        keys = list(dict.fromkeys(questions[i][0] for i in chunk))  # distinct, in order
        slot = {key: k for k, key in enumerate(keys)}
        for pictures, texts, maps in asked:
            batch = processor([pictures[key] for key in keys], [texts[i][1] for i in chunk],
                              image_index=[slot[questions[i][0]] for i in chunk],
                              targets=None if maps is None else torch.stack([maps[key] for key in keys])).to(device)
            probs[chunk] += model.answer(batch, candidates).float().cpu().numpy() / len(asked)  # [B, C]
    return probs
