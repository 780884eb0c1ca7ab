"""The benchmarks' closing table (benchmarks/conftest.py) marks a ratio below its floor."""

from __future__ import annotations

from asic_backend.sim import host_gemm
from benchmarks.conftest import BELOW_FLOOR, FLOOR_NOTE, Row, over_gemm, ratio_table


def _row(dut: float) -> Row:
    return Row(interleaved={"fp32": 4.0, "gemm@int_mm": 2.0, "dut@int_mm": dut})


def test_a_dut_path_faster_than_its_own_gemm_is_marked_with_the_reasons_it_can_be() -> None:
    table = ratio_table({"decode": _row(1.5), "prefill": _row(3.0)})
    cells = [line.split(" | ") for line in table[2:4]]
    assert [c[6] for c in cells] == [f"0.75{BELOW_FLOOR}", "1.50"]
    assert table[-2:] == ["", FLOOR_NOTE]
    # Noise, the bare kernel's fresh accumulator, or the tiles of a prefill linear by int_mm.
    assert "noise" in FLOOR_NOTE
    rows, columns = host_gemm.INT_MM_TILE_MIN_ROWS, host_gemm.INT_MM_TILE_MIN_COLUMNS
    assert f"by int_mm from {rows} rows × {columns} outputs on" in FLOOR_NOTE


def test_a_table_with_every_ratio_at_or_above_its_floor_has_no_note() -> None:
    table = ratio_table({"decode": _row(2.0)})
    assert FLOOR_NOTE not in table
    assert over_gemm(1.0) == "1.00"
    assert over_gemm(0.996) == f"0.996{BELOW_FLOOR}"  # below, though two decimals round it up
    assert over_gemm(0.994) == f"0.99{BELOW_FLOOR}"


def test_the_aten_passes_have_columns_of_their_own_where_measured() -> None:
    timed = Row(
        interleaved={"fp32": 4.0, "gemm@int_mm": 2.0, "dut@int_mm": 2.2, "dut_aten@int_mm": 2.6}
    )
    table = ratio_table({"decode": timed, "prefill": _row(3.0)})
    head = table[0].split(" | ")
    assert head[7:9] == ["DUT aten ms", "DUT aten/GEMM"]
    assert table[2].split(" | ")[7:9] == ["2,600", "1.30"]
    assert table[3].split(" | ")[7:9] == ["-", "-"]
    assert "DUT aten ms" not in ratio_table({"decode": _row(3.0)})[0]


def test_the_dut_in_one_call_has_columns_of_its_own_where_measured() -> None:
    """``dut_whole@int_mm`` (the GEMMs in one call, not tiles): its time and the DUT's over it,
    before the aten passes' columns."""
    timed = Row(
        interleaved={
            "fp32": 4.0,
            "gemm@int_mm": 2.0,
            "dut@int_mm": 2.2,
            "dut_whole@int_mm": 2.75,
            "dut_aten@int_mm": 2.6,
        }
    )
    table = ratio_table({"prefill": timed, "decode": _row(3.0)})
    head = _cells(table[0])
    assert head[7:11] == ["DUT whole ms", "DUT/whole", "DUT aten ms", "DUT aten/GEMM"]
    assert _cells(table[2])[7:11] == ["2,750", "0.80", "2,600", "1.30"]
    assert _cells(table[3])[7:9] == ["-", "-"]
    assert "DUT whole ms" not in ratio_table({"decode": _row(3.0)})[0]


def test_the_torchao_peer_has_columns_of_its_own_where_measured() -> None:
    """TorchAO's layer is one time for every kernel's line, each DUT compared with it."""
    timed = Row(
        interleaved={
            "fp32": 4.0,
            "torchao": 2.5,
            **{
                f"{v}@{k}": t for k in ("int_mm", "int16") for v, t in (("gemm", 2.0), ("dut", 2.2))
            },
            "dut@int16": 3.0,
        }
    )
    table = ratio_table({"decode": timed, "prefill": _row(3.0)})
    head = _cells(table[0])
    assert head[9:11] == ["TorchAO ms", "DUT/TorchAO"]
    lines = [_cells(line) for line in table[2:5]]
    assert [line[1] for line in lines] == ["int_mm", "int16", "int_mm"]
    assert [line[9:11] for line in lines] == [["2,500", "0.88"], ["2,500", "1.20"], ["-", "-"]]
    assert "TorchAO" not in ratio_table({"decode": _row(3.0)})[0]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_each_dut_is_held_to_the_fastest_kernel_alone_of_its_group() -> None:
    """``DUT/best GEMM``: a kernel's DUT over the fastest of the group's kernels alone (the
    issue's per-layer target), whichever kernel that is."""
    timed = Row(
        interleaved={
            "fp32": 4.0,
            "gemm@int_mm": 2.0,
            "dut@int_mm": 2.4,
            "gemm@amx": 1.0,
            "dut@amx": 1.1,
        }
    )
    table = ratio_table({"prefill": timed, "decode": _row(3.0)})
    lines = [[cell.strip("| ") for cell in line.split(" | ")] for line in table]
    column = lines[0].index("DUT/best GEMM")
    assert {line[1]: line[column] for line in lines[2:4]} == {"int_mm": "2.40", "amx": "1.10"}
    assert lines[4][column] == "1.50"  # one kernel: its own GEMM
