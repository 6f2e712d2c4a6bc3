"""Datasets of other libraries in and out of tfdata's format.

:func:`from_minari` converts a Minari dataset (the Farama standard for offline RL, which
replaced D4RL) into a tfdata dataset of transitions; :func:`to_minari` writes a tfdata dataset
or replay buffer as a Minari dataset. Minari and h5py (the ``minari`` extra) are imported when
one of them is called, not with this package. Design: docs/design/minari.md.
"""

from __future__ import annotations

from .minari_export import to_minari
from .minari_format import from_minari

__all__ = ["from_minari", "to_minari"]
