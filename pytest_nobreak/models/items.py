"""``pytest --nobreak-model SPEC``: check a model with no test code.

Each SPEC becomes a collector ``nobreak-model[<spec>]`` whose items are the checks, so a check's
nodeid is ``nobreak-model[hf:llama]::compiles_whole``. The items are ``pytest.Function``\\ s
carrying the ``no_graph_break`` marker: the session (``session.py``) watches and judges them like
any marked test, so they show in the terminal summary, the JSON, JUnit and HTML reports and the
baseline; they select with ``-k``, and every xdist worker collects the same ones. The checks:

- ``compiles_whole``: one call; the marker's full semantics (breaks, eager fallbacks; host
  fallbacks are ``on_dut``'s business);
- ``no_recompile``: three calls with other batch and sequence sizes (for a ``diffusers:``
  model the sequence size sets the latent's side, a multiple of what its blocks and patches
  divide: :mod:`pytest_nobreak.models.diffusers.inputs`); at most one recompile (the one
  that makes the sizes dynamic), with the failed guard named;
- ``exports``: ``torch.export`` in non-strict and strict mode with every dimension the
  check's sizes vary (batch, sequence) ``Dim.AUTO``, through :func:`pytest_nobreak.
  export_check` (a failed mode, draft_export's findings, a dimension the program made static
  or narrowed, disagreeing programs, host syncs in the program), and under ``--asic-backend``
  the program run on the DUT at two sizes;
- ``on_dut`` (under ``--asic-backend``): no host fallback, no host MAC, no host sync (each
  one stalls the device), and the output within
  the int8 error bound of the fp32 eager output (:mod:`asic_backend.sim.tolerance`);
- ``benchmark`` (with ``--benchmark-enable``): the compiled call timed by pytest-benchmark, the
  simulated figures of one call in ``extra_info`` under ``--asic-backend``.

Checks compile with the session's backend: the ASIC under ``--asic-backend``, else
``--nobreak-backend`` when given, else ``eager`` (graph breaks are Dynamo's: the cheapest
backend gives the same answer). This module imports torch only when a check runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import pytest

from pytest_nobreak.benchmark import AsicBenchmark
from pytest_nobreak.config import NobreakConfig
from pytest_nobreak.fixtures import session_backend
from pytest_nobreak.keys import MONITOR_KEY
from pytest_nobreak.markers import MARKER
from pytest_nobreak.models.spec import InputSpec, ModelSpec, SpecError, parse_inputs, parse_spec
from pytest_nobreak.watch.export_program import combine_args
from pytest_nobreak.watch.export_report import NARROWED
from pytest_nobreak.watch.exporting import export_check

if TYPE_CHECKING:
    from pytest_nobreak.models.build import BuiltModel

__all__ = [
    "COLLECTOR_PREFIX",
    "ModelPlugin",
    "add_model_options",
    "configure_models",
    "model_notes",
]

#: Collector names are ``nobreak-model[<spec>]``.
COLLECTOR_PREFIX = "nobreak-model"
PLUGIN_NAME = "nobreak-models"
#: Set in a check's stash once its compiled calls have all run: a failure after that is a
#: verdict on what ran (numerics, host MACs), one before it (the time limit, a crash) cut the
#: check short, and its breaks are not all known.
CALLED_KEY = pytest.StashKey[bool]()
#: Attribute of a check's call-phase report carrying that flag to the xdist controller.
FINISHED_ATTR = "nobreak_model_finished"
#: The second line of the failure of a named model that cannot be built (the first, the reason,
#: is what a sweep's skip says).
NAMED_NOT_SKIPPED = "not skipped: --nobreak-model names it (a sweep's members skip instead)"
#: Set on the call report of a check whose model could not be built (named, so it failed).
UNBUILT_ATTR = "nobreak_model_unbuilt"
#: Default ``--nobreak-model-timeout``: a model that takes longer to build, trace, lower and
#: simulate is a problem of its own, and one must not hold up a sweep of hundreds.
DEFAULT_TIMEOUT_S = 300.0
#: The longest limit accepted (a day): a timer takes a finite, bounded number of seconds.
MAX_TIMEOUT_S = 86400.0
#: Below this, an fp32 output is zero in all but name (deep stacks of default-initialized
#: layers shrink activations to 1e-26): an error relative to it measures nothing.
VANISHING = 1e-6
#: The marker options of each check (``on_dut`` alone fails on host fallbacks and, under the
#: ASIC, on host syncs; the others report them).
_MARKS: dict[str, dict[str, Any]] = {
    "compiles_whole": {"allow_host_fallback": True, "max_host_syncs": None},
    "no_recompile": {"allow_host_fallback": True, "max_recompiles": 1, "max_host_syncs": None},
    # A range narrowed by what the model is (a sequence up to its position embeddings) is
    # reported, not failed; a dimension made static, a failed mode or a guess fails.
    "exports": {"allow_host_fallback": True, "max_host_syncs": None, "allow": [NARROWED]},
    "on_dut": {},
    "benchmark": {"allow_host_fallback": True, "max_host_syncs": None},
}


def add_model_options(parser: pytest.Parser) -> None:
    """Register ``--nobreak-model`` (repeatable; ini ``nobreak_models``, a line list),
    ``--nobreak-model-inputs`` and ``--nobreak-model-timeout`` (ini keys of the same names)."""
    group = parser.getgroup("nobreak")
    group.addoption(
        "--nobreak-model",
        action="append",
        default=None,
        dest="nobreak_model",
        metavar="SPEC",
        help="check a model with no test code (repeatable): module:factory, file.py:factory, "
        "hf:<model_type>[:<task>], diffusers:<ModelClass>, or a sweep hf:*, hf:llm, "
        "hf:vision, hf:audio, diffusers:*",
    )
    group.addoption(
        "--nobreak-model-inputs",
        default=None,
        metavar="INPUTS",
        help="the inputs of the --nobreak-model models, e.g. 4x3x32x32 or ids:2x16 "
        "(default: inferred)",
    )
    group.addoption(
        "--nobreak-model-timeout",
        default=None,
        metavar="SECONDS",
        help=f"time limit of one --nobreak-model check (default {DEFAULT_TIMEOUT_S:g}; 0: none)",
    )
    parser.addini("nobreak_models", "models to check (one SPEC a line)", type="linelist")
    parser.addini("nobreak_model_inputs", "inputs of the nobreak_models", default=None)
    parser.addini("nobreak_model_timeout", "time limit of one model check (s)", default=None)


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The resolved model options of one session."""

    specs: tuple[ModelSpec, ...]
    inputs: tuple[InputSpec, ...]
    timeout_s: float | None


