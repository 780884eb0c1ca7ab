"""Inner Python processes forked from one that has already imported torch.

The suite's tests start some 60 Python processes that import torch (a README command, an inner
pytest run in a subprocess), and each of them spent 2.2 to 2.5 s importing ``torch`` and
``torch._dynamo`` before doing anything the test is about. A zygote imports them once; each run
is then a ``fork()`` of it that sets up what a fresh interpreter would have from the request
(``sys.argv`` and ``sys.orig_argv``, working directory, environment, ``sys.path``, warning
filters, a new ``__main__``, its own random seeds, the settings torch derived from the working
directory), runs the program, and exits as the interpreter would (traceback, status, threads
joined, ``atexit``, open files flushed). tests/unit/test_zygote.py compares what a forked and a
fresh run see. Two things it does not redo: the string hash seed (every run shares the
zygote's, so a test comparing the orders of two runs needs real subprocesses), and the
interpreter's teardown (the ``__del__`` of objects alive at exit does not run; with torch
loaded the teardown costs 0.3 to 1 s a run).

What a forked run cannot change is what the interpreter's start-up and torch's import read
from the environment, so runs are forked from a zygote started with the same values of every
variable but those read later (:data:`LATE_VARIABLES`): a worker keeps a zygote for each such
environment it meets (:func:`zygote_for`). Another program than this interpreter, or
interpreter options, start a real subprocess. And torch is already imported: a test of what
is *not* imported (the plugin's lazy imports) starts its process with :mod:`subprocess`, or is
marked ``fresh_interpreter`` for its ``pytester`` runs (tests/conftest.py).

The zygote runs this file as a script, so it imports nothing of the repository (a project that
an inner run tests may have a ``tests`` package of its own).
"""

from __future__ import annotations

import _io
import atexit
import contextlib
import dataclasses
import gc
import json
import locale
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, Any

#: Variables a run's environment may set otherwise than its zygote's: those read only after
#: start-up, by pytest, its plugins, this project or the suite (none of which the zygote
#: imports). Any other (``CI``, which functorch reads at import; ``TZ``; ``TMPDIR``, where
#: Dynamo's import puts its cache; ``OMP_*``; ``TORCH*``; locale) takes a zygote of its own.
LATE_VARIABLES = (
    "PYTEST_",
    "PY_COLORS",
    "NO_COLOR",
    "FORCE_COLOR",
    "COLUMNS",
    "LINES",
    "HOME",
    "USERPROFILE",
    "GITHUB_",
    "NOBREAK_",
    "ASIC_",
    "TOX_ENV_DIR",
    # the suite's own, read by the conftests of its inner runs
    "NB_",
    "EXPECTED_THREADS",
)
#: Read at start-up, and applied by a forked run itself.
APPLIED = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS")
#: Imported by the zygote before it forks: the cost every run would otherwise pay.
WARM = ("torch", "torch._dynamo")

_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [payload], list(fds)) if fds else 0
    sock.sendall(payload[sent:])


