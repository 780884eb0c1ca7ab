"""tests/zygote.py: a forked run starts as a fresh interpreter would, or is one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests import zygote

#: What a program can see of how its interpreter started, printed as JSON at exit (an
#: ``atexit`` handler, so exiting runs it), beside a line on stdout left unflushed.
PROBE = """
import atexit, json, os, sys, tempfile, threading, time, warnings
import __main__

def report():
    main = {k: type(v).__name__ for k, v in vars(__main__).items() if k.startswith("__")}
    spec = __main__.__spec__
    main["__spec__"] = spec and [spec.name, spec.origin, type(spec.loader).__name__]
    main["__package__"] = __main__.__package__
    main["__file__"] = getattr(__main__, "__file__", None)
    filters = [(a, getattr(m, "pattern", m), c.__name__, getattr(mod, "pattern", mod), n)
               for a, m, c, mod, n in warnings.filters if c.__module__ == "builtins" and not m]
    print(json.dumps({
        "argv": sys.argv, "orig_argv": sys.orig_argv, "path": sys.path, "cwd": os.getcwd(),
        "env": {k: os.environ.get(k) for k in ("NOBREAK_PROBE_VAR", "PYTHONPATH", "TMPDIR")},
        "main": main, "warnoptions": sys.warnoptions, "filters": filters,
        "bytecode": sys.dont_write_bytecode, "stdin": sys.stdin.read(),
        "tmp": tempfile.gettempdir(),
    }), file=sys.stderr)

atexit.register(report)
# A non-daemon thread: the interpreter waits for it before the exit handlers run.
threading.Thread(target=lambda: (time.sleep(0.05), print("thread done"))).start()
sys.stdout.write("no newline")
# Left open: the interpreter flushes it at exit.
UNCLOSED = open("unclosed.txt", "w")
UNCLOSED.write("data")
if len(sys.argv) > 1 and sys.argv[1] == "fail":
    raise ValueError("failed as asked")
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit("exit message")
if len(sys.argv) > 1 and sys.argv[1] == "interrupt":
    raise KeyboardInterrupt
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "probe_module.py").write_text(PROBE)
    (tmp_path / "probe.py").write_text(PROBE)
    script = tmp_path / "bin" / "probe-script"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n{PROBE}")
    script.chmod(0o755)
    return tmp_path


LAUNCHES = ("-c", "-m", "-mjoined", "script", "console script", "relative console script")


def launches(project: Path) -> dict[str, list[str]]:
    return {
        "-c": [sys.executable, "-c", PROBE],
        "-m": [sys.executable, "-m", "probe_module"],
        "-mjoined": [sys.executable, "-mprobe_module"],
        "script": [sys.executable, "probe.py"],
        "console script": [str(project / "bin" / "probe-script")],
        "relative console script": ["bin/probe-script"],
    }


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in zygote.APPLIED}
    return {**env, "PYTHONPATH": "lib", "NOBREAK_PROBE_VAR": "x", **extra}


def fresh(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )


