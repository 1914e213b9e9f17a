"""Device helpers shared by several ops' kernels and planners: host ceiling division and powers
of 2, the GPU's SM count, whether it takes programmatic dependent launches, fp32 rounding to a
stream dtype that the interpreter and the GPU agree on, the finalizes' loads of a token's 4
streams and RMSNorm factor of their mix, and whether the interpreter multiplies bf16 dot
operands as numbers."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsv4spec.kernels import on_rocm


def cdiv(a: int, b: int) -> int:
    """Ceiling division on the host: the planners' (``triton.cdiv`` is a constexpr function,
    2-3 us a call on the host, and the tables' planner queries scan every token count)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= ``n`` (>= 1), on the host: as :func:`cdiv`."""
    return 1 << max(n - 1, 0).bit_length()


def supports_pdl(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` can launch a kernel as a programmatic dependent launch
    (``-1``, the interpreter: no)."""
    # griddepcontrol is NVIDIA's, from sm_90; not in the interpreter, not on ROCm (whose
    # capability numbers mean something else: an MI300 reports 9.4)
    return (device_index >= 0 and not on_rocm()
            and torch.cuda.get_device_capability(device_index)[0] >= 9)


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int) -> int:
    """The streaming multiprocessors of CUDA device ``device_index``, which the split counts fill;
    132 (an H200's) for ``-1``, the interpreter."""
    if device_index < 0:
        return 132  # the interpreter (CPU tensors): mirror an H200's grid
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@triton.jit
def round_to(y, DTYPE: tl.constexpr):
    """fp32 -> DTYPE, round to nearest even."""
    # Triton 3.6's interpreter truncates fp32 -> bf16, so bf16 is rounded by hand (then the cast
    # is exact): the interpreter and the GPU agree.
    if DTYPE == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
        y = bits.to(tl.float32, bitcast=True)
    return y.to(DTYPE)


@triton.jit
def split_bf16x3(f):
    """fp32 ``f`` as three bf16 parts ``hi + mid + lo`` that carry its 24 bits: a bf16 operand
    times each part is exact, so three tensor-core products summed in fp32 give fp32 accuracy."""
    hi = f.to(tl.bfloat16)
    rest = f - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    return hi, mid, lo


@triton.jit
def store_token_grams(ws_rows, stride_wk, gram, mask_r, ROWS: tl.constexpr, BLOCK_T: tl.constexpr,
                      DIAG_SLOT: tl.constexpr, PAIR_SLOT: tl.constexpr, PAIRS: tl.constexpr):
    """Store each token's 4 x 4 Gram matrix from ``gram [ROWS, ROWS]``, the product of a tile of
    rows ``(t, i)`` (token t, stream i; ``ROWS = 4 * BLOCK_T``) with its transpose: the diagonal
    ``G_ii`` to slot ``DIAG_SLOT + i`` and, with ``PAIRS``, ``G_ij`` for i < j to ``PAIR_SLOT +``
    (01, 02, 03, 12, 13, 23). ``ws_rows`` points at each row's token, ``mask_r`` its rows in T."""
    offs_r = tl.arange(0, ROWS)
    same_token = (offs_r[:, None] // 4) == (offs_r[None, :] // 4)
    g = tl.sum(tl.reshape(tl.where(same_token, gram, 0.0), [ROWS, BLOCK_T, 4]), axis=1)
    ii = offs_r[:, None] % 4  # g[(t, i), j] = G_ij of token t
    jj = tl.arange(0, 4)[None, :]
    slot = tl.where(ii == jj, DIAG_SLOT + ii, PAIR_SLOT + ii * (7 - ii) // 2 + jj - ii - 1)
    keep = (ii == jj) | (PAIRS & (ii < jj))
    tl.store(ws_rows[:, None] + slot * stride_wk, g, mask=mask_r[:, None] & keep)


@triton.jit
def load_streams(row_ptr, stride, mask, POLICY: tl.constexpr):
    """The 4 streams' values at ``row_ptr + i * stride`` (i = 0..3) as fp32, 0 where masked:
    the layer-input and hc_head finalizes' loads of one H-block of a token's streams."""
    x0 = tl.load(row_ptr, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    x1 = tl.load(row_ptr + stride, mask=mask, other=0.0, eviction_policy=POLICY).to(tl.float32)
    x2 = tl.load(row_ptr + 2 * stride, mask=mask, other=0.0,
                 eviction_policy=POLICY).to(tl.float32)
    x3 = tl.load(row_ptr + 3 * stride, mask=mask, other=0.0,
                 eviction_policy=POLICY).to(tl.float32)
    return x0, x1, x2, x3


@triton.jit
def load_pre_params(scale_ptr, base_ptr):
    """The pre weights' scale and 4 biases ``(scale[0], base[0..3])``: the layer-input and
    hc_head finalizes' scalar parameter loads, issued together before any reduction."""
    return (tl.load(scale_ptr), tl.load(base_ptr), tl.load(base_ptr + 1), tl.load(base_ptr + 2),
            tl.load(base_ptr + 3))


@triton.jit
def mix_rstd(w0, w1, w2, w3, g00, g11, g22, g33, g01, g02, g03, g12, g13, g23, H, norm_eps):
    """The RMSNorm factor of ``y = sum_i w_i x_i`` over H from the streams' Gram sums G alone:
    ``sum_h y^2 = w^T G w`` (of the fp32 y; the reference squares y rounded to x.dtype, and the
    difference is far below the output's rounding), so no second pass over y."""
    yy = w0 * w0 * g00 + w1 * w1 * g11 + w2 * w2 * g22 + w3 * w3 * g33
    yy += 2.0 * (w0 * (w1 * g01 + w2 * g02 + w3 * g03) + w1 * (w2 * g12 + w3 * g13)
                 + w2 * w3 * g23)
    return 1.0 / tl.sqrt(yy / H + norm_eps)


@triton.jit
def _bf16_dot_probe_kernel(a_ptr, out_ptr):
    offs = tl.arange(0, 16)
    a = tl.load(a_ptr + offs[:, None] * 16 + offs[None, :])
    tl.store(out_ptr + offs[:, None] * 16 + offs[None, :], tl.dot(a, a))


@functools.lru_cache(maxsize=None)
def interpreter_multiplies_bf16() -> bool:
    """Whether this Triton interpreter multiplies bf16 ``tl.dot`` operands as numbers (the
    tensor-core paths need it on CPU)."""
    # Triton 3.6's interpreter keeps bf16 as uint16 and multiplies the bit patterns in tl.dot
    # (tests/conftest.py converts them first): probe once instead of trusting a version number.
    a = torch.full((16, 16), 0.5, dtype=torch.bfloat16)
    out = torch.empty((16, 16), dtype=torch.float32)
    _bf16_dot_probe_kernel[(1,)](a, out)
    return bool((out == 4.0).all())
