"""The roofline SVG: well-formed, every point where the numbers put it, labels readable."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from pytest_nobreak.report import roofline
from pytest_nobreak.report.roofline import Point, Roof, render_svg

SVG = "{http://www.w3.org/2000/svg}"
FAST = Roof("fast", peak_ops_per_s=32e12, bandwidth_bytes_per_s=100e9, description="fast (128x128)")
SLOW = Roof("slow", peak_ops_per_s=512e9, bandwidth_bytes_per_s=16e9)
POINTS = [
    Point("fast", "decode 1×2048×2048", 2.0, 0.2e12, "memory"),
    Point("fast", "prefill 512×2048×2048", 600.0, 20e12, "compute"),
    Point("slow", "decode 1×2048×2048", 2.0, 10e9, "compute"),
]


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def circles(root: ET.Element, cls: str) -> list[ET.Element]:
    return [c for c in root.iter(f"{SVG}circle") if c.get("class") == cls]


def texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def test_one_roof_per_device_with_its_figures() -> None:
    root = parse(render_svg([FAST, SLOW], POINTS))
    roofs = [g for g in root.iter(f"{SVG}g") if g.get("class") == "roof"]
    assert [g.get("data-device") for g in roofs] == ["fast", "slow"]
    assert float(roofs[0].get("data-ridge", 0)) == pytest.approx(320.0)
    assert float(roofs[1].get("data-ridge", 0)) == pytest.approx(32.0)
    assert len(circles(root, "ridge")) == 2
    labels = texts(root)
    assert "fast: 32 TOP/s, ridge 320 op/B" in labels
    assert "slow: 512 GOP/s, ridge 32 op/B" in labels
    assert "fast (128x128)" in labels  # the legend uses the description


def test_roof_bends_at_the_ridge() -> None:
    root = parse(render_svg([FAST], []))
    line = next(p for p in root.iter(f"{SVG}polyline") if p.get("class") == "roofline")
    (x0, y0), (kx, ky), (x1, y1) = (
        tuple(map(float, pair.split(","))) for pair in (line.get("points") or "").split()
    )
    ridge = next(iter(circles(root, "ridge")))
    assert (kx, ky) == (float(ridge.get("cx", 0)), float(ridge.get("cy", 0)))
    # Flat compute roof to the right edge; rising memory roof on the left (SVG y grows down).
    assert (y1, x1 > kx) == (ky, True)
    assert (x0 < kx, y0 > ky) == (True, True)
    # On log-log axes the memory roof rises one decade per decade.
    axes = roofline._Axes.fit([FAST], [])
    decade_x, decade_y = axes.x(10.0) - axes.x(1.0), axes.y(1.0) - axes.y(10.0)
    assert (y0 - ky) / (kx - x0) == pytest.approx(decade_y / decade_x, rel=1e-3)


def test_every_point_is_drawn_where_its_numbers_put_it() -> None:
    root = parse(render_svg([FAST, SLOW], POINTS))
    drawn = circles(root, "point")
    assert len(drawn) == len(POINTS)
    axes = roofline._Axes.fit([FAST, SLOW], POINTS)
    right = roofline.PLOT_LEFT + roofline.PLOT_WIDTH
    bottom = roofline.PLOT_TOP + roofline.PLOT_HEIGHT
    for circle in drawn:
        point = next(
            p
            for p in POINTS
            if (p.device, p.layer) == (circle.get("data-device"), circle.get("data-layer"))
        )
        cx, cy = float(circle.get("cx", 0)), float(circle.get("cy", 0))
        assert cx == pytest.approx(axes.x(point.arithmetic_intensity), abs=0.06)
        assert cy == pytest.approx(axes.y(point.attained_ops_per_s), abs=0.06)
        assert roofline.PLOT_LEFT < cx < right
        assert roofline.PLOT_TOP < cy < bottom
        # Compute-bound markers are filled, memory-bound ones hollow.
        assert (circle.get("fill") == "white") == (point.bound == "memory")


def test_layers_are_numbered_left_to_right_and_shared_across_devices() -> None:
    root = parse(render_svg([FAST, SLOW], POINTS))
    key = [t for t in texts(root) if t[:1].isdigit() and "×" in t]
    assert key == ["1  decode 1×2048×2048", "2  prefill 512×2048×2048"]
    labels = sorted(
        "".join(t.itertext()) for t in root.iter(f"{SVG}text") if t.get("class") == "point-label"
    )
    assert labels == ["1", "1", "2"]  # layer 1 on both devices


def test_coincident_points_share_one_label() -> None:
    same = [Point("fast", f"layer {i}", 2.0, 0.2e12, "memory") for i in range(3)]
    root = parse(render_svg([FAST], same))
    labels = [t for t in root.iter(f"{SVG}text") if t.get("class") == "point-label"]
    assert ["".join(t.itertext()) for t in labels] == ["1-3"]
    assert len(circles(root, "point")) == 3


def test_labels_are_escaped_and_output_is_deterministic() -> None:
    tricky = [Point("fast", "a<b & 'c'", 10.0, 1e12, "memory")]
    svg = render_svg([FAST], tricky)
    assert svg == render_svg([FAST], tricky)
    root = parse(svg)
    assert any("a<b & 'c'" in t for t in texts(root))


def test_points_that_cannot_sit_on_log_axes_are_left_out() -> None:
    root = parse(render_svg([FAST], [Point("fast", "empty", 0.0, 0.0), *POINTS[:1]]))
    assert len(circles(root, "point")) == 1


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one Roof"):
        render_svg([], POINTS)
    with pytest.raises(ValueError, match=r"unknown device\(s\) slow"):
        render_svg([FAST], POINTS)
    with pytest.raises(ValueError, match="peak_ops_per_s must be a positive finite number"):
        Roof("bad", peak_ops_per_s=math.inf, bandwidth_bytes_per_s=1.0)


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (3.2768e13, "OP/s", "32.8 TOP/s"),
        (1e3, "", "1k"),
        (0.1, "", "0.1"),
        (999.96e9, "OP/s", "1 TOP/s"),
        (16e9, "B/s", "16 GB/s"),
        (2699.8, "", "2.7k"),
    ],
)
def test_si_prefixes(value: float, unit: str, text: str) -> None:
    assert roofline._si(value, unit) == text


def test_tooltip_gives_the_utilization_figures_it_has() -> None:
    full = Point("fast", "qkv", 2.0, 0.2e12, "memory", 0.003, 1.0, 0.0012345)
    bare = Point("fast", "qkv", 2.0, 0.2e12, "memory")
    tip = roofline._point_tooltip(full)
    assert tip.endswith("; utilization 0.3%, mapping efficiency 100%, compute utilization 0.123%")
    assert "utilization" not in roofline._point_tooltip(bare)


def test_a_long_device_description_shrinks_to_fit() -> None:
    long = Roof("tpu", 92e12, 34e9, description="tpu_v1 (256x256 ws, 2 weight buffers @ 0.7 GHz)")
    root = parse(render_svg([FAST, long], []))
    heads = {
        "".join(t.itertext()): float(t.get("font-size", 0))
        for t in root.iter(f"{SVG}text")
        if t.get("font-weight") == "bold" and t.get("fill") not in (None, "#444")
    }
    assert heads["fast (128x128)"] == 12
    size = heads[long.description]
    assert 8 <= size < 12
    # At that size the text ends inside the picture (an average bold glyph is ~0.62 em).
    x = float(
        next(t for t in root.iter(f"{SVG}text") if "".join(t.itertext()) == long.description).get(
            "x", 0
        )
    )
    assert x + 0.62 * size * len(long.description) <= roofline.WIDTH


def test_tooltip_names_the_host_syncs_the_device_stalled_for() -> None:
    stalled = Point("fast", "qkv", 2.0, 0.2e12, "memory", 0.5, syncs=3, stalled_cycles=3000)
    assert roofline._point_tooltip(stalled).endswith(
        "; utilization 50%; 3 host syncs (3,000 cycles stalled) in the tests that ran it"
    )
    # The cost not known: the count alone.
    one = Point("fast", "qkv", 2.0, 0.2e12, "memory", syncs=1)
    assert roofline._point_tooltip(one).endswith(
        "(memory-bound); 1 host sync in the tests that ran it"
    )
    for none in (Point("fast", "qkv", 2.0, 0.2e12), Point("fast", "qkv", 2.0, 0.2e12, syncs=0)):
        assert "sync" not in roofline._point_tooltip(none)


def test_a_point_with_host_syncs_says_so_in_the_svg() -> None:
    points = [
        Point("fast", "synced", 2.0, 0.2e12, "memory", syncs=2, stalled_cycles=20),
        Point("fast", "clean", 600.0, 20e12, "compute"),
    ]
    root = parse(render_svg([FAST], points))
    drawn = {c.get("data-layer"): c for c in circles(root, "point")}
    assert drawn["synced"].get("data-syncs") == "2"
    assert drawn["clean"].get("data-syncs") is None
    title = drawn["synced"].find(f"{SVG}title")
    assert title is not None
    assert "2 host syncs (20 cycles stalled)" in "".join(title.itertext())
