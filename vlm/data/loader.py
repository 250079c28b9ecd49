"""The project's DataLoader: grouped batches, batched fetch, our collate, uint8 images."""

import functools

import torch
from torch.utils.data import DataLoader

from vlm.data.collate import collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.sampler import GroupedBatchSampler


def build_loader(dataset: TrafficVQADataset, batch_size: int, *, shuffle: bool, num_workers: int = 0,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> DataLoader:
    """A DataLoader over ``dataset`` with a ``GroupedBatchSampler`` (``batch_size`` counts questions). Workers are not
    persistent, so ``set_epoch`` reaches them: each epoch's iterator pickles (or forks) the dataset with its epoch."""
    sampler = GroupedBatchSampler(dataset.image_rows, batch_size, shuffle=shuffle, seed=seed, rank=rank,
                                  world_size=world_size)
    return DataLoader(dataset, batch_sampler=sampler, num_workers=num_workers, pin_memory=torch.cuda.is_available(),
                      collate_fn=functools.partial(collate_questions, pad_token_id=dataset.pad_token_id),
                      persistent_workers=False)


def set_epoch(loader: DataLoader, epoch: int, start: int = 0) -> None:
    """Select the shuffle (sampler) and augmentation (dataset) of ``epoch``, its batches yielded from ``start`` on."""
    loader.batch_sampler.set_epoch(epoch, start)
    loader.dataset.set_epoch(epoch)
