"""The training order: a shuffle that depends only on (seed, epoch), and can start mid-epoch.

A resumed run must see the same batches in the same order as an uninterrupted one.
``torch``'s ``RandomSampler`` draws its permutation from the global generator when
the epoch starts, and a plain ``DataLoader`` cannot start mid-epoch; this sampler
derives each epoch's permutation from ``(seed, epoch)`` alone, and
:meth:`EpochShuffle.skip_next` makes the next pass start after the examples a
checkpointed run had already consumed (see :mod:`mate_cli.resume`).
:func:`each_example_once` is the evaluation side under DDP: every example on one rank.
"""

from __future__ import annotations

import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper
from torch.utils.data import DataLoader, DistributedSampler, Sampler


class EpochShuffle(Sampler[int]):
    """Indices ``0..size-1`` in an order fixed by ``(seed, epoch)``.

    Lightning calls :meth:`set_epoch` before every epoch. ``len()`` stays ``size`` (the
    full epoch) even when a pass is shortened by :meth:`skip_next`.
    """

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = int(size), int(seed), 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def skip_next(self, count: int) -> None:
        """Start the next pass after its first ``count`` indices (a resumed epoch)."""
        self._skip = max(0, int(count))

    def order(self, epoch: int) -> list[int]:
        """The full permutation of ``epoch``."""
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % (2**63))
        return torch.randperm(self.size, generator=generator).tolist()

    def __iter__(self):
        skip, self._skip = self._skip, 0
        return iter(self.order(self.epoch)[skip:])

    def __len__(self) -> int:
        return self.size


def each_example_once(loader: DataLoader, world_size: int, rank: int) -> DataLoader:
    """``loader`` serving this rank's share of its examples, each example on exactly one rank.

    For evaluation Lightning gives loaders a ``DistributedSampler``, which pads the split to
    a multiple of the world size by repeating examples: Hits@k and the loss would count
    those twice. ``UnrepeatedDistributedSamplerWrapper`` (what Lightning uses to predict)
    leaves the ranks uneven instead, which is safe in ``trainer.validate``: the module
    runs unwrapped (no DDP collectives per batch) and the metric states and logged sums
    are reduced once, at the end.
    """
    if world_size == 1 or isinstance(loader.sampler, DistributedSampler):
        return loader
    sampler = UnrepeatedDistributedSamplerWrapper(loader.sampler, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
                      collate_fn=loader.collate_fn, pin_memory=loader.pin_memory)
