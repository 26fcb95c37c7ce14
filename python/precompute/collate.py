"""collate: a list of items (from either dataset) into one batch of tensors."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np
import torch

from .reader import Item


def collate(items: Sequence[Item]) -> Dict[str, Any]:
    """Batches items of ShardDataset / ShardIterableDataset:

    - `id`: list of str; `seq`: int64 [B];
    - `columns` (when the run kept manifest columns, output.keep_columns): `{name: list of str}`;
    - pooled modality: `{"embedding": [B, dim], "present": bool [B]}`;
    - per_step modality: `{"values": [B, T, dim]` zero-padded to the longest `T` of the batch,
      `"mask": bool [B, T]` (True on real steps), `"lengths": int64 [B]`, `"present": bool [B]`,
      and `"timestamps": float64 [B, T]` (zero-padded) where the items have them`}`.

    Values keep their stored dtype (float16 unless float32 was stored); cast on the device
    (`batch["text"]["embedding"].cuda().float()`).
    """
    if not items:
        raise ValueError("collate needs at least one item")
    batch: Dict[str, Any] = {
        "id": [it["id"] for it in items],
        "seq": torch.tensor([it["seq"] for it in items], dtype=torch.int64),
    }
    if "columns" in items[0]:
        batch["columns"] = {name: [it["columns"][name] for it in items]
                            for name in items[0]["columns"]}
    for name in items[0]:
        if name in ("id", "seq", "columns"):
            continue
        entries = [it[name] for it in items]
        present = torch.tensor([e["present"] for e in entries], dtype=torch.bool)
        if "embedding" in entries[0]:
            batch[name] = {"embedding": torch.from_numpy(np.stack([e["embedding"]
                                                                   for e in entries])),
                           "present": present}
            continue
        lengths = [len(e["values"]) for e in entries]
        longest = max(lengths)
        first = entries[0]["values"]
        values = np.zeros((len(entries), longest, first.shape[1]), dtype=first.dtype)
        mask = np.zeros((len(entries), longest), dtype=bool)
        for b, (e, n) in enumerate(zip(entries, lengths)):
            values[b, :n] = e["values"]
            mask[b, :n] = True
        out: Dict[str, torch.Tensor] = {
            "values": torch.from_numpy(values), "mask": torch.from_numpy(mask),
            "lengths": torch.tensor(lengths, dtype=torch.int64), "present": present}
        if "timestamps" in entries[0]:
            times = np.zeros((len(entries), longest), dtype=np.float64)
            for b, (e, n) in enumerate(zip(entries, lengths)):
                times[b, :n] = e["timestamps"]
            out["timestamps"] = torch.from_numpy(times)
        batch[name] = out
    return batch


__all__: List[str] = ["collate"]
