"""tfdata.sb3.ReplayBuffer against Stable-Baselines3's own ReplayBuffer: the same add() calls go
into both, and every sampled row must equal what SB3's buffer holds at the same (pos, env), as
SB3's ``_get_samples`` returns it (dtypes and shapes included); SB3's algorithms learn with it;
pickling continues bit for bit; Atari stacks through VecFrameStack are checked bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

sb3 = pytest.importorskip("stable_baselines3")
th = pytest.importorskip("torch")
gym = pytest.importorskip("gymnasium")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common import buffers as sb3_buffers  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.save_util import load_from_pkl, save_to_pkl  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

import tfdata  # noqa: E402
import tfdata.sb3  # noqa: E402

FIELDS = ("observations", "actions", "next_observations", "dones", "rewards")
ENVS = {"CartPole-v1": {"max_episode_steps": 25}, "Pendulum-v1": {"max_episode_steps": 30}}


def sb3_at(ref, pos, env, venv=None):
    """SB3's ``_get_samples`` for rows ``(pos[i], env[i])`` (its env indices are drawn with
    ``np.random.randint``: given here instead)."""
    saved = np.random.randint
    np.random.randint = lambda *a, **k: np.asarray(env, dtype=np.int64)
    try:
        return ref._get_samples(np.asarray(pos, dtype=np.int64), env=venv)
    finally:
        np.random.randint = saved


def assert_rows_equal(ours, ref, fields=FIELDS):
    for f in fields:
        a, b = getattr(ours, f), getattr(ref, f)
        if a is None and b is None:
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, (f, a.dtype, b.dtype, a.shape, b.shape)
        assert th.equal(a, b), f


def check_batch(ours, ref, batch, venv=None) -> int:
    """Compare each row of the drop-in's ``batch`` with SB3's buffer at the same (pos, env); the
    rows of the step SB3 wrote last are skipped once the ring is full: the drop-in holds that
    step back (see tfdata.sb3.ReplayBuffer, Notes), and still holds the older transition there
    that SB3's buffer overwrote. Returns the rows compared."""
    pos, e = ours.positions(ours.last_indices)
    keep = np.ones(len(pos), bool)
    if ours.full:
        keep = pos != (ours.pos - 1) % ours.buffer_size
    idx = th.from_numpy(np.flatnonzero(keep))
    expected = sb3_at(ref, pos[keep], e[keep], venv)
    got = batch._replace(**{f: getattr(batch, f)[idx] for f in FIELDS})
    assert_rows_equal(got, expected)
    return int(keep.sum())


def roll(env, steps, buffers, seed=0, reset_at=()):
    """Random steps of a VecEnv, added to every buffer as SB3's ``_store_transition`` adds them
    (the terminal observation as next_obs at an episode's end)."""
    env.action_space.seed(seed)
    obs = env.reset()
    for t in range(steps):
        if t in reset_at:  # what learn(reset_num_timesteps=True) does mid-episode
            obs = env.reset()
        action = np.array([env.action_space.sample() for _ in range(env.num_envs)])
        new_obs, reward, done, infos = env.step(action)
        next_obs = new_obs.copy()
        for i, d in enumerate(done):
            if d and infos[i].get("terminal_observation") is not None:
                next_obs[i] = infos[i]["terminal_observation"]
        for b in buffers:
            b.add(obs, next_obs, action, reward, done, infos)
        obs = new_obs


def pair(env, buffer_size, handle=True, **kwargs):
    args = (buffer_size, env.observation_space, env.action_space)
    ours = tfdata.sb3.ReplayBuffer(*args, n_envs=env.num_envs, handle_timeout_termination=handle,
                                   seed=3, **kwargs)
    ref = sb3_buffers.ReplayBuffer(*args, n_envs=env.num_envs, handle_timeout_termination=handle)
    return ours, ref