def _settings(config: pytest.Config) -> ModelSettings | None:
    texts = config.getoption("nobreak_model") or config.getini("nobreak_models")
    inputs_text = config.getoption("nobreak_model_inputs") or config.getini("nobreak_model_inputs")
    timeout_text = config.getoption("nobreak_model_timeout") or config.getini(
        "nobreak_model_timeout"
    )
    if not texts:
        if inputs_text:
            raise pytest.UsageError(
                "--nobreak-model-inputs: no model to give them to; add --nobreak-model SPEC"
            )
        return None
    try:
        specs = tuple(parse_spec(text, rootpath=config.rootpath) for text in texts)
        inputs = parse_inputs(inputs_text) if inputs_text else ()
    except SpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    timeout = DEFAULT_TIMEOUT_S
    if timeout_text:
        try:
            timeout = float(timeout_text)
            # A timer takes a finite number of seconds (nan, inf and 1e400 are none).
            if not math.isfinite(timeout) or timeout < 0 or timeout > MAX_TIMEOUT_S:
                raise ValueError
        except ValueError:
            raise pytest.UsageError(
                f"--nobreak-model-timeout {timeout_text}: write a number of seconds up to "
                f"{MAX_TIMEOUT_S:g}, e.g. 120 (0: no limit)"
            ) from None
    return ModelSettings(specs, inputs, timeout or None)


def configure_models(config: pytest.Config, settings: NobreakConfig) -> None:
    """Register the plugin of the generated checks when a ``--nobreak-model`` is given: every
    SPEC is checked now (imports, factories, ``transformers`` model types), before any test."""
    models = _settings(config)
    if models is None:
        return
    config.pluginmanager.register(ModelPlugin(config, settings, models), PLUGIN_NAME)
    given = bool(config.getoption("nobreak_model"))
    if given and config.args_source != pytest.Config.ArgsSource.ARGS:
        # Models named on the command line and no path: check the models alone, not the
        # testpaths as well (name paths to run tests beside them). Models of the ini file join
        # the suite: a plain `pytest` must still run every test.
        config.args = []


