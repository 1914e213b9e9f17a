"""How the mHC precompile counts what Triton holds compiled for a device: every compiled variant
of every mHC kernel on that device (Triton's per-device ``(kernel_cache, kernel_key_cache,
target, backend, binder)``), the other devices' and the kernels never compiled left out."""

from types import SimpleNamespace

from dsv4spec.integrations import mhc_precompile as M


def _kernel(**per_device):
    caches = {int(d[1:]): ({f"variant{i}": object() for i in range(n)}, {}, None, None, None)
              for d, n in per_device.items()}
    return SimpleNamespace(kernel=SimpleNamespace(device_caches=caches))


def test_compiled_variants_counts_each_variant_on_the_device(monkeypatch):
    monkeypatch.setattr(M, "_KERNELS", (_kernel(d0=3, d1=5), _kernel(d1=2),
                                        SimpleNamespace(kernel=SimpleNamespace()),
                                        _kernel(d0=1)))
    assert M.compiled_variants(0) == 4
    assert M.compiled_variants(1) == 7
    assert M.compiled_variants(2) == 0
