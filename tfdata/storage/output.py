"""What a gather writes into, and the views of rows the kernels read.

:class:`Output` is a preallocated batch of rows of one storage or projection (made by its
``new_output``); :func:`bytes2d` and :data:`WORD_TYPES` give the byte and word views of rows
that the row kernels copy and the episode kernels read.
"""

from __future__ import annotations

import numpy as np


class Output:
    """A preallocated batch of ``batch_size`` rows for one storage (or projection of it).

    Attributes
    ----------
    indices : ndarray of int64, shape (batch_size,)
        Row numbers of the last gather into this output.
    fields : dict of str to ndarray
        One array per field, shape ``(batch_size, *field.shape)``. For the AoS layout these are
        strided views of one structured array; for SoA and projections each is C-contiguous.
    kernel_out : ndarray or tuple of ndarray
        The same memory as the kernels see it.
    source : storage, Projection or None
        What made this output and gathers into it (``source.gather``, ``source.kernel_rows``,
        ``source.output_words``); None for a dataset's outputs.
    kernels, store
        ``source.kernels`` and ``source.kernel_store`` (None without a source): a sampler
        calls ``out.kernels.sample_uniform(out.store, ..., out.kernel_out)``, so one sampler
        fills full and projected outputs alike.
    """

    __slots__ = ("indices", "fields", "kernel_out", "records", "source", "kernels", "store")

    def __init__(self, indices, fields, kernel_out, records=None, source=None):
        self.indices = indices
        self.fields = fields
        self.kernel_out = kernel_out
        self.records = records
        self.source = source
        self.kernels = None if source is None else source.kernels
        self.store = None if source is None else source.kernel_store

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays this output owns: the indices and the rows (padding included:
        the kernels' view of them)."""
        rows = self.kernel_out if isinstance(self.kernel_out, tuple) else (self.kernel_out,)
        return int(self.indices.nbytes + sum(a.nbytes for a in rows))


def row_format(layout, names, arrays) -> tuple:
    """The row format of rows held in ``arrays`` (the arrays of a storage or a dataset, each
    ``(rows, *row_shape)``: one record array, one per field, one per group) of fields ``names``
    laid out as ``layout``: ``(layout, names, ((dtype, row_shape), ...))``, hashable.

    Two holders of one row format make interchangeable outputs (the same arrays, dtypes,
    offsets, widths and padding), so each can gather rows into an output the other made (its
    ``window``). Callers compare formats for equality only; what is inside is this package's.
    """
    return (layout, tuple(names), tuple((a.dtype, tuple(a.shape[1:])) for a in arrays))


def output_bytes(out: Output) -> tuple:
    """The rows of ``out`` as byte views, one C-contiguous ``uint8[batch_size, row_bytes]`` per
    array it holds (a record array's words, a column, a group's block): the form in which a
    holder of the same row format reads another's output."""
    kout = out.kernel_out if isinstance(out.kernel_out, tuple) else (out.kernel_out,)
    return tuple(a if a.dtype == np.uint8 else a.view(np.uint8) for a in kout)


def bytes2d(arr: np.ndarray) -> np.ndarray:
    """uint8 view ``(rows, row_bytes)`` of a C-contiguous array ``(rows, ...)``."""
    return arr.reshape(arr.shape[0], -1).view(np.uint8)


WORD_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def readonly(arr: np.ndarray) -> np.ndarray:
    """A read-only view of ``arr``: what the gather kernels read. One type for writable and
    read-only memory (a storage's rows, a dataset's mapped file, a shared region) is one
    compiled kernel per field count instead of two."""
    view = arr.view()
    view.flags.writeable = False
    return view


def word_size(*sizes: int) -> int:
    """8 if 8 divides every byte offset and width in ``sizes``, else 1: the word the episode
    and frame kernels copy and compare by. Two word types rather than four (uint16 and uint32
    too) halve the kernels compiled for them; a frame whose bytes are a multiple of 8 (any
    Atari-like frame) keeps the 64-bit words."""
    return 8 if all(s % 8 == 0 for s in sizes) else 1


def widest_word(*sizes: int) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing every byte offset and width in ``sizes``:
    the word n-step and elision copy a few small next fields by, where a byte loop over a field
    at a 4-byte offset (CartPole's AoS record) costs more than the kernels it saves compiling."""
    for word in (8, 4, 2):
        if all(s % word == 0 for s in sizes):
            return word
    return 1
