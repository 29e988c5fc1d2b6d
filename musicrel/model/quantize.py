"""Weight-only int8 for decoding on a CPU: `load_model(..., weights="int8")`, what the service and the
commands that generate use by default.

A decoding step at batch 1 multiplies one row of activations by every weight matrix once: it is bound by
reading the weights, not by arithmetic. The shipped 9.5 M model's float32 weights are 38 MB, more than this
machine's caches keep close, so every step streams them from memory: its matrix products took 2.8 of a step's
5.0 ms, where the same products on weights already in cache take 0.7. int8 reads a quarter of the bytes. Every
Linear but the output head keeps its weights as int8 with one scale per output row (absmax) and multiplies
them with bfloat16 activations (`aten._weight_int8pack_mm`, the kernel gpt-fast's int8 mode uses); the product
is float32 again before the bias, so the residual stream, attention, layer norms, the embedding and the head
(tied to the embedding) stay float32. Measured in docs/BENCHMARKS.md: held-out NLL moves by under 0.001
nats/token; decoding at batch 1 is 1.7x faster for the shipped model, 2.3x for one of 22 M parameters.

Whether int8 pays depends on the machine: on a CPU whose cache holds the float32 weights (a recent Xeon with a
300 MB L3) it gained nothing. So `weights="auto"` (the default) times a few decoding steps both ways on the
loaded model and keeps the faster (`faster_weights`, a fraction of a second); `held_weights` says which.

On a GPU the int8 kernel is not there: `int8` and `auto` hold bfloat16 weights instead (`GPU_WEIGHTS`: the
whole model in bfloat16, its KV cache too, half the bytes a step reads; `float32` pins float32 there too).

Only for a loaded model that decodes: training, fine-tuning and `musicrel evaluate` keep float32 weights
unless asked, and a quantized model is never saved (a checkpoint folder stays what it always was).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from musicrel.model.weights import GPU_WEIGHTS

INT8_MAX = 127
# aten._weight_int8pack_mm reads its rows in blocks: on this machine a row of 8 gave wrong sums and rows of
# other lengths not a multiple of 16 crashed the process. A layer is quantized only where its shape is one
# PyTorch's own tests give the kernel and the kernel agrees with the plain product at load; any other stays
# float32 (multiplying dequantized weights on every call would be slower than float32).
KERNEL_IN_MULTIPLE = 64
KERNEL_OUT_MULTIPLE = 16
# A prefill multiplies many rows at once and is bound by arithmetic, where float32's GEMM beats the int8
# kernel (the shipped model's 800-token prefill: 141 ms float32, 192 ms through the kernel, 148 ms through
# weights dequantized for the call): from this many rows on, the layer multiplies dequantized weights.
DEQUANTIZE_ROWS = 256
# What `int8` and `auto` hold on a GPU, where the int8 kernel is not: tensor cores take bfloat16 natively.
GPU_WEIGHTS_DTYPE = torch.bfloat16


class Int8Linear(nn.Module):
    """An nn.Linear whose weight is int8 (out, in) times a bfloat16 scale per output row. `kernel`: whether
    the int8 kernel takes this shape here (quantize_int8 keeps the float32 layer where it does not)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        scales = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / INT8_MAX  # (out,)
        # Parameters (without gradients) so that num_parameters() still counts them.
        self.weight = nn.Parameter(torch.round(w / scales[:, None]).to(torch.int8), requires_grad=False)
        self.register_buffer("scales", scales.to(torch.bfloat16))
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.kernel = self._kernel_agrees()

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The weight the int8 values and scales stand for, (out, in)."""
        return dequantize(self.weight, self.scales, dtype)

    def dequantized(self, x: Tensor) -> Tensor:
        """x (N, in) -> (N, out) through the dequantized weights: the product the kernel stands for."""
        return F.linear(x.to(torch.bfloat16).float(), self.dequantized_weight())

    def _kernel_agrees(self) -> bool:
        if self.weight.device.type != "cpu" or self.in_features % KERNEL_IN_MULTIPLE:
            return False
        if self.out_features % KERNEL_OUT_MULTIPLE:
            return False
        # 5 rows: a block of rows and a remainder, as a batch of decoding rows may be
        x = torch.randn(5, self.in_features, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            got = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.weight, self.scales).float()
            want = self.dequantized(x)
        return bool((got - want).abs().max() <= 0.02 * want.abs().max() + 1e-6)

    def forward(self, x: Tensor) -> Tensor:
        y = int8_linear(x.reshape(-1, self.in_features), self.weight, self.scales, self.bias)  # (N, out)
        return y.view(*x.shape[:-1], self.out_features)

    def as_function(self) -> Callable[[Tensor], Tensor]:
        """`forward` of (N, in) rows as a plain function of this layer's tensors (references: seen as they
        are when called), for the decoding step, where a module call costs as much as a small kernel."""
        return partial(int8_linear, weight=self.weight, scales=self.scales, bias=self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def dequantize(weight: Tensor, scales: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """int8 (out, in) times a scale per output row -> the weight they stand for, (out, in) in `dtype`."""
    return weight.to(dtype) * scales.to(dtype)[:, None]


def int8_linear(x: Tensor, weight: Tensor, scales: Tensor, bias: Tensor | None) -> Tensor:
    """x (N, in) -> (N, out): x times int8 `weight` (out, in) and its `scales`, plus `bias` (Int8Linear)."""
    if x.is_cpu and x.size(0) < DEQUANTIZE_ROWS:
        y = torch._weight_int8pack_mm(x.to(torch.bfloat16), weight, scales)  # bfloat16 (aten's kernel)
        # bias + y promotes y to float32 first: the same sums as casting and adding, one call fewer
        return y.to(x.dtype) if bias is None else bias + y
    y = F.linear(x, dequantize(weight, scales, x.dtype))  # a prefill, or off the CPU: dequantized
    return y if bias is None else y.add_(bias)  # y is this call's own tensor


# The probe of weights="auto": this many decoding steps per round, over a context of this many positions (a
# typical step's attention), in this many rounds alternating int8 and float32; each side's fastest round
# counts (a shared machine only ever slows a round down).
PROBE_STEPS = 3
PROBE_CONTEXT = 256
PROBE_ROUNDS = 3
# A process probes each model shape once (per thread count): every later load of it holds what the first
# chose, so a process that loads a model twice (a test, an evaluation, a command run twice) decodes a seed
# the same way each time. Another process probes again: pin MUSICREL_WEIGHTS / --weights to fix it there.
_VERDICTS: dict[tuple[str, int], dict[str, float]] = {}


def _int8_layers(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear, Int8Linear]]:
    """(parent, name, the float32 layer, its int8 twin) for every nn.Linear but the output head whose shape
    the int8 kernel takes on this CPU (KERNEL_IN_MULTIPLE, KERNEL_OUT_MULTIPLE)."""
    head = getattr(model, "head", None)
    layers = []
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child is not head:
                quantized = Int8Linear(child)
                if quantized.kernel:
                    layers.append((module, name, child, quantized))
    return layers


def quantize_int8(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` but its output head by an Int8Linear where the int8 kernel takes
    its shape on this CPU (KERNEL_IN_MULTIPLE, KERNEL_OUT_MULTIPLE), in place; returns `model`."""
    for module, name, _, quantized in _int8_layers(model):
        setattr(module, name, quantized)
    return model


