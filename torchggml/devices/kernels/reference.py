"""The torch reference table: every op family's kernels in plain torch, on any torch device.
It is the CPU's table and the fallback of every other device's table."""
from . import attention, binary, copy, custom, glu, math, matmul, norm, reduce, rope, rows, shape, training, unary
from . import recurrent
from .table import KernelTable
from . import conv, deepseek, image, regions

FAMILIES = (attention, binary, copy, custom, glu, math, matmul, norm, reduce, rope, rows, shape, training, unary)
FAMILIES += (conv, deepseek, image, regions)
FAMILIES += (recurrent,)

TORCH_KERNELS = KernelTable.merged("torch", [family.KERNELS for family in FAMILIES])
