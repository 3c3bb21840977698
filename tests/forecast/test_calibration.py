"""How the safety margin moves: measured peaks pull it to the observed excess, an OOM pushes it up at once."""

import pytest

from tuner.forecast import DEFAULT_MARGIN, MIN_MARGIN, Calibration

GIB = 2**30


def test_fresh_margin_is_the_default() -> None:
    calibration = Calibration()
    assert calibration.margin == DEFAULT_MARGIN
    assert calibration.fits(int(76 * GIB), 80 * GIB)  # 76 × 1.05 = 79.8
    assert not calibration.fits(int(77 * GIB), 80 * GIB)


def test_accurate_estimates_shrink_the_margin_to_its_floor() -> None:
    calibration = Calibration()
    for _ in range(10):
        calibration = calibration.after_measurement(estimated_peak=100, measured_peak=99)
    assert calibration.margin == MIN_MARGIN


def test_underestimates_grow_the_margin_to_their_90th_percentile() -> None:
    calibration = Calibration()
    for excess in (0.00, 0.02, 0.04, 0.06, 0.08, 0.10, 0.12, 0.14, 0.16, 0.18, 0.20):
        calibration = calibration.after_measurement(estimated_peak=1000, measured_peak=int(1000 * (1 + excess)))
    assert calibration.margin == pytest.approx(0.18 + 0.01, abs=1e-9)


def test_an_oom_the_estimator_let_through_prunes_its_like_afterwards() -> None:
    """A config estimated at 75 GiB ran out of memory on an 80 GiB GPU: the margin jumps so that 75 GiB no longer
    fits (80/75 - 1 + 0.01 = 7.67 %), and later accurate measurements do not pull it back below that."""
    calibration = Calibration()
    estimated, capacity = 75 * GIB, 80 * GIB
    assert calibration.fits(estimated, capacity)
    calibration = calibration.after_oom(estimated, capacity)
    assert calibration.margin == pytest.approx(80 / 75 - 1 + 0.01)
    assert not calibration.fits(estimated, capacity)
    after = calibration.after_measurement(estimated_peak=100, measured_peak=100)
    assert after.margin == calibration.margin and after.ooms == 1


def test_one_wild_outlier_cannot_prune_everything() -> None:
    calibration = Calibration().after_measurement(estimated_peak=100, measured_peak=10_000)
    assert calibration.margin == 0.5