@pytest.mark.parametrize("env_id", sorted(ENVS))
@pytest.mark.parametrize("n_envs", [1, 4, 12])
@pytest.mark.parametrize("handle", [True, False])
@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_rows_equal_sb3s_buffer(env_id, n_envs, handle, layout):
    """Every sampled row against SB3's buffer given the same adds; steps are staged and written
    to tfdata in batches (17 steps of one env, 5 of 4, 2 of 12), so samples come both before
    and after the stage fills."""
    env = make_vec_env(env_id, n_envs=n_envs, seed=1, env_kwargs=ENVS[env_id])
    ours, ref = pair(env, 48 * n_envs, handle, layout=layout)
    assert isinstance(ours, sb3_buffers.ReplayBuffer)
    assert ours.buffer_size == ref.buffer_size and ours.obs_shape == ref.obs_shape
    steps = 130  # the ring wraps more than twice
    env.action_space.seed(0)
    obs = env.reset()
    for t in range(steps):
        action = np.array([env.action_space.sample() for _ in range(n_envs)])
        new_obs, reward, done, infos = env.step(action)
        next_obs = new_obs.copy()
        for i, d in enumerate(done):
            if d:
                next_obs[i] = infos[i]["terminal_observation"]
        ours.add(obs, next_obs, action, reward, done, infos)
        ref.add(obs, next_obs, action, reward, done, infos)
        obs = new_obs
        assert (ours.pos, ours.full, ours.size()) == (ref.pos, ref.full, ref.size())
        if t >= 3 and t % (23 if n_envs == 1 else 7) in (0, 3):
            batch = ours.sample(32)
            assert check_batch(ours, ref, batch) >= 24
            assert batch.discounts is None
            # SB3's own sample: the same dtypes and shapes
            own = ref.sample(32)
            for f in FIELDS:
                assert getattr(own, f).dtype == getattr(batch, f).dtype
                assert getattr(own, f).shape == getattr(batch, f).shape
    # timeouts both ways: not terminal when handled, terminal when not
    held = len(ours.tfdata_buffer)
    batch = ours.sample(held)
    check_batch(ours, ref, batch)
    pos, e = ours.positions(ours.last_indices)
    fresh = pos != (ours.pos - 1) % ours.buffer_size
    pos, e, batch = pos[fresh], e[fresh], batch._replace(dones=batch.dones[th.from_numpy(fresh)])
    ended = ref.dones[pos, e] == 1
    timeout = np.array([False] * len(pos))
    if handle:
        timeout = ref.timeouts[pos, e] == 1
        if env_id == "Pendulum-v1":  # never terminates: its episodes end by timeouts
            assert (ended & timeout).any()
    d = batch.dones.numpy()[:, 0]
    assert np.array_equal(d == 1, ended & ~timeout)
    if not handle:
        assert np.array_equal(d == 1, ended)


def test_timeouts_are_not_terminal_when_handled():
    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0, env_kwargs={"max_episode_steps": 10})
    for handle in (True, False):
        ours, ref = pair(env, 200, handle)
        roll(env, 41, [ours, ref])
        batch = ours.sample(80)
        assert check_batch(ours, ref, batch) == 80  # not full: every row
        pos, e = ours.positions(ours.last_indices)
        ended = ref.dones[pos, e] == 1
        assert ended.any()  # Pendulum never terminates: every end is a timeout
        assert (batch.dones.numpy()[:, 0] == 1).any() != handle


def test_dict_observations_are_refused():
    space = spaces.Dict({"a": spaces.Box(-1, 1, (3,)), "b": spaces.Discrete(4)})
    with pytest.raises(TypeError, match="Dict"):
        tfdata.sb3.ReplayBuffer(100, space, spaces.Discrete(2))


def test_refusals_name_the_option():
    box, act = spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2)
    with pytest.raises(NotImplementedError, match="update_priorities"):
        tfdata.sb3.ReplayBuffer(100, box, act, prioritized=True)
    with pytest.raises(ValueError, match="not a multiple of 3"):
        tfdata.sb3.ReplayBuffer(100, box, act, frame_stack=3)
    img_last = spaces.Box(0, 255, (84, 84, 4), np.uint8)
    with pytest.raises(ValueError, match="first axis"):
        tfdata.sb3.ReplayBuffer(100, img_last, act, frame_stack=4)
    with pytest.raises(ValueError, match="frame_stack"):
        tfdata.sb3.ReplayBuffer(100, box, act, frame_stack="auto")
    with pytest.raises(ValueError, match="n_step"):
        tfdata.sb3.ReplayBuffer(100, box, act, n_step=0)


def test_discrete_observations_and_extend_reset_to_torch():
    env = make_vec_env("FrozenLake-v1", n_envs=2, seed=0, env_kwargs={"is_slippery": True})
    ours, ref = pair(env, 64)
    assert ours.obs_shape == (1,)
    roll(env, 40, [ours, ref])
    assert ours.full
    check_batch(ours, ref, ours.sample(16))
    # extend (BaseBuffer's: one add per step) gives the same buffer as the adds
    other, _ = pair(env, 64)
    obs = np.arange(6).reshape(3, 2) % 16
    nxt = (obs + 1) % 16
    acts = np.ones((3, 2), np.int64)
    other.extend(obs, nxt, acts, np.zeros((3, 2), np.float32), np.zeros((3, 2), bool), [[{}, {}]] * 3)
    assert other.size() == 3 and len(other.tfdata_buffer) == 4  # the newest step is held back
    assert isinstance(other.to_torch(np.zeros(3)), th.Tensor)
    other.reset()
    assert (other.size(), other.pos, other.full, len(other.tfdata_buffer)) == (0, 0, False, 0)


