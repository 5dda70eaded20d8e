"""Sums a table with pandas; says which numpy pandas brought."""
import numpy as np
import pandas as pd


def f(event):
    return {"result": int(pd.DataFrame(event).values.sum()), "numpy-version": np.__version__}
