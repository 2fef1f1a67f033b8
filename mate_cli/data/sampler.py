"""The training order: a shuffle that depends only on ``(seed, epoch)`` and can start mid-epoch, so that a resumed run
sees the same batches in the same order as an uninterrupted one (torch's ``RandomSampler`` draws from the global
generator, and a ``DataLoader`` cannot start mid-epoch; resumption: :mod:`mate_cli.resume`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper
from torch.utils.data import DataLoader, DistributedSampler


class EpochShuffle(DistributedSampler):
    """Indices ``0..size-1`` in an order fixed by ``(seed, epoch)``, this rank's share of them: every
    ``num_replicas``-th index of the order, padded by repetition as ``DistributedSampler`` does (Lightning uses it as it
    is, unwrapped). ``num_replicas`` and ``rank`` default to the process group's (1 and 0 without one); ``len()`` is the
    rank's full share even when :meth:`skip_next` shortens a pass."""

    def __init__(
        self,
        size: int,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        same_every_epoch: bool = False,
    ) -> None:
        self.size, self.seed, self.epoch = int(size), int(seed), 0
        self._replicas, self._rank, self._skip = num_replicas, rank, 0
        self.same_every_epoch = bool(same_every_epoch)

    def _world(self) -> tuple[int, int]:
        if self._replicas is not None:
            return self._replicas, self._rank or 0
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
        return 1, 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order (and, :class:`EpochTagged`, randomness) comes next; with
        ``same_every_epoch`` always epoch 0's (``debug=overfit``'s one fixed batch)."""
        self.epoch = 0 if self.same_every_epoch else int(epoch)

    def skip_next(self, count: int) -> None:
        """Start the next pass after the first ``count`` examples of the epoch, over all ranks."""
        self._skip = max(0, int(count))

    def order(self, epoch: int) -> list[int]:
        """The full permutation of ``epoch`` (every rank's)."""
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % (2**63))
        return torch.randperm(self.size, generator=generator).tolist()

    def __iter__(self):
        world, rank = self._world()
        skip, self._skip = self._skip, 0
        order = self.order(self.epoch)
        order += order[: (-len(order)) % world]
        return iter(order[rank::world][skip // world :])

    def __len__(self) -> int:
        return -(-self.size // self._world()[0])


def each_example_once(loader: DataLoader, world_size: int, rank: int) -> DataLoader:
    """``loader`` serving this rank's share of its examples, each on exactly one rank: Lightning's evaluation
    ``DistributedSampler`` pads the split by repeating examples, which Hits@k and the loss would count twice.
    ``UnrepeatedDistributedSamplerWrapper`` leaves the ranks uneven instead, which is safe in ``trainer.validate``: the
    module runs unwrapped (no DDP collectives per batch), and metric states and logged sums are reduced once, at the
    end."""
    if world_size == 1 or isinstance(loader.sampler, DistributedSampler):
        return loader
    sampler = UnrepeatedDistributedSamplerWrapper(loader.sampler, num_replicas=world_size, rank=rank, shuffle=False)
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        worker_init_fn=loader.worker_init_fn,
    )


class EpochTagged(EpochShuffle):
    """:class:`EpochShuffle` yielding ``(epoch, index)``: the dataset draws that epoch's
    randomness for the example (masked-LM masks) from the pair, so it travels with the index
    into worker processes and is the same after a resume."""

    def __iter__(self):
        epoch = self.epoch
        return ((epoch, index) for index in super().__iter__())
