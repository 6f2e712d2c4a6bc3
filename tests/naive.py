"""Slow, obviously-correct references for every kernel and for the buffer (pure Python / numpy).

Nothing here imports tfdata: the references are independent of the code they check.
"""

from __future__ import annotations

import math

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    z &= MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def key_of(seed: int) -> int:
    return mix64(seed & MASK64)


def draw_indices(key: int, counter: int, n: int, batch: int) -> tuple[np.ndarray, int]:
    """Uniform draws in [0, n) as the kernels define them; returns (indices, new counter).

    Word ``k`` is ``mix64(key + k * GOLDEN)``; its top 32 bits ``x`` give ``(x * n) >> 32``
    unless ``(x * n) mod 2**32 < (2**32 - n) mod n`` (Lemire's rejection), which redraws.
    """
    threshold = (2**32 - n) % n
    out = []
    while len(out) < batch:
        r = mix64(key + counter * GOLDEN)
        counter += 1
        m = (r >> 32) * n
        if m & 0xFFFFFFFF >= threshold:
            out.append(m >> 32)
    return np.array(out, dtype=np.int64), counter


def gather_fields(fields: dict, idx: np.ndarray) -> dict:
    """Rows ``idx`` of every field, by fancy indexing."""
    return {k: v[idx] for k, v in fields.items()}


def gather_spans(bases: list, spans: list, idx) -> list:
    """The projection kernels' copy, byte by byte: for each ``(base, offset, width)`` of
    ``spans``, bytes ``[offset, offset + width)`` of rows ``idx`` of ``bases[base]`` (2-D uint8),
    as one ``(len(idx), width)`` uint8 array."""
    out = []
    for b, offset, width in spans:
        rows = np.zeros((len(idx), width), np.uint8)
        for i, j in enumerate(idx):
            for k in range(width):
                rows[i, k] = bases[b][int(j), offset + k]
        out.append(rows)
    return out


