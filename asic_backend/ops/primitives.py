"""The DUT's low-level ops, ``torch.ops.asic.*``, as ``torch.library`` ops (see ``oplib``).

Each op runs the simulator (numerics + cycle count on the named device) in its real kernel; its
fake kernel checks shapes and dtypes and allocates the output, never reading data, so Dynamo,
AOTAutograd and Inductor trace through it with fake or symbolic shapes (no
``_local_scalar_dense``). ``device`` is a device key, preset name or TOML path, resolved by
:func:`asic_backend.sim.device.get_device`; pass ``get_device(config).key``.

* ``asic::mm_i32(Tensor a_q, Tensor w_q, Tensor? bias_i32, Tensor a_zp, str device) -> Tensor``:
  int32 [M,N]; ``a_zp`` is int32, ``[]``/``[1]``/``[1,1]`` per tensor or ``[M,1]`` per row.
* ``asic::linear_requant(Tensor a_q, Tensor w_q, Tensor? bias_i32, int a_zp, Tensor multiplier,
  Tensor shift, int out_zp, int qmin, int qmax, str device) -> Tensor``: int8 [M,N].

>>> import asic_backend.ops.primitives
>>> key = get_device("gemmini").key
>>> a_q = torch.randint(-128, 128, (8, 64), dtype=torch.int8)
>>> w_q = torch.randint(-128, 128, (32, 64), dtype=torch.int8)
>>> torch.ops.asic.mm_i32(a_q, w_q, None, torch.tensor(0, dtype=torch.int32), key).shape
torch.Size([8, 32])
"""

from __future__ import annotations

import torch

from asic_backend.ops.library import dut_op
from asic_backend.sim import numerics
from asic_backend.sim.device import get_device, run_linear_requant, run_mm_i32


@dut_op("asic::mm_i32")
def mm_i32(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    bias_i32: torch.Tensor | None,
    a_zp: torch.Tensor,
    device: str,
) -> torch.Tensor:
    """int8 [M,K] · int8 [N,K]ᵀ − a_zp·rowsum(w_q) + bias_i32 -> int32 [M,N], on ``device``."""
    return run_mm_i32(a_q, w_q, a_zp=a_zp, bias_i32=bias_i32, device=get_device(device))


@mm_i32.register_fake
def _mm_i32_fake(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    bias_i32: torch.Tensor | None,
    a_zp: torch.Tensor,
    device: str,
) -> torch.Tensor:
    numerics.check_gemm_operands(a_q, w_q, bias_i32)
    numerics.check_a_zp_tensor(a_zp, a_q.shape[0])
    get_device(device)  # an unknown device fails at trace time, not at the first run
    return a_q.new_empty((a_q.shape[0], w_q.shape[0]), dtype=torch.int32)


@dut_op("asic::linear_requant")
def linear_requant(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    bias_i32: torch.Tensor | None,
    a_zp: int,
    multiplier: torch.Tensor,
    shift: torch.Tensor,
    out_zp: int,
    qmin: int,
    qmax: int,
    device: str,
) -> torch.Tensor:
    """The int8-out linear: accumulate, requantize by multiplier/shift, add out_zp, clamp."""
    return run_linear_requant(
        a_q,
        w_q,
        a_zp=a_zp,
        bias_i32=bias_i32,
        multiplier=multiplier,
        shift=shift,
        out_zp=out_zp,
        qmin=qmin,
        qmax=qmax,
        device=get_device(device),
    )


@linear_requant.register_fake
def _linear_requant_fake(
    a_q: torch.Tensor,
    w_q: torch.Tensor,
    bias_i32: torch.Tensor | None,
    a_zp: int,
    multiplier: torch.Tensor,
    shift: torch.Tensor,
    out_zp: int,
    qmin: int,
    qmax: int,
    device: str,
) -> torch.Tensor:
    numerics.check_gemm_operands(a_q, w_q, bias_i32)
    numerics.check_requant_params(multiplier, shift, w_q.shape[0])
    numerics.check_int8_qparams(a_zp, out_zp, qmin, qmax)
    get_device(device)
    return a_q.new_empty((a_q.shape[0], w_q.shape[0]), dtype=torch.int8)