def faster_weights(model: nn.Module) -> nn.Module:
    """`model` holding int8 weights where that decodes faster on this machine, else as it is (float32): a
    few one-token steps of each, timed (PROBE_*); the verdict is `held_weights(model)` afterwards. Off the
    CPU, or with no layer the kernel takes, there is nothing to choose."""
    if next(model.parameters()).device.type != "cpu":
        return model
    layers = _int8_layers(model)
    if not layers:
        return model
    key = (repr(model.cfg), torch.get_num_threads())
    seconds = _VERDICTS.get(key)
    if seconds is None:
        seconds = {"float32": _probe(model), "int8": 0.0}
        for module, name, _, quantized in layers:
            setattr(module, name, quantized)
        seconds["int8"] = _probe(model)
        for _ in range(PROBE_ROUNDS - 1):  # alternate: load on a shared machine hits both alike
            for held in ("float32", "int8"):
                for module, name, linear, quantized in layers:
                    setattr(module, name, quantized if held == "int8" else linear)
                seconds[held] = min(seconds[held], _probe(model))
        _VERDICTS[key] = seconds
    held = "int8" if seconds["int8"] < seconds["float32"] else "float32"
    for module, name, linear, quantized in layers:
        setattr(module, name, quantized if held == "int8" else linear)
    model.weights_probe = {f"{k}_step_ms": round(1e3 * v, 3) for k, v in seconds.items()}
    return model


@torch.inference_mode()
def _probe(model: nn.Module) -> float:
    """Seconds per one-token step of `model` over PROBE_CONTEXT cached positions (the fastest of
    PROBE_STEPS, after one untimed step)."""
    context = min(PROBE_CONTEXT, model.cfg.max_seq_len - 1)
    cache = model.new_cache(1, context + 1)
    token = torch.zeros(1, dtype=torch.long)
    decode = model.decoder()
    best = float("inf")
    for step in range(PROBE_STEPS + 1):
        cache.length = context  # the same step every time: attention over `context` positions
        start = time.perf_counter()
        decode(token, cache)
        if step:
            best = min(best, time.perf_counter() - start)
    return best


def hold_weights(model: nn.Module, weights: str) -> nn.Module:
    """`model` with its weights held as `weights` (DECODE_WEIGHTS: "auto" the faster of int8 and float32
    here, `faster_weights`) while it decodes; returns it. On a GPU, "int8" and "auto" hold GPU_WEIGHTS."""
    if next(model.parameters()).device.type == "cuda":
        return model.to(gpu_dtype(weights))
    if weights == "auto":
        return faster_weights(model)
    return quantize_int8(model) if weights == "int8" else model


def gpu_dtype(weights: str) -> torch.dtype:
    """The dtype a model holds on a GPU for `weights` (DECODE_WEIGHTS): float32 when pinned, else bfloat16."""
    return torch.float32 if weights == "float32" else GPU_WEIGHTS_DTYPE


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, Int8Linear) for m in model.modules())


def held_weights(model: nn.Module) -> str:
    """How `model` holds its weights now (HELD_WEIGHTS, or GPU_WEIGHTS on a GPU): what reports say, whatever
    was asked for."""
    if next(model.parameters()).dtype == GPU_WEIGHTS_DTYPE:
        return GPU_WEIGHTS
    return "int8" if is_quantized(model) else "float32"
