"""Inner Python processes forked from one that has already imported torch.

The suite's tests start some 60 Python processes that import torch (a README command, an inner
pytest run in a subprocess), and each of them spent 2.2 to 2.5 s importing ``torch`` and
``torch._dynamo`` before doing anything the test is about. A zygote imports them once; each run
is then a ``fork()`` of it that sets up what a fresh interpreter would have from the request
(``sys.argv`` and ``sys.orig_argv``, working directory, environment, ``sys.path``, warning
filters, a new ``__main__``, its own random seed), runs the program, and exits as the
interpreter would. tests/unit/test_zygote.py compares what a forked and a fresh run see.

What a forked run cannot have is an interpreter whose start-up read different settings, so a
request falls back to a real subprocess whenever it could tell: another program than this
interpreter, interpreter options, or an environment that differs from the zygote's in a
variable read at start-up or at torch's import (:data:`START_UP_VARIABLES`). And torch is
already imported: a test of what is *not* imported (the plugin's lazy imports) starts its
process with :mod:`subprocess`, or is marked ``fresh_interpreter`` for its ``pytester`` runs
(tests/conftest.py).

The zygote runs this file as a script, so it imports nothing of the repository (a project that
an inner run tests may have a ``tests`` package of its own).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import locale
import os
import random
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

#: Variables a fresh interpreter, torch's import or its OpenMP runtime read when they start:
#: a request whose value differs from the zygote's runs in a real subprocess. ``PYTHONPATH``
#: and ``PYTHONDONTWRITEBYTECODE`` are the exceptions that a forked run applies itself.
START_UP_VARIABLES = (
    "PYTHON",
    "TORCH",
    "PYTORCH",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL",
    "ONEDNN_",
    "DNNL_",
    "ATEN_",
    "CUDA",
    "LD_",
    "LC_",
    "LANG",
)
APPLIED = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS")
#: Imported by the zygote before it forks: the cost every run would otherwise pay.
WARM = ("torch", "torch._dynamo")

_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], list(fds))
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """A message and the descriptors sent with it; ``None`` when the other end closed."""
    fds: list[int] = []
    buffer = b""
    while len(buffer) < _HEADER.size:
        if max_fds:
            data, new_fds, _, _ = socket.recv_fds(sock, 65536, max_fds)
            fds += new_fds
        else:
            data = sock.recv(65536)
        if not data:
            return None, fds
        buffer += data
    (size,) = _HEADER.unpack(buffer[: _HEADER.size])
    buffer = buffer[_HEADER.size :]
    while len(buffer) < size:
        data = sock.recv(size - len(buffer))
        if not data:
            return None, fds
        buffer += data
    return json.loads(buffer), fds


# --------------------------------------------------------------------------- in the zygote


def _serve(fd: int, parent: int) -> None:
    """The zygote: import :data:`WARM`, then serve the listening socket ``fd``: a connection a
    run. A run's own parent is a fork of the zygote that waits for it and reports its exit, so
    runs may overlap (a test may start two side by side)."""
    defaults = list(warnings.filters)  # started without PYTHONWARNINGS: the interpreter's
    for name in WARM:
        __import__(name)
    base_path = sys.path[1:]  # started without PYTHONPATH: what the site module gave
    imported = warnings.filters[: len(warnings.filters) - len(defaults)]
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
        connection.settimeout(None)
        request, fds = _receive(connection, max_fds=2)
        if request is not None and os.fork() == 0:
            listener.close()
            _wait_for(connection, request, fds, Start(base_path, defaults, imported))
        for descriptor in fds:
            os.close(descriptor)
        connection.close()


@dataclasses.dataclass(frozen=True)
class Start:
    """What the zygote's interpreter had before and after :data:`WARM`, for each run to build
    its own from."""

    base_path: list[str]  # sys.path past its first entry, without PYTHONPATH's
    warnings: list[Any]  # the interpreter's warning filters, without PYTHONWARNINGS's
    imported: list[Any]  # the filters the imports of WARM put in front of them


def _wait_for(
    connection: socket.socket, request: dict[str, Any], fds: list[int], start: Start
) -> None:
    """In a fork of the zygote: fork the run, say its pid, wait for it, say how it exited."""
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
        _send(connection, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
    finally:
        os._exit(0)


def _child(request: dict[str, Any], fds: list[int], start: Start) -> None:
    """Become the requested program as a fresh interpreter would start it, run it, and exit as
    it would: non-daemon threads joined, ``atexit`` run, standard streams flushed."""
    code = 1
    try:
        stdout, stderr = fds
        null = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((null, 0), (stdout, 1), (stderr, 2)):
            os.dup2(source, target)
            os.close(source)
        os.chdir(request["cwd"])
        env: dict[str, str] = request["env"]
        os.environ.clear()
        os.environ.update(env)
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = list(dict.fromkeys([request["path0"], *extra, *start.base_path]))
        options = [o for o in env.get("PYTHONWARNINGS", "").split(",") if o]
        if options:  # in front of the interpreter's filters, behind those of torch's import
            sys.warnoptions[:] = options
            warnings.filters[:] = start.warnings
            warnings._processoptions(options)  # type: ignore[attr-defined]
            warnings.filters[:0] = start.imported
            warnings._filters_mutated()  # type: ignore[attr-defined]
        sys.argv[:] = request["argv"]
        sys.orig_argv[:] = request["orig_argv"]
        tempfile.tempdir = None  # found anew from TMPDIR and the others, as a fresh one would
        random.seed()  # a fresh interpreter seeds from the OS, not from its parent's state
        import importlib

        importlib.invalidate_caches()  # files written since the zygote started
        code = _run(request)
    except SystemExit as stop:
        code = _exit_code(stop)
    except BaseException as error:
        _print_error(error)
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _print_error(error: BaseException) -> None:
    """As the interpreter prints an uncaught error: from the program's first frame on, not the
    zygote's."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    sys.excepthook(type(error), error.with_traceback(tb), tb)


