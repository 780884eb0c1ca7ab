"""The --nobreak-json report, TestRecord's JSON round trip, and the JUnit properties."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_nobreak.report.json_report import (
    ReportError,
    TestRecord,
    build_report,
    check_report_path,
    dump_report,
    main,
    merge_files,
    merge_report,
    merge_sections,
    read_report,
    write_report,
)
from pytest_nobreak.report.junit import junit_properties
from pytest_nobreak.watch.events import (
    BreakEvent,
    CallSite,
    ChainLink,
    Figures,
    GemmRecord,
    OtherSite,
)
from pytest_nobreak.watch.fixes import fix_for

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
                "owner": "own",
                # The fixes table's, for this id and reason (pytest_nobreak.watch.fixes).
                "fix": fix_for("GB0219", None, "aten._local_scalar_dense: data-dependent"),
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
                "owner": "own",
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


def test_the_round_trip_keeps_what_the_html_report_shows() -> None:
    rich = BreakEvent(
        kind="graph_break",
        gb_type="Data-dependent branching",
        gb_id="GB0170",
        file="m.py",
        line=5,
        source="if x.sum() > 0:",
        hints=("use torch.cond",),
        link="https://example.invalid/gb0170",
        call_sites=(CallSite("t.py", 9, "f(x)"),),
        context=("def f(x):", "    x = x * 2", "    if x.sum() > 0:"),
        context_start=3,
    )
    gemm = GemmRecord("default", "conv", 4, 27, 8, 2, 864, 300, 0.1, 0.2, 0.3, 1.5, 2e9, "memory")
    record = TestRecord(
        "t",
        "passed",
        False,
        Figures(graphs=2, graph_breaks=1, recompiles=1),
        (rich,),
        recompile_reasons=("tensor 'x' size mismatch at index 0. expected 2, actual 3",),
        gemms=(gemm,),
    )
    back = TestRecord.from_json("t", json.loads(json.dumps(record.to_json())))
    assert back == record

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
    # The first call's shapes and the other sites, as the failure message shows them.
    back = TestRecord.from_json("t", json.loads(json.dumps(record.to_json())))
    assert back.breaks == (host,)


MODELS_ERROR = '"models" must be an object of {"reason": str, "finished": bool[, "built": bool]}'
MODELS_ERROR += " by test id"
FAMILIES_ERROR = '"families" must be an object of family names by SPEC'


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"roofs": [1, 2]}, '"roofs" must be an object of devices, not [1, 2]'),
        (
            {"roofs": {"d": {"peak_ops_per_s": 1.0, "description": "x"}}},
            "\"roofs\" of 'd' must hold exactly peak_ops_per_s, bandwidth_bytes_per_s, description",
        ),
        (
            {"roofs": {"d": {"peak_ops_per_s": -1, "bandwidth_bytes_per_s": 1, "description": ""}}},
            "\"roofs\" of 'd': peak_ops_per_s must be a number > 0, not -1",
        ),
        (
            {"models": "oops"},
            MODELS_ERROR,
        ),
        (
            {"models": {"t": "a reason"}},
            MODELS_ERROR,
        ),
        ({"models": {"t": {"reason": "r", "finished": False, "built": "no"}}}, MODELS_ERROR),
        ({"models": {"t": {"reason": "r", "finished": False, "other": 1}}}, MODELS_ERROR),
        ({"families": ["LLM"]}, FAMILIES_ERROR),
        ({"families": {"hf:llama": 1}}, FAMILIES_ERROR),
    ],
)
def test_a_hand_edited_section_is_a_report_error(
    tmp_path: Path, section: dict[str, Any], message: str
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"version": 1, "tests": {}, **section}))
    with pytest.raises(ReportError) as raised:
        read_report(path)
    assert raised.value.problem == message


def test_the_families_of_merged_reports_are_united(tmp_path: Path) -> None:
    paths = []
    for name, families in (("a", {"hf:llama": "LLM"}), ("b", {"hf:vit": "vision"})):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"version": 1, "tests": {}, "families": families}))
        paths.append(path)
    merged = merge_sections(*(read_report(path) for path in paths))
    assert merged["families"] == {"hf:llama": "LLM", "hf:vit": "vision"}


def test_a_note_of_a_model_that_was_not_built_reads_back(tmp_path: Path) -> None:
    note = {"reason": "hf:bert: too big", "finished": False, "built": False}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"version": 1, "tests": {}, "models": {"t": note}}))
    assert read_report(path)["models"] == {"t": note}


def test_the_roof_fields_are_the_ones_the_report_checks() -> None:
    from asic_backend.sim.config import AsicConfig
    from pytest_nobreak.benchmark import roof_fields
    from pytest_nobreak.report.json_report import ROOF_FIELDS

    assert set(roof_fields(AsicConfig.preset("gemmini"))) == set(ROOF_FIELDS)


def test_a_gemm_with_a_negative_or_nan_figure_is_refused() -> None:
    good = GemmRecord("d", "conv", 4, 27, 8, 2, 864, 300, 0.1, 0.2, 0.3, 1.5, 2e9, "memory")
    for name, bad in (("cycles", -5), ("utilization", float("nan"))):
        data = good.to_json() | {name: bad}
        with pytest.raises(ValueError, match=f"gemm '{name}' must be"):
            GemmRecord.from_json(data, "t")


def test_chains_call_sites_and_libraries_survive_the_trip_from_a_worker() -> None:
    # The controller renders the table from what the workers ship: chains must arrive whole.
    chained = BreakEvent(
        kind="eager_fallback",
        gb_type="Call to `torch._dynamo.graph_break()`",
        gb_id="GB0025",
        file="m.py",
        line=3,
        reason="User-inserted graph break.",
        chain=(
            ChainLink("GB0025", "Call to `torch._dynamo.graph_break()`"),
            ChainLink("GB0066", "Graph break under GenericContextWrappingVariable"),
        ),
        call_sites=(CallSite("m.py", 9), CallSite("test_m.py", 4)),
        library="os",
    )
    record = TestRecord("t", "failed", True, Figures(graphs=1), (chained,))
    back = TestRecord.from_json("t", json.loads(json.dumps(record.to_json()))).breaks[0]
    assert back.ids == "GB0025 → GB0066"
    assert [link.label for link in back.chain] == ["GB0025", "GB0066"]
    assert back.call_sites == (CallSite("m.py", 9), CallSite("test_m.py", 4))
    assert back.library == "os"


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


def test_merge_keeps_the_tests_the_newer_report_does_not_have() -> None:
    old = build_report("2.12.0", "inductor", "cpu", [CLEAN, BROKEN])
    fixed = TestRecord(BROKEN.nodeid, "passed", True, Figures(graphs=1))
    new = build_report("2.13.0", "asic", "default", [fixed])
    merged = merge_report(old, new)
    assert merged["torch"] == "2.13.0"
    assert merged["tests"] == {CLEAN.nodeid: CLEAN.to_json(), BROKEN.nodeid: fixed.to_json()}
    assert merge_report(None, new) == new


def test_merge_drops_the_old_note_of_a_test_the_newer_report_has() -> None:
    skipped = TestRecord(BROKEN.nodeid, "skipped", True, Figures())
    old = {
        **build_report("2.13.0", "asic", "default", [CLEAN, skipped]),
        "models": {
            BROKEN.nodeid: {"reason": "hf:x: not built", "finished": False},
            CLEAN.nodeid: {"reason": "hf:y: off the bound", "finished": True},
        },
    }
    fixed = TestRecord(BROKEN.nodeid, "passed", True, Figures(graphs=1))
    merged = merge_report(old, build_report("2.13.0", "asic", "default", [fixed]))
    # The passing test's old reason is gone; the test the new run did not have keeps its own.
    assert merged["models"] == {CLEAN.nodeid: {"reason": "hf:y: off the bound", "finished": True}}


def test_write_report_replaces_the_existing_file_with_this_run(tmp_path: Path) -> None:
    """A CI artifact says what this run did: no entry of an earlier run survives."""
    path = tmp_path / "out" / "nobreak.json"
    write_report(path, "2.13.0", "asic", "default", [CLEAN, BROKEN])
    written = write_report(path, "2.13.0", "asic", "default", [CLEAN])
    on_disk = json.loads(path.read_text(encoding="utf-8"))
    assert on_disk == written
    assert set(on_disk["tests"]) == {CLEAN.nodeid}
    assert path.read_text(encoding="utf-8") == dump_report(written)


def test_a_run_that_watched_no_test_writes_an_empty_report(tmp_path: Path) -> None:
    path = tmp_path / "nobreak.json"
    write_report(path, "2.13.0", "inductor", "", [])
    assert json.loads(path.read_text()) == {
        "version": 1,
        "torch": "2.13.0",
        "backend": "inductor",
        "device": "",
        "tests": {},
    }


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
def test_a_file_that_is_not_a_report_is_one_line_and_is_never_replaced(
    tmp_path: Path, content: bytes, expected: str
) -> None:
    path = tmp_path / "nobreak.json"
    path.write_bytes(content)
    with pytest.raises(ReportError) as info:
        check_report_path(path)
    assert expected in str(info.value)
    assert str(info.value).startswith(f"JSON report {path}: ")
    assert str(info.value).endswith("; delete it or pass another --nobreak-json path")
    assert "\n" not in str(info.value)
    assert path.read_bytes() == content


def test_a_report_path_that_cannot_be_written_is_caught_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile.txt").write_text("not a directory")

    def problem(path: str) -> str:
        with pytest.raises(ReportError) as info:
            check_report_path(path)
        return str(info.value)

    assert problem("adir") == "JSON report adir: is a directory; pass the path of a file"
    assert problem("afile.txt/deeper/r.json") == (
        "JSON report afile.txt/deeper/r.json: afile.txt is not a directory; "
        "pass another --nobreak-json path"
    )
    check_report_path("new/dirs/r.json")  # missing directories are created when writing
    assert not (tmp_path / "new").exists()  # ...not when checking
    check_report_path(tmp_path / "r.json")
    write_report("r.json", "2.13.0", "asic", "default", [CLEAN])
    check_report_path("r.json")  # an earlier report is replaced


def test_a_directory_without_write_permission_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Simulated: this suite may run as root, who may write anywhere.
    denied = {tmp_path / "locked"}
    (tmp_path / "locked").mkdir()
    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: Path(p) not in denied and real_access(p, mode)
    )
    with pytest.raises(ReportError) as info:
        check_report_path(tmp_path / "locked" / "sub" / "r.json")
    assert str(info.value) == (
        f"JSON report {tmp_path}/locked/sub/r.json: cannot write in {tmp_path}/locked: "
        "permission denied; pass another --nobreak-json path"
    )


def test_merge_files_combines_runs_the_last_entry_winning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixed = TestRecord(BROKEN.nodeid, "passed", True, Figures(graphs=1))
    write_report(tmp_path / "a.json", "2.13.0", "asic", "default", [CLEAN, BROKEN])
    write_report(tmp_path / "b.json", "2.13.0", "asic", "default", [fixed])
    # A newer schema minor's extra keys are copied verbatim.
    document = json.loads((tmp_path / "b.json").read_text())
    document["tests"][fixed.nodeid]["extra"] = {"kept": True}
    (tmp_path / "b.json").write_text(json.dumps(document))

    out = tmp_path / "all.json"
    assert main(["merge", str(out), str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    assert capsys.readouterr().out == f"merged 2 reports (2 tests) into {out}\n"
    merged = json.loads(out.read_text())
    assert merged["tests"] == {
        CLEAN.nodeid: CLEAN.to_json(),
        fixed.nodeid: {**fixed.to_json(), "extra": {"kept": True}},
    }
    assert out.read_text() == dump_report(merged)
    # The output may be one of the inputs: accumulate run after run.
    assert merge_files(tmp_path / "a.json", [tmp_path / "a.json", tmp_path / "b.json"]) == 2


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        ("missing", "b.json: does not exist"),
        (
            "other torch",
            "b.json: is from torch '2.12.0', a.json from torch '2.13.0'; "
            "merge reports of one configuration only",
        ),
        ("not a report", "b.json: is not valid JSON: Expecting value at line 1, column 1"),
    ],
)
def test_merge_files_refuses_what_it_cannot_merge_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    second: str,
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    write_report("a.json", "2.13.0", "asic", "default", [CLEAN])
    if second == "other torch":
        write_report("b.json", "2.12.0", "asic", "default", [BROKEN])
    elif second == "not a report":
        Path("b.json").write_text("nope")
    assert main(["merge", "all.json", "a.json", "b.json"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: JSON report {expected}\n"
    assert not Path("all.json").exists()


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
    # The nine figures, then one line per break, as the terminal table lists them.
    assert len(junit_properties(BROKEN)) == 11
    assert junit_properties(BROKEN)[9:] == [
        (
            "nobreak_break",
            "backend compiler fallback (whole frame ran eagerly) GB0219 at /repo/models.py:12: "
            "Backend compiler exception",
        ),
        (
            "nobreak_break",
            "host fallback (ran on the host, not the DUT) at /repo/models.py:20: linear "
            "(x2 calls, 640 host MACs)",
        ),
    ]


def test_an_unmarked_tests_handled_compile_error_is_not_a_reported_break() -> None:
    """An error raised to an unmarked test is its own business (``pytest.raises`` around a
    ``fullgraph=True`` compile): the JSON report keeps it, the reports do not name it. A
    marked test's is reported (it fails the marker unless allowed)."""
    rejected = BreakEvent(kind="compile_error", gb_type="Data-dependent branching", gb_id="GB0170")
    unmarked = dataclasses.replace(CLEAN, breaks=(rejected, SEED_BREAK))
    assert unmarked.reported_breaks == (SEED_BREAK,)
    assert [b["kind"] for b in unmarked.to_json()["breaks"]] == ["compile_error", "backend_error"]
    assert [name for name, _ in junit_properties(unmarked)].count("nobreak_break") == 1
    marked = dataclasses.replace(unmarked, marked=True)
    assert marked.reported_breaks == (rejected, SEED_BREAK)


@pytest.mark.parametrize(
    "module", ["pytest_nobreak.report.json_report", "pytest_nobreak.json_report"]
)
def test_merge_runs_as_a_module_at_its_path_and_at_its_old_one(tmp_path: Path, module: str) -> None:
    """The README's ``python -m pytest_nobreak.report.json_report merge``, and the path CI
    scripts wrote before the layout (``pytest_nobreak.json_report``), merge alike."""
    write_report(tmp_path / "a.json", "2.13.0", "asic", "default", [CLEAN])
    write_report(tmp_path / "b.json", "2.13.0", "asic", "default", [BROKEN])
    command = [sys.executable, "-m", module, "merge", "all.json", "a.json", "b.json"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "merged 2 reports (2 tests) into all.json\n",
        "",
    )
    assert sorted(json.loads((tmp_path / "all.json").read_text())["tests"]) == sorted(
        [CLEAN.nodeid, BROKEN.nodeid]
    )
