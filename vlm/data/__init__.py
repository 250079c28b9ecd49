"""The data path from JPEGs to training batches: packing, dataset, sampler, collate, augmentation."""

from vlm.data.augment import AugmentConfig, swap_left_right
from vlm.data.collate import IGNORE_INDEX, collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.h5file import PackedImageReader
from vlm.data.loader import build_loader, set_epoch
from vlm.data.pack import CorruptImageError, PackConfig, decode_image, pack_dataset
from vlm.data.sampler import GroupedBatchSampler

__all__ = [
    "AugmentConfig",
    "CorruptImageError",
    "GroupedBatchSampler",
    "IGNORE_INDEX",
    "PackConfig",
    "PackedImageReader",
    "TrafficVQADataset",
    "build_loader",
    "collate_questions",
    "decode_image",
    "pack_dataset",
    "set_epoch",
    "swap_left_right",
]
