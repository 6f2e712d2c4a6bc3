"""Every kernel against its slow reference in tests/naive.py."""

from __future__ import annotations

import numpy as np
import pytest

from tfdata import kernels
from tfdata.replay.samplers.uniform import UniformSampler
from tfdata.spec import Spec
from tfdata.storage import make_storage

from . import naive
from .conftest import CARTPOLE, ODD, random_rows


@pytest.mark.parametrize("n", [1, 2, 3, 7, 33, 1000, 2**31 + 11, 2**32 - 1])
@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_draw_indices_matches_reference(n, seed):
    s = UniformSampler(seed)
    s.state[1] = 5
    idx = np.empty(300, np.int64)
    kernels.draw_indices(n, s.state, idx)
    ref, counter = naive.draw_indices(naive.key_of(seed), 5, n, 300)
    np.testing.assert_array_equal(idx, ref)
    assert s.counter == counter
    assert idx.min() >= 0 and idx.max() < n


def test_draw_indices_uniform():
    # chi-square over 7 bins with 70,000 draws; the 0.999 quantile for 6 dof is 22.46
    s = UniformSampler(123)
    idx = np.empty(70_000, np.int64)
    kernels.draw_indices(7, s.state, idx)
    counts = np.bincount(idx, minlength=7)
    chi2 = ((counts - 10_000) ** 2 / 10_000).sum()
    assert chi2 < 22.46, counts


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("fields", [CARTPOLE, ODD, {"x": "u1"}, {"img": ("u1", (4, 21, 21))}],
                         ids=["cartpole", "odd", "one-byte", "image"])
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_gather_matches_fancy_indexing(layout, fields, capacity):
    spec = Spec(fields)
    st = make_storage(spec, capacity, layout)
    data = random_rows(spec, capacity, np.random.default_rng(capacity))
    st.write_rows(0, [data[n] for n in spec.names], 0, capacity)
    idx = np.random.default_rng(1).integers(0, capacity, 50)
    out = st.new_output(64)  # larger than the batch: kernels fill only the first rows
    st.gather(idx, out)
    ref = naive.gather_fields(data, idx)
    for name in spec.names:
        np.testing.assert_array_equal(out.fields[name][:50], ref[name])
        assert not out.fields[name][50:].any()


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_sample_uniform_matches_reference(layout, capacity):
    spec = Spec(ODD)
    st = make_storage(spec, capacity, layout)
    data = random_rows(spec, capacity, np.random.default_rng(0))
    st.write_rows(0, [data[n] for n in spec.names], 0, capacity)
    s = UniformSampler(99)
    out = st.new_output(40)
    key, counter = naive.key_of(99), 0
    for n in range(1, capacity + 1):
        st.kernels.sample_uniform(st.kernel_store, n, s.state, out.indices, out.kernel_out)
        ref_idx, counter = naive.draw_indices(key, counter, n, 40)
        np.testing.assert_array_equal(out.indices, ref_idx)
        assert s.counter == counter
        ref = naive.gather_fields(data, ref_idx)
        for name in spec.names:
            np.testing.assert_array_equal(out.fields[name], ref[name])
