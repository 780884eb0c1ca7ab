"""AsicConfig: presets, TOML, the environment variable, keys, and every validation message."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from asic_backend.sim.config import ENV_VAR, PRESETS, AsicConfig


def test_presets() -> None:
    assert set(PRESETS) >= {"default", "tpu_v1", "gemmini"}
    assert AsicConfig() == AsicConfig.preset("default")
    default = PRESETS["default"]
    assert (default.rows, default.cols, default.clock_hz) == (128, 128, 1e9)
    tpu = PRESETS["tpu_v1"]
    assert (tpu.rows, tpu.cols, tpu.clock_hz, tpu.dram_bw_bytes_per_s) == (256, 256, 700e6, 34e9)
    assert (PRESETS["gemmini"].rows, PRESETS["gemmini"].cols) == (16, 16)
    for name, cfg in PRESETS.items():
        assert cfg.name == name
        assert cfg.key == name
        assert (cfg.acc_overflow, cfg.requant_rounding) == ("wrap", "tflite")
    with pytest.raises(TypeError):
        PRESETS["mine"] = default  # type: ignore[index]


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        AsicConfig().rows = 3  # type: ignore[misc]


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown ASIC preset 'tpu'; known presets: default, "):
        AsicConfig.preset("tpu")


def test_key_is_stable_and_names_modified_configs() -> None:
    small = AsicConfig().replace(rows=64)
    assert re.fullmatch(r"default-[0-9a-f]{10}", small.key)
    assert AsicConfig(rows=64).key == small.key
    assert small.replace(cols=64).key != small.key
    assert small.replace(rows=128).key == "default"
    # A preset's fields under another name are another device.
    assert PRESETS["gemmini"].replace(name="mine").key.startswith("mine-")


def test_replace_validates() -> None:
    with pytest.raises(
        ValueError, match=r"unknown AsicConfig field\(s\) 'row'; allowed: name, rows"
    ):
        AsicConfig().replace(row=3)
    with pytest.raises(ValueError, match=r"AsicConfig.rows must be a positive integer, got 0"):
        AsicConfig().replace(rows=0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "", r"AsicConfig.name must be a non-empty string, got ''"),
        ("name", 3, r"AsicConfig.name must be a non-empty string, got 3"),
        ("rows", 0, r"AsicConfig.rows must be a positive integer, got 0"),
        ("rows", -4, r"AsicConfig.rows must be a positive integer, got -4"),
        ("rows", True, r"AsicConfig.rows must be a positive integer, got True"),
        ("cols", 1.5, r"AsicConfig.cols must be a positive integer, got 1.5"),
        ("cols", "128", r"AsicConfig.cols must be a positive integer, got '128'"),
        ("inp_sram_bytes", 0, r"AsicConfig.inp_sram_bytes must be a positive integer, got 0"),
        ("wgt_sram_bytes", -1, r"AsicConfig.wgt_sram_bytes must be a positive integer, got -1"),
        ("acc_sram_bytes", 0, r"AsicConfig.acc_sram_bytes must be a positive integer, got 0"),
        ("clock_hz", 0, r"AsicConfig.clock_hz must be a positive finite number, got 0"),
        (
            "clock_hz",
            float("nan"),
            r"AsicConfig.clock_hz must be a positive finite number, got nan",
        ),
        ("clock_hz", "1GHz", r"AsicConfig.clock_hz must be a positive finite number, got '1GHz'"),
        (
            "dram_bw_bytes_per_s",
            float("inf"),
            r"AsicConfig.dram_bw_bytes_per_s must be a positive finite number, got inf",
        ),
        ("dataflow", "rs", r"AsicConfig.dataflow must be one of ws, os, is; got 'rs'"),
        ("weight_buffers", 3, r"AsicConfig.weight_buffers must be 1 \(single-buffered\) or 2"),
        ("weight_buffers", True, r"AsicConfig.weight_buffers must be 1"),
        ("weight_buffers", 2.0, r"AsicConfig.weight_buffers must be 1"),  # one key per config
        ("acc_overflow", "clip", r"AsicConfig.acc_overflow must be one of wrap, saturate; got"),
        (
            "requant_rounding",
            "rne",
            r"AsicConfig.requant_rounding must be one of tflite, float64_rne; got 'rne'",
        ),
    ],
)
def test_validation_messages(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}") as info:
        AsicConfig(**{field: value})  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_numbers_are_normalized() -> None:
    assert AsicConfig(clock_hz=1_000_000_000) == AsicConfig()
    assert type(AsicConfig(clock_hz=1_000_000_000).clock_hz) is float


def write(tmp_path: Path, text: str, name: str = "asic.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_from_toml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'preset = "tpu_v1"\nrows = 128\nacc_overflow = "saturate"\nclock_hz = 700000000\n',
    )
    cfg = AsicConfig.from_toml(path)
    assert cfg == PRESETS["tpu_v1"].replace(rows=128, acc_overflow="saturate")
    assert cfg.name == "tpu_v1"
    assert cfg.key.startswith("tpu_v1-")
    # The same fields as a preset are that preset, whatever the spelling of the numbers.
    same = write(tmp_path, 'preset = "tpu_v1"\nclock_hz = 700000000\n', "same.toml")
    assert AsicConfig.from_toml(same).key == "tpu_v1"
    # No preset: the default is the base.
    assert AsicConfig.from_toml(write(tmp_path, 'name = "lab"\n', "lab.toml")).key.startswith(
        "lab-"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rowz = 3\n", r"unknown AsicConfig field\(s\) 'rowz'; allowed: preset, name, rows"),
        ("rows = 0\n", r"AsicConfig.rows must be a positive integer, got 0"),
        ('rows = "128"\n', r"AsicConfig.rows must be a positive integer, got '128'"),
        ('preset = "tpu"\n', r"unknown ASIC preset 'tpu'; known presets"),
        ("[asic]\nrows = 3\n", r"unknown AsicConfig field\(s\) 'asic'"),
        ("rows = \n", r"is not valid TOML"),
    ],
)
def test_bad_toml(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ValueError, match=f"^ASIC config file '{re.escape(str(path))}'.*{message}"):
        AsicConfig.from_toml(path)


def test_missing_toml(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ASIC config file '.*nope.toml' does not exist"):
        AsicConfig.from_toml(tmp_path / "nope.toml")


def test_load(tmp_path: Path) -> None:
    assert AsicConfig.load("gemmini") is PRESETS["gemmini"]
    path = write(tmp_path, "cols = 8\n")
    assert AsicConfig.load(str(path)).cols == 8
    with pytest.raises(ValueError, match=r"ASIC config 'gemini' is neither a preset \(default, "):
        AsicConfig.load("gemini")


def test_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert AsicConfig.from_env() == PRESETS["default"]
    monkeypatch.setenv(ENV_VAR, "")
    assert AsicConfig.from_env() == PRESETS["default"]
    monkeypatch.setenv(ENV_VAR, "gemmini")
    assert AsicConfig.from_env() == PRESETS["gemmini"]
    monkeypatch.setenv(ENV_VAR, str(write(tmp_path, 'dataflow = "os"\n')))
    assert AsicConfig.from_env().dataflow == "os"
    monkeypatch.setenv(ENV_VAR, "tpu-v1")
    with pytest.raises(
        ValueError, match=r"^\$ASIC_BACKEND_CONFIG: ASIC config 'tpu-v1' is neither"
    ):
        AsicConfig.from_env()


def test_toml_sets_the_dataflow_and_weight_buffers(tmp_path: Path) -> None:
    cfg = AsicConfig.from_toml(write(tmp_path, 'name = "lab"\nweight_buffers = 2\n'))
    assert (cfg.dataflow, cfg.weight_buffers) == ("ws", 2)
    assert AsicConfig.from_toml(write(tmp_path, 'dataflow = "is"\n')).dataflow == "is"
    bad = write(tmp_path, 'dataflow = "is"\nweight_buffers = 2\n', "bad.toml")
    with pytest.raises(
        ValueError, match=r"^ASIC config file .*bad\.toml'?: AsicConfig\.weight_buf"
    ):
        AsicConfig.from_toml(bad)
