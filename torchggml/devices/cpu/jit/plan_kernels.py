"""A run of a compiled plan's bound kernels in one native call (native_plan.py encodes them).

    run_program(arrays, program, floats, status) -> -1, or the row of a kernel that reported a
                                                    bad row index (its position in status[0])

Each row of `program` (int64 [rows, PROGRAM_WIDTH]) is one call: its opcode (the position of
its kernel and argument types in OPS), then its arguments but floats in order: an array as its
row of `arrays` (int64 [n, 5]: the address of its first element and its shape, right-aligned
in four dims; C-contiguous), an int or bool as itself. Its floats are that row of `floats`
(float64 [rows, FLOAT_WIDTH]; "f4" ones are converted back to float32). The kernels are the
ones the bound calls name, called with the same values and types, so a run computes exactly
what the calls one by one compute; the arrays' memory is the caller's to keep alive.
"""
import numpy as np
from numba import carray, get_num_threads, njit, types
from numba.extending import intrinsic

from .op_kernels import add_norm_mul, binary, copy, decode_attention, glu, half_matvec, norm_mul, rope_shared, row_norm, scale, set_rows
from .quant_kernels import rows_block_matvecs, rows_matvec

# (kernel name, argument types): an array as dtype/ndim, "i" an int, "b" a bool, "f4"/"f8" a
# float32/float64 scalar. The opcode is the position; run_program has a branch for each.
OPS = (
    ("rows_block_matvecs", "u1/2 u1/2 u1/2 i f4/2 i1/2 f4/2 f4/2 i2/2 i4/2 i8/1 i8/1 f4/2 f4/2 f4/2"),
    ("half_matvec", "u2/2 f4/2 f4/2"),
    ("binary", "f4/4 f4/4 f4/4 i"),
    ("row_norm", "f4/4 f4/4 f4 b"),
    ("set_rows", "f4/4 i8/3 u2/4"),
    # rope's calls, with a table of angles the run's calls of the same positions share (native_plan)
    ("rope_shared", "f4/4 f4/4 i4/1 f4/1 f8/1 f8/2 b f8 f8 i i b b f4/3 i8/1"),
    ("decode_attention", "u2/1 u2/1 i8/1 i i f4/3 u2/2 b f4 f4/3 f4/3 i"),
    ("copy", "f4/4 f4/4"),
    ("glu", "f4/4 f4/4 f4/4 b"),
    # the converted layout's matvec: its 2-D weights' int8 q (the 4-bit types' 2-D weights,
    # Q4_0, Q4_1 and Q4_K, are multiplied on their blocks in place)
    ("rows_matvec", "i1/2 f4/2 f4/2 b i b f4/2 i1/2 f4/2 f4/2 i8/1 i8/1 f4/2"),
    ("scale", "f4/4 f4/4 f4 f4"),
    ("norm_mul", "f4/4 f4/4 f4/4 f4 b"),
    ("add_norm_mul", "f4/4 f4/4 f4/4 f4/4 f4/4 f4 b"),
)
# Only the types of a decode step with the default F16 KV cache: each branch compiles when the
# program does (a first use after an install: ~4 s for an attention variant), and the other
# calls run one by one as before.
PROGRAM_WIDTH = 16
FLOAT_WIDTH = 4

# numba starts its threading layer when a parallel kernel is first called from Python, not when
# cached code that calls one is loaded: run_program's would crash in a process whose first
# kernel it is. get_num_threads() starts it.
get_num_threads()


def _pointer_intrinsic(element):
    """as_pointer(address): an int64 address as a pointer to `element` values (for carray)."""
    @intrinsic
    def as_pointer(typingctx, address):
        if not isinstance(address, types.Integer):
            return None
        pointer = types.CPointer(element)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(pointer))
        return pointer(address), codegen
    return as_pointer


_f4, _f8, _u1, _u2 = (_pointer_intrinsic(t) for t in (types.float32, types.float64, types.uint8, types.uint16))
_i1, _i2, _i4, _i8 = (_pointer_intrinsic(t) for t in (types.int8, types.int16, types.int32, types.int64))


# the arrays of the table: row i as a C-contiguous array of the given type and rank
@njit(cache=True, inline="always")
def f4_1(a, i):
    return carray(_f4(a[i, 0]), (a[i, 4],))