def test_n_step_windows_equal_sb3s_n_step_buffer():
    if not tfdata.sb3.HAS_DISCOUNTS:
        pytest.skip("this SB3 has no discounts in its samples")
    env = make_vec_env("CartPole-v1", n_envs=2, seed=2, env_kwargs={"max_episode_steps": 12})
    args = (400, env.observation_space, env.action_space)
    ours = tfdata.sb3.ReplayBuffer(*args, n_envs=2, n_step=3, gamma=0.9, seed=1)
    ref = sb3_buffers.NStepReplayBuffer(*args, n_envs=2, n_steps=3, gamma=0.9)
    roll(env, 60, [ours, ref])
    batch = ours.sample(100)
    pos, e = ours.positions(ours.last_indices)
    far = pos < ref.pos - 4  # windows that reach neither the newest step written nor the held one
    assert far.sum() > 30
    expected = sb3_at(ref, pos[far], e[far])
    for f in ("observations", "actions", "next_observations", "dones"):
        got = getattr(batch, f)[th.from_numpy(far)]
        assert th.equal(got, getattr(expected, f)), f
    # tfdata sums in float64, SB3 in float32: equal to rounding
    for f in ("rewards", "discounts"):
        got = getattr(batch, f)[th.from_numpy(far)]
        assert got.dtype == th.float32 and th.allclose(got, getattr(expected, f), rtol=1e-6), f
    assert (expected.discounts < 0.8).any() and (expected.discounts > 0.85).any()


def test_vecnormalize_normalization_equals_sb3s():
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), norm_obs=True, norm_reward=True)
    ours, ref = pair(venv, 200)
    venv.action_space.seed(0)
    venv.reset()
    last = venv.get_original_obs()
    for _ in range(50):
        action = np.array([venv.action_space.sample() for _ in range(2)])
        _, _, done, infos = venv.step(action)
        new, reward = venv.get_original_obs(), venv.get_original_reward()
        nxt = new.copy()
        for i, d in enumerate(done):
            if d:
                nxt[i] = venv.unnormalize_obs(infos[i]["terminal_observation"])
        for b in (ours, ref):
            b.add(last, nxt, action, reward, done, infos)
        last = new
    assert check_batch(ours, ref, ours.sample(64, env=venv), venv) == 64


def test_pickle_round_trip_continues_bit_for_bit(tmp_path):
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    ours, _ = pair(env, 64)
    roll(env, 50, [ours])
    ours.sample(8)
    save_to_pkl(tmp_path / "rb.pkl", ours)
    loaded = load_from_pkl(tmp_path / "rb.pkl")
    assert (loaded.pos, loaded.full, loaded.size()) == (ours.pos, ours.full, ours.size())
    roll(env, 10, [ours, loaded], seed=5)
    for _ in range(3):
        a, b = ours.sample(32), loaded.sample(32)
        assert np.array_equal(ours.last_indices, loaded.last_indices)
        assert_rows_equal(a, b)


class Checked(tfdata.sb3.ReplayBuffer):
    """The drop-in with SB3's buffer beside it: every batch SB3's algorithm draws is compared,
    row by row, with what SB3's buffer holds at the same (pos, env)."""

    def __init__(self, buffer_size, observation_space, action_space, device="auto", n_envs=1,
                 optimize_memory_usage=False, handle_timeout_termination=True, **kwargs):
        super().__init__(buffer_size, observation_space, action_space, device, n_envs,
                         optimize_memory_usage, handle_timeout_termination, **kwargs)
        self.shadow = sb3_buffers.ReplayBuffer(buffer_size, observation_space, action_space, device,
                                               n_envs, handle_timeout_termination=handle_timeout_termination)
        self.compared = 0

    def add(self, *args):
        super().add(*args)
        self.shadow.add(*args)

    def sample(self, batch_size, env=None):
        out = super().sample(batch_size, env)
        self.compared += check_batch(self, self.shadow, out, env)
        return out


@pytest.mark.parametrize("n_envs", [1, 4])
def test_dqn_learns_with_it(n_envs):
    from stable_baselines3 import DQN

    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=0)
    model = DQN("MlpPolicy", env, replay_buffer_class=Checked, replay_buffer_kwargs={"seed": 0},
                learning_starts=200, buffer_size=500, batch_size=32, train_freq=4,
                policy_kwargs={"net_arch": [16]}, seed=0)
    model.learn(1000)
    rb = model.replay_buffer
    assert isinstance(rb, tfdata.sb3.ReplayBuffer) and rb.compared > 0
    assert rb.full  # wrapped
    # a second learn() resets the environments mid-episode: the stream is cut, not refused
    compared = rb.compared
    model.learn(300, reset_num_timesteps=True)  # trains again after learning_starts
    assert rb.resets_cut > 0 and rb.compared > compared


