"""The A/B guard's statistics (bench/ab_stats.py): a change is named only when the rounds
cannot be explained by noise, in the figure's own direction."""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import ab_stats  # noqa: E402


def noisy(center, n, spread, seed):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_a_clear_slowdown_is_worse_and_a_clear_speedup_better():
    a, b = noisy(100, 6, 0.03, 1), noisy(125, 6, 0.03, 2)
    slower = ab_stats.verdict(a, b, "lower")
    assert slower["verdict"] == "worse" and slower["ci95"][0] > 1.1 and slower["p"] < 0.05, slower
    # The same numbers as a rate (higher is better): more is better.
    assert ab_stats.verdict(a, b, "higher")["verdict"] == "better"
    assert ab_stats.verdict(b, a, "lower")["verdict"] == "better"


def test_noise_alone_is_the_same():
    a, b = noisy(100, 6, 0.2, 3), noisy(100, 6, 0.2, 4)
    same = ab_stats.verdict(a, b, "lower")
    assert same["verdict"] == "same" and same["ci95"][0] < 1 < same["ci95"][1], same


def test_a_change_within_the_tolerance_is_the_same():
    a = [100.0, 100.1, 99.9, 100.05, 99.95]
    b = [x * 1.02 for x in a]
    result = ab_stats.verdict(a, b, "lower", tolerance=0.03)
    assert result["p"] < 0.05 and result["verdict"] == "same", result
    assert ab_stats.verdict(a, b, "lower", tolerance=0.01)["verdict"] == "worse"


def test_the_exact_permutation_p_of_fully_separated_rounds():
    # 5 and 5 rounds, every B above every A: 2 of the 252 splits are as far apart.
    p = ab_stats.permutation_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert abs(p - 2 / 252) < 1e-9
    assert ab_stats.permutation_p([1, 2, 3], [1, 2, 3]) == 1.0


def test_seeded_so_the_same_rounds_give_the_same_answer():
    a, b = noisy(10, 8, 0.1, 5), noisy(11, 8, 0.1, 6)
    assert ab_stats.verdict(a, b, "lower") == ab_stats.verdict(a, b, "lower")
    assert ab_stats.ratio_of_medians([0, 0], [1, 1]) is None
