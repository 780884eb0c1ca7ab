"""Regenerate ``scalesim_reports.csv``: SCALE-Sim 3.0.0's COMPUTE_REPORT for every dataflow,
array and GEMM shape that ``test_dataflows.py`` compares the cycle model against.

SCALE-Sim pins numpy<2 and pandas<3, which the project's own environment does not, so it runs in
a venv of its own::

    python3 -m venv /tmp/ssvenv
    /tmp/ssvenv/bin/pip install scalesim==3.0.0 "numpy<2" "pandas<3"
    /tmp/ssvenv/bin/python tests/asic/scalesim_reports.py

The run takes about a minute and rewrites the CSV beside this file; ``git diff`` shows any change.
"""

from __future__ import annotations

import configparser
import csv
import itertools
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).with_name("scalesim_reports.csv")
COLUMNS = ("dataflow", "rows", "cols", "m", "k", "n", "total_cycles", "mapping_pct", "compute_pct")

DATAFLOWS = ("ws", "os", "is")
ARRAYS = ((8, 8), (16, 16), (32, 16))
# (M, K, N): a GEMV, a batch of eight, ragged shapes below, across and above every array's
# rows and columns in each dimension, and one square shape that fills the 8x8 array.
SHAPES = (
    (1, 64, 32),
    (8, 64, 32),
    (5, 20, 7),
    (33, 17, 9),
    (40, 8, 70),
    (64, 64, 64),
    (3, 100, 50),
    (100, 3, 20),
)
# SRAMs far larger than any operand and the interface bandwidth SCALE-Sim calculates itself:
# zero stall cycles, so Total Cycles is the array's own schedule, what cycles.py models.
SRAM_KB = 4096


def _config(path: Path, dataflow: str, rows: int, cols: int) -> None:
    cp = configparser.ConfigParser()
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp["general"] = {"run_name": "nobreak"}
    cp["run_presets"] = {"InterfaceBandwidth": "CALC", "UseRamulatorTrace": "False"}
    cp["architecture_presets"] = {
        "ArrayHeight": str(rows),
        "ArrayWidth": str(cols),
        "ifmapsramszkB": str(SRAM_KB),
        "filtersramszkB": str(SRAM_KB),
        "ofmapsramszkB": str(SRAM_KB),
        "IfmapOffset": "0",
        "FilterOffset": "10000000",
        "OfmapOffset": "20000000",
        "Dataflow": dataflow,
        "ReadRequestBuffer": "1024",
        "WriteRequestBuffer": "1024",
    }
    cp["layout"] = {
        "IfmapCustomLayout": "False",
        "FilterCustomLayout": "False",
        "IfmapSRAMBankBandwidth": "10",
        "IfmapSRAMBankNum": "10",
        "IfmapSRAMBankPort": "2",
        "FilterSRAMBankBandwidth": "10",
        "FilterSRAMBankNum": "10",
        "FilterSRAMBankPort": "2",
    }
    cp["sparsity"] = {"SparsitySupport": "false"}
    with path.open("w") as f:
        cp.write(f)


def _run(work: Path, dataflow: str, rows: int, cols: int) -> list[tuple[object, ...]]:
    from scalesim.scale_sim import scalesim  # type: ignore[import-not-found]

    run = work / f"{dataflow}_{rows}x{cols}"
    run.mkdir()
    cfg, topo, layout = run / "arch.cfg", run / "gemm.csv", run / "layout.csv"
    _config(cfg, dataflow, rows, cols)
    # SCALE-Sim's GEMM rows are "name, M, N, K," with the trailing comma its parser expects;
    # the ifmap is M x K and the filters K x N, as in cycles.py.
    topo.write_text(
        "Layer, M, N, K,\n"
        + "".join(f"g{i}, {m}, {n}, {k},\n" for i, (m, k, n) in enumerate(SHAPES))
    )
    # Read even with custom layouts off: one row of placeholder ints per layer.
    layout.write_text(
        "Layer, a, b, c, d, e, f, g,\n"
        + "".join(f"g{i}, 1, 1, 1, 1, 1, 1, 1,\n" for i in range(len(SHAPES)))
    )
    sim = scalesim(
        save_disk_space=True,
        verbose=False,
        config=str(cfg),
        topology=str(topo),
        layout=str(layout),
        input_type_gemm=True,
    )
    sim.run_scale(top_path=str(run))
    (report,) = run.rglob("COMPUTE_REPORT.csv")
    with report.open() as f:
        lines = [[c.strip() for c in row if c.strip()] for row in csv.reader(f)]
    header, body = lines[0], lines[1:]
    col = {name: i for i, name in enumerate(header)}
    out: list[tuple[object, ...]] = []
    for (m, k, n), row in zip(SHAPES, body, strict=True):
        stalls = int(row[col["Stall Cycles"]])
        if stalls:
            sys.exit(f"{dataflow} {rows}x{cols} M={m} K={k} N={n}: {stalls} stall cycles")
        out.append(
            (
                dataflow,
                rows,
                cols,
                m,
                k,
                n,
                int(row[col["Total Cycles"]]),
                float(row[col["Mapping Efficiency %"]]),
                float(row[col["Compute Util %"]]),
            )
        )
    return out


def main() -> None:
    rows: list[tuple[object, ...]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for dataflow, (r, c) in itertools.product(DATAFLOWS, ARRAYS):
            rows += _run(Path(tmp), dataflow, r, c)
    with OUT.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        # repr keeps every digit SCALE-Sim printed, so the test can compare at rel=1e-12.
        w.writerows([*row[:7], repr(row[7]), repr(row[8])] for row in rows)
    print(f"{len(rows)} runs -> {OUT}")


if __name__ == "__main__":
    main()