class RingModel:
    """The buffer as a Python list of rows in slot order, with a cursor."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.slots: list = [None] * capacity
        self.cursor = 0
        self.size = 0

    def push(self, row: dict) -> None:
        self.slots[self.cursor] = {k: np.array(v) for k, v in row.items()}
        self.cursor = (self.cursor + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def extend(self, batch: dict) -> None:
        n = len(next(iter(batch.values())))
        for i in range(n):
            self.push({k: v[i] for k, v in batch.items()})

    def clear(self) -> None:
        self.cursor = 0
        self.size = 0

    def rows(self, idx) -> dict:
        names = self.slots[0].keys()
        return {k: np.stack([self.slots[i][k] for i in idx]) for k in names}


def tree_levels(leaves: np.ndarray, size: int):
    """Sum, min and max trees built bottom-up from ``leaves`` padded to ``size`` (a power of 2),
    root at 1, leaves at ``size + s`` (a plain binary tree over every leaf, in float64)."""
    s = np.zeros(2 * size)
    mn = np.full(2 * size, np.inf)
    mx = np.zeros(2 * size)
    s[size:size + len(leaves)] = leaves
    mx[size:size + len(leaves)] = leaves
    mn[size:size + len(leaves)] = np.where(leaves > 0, leaves, np.inf)
    for i in range(size - 1, 0, -1):
        s[i] = s[2 * i] + s[2 * i + 1]
        mn[i] = min(mn[2 * i], mn[2 * i + 1])
        mx[i] = max(mx[2 * i], mx[2 * i + 1])
    return s, mn, mx


BLOCK = 16  # leaves per block of the kernels' tree (one cache line of float32)


def tree_leaves(capacity: int) -> int:
    """Leaves of the kernels' tree for ``capacity`` slots: the power of two >= capacity, at
    least one block."""
    return max(BLOCK, 1 << max(0, (capacity - 1).bit_length()))


def leaf32(x) -> np.ndarray:
    """float64 values rounded to nearest float32, overflow to inf (as the tree stores leaves)."""
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float64).astype(np.float32)


def block_tree(leaves, size: int):
    """The kernels' tree of ``leaves`` (float64, rounded to float32 here) padded to ``size``
    leaves: ``(sums, mm, leaves32)`` with ``leaves32`` float32[size], and over the
    ``NB = size // 16`` blocks a tree (root 1, block ``b`` at ``NB + b``) of float64 sums
    (a block's 16 leaves added one by one in slot order) and float32
    ``[min positive (inf if none), max (0 if none)]``, each parent from its two children."""
    lv = np.zeros(size, np.float32)
    lv[:len(leaves)] = leaf32(leaves)
    nb = size // BLOCK
    sums = np.zeros(2 * nb)
    mm = np.zeros((2 * nb, 2), np.float32)
    mm[:, 0] = np.inf  # node 0 is unused; the kernels' arrays start as an empty tree
    for b in range(nb):
        total = 0.0
        lo, hi = np.float32(np.inf), np.float32(0.0)
        for v in lv[b * BLOCK:(b + 1) * BLOCK]:
            total += float(v)
            if v > 0 and v < lo:
                lo = v
            if v > hi:
                hi = v
        sums[nb + b], mm[nb + b] = total, (lo, hi)
    for i in range(nb - 1, 0, -1):
        sums[i] = sums[2 * i] + sums[2 * i + 1]
        mm[i, 0] = min(mm[2 * i, 0], mm[2 * i + 1, 0])
        mm[i, 1] = max(mm[2 * i, 1], mm[2 * i + 1, 1])
    return sums, mm, lv


def stratified_slots(key: int, counter: int, leaves: np.ndarray, batch: int, n: int | None = None):
    """Stratified proportional draws by cumulative sums: slot of mass (i + r_i) * total / batch.

    ``n``: the live rows; a slot at or past ``n`` (only possible when leaves past the live rows
    hold mass, i.e. a corrupt tree) becomes ``n - 1``. The kernels draw nothing (and the buffer
    raises) when the total is not finite and positive; so does this: it returns None.
    """
    total = float(np.sum(leaves)) if len(leaves) else 0.0
    if not (0.0 < total < np.inf) or (n is not None and n < 1):
        return None
    cums = np.cumsum(leaves)
    out = []
    for i in range(batch):
        r = mix64(key + counter * GOLDEN)
        counter += 1
        u = (i + (r >> 11) * 2.0**-53) * (total / batch)
        slot = int(np.searchsorted(cums, u, side="right"))
        while leaves[min(slot, len(leaves) - 1)] <= 0 or slot >= len(leaves):
            slot -= 1  # past the end by rounding: the last positive leaf
        if n is not None:
            slot = min(slot, n - 1)
        out.append(slot)
    return np.array(out, dtype=np.int64), counter


FLOAT64_MAX = float(np.finfo(np.float64).max)
FLOAT64_TINY = float(np.finfo(np.float64).tiny)  # the smallest normal float64
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32


def leaf_ok(priority: float, eps: float, alpha: float, leaves: int = 0) -> bool:
    """Whether a priority is accepted: finite, >= 0, and its leaf ``(p + eps) ** alpha``
    (Python's float power), rounded to nearest float32, is a positive normal float32, so that
    the sum of up to 2**32 leaves is finite and positive (``leaves`` unused: the bounds no
    longer depend on the tree's size)."""
    p = float(priority)
    if not (p >= 0.0 and p < float("inf")):
        return False
    try:
        leaf = (p + eps) ** alpha
    except OverflowError:
        return False
    leaf = float(leaf32(leaf))
    return FLOAT32_TINY <= leaf <= FLOAT32_MAX


def first_bad_priority(priorities, eps: float, alpha: float, leaves: int) -> int:
    """Position of the first priority :func:`leaf_ok` refuses, or -1."""
    for j, p in enumerate(priorities):
        if not leaf_ok(p, eps, alpha, leaves):
            return j
    return -1


class StreamModel:
    """The raw streams as pushed: every step of every environment since the last clear.

    The buffer holds the last ``capacity // num_envs`` steps; environment ``e``'s row of step
    ``t`` is in slot ``(t * num_envs + e) % capacity`` (the documented storage scheme). Windows and
    slices are computed from the raw rows and their flags: no episode numbers, no ages.
    """

    def __init__(self, capacity: int, num_envs: int):
        self.capacity = capacity
        self.num_envs = num_envs
        self.steps: list[list[dict]] = []  # steps[t][e] is a row

    @property
    def held_steps(self) -> int:
        return min(len(self.steps), self.capacity // self.num_envs)

    @property
    def size(self) -> int:
        return self.held_steps * self.num_envs

    def extend(self, batch: dict) -> None:
        n = len(next(iter(batch.values())))
        for t in range(n // self.num_envs):
            self.steps.append([{k: np.array(v[t * self.num_envs + e]) for k, v in batch.items()}
                               for e in range(self.num_envs)])

    def clear(self) -> None:
        self.steps = []

    def locate(self, slot: int) -> tuple[int, int]:
        """(step, env) of the row held in ``slot``."""
        e = slot % self.num_envs
        for t in range(len(self.steps) - 1, len(self.steps) - 1 - self.held_steps, -1):
            if (t * self.num_envs + e) % self.capacity == slot:
                return t, e
        raise AssertionError(f"slot {slot} holds no row")

    def slot_of(self, t: int, e: int) -> int:
        return (t * self.num_envs + e) % self.capacity

    @staticmethod
    def ends(row: dict) -> bool:
        return bool(row["terminated"]) or bool(row["truncated"])

    def nstep(self, slot: int, n: int, gamma: float) -> dict:
        """The n-step transition that starts at ``slot``, as the buffer must return it."""
        t, e = self.locate(slot)
        first = self.steps[t][e]
        acc, g, k = 0.0, 1.0, 0
        while True:
            last = self.steps[t + k][e]
            acc += g * float(last["reward"])
            g *= gamma
            k += 1
            if self.ends(last) or k == n or t + k == len(self.steps):
                break
        out = dict(first)
        out["reward"] = np.array(acc, dtype=first["reward"].dtype)
        out["terminated"] = last["terminated"]
        out["truncated"] = last["truncated"]
        out["next_obs"] = last["next_obs"]
        return {"row": out, "discount": np.float32(g), "k": k,
                "last": self.slot_of(t + k - 1, e)}

    def slice(self, slot: int, length: int) -> tuple[list[dict], np.ndarray]:
        """Rows of the slice starting at ``slot``, padded with its last valid row, and the mask."""
        t, e = self.locate(slot)
        rows, mask = [], []
        for j in range(length):
            ok = t + j < len(self.steps) and (j == 0 or not self.ends(self.steps[t + j - 1][e]))
            if ok and mask and not mask[-1]:
                ok = False
            rows.append(self.steps[t + j][e] if ok else rows[-1])
            mask.append(ok)
        return rows, np.array(mask)

    def slice_valid(self, slot: int, length: int) -> bool:
        return bool(self.slice(slot, length)[1].all())


def draw_one(key: int, counter: int, n: int) -> tuple[int, int]:
    """One uniform draw in [0, n) (see :func:`draw_indices`)."""
    idx, counter = draw_indices(key, counter, n, 1)
    return int(idx[0]), counter


# -- data loader ---------------------------------------------------------------------------------


def epoch_key(seed: int, epoch: int) -> int:
    """Key of one epoch's generator: mix64(mix64(seed) + (epoch + 1) * GOLDEN)."""
    return mix64((mix64(seed & MASK64) + (epoch + 1) * GOLDEN) & MASK64)


def fisher_yates(items: list, key: int, counter: int) -> int:
    """Shuffle ``items`` in place: for i from the top, swap with a uniform j in [0, i]; returns
    the counter after the last draw. The reference of the package's one shuffle
    (``kernels._rng.shuffle`` and ``permutation``): the loader's epochs and block windows, the
    rollout buffer's minibatch epochs."""
    for i in range(len(items) - 1, 0, -1):
        j, counter = draw_one(key, counter, i + 1)
        items[i], items[j] = items[j], items[i]
    return counter


def loader_order(n: int, batch: int, mode: str, seed: int, epoch: int, drop_last: bool,
                 block_rows: int = 1, window_blocks: int = 1) -> list:
    """Row numbers of every batch of one epoch, as the loader defines them."""
    key = epoch_key(seed, epoch)
    if mode == "none":
        order = list(range(n))
    elif mode == "full":
        order = list(range(n))
        fisher_yates(order, key, 0)
    else:
        n_blocks = -(-n // block_rows)
        blocks = list(range(n_blocks))
        ctr = fisher_yates(blocks, key, 0)
        order = []
        for w in range(0, n_blocks, window_blocks):
            rows = [r for b in blocks[w:w + window_blocks] for r in range(b * block_rows, min((b + 1) * block_rows, n))]
            ctr = fisher_yates(rows, key, ctr)
            order.extend(rows)
    batches = [order[s:s + batch] for s in range(0, n, batch)]
    if drop_last and batches and len(batches[-1]) < batch:
        batches.pop()
    return [np.array(b, dtype=np.int64) for b in batches]


# -- small networks (tfdata.nn) ------------------------------------------------------------------


def mlp_forward_naive(weights: list, biases: list, x) -> list:
    """Every layer's output in float64: ``h @ W.T + b``, ReLU on all but the last layer."""
    h = np.asarray(x, dtype=np.float64)
    outs = []
    for i, (w, b) in enumerate(zip(weights, biases)):
        z = h @ np.asarray(w, dtype=np.float64).T + np.asarray(b, dtype=np.float64)
        h = np.maximum(z, 0.0) if i < len(weights) - 1 else z
        outs.append(h)
    return outs


def mlp_preactivations_naive(weights: list, biases: list, x) -> list:
    """Every hidden layer's input to its ReLU (to keep finite differences away from the kinks)."""
    outs = mlp_forward_naive(weights, biases, x)
    inputs = [np.asarray(x, dtype=np.float64)] + outs[:-1]
    return [inputs[i] @ np.asarray(weights[i], dtype=np.float64).T + biases[i]
            for i in range(len(weights) - 1)]


def mlp_backward_naive(weights: list, biases: list, x, grad_out) -> list:
    """(dW, db) of every layer by the chain rule, given d loss / d output, in float64."""
    outs = mlp_forward_naive(weights, biases, x)
    inputs = [np.asarray(x, dtype=np.float64)] + outs[:-1]
    d = np.asarray(grad_out, dtype=np.float64)
    grads = [None] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        dw = np.zeros(np.shape(weights[i]))
        for r in range(d.shape[0]):  # one outer product per row of the batch
            dw += np.outer(d[r], inputs[i][r])
        grads[i] = (dw, d.sum(axis=0))
        if i > 0:
            # through layer i's weights, then through the ReLU of layer i - 1 (no gradient at 0)
            d = (d @ np.asarray(weights[i], dtype=np.float64)) * (inputs[i] > 0)
    return grads


def adam_naive(params, grads: list, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
    """Adam as in the paper (bias-corrected moments), one step per gradient; returns
    (params, m, v) in float64."""
    p = np.array(params, dtype=np.float64)
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    b1, b2 = betas
    for t, g in enumerate(grads, start=1):
        g = np.asarray(g, dtype=np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat = m / (1 - b1 ** t)
        v_hat = v / (1 - b2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
    return p, m, v


def td_loss_naive(q, q_next, actions, rewards, terminated, discounts, weights):
    """DQN's loss ``mean(w * (q[a] - y) ** 2)`` with ``y = r + discount * (1 - term) * max q_next``;
    returns (loss, d loss / d q, |q[a] - y|) in float64."""
    q = np.asarray(q, dtype=np.float64)
    n = q.shape[0]
    rows = np.arange(n)
    y = (np.asarray(rewards, dtype=np.float64)
         + np.asarray(discounts, dtype=np.float64) * (1.0 - np.asarray(terminated, dtype=np.float64))
         * np.asarray(q_next, dtype=np.float64).max(axis=1))
    err = q[rows, actions] - y
    w = np.asarray(weights, dtype=np.float64)
    grad = np.zeros_like(q)
    grad[rows, actions] = 2.0 * w * err / n
    return float(np.mean(w * err * err)), grad, np.abs(err)


# -- tanh networks and PPO (tfdata.nn.PPO, tfdata.nn._ppo_kernels) -----------------------------
def tanh_mlp_forward_naive(weights: list, biases: list, x) -> list:
    """Every layer's output in float64: ``h @ W.T + b``, tanh on all but the last layer."""
    h = np.asarray(x, dtype=np.float64)
    outs = []
    for i, (w, b) in enumerate(zip(weights, biases)):
        z = h @ np.asarray(w, dtype=np.float64).T + np.asarray(b, dtype=np.float64)
        h = np.tanh(z) if i < len(weights) - 1 else z
        outs.append(h)
    return outs


def tanh_mlp_backward_naive(weights: list, biases: list, x, grad_out) -> list:
    """(dW, db) of every layer of a tanh network by the chain rule, in float64; tanh's derivative
    is ``1 - tanh(z)**2``."""
    outs = tanh_mlp_forward_naive(weights, biases, x)
    inputs = [np.asarray(x, dtype=np.float64)] + outs[:-1]
    d = np.asarray(grad_out, dtype=np.float64)
    grads = [None] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        dw = np.zeros(np.shape(weights[i]))
        for r in range(d.shape[0]):
            dw += np.outer(d[r], inputs[i][r])
        grads[i] = (dw, d.sum(axis=0))
        if i > 0:
            d = (d @ np.asarray(weights[i], dtype=np.float64)) * (1.0 - inputs[i] ** 2)
    return grads


def categorical_naive(logits) -> tuple:
    """Log-probabilities (B, A) and entropies (B,) of ``softmax(logits)`` row by row, float64."""
    logits = np.asarray(logits, dtype=np.float64)
    logp = np.zeros_like(logits)
    ent = np.zeros(len(logits))
    for b, row in enumerate(logits):
        m = max(row)
        lse = m + math.log(sum(math.exp(z - m) for z in row))
        for k, z in enumerate(row):
            logp[b, k] = z - lse
            ent[b] -= math.exp(z - lse) * (z - lse)
    return logp, ent


def _tie_weights(a: float, b: float) -> tuple:
    """How ``torch.max(a, b)`` (elementwise maximum) splits the gradient: half each on ties."""
    if a > b:
        return 1.0, 0.0
    if a < b:
        return 0.0, 1.0
    return 0.5, 0.5


def ppo_loss_naive(logits, values, actions, old_log_probs, advantages, returns, old_values, *,
                   clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True):
    """CleanRL ``ppo.py``'s minibatch loss and its gradient, row by row in float64.

    ``logits`` (B, A) and ``values`` (B,) are the networks' outputs. Returns ``(loss, stats,
    d loss / d logits (B, A), d loss / d values (B,))``; stats as :attr:`tfdata.nn.PPO.stats`
    (without grad_norm). Gradients follow torch's rules at kinks: ``max`` splits ties in half,
    ``clamp`` passes the gradient on its closed interval.
    """
    logits = np.asarray(logits, dtype=np.float64)
    n, n_act = logits.shape
    logp, ent = categorical_naive(logits)
    adv = np.asarray(advantages, dtype=np.float64)
    if norm_adv:
        mean = sum(adv) / n
        std = math.sqrt(sum((a - mean) ** 2 for a in adv) / (n - 1))  # unbiased, as torch's std
        adv = (adv - mean) / (std + 1e-8)
    c = float(clip_coef)
    pg = vl = okl = kl = cf = 0.0
    d_logits = np.zeros_like(logits)
    d_values = np.zeros(n)
    for b in range(n):
        a = int(actions[b])
        logratio = logp[b, a] - float(old_log_probs[b])
        ratio = math.exp(logratio)
        okl += -logratio
        kl += (ratio - 1) - logratio
        cf += abs(ratio - 1) > c
        pg1 = -adv[b] * ratio
        clipped = min(max(ratio, 1 - c), 1 + c)
        pg2 = -adv[b] * clipped
        pg += max(pg1, pg2)
        w1, w2 = _tie_weights(pg1, pg2)
        d_ratio = (w1 * -adv[b] + w2 * -adv[b] * (1 - c <= ratio <= 1 + c)) / n
        d_logp = d_ratio * ratio
        p = np.exp(logp[b])
        for k in range(n_act):
            # d logp[a] / d z_k = [k == a] - p_k;  d entropy / d z_k = -p_k (logp_k + entropy)
            d_logits[b, k] = d_logp * ((k == a) - p[k]) - ent_coef / n * -p[k] * (logp[b, k] + ent[b])
        v, r, ov = float(values[b]), float(returns[b]), float(old_values[b])
        if clip_vloss:
            unclipped = (v - r) ** 2
            delta = v - ov
            vc = ov + min(max(delta, -c), c)
            clipped_v = (vc - r) ** 2
            vl += max(unclipped, clipped_v)
            wu, wc = _tie_weights(unclipped, clipped_v)
            dv = wu * 2 * (v - r) + wc * 2 * (vc - r) * (-c <= delta <= c)
        else:
            vl += (v - r) ** 2
            dv = 2 * (v - r)
        d_values[b] = vf_coef * 0.5 * dv / n
    pg /= n
    vl = 0.5 * vl / n
    entropy = float(np.mean(ent))
    loss = pg - ent_coef * entropy + vf_coef * vl
    stats = {"pg_loss": pg, "v_loss": vl, "entropy": entropy, "old_approx_kl": okl / n,
             "approx_kl": kl / n, "clipfrac": cf / n}
    return loss, stats, d_logits, d_values


def clip_grad_norm_naive(grads, max_norm: float) -> tuple:
    """``torch.nn.utils.clip_grad_norm_`` over one flat gradient: returns (clipped copy, norm)."""
    g = np.asarray(grads, dtype=np.float64)
    norm = math.sqrt(sum(x * x for x in g))
    coef = min(max_norm / (norm + 1e-6), 1.0)
    return g * coef, norm


def categorical_sample_naive(key: int, counter: int, logits) -> tuple:
    """Actions drawn as nn._ppo_kernels.ppo_act draws them: row ``b``'s uniform is the top 53 bits
    of word ``counter + b``; the action is the first one whose cumulative probability exceeds it.
    Returns (actions, new counter)."""
    logp, _ = categorical_naive(logits)
    out = []
    for row in logp:
        u = (mix64(key + counter * GOLDEN) >> 11) / 2.0 ** 53
        counter += 1
        cum, act = 0.0, -1
        for k, lp in enumerate(row):
            p = math.exp(lp)
            cum += p
            if p > 0:
                act = k
                if u < cum:
                    break
        out.append(act)
    return np.array(out, dtype=np.int64), counter


# -- shared-memory buffers ----------------------------------------------------------------------
def shared_sample_slots(key: int, counter: int, counts: list, cap: int, batch: int):
    """Slots a shared buffer samples when no row is being written: uniform draws over the
    ``sum(counts)`` rows held, row ``u`` being the ``u``-th held slot in shard order."""
    held = [s * cap + j for s, c in enumerate(counts) for j in range(c)]
    idx, counter = draw_indices(key, counter, len(held), batch)
    return np.array([held[i] for i in idx], dtype=np.int64), counter


def shared_sample_redrawn(key: int, counter: int, counts: list, cap: int, batch: int,
                          busy: set, max_redraws: int):
    """Slots a shared buffer samples while the slots in ``busy`` are being written (and the
    writers do not move): the draws of :func:`shared_sample_slots`, then every draw that landed
    in ``busy``, first to last, drawn again alone until it does not. Returns ``(slots, counter,
    redraws)``; redraws is -1 when more than ``max_redraws`` would be needed (``slots`` is then
    as far as it got)."""
    slots, counter = shared_sample_slots(key, counter, counts, cap, batch)
    redraws = 0
    for i in range(batch):
        while int(slots[i]) in busy:
            if redraws == max_redraws:
                return slots, counter, -1
            redraws += 1
            (slots[i],), counter = shared_sample_slots(key, counter, counts, cap, 1)
    return slots, counter, redraws


def fifo_merge(published: list) -> list:
    """Delivery order of a FIFO shared buffer: ``published`` holds one list per shard of
    ``(stamp, row)`` in the shard's order; rows are merged by stamp, ties to the lower shard."""
    cursors = [0] * len(published)
    out = []
    while True:
        best = None
        for s, rows in enumerate(published):
            if cursors[s] < len(rows) and (best is None or rows[cursors[s]][0] < published[best][cursors[best]][0]):
                best = s
        if best is None:
            return out
        out.append((best, published[best][cursors[best]][1]))
        cursors[best] += 1


def episode_break_naive(episode, current, term, trunc, cursor: int, size: int, capacity: int,
                        num_envs: int) -> int:
    """Reference of ``kernels._checkpoint.first_episode_break``: replay the stamping of every
    stream in time order and report the first slot (or ``capacity + e`` for ``current``) whose
    number differs from what insertion would have given."""
    if size == 0:
        bad = [e for e in range(num_envs) if int(current[e]) != 0]
        return capacity + bad[0] if bad else -1
    start = cursor if size == capacity else 0
    order = [(start + j) % capacity for j in range(size)]  # slots, oldest step first
    for j in range(size - num_envs):
        s, n = order[j], order[j + num_envs]
        want = (int(episode[s]) + (1 if (term[s] or trunc[s]) else 0)) % 2**32
        if int(episode[n]) != want:
            return s
    for e in range(num_envs):
        s = order[size - num_envs + e]
        want = (int(episode[s]) + (1 if (term[s] or trunc[s]) else 0)) % 2**32
        if int(current[e]) != want:
            return capacity + e
    return -1


def elide_step_naive(src, nxt, term, trunc, p: int, final_idx, finals, free, n_free: int, pending,
                     has_pending, episode, current):
    """Reference of ``kernels.elide_step`` on copies: ``(code, state)``, ``code`` as the kernel
    returns it and ``state`` the arrays after the call (unchanged when refused), as a dict.

    The rule, written as a model of the generic path (``Episodes.check``, ``reserve``,
    ``write``): rows continue their stream (bytes of ``src`` equal the stream's previous next
    value unless that row ended); the final table has an entry for each ending row after the
    overwritten rows' entries are pushed back; entries are popped in row order."""
    state = {k: np.array(v) for k, v in dict(final_idx=final_idx, finals=finals, free=free,
                                               pending=pending, has_pending=has_pending,
                                               episode=episode, current=current).items()}
    n, e = len(src), len(pending)
    cap, k, nf = len(episode), len(free), len(finals)
    shapes_ok = (e > 0 and n > 0 and n % e == 0 and nxt.shape == src.shape
                 and pending.shape[1:] == src.shape[1:] and finals.shape[1:] == src.shape[1:]
                 and len(term) == n and len(trunc) == n and len(has_pending) == e
                 and len(current) == e and len(final_idx) == cap and 0 <= p and p + n <= cap
                 and 0 <= n_free <= k)
    if not shapes_ok:
        return 2, state
    ended = [bool(term[r]) or bool(trunc[r]) for r in range(n)]
    for r in range(n):
        if r < e:
            prev, live = pending[r], bool(has_pending[r])
        else:
            prev, live = nxt[r - e], not ended[r - e]
        if live and bytes(src[r]) != bytes(prev):
            return 0, state
    stack = [int(x) for x in free[:n_free]]
    olds = [int(final_idx[p + r]) for r in range(n)]
    recycled = [o for o in olds if 0 <= o < nf]
    if len(stack) + len(recycled) > k:
        return 2, state
    if len(stack) + len(recycled) < sum(ended):
        return 1, state
    stack += recycled
    fi, fin, fr = state["final_idx"], state["finals"], state["free"]
    for r in range(n):
        fi[p + r] = -1
    cur = [int(c) for c in current]
    for r in range(n):
        s = r % e
        if ended[r]:
            f = stack.pop()
            if 0 <= f < nf:
                fin[f] = nxt[r]
                fi[p + r] = f
        state["episode"][p + r] = cur[s]
        if ended[r]:
            cur[s] = (cur[s] + 1) % 2**32
        if r >= n - e:
            state["pending"][s] = nxt[r]
            state["has_pending"][s] = not ended[r]
    state["current"][:] = cur
    # the stack as the kernel leaves it: entries below n_free live, the rest as written
    fr[:len(stack)] = stack
    for j, o in enumerate(recycled):  # slots written by pushes that later pops uncovered
        pos = n_free + j
        if pos >= len(stack):
            fr[pos] = o
    state["n_free"] = len(stack)
    return -1 - len(stack), state


def final_mismatch_naive(final_slots, term, trunc, size: int) -> int:
    """Reference of ``kernels._checkpoint.first_final_mismatch``."""
    want = [s for s in range(size) if term[s] or trunc[s]]
    got = [int(x) for x in final_slots]
    for i in range(max(len(want), len(got))):
        if i >= len(want) or i >= len(got) or want[i] != got[i]:
            return i
    return -1


def prioritized_slice_starts(key: int, counter: int, leaves: np.ndarray, batch: int, n: int,
                             valid=None):
    """Start rows of ``sample_slices_prioritized``: ``batch`` stratified proportional draws;
    with ``valid`` (the set of starts whose slice fits, for policy "reject") a start outside it
    is replaced by one proportional draw over the whole mass, in slice order, until it fits."""
    starts, counter = stratified_slots(key, counter, leaves, batch, n)
    out = []
    for s in starts:
        s = int(s)
        while valid is not None and s not in valid:
            (s,), counter = stratified_slots(key, counter, leaves, 1, n)
            s = int(s)
        out.append(s)
    return np.array(out, dtype=np.int64), counter


def fold_published_naive(leaves: np.ndarray, version: np.ndarray, heads, folded, cap: int):
    """What catching up (folding) the rows published since ``folded`` does to the leaves and versions of a
    shared buffer's tree: each row of each shard in order, unless lapped (only the last ``cap``
    rows before the head), evicts its slot and takes the largest live leaf (1.0 if none).
    Returns new leaves, versions, folded positions and rows held."""
    leaves, version, folded = leaves.copy(), version.copy(), list(folded)
    for s, h in enumerate(heads):
        for r in range(max(folded[s], h - cap), h):
            slot = s * cap + r % cap
            leaves[slot] = 0.0
            version[slot] = (int(version[slot]) + 1) % (1 << (8 * version.dtype.itemsize))
            live = leaves[leaves > 0]
            leaves[slot] = live.max() if live.size else 1.0
        folded[s] = max(folded[s], h)
    return leaves, version, folded, sum(min(h, cap) for h in heads)


def writer_windows(heads, reserved, cap: int) -> set:
    """Slots a shard's writer may be writing: those of rows ``head .. reserved - 1``."""
    out = set()
    for s, (h, r) in enumerate(zip(heads, reserved)):
        for row in range(h, min(r, h + cap)):
            out.add(s * cap + row % cap)
    return out


# -- streams: both geometries, one reference ------------------------------------------------
# (tfdata/kernels/_streams.py: a ring of interleaved streams, or one stream per shard). A
# geometry only says which slots follow a slot in its stream, up to the newest row; the
# windows and slices are computed from those slots and the rows' flags alone.


def ring_forward(slot: int, cursor: int, num_envs: int, capacity: int) -> list:
    """Slots of ``slot``'s stream in a ring, from ``slot`` to its stream's newest row (the
    ``num_envs`` slots before ``cursor``), by walking ``slot + num_envs`` (mod capacity)."""
    newest = [(cursor - num_envs + e) % capacity for e in range(num_envs)]
    out = [slot]
    while out[-1] not in newest:
        out.append((out[-1] + num_envs) % capacity)
        assert len(out) <= capacity // num_envs, "a held slot reaches its newest row"
    return out


def shard_forward(slot: int, heads, cap: int) -> list:
    """Slots of ``slot``'s shard from ``slot`` to the shard's newest row as of ``heads``
    (empty when the shard holds none)."""
    s = slot // cap
    if heads[s] <= 0:
        return []
    newest = s * cap + (heads[s] - 1) % cap
    out = [slot]
    while out[-1] != newest:
        out.append(s * cap + (out[-1] - s * cap + 1) % cap)
    return out


def nstep_forward(forward: list, n: int, gamma: float, reward, term, trunc):
    """The n-step window over the slots ``forward`` of a stream (from the start to the
    newest): up to ``n`` rows, stopping after a terminated or truncated row. Returns
    ``(return as float64 summed in order, k, last slot)``."""
    acc, w = 0.0, 1.0
    for k, j in enumerate(forward[:n]):
        acc += w * float(reward[j])
        w *= gamma
        if term[j] or trunc[j] or k == n - 1 or k == len(forward) - 1:
            return acc, k + 1, j
    raise AssertionError("an empty window")


def slice_forward(start: int, forward: list, length: int, term, trunc):
    """The slice from ``start`` over the slots ``forward`` of its stream: rows while they exist
    and no earlier row of the slice ended an episode; the rest repeat the last valid row.
    Returns ``(slots, mask)``."""
    slots, mask = [], []
    for k in range(length):
        ok = k < len(forward) and (k == 0 or (mask[-1] and not (term[slots[-1]] or trunc[slots[-1]])))
        slots.append(forward[k] if ok else (slots[-1] if slots else start))
        mask.append(ok)
    return np.array(slots, np.int64), np.array(mask)


def shard_slice_starts(key: int, counter: int, heads, cap: int, batch: int, length: int, term,
                       trunc, reject: bool):
    """Uniform slice starts over the rows held (shard order), redrawn under ``reject`` until the
    slice is whole; returns (starts, counter)."""
    held = [s * cap + j for s, h in enumerate(heads) for j in range(min(h, cap))]
    out = []
    for _ in range(batch):
        while True:
            (u,), counter = draw_indices(key, counter, len(held), 1)
            start = held[int(u)]
            forward = shard_forward(start, heads, cap)
            if not reject or slice_forward(start, forward, length, term, trunc)[1].all():
                break
        out.append(start)
    return np.array(out, np.int64), counter


def wait_change_naive(state, i: int, value: int, spins: int) -> int:
    """``state[i]`` if it differs from ``value`` within ``spins`` reads, else ``value`` (the
    loader's spin kernel, read by read; the kernel's point is that another thread's store is
    seen while it spins)."""
    for _ in range(spins):
        if int(state[i]) != value:
            return int(state[i])
    return value


def column_stats_naive(values) -> tuple:
    """Reference of ``kernels._columns.column_scan_ranges`` (of the rows it counts): ``(count,
    out)`` with ``out[:, j]`` = mean, var (population), std, min, max of element ``j`` of
    ``values`` (``(n, *shape)``) as float64, element by element in Python with numpy's
    semantics: a NaN makes everything NaN; +inf or -inf make the mean infinite (NaN with both)
    and the variance NaN; no row: all NaN."""
    x = np.asarray(values)
    x = x.reshape(len(x), int(np.prod(x.shape[1:], dtype=np.int64))).astype(np.float64)
    n, k = x.shape
    out = np.full((5, k), np.nan)
    if n == 0:
        return 0, out
    for j in range(k):
        col = [float(v) for v in x[:, j]]
        if any(v != v for v in col):
            continue
        pos, neg = col.count(math.inf), col.count(-math.inf)
        finite = [v for v in col if math.isfinite(v)]
        if pos or neg:
            mean = math.inf if not neg else (-math.inf if not pos else math.nan)
            out[:, j] = [mean, math.nan, math.nan, -math.inf if neg else min(finite, default=math.inf),
                         math.inf if pos else max(finite, default=-math.inf)]
            continue
        mean = math.fsum(col) / n
        var = math.fsum((v - mean) ** 2 for v in col) / n  # two passes, exactly rounded sums
        out[:, j] = [mean, var, math.sqrt(var), min(col), max(col)]
    return n, out


def chan_merge_naive(a: tuple, b: tuple) -> tuple:
    """Statistics ``(n, mean, m2, min, max)`` of two disjoint sets of values (one element), as
    the tree's merge defines them for non-finite means (a weighted mean, M2 NaN; min and max
    NaN if either is)."""
    na, ma, qa, mna, mxa = a
    nb, mb, qb, mnb, mxb = b
    if na == 0 or nb == 0:
        return a if nb == 0 else b
    n = na + nb
    if math.isfinite(ma) and math.isfinite(mb):
        d = mb - ma
        mean, m2 = ma + d * nb / n, qa + qb + d * d * na * nb / n
    else:
        mean, m2 = ma * na / n + mb * nb / n, math.nan
    mn = math.nan if (mna != mna or mnb != mnb) else min(mna, mnb)
    mx = math.nan if (mxa != mxa or mxb != mxb) else max(mxa, mxb)
    return n, mean, m2, mn, mx


def stats_tree_naive(values, live: int, block: int, leaves: int) -> tuple:
    """Reference of the statistics tree of ``kernels._columns``: ``(cnt, stats)`` over ``2 *
    leaves`` nodes, leaf ``leaves + b`` the statistics (``column_stats_naive``) of rows
    ``[b * block, min((b + 1) * block, live))`` of ``values``, node ``i`` the merge of ``2i`` and
    ``2i + 1``; ``stats[i]`` is ``(n, mean, m2, min, max)`` per element, a list."""
    x = np.asarray(values)
    x = x.reshape(len(x), int(np.prod(x.shape[1:], dtype=np.int64)))
    k = x.shape[1]
    cnt = [0] * (2 * leaves)
    stats = [[(0, 0.0, 0.0, math.inf, -math.inf)] * k for _ in range(2 * leaves)]
    for b in range(leaves):
        rows = x[b * block:max(b * block, min((b + 1) * block, live))]
        n, out = column_stats_naive(rows)
        cnt[leaves + b] = n
        if n:
            stats[leaves + b] = [(n, out[0, j], out[1, j] * n, out[3, j], out[4, j]) for j in range(k)]
    for i in range(leaves - 1, 0, -1):
        cnt[i] = cnt[2 * i] + cnt[2 * i + 1]
        stats[i] = [chan_merge_naive(stats[2 * i][j], stats[2 * i + 1][j]) for j in range(k)]
    return cnt, stats


def first_bad_slot_naive(idx, n: int) -> int:
    """Reference of ``kernels._columns.first_bad_slot``: ``2 * i`` for the first ``idx[i]`` outside
    ``[0, n)``, ``2 * i + 1`` for the first that repeats an earlier one, -1 if none."""
    seen = set()
    for i, v in enumerate(int(v) for v in idx):
        if not 0 <= v < n:
            return 2 * i
        if v in seen:
            return 2 * i + 1
        seen.add(v)
    return -1


def scatter_fields_naive(dst, p, n, srcs, spans) -> int:
    """Reference of ``kernels._records.scatter_fields``: byte by byte in Python, every check
    first (-1 and nothing written when an argument disagrees)."""
    rows, stride = dst.shape
    if n < 1 or p < 0 or p + n > rows or len(spans) < len(srcs):
        return -1
    for i, s in enumerate(srcs):
        off, w = int(spans[i][0]), int(spans[i][1])
        if off < 0 or w < 0 or off + w > stride or len(s) != n * w:
            return -1
    for i, s in enumerate(srcs):
        off, w = int(spans[i][0]), int(spans[i][1])
        for k in range(n):
            for b in range(w):
                dst[p + k][off + b] = s[k * w + b]
    return 0


# -- sampling without replacement ------------------------------------------------------------------


def pool_sample_naive(pool: list, m: int, passes: int, start: int, count: int, n: int, key: int,
                      counter: int, batch: int, live=None) -> tuple:
    """Reference of ``kernels._pool.pool_sample`` on a Python list: ``pool[:m]`` are the undrawn
    slots. Returns ``(pool, m, passes, indices, counter)``.

    Slots ``start, start + 1, ...`` (``count``, modulo ``len(pool)``) join the pool if absent;
    each draw takes the entry at a uniform place ``r`` among the first ``m - deferred`` and puts
    the last of those there, and the pool's last entry (a deferred one) in the place that left.
    An exhausted pass refills the pool with the live slots ``0..n-1`` in order, the rows this
    batch already took left out and put last, in the order taken; a batch that empties the
    pool refills it at once with ``0..n-1``. ``live``: the live slots in order, if not
    ``0..n-1`` (the shards of ``pool_fold_draw``: each shard's held slots)."""
    live = list(range(n)) if live is None else list(live)
    cap = len(pool)
    pool = list(pool)
    members = set(pool[:m])
    for k in range(count):
        s = (start + k) % cap
        if s not in members:
            pool[m] = s
            members.add(s)
            m += 1
    out = []
    defer = 0
    for i in range(batch):
        if m - defer == 0:
            fresh = [s for s in live if s not in out] + out
            pool[:len(fresh)] = fresh
            members = set(fresh)
            m, defer = len(fresh), len(out)
            passes += 1
        avail = m - defer
        (r,), counter = draw_indices(key, counter, avail, 1)
        r = int(r)
        s = pool[r]
        a = avail - 1
        pool[r] = pool[a]
        if a != m - 1:
            pool[a] = pool[m - 1]
        members.discard(s)
        m -= 1
        out.append(s)
    if batch and m == 0:  # the batch ended the pass: the next one begins at once
        pool[:len(live)] = live
        m = len(live)
        passes += 1
    return pool, m, passes, np.array(out, np.int64), counter


def pool_redraw_naive(pool: list, m: int, passes: int, key: int, counter: int, batch, i: int,
                      live) -> tuple:
    """Reference of ``kernels._pool.pool_fold_redraw`` after its fold (the rows published since
    already in ``pool[:m]``): row ``i`` of ``batch`` drawn again, never a slot the batch's other
    rows hold. Returns ``(pool, m, passes, batch, counter)``.

    The batch's other rows that are in the pool go last (the kernel's scan: an entry among them
    swaps with the last entry within reach); the draw takes a uniform entry within reach as
    ``pool_sample_naive`` does. With nothing within reach the pass is over: the next one is
    ``live`` without the batch's other rows, then those rows in batch order. A redraw that
    empties the pool begins the next pass, ``live``, at once."""
    pool, batch, live = list(pool), [int(s) for s in batch], list(live)
    others = [s for j, s in enumerate(batch) if j != i]
    taken = set(others)
    a, r = m, 0
    while r < a:
        if pool[r] in taken:
            a -= 1
            pool[r], pool[a] = pool[a], pool[r]
        else:
            r += 1
    if a == 0:
        fresh = [s for s in live if s not in taken]
        pool[:len(fresh) + len(others)] = fresh + others
        a, m = len(fresh), len(fresh) + len(others)
        passes += 1
    (r,), counter = draw_indices(key, counter, a, 1)
    r = int(r)
    s = pool[r]
    pool[r] = pool[a - 1]
    if a - 1 != m - 1:
        pool[a - 1] = pool[m - 1]
    m -= 1
    batch[i] = s
    if m == 0:
        pool[:len(live)] = live
        m = len(live)
        passes += 1
    return pool, m, passes, np.array(batch, np.int64), counter


# -- the sample-to-insert rate limiter ---------------------------------------------------------------


def limiter_allows_naive(side: str, inserts: int, samples: int, n: int, samples_per_insert,
                         min_size: int, error_buffer) -> bool:
    """Reference of the rate limiter's two predicates (Reverb's SampleToInsertRatio, counted in
    rows), in exact rational arithmetic: may a sample of ``n`` rows (``side == "sample"``) or an
    insert of ``n`` rows (``"insert"``) proceed after ``inserts`` rows inserted and ``samples``
    sampled? ``error_buffer`` None: no ratio bound (MinSize)."""
    from fractions import Fraction

    if side == "sample" and inserts < min_size:
        return False
    if error_buffer is None:
        return True
    spi, eb = Fraction(samples_per_insert), Fraction(error_buffer)
    centre = spi * min_size  # the difference inserts * spi - samples at which the ratio is met
    if side == "sample":
        return inserts * spi - samples - n >= centre - eb
    if inserts + n <= min_size:  # filling up to the minimum size is free
        return True
    return (inserts + n) * spi - samples <= centre + eb


def limiter_bounds_naive(inserts: int, samples_per_insert, min_size: int, error_buffer) -> tuple:
    """``(lo, hi)``: the samples the limiter promises after ``inserts`` rows, as Fractions:
    ``lo <= samples`` always, and ``samples <= hi`` once anything was sampled."""
    from fractions import Fraction

    spi, eb = Fraction(samples_per_insert), Fraction(error_buffer)
    centre = spi * min_size
    return inserts * spi - centre - eb, inserts * spi - centre + eb

def exactly_k_sample_naive(pool: list, m: int, remaining: list, key: int, counter: int,
                           batch: int) -> tuple:
    """Reference of ``kernels._replays.replays_sample`` on Python lists: ``pool[:m]`` are the
    slots awaiting replay, ``remaining[s]`` the deliveries slot ``s`` has left. Returns
    ``(pool, m, remaining, indices, counter, freed)``.

    Draw ``i`` takes a uniform place ``r`` among the first ``m - i`` entries and swaps it with
    entry ``m - 1 - i`` (so the batch's rows end up last, out of reach of its later draws);
    then each row drawn loses one delivery, and those left with none leave the pool (the last
    ``batch`` entries keep their order, the freed ones dropped)."""
    pool, remaining = list(pool), list(remaining)
    out = []
    for i in range(batch):
        (r,), counter = draw_indices(key, counter, m - i, 1)
        j = m - 1 - i
        pool[int(r)], pool[j] = pool[j], pool[int(r)]
        out.append(pool[j])
    for s in out:
        remaining[s] -= 1
    kept = [s for s in pool[m - batch:m] if remaining[s] > 0]
    pool[m - batch:m - batch + len(kept)] = kept
    freed = batch - len(kept)
    return pool, m - freed, remaining, np.array(out, np.int64), counter, freed


def exactly_k_write_naive(pool: list, m: int, remaining: list, start: int, count: int, k: int) -> tuple:
    """Reference of ``kernels._replays.replays_write``: slots ``start, ...`` (``count``, modulo
    the capacity) get ``k`` deliveries; a slot not in the pool joins it at the end. Returns
    ``(pool, m, remaining, lost)``, ``lost`` the deliveries the slots had left."""
    pool, remaining = list(pool), list(remaining)
    cap = len(pool)
    lost = 0
    for i in range(count):
        s = (start + i) % cap
        if remaining[s] == 0:
            pool[m] = s
            m += 1
        lost += remaining[s]
        remaining[s] = k
    return pool, m, remaining, lost


def exactly_k_place_naive(remaining: list, start: int, n: int, free: int) -> tuple:
    """Reference of ``kernels._replays.replays_place``, written from the rule: row by row, the
    first slot at or after the position (wrapping) whose count is 0, while a free slot is
    left (a slot taken by this write is no longer free); with none left, the slot at the
    position. The position moves past each slot taken. Returns ``(slots, position after,
    slots moved over)``."""
    cap = len(remaining)
    rem = list(remaining)
    pos, moved, slots = start, 0, []
    for _ in range(n):
        if free > 0:
            while rem[pos] != 0:
                pos = (pos + 1) % cap
                moved += 1
            free -= 1
        slots.append(pos)
        rem[pos] = max(rem[pos], 1)  # taken: not free for the rest of this write
        pos = (pos + 1) % cap
        moved += 1
    return slots, pos, moved


class ExactlyKModel:
    """A buffer with ``sampler="exactly_k"`` in plain Python: slots of row ids, the naive pool
    and the policy's rule, written from the documentation (not the code): each row goes to the
    next free slot at or after the cursor (wrapping), skipping rows awaiting replay, and the
    cursor moves past the last slot written; "block" refuses a write of more rows than there
    are free slots (the caller checks the TimeoutError), "drop" keeps the rows that fit (whole
    steps of ``num_envs``), "overwrite" writes at the cursor once no slot is free and counts
    the deliveries lost."""

    def __init__(self, capacity: int, k: int, policy: str, seed: int, num_envs: int = 1):
        self.cap, self.k, self.policy, self.num_envs = capacity, k, policy, num_envs
        self.key, self.counter = key_of(seed), 0
        self.clear()

    def clear(self) -> None:
        self.ids = [None] * self.cap
        self.pool, self.m, self.remaining = [0] * self.cap, 0, [0] * self.cap
        self.cursor = self.size = 0
        self.delivered = self.dropped = self.lost = 0

    def write(self, ids: list) -> bool:
        """Write rows ``ids``; False if "block" refuses (nothing changed)."""
        n = len(ids)
        free = self.remaining.count(0)
        if self.policy == "block":
            if n > free:
                return False
        elif self.policy == "drop":
            ok = min(n, free)
            ok -= ok % self.num_envs
            self.dropped += n - ok
            ids = ids[:ok]
            n = ok
        if n:
            slots, self.cursor, _ = exactly_k_place_naive(self.remaining, self.cursor, n, free)
            for s, x in zip(slots, ids):
                self.pool, self.m, self.remaining, lost = exactly_k_write_naive(
                    self.pool, self.m, self.remaining, s, 1, self.k)
                self.lost += lost
                self.ids[s] = x
            self.size = min(self.size + n, self.cap)
        return True

    def sample(self, batch: int):
        """The slots and ids a sample of ``batch`` returns, or None if fewer rows await."""
        if batch > self.m:
            return None
        self.pool, self.m, self.remaining, idx, self.counter, _ = exactly_k_sample_naive(
            self.pool, self.m, self.remaining, self.key, self.counter, batch)
        self.delivered += batch
        return idx, [self.ids[s] for s in idx]


def exactly_k_claim_naive(taken: list, released: list, base: int, cap: int, cursor: int,
                          n: int) -> list:
    """Reference of ``kernels._replays.replays_claim``: from the rule, row by row, the first
    slot of the shard at or after the position (wrapping) that is free (``taken ==
    released``) and not taken by this call; stops when none is left."""
    out, pos = [], cursor
    for _ in range(n):
        for step in range(cap):
            s = (pos + step) % cap
            if taken[base + s] == released[base + s] and s not in out:
                out.append(s)
                pos = (s + 1) % cap
                break
        else:
            break
    return out


def exactly_k_log_slots_naive(heads: list, log: list, published: list, cap: int) -> tuple:
    """Reference of ``kernels._replays.replays_log_spans`` (its runs expanded): shard ``s``'s
    rows ``published[s] .. heads[s] - 1`` are in slots ``s * cap + (log[s * cap + p % cap] &
    0xFFFFFFFF)`` (the entry tagged ``p & 0xFFFFFFFF`` in its high 32 bits). Returns
    ``(slots, published, ok)``: ``ok`` False at a head out of range (nothing of that shard) or
    a bad entry (the rows before it kept)."""
    slots, published = [], list(published)
    for s, h in enumerate(heads):
        if h < published[s] or h - published[s] > cap:
            return slots, published, False
        for p in range(published[s], h):
            e = log[s * cap + p % cap]
            slot = e & 0xFFFFFFFF
            if e >> 32 != p & 0xFFFFFFFF or not 0 <= slot < cap:
                published[s] = p
                return slots, published, False
            slots.append(s * cap + slot)
        published[s] = h
    return slots, published, True


def exactly_k_release_naive(remaining: list, released: list, idx: list) -> tuple:
    """Reference of ``kernels._replays.replays_release``: slots of ``idx`` with no delivery
    left are released once more. Returns ``(released, freed)``."""
    released = list(released)
    freed = 0
    for g in idx:
        if remaining[g] == 0:
            released[g] += 1
            freed += 1
    return released, freed


def exactly_k_log_naive(taken: list, log: list, base: int, cap: int, head: int, slots: list) -> tuple:
    """Reference of ``kernels._replays.replays_log``: entry of row ``head + i`` (tagged with its
    position's low 32 bits) and one more take of slot ``slots[i]``. Returns ``(taken, log)``."""
    taken, log = list(taken), list(log)
    for i, s in enumerate(slots):
        p = head + i
        log[base + p % cap] = ((p & 0xFFFFFFFF) << 32) | s
        taken[base + s] += 1
    return taken, log


def exactly_k_recover_naive(taken: list, released: list, log: list, base: int, cap: int,
                            head: int, reserved: int) -> tuple:
    """Reference of ``kernels._replays.replays_recover``: for the begun, unpublished positions
    whose entry is tagged with the position, the slot named is made free again. Returns
    ``(taken, freed)``."""
    taken = list(taken)
    freed = 0
    for p in range(head, min(reserved, head + cap)):
        e = log[base + p % cap]
        s = e & 0xFFFFFFFF
        if e >> 32 == p & 0xFFFFFFFF and s < cap and taken[base + s] != released[base + s]:
            taken[base + s] = released[base + s]
            freed += 1
    return taken, freed


# -- frame stacks ------------------------------------------------------------------------------
def frame_of(env: int, episode: int, t: int, frame=(3, 2), dtype=np.uint8) -> np.ndarray:
    """The synthetic frame of :class:`FrameStackEnv`: step ``t`` of ``episode`` of stream ``env``,
    its ids repeated over the pixels."""
    n = int(np.prod(frame))
    ids = [env + 1, episode % 251 + 1, t % 253 + 1, episode // 251 % 256, t // 253 % 256]
    vals = np.array([ids[i % len(ids)] for i in range(n)], dtype=np.int64)
    return vals.astype(np.dtype(dtype)).reshape(tuple(frame))


def stack_of(env: int, episode: int, t: int, k: int, padding="reset", frame=(3, 2),
             dtype=np.uint8) -> np.ndarray:
    """The ``FrameStackObservation`` stack of :class:`FrameStackEnv` whose newest frame is step
    ``t`` of ``episode`` of stream ``env`` (steps before 0 padded)."""
    frames = [frame_of(env, episode, j, frame, dtype) for j in range(max(0, t - k + 1), t + 1)]
    return frame_stack_naive(frames, min(t, k - 1), k, padding)


class FrameStackEnv:
    """A vector of ``num_envs`` streams as gymnasium's ``FrameStackObservation`` over a
    same-step-autoreset vector env returns them, with synthetic frames that carry their
    ``(env, episode, step)`` in every pixel (so a frame of another stream, episode or step shows).

    ``step(rng)`` returns one transition per env: obs and next_obs stacks ``(E, K, *frame)``,
    terminated and truncated ``(E,)``; an episode ends with probability ``p_end`` (half of the
    ends truncations). ``padding``: "reset", "zero" or a frame.
    """

    def __init__(self, num_envs: int, k: int, frame=(3, 2), padding="reset", p_end=0.15, dtype=np.uint8):
        self.e, self.k, self.frame, self.padding, self.p_end = num_envs, k, tuple(frame), padding, p_end
        self.dtype = np.dtype(dtype)
        self.episode = [0] * num_envs
        self.t = [0] * num_envs
        self.queues = [self._reset(i) for i in range(num_envs)]

    def _frame(self, env: int) -> np.ndarray:
        return frame_of(env, self.episode[env], self.t[env], self.frame, self.dtype)

    def _reset(self, env: int) -> list:
        first = self._frame(env)
        if isinstance(self.padding, str):
            pad = first if self.padding == "reset" else np.zeros(self.frame, self.dtype)
        else:
            pad = np.asarray(self.padding, self.dtype)
        return [pad] * (self.k - 1) + [first]

    def step(self, rng) -> dict:
        obs, nxt, term, trunc = [], [], [], []
        for i in range(self.e):
            q = self.queues[i]
            obs.append(np.stack(q))
            self.t[i] += 1
            q = q[1:] + [self._frame(i)]
            nxt.append(np.stack(q))
            end = rng.random() < self.p_end
            te = bool(end and rng.random() < 0.5)
            tr = bool(end and not te)
            term.append(te)
            trunc.append(tr)
            if end:
                self.episode[i] += 1
                self.t[i] = 0
                q = self._reset(i)
            self.queues[i] = q
        return {"obs": np.stack(obs), "next_obs": np.stack(nxt),
                "terminated": np.array(term), "truncated": np.array(trunc)}


def frame_stack_naive(frames: list, depth: int, k: int, padding) -> np.ndarray:
    """The stack of a row from its stream's newest frames (``frames[-1]`` the row's own, at
    least ``min(depth, k-1) + 1`` of them): within ``depth`` steps of the episode's first row,
    the positions before it padded as FrameStackObservation pads."""
    out = []
    for p in range(k):
        j = k - 1 - p
        if j <= depth:
            out.append(frames[-1 - j])
        elif isinstance(padding, str) and padding == "reset":
            out.append(frames[-1 - depth])
        elif isinstance(padding, str):
            out.append(np.zeros_like(frames[-1]))
        else:
            out.append(np.asarray(padding, frames[-1].dtype))
    return np.stack(out)


def frame_breaks_naive(obs, nxt, ends_prev, prev_frames: list, prev_depth: list, k: int, padding,
                       num_envs: int) -> int:
    """``frame_breaks`` as a reference: ``obs``/``nxt`` ``(n, k, *frame)`` time-major; for each
    stream its newest stored frames (oldest first) and depth (-1: the next row starts an
    episode). Returns ``row * 4 + reason`` (0 padding, 1 continuity, 2 next) or -1."""
    frames = [list(f) for f in prev_frames]
    depth = list(prev_depth)
    for r in range(obs.shape[0]):
        e = r % num_envs
        start = depth[e] < 0 if r < num_envs else bool(ends_prev[r - num_envs])
        d = 0 if start else min(depth[e] + 1, k - 1)
        if start:
            want = frame_stack_naive([obs[r, -1]], 0, k, padding)
        else:
            want = frame_stack_naive(frames[e][-(k - 1):] + [obs[r, -1]], d, k, padding)
        if not np.array_equal(want[:-1], obs[r, :-1]):
            return r * 4 + (0 if start else 1)
        if nxt is not None and not np.array_equal(nxt[r, :-1], obs[r, 1:]):
            return r * 4 + 2
        frames[e] = frames[e] + [obs[r, -1]]
        depth[e] = d
    return -1


# -- frame stacks: both geometries, one reference -----------------------------------------------
# A geometry says, of a held slot, which stream it is in, which row of that stream it holds,
# how many rows the stream wrote and keeps, and where the stream's row ``u`` is: the ring's
# step ``u`` of stream ``e`` in slot ``(cursor - (steps - u) * num_envs + e) % capacity``, a
# shard's row ``u`` in slot ``s * cap + u % cap``. A row the stream no longer keeps (the
# ``K - 1`` overwritten last) is in ``hist[u % (K - 1), stream]``. Frames are rows of words (any
# dtype); positions before a row's episode start are padding.
def ring_stream(x: int, cursor: int, steps: int, num_envs: int, capacity: int):
    """``(stream, row, written, kept, slot_of)`` of ring slot ``x`` (Python's modulo for any
    row number)."""
    e = x % num_envs
    age = ((cursor - num_envs) - (x - e)) % capacity // num_envs
    return (e, steps - 1 - age, steps, capacity // num_envs,
            lambda u: (cursor - (steps - u) * num_envs + e) % capacity)


def shard_stream(x: int, heads, cap: int):
    """:func:`ring_stream` of region slot ``x`` as of ``heads`` (shard ``s`` wrote ``heads[s]``
    rows)."""
    s, local = divmod(int(x), cap)
    h = int(heads[s])
    return s, h - 1 - (h - 1 - local) % cap, h, cap, lambda u: s * cap + u % cap


def stack_naive(stream, dep: int, k: int, src, hist, pad, mode: int, count=None) -> np.ndarray:
    """Positions ``0 .. count-1`` (default ``k``) of the stack of the row ``stream`` locates
    (``(count, width)``): the frames ``count - 1 .. 0`` rows back, oldest first (``src[slot]``
    while the stream keeps the row, else ``hist``), padded beyond ``dep`` rows back (capped at
    ``K - 1``) as ``mode`` says (0 reset, 1 zero, 2 ``pad``). ``src``: ``(slots, width)``."""
    e, t, written, kept, slot_of = stream
    count = k if count is None else count
    d = min(int(dep), k - 1)

    def frame(u):
        return np.array(src[slot_of(u)] if written - u <= kept else hist[u % (k - 1), e])

    out = []
    for p in range(count):
        j = count - 1 - p
        if j <= d:
            out.append(frame(t - j))
        elif mode == 0:
            out.append(frame(t - d))
        elif mode == 1:
            out.append(np.zeros_like(src[0]))
        else:
            out.append(np.array(pad))
    return np.stack(out)


def next_stack_naive(stream, x: int, k: int, depth, src, hist, pad, mode: int, term, trunc,
                     final_idx, table, pending) -> np.ndarray:
    """The next stack of slot ``x`` (located by ``stream``): its stack shifted by one, then its
    next frame: ``table[f]`` of an episode-ending row whose entry ``f`` the table (``(F,
    width)``: the stream's) has, the stream's pending frame for its newest row, else the frame
    of the stream's next row."""
    e, t, written, kept, slot_of = stream
    back = stack_naive(stream, depth[x], k, src, hist, pad, mode, k - 1)
    f = int(final_idx[x]) if term[x] or trunc[x] else -1
    if 0 <= f < len(table):
        last = table[f]
    elif t == written - 1:
        last = pending[e]
    else:
        last = src[slot_of(t + 1)]
    return np.concatenate([back, np.array(last)[None]])


def frames_write_naive(obs, term, trunc, num_envs, cursor, capacity, size, steps, src, src_off,
                       hist, prev, depth) -> tuple:
    """``frames_write`` as a reference, by steps: every step the ring holds before the write or
    the write brings, and does not hold after it, goes into ``hist`` (in step order, so the
    last ``K - 1`` of them remain); each written row's depth is its stream's previous depth plus
    one (at most ``K - 1``; the previous is -1 after an episode's end), stamped for the rows the
    ring keeps (the last ``capacity``). Returns new ``(hist, prev, depth)``."""
    hist, prev, depth = hist.copy(), prev.copy(), depth.copy()
    km = hist.shape[0]
    width = hist.shape[2]
    n = obs.shape[0]
    m = n // num_envs
    held = capacity // num_envs
    t1 = steps + m
    for t in range(max(0, steps - size // num_envs), t1 - held):
        for e in range(num_envs):
            if t >= steps:  # brought by the write: its newest frame
                frame = obs[(t - steps) * num_envs + e, km * width:]
            else:
                frame = src[(cursor - (steps - t) * num_envs + e) % capacity, src_off:src_off + width]
            hist[t % km, e] = frame
    for r in range(n):
        e = r % num_envs
        d = min(int(prev[e]) + 1, km)
        if r >= n - capacity:
            depth[(cursor + r) % capacity] = d % 256
        prev[e] = -1 if term[r] or trunc[r] else d
    return hist, prev, depth


def cold_stacks_naive(rows, cursor, steps, num_envs, capacity, depth, src, src_off, hist, pad, pmode,
                      nexts, cold_from, block, cache_map, cache, filled, mode, mark, gen, need, reach,
                      count, dst, npos):
    """``cold_frame_stacks`` (``nexts == ()``, ``npos == K``) and ``cold_next_frame_stacks``
    (``nexts = (term, trunc, final_idx, finals, pending)``, ``npos == K - 1``) as a reference.
    Returns ``(dst, need[:count], mark, reach)`` as the kernel leaves them (copies; inputs
    untouched). Modes: 0 list the compressed blocks read (and one more than the last offset read
    in each), 1 write all (cold frames from cached blocks, within the frames decompressed),
    2 write cold frames of cached blocks only."""
    size = len(need)
    dst, need, mark, reach = dst.copy(), list(need[:count]), mark.copy(), reach.copy()
    width = pad.shape[0]
    k = hist.shape[0] + 1
    held = capacity // num_envs
    newest = (cursor - num_envs) % capacity
    nb = min(len(cold_from), len(cache_map), len(mark), len(reach))

    def slot(i, o, s):
        b = s // block
        r = s - b * block
        if b < nb and r >= cold_from[b]:
            if mode == 0:
                if mark[b] != gen:
                    if len(need) < size:
                        mark[b] = gen
                        need.append(b)
                        reach[b] = r + 1
                else:
                    reach[b] = max(reach[b], r + 1)
            else:
                c = cache_map[b]
                if (0 <= c < min(cache.shape[0], len(filled)) and r < filled[c] and r < cache.shape[1]
                        and width <= cache.shape[2]):
                    dst[i, o:o + width] = cache[c, r, :width]
        elif mode == 1:
            dst[i, o:o + width] = src[s, src_off:src_off + width]

    def back(i, x, a, j, e, o):
        if a + j < held:
            slot(i, o, (x - j * num_envs) % capacity)
        elif mode == 1:
            dst[i, o:o + width] = hist[(steps - 1 - a - j) % (k - 1), e]

    for i, x in enumerate(int(v) for v in rows):
        a = ((newest - (x - x % num_envs)) % capacity) // num_envs
        d = min(int(depth[x]), k - 1)
        e = x % num_envs
        for p in range(npos):
            j = npos - 1 - p
            if j <= d:
                back(i, x, a, j, e, p * width)
            elif pmode == 0:
                back(i, x, a, d, e, p * width)
            elif mode == 1:
                dst[i, p * width:(p + 1) * width] = 0 if pmode == 1 else pad
        if nexts:
            term, trunc, final_idx, finals, pending = nexts
            f = int(final_idx[x]) if term[x] or trunc[x] else -1
            o = (k - 1) * width
            if 0 <= f < len(finals):
                if mode == 1:
                    dst[i, o:o + width] = finals[f]
            elif a == 0:
                if mode == 1:
                    dst[i, o:o + width] = pending[e]
            else:
                slot(i, o, (x + num_envs) % capacity)
    return dst, np.array(need, np.int32), mark, reach


def cold_assign_naive(need, reach, start, count, cache_map, slot_block, filled, slot_used, slot_pass,
                      pass_id, clock):
    """``cold_assign`` as a reference: returns ``(next, todo, clock, cache_map, slot_block,
    filled, slot_used, slot_pass)`` (copies; inputs untouched)."""
    cache_map, slot_block, filled = cache_map.copy(), slot_block.copy(), filled.copy()
    slot_used, slot_pass = slot_used.copy(), slot_pass.copy()
    nc, nb = len(slot_block), len(cache_map)
    todo = []
    for i in range(start, count):
        b = int(need[i])
        if not (0 <= b < nb and b < len(reach)):
            continue
        c = int(cache_map[b])
        if 0 <= c < nc and slot_block[c] == b:
            if filled[c] < reach[b]:  # decompressed again, further
                filled[c] = reach[b]
                todo.append(c)
        else:
            free = [s for s in range(nc) if slot_pass[s] != pass_id]
            if not free:
                return i, todo, clock, cache_map, slot_block, filled, slot_used, slot_pass
            c = min(free, key=lambda s: (slot_used[s], s))
            if 0 <= slot_block[c] < nb:
                cache_map[slot_block[c]] = -1
            slot_block[c] = b
            filled[c] = reach[b]
            cache_map[b] = c
            todo.append(c)
        clock += 1
        slot_used[c] = clock
        slot_pass[c] = pass_id
    return count, todo, clock, cache_map, slot_block, filled, slot_used, slot_pass


# -- what only the shards of a shared region need --------------------------------------------
def torn_stacks_naive(x, heads, reserved, cap, depth, kmax) -> bool:
    """Whether a slot read by the stacks of region slot ``x`` (``depth`` rows back to one row
    forward) is one a writer began since ``heads`` (rows ``heads[s] .. reserved[s] - 1``)."""
    s, local = divmod(int(x), cap)
    h, res = int(heads[s]), int(reserved[s])
    busy = {r % cap for r in range(h, min(res, h + cap))}
    d = min(int(depth[x]), kmax)
    return any((local - j) % cap in busy for j in range(-1, d + 1))


def final_ring_room_naive(ends_rows, cap: int, ends: int, final_rows, head: int) -> int:
    """First write row (of ``ends_rows``: the write's rows that end an episode, stored as shard
    rows ``head + r``) whose final-table entry a held row still uses, or -1."""
    f = len(final_rows)
    users = {e: int(final_rows[e]) for e in range(min(ends, f))}
    j = ends
    for r in ends_rows:
        e = j % f
        if e in users and users[e] + cap > head + r:
            return r
        users[e] = head + r
        j += 1
    return -1


# -- rollouts (tfdata.RolloutBuffer) ---------------------------------------------------------------


def gae_naive(reward, value, terminated, truncated, final_value, last_values, gamma: float,
              gae_lambda: float):
    """Advantages and returns of a rollout ``(T, E)``, one float32 scalar operation at a time in
    CleanRL's order (``truncated`` / ``final_value`` may be None).

    Per row, the flags of the step that produced the reward: a termination bootstraps nothing; a
    truncation bootstraps ``final_value`` when given, else nothing; otherwise the next row's value
    (``last_values`` after the last row). Either flag cuts the sum of later deltas.
    """
    f32 = np.float32
    T, E = len(reward), len(reward[0])
    g, gl = f32(gamma), f32(gamma * gae_lambda)  # the product in double, as Python computes it
    adv = np.zeros((T, E), np.float32)
    ret = np.zeros((T, E), np.float32)
    for e in range(E):
        lastgaelam = f32(0.0)
        for t in reversed(range(T)):
            term = bool(terminated[t][e])
            trunc = bool(truncated[t][e]) if truncated is not None else False
            nextvalues = f32(last_values[e]) if t == T - 1 else f32(value[t + 1][e])
            if term:
                nextnonterminal = f32(0.0)
            elif trunc and final_value is not None:
                nextvalues, nextnonterminal = f32(final_value[t][e]), f32(1.0)
            elif trunc:
                nextnonterminal = f32(0.0)
            else:
                nextnonterminal = f32(1.0)
            cont = f32(0.0) if (term or trunc) else f32(1.0)
            delta = f32(reward[t][e]) + g * nextvalues * nextnonterminal - f32(value[t][e])
            lastgaelam = delta + gl * cont * lastgaelam
            adv[t, e] = lastgaelam
            ret[t, e] = lastgaelam + f32(value[t][e])
    return adv, ret


def rollout_permutations(seed: int, n_rows: int, epochs: int) -> list:
    """The row order of each epoch of ``RolloutBuffer.minibatches(..., seed=seed)``: epoch ``k``
    shuffles the identity with Fisher-Yates, its draws continuing the stream of epoch ``k - 1``
    (key ``mix64(seed)``, counter 0 at the first epoch)."""
    key, counter = key_of(seed), 0
    out = []
    for _ in range(epochs):
        order = list(range(n_rows))
        counter = fisher_yates(order, key, counter)
        out.append(order)
    return out


def rollout_minibatches_naive(fields: dict, seed: int, n: int, epochs: int) -> list:
    """Every minibatch as ``(rows, {name: array})``: fields given time-major ``(T, E, ...)``,
    flattened to rows ``t * E + e`` and fancy-indexed by each ``n``-th of each epoch's order."""
    flat = {k: np.asarray(v).reshape((-1,) + np.shape(v)[2:]) for k, v in fields.items()}
    n_rows = len(next(iter(flat.values())))
    m = n_rows // n
    out = []
    for order in rollout_permutations(seed, n_rows, epochs):
        for b in range(n):
            rows = np.array(order[b * m:(b + 1) * m], dtype=np.int64)
            out.append((rows, {k: v[rows] for k, v in flat.items()}))
    return out


# -- soft actor-critic (tfdata.nn.SAC's kernels) ------------------------------------------------
SAC_LOG_STD_MIN, SAC_LOG_STD_MAX = -5.0, 2.0


def sac_bias_act_naive(h, b, relu: bool) -> np.ndarray:
    out = np.array(h, dtype=np.float64) + np.asarray(b, np.float64)[None, :]
    return np.where(out < 0, 0.0, out) if relu else out  # NaN stays NaN, as torch's relu


def sac_squashed_gaussian_naive(head, eps, scale, bias) -> tuple:
    """(t, std, y, action, logp) of CleanRL's get_action, element by element, in float64."""
    rows, n = np.shape(eps)
    t, std, y, act = (np.zeros((rows, n)) for _ in range(4))
    logp = np.zeros(rows)
    for i in range(rows):
        for a in range(n):
            mean = float(head[i][a])
            t[i, a] = math.tanh(float(head[i][n + a]))
            log_std = SAC_LOG_STD_MIN + 0.5 * (SAC_LOG_STD_MAX - SAC_LOG_STD_MIN) * (t[i, a] + 1)
            std[i, a] = math.exp(log_std)
            x = mean + std[i, a] * float(eps[i][a])
            y[i, a] = math.tanh(x)
            act[i, a] = y[i, a] * float(scale[a]) + float(bias[a])
            logp[i] += (-0.5 * float(eps[i][a]) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
                        - math.log(float(scale[a]) * (1 - y[i, a] ** 2) + 1e-6))
    return t, std, y, act, logp


def sac_squashed_gaussian_backward_naive(g_action, c_logp, head, eps, scale) -> np.ndarray:
    """d/d head of sum(g_action * action) + c_logp * sum(logp), by the chain rule written out
    per element (tanh' = 1 - tanh**2, d exp = exp)."""
    rows, n = np.shape(eps)
    g = np.zeros((rows, 2 * n))
    for i in range(rows):
        for a in range(n):
            mean, raw, e, s = float(head[i][a]), float(head[i][n + a]), float(eps[i][a]), float(scale[a])
            t = math.tanh(raw)
            log_std = SAC_LOG_STD_MIN + 3.5 * (t + 1)
            std = math.exp(log_std)
            y = math.tanh(mean + std * e)
            # logp's element: -e**2/2 - log_std - log(s (1 - y**2) + 1e-6) (+ constant)
            dlogp_dy = 2 * y * s / (s * (1 - y * y) + 1e-6)
            dy_dx = 1 - y * y
            d_x = (float(g_action[i][a]) * s + c_logp * dlogp_dy) * dy_dx
            d_log_std = d_x * e * std - c_logp
            g[i, a] = d_x
            g[i, n + a] = d_log_std * 3.5 * (1 - t * t)
    return g


def sac_critic_target_naive(reward, terminated, q1, q2, logp, alpha, gamma) -> np.ndarray:
    return np.array([float(r) + (0.0 if d else 1.0) * gamma * (min(float(a), float(b)) - alpha * float(lp))
                     for r, d, a, b, lp in zip(reward, terminated, np.ravel(q1), np.ravel(q2), logp)])


def sac_mse_backward_naive(q, target) -> tuple:
    d = np.ravel(q).astype(np.float64) - np.asarray(target, np.float64)
    return float(np.mean(d * d)), (2 * d / len(d))[:, None]


def sac_min_backward_naive(q1, q2, logp, alpha) -> tuple:
    q1, q2 = np.ravel(q1).astype(np.float64), np.ravel(q2).astype(np.float64)
    n = len(q1)
    g1 = np.where(q1 < q2, -1.0 / n, np.where(q1 == q2, -0.5 / n, 0.0))
    g2 = np.where(q2 < q1, -1.0 / n, np.where(q1 == q2, -0.5 / n, 0.0))
    loss = float(np.mean(alpha * np.asarray(logp, np.float64) - np.minimum(q1, q2)))
    return loss, g1[:, None], g2[:, None]


def sac_temperature_naive(logp, target_entropy, log_alpha) -> float:
    return float(np.mean([-math.exp(log_alpha) * (float(lp) + target_entropy) for lp in logp]))


def sac_actor_act_naive(layers, x, eps, scale, bias, deterministic: bool) -> np.ndarray:
    """The actor row by row in float64: layers [(weight (n_out, n_in), bias)], ReLU between."""
    out = []
    for r, row in enumerate(np.asarray(x, np.float64)):
        h = row
        for i, (w, b) in enumerate(layers):
            h = np.asarray(w, np.float64) @ h + np.asarray(b, np.float64)
            if i < len(layers) - 1:
                h = np.maximum(h, 0.0)
        n = len(scale)
        mean, raw = h[:n], h[n:]
        if deterministic:
            y = np.tanh(mean)
        else:
            std = np.exp(SAC_LOG_STD_MIN + 3.5 * (np.tanh(raw) + 1))
            y = np.tanh(mean + std * np.asarray(eps[r], np.float64))
        out.append(y * np.asarray(scale, np.float64) + np.asarray(bias, np.float64))
    return np.array(out)


# -- sample transforms (tfdata.transforms) ------------------------------------------------------


def normalize(x, mean, var, eps: float, clip=None) -> np.ndarray:
    """``(x - mean) * (1 / sqrt(var + eps))`` in float64, optionally clipped, rounded to
    float32 (the factor's reciprocal first, then a product: the transform's definition)."""
    out = (np.asarray(x, np.float64) - mean) * (1.0 / np.sqrt(np.asarray(var, np.float64) + eps))
    if clip is not None:
        out = np.clip(out, -clip, clip)
    return out.astype(np.float32)


def scale_clip(x, scale: float, low=None, high=None) -> np.ndarray:
    """``clip(x * scale, low, high)``, the product in float64, rounded once to ``x``'s dtype."""
    out = np.asarray(x, np.float64) * scale
    if low is not None:
        out = np.clip(out, low, high)
    return out.astype(np.asarray(x).dtype)


def cast(x, dtype, scale=None) -> np.ndarray:
    x = np.asarray(x)
    if scale is None:
        return x.astype(dtype)
    return (x.astype(np.float64) * scale).astype(dtype)


def random_shift(images, pad: int, key: int, counter: int) -> tuple[np.ndarray, int]:
    """DrQ's shift: each row padded with its edge pixels (``np.pad(mode="edge")``) on the last
    two axes, then cropped at ``(dy, dx)``, drawn as the counter RNG's bounded draws from
    ``[0, 2 * pad]`` (dy, then dx, row by row). Returns (shifted, new counter)."""
    images = np.asarray(images)
    out = np.empty_like(images)
    H, W = images.shape[-2:]
    widths = [(0, 0)] * (images.ndim - 3) + [(pad, pad), (pad, pad)]
    for b in range(images.shape[0]):
        (dy, dx), counter = draw_indices(key, counter, 2 * pad + 1, 2)
        padded = np.pad(images[b], widths, mode="edge")
        out[b] = padded[..., dy:dy + H, dx:dx + W]
    return out, counter
