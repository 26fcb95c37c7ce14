"""Reading rows of shards: per-process HDF5 handles and coalesced reads. Both datasets use it.

Note [Handles per process]: an h5py file handle must not cross a process boundary. A DataLoader
worker made by `fork` inherits the parent's open handles, and reading through them from two
processes shares one file offset and HDF5's caches (wrong rows, or a deadlock); `spawn` pickles
the dataset, and an open h5py file cannot be pickled. So a ShardReader opens files lazily, notes
the pid that opened them, drops every handle when `os.getpid()` changes, and leaves them out
when pickled. Opening is cheap (about a millisecond) and happens once per shard per process; at
most `max_open_files` stay open (least recently used closed first).

Note [Coalesced reads]: every h5py read has a fixed cost (tens of microseconds) whatever its
size, so rows wanted together are sorted by shard and row. A shard's small per-row arrays (ids,
seq, presence flags, per-step offsets, kept columns) are read whole once per process and kept.
Pooled vectors are read as one slice from the first to the last wanted row of a shard (up to
`slice_bytes`, 32 MiB): HDF5 reads and checksums whole chunks (256 rows) anyway, and a random
batch touches most chunks of each shard, so one call that copies some rows too many beats one
call per row run (h5py's point selections are slower still). Longer spans, and per-step values,
whose rows differ in length, are read as slices over runs of rows no more than `coalesce_gap`
apart, then picked out in memory. One read per run of rows and array gave random batches about a
sixth of this rate (docs/benchmarks.md, "The reader").
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import h5py
import numpy as np

from .errors import RERUN_FIX, DamagedShardError
from .index import ModalityInfo, OutputIndex, check_strings

Item = Dict[str, Any]


class ShardReader:
    """Reads samples (shard position, row) of one output as item dicts. Safe to use from one
    thread per process; picklable (handles are reopened after unpickling)."""

    def __init__(self, index: OutputIndex, modalities: Optional[Sequence[str]] = None,
                 coalesce_gap: int = 32, max_open_files: int = 128,
                 slice_bytes: int = 32 << 20) -> None:
        self.index = index
        names = list(index.modalities) if modalities is None else list(modalities)
        unknown = [m for m in names if m not in index.modalities]
        if unknown:
            raise ValueError(f"{index.out_dir} has no modality {unknown[0]!r}; it has "
                             f"{sorted(index.modalities)}")
        self.modalities: List[ModalityInfo] = [index.modalities[m] for m in names]
        self.coalesce_gap = coalesce_gap
        self.slice_bytes = slice_bytes
        self.max_open_files = max_open_files
        self._files: "OrderedDict[int, h5py.File]" = OrderedDict()
        self._rows: Dict[int, _ShardRows] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = OrderedDict()
        state["_rows"] = {}
        state["_pid"] = -1
        return state

    def _file(self, k: int) -> h5py.File:
        """The open handle of shard `k` in this process (Note [Handles per process])."""
        if self._pid != os.getpid():
            # Inherited through fork: forget, never read through, the parent's handles.
            self._files = OrderedDict()
            self._rows = {}
            self._pid = os.getpid()
        f = self._files.get(k)
        if f is None:
            f = self.index.open(self.index.shards[k])
            self._files[k] = f
            while len(self._files) > self.max_open_files:
                closed, handle = self._files.popitem(last=False)
                handle.close()
                self._rows.pop(closed, None)
        else:
            self._files.move_to_end(k)
        return f

    def close(self) -> None:
        """Closes this process's handles (they reopen on the next read)."""
        if self._pid == os.getpid():
            for f in self._files.values():
                f.close()
        self._files = OrderedDict()
        self._rows = {}

    def _shard_rows(self, k: int, f: h5py.File) -> "_ShardRows":
        """The per-row arrays of shard k, read whole once per process (they are small: about
        30 bytes a sample and modality)."""
        cached = self._rows.get(k)
        if cached is None:
            path = self.index.shards[k].path
            ids = f["ids"].asstr()[:]
            check_strings(path, f["ids"], ids)  # Note [Digests of string datasets]
            columns = {}
            for name in self.index.columns:
                columns[name] = f["columns"][name].asstr()[:]
                check_strings(path, f["columns"][name], columns[name])
            cached = _ShardRows(
                ids=ids,
                seq=f["seq"][:],
                present={m.name: f[m.name]["present"][:].astype(bool) for m in self.modalities},
                offsets={m.name: f[m.name]["offsets"][:] for m in self.modalities
                         if m.layout != "pooled"},
                columns=columns)
            self._rows[k] = cached
        return cached

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
            return self._read_rows(f, k, rows)
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

    def _read_rows(self, f: h5py.File, k: int, rows: np.ndarray) -> List[Item]:
        meta = self._shard_rows(k, f)
        items: List[Item] = [{"id": str(meta.ids[r]), "seq": int(meta.seq[r])} for r in rows]
        if meta.columns:
            # Kept manifest columns (output.keep_columns), as str.
            for item, r in zip(items, rows):
                item["columns"] = {name: str(values[r]) for name, values in meta.columns.items()}
        for m in self.modalities:
            g = f[m.name]
            present = meta.present[m.name]
            if m.layout == "pooled":
                vectors = g["embeddings"]
                lo, hi = int(rows[0]), int(rows[-1]) + 1
                if (hi - lo) * vectors.dtype.itemsize * m.dim <= self.slice_bytes:
                    # One slice over every wanted row: HDF5 reads each chunk in it once.
                    block = vectors[lo:hi]
                    for item, r in zip(items, rows):
                        item[m.name] = {"embedding": block[r - lo], "present": bool(present[r])}
                    continue
                at = 0
                for run_lo, run_hi, wanted in self._runs(rows):
                    block = vectors[run_lo:run_hi]
                    for r in wanted:
                        items[at][m.name] = {"embedding": block[r],
                                             "present": bool(present[run_lo + r])}
                        at += 1
                continue
            offsets = meta.offsets[m.name]
            has_times = "timestamps" in g
            at = 0
            for lo, hi, wanted in self._runs(rows):
                base, end = int(offsets[lo]), int(offsets[hi])
                values = g["values"][base:end]
                times = g["timestamps"][base:end] if has_times else None
                for r in wanted + lo:
                    a, b = int(offsets[r]) - base, int(offsets[r + 1]) - base
                    entry = {"values": values[a:b], "present": bool(present[r])}
                    if times is not None:
                        entry["timestamps"] = times[a:b]
                    items[at][m.name] = entry
                    at += 1
        return items


@dataclass
class _ShardRows:
    """A shard's per-row arrays, kept per process by ShardReader."""

    ids: np.ndarray
    seq: np.ndarray
    present: Dict[str, np.ndarray]
    offsets: Dict[str, np.ndarray]
    columns: Dict[str, np.ndarray]
