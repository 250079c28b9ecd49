"""The textbook per-sample loader, the ``profile_dataloader`` stage's baseline: per item it opens the HDF5 file, reads,
normalises and permutes an image and tokenises its texts, what ``TrafficVQADataset`` does once."""

import os
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

from vlm.batch import IGNORE_INDEX
from vlm.data.commands import read_commands
from vlm.data.dataset import QATokenizer
from vlm.data.h5file import PackedImageReader


class NaiveTrafficVQADataset(Dataset):
    def __init__(self, commands_path: str | os.PathLike, h5_path: str | os.PathLike, tokenizer: QATokenizer,
                 max_length: int = 48):
        header = PackedImageReader(h5_path)
        self.h5_path = header.path
        self.row_of_image = {image_id: row for row, image_id in enumerate(header.image_ids)}
        self.records = [r for r in read_commands(commands_path) if r["image_id"] in self.row_of_image]
        self.mean = header.mean.reshape(1, 1, 3)  # [1, 1, 3]
        self.std = header.std.reshape(1, 1, 3)
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        with h5py.File(self.h5_path, "r") as f:
            image = f["images"][self.row_of_image[record["image_id"]]]  # uint8 [S, S, 3]
        image = image.astype(np.float32) / 255.0
        image = (image - self.mean) / self.std
        image = torch.from_numpy(image).permute(2, 0, 1)  # float32 [3, S, S]

        question_ids = self.tokenizer.encode_question(record["command"])
        answer_ids = self.tokenizer.encode_answer(record["answer"])
        ids = (question_ids + answer_ids)[:self.max_length]
        input_ids = torch.full((self.max_length,), self.tokenizer.pad_token_id, dtype=torch.int64)
        input_ids[:len(ids)] = torch.tensor(ids)
        attention_mask = torch.zeros(self.max_length, dtype=torch.int64)
        attention_mask[:len(ids)] = 1
        labels = torch.full((self.max_length,), IGNORE_INDEX, dtype=torch.int64)
        labels[len(question_ids):len(ids)] = input_ids[len(question_ids):len(ids)]
        return {"image": image, "input_ids": input_ids, "attention_mask": attention_mask,
                "prefix_length": len(question_ids), "labels": labels, "question_id": record["question_id"],
                "answer": record["answer"]}


def build_naive_loader(dataset: NaiveTrafficVQADataset, batch_size: int, num_workers: int = 0, seed: int = 0,
                       num_samples: int | None = None) -> DataLoader:
    """Shuffled batches, the default collate: the textbook DataLoader; ``num_samples`` past the dataset wraps around."""
    sampler = RandomSampler(dataset, num_samples=num_samples, generator=torch.Generator().manual_seed(seed))
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers)
