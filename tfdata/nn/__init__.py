"""A torch-free learner for small devices: an MLP, Adam, DQN, PPO and SAC, as numba kernels over numpy.

For a policy loop on a device where torch does not fit (a 512 MB board): the network, its
gradient and the optimizer are a few kernels over preallocated float32 arrays, the replay buffer
is tfdata's. Nothing is allocated after the first call with a given batch size.

>>> net = DQN((4, 120, 84, 2), lr=2.5e-4, gamma=0.99, seed=0)   # doctest: +SKIP
>>> action = net.act(obs)                                      # greedy action, an int
>>> loss = net.train(buffer.sample(128))                        # one Adam step
>>> net.sync_target()                                          # hard target update

The arithmetic follows torch's (``nn.Linear`` initialisation, ReLU, ``F.mse_loss``,
``torch.optim.Adam``); results agree with torch to float32 rounding, not bit for bit (sums are
taken in another order). ``tests/test_nn.py``, ``tests/test_nn_ppo.py`` and ``tests/test_nn_sac.py``
check every gradient against torch, and the kernels against slow references.

One module per part: :mod:`.mlp` (:class:`MLP`, ReLU or tanh, and :func:`orthogonal`),
:mod:`.adam` (:class:`Adam`), :mod:`.dqn` (:class:`DQN`), :mod:`.ppo` (:class:`PPO`),
:mod:`.sac` (:class:`SAC`), and their kernels beside them: :mod:`._mlp_kernels` (ReLU networks,
Adam's step, the DQN step), :mod:`._ppo_kernels` (tanh networks, categorical sampling, the PPO
step) and :mod:`._sac_kernels` (the squashed Gaussian, the critics' target, acting; SAC's
batched products are numpy's BLAS). Importing this package
imports neither numba nor the kernels; building the first network does.
"""

from __future__ import annotations

from .adam import Adam
from .dqn import DQN
from .mlp import MLP, orthogonal
from .ppo import PPO
from .sac import SAC

__all__ = ["MLP", "Adam", "DQN", "PPO", "SAC", "orthogonal"]
