"""A tfdata buffer behind Stable-Baselines3's replay buffer contract.

``DQN("CnnPolicy", env, replay_buffer_class=tfdata.sb3.ReplayBuffer,
replay_buffer_kwargs={"frame_stack": 4})`` stores one frame per Atari transition instead of
the two full stacks SB3's buffer keeps. This module imports ``stable_baselines3`` and ``torch``
when it is imported: it is the optional extra ``tfdata[sb3]``, reached as ``import tfdata.sb3``
(``import tfdata`` never imports it). The design and what it refuses:
``docs/design/sb3.md``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer as SB3ReplayBuffer
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape, is_image_space_channels_first
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from .replay.buffer import ReplayBuffer as TfdataReplayBuffer

__all__ = ["ReplayBuffer"]

#: SB3 releases whose ReplayBufferSamples carry per-row ``discounts`` (DQN, SAC, TD3 and DDPG
#: then bootstrap with them instead of their own ``gamma``): n-step returns need it
HAS_DISCOUNTS = hasattr(ReplayBufferSamples, "discounts")


class ReplayBuffer(SB3ReplayBuffer):
    """Stable-Baselines3's ``ReplayBuffer``, stored in a :class:`tfdata.ReplayBuffer`.

    A subclass of SB3's class (``load_replay_buffer`` checks ``isinstance``) that never runs its
    constructor, which would allocate SB3's arrays: it builds a tfdata buffer of
    ``buffer_size // n_envs * n_envs`` rows instead, one per transition, the environments
    interleaved step by step. Pass it as ``replay_buffer_class=tfdata.sb3.ReplayBuffer`` with
    options in ``replay_buffer_kwargs``.

    Parameters
    ----------
    buffer_size, observation_space, action_space, device, n_envs, handle_timeout_termination
        As SB3's ``ReplayBuffer``: ``buffer_size`` transitions in all (``buffer_size // n_envs``
        steps, at least one), timeouts (``infos[i]["TimeLimit.truncated"]``) not terminal when
        ``handle_timeout_termination``. Observation spaces: ``Box``, ``Discrete``,
        ``MultiDiscrete``, ``MultiBinary``; a ``Dict`` space raises TypeError (use SB3's
        ``DictReplayBuffer``).
    optimize_memory_usage : bool
        Accepted and without effect: ``next_obs`` is never stored but for the last row of an
        episode (see Notes), which is what SB3's option approximates, without its caveats
        (SB3 refuses it with ``handle_timeout_termination``; this buffer does not).
    layout : {"aos", "soa"} or list of lists of str, optional
        tfdata's row layout (``tfdata.ReplayBuffer``'s ``layout``); never changes a batch.
    frame_stack : int, optional
        ``n_stack`` of the ``VecFrameStack`` that made the observations. The space must be
        stacked on its first axis: a channel-first image ``(K*C, H, W)`` (what SB3 hands a
        buffer after ``VecTransposeImage``, which it adds itself for channel-last images) or a
        vector ``(K*n,)``; frames oldest first. Only the newest frame of each transition is
        stored, and every stack is checked on insert: one that does not continue its stream,
        or an episode's first stack not padded as ``frame_padding`` says, raises
        :class:`tfdata.SpecError`, naming the row. The depth cannot be read off the space
        (``(4, 84, 84)`` is 4 grey frames or one frame of 4 channels): give it.
    frame_padding : {"zero", "reset"}, default "zero"
        What precedes an episode's first frame in its first stacks: ``"zero"``, zeros, as SB3's
        ``VecFrameStack`` pads; ``"reset"``, copies of the first frame, as gymnasium's
        ``FrameStackObservation`` (its default ``padding_type="reset"``; gym's ``FrameStack``
        likewise) pads, which CleanRL's ``dqn_atari.py`` uses. Only with ``frame_stack``.
        A terminal transition (``done`` and not a timeout) whose ``next_obs`` is not ``obs``
        shifted by one frame is stored with ``obs`` shifted by one and ``next_obs``'s newest
        frame: CleanRL's loops put the final observation back only for truncations and pass
        the next episode's first stack at a termination, which only a terminal transition can
        hold (every algorithm multiplies its next value by ``1 - done``). A timeout's
        ``next_obs`` must continue the stack (SpecError otherwise).
    n_step : int, default 1
        n-step returns (tfdata's ``n_step``): ``rewards`` is the discounted return of up to
        ``n_step`` transitions of the stream, ``next_observations`` and ``dones`` those of the
        window's last transition, and the samples' ``discounts`` is ``gamma ** k`` for the
        ``k`` taken; windows stop at an episode end (terminal or timeout) and at the newest
        stored step, as SB3's ``NStepReplayBuffer`` does. SB3's DQN, SAC, TD3 and DDPG
        bootstrap with ``discounts`` when a batch has them (SB3 releases with
        ``NStepReplayBuffer``, 2.9 among them; older ones would use ``gamma`` alone and mix an
        n-step return with a one-step discount, so there ``n_step > 1`` raises ValueError). ``n_steps`` (SB3's spelling) is accepted.
    gamma : float, default 0.99
        The discount of the n-step return: give the algorithm's ``gamma``.
    prioritized : bool, default False
        Refused when True (NotImplementedError): SB3's DQN, SAC and TD3 neither weight their
        loss by importance weights nor call ``update_priorities``, so a prioritized buffer
        would draw by priorities that never change from their initial maximum.
    seed : int, optional
        Seed of the sampling generator (tfdata's ``seed``). SB3 draws its buffer's rows from
        numpy's global generator, which the algorithm's ``seed`` seeds; tfdata never uses a
        global generator, so a run is repeated only with ``seed=`` given here as well.
        None draws one from the OS, recorded in the state.
    ring_size : int, default 2
        Batches kept per batch size before their memory is reused (see Notes).
    allocator, memory_budget
        As :class:`tfdata.ReplayBuffer`.

    Notes
    -----
    **Memory.** A row holds ``obs``, the action, the reward and two flags. ``next_obs`` is not
    stored: it is the next row's ``obs`` of the same environment, except at an episode's end
    (SB3 passes the terminal observation as ``next_obs``; tfdata keeps it in a table of final
    observations) and for each environment's newest row. With ``frame_stack`` only the newest
    frame of ``obs`` is stored, and the final frame at an episode's end: about one frame per
    transition. ``nbytes`` and ``tfdata_buffer.nbytes_parts`` give the bytes (``output_rings``:
    the batches, ``ring_size`` per batch size drawn);
    :func:`tfdata.memory.max_capacity` the largest buffer that fits a budget.

    **The newest step is held back.** A step passed to :meth:`add` is written into tfdata
    when the next step arrives: only then is it known whether the stream continued. SB3
    resets the environments when ``learn`` is called again with ``reset_num_timesteps=True``
    (or after ``load_replay_buffer`` into a new model) without marking the newest transition
    done; such a transition is stored as a timeout (an episode end that is not terminal, as it
    was). ``size()``, ``pos`` and ``full`` count the held step, as SB3 counts it; ``sample``
    draws from the steps written, so the newest step joins the draws one step later than with
    SB3's buffer, and an n-step window stops before it. The steps before it are staged and
    written to tfdata together, up to 16 rows in one call (17 steps of one environment, 5 of
    4), and before every ``sample``, pickle or :attr:`tfdata_buffer`: what a sample draws from
    is the same, and an ``add`` costs a copy into the stage. A step is checked at its own
    ``add`` (its stacks too, with ``frame_stack``), so a staged step is never refused later.

    **Batch lifetime.** On the CPU the tensors of a sample are ``torch.from_numpy`` views of
    tfdata's output ring, no copy: they hold the batch until ``ring_size`` more samples of the
    same batch size were drawn (by default the one after next), when the ring reuses the
    memory. SB3's algorithms use a batch within one gradient step; keep one longer with
    ``.clone()``. While the buffer holds fewer rows than ``batch_size`` (SAC's first
    steps: ``learning_starts`` below ``batch_size``), a sample is several smaller draws copied
    into new arrays. On another device the tensors are copies.

    **Pickling** (SB3's ``save_replay_buffer`` / ``load_replay_buffer``): the pickle holds the
    SB3-side attributes and the tfdata buffer's ``state_dict()`` (plain numpy arrays and
    scalars), and loading rebuilds the buffer and restores that state, validated as any state
    is; the SB3-side attributes (sizes, shapes, the held step's arrays) are checked against
    each other and that state before the buffer is allocated (ValueError naming the
    attribute). Sampling continues bit for bit. Not a tfdata checkpoint: SB3 writes one file, or a
    file object, and a checkpoint is a directory; the file is SB3's pickle either way.
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, layout=None, frame_stack: int | None = None,
                 frame_padding: str = "zero", n_step: int = 1, gamma: float = 0.99, n_steps: int | None = None,
                 prioritized: bool = False, seed: int | None = None, ring_size: int = 2,
                 allocator=None, memory_budget=None):
        if isinstance(observation_space, spaces.Dict):
            raise TypeError(f"tfdata.sb3.ReplayBuffer: observation_space is a Dict space "
                            f"({observation_space}); expected Box, Discrete, MultiDiscrete or "
                            f"MultiBinary. Use SB3's DictReplayBuffer for Dict observations")
        if prioritized:
            raise NotImplementedError(
                "tfdata.sb3.ReplayBuffer: prioritized=True is refused: SB3's DQN, SAC and TD3 do "
                "not weight their loss by importance weights and never call update_priorities, "
                "so every priority would stay at its initial value")
        if n_steps is not None:
            if n_step not in (1, n_steps):
                raise ValueError(f"n_step={n_step} and n_steps={n_steps} given: give one")
            n_step = n_steps
        if not isinstance(n_step, (int, np.integer)) or isinstance(n_step, bool) or n_step < 1:
            raise ValueError(f"n_step must be an int >= 1, got {n_step!r}")
        if n_step > 1 and not HAS_DISCOUNTS:
            raise ValueError("n_step > 1 needs a Stable-Baselines3 whose samples carry discounts "
                             "(2.9 does), which its algorithms bootstrap with; this release would "
                             "discount an n-step return by gamma once")
        if not isinstance(n_envs, (int, np.integer)) or isinstance(n_envs, bool) or n_envs < 1:
            raise ValueError(f"n_envs must be an int >= 1, got {n_envs!r}")
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        self.frame_stack = _frame_depth(frame_stack, observation_space, self.obs_shape)
        if frame_padding not in ("zero", "reset"):
            raise ValueError(f"frame_padding must be 'zero' (SB3's VecFrameStack) or 'reset' "
                             f"(gymnasium's FrameStackObservation), got {frame_padding!r}")
        if frame_padding != "zero" and not self.frame_stack:
            raise ValueError(f"frame_padding={frame_padding!r} given without frame_stack: it says "
                             f"how stacks are padded, and only frame_stack stores stacks by frame")
        self.frame_padding = frame_padding
        self.n_step, self.gamma = int(n_step), float(gamma)
        self._options = {"layout": layout, "seed": seed, "ring_size": ring_size,
                         "allocator": allocator, "memory_budget": memory_budget}
        self._obs_dtype = np.dtype(observation_space.dtype)
        self._action_dtype = np.dtype(self._maybe_cast_dtype(action_space.dtype))
        self._buffer = self._make_buffer()
        self._make_stage()
        #: streams cut by an environment reset that did not end an episode (see Notes)
        self.resets_cut = 0
        self.last_indices = None

    def _make_stage(self) -> None:
        """The steps added and not yet written to tfdata: ``_stage[field][:_staged]``, oldest
        first, the newest held back until the next step says whether its streams continued.
        Written in one extend of up to 16 rows (the generated one-step extend) when the stage
        is full, and before every sample."""
        e = self.n_envs
        self._depth = 16 // e + 1 if e <= 8 else 2
        shapes = {"obs": ((e, *self.obs_shape), self._obs_dtype),
                  "next_obs": ((e, *self.obs_shape), self._obs_dtype),
                  "action": ((e, self.action_dim), self._action_dtype),
                  "reward": ((e,), np.float32), "terminated": ((e,), bool), "truncated": ((e,), bool)}
        self._stage = {k: np.zeros((self._depth, *shape), dt) for k, (shape, dt) in shapes.items()}
        self._staged = 0

    def _make_buffer(self) -> TfdataReplayBuffer:
        shape, dt = self._stored_shape(), self._obs_dtype
        spec = {"obs": (dt, shape), "next_obs": (dt, shape),
                "action": (self._action_dtype, (self.action_dim,)), "reward": "f4",
                "terminated": "?", "truncated": "?"}
        o = self._options
        extra = ({"frame_stack": {"obs": self.frame_stack}, "frame_padding": self.frame_padding}
                 if self.frame_stack else {"elide_next": True})
        if self.n_step > 1:
            extra.update(n_step=self.n_step, gamma=self.gamma)
        return TfdataReplayBuffer(spec, self.buffer_size * self.n_envs, num_envs=self.n_envs,
                                  layout=o["layout"], seed=o["seed"], ring_size=o["ring_size"],
                                  allocator=o["allocator"], memory_budget=o["memory_budget"], **extra)

    def _stored_shape(self) -> tuple:
        """The obs field's shape in tfdata: ``(K, frame...)`` with a frame stack."""
        if not self.frame_stack:
            return tuple(self.obs_shape)
        k = self.frame_stack
        return (k, self.obs_shape[0] // k, *self.obs_shape[1:])

    # -- what SB3 calls -----------------------------------------------------------------------
    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Store one step of the ``n_envs`` environments, as SB3's ``ReplayBuffer.add``.

        Parameters
        ----------
        obs, next_obs : ndarray, shape (n_envs, *obs_shape)
            ``next_obs`` is the terminal observation for an environment whose episode ended.
            Cast to the space's dtype as SB3's buffer casts them (numpy assignment).
        action : ndarray, n_envs * action_dim values
            Reshaped to ``(n_envs, action_dim)`` as SB3 does (discrete actions included).
        reward, done : ndarray, shape (n_envs,)
        infos : list of dict, n_envs long, or dict of arrays, or anything
            Read only when ``handle_timeout_termination``, as SB3 reads it (CleanRL passes
            gymnasium's vector-env info dict with the flag off; it is then ignored). With the
            flag on: SB3's list of one dict per environment, ``infos[i]["TimeLimit.truncated"]``
            a timeout (not terminal); or gymnasium's vector-env dict of arrays,
            ``infos["TimeLimit.truncated"][i]`` where ``infos["_TimeLimit.truncated"][i]``
            (all when that mask is absent), and the same keys in ``infos["final_info"]``, where
            gymnasium's same-step autoreset puts an ended episode's info. gymnasium's own
            ``TimeLimit`` reports truncation in ``truncated``, not in ``infos``: pass
            ``terminated`` as ``done`` with the flag off, as CleanRL does.
        """
        e = self.n_envs
        # every argument checked and converted before anything changes: a refused call leaves
        # the held step, pos and the tfdata buffer as they were. Values already of the held
        # arrays' dtype and shape (what SB3 passes) skip the conversion.
        S = self._stage
        want, dt = S["obs"].shape[1:], self._obs_dtype
        if not (type(obs) is np.ndarray and obs.dtype is dt and obs.shape == want):
            obs = _step_array("obs", obs, want, dt)
        if not (type(next_obs) is np.ndarray and next_obs.dtype is dt and next_obs.shape == want):
            next_obs = _step_array("next_obs", next_obs, want, dt)
        a_shape = S["action"].shape[1:]
        if type(action) is np.ndarray and action.dtype is self._action_dtype and action.size == e * a_shape[1]:
            action = action.reshape(a_shape)
        else:
            action = _step_array("action", action, a_shape, self._action_dtype)
        # gymnasium's float64 rewards: numpy's assignment into the held float32 array casts them
        # as astype would, and cannot fail
        if not (type(reward) is np.ndarray and reward.dtype in _REWARDS and reward.shape == (e,)):
            reward = _step_array("reward", reward, (e,), np.float32)
        if not (type(done) is np.ndarray and done.dtype is _BOOL and done.shape == (e,)):
            done = _step_array("done", done, (e,), bool)
        timeout = self._timeouts(infos) if self.handle_timeout_termination else None
        if self.frame_stack:  # refused at this call, not when the step is written at the next
            self._check_stacks(obs, next_obs, done if timeout is None else done & ~timeout)
        j = self._staged
        if j == self._depth:
            self._flush()  # tfdata refuses nothing the checks above let in; if it did: unchanged
            j = 1
        if j and obs.tobytes() != S["next_obs"][j - 1].tobytes():  # most steps: every stream continues
            cut = self._cut_resets(obs, j - 1)
            S["truncated"][j - 1] |= cut
            self.resets_cut += int(cut.sum())
        S["obs"][j] = obs
        S["next_obs"][j] = next_obs
        S["action"][j] = action
        S["reward"][j] = reward
        if timeout is None:
            S["terminated"][j] = done
            S["truncated"][j] = False
        else:
            np.logical_and(done, ~timeout, out=S["terminated"][j])
            np.logical_and(done, timeout, out=S["truncated"][j])
        if self.frame_stack and S["terminated"][j].any():
            self._shift_terminal_stacks(j)
        self._staged = j + 1
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0

    def _timeouts(self, infos) -> np.ndarray | None:
        """``infos``' timeouts, bool ``(n_envs,)``, or None for none: SB3's list of dicts or
        gymnasium's dict."""
        e = self.n_envs
        if type(infos) is list and len(infos) == e:
            # SB3's list of dicts, most steps without a timeout
            hits = [d.get("TimeLimit.truncated", False) for d in infos if type(d) is dict]
            if len(hits) == e:
                return np.array(hits, bool) if any(hits) else None
        if isinstance(infos, dict):
            timeout = np.zeros(e, bool)
            for d in (infos, infos.get("final_info")):
                if isinstance(d, dict) and "TimeLimit.truncated" in d:
                    hit = np.asarray(d["TimeLimit.truncated"], bool).reshape(e)
                    mask = d.get("_TimeLimit.truncated")
                    timeout |= hit if mask is None else hit & np.asarray(mask, bool).reshape(e)
            return timeout
        if len(infos) != e:
            raise ValueError(f"add: infos has {len(infos)} entries, expected n_envs={e} (one dict "
                             f"per environment) or gymnasium's vector-env info dict")
        if not all(isinstance(i, dict) for i in infos):
            given = sorted({type(i).__name__ for i in infos if not isinstance(i, dict)})
            raise ValueError(f"add: infos holds {', '.join(given)} entries, expected one dict per "
                             f"environment (SB3's list) or gymnasium's vector-env info dict")
        return np.array([bool(i.get("TimeLimit.truncated", False)) for i in infos])

    def _check_stacks(self, obs: np.ndarray, next_obs: np.ndarray, terminated: np.ndarray) -> None:
        """ValueError unless tfdata will accept this step's stacks when it is written: each
        ``next_obs`` (but a terminal one, shifted by :meth:`_shift_terminal_stacks`) is ``obs``
        shifted by one frame, and an ``obs`` that starts its stream (the first step, after an
        episode's end or a reset that cut it) is padded as ``frame_padding`` says. A stream
        that continues needs nothing more: its stack is the held ``next_obs``, checked so."""
        k, e, S, h = self.frame_stack, self.n_envs, self._stage, self._staged - 1
        o, nx = obs.reshape(e, k, -1), next_obs.reshape(e, k, -1)
        held = S["next_obs"][h].reshape(e, k, -1)
        for i in range(e):
            if not terminated[i] and o[i, 1:].tobytes() != nx[i, :-1].tobytes():
                raise ValueError(f"add: next_obs of env {i} is not obs shifted by one frame (its "
                                 f"first {k - 1} frames must be obs's last {k - 1}), and the "
                                 f"transition is not terminal: frame_stack={k} stores one frame per step")
            if h >= 0 and not (S["terminated"][h, i] or S["truncated"][h, i]) and \
                    o[i].tobytes() == held[i].tobytes():
                continue  # the stream continues
            if self.frame_padding == "zero":
                bad = np.any(o[i, :-1].view(np.uint8))
                want = (f"its first {k - 1} frames zero, as SB3's VecFrameStack pads (frame_padding="
                        f"'zero'; frame_padding='reset' takes gymnasium's FrameStackObservation's copies)")
            else:
                bad = o[i, :-1].tobytes() != np.repeat(o[i, -1:], k - 1, axis=0).tobytes()
                want = (f"its first {k - 1} frames copies of its last, as gymnasium's "
                        f"FrameStackObservation pads (frame_padding='reset')")
            if bad:
                raise ValueError(f"add: obs of env {i} starts a stream (the first step, or after an "
                                 f"episode's end or a reset) but is not padded as an episode's "
                                 f"first stack: expected {want}")

    def _shift_terminal_stacks(self, j: int) -> None:
        """A terminal transition's ``next_obs`` (of staged step ``j``) that does not continue
        its stack (CleanRL's loops pass the next episode's first stack): ``obs`` shifted by
        one frame and ``next_obs``'s newest frame instead (see ``frame_padding``)."""
        k, S = self.frame_stack, self._stage
        obs = S["obs"][j].reshape(self.n_envs, k, -1)
        nxt = S["next_obs"][j].reshape(self.n_envs, k, -1)
        for i in np.flatnonzero(S["terminated"][j]):
            if not np.array_equal(obs[i, 1:].view(np.uint8), nxt[i, :-1].view(np.uint8)):
                nxt[i, :-1] = obs[i, 1:]

    def _cut_resets(self, obs: np.ndarray, h: int) -> np.ndarray:
        """The streams of staged step ``h`` that ``obs`` (the next step's) does not continue
        (to end as timeouts), bool ``(n_envs,)``; nothing changes here."""
        S = self._stage
        ended = S["terminated"][h] | S["truncated"][h]
        held = S["next_obs"][h]
        cut = np.zeros(self.n_envs, bool)
        for i in range(self.n_envs):
            # bytes, as tfdata compares them (-0.0 is not 0.0, a NaN equals itself)
            if not ended[i] and obs[i].tobytes() != held[i].tobytes():
                cut[i] = True
        return cut

    def _flush(self) -> None:
        """Write every staged step but the newest to tfdata, in one extend, and keep the newest
        as the stage's first; nothing changes if tfdata refuses."""
        j = self._staged
        if j <= 1:
            return
        k, e, S = j - 1, self.n_envs, self._stage
        rows = k * e
        shape = (rows, *self._stored_shape())
        self._buffer.extend({"obs": S["obs"][:k].reshape(shape), "next_obs": S["next_obs"][:k].reshape(shape),
                             "action": S["action"][:k].reshape(rows, -1), "reward": S["reward"][:k].reshape(rows),
                             "terminated": S["terminated"][:k].reshape(rows),
                             "truncated": S["truncated"][:k].reshape(rows)})
        for a in S.values():
            a[0] = a[k]
        self._staged = 1

    def sample(self, batch_size: int, env=None) -> ReplayBufferSamples:
        """Draw ``batch_size`` transitions uniformly, with replacement, from the steps written.

        Returns SB3's ``ReplayBufferSamples`` as SB3's buffer builds them: ``observations`` and
        ``next_observations`` of the space's dtype and ``(B, *obs_shape)``, ``actions``
        ``(B, action_dim)``, ``dones`` float32 ``(B, 1)`` (1 for a terminal transition, 0 for a
        timeout when ``handle_timeout_termination``), ``rewards`` float32 ``(B, 1)``, and with
        ``n_step > 1`` ``discounts`` float32 ``(B, 1)``. ``env`` (a ``VecNormalize``)
        normalizes observations and rewards as SB3 does. The slots drawn are
        :attr:`last_indices` (see :meth:`positions`). Tensors on the CPU are views of the
        output ring: see the class Notes for how long they hold the batch.
        """
        self._flush()
        held = len(self._buffer)
        if held == 0:
            raise ValueError("sample: no transition written yet (a step is written when the next "
                             "one is added; SB3 samples after learning_starts steps)")
        if self.n_step > 1 and env is not None and getattr(env, "norm_reward", False):
            raise NotImplementedError(
                "sample: n-step returns with VecNormalize(norm_reward=True): tfdata sums raw "
                "rewards, SB3 normalizes (and clips) each reward before the sum")
        if batch_size <= held:
            b = self._buffer.sample(batch_size)
            f = {k: b[k] for k in ("obs", "next_obs", "action", "reward", "terminated")}
            indices, discounts = b.indices, b.discounts
        else:
            f, indices, discounts = self._sample_short(batch_size, held)
        self.last_indices = indices
        obs = f["obs"].reshape(batch_size, *self.obs_shape)
        next_obs = f["next_obs"].reshape(batch_size, *self.obs_shape)
        dones = f["terminated"].astype(np.float32).reshape(batch_size, 1)
        rewards = f["reward"].reshape(batch_size, 1)
        extra = {}
        if self.n_step > 1:
            extra["discounts"] = self._tensor(discounts.reshape(batch_size, 1))
        return ReplayBufferSamples(
            observations=self._tensor(self._normalize_obs(obs, env)),
            actions=self._tensor(f["action"]),
            next_observations=self._tensor(self._normalize_obs(next_obs, env)),
            dones=self._tensor(dones),
            rewards=self._tensor(self._normalize_reward(rewards, env)), **extra)

    def _sample_short(self, batch_size: int, held: int):
        """A batch larger than the rows held: draws of at most ``held`` rows (a power of two,
        so few output rings), copied one after the other into new arrays."""
        m = 1 << (held.bit_length() - 1)
        parts, got = [], 0
        while got < batch_size:
            b = self._buffer.sample(m, copy=True)
            parts.append(b)
            got += m
        f = {k: np.concatenate([p[k] for p in parts])[:batch_size]
             for k in ("obs", "next_obs", "action", "reward", "terminated")}
        indices = np.concatenate([p.indices for p in parts])[:batch_size]
        discounts = (np.concatenate([p.discounts for p in parts])[:batch_size]
                     if self.n_step > 1 else None)
        return f, indices, discounts

    def _tensor(self, a: np.ndarray) -> th.Tensor:
        if self.device.type != "cpu":
            return th.as_tensor(a, device=self.device)
        try:
            return th.from_numpy(a)
        except ValueError:  # a field of packed records whose stride is not a multiple of its item
            return th.from_numpy(np.ascontiguousarray(a))

    def reset(self) -> None:
        """Forget every transition (SB3's ``reset``; tfdata's ``clear``)."""
        BaseBuffer.reset(self)
        self._buffer.clear()
        self._staged = 0

    # -- what SB3 writes when it truncates the last trajectory --------------------------------
    @property
    def dones(self):
        """Write-only stand-in for SB3's ``dones`` array: ``learn`` with
        ``optimize_memory_usage=True`` writes ``dones[pos - 1] = True`` before resetting the
        environments. This buffer ends such a stream itself, as a timeout, when the next step
        shows the reset, so the write is accepted and ignored."""
        return _IgnoredWrites()

    # -- tfdata's side ------------------------------------------------------------------------
    @property
    def tfdata_buffer(self) -> TfdataReplayBuffer:
        """The :class:`tfdata.ReplayBuffer` holding the written transitions (its ``nbytes_parts``,
        ``column``, ``stats``): every step added but the newest. Writing to it directly bypasses
        :attr:`pos` and the held step."""
        self._flush()
        return self._buffer

    @property
    def nbytes(self) -> int:
        """Bytes held: the tfdata buffer's ``nbytes`` plus the staged steps."""
        return self._buffer.nbytes + sum(a.nbytes for a in self._stage.values())

    def positions(self, indices) -> tuple:
        """``(pos, env)`` of tfdata slots (``last_indices``): where SB3's buffer, given the same
        ``add`` calls, holds the same transition (``observations[pos, env]``).

        Returns
        -------
        pos, env : ndarray of int64, shape (k,)
        """
        return np.divmod(np.asarray(indices, dtype=np.int64), self.n_envs)

    # -- pickling (SB3's save_replay_buffer / load_replay_buffer) -----------------------------
    def __getstate__(self) -> dict:
        self._flush()  # the state every sample sees: all written but the held step
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("_buffer", "last_indices", "_stage", "_staged", "_depth")}
        state["_held"] = self._staged == 1
        for name, a in self._stage.items():
            state["_" + name] = a[0].copy()
        state["tfdata_state"] = self._buffer.state_dict()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        tf_state = state.pop("tfdata_state", None)
        state.setdefault("frame_padding", "zero")  # pickled before the option existed
        _check_pickled(state, tf_state)  # before the buffer it describes is allocated
        held = {name: state.pop("_" + name) for name in _STAGED}
        staged = int(bool(state.pop("_held")))
        self.__dict__.update(state)
        self.last_indices = None
        self._make_stage()
        self._staged = staged
        for name, a in held.items():
            self._stage[name][0] = a
        self._buffer = self._make_buffer()
        self._buffer.load_state_dict(tf_state)


_BOOL = np.dtype(bool)
#: the staged fields, pickled as the held step's ``_obs``, ``_next_obs``, ... (one step each)
_STAGED = ("obs", "next_obs", "action", "reward", "terminated", "truncated")
#: reward dtypes the held float32 array takes by assignment as they are
_REWARDS = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.float16))


def _step_array(name: str, value, shape: tuple, dtype) -> np.ndarray:
    """``value`` as ``shape`` and ``dtype`` (any shape of as many values, as SB3 reshapes them),
    or ValueError naming the argument, what was expected and what was given."""
    a = np.asarray(value)
    want = math.prod(shape)  # a tuple of ints: numpy's prod would run a ufunc reduction per call
    if a.size != want:
        raise ValueError(f"add: {name} has {a.size} values (shape {a.shape}), expected {want}: "
                         f"shape {shape} (n_envs first)")
    try:
        return a.reshape(shape).astype(dtype, copy=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"add: {name} of dtype {a.dtype} cannot be cast to {np.dtype(dtype)}: "
                         f"{err}") from None


def _check_pickled(state: dict, tf_state) -> None:
    """ValueError unless a pickled buffer's SB3-side attributes agree with each other and with
    its tfdata state (what the buffer is rebuilt from, allocated before the tfdata state's own
    check): sizes, shapes and the held step's arrays."""
    def bad(what, expected, given):
        raise ValueError(f"load: pickled tfdata.sb3.ReplayBuffer: {what} is {given!r}, expected "
                         f"{expected}")

    if not isinstance(tf_state, dict) or not {"capacity", "num_envs"} <= tf_state.keys():
        bad("tfdata_state", "a tfdata state dict (with capacity and num_envs)", type(tf_state).__name__)

    def count(key, low):
        v = state.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
            bad(key, f"an int >= {low}", v)
        return int(v)

    n_envs, size = count("n_envs", 1), count("buffer_size", 1)
    if tf_state["num_envs"] != n_envs:
        bad("tfdata_state['num_envs']", f"n_envs={n_envs}", tf_state["num_envs"])
    if tf_state["capacity"] != size * n_envs:
        bad("tfdata_state['capacity']", f"buffer_size * n_envs = {size * n_envs}", tf_state["capacity"])
    pos = count("pos", 0)
    if pos >= size:
        bad("pos", f"below buffer_size={size}", pos)
    for key in ("full", "_held", "handle_timeout_termination"):
        if not isinstance(state.get(key), (bool, np.bool_)):
            bad(key, "a bool", state.get(key))
    count("n_step", 1)
    space, act_space = state.get("observation_space"), state.get("action_space")
    if not isinstance(space, spaces.Space) or not isinstance(act_space, spaces.Space):
        bad("observation_space/action_space", "gymnasium spaces", (type(space).__name__,
                                                                   type(act_space).__name__))
    obs_shape, action_dim = tuple(get_obs_shape(space)), int(get_action_dim(act_space))
    if tuple(state.get("obs_shape", ())) != obs_shape:
        bad("obs_shape", f"{obs_shape} (the observation space's)", state.get("obs_shape"))
    if state.get("action_dim") != action_dim:
        bad("action_dim", f"{action_dim} (the action space's)", state.get("action_dim"))
    if state.get("frame_padding") not in ("zero", "reset"):
        bad("frame_padding", "'zero' or 'reset'", state.get("frame_padding"))
    if state.get("frame_stack") != _frame_depth(state.get("frame_stack"), space, obs_shape):
        bad("frame_stack", "None or an int", state.get("frame_stack"))
    held = {"_obs": ((n_envs, *obs_shape), state.get("_obs_dtype")),
            "_next_obs": ((n_envs, *obs_shape), state.get("_obs_dtype")),
            "_action": ((n_envs, action_dim), state.get("_action_dtype")),
            "_reward": ((n_envs,), np.float32), "_terminated": ((n_envs,), bool),
            "_truncated": ((n_envs,), bool)}
    for key, (shape, dtype) in held.items():
        a = state.get(key)
        if not isinstance(a, np.ndarray) or a.shape != shape or dtype is None or a.dtype != dtype:
            given = (a.shape, str(a.dtype)) if isinstance(a, np.ndarray) else type(a).__name__
            bad(key, f"an array of shape {shape} and dtype {dtype}", given)


class _IgnoredWrites:
    def __setitem__(self, key, value) -> None:
        pass


def _frame_depth(frame_stack, space: spaces.Space, obs_shape: tuple) -> int | None:
    """``frame_stack`` checked against the space: the stack depth, or None."""
    if frame_stack is None:
        return None
    if isinstance(frame_stack, bool) or not isinstance(frame_stack, (int, np.integer)) or frame_stack < 1:
        raise ValueError(f"frame_stack must be None or the VecFrameStack's n_stack (an int >= 1), "
                         f"got {frame_stack!r}")
    k = int(frame_stack)
    if not isinstance(space, spaces.Box):
        raise ValueError(f"frame_stack={k} needs a Box observation space, got {space}")
    shape = tuple(obs_shape)
    first_axis = len(shape) == 1 or (len(shape) == 3 and is_image_space_channels_first(space))
    if not first_axis:
        raise ValueError(f"frame_stack={k}: observation space of shape {shape} is not stacked on "
                         f"its first axis; expected a channel-first image (K*C, H, W) (SB3 adds "
                         f"VecTransposeImage to channel-last images) or a vector (K*n,)")
    if shape[0] % k:
        raise ValueError(f"frame_stack={k}: the observation space's first axis ({shape[0]}, shape "
                         f"{shape}) is not a multiple of {k}: not a stack of {k} frames")
    return k
