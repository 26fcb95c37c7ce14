"""ShardIterableDataset: shard-order streaming, split across DataLoader workers and ranks."""

from __future__ import annotations

import os
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np
import torch.utils.data

from .dataset import IdsArg, select_samples
from .index import OutputIndex, PathLike
from .reader import Item, ShardReader


def resolve_rank(rank: Optional[int], world_size: Optional[int]) -> Tuple[int, int]:
    """(rank, world size): the arguments, else the RANK / WORLD_SIZE environment variables
    (torchrun sets them), else an initialised torch.distributed group, else (0, 1)."""
    if rank is None or world_size is None:
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            env = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        elif torch.distributed.is_available() and torch.distributed.is_initialized():
            env = torch.distributed.get_rank(), torch.distributed.get_world_size()
        else:
            env = 0, 1
        rank = env[0] if rank is None else rank
        world_size = env[1] if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    return rank, world_size


class ShardIterableDataset(torch.utils.data.IterableDataset):
    """Streams the samples of an output folder shard by shard: items as in ShardDataset.

    Every epoch the selected samples are laid out in shard order (the order of the shards
    shuffled with `seed` and the epoch when `shuffle`; rows ascending inside a shard) and cut
    into `world_size * num_workers` contiguous, equal parts (they differ by at most one
    sample); each DataLoader worker of each rank reads its own part, `read_rows` rows per
    coalesced read, and with `shuffle` passes it through a shuffle buffer of `buffer_size`
    items. So every sample comes exactly once per epoch over all ranks and workers, and each
    worker opens only the few shards of its part.

    Call `set_epoch(epoch)` before each epoch (as with DistributedSampler) to get a new order;
    with `persistent_workers=True` the workers keep the epoch they started with. Ranks may get
    one sample more or fewer than others: with DistributedDataParallel, stop every rank after
    `len(dataset) // batch_size` steps of the smallest rank if it must see equal step counts.
    """

    def __init__(self, out_dir: PathLike, modalities: Optional[Sequence[str]] = None,
                 ids: IdsArg = None, shuffle: bool = True, seed: int = 0,
                 buffer_size: int = 1024, read_rows: int = 256, rank: Optional[int] = None,
                 world_size: Optional[int] = None, check: str = "size",
                 allow_incomplete: bool = False) -> None:
        """Arguments as in ShardDataset, plus: shuffle (shards and, through the buffer, rows),
        seed, buffer_size (items held for row shuffling), read_rows (rows per read), rank and
        world_size (default: RANK / WORLD_SIZE, or torch.distributed; see resolve_rank)."""
        self.index = OutputIndex(out_dir, check=check, allow_incomplete=allow_incomplete)
        self.reader = ShardReader(self.index, modalities)
        shards, rows = select_samples(self.index, ids)
        order = np.lexsort((rows, shards))
        self._shards, self._rows = shards[order], rows[order]
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.buffer_size, self.read_rows = max(1, buffer_size), max(1, read_rows)
        self.rank, self.world_size = resolve_rank(rank, world_size)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's order (same on every rank for the same seed and epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Samples this rank yields per epoch (over all its workers)."""
        n = len(self._rows)
        return (self.rank + 1) * n // self.world_size - self.rank * n // self.world_size

    def part(self, worker: int = 0, num_workers: int = 1) -> Tuple[np.ndarray, np.ndarray]:
        """(shard positions, rows) this rank's `worker` reads this epoch, in reading order."""
        if self.shuffle and len(self.index.shards) > 1:
            rng = np.random.default_rng([self.seed, self.epoch])
            rank_of_shard = np.argsort(rng.permutation(len(self.index.shards)))
            order = np.lexsort((self._rows, rank_of_shard[self._shards]))
            shards, rows = self._shards[order], self._rows[order]
        else:
            shards, rows = self._shards, self._rows
        parts = self.world_size * num_workers
        c = self.rank * num_workers + worker
        lo, hi = c * len(rows) // parts, (c + 1) * len(rows) // parts
        return shards[lo:hi], rows[lo:hi]

    def __iter__(self) -> Iterator[Item]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        shards, rows = self.part(worker, num_workers)
        if not self.shuffle:
            for lo in range(0, len(rows), self.read_rows):
                yield from self.reader.read(shards[lo:lo + self.read_rows],
                                            rows[lo:lo + self.read_rows])
            return
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
        buffer: list = []
        for lo in range(0, len(rows), self.read_rows):
            for item in self.reader.read(shards[lo:lo + self.read_rows],
                                         rows[lo:lo + self.read_rows]):
                if len(buffer) < self.buffer_size:
                    buffer.append(item)
                    continue
                j = int(rng.integers(len(buffer)))
                buffer[j], item = item, buffer[j]
                yield item
        rng.shuffle(buffer)  # type: ignore[arg-type]
        yield from buffer
