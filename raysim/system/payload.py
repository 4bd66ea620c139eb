"""The size in bytes of what the server broadcasts, so the downlink is counted like the uplink."""
from __future__ import annotations

import dataclasses
import pickle
from numbers import Number
from typing import Any

import numpy as np
import torch


def payload_bytes(obj: Any) -> int:
    """Bytes of the numbers a payload carries: arrays and tensors by their buffers, containers and
    dataclasses by their contents, a scalar as 8, None as 0, anything else as its pickle."""
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (Number, np.generic)):
        return 8
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj)
    if isinstance(obj, dict):
        return sum(payload_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_bytes(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(payload_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return len(pickle.dumps(obj, protocol=5))