def _receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (a header, then exactly its length: the next may follow on the socket)
    and the descriptors sent with it; ``None`` when the other end closed."""
    fds: list[int] = []
    header = b""
    while len(header) < _HEADER.size:
        want = _HEADER.size - len(header)
        if max_fds:
            data, new_fds, _, _ = socket.recv_fds(sock, want, max_fds)
            fds += new_fds
        else:
            data = sock.recv(want)
        if not data:
            return None, fds
        header += data
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        data = sock.recv(size - len(body))
        if not data:
            return None, fds
        body += data
    return json.loads(body), fds


# --------------------------------------------------------------------------- in the zygote

#: Asked of a run's waiter by :meth:`ForkedProcess.kill`.
_KILL = b"k"


@dataclasses.dataclass(frozen=True)
class Start:
    """What the zygote's interpreter had before and after :data:`WARM`, for each run to build
    its own from."""

    base_path: list[str]  # sys.path past its first entry, without PYTHONPATH's
    warnings: list[Any]  # the interpreter's warning filters, without PYTHONWARNINGS's
    imported: list[Any]  # the filters the imports of WARM put in front of them
    cwd: str  # the zygote's working directory, and the settings its imports derived from it
    from_cwd: list[tuple[Any, str]]  # (config entry, its default), for a run to redo
    set_by_import: list[str]  # environment variables the imports set where they were unset


def _serve(fd: int, parent: int) -> None:
    """The zygote: import :data:`WARM`, then serve the listening socket ``fd``: a connection a
    run. A run's own parent is a fork of the zygote that waits for it and reports its exit, so
    runs may overlap (a test may start two side by side)."""
    defaults = list(warnings.filters)  # started without PYTHONWARNINGS: the interpreter's
    environment = set(os.environ)
    for name in WARM:
        __import__(name)
    cwd = os.getcwd()
    start = Start(
        base_path=sys.path[1:],  # started without PYTHONPATH: what the site module gave
        warnings=defaults,
        imported=warnings.filters[: len(warnings.filters) - len(defaults)],
        cwd=cwd,
        from_cwd=_settings_from(cwd),
        set_by_import=sorted(set(os.environ) - environment),
    )
    listener = socket.socket(fileno=fd)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped as they exit
    while True:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test process is gone, without closing us
                return
            continue
        connection.settimeout(30.0)  # a client that connects and sends nothing
        try:
            request, fds = _receive(connection, max_fds=2)
        except (OSError, ValueError):
            request, fds = None, []
        if request is not None and len(fds) == 2 and os.fork() == 0:
            listener.close()
            connection.settimeout(None)
            _wait_for(connection, request, fds, start)
        for descriptor in fds:
            os.close(descriptor)
        connection.close()


def _settings_from(cwd: str) -> list[tuple[Any, str]]:
    """The defaults torch's config modules took from the working directory at import
    (``torch._dynamo.config.debug_dir_root``...): a fresh interpreter takes them from its own."""
    found = []
    for module in list(sys.modules.values()):
        entries = getattr(module, "_config", None)
        if not isinstance(entries, dict) or not hasattr(module, "get_config_copy"):
            continue
        for entry in entries.values():
            default = getattr(entry, "default", None)
            if isinstance(default, str) and (default + os.sep).startswith(cwd + os.sep):
                found.append((entry, default))
    return found


def _wait_for(
    connection: socket.socket, request: dict[str, Any], fds: list[int], start: Start
) -> None:
    """In a fork of the zygote: fork the run, say its pid, then wait for it to exit, for the
    test process to ask that it be killed, or to be gone (then the run is killed too), and
    say how it exited."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # a fresh interpreter's, and waitpid's need
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        connection.close()
        _child(request, fds, start)  # never returns
    try:
        for descriptor in fds:
            os.close(descriptor)
        exited = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
        _send(connection, {"pid": pid})
        watching = [connection]
        while exited is not None and watching:
            ready, _, _ = select.select([exited, *watching], [], [])
            if exited in ready:
                break
            if connection.recv(1) in (b"", _KILL):  # asked, or nobody will read the result
                os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still the run's
                watching = []
        _, status = os.waitpid(pid, 0)
        _send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
    finally:
        os._exit(0)


