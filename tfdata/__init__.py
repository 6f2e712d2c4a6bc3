"""tfdata: numba-compiled replay buffers and datasets over numpy, for constrained hardware.

Importing tfdata does not import numba and compiles nothing; the kernels are loaded (from
numba's on-disk cache when warm) when the first buffer is built.
"""

from __future__ import annotations

from . import _config

_config.install_cache_dir()

from . import alloc, io, memory, nn  # noqa: E402
from .batch import Batch  # noqa: E402
from .replay.buffer import ReplayBuffer  # noqa: E402
from .dataset import ArrayDataset, Dataset, MmapDataset  # noqa: E402
from .loader import DataLoader, LoaderConfig  # noqa: E402
from .errors import (AllocatorError, FormatError, MemoryBudgetError, SharedBufferError,  # noqa: E402
                     SpecError, StaleBatchError, WriterLostWarning)
from .replay.limiter import RateLimiter  # noqa: E402
from .replay.prioritized import PrioritizedReplayBuffer  # noqa: E402
from .replay.mixed import MixedBatch, MixedReplayBuffer  # noqa: E402
from .rollout import RolloutBuffer  # noqa: E402
from .shared import SharedReplayBuffer, SharedWriter  # noqa: E402
from .spec import Field, Spec  # noqa: E402
from .storage import AoSStorage, SoAStorage, make_storage  # noqa: E402
from . import transforms  # noqa: E402
from .transforms import (Cast, ClipReward, Compiled, Function, Normalize, RandomShift,  # noqa: E402
                         ScaleReward)

from . import datasets  # noqa: E402  (minari and h5py are imported when a conversion runs)

__version__ = "0.2.0"

__all__ = ["AllocatorError", "MemoryBudgetError", "alloc", "memory", "nn", "ArrayDataset", "DataLoader", "Dataset", "FormatError", "LoaderConfig", "MmapDataset", "io", "Batch", "ReplayBuffer", "PrioritizedReplayBuffer", "MixedReplayBuffer", "MixedBatch", "RateLimiter", "RolloutBuffer", "Spec", "Field", "SpecError", "StaleBatchError", "AoSStorage", "SoAStorage",
           "make_storage", "SharedReplayBuffer", "SharedWriter", "SharedBufferError", "WriterLostWarning",
           "transforms", "Cast", "ClipReward", "Compiled", "Function", "Normalize", "RandomShift",
           "ScaleReward", "__version__"]
__all__.append("datasets")
