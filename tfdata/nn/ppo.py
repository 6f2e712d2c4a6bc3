"""The policy-gradient learner of :mod:`tfdata.nn`: CleanRL's PPO over two tanh
:class:`~.mlp.MLP` s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .._checks import check_float
from .._rng import splitmix64
from ._checks import (F32_MAX, LR_MAX, SEED_MAX, check_seed, is_int, state_array, state_error,
                      state_fields, state_float)
from .adam import Adam
from .mlp import MLP

__all__ = ["PPO"]


#: PPO's float coefficients ``(name, low, low open)``; each also at most float32's largest
_PPO_COEFS = (("clip_coef", 0.0, False), ("ent_coef", 0.0, False), ("vf_coef", 0.0, False))
#: :attr:`PPO.stats`, in the order of the kernel's ``stats[1:]``
_PPO_STATS = ("pg_loss", "v_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac", "grad_norm")
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
        if not layers or not all(is_int(h) and h >= 1 for h in layers):
            raise ValueError(f"hidden must be a non-empty sequence of positive ints, got {hidden!r}")
        hidden = tuple(int(h) for h in layers)
        coefs = {name: check_float(name, value, low, low_open=low_open, high=F32_MAX)
                 for (name, low, low_open), value in zip(_PPO_COEFS, (clip_coef, ent_coef, vf_coef))}
        if max_grad_norm is not None:
            max_grad_norm = check_float("max_grad_norm", max_grad_norm, 0.0, low_open=True, high=F32_MAX)
        for name, value in (("clip_vloss", clip_vloss), ("norm_adv", norm_adv)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 63))
        self.seed = check_seed(seed)
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
        # hyperparameters as the kernel reads them (see _ppo_kernels.ppo_train)
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
        from . import _ppo_kernels  # imports numba: only when a learner is built

        self._kp = _ppo_kernels

    # -- hyperparameters ----------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self.optim.lr

    @lr.setter
    def lr(self, value: float) -> None:
        # 0 allowed here (an annealed rate), not at construction (as Adam's)
        self.optim.lr = check_float("lr", value, 0.0, high=LR_MAX)

    def _pack(self) -> None:
        hp = self._hp
        b1, b2 = self.optim.betas
        hp[:] = (self.optim.lr, b1, b2, self.optim.eps, self.clip_coef, self.ent_coef, self.vf_coef,
                 -1.0 if self.max_grad_norm is None else self.max_grad_norm,
                 float(self.norm_adv), float(self.clip_vloss))
        c = np.float32(self.clip_coef)
        self._cst[:] = (c, np.float32(1.0) - c, np.float32(1.0) + c)

    # -- acting -------------------------------------------------------------------------------
    def _check_obs(self, obs, where: str = "obs", rows: str = "E >= 1") -> np.ndarray:
        if not isinstance(obs, np.ndarray) or obs.dtype != np.float32 or obs.ndim != 2 \
                or obs.shape[1] != self.obs_size or obs.shape[0] < 1:
            raise ValueError(f"{where}: expected float32 of shape ({rows}, {self.obs_size}), got "
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
        b = self._check_obs(obs, "minibatch['obs']", "B").shape[0]
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
        """pg_loss, v_loss, entropy, old_approx_kl, approx_kl, clipfrac (floats, as CleanRL logs
        them) and grad_norm (before clipping) of the last :meth:`train` (zeros before it)."""
        return {name: float(v) for name, v in zip(_PPO_STATS, self._stats[1:])}

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
        state_fields(state, ("obs_size", "n_actions", "hidden", "params", "optim", "clip_coef",
                              "clip_vloss", "ent_coef", "vf_coef", "max_grad_norm", "norm_adv", "rng"))
        for key, want in self._config().items():
            got = state[key]
            if key == "hidden":
                ok = (isinstance(got, (list, tuple)) and len(got) == len(want)
                      and all(is_int(g) and g == w for g, w in zip(got, want)))
            else:
                ok = is_int(got) and got == want
            if not ok:
                raise state_error(key, repr(want), repr(got))
        params = state_array("params", state["params"], self.params)
        optim = self.optim.check_state(state["optim"], "optim.")
        coefs = {name: state_float(name, state[name], low, F32_MAX, low_open=low_open)
                 for name, low, low_open in _PPO_COEFS}
        mgn = state["max_grad_norm"]
        if mgn is not None:
            mgn = state_float("max_grad_norm", mgn, 0.0, F32_MAX, low_open=True)
        for key in ("clip_vloss", "norm_adv"):
            if not isinstance(state[key], (bool, np.bool_)):
                raise state_error(key, "a bool", repr(state[key]))
        rng = state["rng"]
        if not (isinstance(rng, (list, tuple)) and len(rng) == 2
                and all(is_int(x) and 0 <= x <= SEED_MAX for x in rng)):
            raise state_error("rng", "[key, counter], two ints in [0, 2**64)", repr(rng))
        # everything checked: apply
        self.params[...] = params
        self.optim.load_state(optim)
        self.clip_coef, self.ent_coef, self.vf_coef = (coefs[k] for k in ("clip_coef", "ent_coef", "vf_coef"))
        self.max_grad_norm = mgn
        self.clip_vloss, self.norm_adv = bool(state["clip_vloss"]), bool(state["norm_adv"])
        self._rng[0], self._rng[1] = np.uint64(rng[0]), np.uint64(rng[1])