def _child(request: dict[str, Any], fds: list[int], start: Start) -> None:
    """Become the requested program as a fresh interpreter would start it, run it, and exit as
    the interpreter would: an uncaught error's traceback, ``SystemExit``'s status, threads
    joined, ``atexit`` run, files flushed, and a ``KeyboardInterrupt``'s signal."""
    stdout, stderr = fds
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (stdout, 1), (stderr, 2)):
        os.dup2(source, target)
        os.close(source)
    cwd = request["cwd"]
    os.chdir(cwd)
    env: dict[str, str] = request["env"]
    imported = {name: os.environ[name] for name in start.set_by_import}
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # site de-duplicates PYTHONPATH and its own entries; the first entry comes after it
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request["path0"], *dict.fromkeys([*extra, *start.base_path])]
    options = [o for o in env.get("PYTHONWARNINGS", "").split(",") if o]
    if options:  # in front of the interpreter's filters, behind those of torch's import
        sys.warnoptions[:] = options
        warnings.filters[:] = start.warnings
        warnings._processoptions(options)  # type: ignore[attr-defined]
        warnings.filters[:0] = start.imported
        warnings._filters_mutated()  # type: ignore[attr-defined]
    sys.argv[:] = request["argv"]
    sys.orig_argv[:] = request["orig_argv"]
    for name, value in imported.items():
        # What the imports would set here too (TORCHINDUCTOR_CACHE_DIR, from TMPDIR and the
        # user, which are the zygote's: they are not among LATE_VARIABLES).
        if name not in env:
            os.environ[name] = value
    for entry, default in start.from_cwd:
        entry.default = cwd + default[len(start.cwd) :]
    import multiprocessing.process

    multiprocessing.process.ORIGINAL_DIR = cwd  # noted at its import
    _reseed()
    import importlib

    importlib.invalidate_caches()  # files written since the zygote started
    code, interrupted = 1, False
    try:
        _run(request)
        code = 0
    except SystemExit as stop:
        code = _exit_status(stop)
    except BaseException as error:
        tb = error.__traceback__  # printed from the program's first frame, not the zygote's
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(error), error.with_traceback(tb), tb)
        interrupted = isinstance(error, KeyboardInterrupt)
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        _flush_open_files()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                code = 120  # as the interpreter, when flushing stdout fails at exit
        if interrupted:  # the interpreter exits by the signal, so the parent sees it
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(code)


def _exit_status(stop: SystemExit) -> int:
    """The status ``SystemExit`` gives, as the interpreter computes it."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code & 0xFF
    print(stop.code, file=sys.stderr)
    return 1


def _flush_open_files() -> None:
    """Flush what the program left in files it never closed: the interpreter would at its
    teardown. (The teardown itself, 0.3 to 1 s with torch loaded, a forked run skips: the
    ``__del__`` of objects alive at exit does not run.)"""
    for obj in gc.get_objects():
        # type(), not isinstance(): no attribute of an arbitrary object is looked up
        if issubclass(type(obj), _io._IOBase):
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()


def _reseed() -> None:
    """What a fresh interpreter seeds from the OS, seeded anew: ``random``, torch's default
    generator, numpy's global one. (The string hash seed cannot be: every forked run shares
    the zygote's, so a test that compares the orders of two runs needs real subprocesses.)"""
    random.seed()
    sys.modules["torch"].seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _run(request: dict[str, Any]) -> None:
    import builtins
    import importlib.machinery
    import runpy
    import types

    kind, target = request["kind"], request["target"]
    # A new __main__ as the interpreter makes it: the zygote's own is this file, whose
    # globals its functions still use.
    main = types.ModuleType("__main__")
    loader: Any = importlib.machinery.BuiltinImporter
    main.__dict__.update(__builtins__=builtins, __annotations__={}, __loader__=loader)
    sys.modules["__main__"] = main
    if kind == "module":
        runpy._run_module_as_main(target)  # type: ignore[attr-defined]  # what `-m` runs
    elif kind == "code":
        exec(compile(target, "<string>", "exec"), main.__dict__)
    else:
        with open(target, "rb") as fh:
            source = fh.read()
        loader = importlib.machinery.SourceFileLoader("__main__", target)
        main.__dict__.update(__file__=target, __cached__=None, __loader__=loader)
        try:
            exec(compile(source, target, "exec"), main.__dict__)
        except SystemExit:
            raise  # the interpreter exits at once
        except BaseException:
            del main.__file__, main.__cached__  # as after a clean run
            raise
        del main.__file__, main.__cached__


# --------------------------------------------------------------------------- in the test