class ModelPlugin:
    """The collection and reporting hooks of the generated checks."""

    def __init__(self, config: pytest.Config, settings: NobreakConfig, models: ModelSettings):
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.models.build import expand, resolve

        self.config = config
        self.settings = settings
        self.models = models
        try:
            self.specs = expand(list(models.specs))
            #: The specs the user named (not members of a sweep): one that cannot be built fails.
            self.named = frozenset(spec.text for spec in models.specs)
            self.factories = {spec.text: resolve(spec) for spec in self.specs}
            if not hasattr(config, "workerinput"):  # once, on the controller
                self._check_inputs(self.named)
        except SpecError as exc:
            raise pytest.UsageError(str(exc)) from None
        #: Each check's skip or failure reason, and whether its compiled calls had run (so its
        #: breaks are all known), by nodeid (on the controller).
        self.notes: dict[str, dict[str, Any]] = {}

    def _check_inputs(self, named: frozenset[str]) -> None:
        """Inputs that cannot be made are a usage error before any test runs: a factory's
        (calling it), a named ``hf:`` model's (its main input). A sweep's members skip instead."""
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.models.build import check_inputs

        for spec in self.specs:
            if spec.text in named:
                factory = self.factories[spec.text]
                check_inputs(spec, factory, self.models.inputs, self.models.timeout_s)

    def checks(self) -> list[str]:
        """The checks each model gets in this session."""
        out = ["compiles_whole", "no_recompile", "exports"]
        if self.settings.asic:
            out.append("on_dut")
        # Timing runs only when asked for: a plain run checks the compile, not the clock.
        if self.config.getoption("benchmark_enable", False) and self.config.pluginmanager.hasplugin(
            "benchmark"
        ):
            out.append("benchmark")
        return out

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Add the checks ahead of the session's marker validation and of ``-k``/``-m``."""
        checks = self.checks()
        for spec in self.specs:
            name = f"{COLLECTOR_PREFIX}[{spec.text}]"
            collector = ModelCollector.from_parent(
                session,
                name=name,
                # Given, or pytest makes "::name" (the session's id is empty): the collector
                # stands where a file would, so -k, --deselect and reports read it as one.
                nodeid=name,
                spec=spec,
                factory=self.factories[spec.text],
                plugin=self,
                checks=checks,
            )
            new = collector.collect()
            items.extend(new)
            # The terminal's "collected N items" counts collect reports.
            report = pytest.CollectReport(collector.nodeid, "passed", None, list(new))
            config.hook.pytest_collectreport(report=report)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if isinstance(item, ModelCheck) and report.when == "call":
            setattr(report, FINISHED_ATTR, item.stash.get(CALLED_KEY, False))
            parent = item.parent
            if isinstance(parent, ModelCollector) and parent.unbuilt:
                setattr(report, UNBUILT_ATTR, True)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.nodeid.startswith(COLLECTOR_PREFIX + "[") or report.when != "call":
            return
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
        elif report.failed:
            reason = _failure_line(report)
        else:
            return
        finished = bool(getattr(report, FINISHED_ATTR, False))
        note: dict[str, Any] = {"reason": reason, "finished": finished}
        if getattr(report, UNBUILT_ATTR, False):
            note["built"] = False
        self.notes[report.nodeid] = note


