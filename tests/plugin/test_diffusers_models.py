"""``--nobreak-model diffusers:<ModelClass>`` and ``diffusers:*``: a UNet, a VAE and a diffusion
transformer through the generated checks, the sweep and its skips, bad SPECs as usage errors,
and the rules that shrink a config and make its inputs.

The checks that only read Dynamo's verdict compile with the ``eager`` backend (the default of
the generated checks without ``--asic-backend``); ``on_dut`` runs alone under the ASIC.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

from pytest_nobreak.models.diffusers import Layout, diffusers_inputs, diffusers_layouts, shrink
from pytest_nobreak.models.diffusers.inputs import _frames, _spatial_factor
from pytest_nobreak.models.diffusers.shrinking import alternate
from pytest_nobreak.models.items import NAMED_NOT_SKIPPED
from pytest_nobreak.models.skips import BuildSkip
from tests.conftest import inner_pythonpath

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*QUIET, *args)


def report_of(pytester: pytest.Pytester) -> dict[str, Any]:
    tests: dict[str, Any] = json.loads((pytester.path / "r.json").read_text())["tests"]
    return tests


# ----------------------------------------------------------------------------- end to end


CLASSES = ["UNet2DConditionModel", "AutoencoderKL", "SD3Transformer2DModel"]


@pytest.mark.parametrize("name", CLASSES)
def test_a_model_class_compiles_whole_and_once_for_other_sizes(
    pytester: pytest.Pytester, name: str
) -> None:
    spec = f"diffusers:{name}"
    checks = "compiles_whole or no_recompile"
    result = run(pytester, "--nobreak-model", spec, "-k", checks, "--nobreak-json", "r.json")
    result.assert_outcomes(passed=2)
    tests = report_of(pytester)
    whole = tests[f"nobreak-model[{spec}]::compiles_whole"]
    assert (whole["marked"], whole["graphs"], whole["graph_breaks"]) == (True, 1, 0)
    # Two more latent sizes and batch sizes: the one recompile that makes them dynamic.
    assert tests[f"nobreak-model[{spec}]::no_recompile"]["recompiles"] == 1


@pytest.mark.parametrize("name", CLASSES)
def test_a_model_class_runs_on_the_dut_within_the_int8_bound(
    pytester: pytest.Pytester, name: str
) -> None:
    spec = f"diffusers:{name}"
    result = run(pytester, "--nobreak-model", spec, "--asic-backend", "-k", "on_dut",
                 "--nobreak-json", "r.json")  # fmt: skip
    result.assert_outcomes(passed=1)
    asic = report_of(pytester)[f"nobreak-model[{spec}]::on_dut"]["asic"]
    assert asic["dut_ops"] > 0
    assert (asic["host_macs"], asic["host_fallbacks"]) == (0, 0)


def test_the_sweep_is_every_model_class_and_nothing_else(pytester: pytest.Pytester) -> None:
    from pytest_nobreak.models.diffusers import diffusers_set

    members = diffusers_set("*")
    assert len(members) > 100
    assert {"diffusers:UNet2DConditionModel", "diffusers:AutoencoderKL"} <= set(members)
    assert {"diffusers:FluxTransformer2DModel", "diffusers:ControlNetModel"} <= set(members)
    # Schedulers, pipelines and the mixin itself are not models.
    assert not {"diffusers:DDPMScheduler", "diffusers:ModelMixin"} & set(members)
    assert not [m for m in members if "Pipeline" in m]
    result = run(pytester, "--nobreak-model", "diffusers:*", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "nobreak-model[[]diffusers:UNet2DConditionModel[]]::compiles_whole",
            "nobreak-model[[]diffusers:UNet2DConditionModel[]]::no_recompile",
            f"{3 * len(members)} tests collected*",
        ]
    )


def test_a_sweep_skips_what_cannot_be_built_and_a_named_one_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = ["diffusers:MultiControlNetModel", "diffusers:AutoencoderKL"]
    monkeypatch.setattr("pytest_nobreak.models.diffusers.diffusers_set", lambda name: sweep)
    reason = (
        "diffusers:MultiControlNetModel: MultiControlNetModel has no default for "
        "'controlnets': it is built from other models or data, not from a config alone"
    )
    result = run(pytester, "--nobreak-model", "diffusers:*", "-k", "compiles_whole", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED * {reason}"])

    result = run(pytester, "--nobreak-model", sweep[0], "-k", "compiles_whole")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([reason, NAMED_NOT_SKIPPED])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "diffusers:UNet2DConditonModel",
            "--nobreak-model diffusers:UNet2DConditonModel: diffusers * has no class "
            "'UNet2DConditonModel' (did you mean diffusers:UNet2DConditionModel*?)",
        ),
        (
            "diffusers:DDPMScheduler",
            "*DDPMScheduler is a class, not a model (a diffusers ModelMixin subclass)",
        ),
        ("diffusers:", "--nobreak-model diffusers:: write diffusers:<ModelClass> (a class *"),
        ("diffusers:UNet2DModel:x", "*: write diffusers:<ModelClass> *or the sweep diffusers:*"),
    ],
)
def test_bad_diffusers_specs_are_usage_errors(
    pytester: pytest.Pytester, spec: str, message: str
) -> None:
    result = run(pytester, "--nobreak-model", spec)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])


def test_diffusers_models_without_diffusers_are_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = pytester.mkdir("no_diffusers") / "diffusers"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(blocker.parent), inner_pythonpath()]))
    result = pytester.runpytest_subprocess(*QUIET, "--nobreak-model", "diffusers:*", "--co")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: --nobreak-model diffusers:...: needs diffusers, which cannot be imported *"]
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


# ----------------------------------------------------------------------------- shrinking

UNET = {
    "in_channels": 4,
    "down_block_types": ("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    "up_block_types": ("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    "block_out_channels": (320, 640, 1280, 1280),
    "layers_per_block": 2,
    "attention_head_dim": (5, 10, 20, 20),
    "cross_attention_dim": 1024,
    "norm_num_groups": 32,
    "sample_size": 96,
}
FLUX = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "caption_projection_dim": 3072,
    "axes_dims_rope": (16, 56, 56),
    "vace_layers": (0, 5, 10, 15),
}


def test_a_unet_keeps_its_first_and_last_block_narrowed() -> None:
    out = shrink(UNET)
    assert out["down_block_types"] == ("CrossAttnDownBlock2D", "DownBlock2D")
    assert out["up_block_types"] == ("UpBlock2D", "CrossAttnUpBlock2D")
    assert out["block_out_channels"] == (32, 64)
    # Heads (or head dims) a power of two that divides both widths: 5 -> 4, 20 -> 8.
    assert out["attention_head_dim"] == (4, 8)
    assert (out["layers_per_block"], out["cross_attention_dim"]) == (1, 64)
    assert (out["norm_num_groups"], out["sample_size"], out["in_channels"]) == (8, 16, 4)
    # Every block kept, narrowed, is the fallback.
    assert alternate(UNET)["block_out_channels"] == (40, 80, 160, 160)


def test_a_transformer_keeps_two_layers_of_two_heads_and_its_ties() -> None:
    out = shrink(FLUX)
    assert (out["num_layers"], out["num_single_layers"]) == (2, 2)
    assert (out["num_attention_heads"], out["attention_head_dim"]) == (2, 32)
    # The rotary axes add up to the new head dim, each even; a width equal to the old
    # attention width (24 x 128) is the new one; layer indices stay below the new depth.
    assert out["axes_dims_rope"] == (4, 14, 14)
    assert out["caption_projection_dim"] == 64
    assert (out["joint_attention_dim"], out["pooled_projection_dim"]) == (64, 64)
    assert out["vace_layers"] == (0,)
    assert out["in_channels"] == 64  # the latent's channels are the model's input: kept
    with pytest.raises(BuildSkip, match="no blocks or channel lists"):
        alternate(FLUX)


def test_channel_lists_are_divided_and_unset_sizes_filled() -> None:
    vae = {"in_channels": 3, "decoder_block_out_channels": (128, 256, 512, 512), "ch": 128,
           "ch_mult": (1, 2, 4)}  # fmt: skip
    out = shrink(vae)
    assert out["decoder_block_out_channels"] == (32, 64, 128, 128)
    assert out["ch"] == 32  # a base width that multipliers widen
    unset = shrink({"in_channels": None, "patch_size": None, "num_attention_heads": 16})
    assert (unset["in_channels"], unset["patch_size"]) == (16, 2)


# ----------------------------------------------------------------------------- inputs


def test_the_latent_side_is_a_multiple_of_the_blocks_and_the_patch() -> None:
    assert _spatial_factor({"block_out_channels": (32, 64)}) == 2
    assert _spatial_factor({"patch_size": 2, "sample_size": 16}) == 2
    assert _spatial_factor({"block_out_channels": (32, 64, 64), "patch_size": 4}) == 4
    assert _spatial_factor({"dim_mult": (1, 2, 4, 4), "scale_factor_spatial": 8}) == 8
    assert _frames({"scale_factor_temporal": 4}) == 5  # a causal VAE: 1 + 4k frames
    assert _frames({"temperal_downsample": (False, True, True)}) == 5
    assert _frames({"patch_size": (1, 2, 2)}) == 2


def built(name: str) -> torch.nn.Module:
    from pytest_nobreak.models.diffusers import build_diffusers

    return build_diffusers(name)


def shapes(model: torch.nn.Module, layout: Layout, batch: int, seq: int) -> dict[str, Any]:
    inputs = diffusers_inputs(model, batch, seq, layout)
    return {k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def test_inputs_follow_the_forward_and_the_config() -> None:
    unet = built("UNet2DConditionModel")
    layout = diffusers_layouts(unet)[0]
    assert layout == Layout("image", 2)
    assert shapes(unet, layout, 2, 16) == {
        "sample": (2, 4, 8, 8),
        "timestep": (2,),
        "encoder_hidden_states": (2, 8, 64),
        "return_dict": False,
    }
    assert shapes(unet, layout, 3, 24)["sample"] == (3, 4, 12, 12)

    flux = built("FluxTransformer2DModel")
    layout = diffusers_layouts(flux)[0]
    assert layout.kind == "tokens"
    got = shapes(flux, layout, 2, 16)
    assert (got["hidden_states"], got["img_ids"], got["txt_ids"]) == ((2, 64, 64), (64, 3), (8, 3))
    assert got["pooled_projections"] == (2, 64)

    controlnet = built("ControlNetModel")
    # The conditioning image is at the scale its embedding's 4 blocks bring down to the latent.
    cond = shapes(controlnet, diffusers_layouts(controlnet)[0], 2, 16)["controlnet_cond"]
    assert cond == (2, 3, 64, 64)


def test_export_declares_the_batch_and_the_latent_side_dynamic() -> None:
    from torch.export import Dim

    from pytest_nobreak.models.build import build
    from pytest_nobreak.models.items import _varying, _varying_dims
    from pytest_nobreak.models.spec import parse_spec

    dims = _varying_dims(build(parse_spec("diffusers:UNet2DConditionModel"), None, ()))
    assert dims == {
        "sample": {0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO},
        "timestep": {0: Dim.AUTO},
        "encoder_hidden_states": {0: Dim.AUTO},  # its 8 text tokens do not vary
        "return_dict": None,
    }
    # Inside a dict of inputs (added_cond_kwargs) too.
    one = {"text_embeds": torch.zeros(2, 4), "time_ids": torch.zeros(2, 6)}
    two = {"text_embeds": torch.zeros(3, 4), "time_ids": torch.zeros(3, 6)}
    assert _varying(one, two) == {"text_embeds": {0: Dim.AUTO}, "time_ids": {0: Dim.AUTO}}
    assert _varying([(1, 8, 8)], [(1, 12, 12)]) is None  # sizes as ints: constants
