"""The names of how a loaded model holds its weights while it decodes, in one torch-free place: the
checkpoint loader, the quantizer and the server's schemas all speak them."""

# How a loaded model holds its weights while it decodes (musicrel.model.quantize; training, fine-tuning and
# `musicrel evaluate` load float32): "int8" (the default) where the CPU's kernel takes a layer; "auto" holds
# int8 where a probe of a few steps at load finds it faster on the machine at hand, else float32. Not the
# default: on this AMD EPYC the probe's margin was 8 % (6.3 vs 6.8 ms a step) where decoding is 1.3x faster
# with int8, and a served model probed beside the other models' loading chose float32; int8 was never slower
# where measured (a Xeon whose cache holds the float32 weights: 3.5x vs 3.4x real time).
HELD_WEIGHTS = ("int8", "float32")
DECODE_WEIGHTS = ("auto", *HELD_WEIGHTS)
DEFAULT_DECODE_WEIGHTS = "int8"
# What int8 and auto hold on a GPU (musicrel.model.quantize: the int8 kernel is CPU-only)
GPU_WEIGHTS = "bfloat16"
