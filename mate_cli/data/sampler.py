"""The training order: a shuffle that depends only on ``(seed, epoch)`` and can start mid-epoch, so that a resumed run
sees the batches of an uninterrupted one (torch's ``RandomSampler`` draws from the global generator, and a
``DataLoader`` cannot start mid-epoch).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSamplerWrapper
from torch.utils.data import DataLoader, DistributedSampler


#: with ``lengths``, the batches whose examples are sorted by length together (``dataset.bucket_by_length``)
BUCKET_WINDOW = 50


class EpochShuffle(DistributedSampler):
    """This rank's share of a ``(seed, epoch)`` permutation, padded by repetition as ``DistributedSampler`` does (so
    Lightning uses it unwrapped). ``len()`` is the full share even when :meth:`skip_next` shortens a pass. With
    ``lengths`` (each example's tokens) and ``batch_size``, batches of similar lengths (:meth:`_bucketed`): less
    padding, the same examples each epoch."""

    def __init__(
        self,
        size: int,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        same_every_epoch: bool = False,
        lengths: Sequence[int] | None = None,
        batch_size: int = 1,
    ) -> None:
        self.size, self.seed, self.epoch = int(size), int(seed), 0
        self._replicas, self._rank, self._skip = num_replicas, rank, 0
        self.same_every_epoch = bool(same_every_epoch)
        self.lengths = None if lengths is None else torch.as_tensor(list(lengths), dtype=torch.long)
        self.batch_size = int(batch_size)

    def _world(self) -> tuple[int, int]:
        if self._replicas is not None:
            return self._replicas, self._rank or 0
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
        return 1, 0

    def set_epoch(self, epoch: int) -> None:
        """With ``same_every_epoch``, always epoch 0 (``debug=overfit``'s one fixed batch)."""
        self.epoch = 0 if self.same_every_epoch else int(epoch)

    def skip_next(self, count: int) -> None:
        """Start the next pass after the epoch's first ``count`` examples, counted over all ranks."""
        self._skip = max(0, int(count))

    def order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % (2**63))
        order = torch.randperm(self.size, generator=generator)
        return order.tolist() if self.lengths is None else self._bucketed(order, generator)

    def _bucketed(self, order: torch.Tensor, generator: torch.Generator) -> list[int]:
        """``order`` regrouped so that each batch holds examples of about one length: within each window of
        :data:`BUCKET_WINDOW` batches of the shuffled order, examples sorted by length and cut into batches (over all
        ranks: each rank's batch of a step comes from the same group); the full batches in a shuffled order, the few
        partial ones (a window's remainder) last, so that every batch the loader cuts is one of these groups."""
        group = self.batch_size * self._world()[0]
        full, rest = [], []
        for window in order.split(group * BUCKET_WINDOW):
            ranked = window[torch.argsort(self.lengths[window], stable=True)]
            cut = len(ranked) - len(ranked) % group
            full += list(ranked[:cut].split(group))
            rest.append(ranked[cut:])
        shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
        return torch.cat([*shuffled, *rest]).tolist() if shuffled or rest else []

    def __iter__(self):
        world, rank = self._world()
        skip, self._skip = self._skip, 0
        order = self.order(self.epoch)
        order += order[: (-len(order)) % world]
        return iter(order[rank::world][skip // world :])

    def __len__(self) -> int:
        return -(-self.size // self._world()[0])


def padding_share(order: Sequence[int], lengths: Sequence[int], batch_size: int) -> float:
    """The share of padding in the batches ``order`` makes (each padded to its longest example)."""
    lengths = torch.as_tensor(list(lengths), dtype=torch.long)[torch.as_tensor(list(order), dtype=torch.long)]
    padded = sum(len(batch) * int(batch.max()) for batch in lengths.split(batch_size) if len(batch))
    return 1 - int(lengths.sum()) / max(padded, 1)


def each_example_once(loader: DataLoader, world_size: int, rank: int) -> DataLoader:
    """``loader`` giving each example to exactly one rank (Lightning's padding repeats would count twice in Hits@k and
    the loss). Uneven ranks are safe in ``trainer.validate``: no DDP collectives per batch, metrics reduced at the
    end."""
    if world_size == 1 or isinstance(loader.sampler, DistributedSampler):
        return loader
    sampler = UnrepeatedDistributedSamplerWrapper(loader.sampler, num_replicas=world_size, rank=rank, shuffle=False)
    kept = ("batch_size", "num_workers", "collate_fn", "pin_memory", "worker_init_fn", "persistent_workers",
            "prefetch_factor")  # fmt: skip
    return DataLoader(loader.dataset, sampler=sampler, **{name: getattr(loader, name) for name in kept})


class EpochTagged(EpochShuffle):
    """:class:`EpochShuffle` yielding ``(epoch, index)``, from which the dataset draws the example's randomness
    (masked-LM masks): it reaches worker processes and is the same after a resume."""

    def __iter__(self):
        epoch = self.epoch
        return ((epoch, index) for index in super().__iter__())
