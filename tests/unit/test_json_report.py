"""The --nobreak-json report, TestRecord's JSON round trip, and the JUnit properties."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.events import BreakEvent, Figures, OtherSite
from pytest_nobreak.json_report import (
    ReportError,
    TestRecord,
    build_report,
    dump_report,
    merge_report,
    read_report,
    write_report,
)
from pytest_nobreak.junit import junit_properties

SEED_BREAK = BreakEvent(
    kind="backend_error",
    gb_type="Backend compiler exception",
    gb_id="GB0219",
    file="/repo/models.py",
    line=12,
    reason="aten._local_scalar_dense: data-dependent",
)
HOST_BREAK = BreakEvent(
    kind="host_fallback",
    gb_type="Host fallback: linear",
    file="/repo/models.py",
    line=20,
    reason="torch.float64 operands",
    calls=2,
    macs=640,
)
BROKEN = TestRecord(
    nodeid="tests/test_m.py::test_seed",
    outcome="failed",
    marked=True,
    figures=Figures(
        graphs=0, eager_frames=1, dut_ops=0, host_fallbacks=2, macs=0, host_macs=640, cycles=0
    ),
    breaks=(SEED_BREAK, HOST_BREAK),
)
CLEAN = TestRecord(
    nodeid="tests/test_m.py::test_clean", outcome="passed", marked=False, figures=Figures(graphs=1)
)


def test_a_record_renders_as_the_documented_schema() -> None:
    assert BROKEN.to_json() == {
        "outcome": "failed",
        "marked": True,
        "graphs": 0,
        "graph_breaks": 0,
        "eager_frames": 1,
        "recompiles": 0,
        "breaks": [
            {
                "kind": "backend_error",
                "gb_id": "GB0219",
                "gb_type": "Backend compiler exception",
                "file": "/repo/models.py",
                "line": 12,
                "reason": "aten._local_scalar_dense: data-dependent",
            },
            {
                "kind": "host_fallback",
                "gb_id": None,
                "gb_type": "Host fallback: linear",
                "file": "/repo/models.py",
                "line": 20,
                "reason": "torch.float64 operands",
                "calls": 2,
                "macs": 640,
            },
        ],
        "asic": {"dut_ops": 0, "host_fallbacks": 2, "macs": 0, "host_macs": 640, "cycles": 0},
    }


def test_asic_figures_are_absent_when_the_asic_backend_did_not_run() -> None:
    assert "asic" not in CLEAN.to_json()


def test_build_report_header_and_tests() -> None:
    report = build_report("2.13.0", "asic", "default", [CLEAN, BROKEN])
    assert set(report) == {"version", "torch", "backend", "device", "tests"}
    assert report["version"] == 1
    assert (report["torch"], report["backend"], report["device"]) == ("2.13.0", "asic", "default")
    assert report["tests"] == {CLEAN.nodeid: CLEAN.to_json(), BROKEN.nodeid: BROKEN.to_json()}


def test_dump_is_sorted_and_does_not_depend_on_record_order() -> None:
    one = dump_report(build_report("2.13.0", "inductor", "cpu", [CLEAN, BROKEN]))
    two = dump_report(build_report("2.13.0", "inductor", "cpu", [BROKEN, CLEAN]))
    assert one == two
    assert one == json.dumps(json.loads(one), sort_keys=True, indent=2) + "\n"


def test_records_survive_the_trip_from_an_xdist_worker_as_plain_json() -> None:
    for record in (BROKEN, CLEAN):
        shipped = json.loads(json.dumps(record.to_json()))
        assert TestRecord.from_json(record.nodeid, shipped) == record


def test_the_round_trip_drops_only_what_the_report_does_not_carry() -> None:
    rich = BreakEvent(
        kind="graph_break",
        gb_type="Data-dependent branching",
        source="if x.sum() > 0:",
        hints=("use torch.cond",),
        link="https://example.invalid/gb0170",
    )
    record = TestRecord("t", "passed", False, Figures(graphs=2, graph_breaks=1), (rich,))
    back = TestRecord.from_json("t", record.to_json())
    assert back.breaks == (BreakEvent(kind="graph_break", gb_type="Data-dependent branching"),)
    assert back.figures == record.figures

    host = BreakEvent(
        kind="host_fallback",
        gb_type="Host fallback: conv2d",
        reason="float64",
        calls=3,
        macs=99,
        detail="x[1, 3, 8, 8] w[4, 3, 3, 3]",
        also_at=(OtherSite("/repo/m.py", 3, 2),),
    )
    record = TestRecord("t", "failed", True, Figures(graphs=1), (host,))
    back = TestRecord.from_json("t", record.to_json())
    assert back.breaks == (
        BreakEvent(
            kind="host_fallback",
            gb_type="Host fallback: conv2d",
            reason="float64",
            calls=3,
            macs=99,
        ),
    )


def test_a_record_from_before_host_macs_reads_as_not_measured() -> None:
    data = json.loads(json.dumps(BROKEN.to_json()))
    del data["asic"]["host_macs"]
    figures = TestRecord.from_json(BROKEN.nodeid, data).figures
    assert figures.host_macs is None
    assert figures.dut_ops == 0
    assert "host_macs" not in (figures.asic() or {})
    assert figures.dut_share is None


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d.pop("outcome"), "'outcome' must be str"),
        (lambda d: d.update(marked="yes"), "'marked' must be bool"),
        (lambda d: d.update(graphs=-1), "'graphs' must be an integer >= 0"),
        (lambda d: d.update(recompiles=1.5), "'recompiles' must be an integer >= 0"),
        (lambda d: d.update(asic=[1]), "'asic' must be an object"),
        (lambda d: d["asic"].pop("cycles"), "'cycles' must be an integer >= 0"),
        (lambda d: d.update(breaks={}), "'breaks' must be list"),
        (lambda d: d["breaks"][0].update(kind="oops"), "unknown break kind 'oops'"),
        (lambda d: d["breaks"][0].update(line="12"), "'line' must be int"),
        (lambda d: d["breaks"].append("x"), "a break must be an object"),
        (lambda d: d["breaks"][1].update(macs=-1), "'macs' must be an integer >= 0"),
        (lambda d: d["asic"].update(host_macs=1.5), "'host_macs' must be an integer >= 0"),
    ],
)
def test_from_json_rejects_malformed_records(mutate: Any, expected: str) -> None:
    data = json.loads(json.dumps(BROKEN.to_json()))
    mutate(data)
    with pytest.raises(ValueError) as info:
        TestRecord.from_json(BROKEN.nodeid, data)
    assert str(info.value).startswith(f"record of {BROKEN.nodeid!r}: ")
    assert expected in str(info.value)


def test_testrecord_is_not_collected_as_a_test_class() -> None:
    assert TestRecord.__test__ is False


def test_merge_keeps_the_tests_that_did_not_run() -> None:
    old = build_report("2.12.0", "inductor", "cpu", [CLEAN, BROKEN])
    fixed = TestRecord(BROKEN.nodeid, "passed", True, Figures(graphs=1))
    new = build_report("2.13.0", "asic", "default", [fixed])
    merged = merge_report(old, new)
    assert merged["torch"] == "2.13.0"
    assert merged["tests"] == {CLEAN.nodeid: CLEAN.to_json(), BROKEN.nodeid: fixed.to_json()}
    assert merge_report(None, new) == new


def test_write_report_merges_into_the_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "out" / "nobreak.json"
    write_report(path, "2.13.0", "asic", "default", [CLEAN, BROKEN])
    written = write_report(path, "2.13.0", "asic", "default", [CLEAN])
    on_disk = json.loads(path.read_text(encoding="utf-8"))
    assert on_disk == written
    assert set(on_disk["tests"]) == {CLEAN.nodeid, BROKEN.nodeid}
    assert on_disk["tests"][BROKEN.nodeid] == BROKEN.to_json()
    assert path.read_text(encoding="utf-8") == dump_report(written)


def test_entries_of_a_newer_schema_minor_are_kept_verbatim(tmp_path: Path) -> None:
    path = tmp_path / "nobreak.json"
    old = build_report("2.13.0", "asic", "default", [BROKEN])
    old["tests"][BROKEN.nodeid]["extra"] = {"kept": True}
    path.write_text(json.dumps(old))
    written = write_report(path, "2.13.0", "asic", "default", [CLEAN])
    assert written["tests"][BROKEN.nodeid]["extra"] == {"kept": True}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{", "is not valid JSON"),
        (b"\xff", "cannot be read"),
        (b"[]", "is not a version 1 pytest-nobreak report"),
        (b'{"version": 2, "tests": {}}', "is not a version 1 pytest-nobreak report"),
        (b'{"version": 1, "tests": []}', '"tests" must be an object'),
        (b'{"version": 1, "tests": {"t": 1}}', '"tests" must be an object'),
    ],
)
def test_a_corrupt_existing_report_is_one_line_and_is_left_alone(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "nobreak.json"
    path.write_bytes(content)
    with pytest.raises(ReportError) as info:
        write_report(path, "2.13.0", "asic", "default", [CLEAN])
    assert expected in str(info.value)
    assert str(info.value).startswith(f"JSON report {path}: ")
    assert "\n" not in str(info.value)
    assert path.read_bytes() == content


def test_read_report_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert read_report(tmp_path / "nope.json") is None


def test_junit_properties_name_every_measured_figure() -> None:
    assert junit_properties(CLEAN) == [
        ("nobreak_graphs", 1),
        ("nobreak_graph_breaks", 0),
        ("nobreak_eager_frames", 0),
        ("nobreak_recompiles", 0),
    ]
    assert dict(junit_properties(BROKEN))["nobreak_host_fallbacks"] == 2
    assert dict(junit_properties(BROKEN))["nobreak_host_macs"] == 640
    assert len(junit_properties(BROKEN)) == 9
