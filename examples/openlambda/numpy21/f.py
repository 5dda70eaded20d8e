"""Sums a nested list with numpy; says which numpy did it (two versions live side by side)."""
import numpy as np


def f(event):
    return {"result": int(np.array(event).sum()), "numpy-version": np.__version__}
