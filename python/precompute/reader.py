"""Reading rows of shards: per-process HDF5 handles and coalesced reads. Both datasets use it.

Note [Handles per process]: an h5py file handle must not cross a process boundary. A DataLoader
worker made by `fork` inherits the parent's open handles, and reading through them from two
processes shares one file offset and HDF5's caches (wrong rows, or a deadlock); `spawn` pickles
the dataset, and an open h5py file cannot be pickled. So a ShardReader opens files lazily, notes
the pid that opened them, drops every handle when `os.getpid()` changes, and leaves them out
when pickled. Opening is cheap (about a millisecond) and happens once per shard per process; at
most `max_open_files` stay open (least recently used closed first).

Note [Coalesced reads]: every h5py read has a fixed cost (tens of microseconds) whatever its
size, so rows wanted together are sorted by shard and row, and rows no more than
`coalesce_gap` apart are read as one slice, then picked out in memory.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import h5py
import numpy as np

from .errors import RERUN_FIX, DamagedShardError
from .index import ModalityInfo, OutputIndex, open_shard

Item = Dict[str, Any]


class ShardReader:
    """Reads samples (shard position, row) of one output as item dicts. Safe to use from one
    thread per process; picklable (handles are reopened after unpickling)."""

    def __init__(self, index: OutputIndex, modalities: Optional[Sequence[str]] = None,
                 coalesce_gap: int = 32, max_open_files: int = 128) -> None:
        self.index = index
        names = list(index.modalities) if modalities is None else list(modalities)
        unknown = [m for m in names if m not in index.modalities]
        if unknown:
            raise ValueError(f"{index.out_dir} has no modality {unknown[0]!r}; it has "
                             f"{sorted(index.modalities)}")
        self.modalities: List[ModalityInfo] = [index.modalities[m] for m in names]
        self.coalesce_gap = coalesce_gap
        self.max_open_files = max_open_files
        self._files: "OrderedDict[int, h5py.File]" = OrderedDict()
        self._pid = os.getpid()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = OrderedDict()
        state["_pid"] = -1
        return state

    def _file(self, k: int) -> h5py.File:
        """The open handle of shard `k` in this process (Note [Handles per process])."""
        if self._pid != os.getpid():
            # Inherited through fork: forget, never read through, the parent's handles.
            self._files = OrderedDict()
            self._pid = os.getpid()
        f = self._files.get(k)
        if f is None:
            f = open_shard(self.index.shards[k], self.index.config_fingerprint)
            self._files[k] = f
            while len(self._files) > self.max_open_files:
                self._files.popitem(last=False)[1].close()
        else:
            self._files.move_to_end(k)
        return f

    def close(self) -> None:
        """Closes this process's handles (they reopen on the next read)."""
        if self._pid == os.getpid():
            for f in self._files.values():
                f.close()
        self._files = OrderedDict()

    def read(self, shards: np.ndarray, rows: np.ndarray) -> List[Item]:
        """Items of the samples (shards[i], rows[i]), in the order given
        (Note [Coalesced reads])."""
        items: List[Optional[Item]] = [None] * len(rows)
        order = np.lexsort((rows, shards))
        start = 0
        while start < len(order):
            k = int(shards[order[start]])
            end = start
            while end < len(order) and shards[order[end]] == k:
                end += 1
            picked = order[start:end]
            for pos, item in zip(picked, self._read_shard(k, rows[picked])):
                items[pos] = item
            start = end
        return items  # type: ignore[return-value]

    def _read_shard(self, k: int, rows: np.ndarray) -> List[Item]:
        """Items of ascending `rows` of shard k."""
        f = self._file(k)
        try:
            return [item for lo, hi, wanted in self._runs(rows)
                    for item in self._read_run(f, k, lo, hi, wanted)]
        except OSError as e:  # Fletcher-32 mismatch, truncated data, I/O error
            path = self.index.shards[k].path
            raise DamagedShardError(path, f"reading shard {path} failed ({e}): it is "
                                    f"damaged; {RERUN_FIX}") from e

    def _runs(self, rows: np.ndarray) -> List[Tuple[int, int, np.ndarray]]:
        """Ascending rows cut into slices [lo, hi) whose rows lie at most coalesce_gap apart."""
        runs = []
        start = 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or rows[i] - rows[i - 1] > self.coalesce_gap:
                lo, hi = int(rows[start]), int(rows[i - 1]) + 1
                runs.append((lo, hi, rows[start:i] - lo))
                start = i
        return runs

    def _read_run(self, f: h5py.File, k: int, lo: int, hi: int,
                  wanted: np.ndarray) -> List[Item]:
        ids = f["ids"].asstr()[lo:hi]
        seq = f["seq"][lo:hi]
        items: List[Item] = [{"id": str(ids[r]), "seq": int(seq[r])} for r in wanted]
        if self.index.columns:
            # Kept manifest columns (output.keep_columns), as str.
            kept = {name: f["columns"][name].asstr()[lo:hi] for name in self.index.columns}
            for item, r in zip(items, wanted):
                item["columns"] = {name: str(values[r]) for name, values in kept.items()}
        for m in self.modalities:
            g = f[m.name]
            present = g["present"][lo:hi]
            if m.layout == "pooled":
                vectors = g["embeddings"][lo:hi]
                for item, r in zip(items, wanted):
                    item[m.name] = {"embedding": vectors[r], "present": bool(present[r])}
                continue
            offsets = g["offsets"][lo:hi + 1]
            base = int(offsets[0])
            values = g["values"][base:int(offsets[-1])]
            times = g["timestamps"][base:int(offsets[-1])] if "timestamps" in g else None
            for item, r in zip(items, wanted):
                a, b = int(offsets[r]) - base, int(offsets[r + 1]) - base
                entry = {"values": values[a:b], "present": bool(present[r])}
                if times is not None:
                    entry["timestamps"] = times[a:b]
                item[m.name] = entry
        return items
