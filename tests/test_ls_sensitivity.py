"""Helpers of the LS centre-distance study (bench/ls_sensitivity.py)."""

from __future__ import annotations

import argparse

import pytest

from bench.ls_sensitivity import distance_for_bl_ip, parse_distances


def _point(distance, bl_ip, default=False):
    return {"center_distance": distance, "default_centres": default, "ip": {"bl_mean": bl_ip}}


def test_parse_distances():
    assert parse_distances("default, 2,4.5") == [None, 2.0, 4.5]
    for bad in ("0", "-1", "x", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match="--distances"):
            parse_distances(bad)


def test_distance_for_bl_ip_interpolates_the_sweep_only():
    points = [_point(2, 1.0), _point(6, 5.0), _point(10.03, 3.4, default=True), _point(14, 13.0)]
    # between (2, 1) and (6, 5): 2 + (3.4 - 1) * 4 / 4 = 4.4; the default point is not part of the sweep
    assert distance_for_bl_ip(points, 3.4) == pytest.approx(4.4)
    assert distance_for_bl_ip(points, 9.0) == pytest.approx(10.0)
    assert distance_for_bl_ip(points, 0.5) is None
