"""The optimizer of :mod:`tfdata.nn`: ``torch.optim.Adam`` over one flat parameter array."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._checks import check_float
from ._checks import (EPS_MIN, LR_MAX, T_MAX, check_betas, state_array, state_error, state_fields,
                      state_float, state_int)

__all__ = ["Adam"]


class Adam:
    """``torch.optim.Adam`` (no weight decay, no amsgrad) over one flat parameter array.

    Parameters
    ----------
    params : ndarray of float, shape (n_params,)
        Updated in place by :meth:`step`.
    lr : float, default 1e-3
        Finite, in (0, 1e3]: far above any useful rate, far below those whose step overflows
        (docs/design/nn.md).
    betas : (float, float), default (0.9, 0.999)
        Each in [0, 1).
    eps : float, default 1e-8
        Finite, >= float32's smallest normal (2**-126, about 1.2e-38): a smaller eps could
        overflow the step ``m / eps`` where the second moment has underflowed to 0.

    Raises
    ------
    TypeError, ValueError
        A hyperparameter of the wrong type or out of range (the message names it).

    Attributes
    ----------
    t : int
        Steps taken (bias corrections use ``t``); a loaded state holds at most 2**62, which
        leaves the kernels' int64 step number 2**62 updates of room.
    """

    def __init__(self, params: np.ndarray, *, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        if not isinstance(params, np.ndarray) or params.ndim != 1 or params.dtype.kind != "f":
            raise TypeError("params: expected a 1-D float ndarray, got "
                            f"{type(params).__name__} {getattr(params, 'shape', '')}")
        lr = check_float("lr", lr, 0.0, low_open=True, high=LR_MAX)
        eps = check_float("eps", eps, EPS_MIN)
        pair = check_betas(betas)
        if pair is None:
            raise ValueError(f"betas must be two floats in [0, 1), got {betas!r}")
        self.params = params
        self.lr, self.betas, self.eps = lr, pair, eps
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0
        from . import _mlp_kernels  # imports numba: only when an optimizer is built

        self._k = _mlp_kernels

    def step(self, grad: np.ndarray) -> None:
        """Apply one update with gradient ``grad`` (same shape and dtype as ``params``)."""
        if grad.shape != self.params.shape or grad.dtype != self.params.dtype:
            raise ValueError(f"grad: expected {self.params.dtype} of shape {self.params.shape}, "
                             f"got {grad.dtype} of shape {grad.shape}")
        self.t += 1
        self._k.adam_step(self.params, grad, self.m, self.v, self.lr, self.betas[0],
                          self.betas[1], self.eps, self.t)

    def state_dict(self) -> dict:
        return {"t": self.t, "m": self.m.copy(), "v": self.v.copy(), "lr": self.lr,
                "betas": list(self.betas), "eps": self.eps}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field, and nothing changed, when anything is missing or out of range (as for the
        constructor, but ``lr`` may be 0: a rate annealed to 0; ``t`` in [0, 2**62]; ``m`` and
        ``v`` finite, ``v >= 0``)."""
        self.load_state(self.check_state(state))

    def check_state(self, state, prefix: str = "") -> tuple:
        """The values of ``state``, checked as :meth:`load_state_dict` checks them (fields named
        ``prefix + key``), for :meth:`load_state`; nothing is changed."""
        state_fields(state, ("t", "m", "v", "lr", "betas", "eps"), prefix)
        m = state_array(prefix + "m", state["m"], self.m)
        v = state_array(prefix + "v", state["v"], self.v, nonneg=True)
        t = state_int(prefix + "t", state["t"], 0, T_MAX)
        lr = state_float(prefix + "lr", state["lr"], 0.0, LR_MAX)
        betas = check_betas(state["betas"])
        if betas is None:
            raise state_error(prefix + "betas", "two floats in [0, 1)", repr(state["betas"]))
        eps = state_float(prefix + "eps", state["eps"], EPS_MIN)
        return m, v, t, lr, betas, eps

    def load_state(self, checked: tuple) -> None:
        """Take the values :meth:`check_state` returned."""
        m, v, self.t, self.lr, self.betas, self.eps = checked
        self.m[...] = m
        self.v[...] = v