class ForkedProcess:
    """A run forked by the zygote, with the part of :class:`subprocess.Popen`'s interface that
    ``pytester`` and :func:`run` use. Dropped unwaited, or left by a test process that dies,
    the run is killed (its waiter sees the connection close)."""

    stdin = None

    def __init__(self, connection: socket.socket, pid: int) -> None:
        self._connection = connection
        self.pid = pid
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                reply, _ = _receive(self._connection)
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0) from None
            if reply is None:
                raise RuntimeError(f"the zygote's waiter of run {self.pid} exited unannounced")
            self.returncode = int(reply["returncode"])
            self._connection.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0.0)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """Kill the run, as :meth:`subprocess.Popen.kill`: nothing once it has exited. The
        waiter kills it, which has not reaped it yet, so the pid cannot be another's."""
        if self.returncode is None:
            with contextlib.suppress(OSError):
                self._connection.sendall(_KILL)

    def __del__(self) -> None:
        self._connection.close()


class Zygote:
    """A zygote of this (test) process for the runs of one start-up environment
    (:func:`zygote_for`), in a directory of its own, where its log is."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = {k: v for k, v in env.items() if k not in APPLIED}
        self._directory = tempfile.TemporaryDirectory(prefix="zygote-")
        self.address = os.path.join(self._directory.name, "socket")
        self.log = os.path.join(self._directory.name, "log")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(self.address)
        listener.listen()
        with open(self.log, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, __file__, str(listener.fileno()), str(os.getpid())],
                cwd=self._directory.name,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                pass_fds=[listener.fileno()],
            )
        listener.close()

    def spawn(self, request: dict[str, Any], stdout: int, stderr: int) -> ForkedProcess:
        """Fork a run; :class:`ZygoteError` when the zygote does not answer (it is then
        stopped, and the next run starts another)."""
        connection = socket.socket(socket.AF_UNIX)
        # The first answer waits for the zygote's imports.
        connection.settimeout(120.0)
        try:
            connection.connect(self.address)
            _send(connection, request, [stdout, stderr])
            reply, _ = _receive(connection)
        except (OSError, ValueError) as error:
            reply = None
            cause: BaseException | None = error
        else:
            cause = None
        if reply is None:
            connection.close()
            with open(self.log, errors="replace") as fh:
                said = fh.read()[-2000:]
            self.close()
            raise ZygoteError(f"the zygote did not answer ({cause!r}); its log:\n{said}")
        connection.settimeout(None)
        return ForkedProcess(connection, int(reply["pid"]))

    def close(self) -> None:
        """Stop the zygote and remove its directory (its log with it): an xdist worker ends
        without running the directory's own finalizer, which left one behind a zygote."""
        self._process.kill()
        self._process.wait()
        self._directory.cleanup()


class ZygoteError(RuntimeError):
    """The zygote died or did not answer."""


#: Zygotes kept at once: a worker's runs come in a few environments (a test's; a module
#: fixture's, which still has the variables a test's fixtures take away, such as ``CI``; and
#: each again once Inductor has set its ``_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR``).
KEPT = 4
_zygotes: dict[tuple[tuple[str, str], ...], Zygote] = {}  # by start-up environment, oldest first
_starting = threading.Lock()  # a test may start its first two runs side by side


