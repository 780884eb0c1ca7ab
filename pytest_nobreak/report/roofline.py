"""A roofline chart of simulated devices as a self-contained SVG: pure, no pytest, no torch.

One or more devices (a :class:`Roof` each: peak ops/s and DRAM bandwidth) and the points measured
on them (a :class:`Point` per layer: arithmetic intensity and attained ops/s), drawn on log-log
axes: each device's memory roof (``bandwidth · intensity``) rising to its ridge point, then its
compute roof (``peak``). Points of the same layer share a number; the key beside the chart names
the layers. Filled markers are compute-bound GEMMs, hollow ones memory-bound. Each marker's tooltip
gives its figures: utilization and, when the tests that ran it made the device stall for host
syncs, how many and the cycles they cost.

>>> from pytest_nobreak.report.roofline import Point, Roof, render_svg
>>> roof = Roof("default", peak_ops_per_s=32.8e12, bandwidth_bytes_per_s=100e9)
>>> svg = render_svg([roof], [Point("default", "1x2048x2048", 2.0, 0.2e12, "memory")])
>>> svg.startswith("<svg")
True

The SVG is written by hand (no plotting dependency) and is deterministic for the same input.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Literal
from xml.sax.saxutils import escape, quoteattr

__all__ = ["Point", "Roof", "is_positive_number", "render_svg"]

Bound = Literal["compute", "memory"]

# Okabe-Ito: the devices stay apart for red-green colour-blind readers too (their yellow, too
# pale on white, is left out).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")

WIDTH, HEIGHT = 1000, 640
PLOT_LEFT, PLOT_TOP, PLOT_WIDTH, PLOT_HEIGHT = 96, 78, 560, 460
PANEL_LEFT = PLOT_LEFT + PLOT_WIDTH + 36
FONT = "font-family='DejaVu Sans, Helvetica, Arial, sans-serif'"
#: Markers of one device closer than this (px) are drawn as one, labelled with all their numbers.
MERGE_PX = 7.0
#: Average glyph width at the label font size, to keep labels from overlapping (px per char).
CHAR_PX = 7.0
LABEL_PX = 11
SUBTITLE = "one point per benchmarked layer: int8 ops / max(cycles / f, bytes / bandwidth)"


Box = tuple[float, float, float, float]  # left, top, right, bottom


def is_positive_number(value: object) -> bool:
    """Whether ``value`` is a finite number above zero (an int or a float, not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@dataclasses.dataclass(frozen=True)
class Roof:
    """A device's roofs: ``peak_ops_per_s`` (2·R·C·f for an R x C array) and DRAM bandwidth."""

    name: str
    peak_ops_per_s: float
    bandwidth_bytes_per_s: float
    description: str = ""

    def __post_init__(self) -> None:
        for field in ("peak_ops_per_s", "bandwidth_bytes_per_s"):
            value = getattr(self, field)
            if not is_positive_number(value):
                raise ValueError(f"Roof.{field} must be a positive finite number, got {value!r}")

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (ops/byte) where the memory roof meets the compute roof."""
        return self.peak_ops_per_s / self.bandwidth_bytes_per_s

    def at(self, intensity: float) -> float:
        """The roof at ``intensity``: ``min(peak, bandwidth · intensity)``."""
        return min(self.peak_ops_per_s, self.bandwidth_bytes_per_s * intensity)


@dataclasses.dataclass(frozen=True)
class Point:
    """One layer measured on device ``device`` (a :attr:`Roof.name`)."""

    device: str
    layer: str
    arithmetic_intensity: float
    attained_ops_per_s: float
    bound: Bound = "compute"
    #: MACs / (R·C·cycles), and SCALE-Sim's mapping efficiency and compute utilization (0..1).
    utilization: float | None = None
    mapping_efficiency: float | None = None
    compute_utilization: float | None = None
    #: The host syncs the device stalled for in the tests that ran this layer, and the cycles
    #: they cost (``None``: not measured, or the cost is not known).
    syncs: int | None = None
    stalled_cycles: int | None = None


def render_svg(
    roofs: Sequence[Roof],
    points: Sequence[Point],
    *,
    title: str = "Roofline of the simulated int8 ASIC",
    subtitle: str = SUBTITLE,
) -> str:
    """The chart as an SVG document. Points must name a device in ``roofs``; points with a
    non-positive intensity or throughput (an empty GEMM) cannot sit on log axes and are left out.
    """
    if not roofs:
        raise ValueError("render_svg: at least one Roof is needed")
    by_name = {roof.name: roof for roof in roofs}
    unknown = sorted({p.device for p in points} - by_name.keys())
    if unknown:
        raise ValueError(f"render_svg: points on unknown device(s) {', '.join(unknown)}")
    drawn = [p for p in points if p.arithmetic_intensity > 0 and p.attained_ops_per_s > 0]
    axes = _Axes.fit(roofs, drawn)
    colours = {roof.name: PALETTE[i % len(PALETTE)] for i, roof in enumerate(roofs)}
    numbers = _number_layers(drawn)

    out = [
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
        f"viewBox='0 0 {WIDTH} {HEIGHT}' role='img' {FONT}>",
        f"<title>{escape(title)}</title>",
        f"<desc>{escape(_description(roofs, drawn))}</desc>",
        f"<rect width='{WIDTH}' height='{HEIGHT}' fill='white'/>",
        f"<text x='{PLOT_LEFT}' y='30' font-size='19' font-weight='bold'>{escape(title)}</text>",
        f"<text x='{PLOT_LEFT}' y='52' font-size='12' fill='#555'>{escape(subtitle)}</text>",
    ]
    out += axes.grid()
    for roof in roofs:
        out += _roof(axes, roof, colours[roof.name])
    taken: list[Box] = []
    out += _points(axes, drawn, colours, numbers, taken)
    out += _roof_labels(axes, roofs, colours, taken)
    out += _panel(roofs, colours, numbers, drawn)
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- axes


@dataclasses.dataclass(frozen=True)
class _Axes:
    """Log-log axes: x in ops/byte, y in ops/s; the bounds are log10 values."""

    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float

    @classmethod
    def fit(cls, roofs: Sequence[Roof], points: Sequence[Point]) -> _Axes:
        xs = [r.ridge for r in roofs] + [p.arithmetic_intensity for p in points]
        ys = [r.peak_ops_per_s for r in roofs] + [p.attained_ops_per_s for p in points]
        # A margin around the data, wider on the right so each compute roof shows as a line
        # past its ridge point, and on top for the roofs' labels.
        x_lo, x_hi = _with_decade(math.log10(min(xs) / 1.6), math.log10(max(xs) * 3))
        y_hi = math.log10(max(ys) * 2.5)
        # Down to the lowest point, but not more than 6 decades below the top (without points:
        # where the lowest memory roof enters the chart).
        lowest = [p.attained_ops_per_s for p in points] or [r.at(10**x_lo) for r in roofs]
        y_lo = max(math.log10(min(lowest) / 1.6), y_hi - 6)
        y_lo, y_hi = _with_decade(min(y_lo, y_hi - 1), y_hi)
        return cls(x_lo, x_hi, y_lo, y_hi)

    def x(self, intensity: float) -> float:
        frac = (math.log10(intensity) - self.x_lo) / (self.x_hi - self.x_lo)
        return PLOT_LEFT + frac * PLOT_WIDTH

    def y(self, ops: float) -> float:
        frac = (math.log10(ops) - self.y_lo) / (self.y_hi - self.y_lo)
        return PLOT_TOP + PLOT_HEIGHT - frac * PLOT_HEIGHT

    def grid(self) -> list[str]:
        bottom, right = PLOT_TOP + PLOT_HEIGHT, PLOT_LEFT + PLOT_WIDTH
        out = [
            f"<rect x='{PLOT_LEFT}' y='{PLOT_TOP}' width='{PLOT_WIDTH}' height='{PLOT_HEIGHT}' "
            "fill='#fbfbfb' stroke='#999'/>",
            "<g class='grid' stroke-width='1'>",
        ]
        # Minor lines at 2..9 of each decade make the log scale readable between the labels.
        xs, ys = _ticks(self.x_lo, self.x_hi), _ticks(self.y_lo, self.y_hi)
        for value, major in xs:
            x = self.x(value)
            out.append(_line(x, PLOT_TOP, x, bottom, "#d0d0d0" if major else "#ececec"))
        for value, major in ys:
            y = self.y(value)
            out.append(_line(PLOT_LEFT, y, right, y, "#d0d0d0" if major else "#ececec"))
        out.append("</g>")
        out.append("<g class='ticks' font-size='12' fill='#333'>")
        for value in (v for v, major in xs if major):
            out.append(
                f"<text x='{self.x(value):.1f}' y='{bottom + 18}' text-anchor='middle'>"
                f"{escape(_si(value))}</text>"
            )
        for value in (v for v, major in ys if major):
            out.append(
                f"<text x='{PLOT_LEFT - 8}' y='{self.y(value) + 4:.1f}' text-anchor='end'>"
                f"{escape(_si(value, 'OP/s'))}</text>"
            )
        out.append("</g>")
        out.append(
            f"<text x='{PLOT_LEFT + PLOT_WIDTH / 2}' y='{bottom + 42}' text-anchor='middle' "
            "font-size='13'>arithmetic intensity (int8 ops per DRAM byte, log scale)</text>"
        )
        mid = PLOT_TOP + PLOT_HEIGHT / 2
        out.append(
            f"<text x='22' y='{mid}' text-anchor='middle' font-size='13' "
            f"transform='rotate(-90 22 {mid})'>attained throughput (ops/s, log scale)</text>"
        )
        return out


def _with_decade(lo: float, hi: float) -> tuple[float, float]:
    """Widen ``[lo, hi]`` (log10) to hold at least one whole decade, so each axis has a label."""
    if math.floor(hi) >= math.ceil(lo):
        return lo, hi
    return math.floor(lo), hi


def _ticks(lo: float, hi: float) -> list[tuple[float, bool]]:
    """The values 1..9 x 10^d between 10^lo and 10^hi, each with whether it is a decade."""
    out = []
    for decade in range(math.floor(lo), math.ceil(hi) + 1):
        for m in range(1, 10):
            value = m * 10.0**decade
            if lo - 1e-9 <= math.log10(value) <= hi + 1e-9:
                out.append((value, m == 1))
    return out


def _si(value: float, unit: str = "") -> str:
    """3 significant digits and an SI prefix: ``_si(3.2768e13, "OP/s")`` is ``'32.8 TOP/s'``,
    ``_si(1000)`` is ``'1k'``, ``_si(0.1)`` is ``'0.1'``."""
    for power, prefix in ((15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if value >= 10.0**power * 0.9995:  # 999.9e9 reads as 1 T, not 1e+03 G
            number = f"{value / 10.0**power:.3g}"
            return f"{number} {prefix}{unit}" if unit else f"{number}{prefix}"
    return f"{value:.3g} {unit}" if unit else f"{value:.3g}"


def _line(x1: float, y1: float, x2: float, y2: float, colour: str) -> str:
    return f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='{colour}'/>"


# --------------------------------------------------------------------------- roofs


def _roof(axes: _Axes, roof: Roof, colour: str) -> list[str]:
    x_left, x_right = 10.0**axes.x_lo, 10.0**axes.x_hi
    # The memory roof enters the chart at its left edge, or at the bottom if it is lower there.
    x_start = max(x_left, 10.0**axes.y_lo / roof.bandwidth_bytes_per_s)
    knee = (roof.ridge, roof.peak_ops_per_s)
    path = [(x_start, roof.at(x_start)), knee, (x_right, roof.peak_ops_per_s)]
    coords = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in path)
    kx, ky = axes.x(knee[0]), axes.y(knee[1])
    left, bottom = PLOT_LEFT, PLOT_TOP + PLOT_HEIGHT
    name = quoteattr(roof.name)
    return [
        f"<g class='roof' data-device={name} data-peak='{roof.peak_ops_per_s:g}' "
        f"data-bandwidth='{roof.bandwidth_bytes_per_s:g}' data-ridge='{roof.ridge:g}'>",
        # Faint guides: the peak carried left to the axis (its label sits there, above every
        # memory roof, where no point can be) and the ridge dropped to the intensity axis.
        f"<polyline points='{left},{ky:.1f} {kx:.1f},{ky:.1f} {kx:.1f},{bottom}' fill='none' "
        f"stroke='{colour}' stroke-width='1' stroke-dasharray='3 4' opacity='0.6'/>",
        f"<polyline class='roofline' points='{coords}' fill='none' stroke='{colour}' "
        "stroke-width='2.5' stroke-linejoin='round'/>",
        f"<circle class='ridge' cx='{kx:.1f}' cy='{ky:.1f}' r='4' fill='{colour}'/>",
        "</g>",
    ]


def _roof_labels(
    axes: _Axes, roofs: Sequence[Roof], colours: dict[str, str], taken: list[Box]
) -> list[str]:
    """Each roof's name, peak and ridge, where it hides no point, label or other roof label:
    past the ridge above the compute roof, else at the left above the peak's guide line, else
    under the compute roof."""
    out = []
    right = PLOT_LEFT + PLOT_WIDTH
    for roof in roofs:
        text = f"{roof.name}: {_si(roof.peak_ops_per_s, 'OP/s')}, ridge {_si(roof.ridge)} op/B"
        w = CHAR_PX * 1.1 * len(text)
        kx, ky = axes.x(roof.ridge), axes.y(roof.peak_ops_per_s)
        spots = [(right - 6 - w, ky - 6), (PLOT_LEFT + 6, ky - 6), (right - 6 - w, ky + 16)]
        # Past the ridge only: further left the box would sit on the roof's own memory slope.
        usable = [s for s in spots if s[0] > kx + 4 or s[0] + w < kx - 40 or s[1] > ky]
        chosen = usable[0] if usable else spots[0]
        for x, y in usable:
            box = (x, y - 12, x + w, y + 3)
            if box[1] > PLOT_TOP and not any(_overlaps(box, other) for other in taken):
                chosen = (x, y)
                break
        x, y = chosen
        taken.append((x, y - 12, x + w, y + 3))
        out.append(
            f"<text class='roof-label' x='{x:.1f}' y='{y:.1f}' font-size='12' font-weight='bold' "
            f"fill='{colours[roof.name]}'>{escape(text)}</text>"
        )
    return out


# --------------------------------------------------------------------------- points


def _number_layers(points: Sequence[Point]) -> dict[str, int]:
    """1, 2, ... per distinct layer, left to right on the chart (then by name)."""
    lowest: dict[str, float] = {}
    for p in points:
        lowest[p.layer] = min(lowest.get(p.layer, math.inf), p.arithmetic_intensity)
    ordered = sorted(lowest, key=lambda layer: (lowest[layer], layer))
    return {layer: i for i, layer in enumerate(ordered, start=1)}


def _ranges(numbers: Iterable[int]) -> str:
    """[1, 2, 3, 5] -> '1-3,5'."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(set(numbers)):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [n]
    if run:
        out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(out)


def _overlaps(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _points(
    axes: _Axes,
    points: Sequence[Point],
    colours: dict[str, str],
    numbers: dict[str, int],
    taken: list[Box],
) -> list[str]:
    """The markers, and their numbers placed clear of each other; ``taken`` gets their boxes."""
    out = ["<g class='points'>"]
    # Markers of one device that (nearly) coincide are labelled once with all their numbers.
    clusters: list[tuple[str, float, float, list[int]]] = []
    for p in sorted(points, key=lambda p: (p.device, numbers[p.layer])):
        x, y = axes.x(p.arithmetic_intensity), axes.y(p.attained_ops_per_s)
        colour = colours[p.device]
        fill = colour if p.bound == "compute" else "white"
        syncs = f"data-syncs='{p.syncs}' " if p.syncs else ""
        out.append(
            f"<circle class='point' data-device={quoteattr(p.device)} "
            f"data-layer={quoteattr(p.layer)} data-bound='{p.bound}' {syncs}"
            f"cx='{x:.1f}' cy='{y:.1f}' "
            f"r='5' fill='{fill}' stroke='{colour}' stroke-width='2'>"
            f"<title>{escape(_point_tooltip(p))}</title></circle>"
        )
        for device, cx, cy, nums in clusters:
            if device == p.device and math.hypot(cx - x, cy - y) < MERGE_PX:
                nums.append(numbers[p.layer])
                break
        else:
            clusters.append((p.device, x, y, [numbers[p.layer]]))
    # Labels: try spots around each marker and take the first that hits no marker or label.
    taken += [(x - 7, y - 7, x + 7, y + 7) for _, x, y, _ in clusters]
    for device, x, y, nums in clusters:
        text = _ranges(nums)
        w, h = CHAR_PX * len(text), LABEL_PX
        spots = [(8, 4), (-8 - w, 4), (-w / 2, -9), (-w / 2, 15 + 2)]
        spots += [(8, 4 + dy) for dy in (-12, 12, -24, 24)]
        chosen = spots[0]
        for dx, dy in spots:
            box = (x + dx, y + dy - h + 2, x + dx + w, y + dy + 2)
            inside = box[0] > PLOT_LEFT and box[2] < PLOT_LEFT + PLOT_WIDTH and box[1] > PLOT_TOP
            if inside and not any(_overlaps(box, other) for other in taken):
                chosen = (dx, dy)
                break
        dx, dy = chosen
        taken.append((x + dx, y + dy - h + 2, x + dx + w, y + dy + 2))
        out.append(
            f"<text class='point-label' x='{x + dx:.1f}' y='{y + dy:.1f}' font-size='{LABEL_PX}' "
            f"font-weight='bold' fill='{colours[device]}'>{text}</text>"
        )
    out.append("</g>")
    return out


def _point_tooltip(p: Point) -> str:
    text = (
        f"{p.layer} on {p.device}: {p.arithmetic_intensity:.3g} op/B, "
        f"{_si(p.attained_ops_per_s, 'OP/s')} ({p.bound}-bound)"
    )
    shares = [
        (label, value)
        for label, value in (
            ("utilization", p.utilization),
            ("mapping efficiency", p.mapping_efficiency),
            ("compute utilization", p.compute_utilization),
        )
        if value is not None
    ]
    if shares:
        text += "; " + ", ".join(f"{label} {_percent(value)}" for label, value in shares)
    if p.syncs:
        text += f"; {p.syncs:,} host sync{'s' if p.syncs != 1 else ''}"
        if p.stalled_cycles:
            text += f" ({p.stalled_cycles:,} cycles stalled)"
        text += " in the tests that ran it"
    return text


def _percent(share: float) -> str:
    """A share as a percentage with 3 significant digits: 0.3%, 2.13%, 92.4%, 100%."""
    return f"{share * 100:.3g}%"


# --------------------------------------------------------------------------- legend


def _panel(
    roofs: Sequence[Roof],
    colours: dict[str, str],
    numbers: dict[str, int],
    points: Sequence[Point],
) -> list[str]:
    x, y = PANEL_LEFT, float(PLOT_TOP + 4)
    out = [
        "<g class='legend'>",
        f"<text x='{x}' y='{y}' font-size='13' font-weight='bold'>Devices</text>",
    ]
    y += 8
    for roof in roofs:
        colour = colours[roof.name]
        y += 20
        out.append(_line(x, y - 4, x + 22, y - 4, colour).replace("/>", " stroke-width='3'/>"))
        head = roof.description or roof.name
        out.append(
            f"<text x='{x + 30}' y='{y}' font-size='{_fitting_size(head, WIDTH - 8 - (x + 30))}' "
            f"font-weight='bold' fill='{colour}'>{escape(head)}</text>"
        )
        y += 15
        out.append(
            f"<text x='{x + 30}' y='{y}' font-size='11' fill='#444'>peak "
            f"{_si(roof.peak_ops_per_s, 'OP/s')} · {_si(roof.bandwidth_bytes_per_s, 'B/s')} · "
            f"ridge {_si(roof.ridge)} op/B</text>"
        )
    y += 22
    out.append(
        f"<circle cx='{x + 6}' cy='{y - 4}' r='5' fill='#555' stroke='#555' stroke-width='2'/>"
        f"<text x='{x + 16}' y='{y}' font-size='11'>compute-bound</text>"
        f"<circle cx='{x + 126}' cy='{y - 4}' r='5' fill='white' stroke='#555' "
        f"stroke-width='2'/><text x='{x + 136}' y='{y}' font-size='11'>memory-bound</text>"
    )
    if numbers:
        y += 30
        out.append(f"<text x='{x}' y='{y}' font-size='13' font-weight='bold'>Layers (M×K×N)</text>")
        y += 4
        # Long keys shrink their line height so they still fit beside the plot.
        room = HEIGHT - 24 - y
        step = min(17.0, room / len(numbers))
        size = min(12.0, max(7.0, step - 3))
        for layer, n in sorted(numbers.items(), key=lambda item: item[1]):
            y += step
            out.append(
                f"<text x='{x}' y='{y:.1f}' font-size='{size:g}'>"
                f"<tspan font-weight='bold'>{n}</tspan>  {escape(layer)}</text>"
            )
    elif not points:
        y += 30
        out.append(f"<text x='{x}' y='{y}' font-size='12' fill='#777'>no points measured</text>")
    out.append("</g>")
    return out


#: Average advance of a bold sans-serif character, in ems (DejaVu Sans Bold is about 0.62).
_BOLD_EM = 0.62


def _fitting_size(text: str, room_px: float, size: float = 12.0, smallest: float = 8.0) -> str:
    """The font size (at most ``size``, at least ``smallest``) at which a bold ``text`` fits
    in ``room_px``: a long device description shrinks instead of running off the picture."""
    fit = room_px / (_BOLD_EM * max(len(text), 1))
    return f"{max(smallest, min(size, fit)):.3g}"


def _description(roofs: Sequence[Roof], points: Sequence[Point]) -> str:
    devices = ", ".join(
        f"{r.name} (peak {_si(r.peak_ops_per_s, 'OP/s')}, {_si(r.bandwidth_bytes_per_s, 'B/s')})"
        for r in roofs
    )
    return f"Roofline of {devices}; {len(points)} measured point(s)."