def test_dqn_save_and_load_replay_buffer(tmp_path):
    from stable_baselines3 import DQN

    kw = dict(replay_buffer_class=tfdata.sb3.ReplayBuffer, replay_buffer_kwargs={"seed": 1},
              learning_starts=50, buffer_size=300, policy_kwargs={"net_arch": [8]}, seed=0)
    model = DQN("MlpPolicy", "CartPole-v1", **kw)
    model.learn(150)
    model.save_replay_buffer(tmp_path / "rb")
    other = DQN("MlpPolicy", "CartPole-v1", **kw)
    other.load_replay_buffer(tmp_path / "rb")
    a, b = model.replay_buffer, other.replay_buffer
    assert type(b) is tfdata.sb3.ReplayBuffer and b.size() == a.size()
    assert_rows_equal(a.sample(64), b.sample(64))
    other.learn(100)  # a new model resets the environment: continues, cut at the reset


def test_optimize_memory_usage_is_accepted_and_a_second_learn_works():
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=tfdata.sb3.ReplayBuffer,
                optimize_memory_usage=True, learning_starts=50, buffer_size=200,
                policy_kwargs={"net_arch": [8]}, seed=0)
    model.learn(120)
    model.learn(80)  # SB3 writes replay_buffer.dones[pos] before resetting
    assert model.replay_buffer.size() > 100


def test_sac_learns_with_it():
    from stable_baselines3 import SAC

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=0)
    # learning_starts below batch_size: the first batches are larger than the rows held
    model = SAC("MlpPolicy", env, replay_buffer_class=Checked, replay_buffer_kwargs={"seed": 0},
                learning_starts=40, batch_size=64, buffer_size=1000,
                policy_kwargs={"net_arch": [16]}, seed=0)
    model.learn(250)
    assert model.replay_buffer.compared > 0


@pytest.mark.parametrize("algo", ["TD3", "DDPG"])
def test_td3_and_ddpg_learn_with_it(algo):
    """The issue's other two off-policy algorithms: every batch they train on checked against
    SB3's buffer given the same adds (TD3's delayed policy updates and target smoothing read
    the same samples), on 2 environments, the ring wrapping."""
    import stable_baselines3

    env = make_vec_env("Pendulum-v1", n_envs=2, seed=0)
    model = getattr(stable_baselines3, algo)(
        "MlpPolicy", env, replay_buffer_class=Checked, replay_buffer_kwargs={"seed": 0},
        learning_starts=60, batch_size=32, buffer_size=300, policy_kwargs={"net_arch": [16]}, seed=0)
    model.learn(400)
    rb = model.replay_buffer
    assert rb.compared > 0 and rb.full


def test_import_tfdata_imports_neither_torch_nor_sb3():
    code = "import sys, tfdata; print('torch' in sys.modules, 'stable_baselines3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


# -- Atari frames through SB3's wrappers -------------------------------------------------------

def atari_env(n_envs=2):
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    import ale_py
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack, VecTransposeImage

    gym.register_envs(ale_py)
    # frameskip=1: SB3's AtariWrapper skips 4 itself; episodes cut short to see timeouts
    env = make_atari_env("ALE/Breakout-v5", n_envs=n_envs, seed=0,
                         env_kwargs={"frameskip": 1, "max_episode_steps": 120})
    return VecTransposeImage(VecFrameStack(env, n_stack=4))


def test_atari_stacks_equal_sb3s_bit_for_bit():
    env = atari_env()
    assert env.observation_space.shape == (4, 84, 84)
    ours, ref = pair(env, 200, frame_stack=4)  # 100 steps per env: the ring wraps twice
    roll(env, 260, [ours, ref], reset_at=(150,))
    ends = ref.dones.sum()
    assert ends > 0 and ref.timeouts.sum() > 0
    assert ours.resets_cut > 0  # the reset at step 150 cut both streams
    # every stored transition, obs and next_obs stacks, bit for bit
    held = len(ours.tfdata_buffer)
    seen = np.zeros(held, bool)
    for _ in range(60):
        batch = ours.sample(held)
        check_batch(ours, ref, batch)
        seen[np.asarray(ours.last_indices)] = True
        if seen.all():
            break
    assert seen.all()
    # about one frame per transition: SB3 holds two stacks of four
    frame = 84 * 84
    parts = ours.tfdata_buffer.nbytes_parts
    assert parts["storage"] <= ours.buffer_size * 2 * (frame + 64)
    sb3_bytes = ref.observations.nbytes + ref.next_observations.nbytes
    assert (parts["storage"] + parts["bookkeeping"]) * 6 < sb3_bytes  # rings: the batches drawn


# -- CleanRL's loop: gymnasium's vector env, its info dict -------------------------------------

def cleanrl_roll(envs, steps, buffers, seed=0):
    """CleanRL's ``dqn.py`` loop (gymnasium 1.x spelling, same-step autoreset as gymnasium 0.29):
    ``rb.add(obs, real_next_obs, actions, rewards, terminations, infos)`` with the vector env's info
    dict, the final observation put back only where an episode was truncated."""
    obs, _ = envs.reset(seed=seed)
    envs.action_space.seed(seed)
    ends = 0
    for _ in range(steps):
        actions = envs.action_space.sample()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        assert isinstance(infos, dict)
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        ends += int(terminations.sum() + truncations.sum())
        for b in buffers:
            b.add(obs, real_next_obs, actions, rewards, terminations, infos)
        obs = next_obs
    return ends


