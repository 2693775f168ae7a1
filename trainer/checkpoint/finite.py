"""No checkpoint carries divergence: a save refuses a model or optimizer state holding NaN/Inf, and a
checkpoint written without that check is read and checked before a resume.

    first_nonfinite(model, optimizer)      # this rank's own shard: the first non-finite tensor's name | None
    nonfinite_in_checkpoint(info)          # the launcher's preflight before a resume: DCP key + value | None
    FINITE_KEY                             # the COMPLETE marker's key: this save checked every tensor
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from trainer.checkpoint.layout import MARKER, CheckpointInfo

if TYPE_CHECKING:  # torch is imported where a tensor is read: the launcher's check of a marked checkpoint
    import torch  # (every checkpoint this version writes) needs none

FINITE_KEY = "finite"  # COMPLETE marker key: this version checked every tensor before the save


def _word(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def first_nonfinite(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """The first parameter or optimizer moment whose shard on this rank holds a non-finite value; None
    when all are finite. One device->host sync for the whole check."""
    import torch

    named = [(name, p) for name, p in model.named_parameters()]
    names = {id(p): name for name, p in named}
    tensors = [(name, _local(p.detach())) for name, p in named]
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                tensors.append((f"optimizer {key} of {names.get(id(param), '?')}", _local(value)))
    tensors = [(n, t) for n, t in tensors if t.numel() > 0]
    if not tensors:
        return None
    finite = torch.stack([torch.isfinite(t).all() for _, t in tensors])
    if bool(finite.all()):
        return None
    return tensors[int((~finite).nonzero()[0])][0]


def nonfinite_in_checkpoint(info: CheckpointInfo, batch_bytes: int = 1 << 30) -> str | None:
    """A tensor of checkpoint `info` holding NaN/Inf (its DCP key and the value), or None. A checkpoint
    whose COMPLETE marker says `finite` was checked tensor by tensor before it was written and is not
    read again; any other (an older version's, one made by hand) is read, `batch_bytes` at a time."""
    marker = json.loads((info.path / MARKER).read_text())
    if marker.get(FINITE_KEY) is True:
        return None
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(str(info.path)).read_metadata()
    batch: dict[str, torch.Tensor] = {}
    size = 0
    items = [(k, m) for k, m in metadata.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)]
    for index, (key, meta) in enumerate(items):
        dtype = meta.properties.dtype
        if dtype.is_floating_point:
            batch[key] = torch.empty(meta.size, dtype=dtype)
            size += batch[key].numel() * batch[key].element_size()
        if batch and (size >= batch_bytes or index == len(items) - 1):
            dcp.load(batch, checkpoint_id=str(info.path), no_dist=True)
            for name, tensor in batch.items():
                bad = tensor[~torch.isfinite(tensor)]
                if bad.numel():
                    return f"{name} ({bad.numel()} non-finite values, e.g. {_word(float(bad[0]))})"
            batch, size = {}, 0
    return None
