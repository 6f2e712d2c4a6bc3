"""Exceptions raised by tfdata."""

from __future__ import annotations


class SpecError(ValueError, TypeError):
    """Input does not match the schema: a missing, unknown or misspelled field, a wrong shape,
    an unsafe dtype cast, or a value that is not numeric data.

    The message names the field, what was expected and what was given. It subclasses both
    ValueError and TypeError so either ``except`` clause catches it. Whatever raised it has changed
    nothing.
    """


class StaleBatchError(ValueError):
    """A :class:`~tfdata.Batch` was used after its output-ring slot was reused by a later sample:
    its arrays now hold another batch's rows. Raised by reading its fields or attributes,
    iterating it, ``copy()`` and ``update_priorities``. Keep a batch longer with
    ``sample(copy=True)`` or ``batch.copy()`` while it is valid. A ValueError, like the refusal
    of an update whose rows were overwritten since the sample."""


class FormatError(ValueError):
    """A file is not a dataset tfdata can read: wrong magic, an unknown version, a header that
    disagrees with the file's size, or fields that are not numeric data.

    The message names the file and what is wrong. Nothing is mapped or read beyond the header
    when it is raised.
    """


class AllocatorError(RuntimeError):
    """An allocator cannot be used: its library is missing, cannot be loaded into this process
    (the message says exactly what to set or install), or its handle is closed."""


class MemoryBudgetError(MemoryError):
    """Building (or growing) something would exceed its ``memory_budget``.

    Raised before anything is allocated; the message gives the budget, what was asked for, part by
    part, and the largest size that fits where there is one.
    """


class SharedBufferError(RuntimeError):
    """A shared-memory buffer cannot be used as asked: its owner closed it, a shard already has
    a live writer, or a method of the other mode was called (``sample`` on a FIFO buffer). The
    message says which buffer, shard and process."""


class WriterLostWarning(RuntimeWarning):
    """A writer process of a shared buffer died without closing its shard. The rows it had
    published stay available; rows it was writing are never sampled or delivered. The message
    names the shard, the process and how many slots were left mid-write."""
