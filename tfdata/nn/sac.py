"""The continuous-control learner of :mod:`tfdata.nn`: CleanRL's soft actor-critic
(``sac_continuous_action.py``), torch-free."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .._checks import check_float, check_int, check_unit
from ._checks import is_int, state_array, state_error, state_fields, state_float, state_int
from .adam import Adam

__all__ = ["SAC"]

_PCG_MAX = (1 << 128) - 1


def _table(sizes: tuple) -> np.ndarray:
    """``(n_in, n_out, weight offset, bias offset, 0)`` per layer, as :class:`~tfdata.nn.MLP`'s."""
    table = np.zeros((len(sizes) - 1, 5), np.int64)
    off = 0
    for layer, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        table[layer] = (n_in, n_out, off, off + n_in * n_out, 0)
        off += n_in * n_out + n_out
    return table


def _views(table: np.ndarray, flat: np.ndarray) -> list:
    """``[(weight (n_out, n_in), bias (n_out,))]``: views of ``flat`` by ``table``."""
    return [(flat[w:w + n_in * n_out].reshape(n_out, n_in), flat[b:b + n_out])
            for n_in, n_out, w, b, _ in table.tolist()]


def _n_params(sizes: tuple) -> int:
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def _init(table: np.ndarray, flat: np.ndarray, rng: np.random.Generator) -> None:
    """``torch.nn.Linear``'s initialisation: weight and bias uniform in ``±1/sqrt(fan_in)``."""
    for weight, bias in _views(table, flat):
        bound = 1.0 / math.sqrt(weight.shape[1])
        weight[...] = rng.uniform(-bound, bound, weight.shape)
        bias[...] = rng.uniform(-bound, bound, bias.shape)


