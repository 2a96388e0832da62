"""ggml's shape rules (its asserts) for the ops whose kernels index their sources by the node's
shape (the CPU's compiled kernels do not bounds-check). The server refuses a graph from the
wire whose nodes disagree with their sources before it runs; the CPU's kernel table gives such
a node (built locally) only to the torch kernels, whose indexing is checked.
`check_node(node)` returns why a node is malformed, or None.

Not covered: values that index memory (GET_ROWS / SET_ROWS row ids) are data, checked by the
kernels that read them, not here.
"""
from __future__ import annotations

from ...enums import Op, GluOp
from ...tensor import Tensor, can_repeat, nelements
from ...types import Type

ROPE_MULTI = 8  # GGML_ROPE_TYPE_MROPE and its variants carry 4 positions per token


def _ne(t: Tensor) -> list:
    return list(t.ne)


def _binary(n: Tensor, a: Tensor, b: Tensor):
    if b is None:
        return "needs two sources"
    if not can_repeat(b, a):
        return f"source 1 ne={_ne(b)} does not broadcast to source 0 ne={_ne(a)}"
    return None if _ne(n) == _ne(a) else f"ne={_ne(n)} is not source 0's {_ne(a)}"


def _same_shape(n: Tensor, a: Tensor, b: Tensor):
    return None if _ne(n) == _ne(a) else f"ne={_ne(n)} is not source 0's {_ne(a)}"


def _mul_mat(n: Tensor, a: Tensor, b: Tensor):
    if b is None or a.ne[0] != b.ne[0] or b.ne[2] % max(a.ne[2], 1) or b.ne[3] % max(a.ne[3], 1) \
            or not a.ne[2] or not a.ne[3]:
        return f"sources ne={_ne(a)} and {None if b is None else _ne(b)} cannot be multiplied"
    want = [a.ne[1], b.ne[1], b.ne[2], b.ne[3]]
    return None if _ne(n) == want else f"ne={_ne(n)}, the product is {want}"


def _mul_mat_id(n: Tensor, a: Tensor, b: Tensor):
    ids = n.src[2]
    if (b is None or ids is None or ids.type != Type.I32 or a.ne[3] != 1 or b.ne[3] != 1 or ids.ne[2] != 1
            or ids.ne[3] != 1 or ids.ne[1] != b.ne[2] or a.ne[0] != b.ne[0] or not b.ne[1] or ids.ne[0] % b.ne[1]):
        return (f"experts ne={_ne(a)}, rows {None if b is None else _ne(b)} and ids "
                f"{None if ids is None else _ne(ids)} do not fit")
    want = [a.ne[1], ids.ne[0], b.ne[2], 1]
    return None if _ne(n) == want else f"ne={_ne(n)}, the products are {want}"


def _soft_max(n: Tensor, a: Tensor, mask: Tensor):
    if _ne(n) != _ne(a):
        return f"ne={_ne(n)} is not source 0's {_ne(a)}"
    if mask is not None and not (mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1] and mask.ne[2] and mask.ne[3]
                                 and a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0):
        return f"mask ne={_ne(mask)} does not fit scores ne={_ne(a)}"
    sinks = n.src[2]
    if sinks is not None and sinks.ne[0] != a.ne[2]:
        return f"sinks ne={_ne(sinks)} is not one per head ({a.ne[2]})"
    return None


def _rope(n: Tensor, a: Tensor, pos: Tensor):
    if _ne(n) != _ne(a):
        return f"ne={_ne(n)} is not source 0's {_ne(a)}"
    per_token = 4 if n.op_params[2] & ROPE_MULTI else 1
    if pos is None or pos.type != Type.I32 or pos.ne[0] != per_token * a.ne[2]:
        return f"positions must be I32 [{per_token * a.ne[2]}], got {None if pos is None else _ne(pos)}"
    return None


def _glu(n: Tensor, a: Tensor, b: Tensor):
    if b is None:
        want = [a.ne[0] // 2] + _ne(a)[1:]
    elif _ne(a) != _ne(b):
        return f"halves ne={_ne(a)} and {_ne(b)} differ"
    else:
        want = _ne(a)
    if n.op_params[0] not in GluOp._value2member_map_:
        return f"unknown GLU op {n.op_params[0]}"
    return None if _ne(n) == want else f"ne={_ne(n)}, expected {want}"


def _copy(n: Tensor, a: Tensor, b: Tensor):
    if nelements(n) != nelements(a) or (b is not None and nelements(b) != nelements(a)):
        return f"copies {nelements(a)} values into {nelements(n)}"
    return None


def _get_rows(n: Tensor, a: Tensor, ids: Tensor):
    if ids is None or ids.type != Type.I32 or a.ne[2] != ids.ne[1] or a.ne[3] != ids.ne[2] or ids.ne[3] != 1:
        return f"row ids {None if ids is None else _ne(ids)} do not fit source ne={_ne(a)}"
    want = [a.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]]
    return None if _ne(n) == want else f"ne={_ne(n)}, expected {want}"


def _set_rows(n: Tensor, rows: Tensor, ids: Tensor):
    """The node is a view of the destination; source 0 the rows, source 1 their indices."""
    if ids is None or ids.type not in (Type.I32, Type.I64):
        return "needs rows and I32/I64 row ids"
    if not (n.ne[0] == rows.ne[0] and n.ne[2] == rows.ne[2] and n.ne[3] == rows.ne[3]
            and rows.ne[1] == ids.ne[0] and ids.ne[1] and ids.ne[2] and ids.ne[3] == 1
            and rows.ne[2] % ids.ne[1] == 0 and rows.ne[3] % ids.ne[2] == 0):
        return f"rows ne={_ne(rows)} and ids ne={_ne(ids)} do not fit destination ne={_ne(n)}"
    return None


RULES = {
    Op.ADD: _binary, Op.SUB: _binary, Op.MUL: _binary, Op.DIV: _binary,
    Op.NORM: _same_shape, Op.RMS_NORM: _same_shape, Op.SCALE: _same_shape, Op.UNARY: _same_shape,
    Op.MUL_MAT: _mul_mat, Op.MUL_MAT_ID: _mul_mat_id, Op.SOFT_MAX: _soft_max, Op.ROPE: _rope, Op.GLU: _glu,
    Op.CPY: _copy, Op.DUP: _copy, Op.CONT: _copy, Op.GET_ROWS: _get_rows, Op.SET_ROWS: _set_rows,
}


def check_node(node: Tensor) -> str | None:
    """Why the node's shape disagrees with its sources' under ggml's rules, or None."""
    rule = RULES.get(node.op)
    if rule is None:
        return None
    a = node.src[0]
    if a is None:
        return "has no source 0"
    return rule(node, a, node.src[1])
