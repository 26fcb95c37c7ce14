"""Exceptions of the reader. Every message names the output folder or shard and says how to fix
the problem."""

from __future__ import annotations


class OutputError(Exception):
    """An output folder that the reader cannot use (no or unreadable index.json, a run that is
    not finished, an unknown format version)."""


class ShardError(OutputError):
    """A problem with one shard; `shard` is its path."""

    def __init__(self, shard: str, message: str) -> None:
        super().__init__(message)
        self.shard = shard


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
