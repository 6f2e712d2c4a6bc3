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

from ._checks import check_float, check_int, check_unit, float_range
from ._rng import splitmix64

__all__ = ["MLP", "Adam", "DQN", "PPO", "orthogonal"]

ACTIVATIONS = ("relu", "tanh")

# Bounds of the hyperparameters (the reasons are in Adam's and PPO's docstrings).
_LR_MAX = 1e3
_EPS_MIN = float(np.finfo(np.float32).tiny)  # float32's smallest normal, 2**-126
_T_MAX = 1 << 62
_F32_MAX = float(np.finfo(np.float32).max)
_SEED_MAX = (1 << 64) - 1


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_seed(seed) -> int | None:
    """``seed`` as None or an int in [0, 2**64)."""
    return None if seed is None else check_int("seed", seed, 0, _SEED_MAX)


def _betas(value) -> tuple[float, float] | None:
    """``value`` as two floats in [0, 1), or None if it is not that."""
    try:
        pair = tuple(value)
    except TypeError:
        return None
    if len(pair) != 2 or not all(
            not isinstance(b, bool) and isinstance(b, (int, float, np.integer, np.floating))
            and 0.0 <= b < 1.0 for b in pair):
        return None
    return float(pair[0]), float(pair[1])


# -- checks of state dicts: untrusted input, every problem a ValueError naming the field ----------
def _state_error(field: str, expected: str, got: str) -> ValueError:
    return ValueError(f"state[{field!r}]: expected {expected}, got {got}")


def _state_fields(state, keys, prefix: str = "") -> None:
    """``state`` is a mapping holding every key of ``keys``."""
    if not isinstance(state, Mapping):
        where = f"state[{prefix[:-1]!r}]" if prefix else "state"
        raise ValueError(f"{where}: expected a mapping, got {type(state).__name__}")
    for key in keys:
        if key not in state:
            raise ValueError(f"state: missing field {prefix + key!r}")


def _state_float(field: str, value, low: float, high: float | None = None, *,
                 low_open: bool = False) -> float:
    try:
        return check_float(field, value, low, low_open=low_open, high=high)
    except (TypeError, ValueError):
        raise _state_error(field, f"a finite float {float_range(low, high, low_open)}",
                           repr(value)) from None


def _state_int(field: str, value, low: int, high: int) -> int:
    try:
        return check_int(field, value, low, high)
    except (TypeError, ValueError):
        raise _state_error(field, f"an int in [{low}, {high}]", repr(value)) from None


def _state_array(field: str, value, like: np.ndarray, *, nonneg: bool = False) -> np.ndarray:
    """``value`` as floats of ``like``'s shape, finite in ``like``'s dtype (a float64 value
    beyond float32's range would turn inf when stored)."""
    expected = f"finite floats of shape {like.shape}" + (" >= 0" if nonneg else "")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):  # a ragged sequence
        raise _state_error(field, expected, type(value).__name__) from None
    if arr.shape != like.shape or arr.dtype.kind != "f":
        raise _state_error(field, expected, f"{arr.dtype} of shape {arr.shape}")
    bad = ~np.isfinite(arr) | (np.abs(arr) > np.finfo(like.dtype).max)
    if nonneg:
        bad |= arr < 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _state_error(field, expected, f"{float(arr.flat[i])} at index {i}")
    return arr


def _kernels():
    from .kernels import _mlp  # imports numba: only when a network is built

    return _mlp


def _ppo_kernels():
    from .kernels import _ppo

    return _ppo


def orthogonal(shape: tuple, gain: float, rng: np.random.Generator) -> np.ndarray:
    """A float64 matrix drawn as ``torch.nn.init.orthogonal_`` draws one (with numpy's generator).

    A (rows, cols) standard normal matrix, transposed if rows < cols, factored ``Q R``; ``Q``'s
    columns are multiplied by the signs of ``diag(R)`` (so ``Q`` is uniform over the orthogonal
    matrices), transposed back, and scaled by ``gain``.
    """
    rows, cols = shape
    flat = rng.standard_normal((rows, cols))
    if rows < cols:
        flat = flat.T
    q, r = np.linalg.qr(flat)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return gain * q


