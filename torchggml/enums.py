"""ggml's enums, named by their C suffix (GGML_OP_ADD -> Op.ADD).

Op, UnaryOp, GluOp (and types.Type) carry upstream's ids, so graphs exchanged with C ggml by id
(RPC, graph dumps) mean the same ops; torchggml defines a subset, so ids have gaps.
tests/data/ggml_enums.json holds upstream's enums at this commit; a test checks them.
"""
from enum import IntEnum, IntFlag

# ggml-org/ggml include/ggml.h at this commit is the source of the ids below
GGML_COMMIT = "d99724f2b141fed9e1a9f402213506c081433465"


class Op(IntEnum):
    NONE = 0
    DUP = 1
    ADD = 2
    ADD_ID = 3
    ADD1 = 4
    ACC = 5
    SUB = 6
    MUL = 7
    DIV = 8
    SQR = 9
    SQRT = 10
    LOG = 11
    SIN = 12
    COS = 13
    SUM = 14
    SUM_ROWS = 15
    CUMSUM = 16
    MEAN = 17
    ARGMAX = 18
    COUNT_EQUAL = 19
    REPEAT = 20
    REPEAT_BACK = 21
    CONCAT = 22
    SILU_BACK = 23
    NORM = 24
    RMS_NORM = 25
    RMS_NORM_BACK = 26
    GROUP_NORM = 27
    L2_NORM = 28
    MUL_MAT = 29
    MUL_MAT_ID = 30
    OUT_PROD = 31
    SCALE = 32
    SET = 33
    CPY = 34
    CONT = 35
    RESHAPE = 36
    VIEW = 37
    PERMUTE = 38
    TRANSPOSE = 39
    GET_ROWS = 40
    GET_ROWS_BACK = 41
    SET_ROWS = 42
    DIAG = 43
    DIAG_MASK_INF = 44
    DIAG_MASK_ZERO = 45
    SOFT_MAX = 46
    SOFT_MAX_BACK = 47
    ROPE = 48
    ROPE_BACK = 49
    CLAMP = 50
    CONV_TRANSPOSE_1D = 51
    IM2COL = 52
    POOL_1D = 60
    POOL_2D = 61
    UPSCALE = 63
    PAD = 64
    ROLL = 66
    ARANGE = 67
    TIMESTEP_EMBEDDING = 68
    ARGSORT = 69
    TOP_K = 70
    LEAKY_RELU = 71
    FLASH_ATTN_EXT = 74
    FLASH_ATTN_BACK = 75
    # recurrent layers (ops/recurrent.py)
    SSM_CONV = 76
    SSM_SCAN = 77
    RWKV_WKV6 = 82
    GATED_LINEAR_ATTN = 83
    RWKV_WKV7 = 84
    SOLVE_TRI = 85
    GATED_DELTA_NET = 86
    UNARY = 91
    MAP_CUSTOM1 = 92
    MAP_CUSTOM2 = 93
    MAP_CUSTOM3 = 94
    CUSTOM = 95
    CROSS_ENTROPY_LOSS = 96
    CROSS_ENTROPY_LOSS_BACK = 97
    OPT_STEP_ADAMW = 98
    OPT_STEP_SGD = 99
    GLU = 100
    # vision, audio and diffusion ops; matrix helpers; DeepSeek's indexer and hyper-connections
    IM2COL_BACK = 53
    IM2COL_3D = 54
    COL2IM_1D = 55
    CONV_2D = 56
    CONV_3D = 57
    CONV_2D_DW = 58
    CONV_TRANSPOSE_2D = 59
    POOL_2D_BACK = 62
    PAD_REFLECT_1D = 65
    TRI = 72
    FILL = 73
    WIN_PART = 78
    WIN_UNPART = 79
    GET_REL_POS = 80
    ADD_REL_POS = 81
    LIGHTNING_INDEXER = 87
    DSV4_HC_COMB = 88
    DSV4_HC_PRE = 89
    DSV4_HC_POST = 90


class UnaryOp(IntEnum):
    ABS = 0
    SGN = 1
    NEG = 2
    STEP = 3
    TANH = 4
    ELU = 5
    RELU = 6
    SIGMOID = 7
    GELU = 8
    GELU_QUICK = 9
    SILU = 10
    HARDSWISH = 11
    HARDSIGMOID = 12
    EXP = 13
    GELU_ERF = 16
    XIELU = 17
    FLOOR = 18
    CEIL = 19
    ROUND = 20
    TRUNC = 21
    EXPM1 = 14
    SOFTPLUS = 15


class GluOp(IntEnum):
    REGLU = 0
    GEGLU = 1
    SWIGLU = 2
    SWIGLU_OAI = 3
    GEGLU_ERF = 4
    GEGLU_QUICK = 5


class SortOrder(IntEnum):
    ASC = 0
    DESC = 1


class OpPool(IntEnum):
    MAX = 0
    AVG = 1


class ScaleMode(IntEnum):
    """interpolate's mode (the low byte); ScaleFlag bits may be or-ed in."""
    NEAREST = 0
    BILINEAR = 1
    BICUBIC = 2


class ScaleFlag(IntFlag):
    ALIGN_CORNERS = 1 << 8
    ANTIALIAS = 1 << 9


class TriType(IntEnum):
    UPPER_DIAG = 0
    UPPER = 1
    LOWER_DIAG = 2
    LOWER = 3


class TensorFlag(IntFlag):
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


class Status(IntEnum):
    ALLOC_FAILED = -2
    FAILED = -1
    SUCCESS = 0
    ABORTED = 1


class RopeType(IntEnum):
    NORMAL = 0
    NEOX = 2
    MROPE = 8
    VISION = 24


class Prec(IntEnum):
    DEFAULT = 0
    F32 = 10


# ops that only describe memory (no kernel runs for them)
VIEW_OPS = frozenset({Op.NONE, Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE})