def forked(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = zygote.popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        assert isinstance(process, zygote.ForkedProcess), "not forked"
        code = process.wait(60)
        texts = []
        for file in (out, err):
            file.seek(0)
            texts.append(file.read().decode())
    return subprocess.CompletedProcess(argv, code, *texts)


WARNINGS = {"PYTHONWARNINGS": "ignore::DeprecationWarning,error::UserWarning:foo"}


@pytest.mark.parametrize(
    ("kind", "extra", "ending"),
    [
        *((kind, WARNINGS, ending) for kind in LAUNCHES for ending in ("", "fail", "exit")),
        ("-c", {}, ""),
        ("script", {}, "fail"),
        ("-m", {}, "interrupt"),
    ],
    ids=lambda value: value if isinstance(value, str) else ("warnings" if value else "plain"),
)
def test_a_forked_run_sees_what_a_fresh_interpreter_sees(
    project: Path, kind: str, extra: dict[str, str], ending: str
) -> None:
    argv = [*launches(project)[kind], *([ending] if ending else [])]
    env = environment(PYTHONDONTWRITEBYTECODE="1", **extra)
    want = fresh(argv, project, env)
    assert (project / "unclosed.txt").read_text() == "data"
    (project / "unclosed.txt").unlink()
    got = forked(argv, project, env)
    assert (project / "unclosed.txt").read_text() == "data"
    statuses = {"": 0, "fail": 1, "exit": 1, "interrupt": -signal.SIGINT}
    assert got.returncode == want.returncode == statuses[ending]
    assert got.stdout == want.stdout == "no newlinethread done\n"
    # stderr: the traceback or exit message, then the probe's report
    *got_lines, got_report = got.stderr.splitlines()
    *want_lines, want_report = want.stderr.splitlines()
    assert got_lines == want_lines
    report = json.loads(got_report)
    assert report == json.loads(want_report)
    assert report["env"]["NOBREAK_PROBE_VAR"] == "x"
    assert str(project / "lib") in report["path"]


def test_a_forked_run_draws_its_own_random_seeds(project: Path) -> None:
    """What a fresh interpreter seeds from the OS: two runs that agree must not agree only
    because both are forks of one process."""
    code = (
        "import random, numpy, torch; "
        "print(random.random(), numpy.random.rand(), torch.initial_seed(), torch.rand(1).item())"
    )
    outs = set()
    for _ in range(3):
        with tempfile.TemporaryFile() as out:
            process = zygote.popen([sys.executable, "-c", code], stdout=out, stderr=out)
            assert isinstance(process, zygote.ForkedProcess)
            assert process.wait(60) == 0
            out.seek(0)
            outs.add(tuple(out.read().split()))
    for draws in zip(*outs, strict=True):
        assert len(set(draws)) == 3, outs


def test_torchs_settings_are_a_fresh_interpreters(project: Path) -> None:
    """The defaults torch's imports take from the working directory and the environment are
    the run's, not the zygote's (sets compared sorted: their order follows the hash seed)."""
    code = (
        "import json, multiprocessing.process, torch, torch._dynamo, torch._inductor.config; "
        "from torch._functorch import config as functorch; "
        "configs = [torch._dynamo.config, torch._inductor.config, functorch]; "
        "plain = lambda v: sorted(v) if isinstance(v, (set, frozenset)) else v; "
        "print(json.dumps([repr(sorted((k, plain(v)) for k, v in c.get_config_copy().items())) "
        "for c in configs] + [multiprocessing.process.ORIGINAL_DIR]))"
    )
    argv = [sys.executable, "-c", code]
    env = environment()
    want, got = fresh(argv, project, env), forked(argv, project, env)
    assert got.returncode == want.returncode == 0, got.stderr
    assert json.loads(got.stdout) == json.loads(want.stdout)
    assert str(project) in got.stdout


def test_a_forked_run_has_torch_imported_and_its_threads_work(project: Path) -> None:
    code = (
        "import sys; print('torch' in sys.modules); import torch; torch.set_num_threads(2); "
        "a = torch.randn(300, 300); d = a.double(); "
        "print(bool(((a @ a) - (d @ d)).abs().max() < 1e-3))"
    )
    done = zygote.run([sys.executable, "-c", code], cwd=project, timeout=60)
    assert (done.returncode, done.stdout) == (0, "True\nTrue\n"), done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["/bin/echo", "hi"],
        ["echo", "hi"],
        [sys.executable, "-X", "utf8", "-c", "print('hi')"],
        [os.path.realpath(sys.executable), "-c", "print('hi')"],
    ],
    ids=[
        "another program",
        "a program on PATH",
        "interpreter options",
        "the interpreter a venv links to",
    ],
)
def test_another_program_runs_in_a_real_subprocess(project: Path, argv: list[str]) -> None:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = zygote.popen(argv, cwd=project, stdout=out, stderr=err)
        assert isinstance(process, subprocess.Popen)
        assert process.wait() == 0
        out.seek(0)
        assert out.read() == b"hi\n"


#: Read at start-up or at torch's import, each printed by PRINT_SETTINGS.
SETTINGS = {
    "OMP_NUM_THREADS": "3",
    "TORCH_LOGS": "dynamo",
    "CI": "true",
    "TZ": "Asia/Tokyo",
    "TMPDIR": "/var/tmp",
}
PRINT_SETTINGS = (
    "import logging, os, time, torch, torch._dynamo, torch._dynamo.package as package; "
    "from torch._functorch import config as functorch; "
    "print(torch.get_num_threads(), logging.getLogger('torch._dynamo').level, "
    "functorch.error_on_custom_op_aliasing, time.tzname, package.DynamoCache.path_prefix())"
)


