"""The network of :mod:`tfdata.nn`: a multilayer perceptron in one flat parameter array."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ._checks import check_seed, is_int, state_array, state_error, state_fields

__all__ = ["MLP", "orthogonal"]

ACTIVATIONS = ("relu", "tanh")


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
        Of the hidden layers. ReLU networks run sparse kernels (``_mlp_kernels``), tanh networks
        dense ones (``_ppo_kernels``).

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
        # the nonzero terms of one sparse product (tanh networks' dense kernels need none)
        self._tmp = np.zeros(0 if activation == "tanh" else
                             max(a * b for a, b in zip(self.sizes, self.sizes[1:])), dtype=self.dtype)
        self.params = np.zeros(off, dtype=self.dtype)
        self.grad = np.zeros(off, dtype=self.dtype)
        self._ws: dict[int, tuple] = {}
        from . import _mlp_kernels  # imports numba: only when a network is built

        self._k = _mlp_kernels
        self._kt = None
        if activation == "tanh":
            from . import _ppo_kernels

            self._kt = _ppo_kernels
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
        rng = np.random.default_rng(check_seed(seed))
        for index in range(len(self.table)):
            weight, bias = self.layer(index)
            bound = 1.0 / math.sqrt(weight.shape[1])
            weight[...] = rng.uniform(-bound, bound, weight.shape)
            bias[...] = rng.uniform(-bound, bound, bias.shape)

    def reset_orthogonal(self, seed=None, gain: float = math.sqrt(2.0), out_gain: float = 1.0) -> None:
        """Initialise as CleanRL's ``layer_init``: :func:`orthogonal` weights (``gain`` for
        hidden layers, ``out_gain`` for the output layer), biases 0.

        ``seed`` may be a ``numpy.random.Generator`` (drawn from in layer order)."""
        rng = np.random.default_rng(seed if isinstance(seed, np.random.Generator) else check_seed(seed))
        last = len(self.table) - 1
        for index in range(len(self.table)):
            weight, bias = self.layer(index)
            weight[...] = orthogonal(weight.shape, out_gain if index == last else gain, rng)
            bias[...] = 0.0

    def workspace(self, batch: int) -> tuple:
        """The arrays the kernels work in for a batch of ``batch`` rows, made on the first call
        with that size and kept (a learner that calls the kernels itself, as
        :class:`~tfdata.nn.DQN` does, passes them).

        ReLU: ``(acts, work, argmax, idx, coef, tmp)``: the layer outputs as contiguous
        ``(batch, n_out)`` blocks, two gradient buffers of the backward pass, the argmax output
        (int64, (batch,)), and the nonzero terms of one sparse product (``idx`` int64, ``coef``,
        ``tmp``; ``tmp`` is the same array for every batch size). tanh: ``(acts, work, argmax,
        xT, dT)``: the layer outputs as feature-major ``(n_out, batch)`` blocks, the gradient
        buffers, the argmax output, ``x`` and ``grad_out`` transposed.
        """
        ws = self._ws.get(batch)
        if ws is None:
            common = (np.zeros(batch * self.n_units, dtype=self.dtype),
                      np.zeros(2 * batch * self.width, dtype=self.dtype),
                      np.zeros(batch, dtype=np.int64))
            if self._kt is not None:
                rest = (np.zeros((self.n_in, batch), dtype=self.dtype),
                        np.zeros((self.n_out, batch), dtype=self.dtype))
            else:
                n = max(batch, max(self.sizes))
                rest = (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=self.dtype), self._tmp)
            ws = self._ws[batch] = common + rest
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
            acts, _, _, xT, _ = self.workspace(x.shape[0])
            self._kt.tanh_forward(self.params, self.table, x, xT, acts)
            return acts[x.shape[0] * int(self.table[-1, 4]):].reshape(self.n_out, x.shape[0]).T
        acts, _, _, idx, coef, tmp = self.workspace(x.shape[0])
        self._k.mlp_forward(self.params, self.table, x, acts, tmp, idx, coef)
        return acts[x.shape[0] * int(self.table[-1, 4]):].reshape(x.shape[0], self.n_out)

    def argmax(self, x: np.ndarray) -> np.ndarray:
        """Index of the largest output of every row of ``x`` (int64, shape (batch,), a view)."""
        x = self._check_x(x)
        if self._kt is not None:
            out = self.workspace(x.shape[0])[2]
            return np.argmax(self.forward(x), axis=1, out=out)
        acts, _, out, idx, coef, tmp = self.workspace(x.shape[0])
        self._k.mlp_argmax(self.params, self.table, x, acts, tmp, idx, coef, out)
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
            acts, work, _, xT, dT = self.workspace(x.shape[0])
            self._kt.tanh_backward(self.params, self.table, xT, acts, grad_out, self.grad, dT, work)
            return self.grad
        acts, work, _, idx, coef, tmp = self.workspace(x.shape[0])
        self._k.mlp_backward(self.params, self.table, x, acts, grad_out, self.grad, work, tmp, idx, coef)
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
                + sum(a.nbytes for ws in self._ws.values() for a in ws[:5]))  # tmp counted once

    def state_dict(self) -> dict:
        return {"sizes": list(self.sizes), "dtype": self.dtype.name, "activation": self.activation,
                "params": self.params.copy()}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field, and nothing changed, when anything is missing or does not fit (parameters
        must be finite)."""
        self.load_state(self.check_state(state))

    def check_state(self, state, prefix: str = "") -> np.ndarray:
        """The parameters of ``state``, checked as :meth:`load_state_dict` checks them (fields
        named ``prefix + key``); nothing is changed. A learner checks every part of its state
        before it loads any (:meth:`load_state`)."""
        state_fields(state, ("sizes", "params"), prefix)
        activation = state.get("activation", "relu")  # states written before tanh existed
        if activation != self.activation:
            raise state_error(prefix + "activation", repr(self.activation), repr(activation))
        sizes = state["sizes"]
        if not (isinstance(sizes, (list, tuple)) and len(sizes) == len(self.sizes)
                and all(is_int(n) and n == m for n, m in zip(sizes, self.sizes))):
            raise state_error(prefix + "sizes", f"{list(self.sizes)} ({self.n_params} params)", repr(sizes))
        return state_array(prefix + "params", state["params"], self.params)

    def load_state(self, params: np.ndarray) -> None:
        """Take the parameters :meth:`check_state` returned."""
        self.params[...] = params
