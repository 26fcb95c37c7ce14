"""index.json of an output folder, the checks made before any shard is read, and the id index
behind `lookup`.

Costs: `OutputIndex.open` reads index.json and (with the default `check="size"`) stats every
shard, which is cheap even for thousands of shards. `check="open"` also opens every shard with
HDF5 and compares its attributes (about a millisecond per shard); `check="sha256"` also hashes
every shard's bytes (the whole output is read once). The id index (`lookup`, and datasets built
from a list of ids) reads `/ids` of every shard once per process, about 20 bytes per id on the
disk, and keeps the ids sorted in one NumPy byte-string array (the longest id's length in bytes
per sample, plus 12 bytes) so that each lookup is a binary search, O(log N).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import h5py
import numpy as np

from .errors import (RERUN_FIX, DamagedShardError, FingerprintMismatchError, MissingShardError,
                     OutputError)

PathLike = Union[str, "os.PathLike[str]"]
CHECKS = ("none", "size", "open", "sha256")
# A shard's file name (docs/format.md): its index and the first digits of its SHA-256. Any other
# name in index.json (a path, "..") is a damaged or edited index, never a file to open.
SHARD_NAME = re.compile(r"shard-\d{6,18}-[0-9a-f]{8}\.h5")


def strings_sha256(values) -> str:
    """The digest a string dataset carries in its `sha256` attribute (docs/format.md): SHA-256
    over each row's length in bytes (8 bytes, little-endian) and its UTF-8 bytes."""
    digest = hashlib.sha256()
    for value in values:
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


def check_strings(shard_path: Path, dataset: h5py.Dataset, values) -> None:
    """Raises DamagedShardError when `values` (the rows of `dataset`, read whole) do not hash to
    its `sha256` attribute: HDF5 checksums no variable-length strings, so a flipped byte in an
    id or a kept column would otherwise read back as another id or label."""
    recorded = dataset.attrs.get("sha256")
    if recorded is None or strings_sha256(values) != recorded:
        raise DamagedShardError(shard_path, f"shard {shard_path}: {dataset.name} does not match "
                                f"its sha256 attribute ({'missing' if recorded is None else 'a string changed'}); "
                                f"{RERUN_FIX}")


@dataclass(frozen=True)
class ShardInfo:
    """One entry of index.json's `shards`, with its path resolved."""

    path: Path
    file: str
    first_seq: int
    seq_count: int
    num_samples: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ModalityInfo:
    """One entry of index.json's `modalities`."""

    name: str
    dim: int
    layout: str  # "pooled" or "per_step"
    encoder: str
    pooling: str


def open_shard(shard: ShardInfo, fingerprint: str, output_id: str = "",
               modalities: Optional[Dict[str, "ModalityInfo"]] = None) -> h5py.File:
    """Opens `shard` read-only and checks that it is a precompute shard of the output whose
    config fingerprint is `fingerprint` (and, given, whose output id is `output_id` and whose
    modalities' widths and layouts are `modalities`); raises DamagedShardError or
    FingerprintMismatchError naming the shard and the fix."""
    try:
        f = h5py.File(shard.path, "r")
    except FileNotFoundError:
        raise MissingShardError(shard.path, f"shard {shard.path} is listed in index.json but "
                                f"missing; {RERUN_FIX}") from None
    except OSError as e:
        raise DamagedShardError(shard.path, f"shard {shard.path} cannot be opened by HDF5 "
                                f"({e}): it is damaged or truncated; {RERUN_FIX}") from e
    try:
        if f.attrs.get("format") != "precompute-shard":
            raise DamagedShardError(shard.path, f"{shard.path} is not a precompute shard "
                                    f"(attribute format={f.attrs.get('format')!r}); {RERUN_FIX}")
        theirs = f.attrs.get("config_fingerprint")
        if theirs != fingerprint:
            raise FingerprintMismatchError(
                shard.path, f"shard {shard.path} was written with other settings "
                f"(config_fingerprint {theirs} instead of index.json's {fingerprint}): its "
                f"vectors do not mix with the rest of the output. Remove it and rerun "
                f"`precompute run` with the output's config to redo its range, or read the "
                f"two runs as separate outputs")
        if output_id and f.attrs.get("output_id") != output_id:
            raise FingerprintMismatchError(
                shard.path, f"shard {shard.path} belongs to another output (output_id "
                f"{f.attrs.get('output_id')!r} instead of index.json's {output_id}); "
                f"{RERUN_FIX}")
        for m in (modalities or {}).values():
            g = f.get(m.name)
            if g is None or int(g.attrs.get("dim", -1)) != m.dim or \
                    g.attrs.get("layout") != m.layout:
                raise DamagedShardError(shard.path, f"shard {shard.path}: its /{m.name} group "
                                        f"is not what index.json says (dim {m.dim}, layout "
                                        f"{m.layout}); {RERUN_FIX}")
        if int(f.attrs.get("first_seq", -1)) != shard.first_seq or len(f["ids"]) != \
                shard.num_samples:
            raise DamagedShardError(shard.path, f"shard {shard.path} does not hold what "
                                    f"index.json says (first_seq or sample count differ); "
                                    f"{RERUN_FIX}")
    except BaseException:
        f.close()
        raise
    return f


