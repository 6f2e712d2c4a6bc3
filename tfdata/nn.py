"""A torch-free learner for small devices: an MLP, Adam, and DQN, as numba kernels over numpy.

For a policy loop on a device where torch does not fit (a 512 MB board): the network, its
gradient and the optimizer are a few kernels over preallocated float32 arrays, the replay buffer
is tfdata's. Nothing is allocated after the first call with a given batch size.

>>> net = DQN((4, 120, 84, 2), lr=2.5e-4, gamma=0.99, seed=0)   # doctest: +SKIP
>>> action = net.act(obs)                                      # greedy action, an int
>>> loss = net.train(buffer.sample(128))                        # one Adam step
>>> net.sync_target()                                          # hard target update

The arithmetic follows torch's (``nn.Linear`` initialisation, ReLU, ``F.mse_loss``,
``torch.optim.Adam``); results agree with torch to float32 rounding, not bit for bit (sums are
taken in another order). ``tests/test_nn.py`` checks every gradient against finite differences
and against torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["MLP", "Adam", "DQN"]


def _kernels():
    from .kernels import _mlp  # imports numba: only when a network is built

    return _mlp


class MLP:
    """A multilayer perceptron with ReLU between layers and a linear output, in one flat array.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first: ``(4, 120, 84, 2)`` is CleanRL's CartPole Q-network.
    seed : int, optional
        Seed of the initialisation, which follows ``torch.nn.Linear``: weights and biases
        uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``.
    dtype : {"float32", "float64"}, default "float32"
        float64 is for gradient checks.

    Attributes
    ----------
    params : ndarray, shape (n_params,)
        Every weight and bias (see :meth:`layer` for views of one layer).
    grad : ndarray, shape (n_params,)
        Written by :meth:`backward`.
    table : ndarray of int64, shape (layers, 5)
        ``(n_in, n_out, weight offset, bias offset, output column)`` of each layer.
    """

    def __init__(self, sizes: Sequence[int], *, seed: int | None = None, dtype="float32"):
        sizes = tuple(sizes)
        if len(sizes) < 2 or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                                 or s < 1 for s in sizes):
            raise ValueError(f"sizes must be at least two positive ints (input, ..., output), got {sizes!r}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype}")
        self.sizes = tuple(int(s) for s in sizes)
        table = np.zeros((len(sizes) - 1, 5), dtype=np.int64)
        off = col = 0
        for layer, (n_in, n_out) in enumerate(zip(self.sizes, self.sizes[1:])):
            table[layer] = (n_in, n_out, off, off + n_in * n_out, col)
            off += n_in * n_out + n_out
            col += n_out
        self.table = table
        self.n_params = off
        self.n_units = col
        self.width = max(self.sizes[1:])
        self._tmp = np.zeros(max(a * b for a, b in zip(self.sizes, self.sizes[1:])), dtype=self.dtype)
        # the nonzero terms of one sparse product (see kernels._mlp._axpy_rows)
        self.params = np.zeros(off, dtype=self.dtype)
        self.grad = np.zeros(off, dtype=self.dtype)
        self._ws: dict[int, tuple] = {}
        self._k = _kernels()
        self.reset_parameters(seed)

    @property
    def n_in(self) -> int:
        return self.sizes[0]

    @property
    def n_out(self) -> int:
        return self.sizes[-1]

    def layer(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Views of layer ``index``'s weight, shape (n_out, n_in) as torch's ``Linear.weight``,
        and bias, shape (n_out,)."""
        n_in, n_out, w, b, _ = (int(v) for v in self.table[index])
        return self.params[w:w + n_in * n_out].reshape(n_out, n_in), self.params[b:b + n_out]

    def reset_parameters(self, seed: int | None = None) -> None:
        """Initialise as ``torch.nn.Linear``: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both."""
        rng = np.random.default_rng(seed)
        for index in range(len(self.table)):
            weight, bias = self.layer(index)
            bound = 1.0 / math.sqrt(weight.shape[1])
            weight[...] = rng.uniform(-bound, bound, weight.shape)
            bias[...] = rng.uniform(-bound, bound, bias.shape)

    def _workspace(self, batch: int) -> tuple:
        ws = self._ws.get(batch)
        if ws is None:
            # layer outputs as contiguous (batch, n_out) blocks, see kernels._mlp
            acts = np.zeros(batch * self.n_units, dtype=self.dtype)
            work = np.zeros(2 * batch * self.width, dtype=self.dtype)
            argmax = np.zeros(batch, dtype=np.int64)
            n = max(batch, max(self.sizes))
            idx = np.zeros(n, dtype=np.int64)
            coef = np.zeros(n, dtype=self.dtype)
            ws = self._ws[batch] = (acts, work, argmax, idx, coef)
        return ws

    def _check_x(self, x) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.n_in or x.shape[0] < 1:
            raise ValueError(f"x: expected shape (batch >= 1, {self.n_in}), got {x.shape}")
        if x.dtype != self.dtype:
            raise TypeError(f"x: expected dtype {self.dtype}, got {x.dtype}")
        return x

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Outputs of the network for every row of ``x``.

        Parameters
        ----------
        x : ndarray of the network's dtype, shape (batch, n_in)

        Returns
        -------
        ndarray, shape (batch, n_out)
            A view into this network's workspace for ``batch``: overwritten by the next
            ``forward`` of the same batch size (copy it to keep it).
        """
        x = self._check_x(x)
        acts, _, _, idx, coef = self._workspace(x.shape[0])
        self._k.mlp_forward(self.params, self.table, x, acts, self._tmp, idx, coef)
        return acts[x.shape[0] * int(self.table[-1, 4]):].reshape(x.shape[0], self.n_out)

    def argmax(self, x: np.ndarray) -> np.ndarray:
        """Index of the largest output of every row of ``x`` (int64, shape (batch,), a view)."""
        x = self._check_x(x)
        acts, _, out, idx, coef = self._workspace(x.shape[0])
        self._k.mlp_argmax(self.params, self.table, x, acts, self._tmp, idx, coef, out)
        return out

    def backward(self, x: np.ndarray, grad_out: np.ndarray) -> np.ndarray:
        """Gradient of a loss with respect to :attr:`params`, written into :attr:`grad`.

        Uses the layer outputs of the last :meth:`forward` with this batch size, which must have
        been called with the same ``x`` and parameters (as autograd uses its saved tensors).

        Parameters
        ----------
        x : ndarray, shape (batch, n_in)
        grad_out : ndarray, shape (batch, n_out)
            d loss / d output.
        """
        x = self._check_x(x)
        grad_out = np.asarray(grad_out)
        if grad_out.shape != (x.shape[0], self.n_out) or grad_out.dtype != self.dtype:
            raise ValueError(f"grad_out: expected {self.dtype} of shape {(x.shape[0], self.n_out)}, "
                             f"got {grad_out.dtype} of shape {grad_out.shape}")
        acts, work, _, idx, coef = self._workspace(x.shape[0])
        self._k.mlp_backward(self.params, self.table, x, acts, grad_out, self.grad, work, self._tmp, idx, coef)
        return self.grad

    def copy_from(self, other: "MLP") -> None:
        """Take ``other``'s parameters (a hard target-network update)."""
        if other.sizes != self.sizes or other.dtype != self.dtype:
            raise ValueError(f"copy_from: expected a network of sizes {self.sizes} and dtype "
                             f"{self.dtype}, got {other.sizes} and {other.dtype}")
        self.params[...] = other.params

    @property
    def nbytes(self) -> int:
        """Bytes of parameters, gradient and workspaces."""
        return (self.params.nbytes + self.grad.nbytes + self._tmp.nbytes
                + sum(a.nbytes for ws in self._ws.values() for a in ws))

    def state_dict(self) -> dict:
        return {"sizes": list(self.sizes), "dtype": self.dtype.name, "params": self.params.copy()}

    def load_state_dict(self, state: Mapping) -> None:
        sizes = tuple(int(s) for s in state["sizes"])
        params = np.asarray(state["params"])
        if sizes != self.sizes or params.shape != self.params.shape:
            raise ValueError(f"state: expected sizes {self.sizes} ({self.n_params} params), got "
                             f"{sizes} ({params.shape})")
        self.params[...] = params


