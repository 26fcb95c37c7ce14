"""Read precompute's sharded HDF5 embeddings from PyTorch.

    from torch.utils.data import DataLoader
    from precompute import ShardDataset, collate
    data = ShardDataset("out", modalities=["video", "text"])
    loader = DataLoader(data, batch_size=256, shuffle=True, num_workers=4, collate_fn=collate)
    for batch in loader: ...  # batch["text"]["embedding"]: [B, dim]; see collate

ShardDataset: map-style, random access (ids, split files, `lookup`). ShardIterableDataset:
shard-order streaming with shuffling, split over DataLoader workers and distributed ranks.
Failures name the shard and the fix (errors.py). The schema is docs/format.md.
"""

from .collate import collate
from .dataset import ShardDataset
from .errors import (DamagedShardError, FingerprintMismatchError, MissingShardError, OutputError,
                     ShardError)
from .index import ModalityInfo, OutputIndex, ShardInfo
from .iterable import ShardIterableDataset, resolve_rank
from .reader import ShardReader

__version__ = "0.1.0"

__all__ = ["collate", "ShardDataset", "ShardIterableDataset", "OutputIndex", "ShardInfo",
           "ModalityInfo", "ShardReader", "OutputError", "ShardError", "MissingShardError",
           "DamagedShardError", "FingerprintMismatchError", "resolve_rank"]