@njit(cache=True, inline="always")
def f4_2(a, i):
    return carray(_f4(a[i, 0]), (a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def f4_3(a, i):
    return carray(_f4(a[i, 0]), (a[i, 2], a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def f4_4(a, i):
    return carray(_f4(a[i, 0]), (a[i, 1], a[i, 2], a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def f8_1(a, i):
    return carray(_f8(a[i, 0]), (a[i, 4],))


@njit(cache=True, inline="always")
def f8_2(a, i):
    return carray(_f8(a[i, 0]), (a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def u1_2(a, i):
    return carray(_u1(a[i, 0]), (a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def u2_1(a, i):
    return carray(_u2(a[i, 0]), (a[i, 4],))


@njit(cache=True, inline="always")
def u2_2(a, i):
    return carray(_u2(a[i, 0]), (a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def u2_4(a, i):
    return carray(_u2(a[i, 0]), (a[i, 1], a[i, 2], a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def i1_2(a, i):
    return carray(_i1(a[i, 0]), (a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def i2_2(a, i):
    return carray(_i2(a[i, 0]), (a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def i4_2(a, i):
    return carray(_i4(a[i, 0]), (a[i, 3], a[i, 4]))


@njit(cache=True, inline="always")
def i4_1(a, i):
    return carray(_i4(a[i, 0]), (a[i, 4],))


@njit(cache=True, inline="always")
def i8_1(a, i):
    return carray(_i8(a[i, 0]), (a[i, 4],))


@njit(cache=True, inline="always")
def i8_3(a, i):
    return carray(_i8(a[i, 0]), (a[i, 2], a[i, 3], a[i, 4]))


@njit(cache=True, nogil=True)
def run_program(a, program, floats, status):
    for r in range(program.shape[0]):
        p, f = program[r], floats[r]
        op = p[0]
        if op == 0:
            rows_block_matvecs(u1_2(a, p[1]), u1_2(a, p[2]), u1_2(a, p[3]), p[4], f4_2(a, p[5]), i1_2(a, p[6]),
                               f4_2(a, p[7]), f4_2(a, p[8]), i2_2(a, p[9]), i4_2(a, p[10]), i8_1(a, p[11]),
                               i8_1(a, p[12]), f4_2(a, p[13]), f4_2(a, p[14]), f4_2(a, p[15]))
        elif op == 1:
            half_matvec(u2_2(a, p[1]), f4_2(a, p[2]), f4_2(a, p[3]))
        elif op == 2:
            binary(f4_4(a, p[1]), f4_4(a, p[2]), f4_4(a, p[3]), p[4])
        elif op == 3:
            row_norm(f4_4(a, p[1]), f4_4(a, p[2]), np.float32(f[0]), p[3] != 0)
        elif op == 4:
            bad = set_rows(f4_4(a, p[1]), i8_3(a, p[2]), u2_4(a, p[3]))
            if bad >= 0:
                status[0] = bad
                return r
        elif op == 5:
            rope_shared(f4_4(a, p[1]), f4_4(a, p[2]), i4_1(a, p[3]), f4_1(a, p[4]), f8_1(a, p[5]), f8_2(a, p[6]),
                        p[7] != 0, f[0], f[1], p[8], p[9], p[10] != 0, p[11] != 0, f4_3(a, p[12]), i8_1(a, p[13]))
        elif op == 6:
            decode_attention(u2_1(a, p[1]), u2_1(a, p[2]), i8_1(a, p[3]), p[4], p[5], f4_3(a, p[6]), u2_2(a, p[7]),
                             p[8] != 0, np.float32(f[0]), f4_3(a, p[9]), f4_3(a, p[10]), p[11])
        elif op == 7:
            copy(f4_4(a, p[1]), f4_4(a, p[2]))
        elif op == 8:
            glu(f4_4(a, p[1]), f4_4(a, p[2]), f4_4(a, p[3]), p[4] != 0)
        elif op == 9:
            rows_matvec(i1_2(a, p[1]), f4_2(a, p[2]), f4_2(a, p[3]), p[4] != 0, p[5], p[6] != 0, f4_2(a, p[7]),
                        i1_2(a, p[8]), f4_2(a, p[9]), f4_2(a, p[10]), i8_1(a, p[11]), i8_1(a, p[12]), f4_2(a, p[13]))
        elif op == 10:
            scale(f4_4(a, p[1]), f4_4(a, p[2]), np.float32(f[0]), np.float32(f[1]))
        elif op == 11:
            norm_mul(f4_4(a, p[1]), f4_4(a, p[2]), f4_4(a, p[3]), np.float32(f[0]), p[4] != 0)
        elif op == 12:
            add_norm_mul(f4_4(a, p[1]), f4_4(a, p[2]), f4_4(a, p[3]), f4_4(a, p[4]), f4_4(a, p[5]), np.float32(f[0]),
                         p[6] != 0)
    return -1
