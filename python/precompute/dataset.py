"""ShardDataset: random access to the samples of one output folder."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch.utils.data

from .index import OutputIndex, PathLike, read_split_file
from .reader import Item, ShardReader

IdsArg = Union[None, Sequence[str], PathLike]


def select_samples(index: OutputIndex, ids: IdsArg) -> Tuple[np.ndarray, np.ndarray]:
    """(shard positions, rows) of the samples to read: every embedded sample in input order
    when `ids` is None, else those ids in the order given (a str or path is a split file with
    one id per line). An id the output lacks is a KeyError."""
    if ids is None:
        counts = [s.num_samples for s in index.shards]
        shards = np.repeat(np.arange(len(counts), dtype=np.int32), counts)
        rows = np.concatenate([np.arange(c, dtype=np.int64) for c in counts]) if counts else \
            np.zeros(0, np.int64)
        return shards, rows
    if isinstance(ids, (str, bytes)) or hasattr(ids, "__fspath__"):
        try:
            return index.locate(read_split_file(ids))  # type: ignore[arg-type]
        except KeyError as e:
            raise KeyError(f"split file {ids}: {e.args[0]}") from None
    return index.locate(list(ids))  # type: ignore[arg-type]


class ShardDataset(torch.utils.data.Dataset):
    """Map-style dataset over an output folder; item `i` is a dict:

    - `id` (str) and `seq` (int, the input position);
    - `columns`, when the run kept manifest columns (`output.keep_columns`): `{name: str}`;
    - per modality, a dict: pooled layout `{"embedding": [dim], "present": bool}` (zeros when
      absent); per_step layout `{"values": [steps, dim], "present": bool}` plus `"timestamps":
      [steps]` (float64 seconds) for video and audio (zero steps when absent).

    Arrays are NumPy in the stored dtype (float16 unless the run stored float32); `collate`
    turns a list of items into padded tensors. Handles open lazily in each process, so the
    dataset works with any `num_workers` and both `fork` and `spawn`. A DataLoader with
    `batch_size` fetches a batch through `__getitems__`, one coalesced read per run of
    neighbouring rows.
    """

    def __init__(self, out_dir: PathLike, modalities: Optional[Sequence[str]] = None,
                 ids: IdsArg = None, check: str = "size", allow_incomplete: bool = False,
                 coalesce_gap: int = 32) -> None:
        """out_dir: a precompute output folder. modalities: names to read (default: every
        modality the run computed). ids: None (every embedded sample, in input order), a list
        of ids, or a split file (one id per line); the dataset follows its order. check:
        what is verified now, see OutputIndex ("size" by default: cheap). Raises
        MissingShardError / DamagedShardError / FingerprintMismatchError naming the shard."""
        self.index = OutputIndex(out_dir, check=check, allow_incomplete=allow_incomplete)
        self.reader = ShardReader(self.index, modalities, coalesce_gap=coalesce_gap)
        self._shards, self._rows = select_samples(self.index, ids)

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> Item:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} samples")
        i %= len(self)
        return self.reader.read(self._shards[i:i + 1], self._rows[i:i + 1])[0]

    def __getitems__(self, indices: Sequence[int]) -> List[Item]:
        """Items of `indices` in their order, read with coalesced slices (DataLoader calls this
        with a whole batch of indices)."""
        where = np.asarray(indices, dtype=np.int64)
        return self.reader.read(self._shards[where], self._rows[where])

    def lookup(self, sample_id: str) -> Tuple[str, int]:
        """(shard file, row) of `sample_id`; see OutputIndex.lookup for the cost."""
        return self.index.lookup(sample_id)

    @property
    def modalities(self) -> List[str]:
        return [m.name for m in self.reader.modalities]