def start_up(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of ``env`` that a forked run cannot apply (all but :data:`LATE_VARIABLES` and
    :data:`APPLIED`): runs with the same are forked from the same zygote."""
    return tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if not name.startswith(LATE_VARIABLES) and name not in APPLIED
        )
    )


def zygote_for(env: Mapping[str, str]) -> Zygote | None:
    """The zygote for runs with environment ``env``, started with it when there is none alive
    (the oldest of :data:`KEPT` is then stopped); ``None`` where nothing can fork."""
    if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return None
    key = start_up(env)
    with _starting:
        zygote = _zygotes.pop(key, None)
        if zygote is None or zygote._process.poll() is not None:
            while len(_zygotes) >= KEPT:
                _zygotes.pop(next(iter(_zygotes))).close()
            zygote = Zygote(env)
            atexit.register(zygote.close)
        _zygotes[key] = zygote  # now the newest
    return zygote


def _shebang(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names, when it is a plain path."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return None
    named = first[2:].strip().decode(errors="replace") if first.startswith(b"#!") else ""
    return named if named and " " not in named else None


def _this_interpreter(path: str) -> bool:
    """Whether ``path`` starts this interpreter: the same executable in the same directory
    (``python`` or ``python3`` of this venv; the base interpreter a venv links to has another
    ``sys.prefix``, and none of its packages)."""
    here = os.path.abspath(sys.executable)
    there = os.path.abspath(path)
    return os.path.dirname(there) == os.path.dirname(here) and os.path.realpath(
        there
    ) == os.path.realpath(here)


def request_for(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> dict[str, Any] | None:
    """What the zygote needs to run ``argv`` in ``cwd`` as a fresh interpreter would, or
    ``None`` when a forked run could differ from it (then the caller starts a subprocess)."""
    if not argv or os.sep not in argv[0]:
        return None  # a program found on PATH, or none
    program = os.path.join(cwd, argv[0])
    if not _this_interpreter(program):
        # A console script (this environment's pytest): the kernel runs its #! interpreter.
        interpreter = _shebang(program)
        if interpreter is None or not _this_interpreter(interpreter):
            return None
        path0 = os.path.dirname(os.path.realpath(program))
        orig = [interpreter, *argv]
        return _request("script", program, list(argv), path0, cwd, env, orig)
    option, value, rest = _option(argv[1:])
    if option == "-c":
        return _request("code", value, ["-c", *rest], "", cwd, env, list(argv))
    if option == "-m":
        return _request("module", value, ["-m", *rest], cwd, cwd, env, list(argv))
    if len(argv) >= 2 and not argv[1].startswith("-"):
        script = os.path.join(cwd, argv[1])
        if not os.path.isfile(script):
            return None  # the interpreter's own message and status
        path0 = os.path.dirname(os.path.realpath(script))
        return _request("script", script, list(argv[1:]), path0, cwd, env, list(argv))
    return None  # interpreter options: -X, -W, -I, -u ...


def _option(args: Sequence[str]) -> tuple[str, str, list[str]]:
    """``-c``/``-m``, its value and the arguments after it (``-mpytest`` is ``-m pytest``)."""
    if not args or args[0][:2] not in ("-c", "-m"):
        return "", "", []
    if len(args[0]) > 2:
        return args[0][:2], args[0][2:], list(args[1:])
    if len(args) < 2:
        return "", "", []
    return args[0], args[1], list(args[2:])


def _request(
    kind: str,
    target: str,
    argv: list[str],
    path0: str,
    cwd: str,
    env: Mapping[str, str],
    orig_argv: list[str],
) -> dict[str, Any]:
    return {
        "kind": kind,  # code (-c), module (-m) or script
        "target": target,
        "argv": argv,  # sys.argv
        "orig_argv": orig_argv,  # sys.orig_argv
        "path0": path0,  # sys.path[0]
        "cwd": cwd,
        "env": dict(env),
    }


def popen(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[Any],
    stderr: IO[Any],
) -> ForkedProcess | subprocess.Popen[bytes]:
    """``argv`` run as :class:`subprocess.Popen` would, writing to the files ``stdout`` and
    ``stderr``, forked from the zygote where that cannot differ from a fresh process."""
    where = os.path.abspath(cwd if cwd is not None else os.getcwd())
    environment = dict(os.environ if env is None else env)
    request = request_for([os.fspath(a) for a in argv], where, environment)
    zygote = zygote_for(environment) if request is not None else None
    if zygote is not None and request is not None:
        stdout.flush()
        stderr.flush()
        with contextlib.suppress(ZygoteError):  # then a real subprocess
            return zygote.spawn(request, stdout.fileno(), stderr.fileno())
    return subprocess.Popen(
        list(argv),
        cwd=where,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
    )


def run(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, check=False)`` by :func:`popen`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise subprocess.TimeoutExpired(list(argv), timeout or 0.0) from None
        texts = []
        for file in (out, err):
            file.seek(0)
            # As text=True decodes: the locale's encoding, universal newlines.
            text = file.read().decode(locale.getpreferredencoding(False))
            texts.append(text.replace("\r\n", "\n").replace("\r", "\n"))
    return subprocess.CompletedProcess(list(argv), code, texts[0], texts[1])


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
