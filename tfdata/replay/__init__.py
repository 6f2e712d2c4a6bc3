"""Replay: the core and its parts.

``core``        :class:`ReplayCore`: the lock, the output rings, validation, budget, state
``buffer``      :class:`ReplayBuffer` (uniform or any sampler), a constructor over the core
``prioritized`` :class:`PrioritizedReplayBuffer`, the core with the prioritized sampler
``samplers/``   the sampler contract and one file per sampler (uniform, prioritized)
``writers``     the writer contract; the ring writer and its write path
``transforms``  n-step returns and elided next fields, at sample time
``episodes``    the episode bookkeeping both transforms and slices read
``columns``     column views, statistics, running statistics (``stats=``), relabelling
``fastpush``    the per-spec generated push the writers use
``checkpoint``  save/load of a buffer as a directory; ``planning``: memory plans
"""
