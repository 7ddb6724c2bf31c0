"""A dataset factory whose training set has one sample that makes any loss non-finite: a loss scaler skips its step."""

from __future__ import annotations

import numpy as np
import torch

from psframework.data.synthetic import make_synthetic


def with_an_overflow(index: int = 5, size: int = 16, train_size: int = 512) -> tuple:
    """Return synthetic 1 x size x size images whose training sample `index` holds an infinite pixel (an overflow
    upstream, as fp16 activations have)."""
    train_x, train_y, test_x, test_y = make_synthetic(1, size, size, 10, train_size, 128, seed=0)
    train_x = train_x.astype(np.float32)
    train_x[index, 0, size // 2, size // 2] = np.inf
    pair = (lambda x, y: (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y)))
    return pair(train_x, train_y), pair(test_x, test_y), 10
