"""A batch sampler that keeps the questions of an image together (the image is encoded once): per epoch the images are
shuffled by ``(seed, epoch)``, packed greedily; under DDP rank r takes part r (docs/architecture.md, Training)."""

from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


class GroupedBatchSampler(Sampler[list[int]]):
    """Batches of question indices, an image's questions (``image_rows[q]`` is question q's) in one batch but for more
    than ``batch_size`` of them (rare: consecutive batches). ``set_epoch(epoch, start)`` before each epoch: its batches
    from ``start`` on (a resumed run skips, unread, those it trained); ``len`` counts those it yields."""

    def __init__(self, image_rows: Sequence[int] | np.ndarray, batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, rank: int = 0, world_size: int = 1):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank} world_size={world_size}")
        image_rows = np.asarray(image_rows, dtype=np.int64)  # [Q]
        order = np.argsort(image_rows, kind="stable")  # questions grouped by image, file order inside
        _, group_starts = np.unique(image_rows[order], return_index=True)
        self.groups = [group.tolist() for group in np.split(order, group_starts[1:])] if len(order) else []
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0  # the first batch of the epoch to yield
        self._cached: tuple[int, list[list[int]]] | None = None

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        self.epoch, self.start = epoch, start

    def _pack(self, group_order: np.ndarray, capacity: int) -> list[list[int]]:
        batches: list[list[int]] = []
        batch: list[int] = []
        for g in group_order.tolist():
            for start in range(0, len(self.groups[g]), capacity):
                questions = self.groups[g][start:start + capacity]
                # closed once it holds a question per rank (under DDP a part of it each): it may then pass
                # capacity by less than a group
                if len(batch) >= self.world_size and len(batch) + len(questions) > capacity:
                    batches.append(batch)
                    batch = []
                batch.extend(questions)
        if batch:
            batches.append(batch)
        return batches

    def _epoch_batches(self) -> list[list[int]]:
        if self._cached is not None and self._cached[0] == self.epoch:
            return self._cached[1]
        world = self.world_size
        group_order = (np.random.default_rng((self.seed, self.epoch)).permutation(len(self.groups)) if self.shuffle
                       else np.arange(len(self.groups)))
        global_batches = self._pack(group_order, self.batch_size * world)  # [steps][questions]
        if world > 1 and global_batches and len(global_batches[-1]) < world:  # too few to give each rank one
            if len(global_batches) == 1:
                raise ValueError(f"{len(global_batches[0])} questions cannot be split over {world} ranks")
            global_batches[-2].extend(global_batches.pop())
        batches = [batch[len(batch) * self.rank // world:len(batch) * (self.rank + 1) // world]
                   for batch in global_batches]
        self._cached = (self.epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._epoch_batches()[self.start:])

    def __len__(self) -> int:
        return max(0, len(self._epoch_batches()) - self.start)