def cleanrl_envs(n, max_steps, wrap=None):
    def make():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=max_steps))
        return wrap(env) if wrap else env
    return gym.vector.SyncVectorEnv([make] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


@pytest.mark.parametrize("n_envs", [1, 3])
def test_cleanrl_info_dict_is_accepted_without_timeout_handling(n_envs):
    envs = cleanrl_envs(n_envs, 9)
    args = (120 * n_envs, envs.single_observation_space, envs.single_action_space, "cpu")
    # CleanRL's own line, with handle_timeout_termination=False
    ours = tfdata.sb3.ReplayBuffer(*args, n_envs=n_envs, handle_timeout_termination=False, seed=0)
    ref = sb3_buffers.ReplayBuffer(*args, n_envs=n_envs, handle_timeout_termination=False)
    assert cleanrl_roll(envs, 60, [ours, ref]) > n_envs  # episodes ended both ways
    assert (ours.pos, ours.size()) == (ref.pos, ref.size())
    assert check_batch(ours, ref, ours.sample(64)) == 64
    # a truncation (not passed as done) is a timeout here: the next step starts a new stream
    assert ours.resets_cut > 0


class LegacyTimeLimitInfo(gym.Wrapper):
    """Reports a truncation in ``info["TimeLimit.truncated"]``, as gym's TimeLimit did."""

    def step(self, action):
        obs, r, term, trunc, info = self.env.step(action)
        return obs, r, term, trunc, {**info, "TimeLimit.truncated": trunc and not term}


def test_gymnasium_info_dict_timeouts_when_handled():
    envs = cleanrl_envs(2, 7, LegacyTimeLimitInfo)
    args = (200, envs.single_observation_space, envs.single_action_space, "cpu")
    ours = tfdata.sb3.ReplayBuffer(*args, n_envs=2, handle_timeout_termination=True, seed=0)
    obs, _ = envs.reset(seed=0)
    envs.action_space.seed(0)
    timeouts = 0
    for _ in range(40):
        actions = envs.action_space.sample()
        next_obs, rewards, terms, truncs, infos = envs.step(actions)
        real = next_obs.copy()
        for idx in np.flatnonzero(truncs | terms):
            real[idx] = infos["final_obs"][idx]
        # the ended episode's info is in final_info (same-step autoreset)
        assert "TimeLimit.truncated" not in infos or not truncs.any()
        timeouts += int(truncs.sum())
        ours.add(obs, real, actions, rewards, terms | truncs, infos)
        obs = next_obs
    assert timeouts > 0 and ours.resets_cut == 0
    tb = ours.tfdata_buffer
    term, trunc = np.asarray(tb.column("terminated")), np.asarray(tb.column("truncated"))
    assert trunc.sum() > 0 and not (term & trunc).any()
    # SB3's list of dicts still works, and a wrong length is refused naming the count
    with pytest.raises(ValueError, match="infos has 1 entries, expected n_envs=2"):
        ours.add(obs, obs, np.zeros(2, np.int64), np.zeros(2), np.zeros(2, bool), [{}])


# -- frame_padding="reset": gymnasium's FrameStackObservation, CleanRL's dqn_atari.py ----------

def stacked_envs(n, max_steps, k=4, padding="reset"):
    """CartPole through FrameStackObservation, flattened: a vector of ``k`` frames, oldest first."""
    def make():
        env = gym.make("CartPole-v1", max_episode_steps=max_steps)
        env = gym.wrappers.FrameStackObservation(env, k, padding_type=padding)
        return gym.wrappers.FlattenObservation(env)
    return gym.vector.SyncVectorEnv([make] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def gym_roll(envs, steps, buffers, seed=0, final_obs_at="both"):
    """A CleanRL-style loop; ``final_obs_at``: "both" puts the final observation back at every
    episode end (what SB3 does), "truncation" only at truncations (what CleanRL does)."""
    obs, _ = envs.reset(seed=seed)
    envs.action_space.seed(seed)
    for _ in range(steps):
        actions = envs.action_space.sample()
        next_obs, rewards, terms, truncs, infos = envs.step(actions)
        real = next_obs.copy()
        for idx in np.flatnonzero(truncs | terms if final_obs_at == "both" else truncs):
            real[idx] = infos["final_obs"][idx]
        for b in buffers:
            b.add(obs, real, actions, rewards, terms, infos)
        obs = next_obs


def check_all_rows(ours, ref, terminal_next_may_differ=False):
    """Every row written, against SB3's buffer; with ``terminal_next_may_differ``, a terminal
    row's next_observations only in its newest frame. Returns the terminal rows whose
    next_observations differed from SB3's."""
    held = len(ours.tfdata_buffer)
    seen, differed = np.zeros(held, bool), set()
    for _ in range(50):
        batch = ours.sample(held)
        pos, e = ours.positions(ours.last_indices)
        seen[np.asarray(ours.last_indices)] = True
        if ours.full:  # SB3 overwrote the step the drop-in still holds there (see check_batch)
            keep = th.from_numpy(pos != (ours.pos - 1) % ours.buffer_size)
            batch = batch._replace(**{f: getattr(batch, f)[keep] for f in FIELDS})
            pos, e = pos[keep.numpy()], e[keep.numpy()]
        expected = sb3_at(ref, pos, e)
        term = batch.dones.numpy()[:, 0] == 1
        fields = [f for f in FIELDS if f != "next_observations"]
        assert_rows_equal(batch, expected, fields)
        n, k = len(pos), ours.frame_stack or 1
        got = batch.next_observations.numpy().reshape(n, k, -1)
        want = expected.next_observations.numpy().reshape(n, k, -1)
        same = (got == want).all(axis=(1, 2))
        assert same[~term].all()
        if terminal_next_may_differ:
            assert np.array_equal(got[:, -1], want[:, -1])  # the newest frame is next_obs's
            obs = batch.observations.numpy().reshape(n, k, -1)
            assert np.array_equal(got[term, :-1], obs[term, 1:])
            differed |= set((pos * ours.n_envs + e)[term & ~same].tolist())
        else:
            assert same.all()
        if seen.all():
            break
    assert seen.all()
    return len(differed)


@pytest.mark.parametrize("n_envs", [1, 2])
def test_reset_padding_stacks_equal_sb3s(n_envs):
    envs = stacked_envs(n_envs, 18)
    args = (150 * n_envs, envs.single_observation_space, envs.single_action_space, "cpu")
    assert envs.single_observation_space.shape == (16,)
    ours = tfdata.sb3.ReplayBuffer(*args, n_envs=n_envs, handle_timeout_termination=False, seed=0,
                                   frame_stack=4, frame_padding="reset")
    ref = sb3_buffers.ReplayBuffer(*args, n_envs=n_envs, handle_timeout_termination=False)
    gym_roll(envs, 120, [ours, ref])
    assert ref.dones.sum() > 0 and ours.resets_cut > 0  # terminations and truncations
    assert check_all_rows(ours, ref) == 0
    # the same stream with SB3's zero padding is refused, naming the padding
    zero = tfdata.sb3.ReplayBuffer(*args, n_envs=n_envs, handle_timeout_termination=False, seed=0,
                                   frame_stack=4)
    with pytest.raises(ValueError, match="obs of env 0 starts a stream .* frame_padding='reset' takes"):
        gym_roll(envs, 3, [zero])


def test_frame_padding_refusals():
    box, act = spaces.Box(-1, 1, (8,), np.float32), spaces.Discrete(2)
    with pytest.raises(ValueError, match="frame_padding must be 'zero'.*'first'"):
        tfdata.sb3.ReplayBuffer(100, box, act, frame_stack=4, frame_padding="first")
    with pytest.raises(ValueError, match="without frame_stack"):
        tfdata.sb3.ReplayBuffer(100, box, act, frame_padding="reset")


def test_cleanrl_loop_terminal_next_obs_is_shifted():
    """CleanRL passes the next episode's first stack as a terminated transition's next_obs: the
    drop-in keeps obs shifted and that stack's newest frame; every other field and row as SB3's."""
    envs = stacked_envs(2, 40)
    args = (300, envs.single_observation_space, envs.single_action_space, "cpu")
    ours = tfdata.sb3.ReplayBuffer(*args, n_envs=2, handle_timeout_termination=False, seed=0,
                                   frame_stack=4, frame_padding="reset")
    ref = sb3_buffers.ReplayBuffer(*args, n_envs=2, handle_timeout_termination=False)
    gym_roll(envs, 140, [ours, ref], final_obs_at="truncation")
    assert check_all_rows(ours, ref, terminal_next_may_differ=True) > 0


def cleanrl_atari_envs(n_envs):
    """CleanRL's ``dqn_atari.py`` ``make_env`` (gymnasium 1.x names), a short time limit."""
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    import ale_py
    from stable_baselines3.common.atari_wrappers import (ClipRewardEnv, EpisodicLifeEnv, FireResetEnv,
                                                         MaxAndSkipEnv, NoopResetEnv)

    gym.register_envs(ale_py)

    def make():
        env = gym.make("BreakoutNoFrameskip-v4", max_episode_steps=400)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = NoopResetEnv(env, noop_max=30)
        env = MaxAndSkipEnv(env, skip=4)
        env = EpisodicLifeEnv(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireResetEnv(env)
        env = ClipRewardEnv(env)
        env = gym.wrappers.ResizeObservation(env, (84, 84))
        env = gym.wrappers.GrayscaleObservation(env)
        return gym.wrappers.FrameStackObservation(env, 4)
    return gym.vector.SyncVectorEnv([make] * n_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def test_cleanrl_dqn_atari_loop_with_reset_padding():
    envs = cleanrl_atari_envs(2)
    assert envs.single_observation_space.shape == (4, 84, 84)
    args = (240, envs.single_observation_space, envs.single_action_space, "cpu")
    # CleanRL's line (optimize_memory_usage=True, handle_timeout_termination=False) and the two options
    ours = tfdata.sb3.ReplayBuffer(*args, optimize_memory_usage=True, handle_timeout_termination=False,
                                   n_envs=2, seed=0, frame_stack=4, frame_padding="reset")
    ref = sb3_buffers.ReplayBuffer(*args, n_envs=2, handle_timeout_termination=False)
    gym_roll(envs, 200, [ours, ref], final_obs_at="truncation")
    assert ref.dones.sum() > 0  # lives lost: EpisodicLifeEnv's terminations
    check_all_rows(ours, ref, terminal_next_may_differ=True)


# -- what the planted-bug review found untested, and refusals that change nothing --------------

def test_reset_forgets_the_held_step():
    """After reset() the step held before it is never written: the buffer holds only the steps
    added after the reset."""
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    ours, ref = pair(env, 64)
    roll(env, 20, [ours])
    ours.reset()
    roll(env, 6, [ours, ref], seed=4)
    assert len(ours.tfdata_buffer) == 5 * 2  # the sixth step is held
    assert check_batch(ours, ref, ours.sample(10)) == 10
    assert (ours.positions(np.arange(10))[0] < 5).all()


def test_n_step_with_normalized_rewards_is_refused():
    if not tfdata.sb3.HAS_DISCOUNTS:
        pytest.skip("this SB3 has no discounts in its samples")
    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0), norm_reward=True)
    args = (100, venv.observation_space, venv.action_space)
    ours = tfdata.sb3.ReplayBuffer(*args, n_step=3, seed=0)
    roll(venv, 10, [ours])
    with pytest.raises(NotImplementedError, match="norm_reward"):
        ours.sample(4, env=venv)
    ours.sample(4, env=VecNormalize(make_vec_env("Pendulum-v1", n_envs=1), norm_reward=False))


def test_gymnasium_info_mask_hides_unset_timeouts():
    """gymnasium's ``_key`` mask says which environments set a key: a value where the mask is
    False is not that environment's (not a timeout)."""
    box, act = spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(2)
    ours = tfdata.sb3.ReplayBuffer(100, box, act, n_envs=2, seed=0)
    obs = np.zeros((2, 2), np.float32)
    infos = {"TimeLimit.truncated": np.array([True, True]),
             "_TimeLimit.truncated": np.array([False, True])}
    ours.add(obs, obs + 1, np.zeros(2, np.int64), np.zeros(2), np.ones(2, bool), infos)
    ours.add(obs + 5, obs + 6, np.zeros(2, np.int64), np.zeros(2), np.zeros(2, bool), [{}, {}])
    tb = ours.tfdata_buffer
    assert np.asarray(tb.column("terminated")).tolist() == [True, False]
    assert np.asarray(tb.column("truncated")).tolist() == [False, True]


def test_float64_actions_are_stored_as_float32_as_sb3_does():
    box = spaces.Box(-1, 1, (3,), np.float32)
    act = spaces.Box(-1, 1, (2,), np.float64)
    ours = tfdata.sb3.ReplayBuffer(50, box, act, seed=0)
    ref = sb3_buffers.ReplayBuffer(50, box, act)
    obs = np.zeros((1, 3), np.float32)
    for b in (ours, ref):
        b.add(obs, obs + 1, np.full((1, 2), 0.1), np.ones(1), np.zeros(1, bool), [{}])
        b.add(obs + 1, obs + 2, np.full((1, 2), 0.2), np.ones(1), np.zeros(1, bool), [{}])
    assert ours.sample(1).actions.dtype == ref.sample(1).actions.dtype == th.float32


def _state_of(b):
    # the stage as it is (tfdata_buffer would write it), and tfdata's rows
    return (b.pos, b.full, b.size(), b.resets_cut, b._staged, len(b._buffer),
            [a.copy() for a in b._stage.values()])


def _same_state(a, b):
    assert a[:6] == b[:6]
    for x, y in zip(a[6], b[6]):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("arg, value, match", [
    ("obs", np.zeros((2, 5), np.float32), "obs has 10 values .*expected 8"),
    ("next_obs", np.zeros((3, 4), np.float32), "next_obs has 12 values .*expected 8"),
    ("action", np.zeros(3, np.int64), "action has 3 values .*expected 2"),
    ("reward", np.zeros(3), r"reward has 3 values .*expected 2: shape \(2,\)"),
    ("reward", np.array(["a", "b"]), "reward of dtype <U1 cannot be cast to float32"),
    ("done", np.zeros(1, bool), "done has 1 values .*expected 2"),
    ("infos", [{}, 3], "infos holds int entries"),
])
def test_a_refused_add_names_the_argument_and_changes_nothing(arg, value, match):
    box, act = spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2)
    ours = tfdata.sb3.ReplayBuffer(100, box, act, n_envs=2, seed=0)
    obs = np.zeros((2, 4), np.float32)
    step = dict(obs=obs, next_obs=obs + 1, action=np.zeros(2, np.int64), reward=np.ones(2),
                done=np.zeros(2, bool), infos=[{}, {}])
    ours.add(**step)
    step = {**step, "obs": obs + 1, "next_obs": obs + 2}
    ours.add(**step)
    before = _state_of(ours)
    with pytest.raises(ValueError, match=match):
        ours.add(**{**step, arg: value})
    _same_state(before, _state_of(ours))
    ours.add(**{**step, "obs": obs + 2, "next_obs": obs + 3})  # continues as if never called
    assert len(ours.tfdata_buffer) == 4 and ours.resets_cut == 0


@pytest.mark.parametrize("padding", ["zero", "reset"])
@pytest.mark.parametrize("n_envs", [1, 2])
def test_a_bad_stack_is_refused_at_its_own_add_and_changes_nothing(padding, n_envs):
    """A stack tfdata would refuse (an episode's first stack not padded, a ``next_obs`` that is
    not ``obs`` shifted by one frame) is refused by the ``add`` that passes it, naming the
    environment; the held step, ``pos`` and the tfdata buffer are as they were, and the next
    good steps are written (the refusal does not come back at every later ``add``)."""
    box, act = spaces.Box(-9, 9, (4,), np.float32), spaces.Discrete(2)
    ours = tfdata.sb3.ReplayBuffer(100, box, act, n_envs=n_envs, seed=0, frame_stack=2,
                                   frame_padding=padding)
    e = n_envs

    def first(x):  # an episode's first stack of frame (x, x)
        return np.array([[0, 0, x, x] if padding == "zero" else [x, x, x, x]] * e, np.float32)

    def shifted(s, x):
        return np.concatenate([s[:, 2:], np.full((e, 2), x, np.float32)], axis=1)

    a, r, d = np.zeros(e, np.int64), np.ones(e), np.zeros(e, bool)
    s0 = first(1)
    ours.add(s0, shifted(s0, 2), a, r, d, [{}] * e)
    before = _state_of(ours)
    s1 = shifted(s0, 2)
    bad_next = shifted(s1, 3)
    bad_next[-1, :2] = 5  # its older frame is not obs's newest
    with pytest.raises(ValueError, match=f"next_obs of env {e - 1} is not obs shifted by one frame"):
        ours.add(s1, bad_next, a, r, d, [{}] * e)
    _same_state(before, _state_of(ours))
    unpadded = first(7)
    unpadded[-1, :2] = 3  # a reset's first stack, not padded: starts a stream, refused
    with pytest.raises(ValueError, match=f"obs of env {e - 1} starts a stream .* not padded"):
        ours.add(unpadded, shifted(unpadded, 8), a, r, d, [{}] * e)
    _same_state(before, _state_of(ours))
    ours.add(s1, shifted(s1, 3), a, r, d, [{}] * e)  # continues as if never called
    s2 = first(4)  # a reset mid-episode: cuts the streams, then starts them again
    ours.add(s2, shifted(s2, 5), a, r, d, [{}] * e)
    assert len(ours.tfdata_buffer) == 2 * e and ours.resets_cut == e


def _pickled_state():
    import pickle

    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    ours, _ = pair(env, 64)
    roll(env, 12, [ours])
    return pickle.loads(pickle.dumps(ours)).__getstate__(), ours


@pytest.mark.parametrize("key, value, match", [
    ("buffer_size", 40, r"capacity'\] is 64, expected buffer_size \* n_envs = 80"),
    ("n_envs", 0, "n_envs is 0, expected an int >= 1"),
    ("pos", 40, "pos is 40, expected below buffer_size=32"),
    ("_held", "yes", "_held is 'yes', expected a bool"),
    ("_obs", np.zeros((3, 4), np.float32), r"_obs is \(\(3, 4\), 'float32'\), expected an array of shape \(2, 4\)"),
    ("_reward", np.zeros(2), "_reward is .*float64.*expected .*float32"),
    ("obs_shape", (5,), r"obs_shape is \(5,\), expected \(4,\)"),
    ("tfdata_state", None, "tfdata_state is 'NoneType'"),
])
def test_an_inconsistent_pickle_is_refused_before_allocating(key, value, match):
    state, ours = _pickled_state()
    state[key] = value
    rb = tfdata.sb3.ReplayBuffer.__new__(tfdata.sb3.ReplayBuffer)
    with pytest.raises(ValueError, match=match):
        rb.__setstate__(state)
    # the same state, untouched, loads
    good, _ = _pickled_state()
    rb.__setstate__(good)
    assert rb.size() == ours.size()