class OutputIndex:
    """An output folder's index.json, checked. Picklable (holds no open file)."""

    def __init__(self, out_dir: PathLike, check: str = "size",
                 allow_incomplete: bool = False) -> None:
        """Reads `out_dir/index.json` and checks the shards it lists.

        check: "none"; "size" (default: every shard exists and has the size index.json
        records); "open" (also opens each shard and compares its format, config fingerprint,
        first seq and sample count); "sha256" (also hashes every shard: reads the whole output).
        allow_incomplete: accept an output whose shards do not yet cover every input position
        (a run in progress or interrupted); otherwise that is an OutputError.
        """
        if check not in CHECKS:
            raise ValueError(f"check must be one of {CHECKS}, not {check!r}")
        self.out_dir = Path(out_dir)
        path = self.out_dir / "index.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise OutputError(f"{path} does not exist: {self.out_dir} is not a precompute "
                              f"output folder, or its run has not started (run `precompute "
                              f"run`)") from None
        except (OSError, ValueError) as e:
            raise OutputError(f"{path} cannot be read ({e}); rerun the same `precompute run` "
                              f"command to rebuild it from the shards") from e
        if raw.get("format") != "precompute-index" or raw.get("format_version") != 1:
            raise OutputError(f"{path} is not a precompute index of format version 1 "
                              f"(format={raw.get('format')!r}, "
                              f"format_version={raw.get('format_version')!r}); use a reader "
                              f"that matches the precompute that wrote it")
        self.raw: dict = raw
        self.config_fingerprint: str = raw["config_fingerprint"]
        self.output_id: str = raw.get("output_id", "")
        self.storage_dtype: str = raw["storage_dtype"]
        self.total_samples: int = int(raw["total_samples"])
        self.modalities: Dict[str, ModalityInfo] = {
            name: ModalityInfo(name, int(m["dim"]), m["layout"], m.get("encoder", ""),
                               m.get("pooling", ""))
            for name, m in raw["modalities"].items()}
        # output.keep_columns of the run: each shard's /columns/<name>, one string per row.
        output = (raw.get("config") or {}).get("output") or {}
        self.columns: List[str] = [str(c) for c in output.get("keep_columns", [])]
        shards = sorted(raw["shards"], key=lambda s: s["first_seq"])
        for s in shards:
            if not isinstance(s.get("file"), str) or not SHARD_NAME.fullmatch(s["file"]):
                raise OutputError(f"{path} is damaged: it lists a shard file {s.get('file')!r}, "
                                  f"which is not a shard name; rerun the same `precompute run` "
                                  f"command to rebuild it from the shards")
        self.shards: List[ShardInfo] = [
            ShardInfo(self.out_dir / s["file"], s["file"], int(s["first_seq"]),
                      int(s["seq_count"]), int(s["num_samples"]), int(s["bytes"]), s["sha256"])
            for s in shards]
        covered = sum(s.seq_count for s in self.shards)
        # A rank folder of a split job covers its span of the input, not all of it.
        rank = raw.get("rank") or {}
        wanted = int(rank["end_seq"]) - int(rank["first_seq"]) if rank else self.total_samples
        if covered != wanted and not allow_incomplete:
            raise OutputError(f"{path}: the committed shards cover {covered} of "
                              f"{wanted} input positions: the run is in progress or "
                              f"was interrupted. Rerun the same `precompute run` command to "
                              f"finish it, or pass allow_incomplete=True to read what is there")
        self.check(check)
        self._id_index: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]] = None

    def check(self, level: str = "size") -> None:
        """Checks the shards at `level` (see __init__); raises MissingShardError,
        DamagedShardError or FingerprintMismatchError naming the first bad shard."""
        if level == "none":
            return
        for shard in self.shards:
            try:
                size = shard.path.stat().st_size
            except FileNotFoundError:
                raise MissingShardError(shard.path, f"shard {shard.path} is listed in "
                                        f"index.json but missing; {RERUN_FIX}") from None
            if size != shard.bytes:
                raise DamagedShardError(shard.path, f"shard {shard.path} has {size} bytes, "
                                        f"index.json says {shard.bytes}: it is truncated or "
                                        f"was changed; {RERUN_FIX}")
            if level in ("open", "sha256"):
                self.open(shard).close()
            if level == "sha256":
                digest = hashlib.sha256()
                with open(shard.path, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                if digest.hexdigest() != shard.sha256:
                    raise DamagedShardError(shard.path, f"shard {shard.path}: sha256 "
                                            f"{digest.hexdigest()} differs from index.json's "
                                            f"{shard.sha256}: its bytes changed; {RERUN_FIX}")

    def open(self, shard: ShardInfo) -> h5py.File:
        """open_shard() with this output's fingerprint, output id and modalities."""
        return open_shard(shard, self.config_fingerprint, self.output_id, self.modalities)

    @property
    def num_samples(self) -> int:
        """Samples with at least one embedding (rows of every shard's /ids)."""
        return sum(s.num_samples for s in self.shards)

    def _build_id_index(self) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sorted ids (UTF-8 bytes) with their shard position (in `self.shards`) and row."""
        ids: List[np.ndarray] = []
        shard_of: List[np.ndarray] = []
        rows: List[np.ndarray] = []
        for k, shard in enumerate(self.shards):
            with self.open(shard) as f:
                try:
                    shard_ids = np.asarray(f["ids"][:], dtype=object)
                except OSError as e:
                    raise DamagedShardError(shard.path, f"reading /ids of {shard.path} "
                                            f"failed ({e}); {RERUN_FIX}") from e
                check_strings(shard.path, f["ids"], shard_ids)
            ids.append(shard_ids)
            shard_of.append(np.full(len(shard_ids), k, dtype=np.int32))
            rows.append(np.arange(len(shard_ids), dtype=np.int64))
        if not ids:
            empty = np.zeros(0, dtype="S1")
            return empty, np.zeros(0, np.int32), np.zeros(0, np.int64)
        all_ids = np.concatenate(ids).astype(bytes)  # fixed width: longest id
        order = np.argsort(all_ids, kind="stable")
        return all_ids[order], np.concatenate(shard_of)[order], np.concatenate(rows)[order]

    def locate(self, ids: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
        """Shard positions (into `self.shards`) and rows of `ids`; KeyError names the first id
        the output lacks. Builds the id index on first use (see the module docstring)."""
        if self._id_index is None:
            self._id_index = self._build_id_index()
        sorted_ids, shard_of, rows = self._id_index
        keys = np.array([i.encode("utf-8") for i in ids], dtype=bytes)
        if len(keys) == 0:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        where = np.searchsorted(sorted_ids, keys)
        inside = np.minimum(where, max(len(sorted_ids) - 1, 0))
        found = (where < len(sorted_ids)) & (sorted_ids[inside] == keys) if len(sorted_ids) else \
            np.zeros(len(keys), bool)
        if not found.all():
            missing = ids[int(np.flatnonzero(~found)[0])]
            raise KeyError(f"id {missing!r} is not embedded in {self.out_dir} (it failed in every "
                           f"modality, or is not in the run's input; see /failures or "
                           f"`precompute inspect`)")
        return shard_of[inside], rows[inside]

    def lookup(self, sample_id: str) -> Tuple[str, int]:
        """(shard file name, row) of `sample_id`, without scanning shards once the id index is
        built (the first call builds it: one read of every shard's /ids)."""
        shard, row = self.locate([sample_id])
        return self.shards[int(shard[0])].file, int(row[0])


def read_split_file(path: PathLike) -> List[str]:
    """Ids of a split file: one id per line (UTF-8), blank lines ignored."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f if line.strip()]
