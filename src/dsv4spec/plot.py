"""matplotlib on demand: plots are optional (extra ``bench``), so nothing imports it eagerly."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib (extra ``bench``) is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
