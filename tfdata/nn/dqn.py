"""The value-based learner of :mod:`tfdata.nn`: CleanRL's DQN over a ReLU :class:`~.mlp.MLP`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._checks import check_unit
from ._checks import state_error, state_fields
from .adam import Adam
from .mlp import MLP

__all__ = ["DQN"]


class DQN:
    """Deep Q-learning: an online and a target :class:`MLP`, Adam, and the squared TD loss.

    The update is CleanRL's ``dqn.py``: target ``r + gamma * (1 - terminated) * max_a
    Q_target(next_obs, a)``, loss ``mse(Q(obs, action), target)``, one Adam step. Batches from an
    n-step buffer bring their own ``discounts`` (``gamma ** k``); batches from a prioritized
    buffer their importance ``weights`` (the loss becomes ``mean(w * err ** 2)``, and
    :attr:`td_errors` holds the new priorities).

    Parameters
    ----------
    sizes : sequence of int
        Q-network layer sizes, observation size first, number of actions last.
    lr : float, default 2.5e-4
        Finite, in (0, 1e3] (see :class:`Adam`).
    gamma : float, default 0.99
        In [0, 1].
    betas, eps
        Adam's (see :class:`Adam` for their ranges).
    seed : int, optional
        Seed of the initialisation, in [0, 2**64) (the target starts as a copy of the online
        network).

    Raises
    ------
    TypeError, ValueError
        An argument of the wrong type or out of range (the message names it).
    """

    def __init__(self, sizes: Sequence[int], *, lr: float = 2.5e-4, gamma: float = 0.99,
                 betas=(0.9, 0.999), eps: float = 1e-8, seed: int | None = None):
        self.gamma = check_unit("gamma", gamma)
        self.online = MLP(sizes, seed=seed)
        self.target = MLP(sizes)
        self.target.copy_from(self.online)
        self.optim = Adam(self.online.params, lr=lr, betas=betas, eps=eps)
        self._x1 = np.zeros((1, self.online.n_in), dtype=np.float32)
        self._act_ws = self.online.workspace(1)
        # act's Q-values: the output block of its batch-of-one workspace
        q0 = int(self.online.table[-1, 4])
        self._q1 = self._act_ws[0][q0:q0 + self.online.n_out]
        self._obs_shape = (self.online.n_in,)
        self._ws: dict[int, tuple] = {}
        self.td_errors = np.zeros(0, dtype=np.float32)
        from . import _mlp_kernels  # imports numba: only when a learner is built

        self._k = _mlp_kernels

    def act(self, obs) -> int:
        """The greedy action for one observation (shape (n_in,)).

        Raises ValueError when the Q-values are not finite (NaN or inf in ``obs`` or in the
        parameters): no action is the greedy one then."""
        if np.shape(obs) != self._obs_shape:
            raise ValueError(f"obs: expected shape {self._obs_shape}, got {np.shape(obs)}")
        self._x1[0] = obs  # one copy into float32, no allocation
        net = self.online
        acts, _, out, idx, coef, tmp = self._act_ws
        # straight to the kernel: _x1 is this object's own, of the right shape and dtype
        self._k.mlp_argmax(net.params, net.table, self._x1, acts, tmp, idx, coef, out)
        if not np.isfinite(self._q1).all():
            raise ValueError(f"obs: the Q-values are {self._q1.tolist()} (NaN or inf in obs "
                             f"{self._x1[0].tolist()} or in the parameters); no action is greedy")
        return int(out[0])

    def _workspace(self, batch: int) -> tuple:
        ws = self._ws.get(batch)
        if ws is None:
            n_out = self.online.n_out
            ws = self._ws[batch] = (
                np.zeros((batch, n_out), np.float32),          # grad_out
                np.zeros(batch, np.float32),                   # |td|
                np.full(batch, self.gamma, np.float32),        # one-step discounts
                np.ones(batch, np.float32),                    # uniform weights
            )
        return ws

    def train(self, batch: Mapping) -> float:
        """One gradient step on a sampled batch; returns the loss.

        Parameters
        ----------
        batch : Mapping
            ``obs`` and ``next_obs`` (float32, shape (B, n_in)), ``action`` (int, (B,)),
            ``reward`` (float32, (B,)), ``terminated`` (bool, (B,)); optional attributes
            ``discounts`` and ``weights`` (float32, (B,)), as on :class:`tfdata.Batch`.
        """
        obs, next_obs = batch["obs"], batch["next_obs"]
        actions, rewards, terminated = batch["action"], batch["reward"], batch["terminated"]
        n_in, n_actions = self.online.n_in, self.online.n_out
        if obs.dtype != np.float32 or obs.ndim != 2 or obs.shape[1] != n_in or obs.shape[0] < 1:
            raise ValueError(f"batch['obs']: expected float32 of shape (batch >= 1, {n_in}), got "
                             f"{obs.dtype} of shape {obs.shape}")
        n = obs.shape[0]
        grad_out, td, discounts, weights = self._workspace(n)
        d = getattr(batch, "discounts", None)
        w = getattr(batch, "weights", None)
        for name, arr, dtype, shape in (("reward", rewards, np.float32, (n,)),
                                        ("terminated", terminated, np.bool_, (n,)),
                                        ("next_obs", next_obs, np.float32, obs.shape),
                                        ("discounts", d, np.float32, (n,)),
                                        ("weights", w, np.float32, (n,))):
            if arr is not None and (arr.dtype != dtype or arr.shape != shape):
                where = f"batch[{name!r}]" if name not in ("discounts", "weights") else f"batch.{name}"
                raise ValueError(f"{where}: expected {np.dtype(dtype)} of shape {shape}, "
                                 f"got {arr.dtype} of shape {arr.shape}")
        if actions.shape != (n,) or actions.dtype.kind not in "iu":
            raise ValueError(f"batch['action']: expected ints of shape {(n,)}, got "
                             f"{actions.dtype} of shape {actions.shape}")
        if d is None and discounts[0] != np.float32(self.gamma):
            discounts.fill(self.gamma)  # gamma changed (set, or loaded by load_state_dict)
        on, tg, opt = self.online, self.target, self.optim
        acts, work, _, idx, coef, tmp = on.workspace(n)
        acts_target = tg.workspace(n)[0]
        # one compiled call: the same steps as target.forward, online.forward, td_loss,
        # online.backward and optim.step (tests/test_nn.py checks both ways agree)
        loss, bad = self._k.dqn_step(on.params, tg.params, on.table, obs, next_obs, actions, rewards,
                                     terminated, discounts if d is None else d,
                                     weights if w is None else w, acts, acts_target, grad_out, td,
                                     on.grad, work, tmp, idx, coef, opt.m, opt.v, opt.lr,
                                     opt.betas[0], opt.betas[1], opt.eps, opt.t + 1)
        if bad >= 0:
            raise ValueError(f"batch['action']: expected actions in [0, {n_actions}), got "
                             f"{actions[bad]} at row {bad}; nothing was updated")
        opt.t += 1
        self.td_errors = td
        return float(loss)

    def sync_target(self) -> None:
        """Copy the online network into the target network."""
        self.target.copy_from(self.online)

    @property
    def nbytes(self) -> int:
        return (self.online.nbytes + self.target.nbytes + self.optim.m.nbytes + self.optim.v.nbytes
                + sum(a.nbytes for ws in self._ws.values() for a in ws))

    def state_dict(self) -> dict:
        return {"online": self.online.state_dict(), "target": self.target.state_dict(),
                "optim": self.optim.state_dict(), "gamma": self.gamma}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field (``online.params``, ``optim.lr``, ``gamma``, ...), and nothing changed, when
        anything is missing or out of range (the ranges of :class:`Adam` and the constructor)."""
        state_fields(state, ("online", "target", "optim", "gamma"))
        online = self.online.check_state(state["online"], "online.")
        target = self.target.check_state(state["target"], "target.")
        optim = self.optim.check_state(state["optim"], "optim.")
        try:
            gamma = check_unit("gamma", state["gamma"])
        except (TypeError, ValueError):
            raise state_error("gamma", "a float in [0, 1]", repr(state["gamma"])) from None
        # everything checked: apply
        self.online.load_state(online)
        self.target.load_state(target)
        self.optim.load_state(optim)
        self.gamma = gamma
