"""The training order, alone and as two DDP ranks: fixed by (seed, epoch), every example
once per epoch over the ranks, a resumed rank continuing exactly its uninterrupted share,
and used by Lightning as it is (a ``DistributedSampler``, so not wrapped)."""

from __future__ import annotations

from torch.utils.data import DataLoader, DistributedSampler

from mate_cli.data.sampler import EpochShuffle
from mate_cli.callbacks.resume_state import epoch_shuffles

SIZE, WORLD, BATCH = 23, 2, 3


def test_epochs_differ_and_each_example_is_served_once_per_epoch_over_the_ranks():
    first = [list(EpochShuffle(SIZE, seed=5, num_replicas=WORLD, rank=r)) for r in range(WORLD)]
    assert sorted(set(first[0] + first[1])) == list(range(SIZE)) and len(first[0]) == len(first[1]) == 12
    later = EpochShuffle(SIZE, seed=5, num_replicas=WORLD, rank=0)
    later.set_epoch(1)
    assert list(later) != first[0]
    assert list(EpochShuffle(SIZE, seed=5)) == EpochShuffle(SIZE, seed=5).order(0)  # one process: the whole order


def test_lightning_leaves_it_unwrapped_and_the_resume_state_finds_it():
    sampler = EpochShuffle(SIZE, seed=5)
    assert isinstance(sampler, DistributedSampler)  # Lightning wraps only samplers that are not
    assert epoch_shuffles([DataLoader(list(range(SIZE)), batch_size=BATCH, sampler=sampler)]) == [sampler]


def test_a_resumed_rank_continues_its_uninterrupted_share():
    done = 2 * BATCH  # examples each rank consumed before the kill
    for rank in range(WORLD):
        whole = list(EpochShuffle(SIZE, seed=5, num_replicas=WORLD, rank=rank))
        resumed = EpochShuffle(SIZE, seed=5, num_replicas=WORLD, rank=rank)
        resumed.skip_next(done * WORLD)  # what ResumeState passes: one rank's count x world size
        assert list(resumed) == whole[done:]


def test_length_buckets_serve_each_example_once_in_batches_of_similar_length():
    from mate_cli.data.sampler import BUCKET_WINDOW, padding_share

    size, batch = 2 * BUCKET_WINDOW * BATCH + 5, BATCH
    lengths = [(i * 37) % 500 + 10 for i in range(size)]
    bucketed = EpochShuffle(size, seed=5, lengths=lengths, batch_size=batch)
    order = bucketed.order(0)
    assert sorted(order) == list(range(size))  # every example, once
    assert order == EpochShuffle(size, seed=5, lengths=lengths, batch_size=batch).order(0)  # fixed by (seed, epoch)
    assert order != bucketed.order(1)
    plain = EpochShuffle(size, seed=5).order(0)
    assert padding_share(order, lengths, batch) < padding_share(plain, lengths, batch) / 4
    # the loader cuts whole groups: each batch lies within one sorted window's run of lengths
    full = order[: size - size % batch]
    assert sorted(padding_share(full[i : i + batch], lengths, batch) for i in range(0, len(full), batch))[-1] < 0.2


def test_length_buckets_give_each_rank_its_part_of_one_group_per_step_and_resume_exactly():
    lengths = [(i * 11) % 97 + 1 for i in range(SIZE)]
    shares = [list(EpochShuffle(SIZE, seed=3, num_replicas=WORLD, rank=r, lengths=lengths, batch_size=BATCH))
              for r in range(WORLD)]  # fmt: skip
    whole = EpochShuffle(SIZE, seed=3, num_replicas=WORLD, rank=0, lengths=lengths, batch_size=BATCH).order(0)
    step = whole[: BATCH * WORLD]  # the first group: what both ranks' first batches come from
    assert sorted(shares[0][:BATCH] + shares[1][:BATCH]) == sorted(step)
    resumed = EpochShuffle(SIZE, seed=3, num_replicas=WORLD, rank=1, lengths=lengths, batch_size=BATCH)
    resumed.skip_next(BATCH * WORLD)
    assert list(resumed) == shares[1][BATCH:]
