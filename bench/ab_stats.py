"""How two builds' rounds of one benchmark figure compare: the ratio of their medians (B / A),
its confidence interval by bootstrap, a rank-sum permutation test's p-value, and a verdict that names a
change only when the noise of a shared host cannot explain it (as Firecracker's A/B tests do).

Pure functions of the rounds' numbers, seeded, so the same rounds always give the same verdict.
"""

import itertools
import math
import random
import statistics


def ratio_of_medians(a, b):
    """B's median over A's (None when A's is 0)."""
    base = statistics.median(a)
    return statistics.median(b) / base if base else None


def bootstrap_ci(a, b, level=0.95, draws=4000, seed=1):
    """The `level` confidence interval of B's median over A's: each side resampled with
    replacement `draws` times, the ratio's percentiles."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        ma = statistics.median(rng.choices(a, k=len(a)))
        mb = statistics.median(rng.choices(b, k=len(b)))
        if ma:
            ratios.append(mb / ma)
    if not ratios:
        return None, None
    ratios.sort()
    tail = (1 - level) / 2
    low = ratios[int(tail * (len(ratios) - 1))]
    high = ratios[int((1 - tail) * (len(ratios) - 1))]
    return low, high


def permutation_p(a, b, draws=20000, seed=1):
    """Two-sided p-value of the Mann-Whitney rank-sum under "A and B are the same build":
    every split of the pooled rounds' ranks when there are few enough (exact), else `draws`
    random ones. Ties share their mean rank."""
    pooled = list(a) + list(b)
    ranks = _ranks(pooled)
    n, total = len(a), sum(ranks)
    expected = total * n / len(pooled)
    observed = abs(sum(ranks[:n]) - expected)

    def as_far(idx):
        return abs(sum(ranks[i] for i in idx) - expected) >= observed - 1e-9

    if math.comb(len(pooled), n) <= draws:
        splits = list(itertools.combinations(range(len(pooled)), n))
        return sum(as_far(s) for s in splits) / len(splits)
    rng = random.Random(seed)
    hits = sum(as_far(rng.sample(range(len(pooled)), n)) for _ in range(draws))
    return (hits + 1) / (draws + 1)


def _ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def verdict(a, b, better, tolerance=0.03, alpha=0.05):
    """Compare rounds `a` and `b` of a figure that is better when `better` ("lower" or
    "higher"): a dict with the medians, the ratio, its interval, p and the verdict, one of
    "better", "worse" (the interval wholly past `tolerance` on that side and p < alpha) or
    "same" (no change the rounds can tell from noise)."""
    ratio = ratio_of_medians(a, b)
    low, high = bootstrap_ci(a, b)
    p = permutation_p(a, b)
    result = {"a_median": statistics.median(a), "b_median": statistics.median(b), "ratio": ratio,
              "ci95": [low, high], "p": p, "verdict": "same"}
    if ratio is None or low is None or p >= alpha:
        return result
    worse_if_up = better == "lower"
    if low > 1 + tolerance:
        result["verdict"] = "worse" if worse_if_up else "better"
    elif high < 1 - tolerance:
        result["verdict"] = "better" if worse_if_up else "worse"
    return result