class MLP:
    """A multilayer perceptron with ReLU or tanh between layers and a linear output, in one flat array.

    Parameters
    ----------
    sizes : sequence of int
        Units per layer, input first: ``(4, 120, 84, 2)`` is CleanRL's CartPole Q-network.
    seed : int, optional
        Seed of the initialisation (in [0, 2**64)), which follows ``torch.nn.Linear``: weights
        and biases uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``.
    dtype : {"float32", "float64"}, default "float32"
        float64 is for gradient checks.
    activation : {"relu", "tanh"}, default "relu"
        Of the hidden layers. ReLU networks run sparse kernels (``kernels._mlp``: about half of
        every hidden layer is zero); tanh networks dense feature-major ones (``kernels._ppo``).

    Attributes
    ----------
    params : ndarray, shape (n_params,)
        Every weight and bias (see :meth:`layer` for views of one layer).
    grad : ndarray, shape (n_params,)
        Written by :meth:`backward`.
    table : ndarray of int64, shape (layers, 5)
        ``(n_in, n_out, weight offset, bias offset, output column)`` of each layer.
    """

    def __init__(self, sizes: Sequence[int], *, seed: int | None = None, dtype="float32",
                 activation: str = "relu"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        sizes = tuple(sizes)
        if len(sizes) < 2 or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                                 or s < 1 for s in sizes):
            raise ValueError(f"sizes must be at least two positive ints (input, ..., output), got {sizes!r}")
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype}")
        self.sizes = tuple(int(s) for s in sizes)
        n_params = sum(a * b + b for a, b in zip(self.sizes, self.sizes[1:]))
        if n_params >= 1 << 63:  # the layer table holds int64 offsets
            raise ValueError(f"sizes: expected at most 2**63 - 1 parameters, got {n_params} from {sizes!r}")
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
        # the nonzero terms of one sparse product (see kernels._mlp._axpy_rows; tanh networks'
        # dense kernels need none)
        self._tmp = np.zeros(0 if activation == "tanh" else
                             max(a * b for a, b in zip(self.sizes, self.sizes[1:])), dtype=self.dtype)
        self.params = np.zeros(off, dtype=self.dtype)
        self.grad = np.zeros(off, dtype=self.dtype)
        self._ws: dict[int, tuple] = {}
        self._k = _kernels()
        self._kt = _ppo_kernels() if activation == "tanh" else None
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
        rng = np.random.default_rng(_check_seed(seed))
        for index in range(len(self.table)):
            weight, bias = self.layer(index)
            bound = 1.0 / math.sqrt(weight.shape[1])
            weight[...] = rng.uniform(-bound, bound, weight.shape)
            bias[...] = rng.uniform(-bound, bound, bias.shape)

    def reset_orthogonal(self, seed=None, gain: float = math.sqrt(2.0), out_gain: float = 1.0) -> None:
        """Initialise as CleanRL's ``layer_init``: :func:`orthogonal` weights (``gain`` for
        hidden layers, ``out_gain`` for the output layer), biases 0.

        ``seed`` may be a ``numpy.random.Generator`` (drawn from in layer order)."""
        rng = np.random.default_rng(seed if isinstance(seed, np.random.Generator) else _check_seed(seed))
        last = len(self.table) - 1
        for index in range(len(self.table)):
            weight, bias = self.layer(index)
            weight[...] = orthogonal(weight.shape, out_gain if index == last else gain, rng)
            bias[...] = 0.0

    def _workspace(self, batch: int) -> tuple:
        ws = self._ws.get(batch)
        if ws is None and self._kt is not None:
            # feature-major (kernels._ppo): layer outputs as (n_out, batch) blocks, x transposed
            ws = self._ws[batch] = (
                np.zeros(batch * self.n_units, dtype=self.dtype),       # acts
                np.zeros(2 * batch * self.width, dtype=self.dtype),     # work
                np.zeros(batch, dtype=np.int64),                        # argmax
                np.zeros((self.n_in, batch), dtype=self.dtype),         # x transposed
                np.zeros((self.n_out, batch), dtype=self.dtype),        # grad_out transposed
            )
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
        if self._kt is not None:
            acts, _, _, xT, _ = self._workspace(x.shape[0])
            self._kt.tanh_forward(self.params, self.table, x, xT, acts)
            return acts[x.shape[0] * int(self.table[-1, 4]):].reshape(self.n_out, x.shape[0]).T
        acts, _, _, idx, coef = self._workspace(x.shape[0])
        self._k.mlp_forward(self.params, self.table, x, acts, self._tmp, idx, coef)
        return acts[x.shape[0] * int(self.table[-1, 4]):].reshape(x.shape[0], self.n_out)

    def argmax(self, x: np.ndarray) -> np.ndarray:
        """Index of the largest output of every row of ``x`` (int64, shape (batch,), a view)."""
        x = self._check_x(x)
        if self._kt is not None:
            out = self._workspace(x.shape[0])[2]
            return np.argmax(self.forward(x), axis=1, out=out)
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
        if self._kt is not None:
            acts, work, _, xT, dT = self._workspace(x.shape[0])
            self._kt.tanh_backward(self.params, self.table, xT, acts, grad_out, self.grad, dT, work)
            return self.grad
        acts, work, _, idx, coef = self._workspace(x.shape[0])
        self._k.mlp_backward(self.params, self.table, x, acts, grad_out, self.grad, work, self._tmp, idx, coef)
        return self.grad

    def copy_from(self, other: "MLP") -> None:
        """Take ``other``'s parameters (a hard target-network update)."""
        if (other.sizes != self.sizes or other.dtype != self.dtype
                or other.activation != self.activation):
            raise ValueError(f"copy_from: expected a network of sizes {self.sizes} and dtype "
                             f"{self.dtype} ({self.activation}), got {other.sizes} and {other.dtype} "
                             f"({other.activation})")
        self.params[...] = other.params

    @property
    def nbytes(self) -> int:
        """Bytes of parameters, gradient and workspaces."""
        return (self.params.nbytes + self.grad.nbytes + self._tmp.nbytes
                + sum(a.nbytes for ws in self._ws.values() for a in ws))

    def state_dict(self) -> dict:
        return {"sizes": list(self.sizes), "dtype": self.dtype.name, "activation": self.activation,
                "params": self.params.copy()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field, and nothing changed, when anything is missing or does not fit (parameters
        must be finite)."""
        self.params[...] = self._check_state(state)

    def _check_state(self, state, prefix: str = "") -> np.ndarray:
        """The parameters of ``state``, checked (fields named ``prefix + key``)."""
        _state_fields(state, ("sizes", "params"), prefix)
        activation = state.get("activation", "relu")  # states written before tanh existed
        if activation != self.activation:
            raise _state_error(prefix + "activation", repr(self.activation), repr(activation))
        sizes = state["sizes"]
        if not (isinstance(sizes, (list, tuple)) and len(sizes) == len(self.sizes)
                and all(_is_int(n) and n == m for n, m in zip(sizes, self.sizes))):
            raise _state_error(prefix + "sizes", f"{list(self.sizes)} ({self.n_params} params)", repr(sizes))
        return _state_array(prefix + "params", state["params"], self.params)


class Adam:
    """``torch.optim.Adam`` (no weight decay, no amsgrad) over one flat parameter array.

    Parameters
    ----------
    params : ndarray of float, shape (n_params,)
        Updated in place by :meth:`step`.
    lr : float, default 1e-3
        Finite, in (0, 1e3]. Adam moves each parameter by about ``lr`` per step whatever the
        gradient's scale (by exactly ``lr`` on the first step, eps aside), so 1e3 is far above
        any useful rate, and far below the rates whose arithmetic overflows: the bias-corrected
        ``lr / (1 - beta1 ** t)`` in float64 from about 1e292, a float32 parameter's step from
        about 3e38 (an inf step makes the parameters inf or NaN).
    betas : (float, float), default (0.9, 0.999)
        Each in [0, 1).
    eps : float, default 1e-8
        Finite, >= float32's smallest normal (2**-126, about 1.2e-38). The moments are kept in
        the parameters' type: where the second moment has underflowed to 0 the step is ``m /
        eps``, which a smaller eps could overflow (a gradient of 1e-23 in float32 with eps
        1e-300 did).

    Raises
    ------
    TypeError, ValueError
        A hyperparameter of the wrong type or out of range (the message names it).

    Attributes
    ----------
    t : int
        Steps taken (bias corrections use ``t``); a loaded state holds at most 2**62, which
        leaves the kernels' int64 step number 2**62 updates of room (centuries at a
        microsecond each). ``beta ** t`` is well defined for any such ``t``.
    """

    def __init__(self, params: np.ndarray, *, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        if not isinstance(params, np.ndarray) or params.ndim != 1 or params.dtype.kind != "f":
            raise TypeError("params: expected a 1-D float ndarray, got "
                            f"{type(params).__name__} {getattr(params, 'shape', '')}")
        lr = check_float("lr", lr, 0.0, low_open=True, high=_LR_MAX)
        eps = check_float("eps", eps, _EPS_MIN)
        pair = _betas(betas)
        if pair is None:
            raise ValueError(f"betas must be two floats in [0, 1), got {betas!r}")
        self.params = params
        self.lr, self.betas, self.eps = lr, pair, eps
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
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field, and nothing changed, when anything is missing or out of range (as for the
        constructor, but ``lr`` may be 0: a rate annealed to 0; ``t`` in [0, 2**62]; ``m`` and
        ``v`` finite, ``v >= 0``)."""
        self._apply(self._check_state(state))

    def _check_state(self, state, prefix: str = "") -> tuple:
        """The checked values of ``state`` (fields named ``prefix + key``), for :meth:`_apply`."""
        _state_fields(state, ("t", "m", "v", "lr", "betas", "eps"), prefix)
        m = _state_array(prefix + "m", state["m"], self.m)
        v = _state_array(prefix + "v", state["v"], self.v, nonneg=True)
        t = _state_int(prefix + "t", state["t"], 0, _T_MAX)
        lr = _state_float(prefix + "lr", state["lr"], 0.0, _LR_MAX)
        betas = _betas(state["betas"])
        if betas is None:
            raise _state_error(prefix + "betas", "two floats in [0, 1)", repr(state["betas"]))
        eps = _state_float(prefix + "eps", state["eps"], _EPS_MIN)
        return m, v, t, lr, betas, eps

    def _apply(self, checked: tuple) -> None:
        m, v, self.t, self.lr, self.betas, self.eps = checked
        self.m[...] = m
        self.v[...] = v


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
        self._act_ws = self.online._workspace(1)
        # act's Q-values: the output block of its batch-of-one workspace
        q0 = int(self.online.table[-1, 4])
        self._q1 = self._act_ws[0][q0:q0 + self.online.n_out]
        self._obs_shape = (self.online.n_in,)
        self._ws: dict[int, tuple] = {}
        self.td_errors = np.zeros(0, dtype=np.float32)
        self._k = self.online._k

    def act(self, obs) -> int:
        """The greedy action for one observation (shape (n_in,)).

        Raises ValueError when the Q-values are not finite (NaN or inf in ``obs`` or in the
        parameters): no action is the greedy one then."""
        if np.shape(obs) != self._obs_shape:
            raise ValueError(f"obs: expected shape {self._obs_shape}, got {np.shape(obs)}")
        self._x1[0] = obs  # one copy into float32, no allocation
        net = self.online
        acts, _, out, idx, coef = self._act_ws
        # straight to the kernel: _x1 is this object's own, of the right shape and dtype
        self._k.mlp_argmax(net.params, net.table, self._x1, acts, net._tmp, idx, coef, out)
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
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field (``online.params``, ``optim.lr``, ``gamma``, ...), and nothing changed, when
        anything is missing or out of range (the ranges of :class:`Adam` and the constructor)."""
        _state_fields(state, ("online", "target", "optim", "gamma"))
        online = self.online._check_state(state["online"], "online.")
        target = self.target._check_state(state["target"], "target.")
        optim = self.optim._check_state(state["optim"], "optim.")
        try:
            gamma = check_unit("gamma", state["gamma"])
        except (TypeError, ValueError):
            raise _state_error("gamma", "a float in [0, 1]", repr(state["gamma"])) from None
        # everything checked: apply
        self.online.params[...] = online
        self.target.params[...] = target
        self.optim._apply(optim)
        self.gamma = gamma


#: PPO's float coefficients ``(name, low, low open)``; each also at most float32's largest
_PPO_COEFS = (("clip_coef", 0.0, False), ("ent_coef", 0.0, False), ("vf_coef", 0.0, False))
_PPO_STATS = ("pg_loss", "v_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")
#: the minibatch fields :meth:`PPO.train` reads, besides ``obs`` and ``action``
_PPO_FLOAT_FIELDS = ("log_prob", "advantage", "return", "value")


class PPO:
    """Proximal policy optimisation for discrete actions: CleanRL's ``ppo.py`` agent and update.

    An actor ``obs_size-64-64-n_actions`` and a critic ``obs_size-64-64-1``, separate tanh
    :class:`MLP` s with CleanRL's ``layer_init`` (orthogonal, gain sqrt(2), output gains 0.01 and
    1, biases 0); one Adam over both networks' parameters (kept in one flat array: the actor's,
    then the critic's). :meth:`train` is one compiled call per minibatch; :meth:`act` one per
    vector-env step. Nothing is allocated after the first call with a given batch size.

    Parameters
    ----------
    obs_size, n_actions : int
    hidden : sequence of int, default (64, 64)
        Hidden layer sizes of both networks.
    lr : float, default 2.5e-4
        Adam's learning rate, finite, in (0, 1e3] (see :class:`Adam`); settable, in [0, 1e3]
        (``agent.lr = frac * 2.5e-4`` anneals as CleanRL does).
    eps : float, default 1e-5
        Adam's epsilon (CleanRL's; torch's default is 1e-8), finite, >= 2**-126 (see
        :class:`Adam`).
    clip_coef : float, default 0.2
        Clip range of the probability ratio, and of the value change when ``clip_vloss``; in
        [0, 3.4e38] (see Notes).
    clip_vloss : bool, default True
    ent_coef, vf_coef : float, default 0.01, 0.5
        In [0, 3.4e38] (see Notes).
    max_grad_norm : float or None, default 0.5
        Global L2 norm the gradient of both networks together is clipped to
        (``torch.nn.utils.clip_grad_norm_``), in (0, 3.4e38]; None: no clipping.
    norm_adv : bool, default True
        Normalise advantages per minibatch (``(a - mean) / (std + 1e-8)``, unbiased std).
    seed : int, optional
        In [0, 2**64). Seeds the initialisation and the action sampler (tfdata's counter-based
        generator, never numpy's global one).
    betas : (float, float), default (0.9, 0.999)
        Adam's, each in [0, 1).

    Raises
    ------
    TypeError, ValueError
        An argument of the wrong type or out of range (the message names it).

    Attributes
    ----------
    actor, critic : MLP
        Their ``params`` and ``grad`` are views of :attr:`params` and :attr:`grad`.
    params, grad : ndarray of float32, shape (n_params,)
        Both networks' parameters and the last (clipped) gradient.
    stats : dict
        Of the last :meth:`train` call: pg_loss, v_loss, entropy, old_approx_kl, approx_kl,
        clipfrac (floats, as CleanRL logs them), and grad_norm (before clipping).

    Notes
    -----
    The coefficients' upper bound is float32's largest value: the update is computed in
    float32, the type of the networks (the clip range is a float32 constant, as torch's clamp
    bounds). A coefficient so large that the gradient overflows is refused by :meth:`train`,
    which then updates nothing.
    """

    def __init__(self, obs_size: int, n_actions: int, *, hidden: Sequence[int] = (64, 64),
                 lr: float = 2.5e-4, eps: float = 1e-5, clip_coef: float = 0.2,
                 clip_vloss: bool = True, ent_coef: float = 0.01, vf_coef: float = 0.5,
                 max_grad_norm: float | None = 0.5, norm_adv: bool = True,
                 seed: int | None = None, betas=(0.9, 0.999)):
        for name, value in (("obs_size", obs_size), ("n_actions", n_actions)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if n_actions < 2:
            raise ValueError(f"n_actions must be >= 2, got {n_actions!r}")
        try:
            layers = tuple(hidden)
        except TypeError:
            layers = ()
        if not layers or not all(_is_int(h) and h >= 1 for h in layers):
            raise ValueError(f"hidden must be a non-empty sequence of positive ints, got {hidden!r}")
        hidden = tuple(int(h) for h in layers)
        coefs = {name: check_float(name, value, low, low_open=low_open, high=_F32_MAX)
                 for (name, low, low_open), value in zip(_PPO_COEFS, (clip_coef, ent_coef, vf_coef))}
        if max_grad_norm is not None:
            max_grad_norm = check_float("max_grad_norm", max_grad_norm, 0.0, low_open=True, high=_F32_MAX)
        for name, value in (("clip_vloss", clip_vloss), ("norm_adv", norm_adv)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 63))
        self.seed = _check_seed(seed)
        rng = np.random.default_rng(self.seed)
        self.actor = MLP((int(obs_size), *hidden, int(n_actions)), activation="tanh")
        self.critic = MLP((int(obs_size), *hidden, 1), activation="tanh")
        self.actor.reset_orthogonal(rng, out_gain=0.01)
        self.critic.reset_orthogonal(rng, out_gain=1.0)
        self.split = self.actor.n_params
        n = self.split + self.critic.n_params
        self.params = np.zeros(n, np.float32)
        self.grad = np.zeros(n, np.float32)
        self.params[:self.split] = self.actor.params
        self.params[self.split:] = self.critic.params
        # the networks see their parts of the flat arrays (MLP.forward etc. keep working)
        self.actor.params, self.critic.params = self.params[:self.split], self.params[self.split:]
        self.actor.grad, self.critic.grad = self.grad[:self.split], self.grad[self.split:]
        self.optim = Adam(self.params, lr=lr, betas=betas, eps=eps)
        self.obs_size, self.n_actions = int(obs_size), int(n_actions)
        self.hidden = hidden
        # hyperparameters as the kernel reads them (see kernels._ppo.ppo_train)
        self._hp = np.zeros(10, np.float64)
        self._cst = np.zeros(3, np.float32)
        self.clip_coef, self.clip_vloss = coefs["clip_coef"], bool(clip_vloss)
        self.ent_coef, self.vf_coef = coefs["ent_coef"], coefs["vf_coef"]
        self.max_grad_norm = max_grad_norm
        self.norm_adv = bool(norm_adv)
        self._rng = np.zeros(2, np.uint64)
        self._rng[0] = np.uint64(splitmix64(self.seed + 0x5A17))  # not the init's stream
        self._stats = np.zeros(8, np.float64)
        self._act_ws: dict[int, tuple] = {}
        self._train_ws: dict[int, tuple] = {}
        self._kp = _ppo_kernels()

    # -- hyperparameters ----------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self.optim.lr

    @lr.setter
    def lr(self, value: float) -> None:
        # 0 allowed here (an annealed rate), not at construction (as Adam's)
        self.optim.lr = check_float("lr", value, 0.0, high=_LR_MAX)

    def _pack(self) -> None:
        hp = self._hp
        b1, b2 = self.optim.betas
        hp[:] = (self.optim.lr, b1, b2, self.optim.eps, self.clip_coef, self.ent_coef, self.vf_coef,
                 -1.0 if self.max_grad_norm is None else self.max_grad_norm,
                 float(self.norm_adv), float(self.clip_vloss))
        c = np.float32(self.clip_coef)
        self._cst[:] = (c, np.float32(1.0) - c, np.float32(1.0) + c)

    # -- acting -------------------------------------------------------------------------------
    def _check_obs(self, obs) -> np.ndarray:
        if not isinstance(obs, np.ndarray) or obs.dtype != np.float32 or obs.ndim != 2 \
                or obs.shape[1] != self.obs_size or obs.shape[0] < 1:
            raise ValueError(f"obs: expected float32 of shape (E >= 1, {self.obs_size}), got "
                             f"{getattr(obs, 'dtype', type(obs).__name__)} of shape {np.shape(obs)}")
        return obs

    def _act_workspace(self, e: int) -> tuple:
        ws = self._act_ws.get(e)
        if ws is None:
            actions, log_probs, values = np.zeros(e, np.int64), np.zeros(e, np.float32), np.zeros(e, np.float32)
            # act's return value built once; value() has its own output, so that a value() call
            # (a bootstrap or final value) leaves the values of the last act() alone
            ws = self._act_ws[e] = (np.zeros(e * self.actor.n_units, np.float32),
                                    np.zeros(e * self.critic.n_units, np.float32),
                                    actions, log_probs, values, (actions, log_probs, values),
                                    np.zeros(e, np.float32))
        return ws

    def act(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample an action for each of E observations.

        Parameters
        ----------
        obs : ndarray of float32, shape (E, obs_size)

        Returns
        -------
        actions : ndarray of int64, shape (E,)
            Drawn from ``softmax(actor(obs))`` with the agent's own seeded generator.
        log_probs : ndarray of float32, shape (E,)
            ``logits[action] - logsumexp(logits)``.
        values : ndarray of float32, shape (E,)
            ``critic(obs)``.

        The three are views of this agent's workspace for E: overwritten by the next ``act``
        with E observations (copy them to keep them; a rollout buffer's ``add`` copies).
        """
        obs = self._check_obs(obs)
        acts_a, acts_c, actions, log_probs, values, out, _ = self._act_workspace(obs.shape[0])
        bad = self._kp.ppo_act(self.actor.params, self.critic.params, self.actor.table,
                               self.critic.table, obs, acts_a, acts_c, actions, log_probs, values,
                               self._rng, True)
        if bad >= 0:
            raise ValueError(f"obs: the actor's logits are NaN at row {bad} (NaN in obs "
                             f"{obs[bad].tolist()} or in the parameters); no action was drawn")
        return out

    def log_prob(self, obs: np.ndarray, actions) -> tuple[np.ndarray, np.ndarray]:
        """Log-probabilities of given actions and the values (float32, (E,)), without sampling.

        The outputs are the same views :meth:`act` returns for E observations (overwritten by
        either). NaN logits (NaN in ``obs`` or in the parameters) raise ValueError, as in
        :meth:`act`."""
        obs = self._check_obs(obs)
        e = obs.shape[0]
        actions = np.asarray(actions)
        if actions.shape != (e,) or actions.dtype.kind not in "iu":
            raise ValueError(f"actions: expected ints of shape {(e,)}, got {actions.dtype} of shape {actions.shape}")
        bad = np.flatnonzero((actions < 0) | (actions >= self.n_actions))
        if bad.size:
            raise ValueError(f"actions: expected values in [0, {self.n_actions}), got "
                             f"{actions[bad[0]]} at row {bad[0]}")
        acts_a, acts_c, act_out, log_probs, values, _, _ = self._act_workspace(e)
        act_out[:] = actions
        bad = self._kp.ppo_act(self.actor.params, self.critic.params, self.actor.table,
                               self.critic.table, obs, acts_a, acts_c, act_out, log_probs, values,
                               self._rng, False)
        if bad >= 0:
            raise ValueError(f"obs: the actor's logits are NaN at row {bad} (NaN in obs "
                             f"{obs[bad].tolist()} or in the parameters); no log-probability")
        return log_probs, values

    def value(self, obs: np.ndarray) -> np.ndarray:
        """``critic(obs)``: float32, shape (E,), a view (overwritten by the next ``value`` with E
        observations; not by ``act``, and it does not overwrite ``act``'s values).

        A value that is NaN or inf (from NaN or inf in ``obs`` or in the parameters) raises
        ValueError: a bootstrap value is no use then."""
        obs = self._check_obs(obs)
        _, acts_c, _, _, _, _, values = self._act_workspace(obs.shape[0])
        bad = self._kp.ppo_value(self.critic.params, self.critic.table, obs, acts_c, values)
        if bad >= 0:
            raise ValueError(f"obs: the critic's value is {values[bad]} at row {bad} (NaN or inf "
                             f"in obs {obs[bad].tolist()} or in the parameters)")
        return values

    # -- training -----------------------------------------------------------------------------
    def _train_workspace(self, b: int) -> tuple:
        ws = self._train_ws.get(b)
        if ws is None:
            width = max(self.actor.width, self.critic.width)
            ws = self._train_ws[b] = (
                np.zeros((self.obs_size, b), np.float32),                 # obs transposed
                np.zeros(b * self.actor.n_units, np.float32),
                np.zeros(b * self.critic.n_units, np.float32),
                np.zeros((self.n_actions, b), np.float32),               # d loss / d logits
                np.zeros((1, b), np.float32),                            # d loss / d value
                np.zeros(2 * b * width, np.float32))
        return ws

    def train(self, mb: Mapping) -> float:
        """One PPO update on a minibatch (CleanRL's inner loop body); returns the loss.

        Parameters
        ----------
        mb : Mapping
            ``obs`` (float32, (B, obs_size)), ``action`` (int, (B,), in [0, n_actions)),
            ``log_prob``, ``advantage``, ``return``, ``value`` (float32, (B,)): what
            :meth:`act` gave when the rollout was collected, and the rollout buffer's GAE. B >= 2
            when ``norm_adv`` (an unbiased std needs two rows).

        Bad fields raise ValueError naming the field, and so does a minibatch whose loss
        gradient is not finite (NaN or inf in a field); nothing is updated then.
        """
        try:
            obs, actions = mb["obs"], mb["action"]
            floats = [mb[name] for name in _PPO_FLOAT_FIELDS]
        except KeyError as exc:
            raise KeyError(f"minibatch: missing field {exc.args[0]!r} (PPO.train needs obs, action, "
                           f"{', '.join(_PPO_FLOAT_FIELDS)})") from None
        if not isinstance(obs, np.ndarray) or obs.dtype != np.float32 or obs.ndim != 2 \
                or obs.shape[1] != self.obs_size or obs.shape[0] < 1:
            raise ValueError(f"minibatch['obs']: expected float32 of shape (B, {self.obs_size}), got "
                             f"{getattr(obs, 'dtype', type(obs).__name__)} of shape {np.shape(obs)}")
        b = obs.shape[0]
        if self.norm_adv and b < 2:
            raise ValueError(f"minibatch['obs']: expected B >= 2 rows with norm_adv (unbiased std), got {b}")
        for name, arr in zip(_PPO_FLOAT_FIELDS, floats):
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or arr.shape != (b,):
                raise ValueError(f"minibatch[{name!r}]: expected float32 of shape {(b,)}, got "
                                 f"{getattr(arr, 'dtype', type(arr).__name__)} of shape {np.shape(arr)}")
        if not isinstance(actions, np.ndarray) or actions.shape != (b,) or actions.dtype.kind not in "iu":
            raise ValueError(f"minibatch['action']: expected ints of shape {(b,)}, got "
                             f"{getattr(actions, 'dtype', type(actions).__name__)} of shape {np.shape(actions)}")
        self._pack()
        xT, acts_a, acts_c, dA, dC, work = self._train_workspace(b)
        opt = self.optim
        bad = self._kp.ppo_train(self.params, self.grad, opt.m, opt.v, self.split, self.actor.table,
                                 self.critic.table, obs, actions, floats[0], floats[1], floats[2],
                                 floats[3], xT, acts_a, acts_c, dA, dC, work, self._hp, self._cst,
                                 opt.t + 1, self._stats)
        if bad <= -3:
            field, row = divmod(-3 - bad, b)
            name = ("obs",) + _PPO_FLOAT_FIELDS
            raise ValueError(f"minibatch[{name[field]!r}]: expected finite floats, got "
                             f"{obs[row].tolist() if field == 0 else floats[field - 1][row]} at row {row}; "
                             "nothing was updated")
        if bad == -2:
            raise ValueError("minibatch: the loss gradient is not finite (NaN or inf in the "
                             "parameters, or a diverging loss); nothing was updated")
        if bad >= 0:
            raise ValueError(f"minibatch['action']: expected actions in [0, {self.n_actions}), got "
                             f"{actions[bad]} at row {bad}; nothing was updated")
        opt.t += 1
        return float(self._stats[0])

    @property
    def stats(self) -> dict:
        """pg_loss, v_loss, entropy, old_approx_kl, approx_kl, clipfrac, grad_norm of the last
        :meth:`train` (zeros before it)."""
        s = self._stats
        return {"pg_loss": float(s[1]), "v_loss": float(s[2]), "entropy": float(s[3]),
                "old_approx_kl": float(s[4]), "approx_kl": float(s[5]), "clipfrac": float(s[6]),
                "grad_norm": float(s[7])}

    # -- state --------------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bytes of parameters, gradient, Adam's moments and every workspace."""
        return (self.params.nbytes + self.grad.nbytes + self.optim.m.nbytes + self.optim.v.nbytes
                + self.actor.nbytes - self.actor.params.nbytes - self.actor.grad.nbytes
                + self.critic.nbytes - self.critic.params.nbytes - self.critic.grad.nbytes
                + sum(a.nbytes for ws in self._act_ws.values() for a in ws[:5] + ws[6:])
                + sum(a.nbytes for ws in self._train_ws.values() for a in ws))

    def _config(self) -> dict:
        return {"obs_size": self.obs_size, "n_actions": self.n_actions, "hidden": list(self.hidden)}

    def state_dict(self) -> dict:
        return {**self._config(), "params": self.params.copy(), "optim": self.optim.state_dict(),
                "clip_coef": self.clip_coef, "clip_vloss": self.clip_vloss, "ent_coef": self.ent_coef,
                "vf_coef": self.vf_coef, "max_grad_norm": self.max_grad_norm,
                "norm_adv": self.norm_adv, "rng": [int(self._rng[0]), int(self._rng[1])]}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field (``optim.lr``, ``clip_coef``, ...), and nothing changed, when anything is
        missing, does not fit, or is out of the constructor's ranges (``optim`` as
        :meth:`Adam.load_state_dict` checks it: ``lr`` may be 0, ``t`` at most 2**62)."""
        _state_fields(state, ("obs_size", "n_actions", "hidden", "params", "optim", "clip_coef",
                              "clip_vloss", "ent_coef", "vf_coef", "max_grad_norm", "norm_adv", "rng"))
        for key, want in self._config().items():
            got = state[key]
            if key == "hidden":
                ok = (isinstance(got, (list, tuple)) and len(got) == len(want)
                      and all(_is_int(g) and g == w for g, w in zip(got, want)))
            else:
                ok = _is_int(got) and got == want
            if not ok:
                raise _state_error(key, repr(want), repr(got))
        params = _state_array("params", state["params"], self.params)
        optim = self.optim._check_state(state["optim"], "optim.")
        coefs = {name: _state_float(name, state[name], low, _F32_MAX, low_open=low_open)
                 for name, low, low_open in _PPO_COEFS}
        mgn = state["max_grad_norm"]
        if mgn is not None:
            mgn = _state_float("max_grad_norm", mgn, 0.0, _F32_MAX, low_open=True)
        for key in ("clip_vloss", "norm_adv"):
            if not isinstance(state[key], (bool, np.bool_)):
                raise _state_error(key, "a bool", repr(state[key]))
        rng = state["rng"]
        if not (isinstance(rng, (list, tuple)) and len(rng) == 2
                and all(_is_int(x) and 0 <= x <= _SEED_MAX for x in rng)):
            raise _state_error("rng", "[key, counter], two ints in [0, 2**64)", repr(rng))
        # everything checked: apply
        self.params[...] = params
        self.optim._apply(optim)
        self.clip_coef, self.ent_coef, self.vf_coef = (coefs[k] for k in ("clip_coef", "ent_coef", "vf_coef"))
        self.max_grad_norm = mgn
        self.clip_vloss, self.norm_adv = bool(state["clip_vloss"]), bool(state["norm_adv"])
        self._rng[0], self._rng[1] = np.uint64(rng[0]), np.uint64(rng[1])