class SAC:
    """Soft actor-critic: a squashed-Gaussian actor, twin critics with Polyak-averaged targets,
    and an automatically tuned temperature, as CleanRL's ``sac_continuous_action.py``.

    The update, per call of :meth:`train` with CleanRL's ``global_step`` as ``step``:

    1. critics: ``y = r + (1 - terminated) * gamma * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s'))``
       with ``a'`` drawn from the actor, loss ``mse(Q1(s, a), y) + mse(Q2(s, a), y)``, one Adam
       step over both critics;
    2. when ``step % policy_frequency == 0``, ``policy_frequency`` times: the actor's loss
       ``mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a))`` with ``a`` drawn again, one Adam step;
       then (``autotune``) the temperature's loss ``mean(-alpha * (log pi(a|s) + target_entropy))``
       on a fresh draw from the updated actor, one Adam step on ``log alpha``;
    3. when ``step % target_network_frequency == 0``: ``target = tau * online + (1 - tau) * target``.

    Networks: ReLU MLPs of ``hidden`` units; the actor outputs the mean and the log standard
    deviation, squashed by tanh into ``[-5, 2]``; actions are ``tanh(x) * scale + bias`` with
    ``scale``, ``bias`` from the action bounds, and the log-probability carries the tanh
    correction ``log(scale * (1 - tanh(x)**2) + 1e-6)``. Initialisation as ``torch.nn.Linear``.
    The batched matrix products are numpy's BLAS into preallocated arrays, the rest compiled
    kernels (:mod:`._sac_kernels`); no array is allocated after the first :meth:`train` with a
    given batch size (or :meth:`act` with a given number of rows), unless ``noise`` is given.
    Workspaces are kept per batch size, as the buffer's output rings are. Results agree with torch to float32 rounding, not bit for bit.

    numpy's BLAS may run the products on several threads. Where other work shares the cores
    (the environment, a second process), limit it before numpy is imported
    (``OPENBLAS_NUM_THREADS=1``): with more BLAS threads than free cores a product can take many
    times longer (``reports/benchmarks.md``, the SAC section).

    Parameters
    ----------
    obs_dim : int
        Length of an observation (a flat float vector).
    action_low, action_high : array_like of float, shape (A,)
        The bounds of a ``Box`` action space: finite, ``low < high``.
    hidden : sequence of int, default (256, 256)
        Units of the hidden layers of the actor and of each critic.
    gamma : float, default 0.99
        Discount, in [0, 1].
    tau : float, default 0.005
        Polyak coefficient, in [0, 1].
    policy_lr, q_lr : float, default 3e-4, 1e-3
        Adam's learning rates of the actor and of the critics (and of the temperature, as CleanRL).
    alpha : float, default 0.2
        The temperature when ``autotune`` is False: finite, >= 0.
    autotune : bool, default True
        Tune the temperature towards ``target_entropy = -A``; ``log alpha`` starts at 0.
    policy_frequency, target_network_frequency : int, default 2, 1
        >= 1.
    seed : int, optional
        Seeds the initialisation and the generator of the Gaussian draws, in [0, 2**64).
    dtype : {"float32", "float64"}, default "float32"
        float64 is for the checks against torch.

    Raises
    ------
    TypeError, ValueError
        An argument of the wrong type or out of range (the message names it).

    Attributes
    ----------
    actor_params, q_params, q_target_params : ndarray, shape (n,)
        Flat parameters: the actor's, both critics' (``q_params[:n_q]`` is the first), their
        targets'. :meth:`layers` gives torch-shaped views.
    actor_grad, q_grad : ndarray
        The last gradients, of the parameters above.
    alpha : float
        The temperature in use.
    qf_loss, actor_loss, alpha_loss : float
        Of the last update (the last policy update for the latter two; nan before one).
    updates : int
        Calls of :meth:`train`.
    """

    def __init__(self, obs_dim: int, action_low, action_high, *, hidden: Sequence[int] = (256, 256),
                 gamma: float = 0.99, tau: float = 0.005, policy_lr: float = 3e-4,
                 q_lr: float = 1e-3, alpha: float = 0.2, autotune: bool = True,
                 policy_frequency: int = 2, target_network_frequency: int = 1,
                 seed: int | None = None, dtype="float32"):
        obs_dim = check_int("obs_dim", obs_dim, 1, 1 << 20)
        low, high = _bounds(action_low, action_high)
        hidden = tuple(hidden) if isinstance(hidden, (list, tuple)) else hidden
        if not (isinstance(hidden, tuple) and hidden and all(is_int(h) and 1 <= h <= 1 << 16 for h in hidden)):
            raise ValueError(f"hidden: expected a sequence of ints in [1, 65536], got {hidden!r}")
        try:
            self.dtype = np.dtype(dtype)
        except TypeError:
            raise TypeError(f"dtype must be float32 or float64, got {dtype!r}") from None
        if self.dtype not in (np.float32, np.float64):
            raise TypeError(f"dtype must be float32 or float64, got {self.dtype}")
        self.gamma = check_unit("gamma", gamma)
        self.tau = check_unit("tau", tau)
        if not isinstance(autotune, bool):
            raise TypeError(f"autotune must be a bool, got {autotune!r}")
        self.autotune = autotune
        alpha = check_float("alpha", alpha, 0.0)
        self.policy_frequency = check_int("policy_frequency", policy_frequency, 1, 1 << 20)
        self.target_network_frequency = check_int("target_network_frequency",
                                                  target_network_frequency, 1, 1 << 62)
        if seed is not None:
            seed = check_int("seed", seed, 0, (1 << 64) - 1)
        self.seed = seed
        n_act = low.shape[0]
        self.obs_dim, self.action_dim, self.hidden = obs_dim, n_act, tuple(int(h) for h in hidden)
        self.target_entropy = -float(n_act)
        dt = self.dtype
        self.action_low, self.action_high = low.astype(dt), high.astype(dt)
        # as CleanRL's buffers: computed in the space's float type
        self.action_scale = ((self.action_high - self.action_low) / dt.type(2.0)).astype(dt)
        self.action_bias = ((self.action_high + self.action_low) / dt.type(2.0)).astype(dt)

        self.actor_sizes = (obs_dim, *self.hidden, 2 * n_act)
        self.q_sizes = (obs_dim + n_act, *self.hidden, 1)
        self._actor_table, self._q_table = _table(self.actor_sizes), _table(self.q_sizes)
        self.n_q = _n_params(self.q_sizes)
        self.actor_params = np.zeros(_n_params(self.actor_sizes), dt)
        self.actor_grad = np.zeros_like(self.actor_params)
        self.q_params = np.zeros(2 * self.n_q, dt)
        self.q_grad = np.zeros_like(self.q_params)
        self.q_target_params = np.zeros_like(self.q_params)
        self._rng = np.random.default_rng(seed)
        _init(self._actor_table, self.actor_params, self._rng)
        _init(self._q_table, self.q_params[:self.n_q], self._rng)
        _init(self._q_table, self.q_params[self.n_q:], self._rng)
        self.q_target_params[...] = self.q_params
        self.actor_optim = Adam(self.actor_params, lr=policy_lr)
        self.q_optim = Adam(self.q_params, lr=q_lr)
        self.log_alpha = np.zeros(1, dt)
        self.alpha_optim = Adam(self.log_alpha, lr=q_lr)
        self._alpha_grad = np.zeros(1, dt)
        self.alpha = float(np.exp(self.log_alpha[0])) if autotune else alpha
        self.qf_loss = self.actor_loss = self.alpha_loss = math.nan
        self.updates = 0

        # torch-shaped views of every layer, and of its gradient
        self._actor = _views(self._actor_table, self.actor_params)
        self._actor_g = _views(self._actor_table, self.actor_grad)
        self._q = [_views(self._q_table, self.q_params[k * self.n_q:(k + 1) * self.n_q]) for k in (0, 1)]
        self._q_g = [_views(self._q_table, self.q_grad[k * self.n_q:(k + 1) * self.n_q]) for k in (0, 1)]
        self._qt = [_views(self._q_table, self.q_target_params[k * self.n_q:(k + 1) * self.n_q])
                    for k in (0, 1)]
        self._ws: dict[int, dict] = {}
        self._act_ws: dict[int, tuple] = {}
        from . import _sac_kernels  # imports numba: only when a learner is built

        self._k = _sac_kernels

    # -- the networks --------------------------------------------------------------------------
    def layers(self, net: str) -> list:
        """Torch-shaped views ``[(weight (n_out, n_in), bias (n_out,))]`` of ``"actor"``
        (its last layer: the mean head's rows, then the log-std head's), ``"q1"``, ``"q2"``,
        ``"q1_target"`` or ``"q2_target"``."""
        nets = {"actor": self._actor, "q1": self._q[0], "q2": self._q[1],
                "q1_target": self._qt[0], "q2_target": self._qt[1]}
        if net not in nets:
            raise ValueError(f"net must be one of {sorted(nets)}, got {net!r}")
        return nets[net]

    def _forward(self, layers, x, acts) -> None:
        last = len(layers) - 1
        h = x
        for i, (weight, bias) in enumerate(layers):
            np.matmul(h, weight.T, out=acts[i])
            self._k.bias_act(acts[i], bias, i < last)
            h = acts[i]

    def _backward(self, layers, grads, x, acts, g, work, g_in) -> None:
        """Through ``layers`` from ``g`` (d loss / d output): parameter gradients into ``grads``
        (None: none), and d loss / d ``x`` into ``g_in`` (None: not wanted)."""
        k = self._k
        for i in range(len(layers) - 1, -1, -1):
            if grads is not None:
                np.matmul(g.T, x if i == 0 else acts[i - 1], out=grads[i][0])
                k.column_sums(g, grads[i][1])
            if i > 0:
                np.matmul(g, layers[i][0], out=work[i - 1])
                k.relu_backward(work[i - 1], acts[i - 1])
                g = work[i - 1]
            elif g_in is not None:
                np.matmul(g, layers[0][0], out=g_in)

    def _workspace(self, n: int) -> dict:
        ws = self._ws.get(n)
        if ws is None:
            dt, n_act, z = self.dtype, self.action_dim, np.zeros
            hid = self.hidden
            ws = self._ws[n] = {
                "obs": z((n, self.obs_dim), dt), "next_obs": z((n, self.obs_dim), dt),
                "reward": z(n, dt), "terminated": z(n, np.bool_), "y": z(n, dt), "logp": z(n, dt),
                "a": [z((n, h), dt) for h in hid] + [z((n, 2 * n_act), dt)],
                "a_work": [z((n, h), dt) for h in hid],
                "eps": z((n, n_act), dt), "t": z((n, n_act), dt), "std": z((n, n_act), dt),
                "y_act": z((n, n_act), dt), "action": z((n, n_act), dt), "b_action": z((n, n_act), dt),
                "g_action": z((n, n_act), dt), "g_head": z((n, 2 * n_act), dt),
                "qin": z((n, self.obs_dim + n_act), dt), "qin_next": z((n, self.obs_dim + n_act), dt),
                "q": [[z((n, h), dt) for h in hid] + [z((n, 1), dt)] for _ in (0, 1)],
                "q_work": [[z((n, h), dt) for h in hid] for _ in (0, 1)],
                "g_q": [z((n, 1), dt) for _ in (0, 1)],
                "g_in": [z((n, self.obs_dim + n_act), dt) for _ in (0, 1)],
            }
        return ws

    def _sample(self, ws, obs, noise, k: int, forward: bool = True) -> None:
        """The actor at ``obs``: a squashed sample into ``ws["action"]``, its log-probability
        into ``ws["logp"]`` (noise ``noise[k]``, or the generator's). ``forward`` False: the
        actor's outputs at ``obs`` are already in the workspace."""
        if forward:
            self._forward(self._actor, obs, ws["a"])
        eps = ws["eps"]
        if noise is None:
            self._rng.standard_normal(out=eps, dtype=self.dtype)
        else:
            eps[...] = noise[k]
        self._k.squashed_gaussian(ws["a"][-1], eps, self.action_scale, self.action_bias, ws["t"],
                                  ws["std"], ws["y_act"], ws["action"], ws["logp"])

    # -- acting --------------------------------------------------------------------------------
    def act(self, obs, deterministic: bool = False) -> np.ndarray:
        """An action for an observation (shape ``(obs_dim,)``) or for each row of a batch of
        them (``(n, obs_dim)``): drawn from the actor, or ``tanh(mean) * scale + bias`` when
        ``deterministic``.

        Returns
        -------
        ndarray of the learner's dtype, shape (A,) or (n, A)
            A view of this learner's own array, overwritten by the next ``act`` with as many
            rows: copy it to keep it.

        Raises
        ------
        ValueError
            ``obs`` of another shape, or an action that is NaN or inf (NaN or inf in ``obs`` or
            in the parameters); nothing is changed but the generator's draws.

        Notes
        -----
        A sampled action takes ``A`` standard normal draws per row from the learner's generator;
        a deterministic one takes none.
        """
        shape = np.shape(obs)
        one = shape == (self.obs_dim,)
        if not one and not (len(shape) == 2 and shape[1] == self.obs_dim and shape[0] >= 1):
            raise ValueError(f"obs: expected shape ({self.obs_dim},) or (n, {self.obs_dim}), got {shape}")
        n = 1 if one else shape[0]
        ws = self._act_ws.get(n)
        if ws is None:
            dt, width = self.dtype, max(max(self.hidden), 2 * self.action_dim)
            ws = self._act_ws[n] = (np.zeros((n, self.obs_dim), dt), np.zeros((n, self.action_dim), dt),
                                    np.zeros((2, width), dt), np.zeros((n, self.action_dim), dt))
        x, eps, h, out = ws
        x[...] = obs  # one copy into the learner's float type, no allocation
        if not deterministic:
            self._rng.standard_normal(out=eps, dtype=self.dtype)
        self._k.actor_act(self.actor_params, self._actor_table, x, eps, self.action_scale,
                          self.action_bias, bool(deterministic), h, out)
        bad = self._k.first_nonfinite(out)
        if bad >= 0:
            worst = self._k.first_nonfinite(x)
            where = (f"obs holds {x.reshape(-1)[worst]} at flat index {worst}" if worst >= 0
                     else "the parameters hold NaN or inf")
            raise ValueError(f"obs: action {out.reshape(-1)[bad]} at flat index {bad} is not "
                             f"finite: {where}")
        return out[0] if one else out

    # -- learning ------------------------------------------------------------------------------
    def _check_batch(self, batch) -> int:
        """The batch size, every field checked for dtype and shape first (before a workspace of
        that size is made)."""
        obs = batch["obs"]
        if not isinstance(obs, np.ndarray) or obs.ndim != 2 or obs.shape[0] < 1:
            raise ValueError(f"batch['obs']: expected an array of shape (batch >= 1, {self.obs_dim}), "
                             f"got {getattr(obs, 'shape', type(obs).__name__)}")
        n, dt = obs.shape[0], self.dtype
        for name, dtype, shape in (("obs", dt, (n, self.obs_dim)), ("next_obs", dt, (n, self.obs_dim)),
                                   ("action", dt, (n, self.action_dim)), ("reward", dt, (n,)),
                                   ("terminated", np.bool_, (n,))):
            src = batch[name]
            if not isinstance(src, np.ndarray) or src.shape != shape or src.dtype != dtype:
                raise ValueError(f"batch[{name!r}]: expected {np.dtype(dtype)} of shape {shape}, "
                                 f"got {getattr(src, 'dtype', type(src).__name__)} of shape "
                                 f"{getattr(src, 'shape', None)}")
        return n

    def _copy_in(self, batch, ws) -> None:
        """Copy the checked batch into the workspace's contiguous arrays, then refuse a NaN or
        inf there; the learner is not changed."""
        for name in ("obs", "next_obs", "action", "reward", "terminated"):
            dst = ws["b_action" if name == "action" else name]
            dst[...] = batch[name]
            bad = -1 if name == "terminated" else self._k.first_nonfinite(dst)
            if bad >= 0:
                raise ValueError(f"batch[{name!r}]: expected finite values, got "
                                 f"{dst.reshape(-1)[bad]} at flat index {bad}; nothing was updated")
        ws["qin"][:, :self.obs_dim] = ws["obs"]
        ws["qin"][:, self.obs_dim:] = ws["b_action"]
        ws["qin_next"][:, :self.obs_dim] = ws["next_obs"]

    def train(self, batch: Mapping, step: int | None = None, *, noise=None) -> float:
        """One SAC update (see the class) on a sampled batch; returns the critics' loss.

        Parameters
        ----------
        batch : Mapping
            ``obs`` and ``next_obs`` (the learner's dtype, shape (B, obs_dim)), ``action`` (same
            dtype, (B, A), inside the bounds as the buffer holds them), ``reward`` (same dtype,
            (B,)), ``terminated`` (bool, (B,)): a :class:`tfdata.Batch` or a dict. Every float
            must be finite.
        step : int, optional
            CleanRL's ``global_step``, which decides the policy and target updates; None: the
            number of this call (``updates + 1``).
        noise : ndarray, optional
            Standard normal draws of shape ``(1 + 2 * policy_frequency, B, A)`` to use instead of
            the generator's, in the order the update takes them: the next actions', then per
            policy update the actor's and the temperature's (checks against another
            implementation).

        Raises
        ------
        ValueError
            A field of another dtype or shape, or a NaN or inf in one (the message names it);
            checked before anything is updated. Or the critics' loss is NaN or inf (parameters
            that diverged): refused before any optimizer step, the draws of the next actions
            taken.
        """
        n = self._check_batch(batch)
        if step is None:
            step = self.updates + 1
        elif not is_int(step) or step < 0:
            raise ValueError(f"step: expected an int >= 0, got {step!r}")
        if noise is not None:  # checks only: allocates a little, unlike a train without it
            noise = np.asarray(noise)
            want = (1 + 2 * self.policy_frequency, n, self.action_dim)
            if noise.shape != want or noise.dtype.kind != "f" or not np.isfinite(noise).all():
                raise ValueError(f"noise: expected finite floats of shape {want}, got "
                                 f"{noise.dtype} of shape {noise.shape}")
        ws = self._workspace(n)
        self._copy_in(batch, ws)
        k, O = self._k, self.obs_dim

        # 1. the critics
        self._sample(ws, ws["next_obs"], noise, 0)
        ws["qin_next"][:, O:] = ws["action"]
        for c in (0, 1):
            self._forward(self._qt[c], ws["qin_next"], ws["q"][c])
        # the targets' outputs are read here, before the online critics reuse the arrays
        k.critic_target(ws["reward"], ws["terminated"], ws["q"][0][-1], ws["q"][1][-1], ws["logp"],
                        self.alpha, self.gamma, ws["y"])
        loss = 0.0
        for c in (0, 1):
            self._forward(self._q[c], ws["qin"], ws["q"][c])
            loss += k.mse_backward(ws["q"][c][-1], ws["y"], ws["g_q"][c])
            self._backward(self._q[c], self._q_g[c], ws["qin"], ws["q"][c], ws["g_q"][c],
                           ws["q_work"][c], None)
        if not math.isfinite(loss):  # NaN or inf in the parameters: refuse before any step
            raise ValueError(f"the critics' loss is {loss} (NaN or inf in the parameters); "
                             f"nothing was updated")
        self.q_optim.step(self.q_grad)
        self.qf_loss = float(loss)

        # 2. the actor and the temperature
        if step % self.policy_frequency == 0:
            qin = ws["qin_next"]  # free now: the actions drawn at obs go here
            qin[:, :O] = ws["obs"]
            for it in range(self.policy_frequency):
                # after the first, the temperature's draw left the actor's outputs at obs
                self._sample(ws, ws["obs"], noise, 1 + 2 * it, forward=it == 0 or not self.autotune)
                qin[:, O:] = ws["action"]
                for c in (0, 1):
                    self._forward(self._q[c], qin, ws["q"][c])
                self.actor_loss = float(k.min_backward(ws["q"][0][-1], ws["q"][1][-1], ws["logp"],
                                                       self.alpha, ws["g_q"][0], ws["g_q"][1]))
                for c in (0, 1):
                    self._backward(self._q[c], None, qin, ws["q"][c], ws["g_q"][c], ws["q_work"][c],
                                   ws["g_in"][c])
                k.action_gradient(ws["g_in"][0], ws["g_in"][1], O, ws["g_action"])
                k.squashed_gaussian_backward(ws["g_action"], self.alpha / n, ws["eps"], ws["t"],
                                             ws["std"], ws["y_act"], self.action_scale, ws["g_head"])
                self._backward(self._actor, self._actor_g, ws["obs"], ws["a"], ws["g_head"],
                               ws["a_work"], None)
                self.actor_optim.step(self.actor_grad)
                if self.autotune:
                    self._sample(ws, ws["obs"], noise, 2 + 2 * it)
                    self.alpha_loss = float(k.temperature_gradient(ws["logp"], self.target_entropy,
                                                                   self.log_alpha, self._alpha_grad))
                    self.alpha_optim.step(self._alpha_grad)
                    self.alpha = float(np.exp(self.log_alpha[0]))

        # 3. the targets
        if step % self.target_network_frequency == 0:
            t = self.dtype.type
            k.polyak(self.q_target_params, self.q_params, t(self.tau), t(1.0 - self.tau))
        self.updates += 1
        return self.qf_loss

    @property
    def nbytes(self) -> int:
        """Bytes of parameters, gradients, optimizer moments and workspaces."""
        arrays = [self.actor_params, self.actor_grad, self.q_params, self.q_grad, self.q_target_params,
                  self.actor_optim.m, self.actor_optim.v, self.q_optim.m, self.q_optim.v]
        total = sum(a.nbytes for a in arrays)
        for ws in self._ws.values():
            for v in ws.values():
                for a in (v if isinstance(v, list) else [v]):
                    total += sum(b.nbytes for b in a) if isinstance(a, list) else a.nbytes
        return total + sum(a.nbytes for ws in self._act_ws.values() for a in ws)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything :meth:`load_state_dict` restores: parameters, optimizers, the temperature,
        the update count and the generator's state (a loaded learner continues exactly)."""
        rng = self._rng.bit_generator.state
        return {"obs_dim": self.obs_dim, "action_low": self.action_low.tolist(),
                "action_high": self.action_high.tolist(), "hidden": list(self.hidden),
                "dtype": self.dtype.name, "gamma": self.gamma, "tau": self.tau,
                "autotune": self.autotune, "alpha": self.alpha,
                "policy_frequency": self.policy_frequency,
                "target_network_frequency": self.target_network_frequency,
                "actor": self.actor_params.copy(), "q": self.q_params.copy(),
                "q_target": self.q_target_params.copy(), "log_alpha": float(self.log_alpha[0]),
                "actor_optim": self.actor_optim.state_dict(), "q_optim": self.q_optim.state_dict(),
                "alpha_optim": self.alpha_optim.state_dict(), "updates": self.updates,
                "rng": [int(rng["state"]["state"]), int(rng["state"]["inc"]),
                        int(rng["has_uint32"]), int(rng["uinteger"])]}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict`'s output, checked as untrusted input: a ValueError naming
        the field (``actor``, ``q_optim.lr``, ``rng``, ...), and nothing changed, when anything
        is missing, out of range or not this learner's shape (sizes, bounds, dtype)."""
        keys = ("obs_dim", "action_low", "action_high", "hidden", "dtype", "gamma", "tau", "autotune",
                "alpha", "policy_frequency", "target_network_frequency", "actor", "q", "q_target",
                "log_alpha", "actor_optim", "q_optim", "alpha_optim", "updates", "rng")
        state_fields(state, keys)
        for key, mine in (("obs_dim", self.obs_dim), ("hidden", list(self.hidden)),
                          ("dtype", self.dtype.name), ("autotune", self.autotune),
                          ("action_low", self.action_low.tolist()),
                          ("action_high", self.action_high.tolist())):
            value = state[key]
            if type(value) is not type(mine) or value != mine:
                raise state_error(key, f"{mine!r} (this learner's)", repr(value))
        gamma = state_float("gamma", state["gamma"], 0.0, 1.0)
        tau = state_float("tau", state["tau"], 0.0, 1.0)
        alpha = state_float("alpha", state["alpha"], 0.0)
        pf = state_int("policy_frequency", state["policy_frequency"], 1, 1 << 20)
        tnf = state_int("target_network_frequency", state["target_network_frequency"], 1, 1 << 62)
        actor = state_array("actor", state["actor"], self.actor_params)
        q = state_array("q", state["q"], self.q_params)
        q_target = state_array("q_target", state["q_target"], self.q_target_params)
        log_alpha = state_float("log_alpha", state["log_alpha"], -1e4, 1e4)
        if self.autotune and float(np.exp(self.dtype.type(log_alpha))) != alpha:
            raise state_error("alpha", f"exp(log_alpha) = {float(np.exp(self.dtype.type(log_alpha)))}",
                              repr(alpha))
        actor_optim = self.actor_optim.check_state(state["actor_optim"], "actor_optim.")
        q_optim = self.q_optim.check_state(state["q_optim"], "q_optim.")
        alpha_optim = self.alpha_optim.check_state(state["alpha_optim"], "alpha_optim.")
        updates = state_int("updates", state["updates"], 0, 1 << 62)
        rng = state["rng"]
        if not (isinstance(rng, (list, tuple)) and len(rng) == 4 and all(is_int(v) for v in rng)
                and 0 <= rng[0] <= _PCG_MAX and 0 <= rng[1] <= _PCG_MAX and rng[1] % 2 == 1
                and rng[2] in (0, 1) and 0 <= rng[3] < 1 << 32):
            raise state_error("rng", "[state, inc (odd), has_uint32 (0 or 1), uinteger], a PCG64 "
                              "state of ints in range", repr(rng))
        # everything checked: apply
        self.gamma, self.tau, self.alpha = gamma, tau, alpha
        self.policy_frequency, self.target_network_frequency = pf, tnf
        self.actor_params[...] = actor
        self.q_params[...] = q
        self.q_target_params[...] = q_target
        self.log_alpha[0] = log_alpha
        self.actor_optim.load_state(actor_optim)
        self.q_optim.load_state(q_optim)
        self.alpha_optim.load_state(alpha_optim)
        self.updates = updates
        self._rng.bit_generator.state = {"bit_generator": "PCG64",
                                         "state": {"state": int(rng[0]), "inc": int(rng[1])},
                                         "has_uint32": int(rng[2]), "uinteger": int(rng[3])}


def _bounds(low, high) -> tuple[np.ndarray, np.ndarray]:
    """The action bounds as float64 vectors, checked: same shape (A,), finite, ``low < high``."""
    out = []
    for name, value in (("action_low", low), ("action_high", high)):
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError):
            arr = np.zeros(0, object)
        if arr.dtype.kind not in "iuf":  # strings, bools, objects
            raise ValueError(f"{name}: expected finite floats of shape (A,), got {value!r}")
        arr = arr.astype(np.float64)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1 or arr.shape[0] < 1 or not np.isfinite(arr).all():
            raise ValueError(f"{name}: expected finite floats of shape (A,) with A >= 1, got {value!r}")
        out.append(arr)
    low, high = out
    if low.shape != high.shape:
        raise ValueError(f"action_high: expected shape {low.shape} (action_low's), got {high.shape}")
    if not (low < high).all():
        i = int(np.flatnonzero(~(low < high))[0])
        raise ValueError(f"action_high: expected values above action_low, got {high[i]} <= {low[i]} "
                         f"at index {i}")
    return low, high
