"""ggml's enums, named by their C suffix (GGML_OP_ADD -> Op.ADD)."""
from enum import IntEnum, IntFlag, auto


class Op(IntEnum):
    NONE = 0
    DUP = auto()
    ADD = auto()
    ADD_ID = auto()
    ADD1 = auto()
    ACC = auto()
    SUB = auto()
    MUL = auto()
    DIV = auto()
    SQR = auto()
    SQRT = auto()
    LOG = auto()
    SIN = auto()
    COS = auto()
    SUM = auto()
    SUM_ROWS = auto()
    CUMSUM = auto()
    MEAN = auto()
    ARGMAX = auto()
    COUNT_EQUAL = auto()
    REPEAT = auto()
    REPEAT_BACK = auto()
    CONCAT = auto()
    SILU_BACK = auto()
    NORM = auto()
    RMS_NORM = auto()
    RMS_NORM_BACK = auto()
    GROUP_NORM = auto()
    L2_NORM = auto()
    MUL_MAT = auto()
    MUL_MAT_ID = auto()
    OUT_PROD = auto()
    SCALE = auto()
    SET = auto()
    CPY = auto()
    CONT = auto()
    RESHAPE = auto()
    VIEW = auto()
    PERMUTE = auto()
    TRANSPOSE = auto()
    GET_ROWS = auto()
    GET_ROWS_BACK = auto()
    SET_ROWS = auto()
    DIAG = auto()
    DIAG_MASK_INF = auto()
    DIAG_MASK_ZERO = auto()
    SOFT_MAX = auto()
    SOFT_MAX_BACK = auto()
    ROPE = auto()
    ROPE_BACK = auto()
    CLAMP = auto()
    CONV_TRANSPOSE_1D = auto()
    IM2COL = auto()
    POOL_1D = auto()
    POOL_2D = auto()
    UPSCALE = auto()
    PAD = auto()
    ROLL = auto()
    ARANGE = auto()
    TIMESTEP_EMBEDDING = auto()
    ARGSORT = auto()
    TOP_K = auto()
    LEAKY_RELU = auto()
    FLASH_ATTN_EXT = auto()
    UNARY = auto()
    MAP_CUSTOM1 = auto()
    MAP_CUSTOM2 = auto()
    MAP_CUSTOM3 = auto()
    CUSTOM = auto()
    GLU = auto()


class UnaryOp(IntEnum):
    ABS = 0
    SGN = auto()
    NEG = auto()
    STEP = auto()
    TANH = auto()
    ELU = auto()
    RELU = auto()
    SIGMOID = auto()
    GELU = auto()
    GELU_QUICK = auto()
    SILU = auto()
    HARDSWISH = auto()
    HARDSIGMOID = auto()
    EXP = auto()
    GELU_ERF = auto()
    XIELU = auto()
    FLOOR = auto()
    CEIL = auto()
    ROUND = auto()
    TRUNC = auto()


class GluOp(IntEnum):
    REGLU = 0
    GEGLU = auto()
    SWIGLU = auto()
    SWIGLU_OAI = auto()
    GEGLU_ERF = auto()
    GEGLU_QUICK = auto()


class SortOrder(IntEnum):
    ASC = 0
    DESC = 1


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
