"""Exceptions of the reader. Every message names the output folder or shard and says how to fix
the problem."""

from __future__ import annotations


class OutputError(Exception):
    """An output folder that the reader cannot use (no or unreadable index.json, a run that is
    not finished, an unknown format version)."""


class ShardError(OutputError):
    """A problem with one shard; `shard` is its path. (The message comes first and alone is
    enough to construct one, so that a DataLoader re-raises it from a worker with its type.)"""

    def __init__(self, shard_or_message: object, message: str = "") -> None:
        # (shard, message) when raised here; (message) alone when a DataLoader re-raises it.
        super().__init__(message or str(shard_or_message))
        self.shard = str(shard_or_message) if message else ""


class MissingShardError(ShardError):
    """A shard that index.json lists is not in the folder."""


class DamagedShardError(ShardError):
    """A shard whose size or sha256 differs from index.json, that HDF5 cannot open, or whose
    data fails HDF5's Fletcher-32 checksums while being read."""


class FingerprintMismatchError(ShardError):
    """A shard written with other settings (another `config_fingerprint`) than the rest of the
    output: its vectors are not comparable with the others'."""


RERUN_FIX = ("rerun the same `precompute run --config ...` command on this output folder: a "
             "resume checks every shard against index.json and redoes damaged or missing ones "
             "(`precompute inspect OUT` lists them)")