def model_notes(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """Each ``--nobreak-model`` check that did not pass: ``{"reason": ..., "finished": ...}``
    (whether its compiled calls had all run, so that its breaks are all known, when it failed
    or stopped), by nodeid (empty without models), for the JSON report's ``models`` section,
    which the zoo table reads."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    return dict(plugin.notes) if isinstance(plugin, ModelPlugin) else {}


def _failure_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0].removeprefix("Failed: ")[:300] if lines else "failed"


class ModelCollector(pytest.Collector):
    """``nobreak-model[<spec>]``: the checks of one model. Builds the model once per process,
    on first use, and keeps it (and its build failure) for the other checks."""

    def __init__(
        self,
        *,
        spec: ModelSpec,
        factory: Callable[[], Any] | None,
        plugin: ModelPlugin,
        checks: list[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.factory = factory
        self.plugin = plugin
        self.check_names = checks
        self._built: BuiltModel | None = None
        self._skip: str | None = None
        self._failure: str | None = None
        #: The model was named and could not be built: its checks failed without running.
        self.unbuilt = False

    def collect(self) -> list[pytest.Item]:
        items: list[pytest.Item] = []
        for name in self.check_names:
            run = _CHECKS[name]
            item = ModelCheck.from_parent(self, name=name, callobj=_bind(run, self))
            item.add_marker(getattr(pytest.mark, MARKER)(**_MARKS[name]))
            items.append(item)
        return items

    def model(self) -> BuiltModel:
        """The model and its inputs, built on first use; when it cannot be built, fails if the
        user named it and skips if a sweep did."""
        # Lazy: keeps torch out of the plugin's import until a test needs it.
        from pytest_nobreak.models.build import BuildSkip, InferredInputsError, build

        if self._skip is not None:
            pytest.skip(self._skip)
        if self._failure is not None:
            pytest.fail(self._failure, pytrace=False)
        if self._built is None:
            try:
                self._built = build(self.spec, self.factory, self.plugin.models.inputs)
            except BuildSkip as exc:
                reason = f"{self.spec.text}: {exc}"
                if self.spec.text in self.plugin.named:
                    # Named by the user, so a gate relies on it: not building is a failure (a
                    # skip would exit 0 the day it stops building). A sweep's member skips.
                    self._failure = f"{reason}\n{NAMED_NOT_SKIPPED}"
                    self.unbuilt = True
                else:
                    self._skip = reason
            except InferredInputsError as exc:
                self._failure = str(exc)
            # Outside the except clauses: the message alone, not a chain of two tracebacks.
            if self._skip is not None:
                pytest.skip(self._skip)
            if self._failure is not None:
                pytest.fail(self._failure, pytrace=False)
        assert self._built is not None
        return self._built

    def backend(self) -> Any:
        """The compile backend of the checks (see the module docstring)."""

        settings = self.plugin.settings
        if settings.asic or settings.backend_explicit:
            return session_backend(settings)
        return "eager"


class ModelCheck(pytest.Function):
    """One check of one model: ``nobreak-model[<spec>]::<check>``."""

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, self.nodeid


def _bind(run: Callable[..., None], collector: ModelCollector) -> Callable[..., None]:
    """The check as a test function: pytest reads the fixtures it takes from its signature."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from pytest_nobreak.models.build import TIME_LIMIT_HINT, TimeLimitExceeded, time_limit

    timeout = collector.plugin.models.timeout_s

    def limited(request: pytest.FixtureRequest, **fixtures: Any) -> None:
        expired = None
        try:
            with time_limit(timeout):
                run(collector, request, **fixtures)
        except TimeLimitExceeded as exc:
            expired = str(exc)
        if expired is not None:  # failed outside the handler: one line, no chained traceback
            pytest.fail(
                f"{collector.spec.text}: {request.node.name} {expired} {TIME_LIMIT_HINT}",
                pytrace=False,
            )

    if run is _benchmark:

        def with_benchmark(request: pytest.FixtureRequest, benchmark: Any) -> None:
            limited(request, benchmark=benchmark)

        return with_benchmark

    def plain(request: pytest.FixtureRequest) -> None:
        limited(request)

    return plain


# --------------------------------------------------------------------------- the checks


def _compiles_whole(collector: ModelCollector, request: pytest.FixtureRequest) -> None:
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch

    built = collector.model()
    compiled = torch.compile(built.module, backend=collector.backend())
    args, kwargs = built.inputs(0)
    with torch.no_grad():  # an inference check: the DUT runs no autograd
        compiled(*args, **kwargs)
    request.node.stash[CALLED_KEY] = True


def _no_recompile(collector: ModelCollector, request: pytest.FixtureRequest) -> None:
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch

    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from pytest_nobreak.models.build import SIZES

    built = collector.model()
    compiled = torch.compile(built.module, backend=collector.backend())
    with torch.no_grad():
        # The second sizes recompile once with dynamic shapes; the third must reuse that graph.
        for index in range(len(SIZES)):
            args, kwargs = built.inputs(index)
            compiled(*args, **kwargs)
    request.node.stash[CALLED_KEY] = True


def _exports(collector: ModelCollector, request: pytest.FixtureRequest) -> None:
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch

    built = collector.model()
    args, kwargs = built.inputs(0)
    settings = collector.plugin.settings
    with torch.no_grad():
        result = export_check(
            built.module,
            args,
            kwargs,
            dynamic_shapes=_varying_dims(built),
            asic=settings.asic,
            device=settings.asic_config() if settings.asic else None,
            root=str(request.config.rootpath),
            first_party=settings.first_party,
        )
    request.node.stash[MONITOR_KEY].report.add_export(result)
    request.node.stash[CALLED_KEY] = True


def _varying_dims(built: BuiltModel) -> dict[str, Any]:
    """``Dim.AUTO`` for each dimension of an input that the check's sizes vary (batch and
    sequence; a diffusion model's latent side), by the forward's parameter names, inside dicts
    and lists of tensors too (``added_cond_kwargs``); AUTO, so inputs that share a size (ids
    and their mask, latent patches and their ids) stay equal, and what the program made
    static is reported, not raised."""
    one = combine_args(built.module, *built.inputs(0))
    two = combine_args(built.module, *built.inputs(1))
    return {name: _varying(value, two.get(name)) for name, value in one.items()}


def _varying(value: Any, other: Any) -> Any:
    """The dynamic shapes of one input: a tensor's dims that differ between the two calls, a
    dict's or list's entries' (``None``: all static)."""
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch

    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from torch.export import Dim

    if isinstance(value, torch.Tensor):
        if not isinstance(other, torch.Tensor) or value.dim() != other.dim():
            return None
        pairs = zip(value.shape, other.shape, strict=True)
        return {dim: Dim.AUTO for dim, (a, b) in enumerate(pairs) if a != b} or None
    if isinstance(value, dict) and isinstance(other, dict) and value.keys() == other.keys():
        inner = {key: _varying(item, other[key]) for key, item in value.items()}
        return inner if any(v is not None for v in inner.values()) else None
    if (
        isinstance(value, (list, tuple))
        and isinstance(other, (list, tuple))
        and len(value) == len(other)
    ):
        items = [_varying(a, b) for a, b in zip(value, other, strict=True)]
        return type(value)(items) if any(v is not None for v in items) else None
    return None


def _on_dut(collector: ModelCollector, request: pytest.FixtureRequest) -> None:
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch

    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from asic_backend.sim.tolerance import DYN_INT8_MIN_COSINE, DYN_INT8_REL_TOL, cosine, rel_err

    # Lazy: keeps torch out of the plugin's import until a test needs it.
    from pytest_nobreak.models.build import first_tensor

    built = collector.model()
    compiled = torch.compile(built.module, backend=collector.backend())
    args, kwargs = built.inputs(0)
    with torch.no_grad():
        out = first_tensor(compiled(*args, **kwargs))
    request.node.stash[CALLED_KEY] = True
    counters = request.node.stash[MONITOR_KEY].report.asic
    if counters is None or counters.dut_ops == 0:
        pytest.fail(f"{collector.spec.text}: no GEMM ran on the simulated DUT", pytrace=False)
    if counters.host_macs and not counters.host_fallbacks:
        # Host fallbacks fail the check through the marker, with each op; MACs without one are
        # a gap in that accounting, and must not pass.
        pytest.fail(
            f"{collector.spec.text}: {counters.host_macs} MACs ran on the host", pytrace=False
        )
    ref = built.reference
    if not ref.is_floating_point():
        return
    if out.shape != ref.shape:
        pytest.fail(
            f"{collector.spec.text}: the DUT output's shape {tuple(out.shape)} is not the fp32 "
            f"eager one's {tuple(ref.shape)}",
            pytrace=False,
        )
    for label, tensor in (("DUT", out), ("fp32 eager", ref)):
        if not bool(torch.isfinite(tensor).all()):
            # NaN compares false with every bound: it must fail here, or it would pass them all.
            pytest.fail(
                f"{collector.spec.text}: the {label} output holds NaN or infinite values",
                pytrace=False,
            )
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    if scale < VANISHING:
        pytest.fail(
            f"{collector.spec.text}: the fp32 eager output vanishes (max |y| = {scale:.3g}): "
            "its random weights leave nothing to compare the DUT's with; check a factory "
            "that initializes it",
            pytrace=False,
        )
    err, cos = rel_err(out, ref), cosine(out, ref)
    if not (err < DYN_INT8_REL_TOL and cos > DYN_INT8_MIN_COSINE):
        pytest.fail(
            f"{collector.spec.text}: the DUT output is off the fp32 eager output by more than "
            f"int8 error: max error {err:.3g} of its range (bound {DYN_INT8_REL_TOL:g}), cosine "
            f"{cos:.6f} (bound {DYN_INT8_MIN_COSINE:g})",
            pytrace=False,
        )


def _benchmark(collector: ModelCollector, request: pytest.FixtureRequest, benchmark: Any) -> None:
    # Lazy: keeps torch out of the plugin's import until a test needs it.
    import torch

    built = collector.model()
    compiled = torch.compile(built.module, backend=collector.backend())
    args, kwargs = built.inputs(0)
    if not collector.plugin.settings.asic:
        with torch.no_grad():
            benchmark.pedantic(compiled, args=args, kwargs=kwargs, rounds=5, warmup_rounds=1)
        request.node.stash[CALLED_KEY] = True
        return

    timer = AsicBenchmark(benchmark, request.node)
    timer.label = collector.spec.text
    timer(compiled, *args, **kwargs)
    request.node.stash[CALLED_KEY] = True
    assert timer.figures is not None
    counters = timer.figures.counters
    share = counters.dut_share
    benchmark.extra_info["asic_dut_share"] = share if share is not None else 0.0


_CHECKS: dict[str, Callable[..., None]] = {
    "compiles_whole": _compiles_whole,
    "no_recompile": _no_recompile,
    "exports": _exports,
    "on_dut": _on_dut,
    "benchmark": _benchmark,
}
