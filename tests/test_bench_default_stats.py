"""bench/bench_default.py's statistics, on hand-made timings (no GPU): the interleaved rounds' order, the paired
ratio (median of the rounds' best-in-set / default ratios, the first timings left out) and the summary's split of
the rows under 0.97 by cause (another kernel chosen, or the best-in-set kernel itself)."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def bench_default(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import bench_default as mod

    yield mod
    sys.modules.pop("bench_default", None)


def test_interleaved_rounds_alternate_and_pair_back_to_back(bench_default, monkeypatch):
    order, times = [], iter([12.0, 10.0, 11.0, 13.0, 10.0, 9.0, 10.0, 11.0, 13.0, 12.0])
    monkeypatch.setattr(bench_default, "_bench", lambda fn: (order.append(fn()), next(times))[1])
    row = {"default": {"ms": 10.0}, "best_in_set": {"ms": 10.5}}
    bench_default._interleaved(row, {"default": lambda: "D", "best_in_set": lambda: "B"}, 5, 2e9)
    assert order == ["B", "D", "D", "B", "B", "D", "D", "B", "B", "D"]   # B/A, then A/B, ...
    assert row["interleaved"] == {"default": [10.0, 10.0, 11.0, 9.0, 10.0, 12.0],
                                  "best_in_set": [10.5, 12.0, 13.0, 10.0, 11.0, 13.0]}
    # rounds' ratios 12/10, 13/11, 10/9, 11/10, 13/12 -> median 10/9; the first timings (10.5/10) are left out
    assert row["paired_ratio"] == pytest.approx(10 / 9)
    assert row["default"]["ms"] == 10.0 and row["best_in_set"]["ms"] == 11.5   # the medians of six
    assert row["default"]["tflops"] == pytest.approx(2e9 / 10.0 / 1e9)


def test_summary_splits_the_rows_under_097_by_cause(bench_default):
    def row(default_tf, best_tf, same, paired):
        return {"default": {"tflops": default_tf, "kernel": "k1"},
                "best_in_set": {"tflops": best_tf, "name": "k1" if same else "k2"}, "paired_ratio": paired}

    doc = {"parts": {"prefill": [row(95.0, 100.0, True, 0.99), row(90.0, 100.0, False, 0.91),
                                 row(101.0, 100.0, False, 1.01), row(99.0, 100.0, True, 0.98),
                                 row(96.0, 100.0, False, 0.975)]}}
    bench_default.summarize(doc)
    s = doc["summary"]
    assert s["prefill_below_097"] == {"other_kernel": 2, "same_kernel": 1, "same_kernel_rows": 2,
                                      "same_kernel_min": pytest.approx(0.95)}
    assert s["prefill_default_vs_best_in_set"]["ge097"] == 2
    paired = s["prefill_default_vs_best_in_set_paired"]
    assert paired["ge097"] == 4 and paired["min"] == pytest.approx(0.91) and paired["n"] == 5
