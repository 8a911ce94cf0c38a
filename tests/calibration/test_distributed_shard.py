"""Sharding of calibration batches over ranks: contiguous blocks covering every batch once, in
order, the first ranks taking the remainder (hand-worked cases and an exhaustive check)."""
from __future__ import annotations

from amct_torch.calibration.distributed import DistContext, init_distributed, shard_range


def test_hand_worked():
    assert [shard_range(5, r, 2) for r in range(2)] == [(0, 3), (3, 5)]
    assert [shard_range(7, r, 3) for r in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [shard_range(1, r, 4) for r in range(4)] == [(0, 1), (1, 1), (1, 1), (1, 1)]


def test_blocks_partition_in_order():
    for n in range(0, 40):
        for world in range(1, 9):
            blocks = [shard_range(n, r, world) for r in range(world)]
            covered = [i for a, b in blocks for i in range(a, b)]
            assert covered == list(range(n))
            sizes = [b - a for a, b in blocks]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_outside_torchrun_is_single_process(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ctx = init_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.is_writer, ctx.active) == (0, 1, True, False)
    assert not ctx.owns_group
    assert DistContext(rank=1, world_size=2).is_writer is False
