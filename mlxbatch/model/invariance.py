"""Whether a row's bits are its own: the check the BLAS probe runs for each kernel family and
host layout, a needle row among others through hostops.py's products and attention."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from . import hostops
from .hostops import prepare

# (N, K) of the products: small ones, and the 0.5B model's MLP and attention shapes (one row
# alone there is not padded by the plain layout's small-matrix bound)
PRODUCTS = ((64, 64), (300, 896), (896, 520), (3, 64), (4864, 896), (896, 4864), (128, 896))
BATCHES = (2, 3, 5, 17, 40, 300)  # rows a product, the needle at its start, middle and end
LONG = 1200  # a plain product's rows run to a whole batch's tokens: one such product, and
# attention over as many keys (at the smallest head shape: the key count is what changes)


def invariant_layouts() -> list[str]:
    """The layouts (fastest first) in which a row's bits are the same in any batch."""
    return [name for name in hostops.LAYOUTS if row_invariance(name)]


def row_invariance(layout: str | None = None) -> bool:
    """Whether a needle row gets the same bits at several batch sizes and places in `layout`
    (None: this process's), through `matmul_t` (with and without bias) and `attention`."""
    product, attend = hostops.KERNELS[layout or hostops.LAYOUT]
    return _products_invariant(product) and _attention_invariant(attend)


def _products_invariant(product) -> bool:
    r = np.random.default_rng(0)
    for n, k in PRODUCTS:
        w = mx.array(r.standard_normal((n, k)).astype(np.float32))
        x = mx.array(r.standard_normal((LONG, k)).astype(np.float32))
        for bias in (None, mx.array(r.standard_normal(n).astype(np.float32))):
            alone = np.array(product(x[:1], w, bias))[0]
            for m in BATCHES + ((LONG,) if (n, k) == (128, 896) else ()):
                for pos in {1, m // 2, m - 1}:
                    order = list(range(1, pos + 1)) + [0] + list(range(pos + 1, m))
                    got = np.array(product(x[mx.array(order)], w, bias))[pos]
                    if not np.array_equal(got, alone):
                        return False
    return True


def _attention_invariant(attend) -> bool:
    r = np.random.default_rng(1)
    for heads, kv, hd in ((4, 2, 16), (14, 2, 64), (12, 2, 128)):
        own = 9  # the needle row's tokens, the same in each batch; rows padded to `width`
        needle = [r.standard_normal((h, own, hd)).astype(np.float32) for h in (heads, kv, kv)]
        alone = None
        long = ((2, LONG, 1),) if hd == 16 else ()
        for batch, width, at in ((1, own, 0), (3, 40, 1), (5, 130, 4), *long):
            qkv = []
            for h, part in zip((heads, kv, kv), needle):
                a = r.standard_normal((batch, h, width, hd)).astype(np.float32)
                a[at, :, :own] = part
                qkv.append(mx.array(a))
            seen = np.tril(np.ones((width, width), bool))[None, None].repeat(batch, 0)
            seen[at, :, :, own:] = False  # the needle's padding keys
            out = attend(*qkv, hd**-0.5, prepare(mx.array(seen), width, width))
            got = np.array(out)[at, :, :own]
            if alone is None:
                alone = got
            elif not np.array_equal(got, alone):
                return False
    return True
