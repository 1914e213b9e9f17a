"""DeepGEMM's ``tf32_hc_prenorm_gemm``, the engines' mHC pre-norm GEMM with DeepGEMM on, against
float64 on the GPU: whichever ``deep_gemm`` imports (sgl-deep-gemm built for this torch, or vLLM's
own copy, both by ``scripts/deepgemm-bundle.sh``), so the DeepGEMM-on peers measure a GEMM that
computes what the engines rely on. Skipped where ``deep_gemm`` does not import.

The call is the engines': ``tf32_hc_prenorm_gemm(x [T, hc*H] bf16, fn [hc*(hc+2), hc*H] fp32,
out [S, T, hc*(hc+2)] fp32, sqrsum [S, T] fp32, num_splits=S)`` writes S partial sums over
slices of ``hc*H`` (SGLang and vLLM add them up in their big-fuse kernel): ``out.sum(0) = x @
fn.T`` and ``sqrsum.sum(0) = (x * x).sum(-1)``.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

HC = 4
MIX = HC * (HC + 2)


@pytest.fixture(scope="module")
def deep_gemm():
    try:
        import deep_gemm
    except (ImportError, OSError, RuntimeError) as err:
        pytest.skip(f"deep_gemm does not import ({type(err).__name__}: {err}); "
                    "scripts/deepgemm-bundle.sh builds one")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("DeepGEMM's tf32_hc_prenorm_gemm needs compute capability 9.0 or newer")
    return deep_gemm


def sglang_splits(T: int, K: int) -> int:
    """SGLang 0.5.23's ``_compute_num_split_for_mhc_pre`` (block 64 x 64)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return max(1, min(sms // max(-(-T // 64), 1), -(-K // 64) // 4))


@pytest.mark.parametrize("H", [4096, 7168])
@pytest.mark.parametrize("T", [1, 16, 33, 4096])
def test_tf32_hc_prenorm_gemm_matches_float64(deep_gemm, T, H):
    K = HC * H
    g = torch.Generator(device="cuda").manual_seed(T + H)
    x = torch.randn(T, K, generator=g, device="cuda").bfloat16()
    fn = torch.randn(MIX, K, generator=g, device="cuda") * K ** -0.5
    ref = x.double() @ fn.double().T
    ref_sq = x.double().square().sum(-1)
    # TF32 keeps 10 mantissa bits of fn (x, bf16, is exact): each product within 2^-11, each sum
    # in fp32; bounded against the sum of magnitudes, not the (cancelling) result
    scale = x.double().abs() @ fn.double().abs().T
    # one kernel is JIT-compiled per split count: SGLang's, and two of vLLM's buckets {1, 4, 16}
    for splits in sorted({1, 16, sglang_splits(T, K)}):
        out = torch.full((splits, T, MIX), float("nan"), device="cuda")
        sqrsum = torch.full((splits, T), float("nan"), device="cuda")
        deep_gemm.tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_splits=splits)
        torch.cuda.synchronize()
        got, got_sq = out.double().sum(0), sqrsum.double().sum(0)
        assert torch.isfinite(got).all() and torch.isfinite(got_sq).all(), splits
        assert ((got - ref).abs() <= 2e-3 * scale + 1e-6).all(), (
            splits, (got - ref).abs().max().item(), scale.max().item())
        assert ((got_sq - ref_sq).abs() <= 1e-4 * ref_sq + 1e-6).all(), (
            splits, ((got_sq - ref_sq).abs() / ref_sq).max().item())
