"""``ElasticSampler``: partitions a dataset across the ranks, and again over the samples not yet processed
when the number of ranks changes (Horovod Elastic's sampler, same state and methods).

Every rank shuffles the whole index list alike (seeded by ``seed + epoch``); ``processed_num`` counts the
samples all ranks together have consumed this epoch, a prefix of that list (each ``record_batch`` adds
``batch_size`` times the number of ranks). What remains is split round-robin over the ranks, padded to a
multiple of the number of ranks. Kept in a ``TorchState``, the count is saved with ``commit()``, put back
by ``restore()``, and taken from rank 0 by ``sync()``; after a restart with fewer or more ranks the
remaining samples are split over the new number.
"""

from __future__ import annotations

import math
import random

import torch

from .. import basics


class ElasticSampler(torch.utils.data.Sampler):
    """Sampler over ``dataset`` for elastic training. Call ``record_batch(batch_idx, batch_size)`` after each
    processed batch, and ``set_epoch(epoch)`` at the end of an epoch (it clears the processed count)."""

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: a new order (with shuffle), nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Every rank processed one more batch of ``batch_size`` samples."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Split what remains of this epoch over the current ranks (after init, a restart or a restore)."""
        self.num_replicas = basics.size() if basics.is_initialized() else 1
        self.rank = basics.rank() if basics.is_initialized() else 0
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)  # alike on every rank
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        padded = list(self.remaining_indices)
        while len(padded) < self.total_size:  # repeat from the start to a multiple of the ranks
            padded += self.remaining_indices[:self.total_size - len(padded)]
        self.indices = padded[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