def _exit_code(stop: SystemExit) -> int:
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def _run(request: dict[str, Any]) -> int:
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
        except BaseException as error:
            # The interpreter prints the error, then takes the two back as after a clean run.
            _print_error(error)
            del main.__file__, main.__cached__
            return 1
        del main.__file__, main.__cached__
    return 0


# --------------------------------------------------------------------------- in the test


class ForkedProcess:
    """A run forked by the zygote, with the part of :class:`subprocess.Popen`'s interface that
    ``pytester`` and :func:`run` use."""

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
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


class Zygote:
    """The zygote process of this (test) process, started with the environment it compares
    each request's with."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = {k: v for k, v in env.items() if k not in APPLIED}
        self._directory = tempfile.TemporaryDirectory(prefix="zygote-")
        self.address = os.path.join(self._directory.name, "socket")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(self.address)
        listener.listen()
        self._process = subprocess.Popen(
            [sys.executable, __file__, str(listener.fileno()), str(os.getpid())],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=[listener.fileno()],
        )
        listener.close()

    def differs(self, env: Mapping[str, str]) -> list[str]:
        """The start-up variables whose value in ``env`` is not the zygote's."""
        names = set(self.env) | set(env)
        return sorted(
            name
            for name in names
            if name.startswith(START_UP_VARIABLES)
            and name not in APPLIED
            and self.env.get(name) != env.get(name)
        )

    def spawn(self, request: dict[str, Any], stdout: int, stderr: int) -> ForkedProcess:
        connection = socket.socket(socket.AF_UNIX)
        connection.connect(self.address)
        _send(connection, request, [stdout, stderr])
        reply, _ = _receive(connection)
        if reply is None:
            connection.close()
            raise RuntimeError(f"the zygote exited ({self._process.poll()}): see its stderr")
        return ForkedProcess(connection, int(reply["pid"]))

    def close(self) -> None:
        self._process.kill()
        self._process.wait()
        self._directory.cleanup()


_zygote: Zygote | None = None
_starting = threading.Lock()  # a test may start its first two runs side by side


def _the_zygote() -> Zygote | None:
    global _zygote
    with _starting:
        if _zygote is None:
            if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
                return None
            _zygote = Zygote(os.environ)
            atexit.register(_zygote.close)
    return _zygote


def _shebang(path: str) -> str | None:
    """The interpreter a script's ``#!`` line names, when it is a plain path."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return None
    named = first[2:].strip().decode(errors="replace") if first.startswith(b"#!") else ""
    return named if named and " " not in named else None


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def request_for(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> dict[str, Any] | None:
    """What the zygote needs to run ``argv`` in ``cwd`` as a fresh interpreter would, or
    ``None`` when a forked run could differ from it (then the caller starts a subprocess)."""
    if not argv or os.sep not in argv[0]:
        return None  # a program found on PATH, or none
    program = os.path.join(cwd, argv[0])
    if not _same_file(program, sys.executable):
        # A console script (this environment's pytest): the kernel runs its #! interpreter.
        interpreter = _shebang(program)
        if interpreter is None or not _same_file(interpreter, sys.executable):
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
    zygote = _the_zygote() if request is not None else None
    if zygote is None or zygote.differs(environment):
        return subprocess.Popen(
            list(argv),
            cwd=where,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    assert request is not None
    stdout.flush()
    stderr.flush()
    return zygote.spawn(request, stdout.fileno(), stderr.fileno())


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
