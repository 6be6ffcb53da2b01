"""Model FLOP utilisation: FLOPs a training step needs, against the device's peak.

``count_train_flops`` counts one forward and backward pass with ``torch.utils.flop_counter``
(matrix multiplies and convolutions: what dominates a step). ``peak_flops`` looks the device up
in a table of vendor datasheet peaks for dense 16-bit (bf16/fp16) tensor math, or fp32 when
asked; MFU is then ``flops_per_step / step_time / peak``.
"""

from __future__ import annotations

from typing import Any

# Dense (no sparsity) peak FLOP/s per device from vendor datasheets: (bf16/fp16, fp32).
# Matched as substrings of torch.cuda.get_device_name(), most specific first.
PEAK_FLOPS: tuple[tuple[str, float, float], ...] = (
    ("H200", 989e12, 67e12),
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),           # SXM5
    ("GH200", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),         # fp32 without TF32
    ("A40", 149.7e12, 37.4e12),
    ("L40S", 362e12, 91.6e12),
    ("V100", 125e12, 15.7e12),         # SXM2 tensor cores
    ("P100", 21.2e12, 10.6e12),
    ("MI300X", 1307e12, 163.4e12),
    ("MI250X", 191.5e12, 47.9e12),     # per GCD (torch sees each GCD as one device)
    ("MI250", 181e12, 45.3e12),        # per GCD
    ("MI210", 181e12, 45.3e12),
    ("MI100", 184.6e12, 23.1e12),
)


def peak_flops(device_name: str, *, fp32: bool = False) -> float | None:
    """Datasheet peak FLOP/s for a device name, or None when it is not in the table."""
    name = device_name.upper()
    for key, half, single in PEAK_FLOPS:
        if key.upper() in name:
            return single if fp32 else half
    return None


def count_train_flops(model: Any, example: Any, *, loss_fn: Any = None) -> int:
    """FLOPs of one forward and backward pass of ``model`` on ``example`` (a batch).

    The gradients this computes are cleared afterwards, so it can run before training. Divide
    by the batch size for FLOPs per sample.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        out = model(example) if not isinstance(example, (tuple, list)) else model(*example)
        if isinstance(out, (tuple, list)):
            out = out[0]
        loss = loss_fn(out) if loss_fn is not None else out.float().sum()
        loss.backward()
    for p in model.parameters():
        p.grad = None
    return int(counter.get_total_flops())