class Adam:
    """``torch.optim.Adam`` (no weight decay, no amsgrad) over one flat parameter array.

    Parameters
    ----------
    params : ndarray of float, shape (n_params,)
        Updated in place by :meth:`step`.
    lr : float, default 1e-3
    betas : (float, float), default (0.9, 0.999)
    eps : float, default 1e-8
    """

    def __init__(self, params: np.ndarray, *, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        if not isinstance(params, np.ndarray) or params.ndim != 1 or params.dtype.kind != "f":
            raise TypeError("params: expected a 1-D float ndarray, got "
                            f"{type(params).__name__} {getattr(params, 'shape', '')}")
        for name, value in (("lr", lr), ("eps", eps)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        b1, b2 = (float(b) for b in betas)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas!r}")
        self.params = params
        self.lr, self.betas, self.eps = float(lr), (b1, b2), float(eps)
        self.m = np.zeros_like(params)
        self.v = np.zeros_like(params)
        self.t = 0
        self._k = _kernels()

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
        for key in ("m", "v"):
            if np.shape(state[key]) != self.params.shape:
                raise ValueError(f"state[{key!r}]: expected shape {self.params.shape}, got {np.shape(state[key])}")
        self.m[...] = state["m"]
        self.v[...] = state["v"]
        self.t = int(state["t"])
        self.lr, self.betas, self.eps = float(state["lr"]), tuple(state["betas"]), float(state["eps"])


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
    gamma : float, default 0.99
    betas, eps
        Adam's.
    seed : int, optional
        Seed of the initialisation (the target starts as a copy of the online network).
    """

    def __init__(self, sizes: Sequence[int], *, lr: float = 2.5e-4, gamma: float = 0.99,
                 betas=(0.9, 0.999), eps: float = 1e-8, seed: int | None = None):
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
        self.gamma = float(gamma)
        self.online = MLP(sizes, seed=seed)
        self.target = MLP(sizes)
        self.target.copy_from(self.online)
        self.optim = Adam(self.online.params, lr=lr, betas=betas, eps=eps)
        self._x1 = np.zeros((1, self.online.n_in), dtype=np.float32)
        self._act_ws = self.online._workspace(1)
        self._obs_shape = (self.online.n_in,)
        self._ws: dict[int, tuple] = {}
        self.td_errors = np.zeros(0, dtype=np.float32)
        self._k = self.online._k

    def act(self, obs) -> int:
        """The greedy action for one observation (shape (n_in,))."""
        if np.shape(obs) != self._obs_shape:
            raise ValueError(f"obs: expected shape {self._obs_shape}, got {np.shape(obs)}")
        self._x1[0] = obs  # one copy into float32, no allocation
        net = self.online
        acts, _, out, idx, coef = self._act_ws
        # straight to the kernel: _x1 is this object's own, of the right shape and dtype
        self._k.mlp_argmax(net.params, net.table, self._x1, acts, net._tmp, idx, coef, out)
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
        acts, work, _, idx, coef = on._workspace(n)
        acts_target = tg._workspace(n)[0]
        # one compiled call: the same steps as target.forward, online.forward, td_loss,
        # online.backward and optim.step (tests/test_nn.py checks both ways agree)
        loss, bad = self._k.dqn_step(on.params, tg.params, on.table, obs, next_obs, actions, rewards,
                                     terminated, discounts if d is None else d,
                                     weights if w is None else w, acts, acts_target, grad_out, td,
                                     on.grad, work, on._tmp, idx, coef, opt.m, opt.v, opt.lr,
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
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optim.load_state_dict(state["optim"])
        self.gamma = float(state["gamma"])