def test_a_run_in_another_start_up_environment_gets_a_zygote_of_its_own(project: Path) -> None:
    # TORCHINDUCTOR_CACHE_DIR left to Dynamo's import, from TMPDIR
    base = {k: v for k, v in environment().items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env = {**base, **SETTINGS}
    argv = [sys.executable, "-c", PRINT_SETTINGS]
    want, got = fresh(argv, project, env), forked(argv, project, env)
    assert (got.returncode, got.stdout) == (want.returncode, want.stdout), got.stderr
    assert "JST" in got.stdout
    assert "/var/tmp/" in got.stdout
    assert zygote.zygote_for(env) is not zygote.zygote_for(os.environ)


def test_runs_may_overlap(project: Path) -> None:
    code = "import sys, time; time.sleep(0.3); print(sys.argv[1])"
    with tempfile.TemporaryFile() as a_out, tempfile.TemporaryFile() as b_out:
        a = zygote.popen([sys.executable, "-c", code, "a"], stdout=a_out, stderr=a_out)
        b = zygote.popen([sys.executable, "-c", code, "b"], stdout=b_out, stderr=b_out)
        assert isinstance(a, zygote.ForkedProcess)
        assert isinstance(b, zygote.ForkedProcess)
        assert (a.poll(), b.poll()) == (None, None)
        assert (a.wait(30), b.wait(30)) == (0, 0)
        for file, name in ((a_out, b"a\n"), (b_out, b"b\n")):
            file.seek(0)
            assert file.read() == name


def test_a_run_past_its_timeout_is_killed(project: Path) -> None:
    pid_file = project / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run([sys.executable, "-c", code], cwd=project, timeout=0.5)
    # run() returned once its waiter had reaped the run: there is no such process left
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_killed_run_reports_its_signal(project: Path) -> None:
    with tempfile.TemporaryFile() as out:
        process = zygote.popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], stdout=out, stderr=out
        )
        assert isinstance(process, zygote.ForkedProcess)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(0.2)
        process.kill()
        assert process.wait(30) == -signal.SIGKILL


def test_two_messages_read_as_two() -> None:
    """A run that exits before its pid is read: both replies wait on the socket together."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        zygote._send(theirs, {"pid": 7})
        zygote._send(theirs, {"returncode": 0})
        assert zygote._receive(ours) == ({"pid": 7}, [])
        assert zygote._receive(ours) == ({"returncode": 0}, [])


def test_killing_a_run_that_has_exited_does_nothing(project: Path) -> None:
    with tempfile.TemporaryFile() as out:
        process = zygote.popen([sys.executable, "-c", "pass"], stdout=out, stderr=out)
        assert isinstance(process, zygote.ForkedProcess)
        time.sleep(0.5)  # exited, its waiter too; not waited for here
        process.kill()
        assert process.wait(30) == 0


def test_a_dead_zygote_is_replaced(project: Path) -> None:
    first = zygote.zygote_for(os.environ)
    assert first is not None
    first._process.kill()
    first._process.wait()
    argv = [sys.executable, "-c", "import sys; print('torch' in sys.modules)"]
    done = forked(argv, project, dict(os.environ))
    assert (done.returncode, done.stdout) == (0, "True\n")
    assert zygote.zygote_for(os.environ) is not first


def test_pytesters_subprocess_runs_are_forked(pytester: pytest.Pytester) -> None:
    """tests/conftest.py's Pytester.popen: `python -mpytest`, the directory first on
    PYTHONPATH, as pytester starts it."""
    pytester.makepyfile(
        test_inner="""
        import os, sys

        def test_forked():
            assert "torch" in sys.modules
            assert sys.path[:2] == [os.getcwd(), os.getcwd()]
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.fresh_interpreter
def test_a_test_marked_fresh_interpreter_gets_real_subprocesses(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner="""
        import sys

        def test_fresh():
            assert "torch" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
