"""LLVM IR for the fused CPU kernels (used by quant_kernels.py and op_kernels.py): numba
intrinsics for a row's quantized dot product and for packed rows' unpacking, the CPU's byte dot
instruction by target feature, float16 reads that need no library call, and the bf16 row output.
"""
from __future__ import annotations

import functools


# independent float sums a row's dot product keeps (sum_terms)
ACCUMULATORS = 4
# IQ4_NL's kind: Q4_0's 18-byte blocks (its bytes would name it), values through a table
IQ4_NL_KIND = -18
# ggml's blocks of 32 values u in [0, 15] or [0, 31] after a float16 d, by block bytes: Q4_1 (20
# bytes: d, float16 min m, 16 bytes of nibbles; W = d u + m), Q5_0 (22: d, 4 bytes of fifth bits
# qh, nibbles; W = d (u - 16)) and Q5_1 (24: d, m, qh, nibbles; W = d u + m)
OFFSET_BLOCK_KINDS = (20, 22, 24)
# ggml's 2- and 3-bit K-quants, by block bytes: Q2_K (84 bytes per 256 values: 16 bytes of a 4-bit
# scale and a 4-bit min per 16 values, 64 bytes of 2-bit values, float16 d and dmin; W = d sc q -
# dmin m) and Q3_K (110: 32 bytes of high bits, 64 of 2-bit low bits, 12 of 6-bit scales, float16
# d; W = d (sc - 32) (q - 4)). Their activations round per 16 values (low_k_blocks_dot).
LOW_K_KINDS = (84, 110)
# row_dot's kinds that read ggml's blocks in place, by block bytes: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K,
# IQ4_XS, the offset kinds and the low K-quants; and IQ4_NL
BLOCK_KINDS = (34, 18, 144, 176, 210, 136) + OFFSET_BLOCK_KINDS + LOW_K_KINDS + (IQ4_NL_KIND,)


def block_bytes(kind: int) -> int:
    """The bytes of a block kind's ggml block."""
    return 18 if kind == IQ4_NL_KIND else kind


def _row_dot_intrinsic():
    """A numba intrinsic for one row's dot product over int8-quantized groups, written as one
    LLVM vector loop. numba's own integer arithmetic widens to int64 and stays scalar; a dot per
    group that returns a scalar pays a horizontal sum per 32 values. Here, as ggml's x86 and ARM
    kernels do, each group's integer products are folded to 8 int32 lanes (LLVM lowers the
    widening multiply-add to vpmaddwd / vpdpwssd on x86 and sdot / smlal on ARM), converted to
    float and multiplied into 8 float lanes by the group's scale (weight scale * activation
    scale); the lanes are summed once per row.

        row_dot(w, x, scale, xd, kind) = sum_j scale[j] * xd[j] * sum_{i<G} W_j[i] * x[j*G + i]

    w: the row's weights (int8 [K], or uint8 [K/2] nibbles), x int8 [K] activations, scale
    float32 [K/G] or int16 holding float16 bits, xd float32 [K/G]. kind (a compile-time
    literal): 32 or 16 for int8 groups of that size, 4 for 4-bit groups of 32 stored in 16 bytes
    (byte i: value i low nibble, value i + 16 high nibble), -4 for the same nibbles minus 8
    (Q4_0's signed values, as ggml's kernels subtract 8). Block kinds read ggml's blocks in
    place (w: the row's raw bytes): 34 for Q8_0 (float16 d, 32 int8 values; scale not read),
    18 for Q4_0 (q4_0_pairs_dot: two blocks a vector; x in pair order, scale the int32 minus 8
    terms, see quant_kernels.pair_activations; IQ4_NL_KIND for IQ4_NL's blocks, read the same way, each
    nibble an index into kvalues_iq4nl), 144 for Q4_K, 176 for Q5_K, 210 for Q6_K and 136 for IQ4_XS
    (k_blocks_dot, q6_k_blocks_dot, iq4_xs_blocks_dot: activations rounded as ggml's Q8_K, xd one
    scale per 256 values and scale the int16 sums of each 16 values, for the mins and the minus 32).
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    i8, i16, i32, f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()

    def vec(t, n):
        return ir.VectorType(t, n)

    def data_ptr(context, builder, arr_type, arr):
        return context.make_array(arr_type)(context, builder, arr).data

    def fold_to_8(builder, v, n):
        """<n x i32> -> <8 x i32>, adding halves."""
        while n > 8:
            n //= 2
            lo = builder.shuffle_vector(v, v, ir.Constant(vec(i32, n), list(range(n))))
            hi = builder.shuffle_vector(v, v, ir.Constant(vec(i32, n), list(range(n, 2 * n))))
            v = builder.add(lo, hi)
        return v

    def fold_adjacent_to_8(builder, v):
        """<32 x i32> -> <8 x i32>, lane i the sum of lanes 4i..4i+3 (keeps 16-value groups apart)."""
        n = 32
        while n > 8:
            n //= 2
            even = builder.shuffle_vector(v, v, ir.Constant(vec(i32, n), list(range(0, 2 * n, 2))))
            odd = builder.shuffle_vector(v, v, ir.Constant(vec(i32, n), list(range(1, 2 * n, 2))))
            v = builder.add(even, odd)
        return v

    def group_scales(builder, sp, dp, j, half_scales):
        """scale[j] * xd[j] as float."""
        scale_j = builder.load(builder.gep(sp, [j]))
        if half_scales:  # float16 bits -> float
            scale_j = half_bits_to_float(builder, scale_j)
        return builder.fmul(scale_j, builder.load(builder.gep(dp, [j])))

    def block_scales(builder, wp, dp, j, block_bytes):
        """Block j's float16 d (its first two bytes, unaligned) * xd[j] as float."""
        at = builder.gep(wp, [builder.mul(j, ir.Constant(j.type, block_bytes))])
        d = half_bits_to_float(builder, builder.load(builder.bitcast(at, i16.as_pointer()), align=1))
        return builder.fmul(d, builder.load(builder.gep(dp, [j])))

    def six_bit_products(builder, w, x, j):
        """Two 16-value groups of 6-bit values u = q + 32 in 24 bytes (Q6_K): 16 bytes of low
        nibbles (byte i: value i, value i + 16 in the high nibble), then 8 bytes of high bits
        (byte b: values b, b + 8, b + 16, b + 24 in bits 0-1, 2-3, 4-5, 6-7)."""
        u = six_bit_values(builder, w, j)
        xv = load_i8(builder, x, builder.mul(j, ir.Constant(j.type, 32)), 32)
        return offset_six_bit_products(builder, u, xv)

    def offset_six_bit_products(builder, u, xv):
        """32 values u in [0, 63] minus 32 times 32 int8 xv as <8 x i32>, lanes 0-3 the first 16."""
        fast = _byte_dot_8(builder, u, xv)
        if fast is not None:  # sum (u - 32) x = sum u x - 32 sum x
            xsum = _byte_dot_8(builder, ir.Constant(vec(i8, 32), [1] * 32), xv)
            return builder.sub(fast, builder.shl(xsum, ir.Constant(vec(i32, 8), [5] * 8)))
        wide = vec(i32, 32)
        q = builder.sext(builder.sub(u, ir.Constant(vec(i8, 32), [32] * 32)), wide)
        return fold_adjacent_to_8(builder, builder.mul(q, builder.sext(xv, wide)))

    def six_bit_values(builder, w, j):
        """Chunk j's 32 values u = q + 32 as <32 x i8>."""
        base = builder.mul(j, ir.Constant(j.type, 24))
        lo16 = load_i8(builder, w, base, 16)
        hi8 = load_i8(builder, w, builder.add(base, ir.Constant(j.type, 16)), 8)
        u = builder.shuffle_vector(builder.and_(lo16, ir.Constant(vec(i8, 16), [15] * 16)),
                                   builder.lshr(lo16, ir.Constant(vec(i8, 16), [4] * 16)),
                                   ir.Constant(vec(i32, 32), list(range(32))))
        planes = [builder.and_(builder.lshr(hi8, ir.Constant(vec(i8, 8), [2 * p] * 8)), ir.Constant(vec(i8, 8), [3] * 8))
                  for p in range(4)]
        first = builder.shuffle_vector(planes[0], planes[1], ir.Constant(vec(i32, 16), list(range(16))))
        second = builder.shuffle_vector(planes[2], planes[3], ir.Constant(vec(i32, 16), list(range(16))))
        high = builder.shuffle_vector(first, second, ir.Constant(vec(i32, 32), list(range(32))))
        return builder.or_(u, builder.shl(high, ir.Constant(vec(i8, 32), [4] * 32)))  # in [0, 63]

    def group_products(builder, w, x, j, kind):
        """The group's products as <8 x i32> partial sums (kind 16: groups 2j and 2j + 1)."""
        at = builder.mul(j, ir.Constant(j.type, 32))
        if kind in BLOCK_KINDS:  # the values after block j's float16 d
            at_w = builder.add(builder.mul(j, ir.Constant(j.type, kind)), ir.Constant(j.type, 2))
            return (nibble_products(builder, nibble_values_at(builder, w, at_w), load_i8(builder, x, at, 32), True)
                    if kind == 18 else int8_products(builder, load_i8(builder, w, at_w, 32), load_i8(builder, x, at, 32), 32))
        if kind in (4, -4):
            return nibble_products(builder, nibble_values(builder, w, j), load_i8(builder, x, at, 32), kind == -4)
        if kind == 6:
            return six_bit_products(builder, w, x, j)
        # int8 groups; kind 16 reads two groups (32 bytes) at once: lanes 0-3 the first, 4-7 the second
        return int8_products(builder, load_i8(builder, w, at, 32), load_i8(builder, x, at, 32), kind)

    def nibble_products(builder, u, xv, signed, zero=8):
        """32 values u (< 128; minus zero, a power of two, where signed) times 32 int8 xv as
        <8 x i32>, lane i the sum of products 4i..4i+3 where the CPU has a byte dot."""
        fast = _byte_dot_8(builder, u, xv)
        if fast is not None:
            if signed:  # sum (u - zero) x = sum u x - zero sum x
                xsum = _byte_dot_8(builder, ir.Constant(vec(i8, 32), [1] * 32), xv)
                fast = builder.sub(fast, builder.shl(xsum, ir.Constant(vec(i32, 8), [zero.bit_length() - 1] * 8)))
            return fast
        wide = vec(i32, 32)
        if signed:  # u - zero, e.g. a nibble - 8 in [-8, 7]
            uw = builder.sext(builder.sub(u, ir.Constant(vec(i8, 32), [zero] * 32)), wide)
        else:
            uw = builder.zext(u, wide)
        return fold_to_8(builder, builder.mul(uw, builder.sext(xv, wide)), 32)

    def int8_products(builder, wv, xv, kind):
        """32 int8 weights times 32 int8 xv as <8 x i32> (kind 16: lanes 0-3 the first 16, 4-7
        the second)."""
        # |w| times x with w's sign (ggml's trick for signed bytes: the CPU's dot multiplies
        # unsigned by signed bytes); |-128| = 128 reads as an unsigned byte
        fast = _byte_dot_8(builder, *sign_moved(builder, wv, xv))
        if fast is not None:
            return fast
        wide = vec(i32, 32)
        products = builder.mul(builder.sext(wv, wide), builder.sext(xv, wide))
        return fold_adjacent_to_8(builder, products) if kind == 16 else fold_to_8(builder, products, 32)

    def sign_moved(builder, wv, xv):
        """(|w|, x with w's sign, 0 where w is 0) of <32 x i8> w and x: signed bytes through the
        byte dot, which multiplies unsigned by signed ones (vpabsb, vpsignb)."""
        zeros = ir.Constant(vec(i8, 32), [0] * 32)
        negative = builder.icmp_signed("<", wv, zeros)
        magnitude = builder.select(negative, builder.neg(wv), wv)
        signed_x = builder.select(negative, builder.neg(xv), builder.select(builder.icmp_signed("==", wv, zeros), zeros, xv))
        return magnitude, signed_x

    @intrinsic
    def row_dot(typingctx, w, x, scale, xd, kind):
        if not isinstance(kind, types.IntegerLiteral):
            return None
        k = kind.literal_value
        half_scales = scale.dtype == types.int16

        def codegen(context, builder, sig, args):
            wp = builder.bitcast(data_ptr(context, builder, sig.args[0], args[0]), i8.as_pointer())
            row = tuple(data_ptr(context, builder, sig.args[i], args[i]) for i in (1, 2, 3))
            n_groups = context.make_array(sig.args[3])(context, builder, args[3]).shape  # xd's: K / G
            n_groups = builder.extract_value(n_groups, 0)  # K / 256 for the K-quants' blocks
            return dot_rows(builder, wp, [row], n_groups, k, half_scales)[0]
        return types.float32(w, x, scale, xd, kind), codegen

    @intrinsic
    def rows_dot(typingctx, w, wscale, x, xs, xd, m0, kind, count):
        """row_dot of one weight row w by `count` activation rows m0 .. m0 + count - 1 at once
        (count a literal): x int8 [X, K], xd [X, K/G] their scales, xs [X, *] their sums for
        the block kinds (row_dot's `scale`; Q8_0 reads none: pass xd), wscale the weight row's
        group scales for the other kinds (the block kinds read theirs from w: pass any 1-D
        array). The weight's loads and unpacking are the same for every row: LLVM keeps one of
        each, so the weight row is unpacked once for the rows. Each row's sums are added in
        row_dot's order: the same results, bit for bit. A tuple of count float32."""
        if not (isinstance(kind, types.IntegerLiteral) and isinstance(count, types.IntegerLiteral)):
            return None
        k, n_rows = kind.literal_value, count.literal_value
        half_scales = wscale.dtype == types.int16
        out_type = types.UniTuple(types.float32, n_rows)

        def codegen(context, builder, sig, args):
            wp = builder.bitcast(data_ptr(context, builder, sig.args[0], args[0]), i8.as_pointer())
            wsp = data_ptr(context, builder, sig.args[1], args[1])

            def row_of(i, m):
                """Row m of the 2-D argument i, as a pointer to its elements."""
                arr = context.make_array(sig.args[i])(context, builder, args[i])
                at = builder.mul(m, builder.extract_value(arr.strides, 0))
                base = builder.bitcast(arr.data, i8.as_pointer())
                return builder.bitcast(builder.gep(base, [at]), arr.data.type)
            rows = []
            for r in range(n_rows):
                m = builder.add(args[5], ir.Constant(args[5].type, r))
                rows.append((row_of(2, m), row_of(3, m) if k in BLOCK_KINDS else wsp, row_of(4, m)))
            xd_shape = context.make_array(sig.args[4])(context, builder, args[4]).shape
            sums = dot_rows(builder, wp, rows, builder.extract_value(xd_shape, 1), k, half_scales)
            return context.make_tuple(builder, out_type, sums)
        return out_type(w, wscale, x, xs, xd, m0, kind, count), codegen

    @intrinsic
    def weight_rows_dot(typingctx, blocks, n0, x, xs, xd, kind, count):
        """row_dot of the weight rows n0 .. n0 + count - 1 of blocks (uint8 [rows, row bytes] of
        Q4_0's or IQ4_NL's blocks; count a literal) by one activation row (x, xs, xd: row_dot's
        x, scale and xd), in one loop: the activations' loads, their sums' terms and the loop's
        steps are shared by the rows, whose float sums are independent chains the CPU overlaps
        (a decode step's product, one activation row). Each row's sums are added in row_dot's
        order: the same results, bit for bit. A tuple of count float32."""
        if not (isinstance(kind, types.IntegerLiteral) and isinstance(count, types.IntegerLiteral)):
            return None
        k, n_rows = kind.literal_value, count.literal_value
        if k not in (18, IQ4_NL_KIND):
            return None
        out_type = types.UniTuple(types.float32, n_rows)

        def codegen(context, builder, sig, args):
            arr = context.make_array(sig.args[0])(context, builder, args[0])
            stride = builder.extract_value(arr.strides, 0)
            base = builder.bitcast(arr.data, i8.as_pointer())
            first = context.cast(builder, args[1], sig.args[1], types.int64)
            wps = [builder.gep(base, [builder.mul(builder.add(first, ir.Constant(first.type, r)), stride)])
                   for r in range(n_rows)]
            row = tuple(data_ptr(context, builder, sig.args[i], args[i]) for i in (2, 3, 4))
            n_groups = builder.extract_value(context.make_array(sig.args[4])(context, builder, args[4]).shape, 0)
            sums = q4_0_pairs_dot(builder, wps, [row] * n_rows, n_groups, k == IQ4_NL_KIND)
            return context.make_tuple(builder, out_type, sums)
        return out_type(blocks, n0, x, xs, xd, kind, count), codegen

    def dot_rows(builder, wp, rows, n_groups, k, half_scales):
        """The dot products of the weight row at wp with each activation row of rows, (x, scale,
        xd) pointers as row_dot's arguments, as a list of float32 values."""
        if k in (144, 176):
            return k_blocks_dot(builder, wp, rows, n_groups, k)
        if k == 210:
            return q6_k_blocks_dot(builder, wp, rows, n_groups)
        if k == 136:
            return iq4_xs_blocks_dot(builder, wp, rows, n_groups)
        if k in LOW_K_KINDS:  # xd's K / 16 -> the blocks of 256
            return low_k_blocks_dot(builder, wp, rows, builder.lshr(n_groups, ir.Constant(n_groups.type, 4)), k)
        if k in (18, IQ4_NL_KIND):
            return q4_0_pairs_dot(builder, wp, rows, n_groups, k == IQ4_NL_KIND)
        if k in OFFSET_BLOCK_KINDS:
            return offset_blocks_dot(builder, wp, rows, n_groups, k)
        if k == 34:
            return blocks_sum_terms(builder, wp, rows, n_groups, k,
                                    lambda j, row: group_products(builder, wp, row[0], j, k))
        if k in (16, 6):  # groups in pairs (K-quant rows hold an even number of 16-value groups)
            n_groups = builder.lshr(n_groups, ir.Constant(n_groups.type, 1))

        def term(j, row):
            """Group j's <8 x float> contribution: its integer products times its scale."""
            xp, sp, dp = row
            ints = group_products(builder, wp, xp, j, k)
            undef8 = ir.Constant(vec(f32, 8), ir.Undefined)
            if k in (16, 6):  # [s(2j)] * 4 ++ [s(2j+1)] * 4
                j0 = builder.shl(j, ir.Constant(j.type, 1))
                s8 = builder.insert_element(undef8, group_scales(builder, sp, dp, j0, half_scales), ir.Constant(i32, 0))
                s8 = builder.insert_element(s8, group_scales(builder, sp, dp, builder.add(j0, ir.Constant(j.type, 1)),
                                                             half_scales), ir.Constant(i32, 1))
                s8 = builder.shuffle_vector(s8, s8, ir.Constant(vec(i32, 8), [0, 0, 0, 0, 1, 1, 1, 1]))
            else:
                sj = (block_scales(builder, wp, dp, j, k) if k in BLOCK_KINDS
                      else group_scales(builder, sp, dp, j, half_scales))
                s8 = builder.insert_element(undef8, sj, ir.Constant(i32, 0))
                s8 = builder.shuffle_vector(s8, s8, ir.Constant(vec(i32, 8), [0] * 8))
            return builder.fmul(builder.sitofp(ints, vec(f32, 8)), s8, flags=("fast",))
        return sum_terms_rows(builder, term, n_groups, rows)

    def blocks_sum_terms(builder, wp, rows, n, block_bytes, ints_of, min_at=None):
        """sum_terms_rows for blocks that begin with their float16 d (Q8_0, the offset kinds):
        the scales d_j xd_j of ACCUMULATORS blocks converted and multiplied as one vector.
        min_at: where each block holds a float16 min m (Q4_1, Q5_1): plus sum_j m_j xsum_j, the
        activations' group sums xsum the rows' second pointer, ACCUMULATORS products a vector
        in their own sum, added to the row's at the end."""
        u = ACCUMULATORS
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vec(f32, 8), [0.0] * 8)) for _ in range(u)]
                for _ in rows]
        min_accs = [cgutils.alloca_once_value(builder, ir.Constant(vec(f32, u), [0.0] * u)) for _ in rows]

        def half_bits(j, at):
            ptr = builder.gep(wp, [builder.add(builder.mul(j, ir.Constant(j.type, block_bytes)), ir.Constant(j.type, at))])
            return builder.load(builder.bitcast(ptr, i16.as_pointer()), align=1)

        def halves_of(blocks, at):
            """The float16 at `at` of each of blocks as <len x float>."""
            if native_half():
                bits = ir.Constant(vec(i16, len(blocks)), ir.Undefined)
                for a, j in enumerate(blocks):
                    bits = builder.insert_element(bits, half_bits(j, at), ir.Constant(i32, a))
                return builder.fpext(builder.bitcast(bits, vec(ir.HalfType(), len(blocks))), vec(f32, len(blocks)))
            d = ir.Constant(vec(f32, len(blocks)), ir.Undefined)
            for a, j in enumerate(blocks):
                d = builder.insert_element(d, half_bits_to_float(builder, half_bits(j, at)), ir.Constant(i32, a))
            return d

        def add_mins(m, row, acc, j):
            """acc += m * the row's xsum at blocks j.. (as many as m's lanes; one: into lane 0)."""
            xs = builder.bitcast(builder.gep(row[1], [j]), vec(f32, m.type.count).as_pointer())
            products = builder.fmul(m, builder.load(xs, align=4), flags=("fast",))
            if m.type.count == 1:
                products = builder.shuffle_vector(products, ir.Constant(vec(f32, 1), [0.0]),
                                                  ir.Constant(vec(i32, u), [0] + [1] * (u - 1)))
            builder.store(builder.fadd(builder.load(acc), products, flags=("fast",)), acc)

        def add(acc, j, row, s8):
            term = builder.fmul(builder.sitofp(ints_of(j, row), vec(f32, 8)), s8, flags=("fast",))
            builder.store(builder.fadd(builder.load(acc), term, flags=("fast",)), acc)
        with cgutils.for_range(builder, builder.udiv(n, ir.Constant(n.type, u))) as loop:
            base = builder.mul(loop.index, ir.Constant(n.type, u))
            blocks = [builder.add(base, ir.Constant(n.type, a)) for a in range(u)]
            d = halves_of(blocks, 0)
            m = halves_of(blocks, min_at) if min_at is not None else None
            for row, row_accs, min_acc in zip(rows, accs, min_accs):
                xd = builder.load(builder.bitcast(builder.gep(row[2], [base]), vec(f32, u).as_pointer()), align=4)
                scales = builder.fmul(d, xd, flags=("fast",))
                for a, j in enumerate(blocks):
                    add(row_accs[a], j, row, builder.shuffle_vector(scales, scales, ir.Constant(vec(i32, 8), [a] * 8)))
                if m is not None:
                    add_mins(m, row, min_acc, base)
        tail = builder.mul(builder.udiv(n, ir.Constant(n.type, u)), ir.Constant(n.type, u))
        with cgutils.for_range(builder, builder.sub(n, tail)) as loop:
            j = builder.add(tail, loop.index)
            for row, row_accs, min_acc in zip(rows, accs, min_accs):
                sj = builder.fmul(half_bits_to_float(builder, half_bits(j, 0)), builder.load(builder.gep(row[2], [j])))
                s8 = builder.insert_element(ir.Constant(vec(f32, 8), ir.Undefined), sj, ir.Constant(i32, 0))
                add(row_accs[0], j, row, builder.shuffle_vector(s8, s8, ir.Constant(vec(i32, 8), [0] * 8)))
                if min_at is not None:
                    add_mins(halves_of([j], min_at), row, min_acc, j)
        sums = [sum_accumulators(builder, row_accs) for row_accs in accs]
        if min_at is None:
            return sums
        return [builder.fadd(total, reduce_sum(builder, builder.load(min_acc)), flags=("fast",))
                for total, min_acc in zip(sums, min_accs)]

    def offset_blocks_dot(builder, wp, rows, n_blocks, block_bytes):
        """A row of ggml's Q4_1, Q5_0 or Q5_1 blocks in place (OFFSET_BLOCK_KINDS) times the
        activations rounded as ggml's Q8_0 (Q8_1: the groups' sums for the mins), as ggml's
        kernels: per block d xd (sum (u - 16) x) for Q5_0 (in integers: sum u x - 16 sum x),
        d xd (sum u x) + m xsum for Q4_1 and Q5_1. rows: each activation row's (x, xsum, xd)."""
        _nibbles, _qh, min_at = OFFSET_BLOCK_FIELDS[block_bytes]

        def ints_of(j, row):
            u = offset_block_values(builder, wp, builder.mul(j, ir.Constant(j.type, block_bytes)), block_bytes)
            xv = load_i8(builder, row[0], builder.mul(j, ir.Constant(j.type, 32)), 32)
            return nibble_products(builder, u, xv, min_at is None, 16)
        return blocks_sum_terms(builder, wp, rows, n_blocks, block_bytes, ints_of, min_at)

    def q4_0_pairs_dot(builder, wp, rows, n_blocks, iq4_nl=False):
        """A row of ggml's Q4_0 blocks in place (18 bytes: float16 d, 16 bytes of nibbles, byte i
        value i low and value i + 16 high) times the activations, two blocks a vector: the 32
        bytes of blocks 2p and 2p + 1 side by side hold both blocks' values 0-15 in their low
        nibbles and 16-31 in their high ones, so one byte dot each gives 8 int32 lanes, 0-3 block
        2p's and 4-7 block 2p + 1's, with no shuffle of the weights (half the instructions a block
        of a block at a time). xp: the int8 activations with each 64 of a pair reordered to match
        (pair_activations: values 0-15 of both blocks, then 16-31 of both; an odd last block as
        it is); minusp: int32 per pair, 8 lanes of 2 S (S a block's sum of x: sum (u - 8) x =
        sum u x - 8 S exactly, in integers), 8 lanes of S for an odd last block; xd the blocks'
        activation scales. The scales d_j xd_j are taken 8 blocks at a time as one vector.
        rows: each activation row's (xp, minusp, dp). iq4_nl: IQ4_NL's blocks (the same bytes, each
        nibble the index of its int8 value in kvalues_iq4nl: nibble_dot). wp: one weight row for
        every activation row (rows_dot), or a list, one weight row for each (weight_rows_dot)."""
        wps = wp if isinstance(wp, list) else [wp] * len(rows)
        const = lambda v: ir.Constant(n_blocks.type, v)  # noqa: E731
        n_pairs = builder.lshr(n_blocks, const(1))
        nibble_dot = iq4_nl_dot if iq4_nl else q4_0_dot
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vec(f32, 8), [0.0] * 8)) for _ in range(ACCUMULATORS)]
                for _ in rows]

        def pair_ints(p, row, wp):
            xp, minus = row[0], builder.bitcast(row[1], i32.as_pointer())
            at = builder.mul(p, const(36))
            packed = builder.shuffle_vector(load_i8(builder, wp, builder.add(at, const(2)), 16),
                                            load_i8(builder, wp, builder.add(at, const(20)), 16),
                                            ir.Constant(vec(i32, 32), list(range(32))))
            low = builder.and_(packed, ir.Constant(vec(i8, 32), [15] * 32))
            high = builder.lshr(packed, ir.Constant(vec(i8, 32), [4] * 32))
            x_at = builder.mul(p, const(64))
            sub = builder.load(builder.bitcast(builder.gep(minus, [builder.mul(p, const(8))]), vec(i32, 8).as_pointer()),
                               align=4)
            return nibble_dot(builder, [low, high], [load_i8(builder, xp, x_at, 32),
                                                     load_i8(builder, xp, builder.add(x_at, const(32)), 32)], sub)

        def d_bits(j, wp):
            at = builder.gep(wp, [builder.mul(j, const(18))])
            return builder.load(builder.bitcast(at, i16.as_pointer()), align=1)

        def add(acc, p, row, wp, s8):
            term = builder.fmul(builder.sitofp(pair_ints(p, row, wp), vec(f32, 8)), s8, flags=("fast",))
            builder.store(builder.fadd(builder.load(acc), term, flags=("fast",)), acc)

        def once_per_weight(make):
            """make(w) for each row's weight row, computed once for rows that share one."""
            made = {}
            for w in wps:
                if id(w) not in made:
                    made[id(w)] = make(w)
            return [made[id(w)] for w in wps]

        per = ACCUMULATORS  # pairs an iteration: 2 * per blocks' scales as one vector
        i64 = ir.IntType(64)
        with cgutils.for_range(builder, builder.udiv(n_pairs, const(per))) as loop:
            block0 = builder.mul(loop.index, const(2 * per))

            def scales_d(wp):
                """The float16 d of 2 * per blocks: where AVX-512 BW permutes words (vpermw),
                picked from the 128 bytes that hold them (inside the blocks read); else 4 joined
                in a 64-bit integer (integer units), two of them then one vector: fewer vector
                shuffles than inserting each half."""
                if "avx512bw" in target_features():
                    words = builder.load(builder.bitcast(builder.gep(wp, [builder.mul(block0, const(18))]),
                                                         vec(i16, 64).as_pointer()), align=1)
                    bits = builder.shuffle_vector(words, words, ir.Constant(vec(i32, 2 * per), [9 * b for b in range(2 * per)]))
                    return halves_to_float(builder, bits)
                quads = []
                for first in range(0, 2 * per, 4):
                    quad = ir.Constant(i64, 0)
                    for b in range(4):
                        half = builder.zext(d_bits(builder.add(block0, const(first + b)), wp), i64)
                        quad = builder.or_(quad, builder.shl(half, ir.Constant(i64, 16 * b)))
                    quads.append(quad)
                packed = ir.Constant(vec(i64, len(quads)), ir.Undefined)
                for lane, quad in enumerate(quads):
                    packed = builder.insert_element(packed, quad, ir.Constant(i32, lane))
                return halves_to_float(builder, builder.bitcast(packed, vec(i16, 2 * per)))
            ds = once_per_weight(scales_d)
            for row, wp, d, row_accs in zip(rows, wps, ds, accs):
                xd = builder.load(builder.bitcast(builder.gep(row[2], [block0]), vec(f32, 2 * per).as_pointer()), align=4)
                scales = builder.fmul(d, xd, flags=("fast",))
                for q in range(per):
                    add(row_accs[q], builder.add(builder.mul(loop.index, const(per)), const(q)), row, wp,
                        lane_pairs(builder, scales, 2 * q))

        def scale_of(j, row, wp):
            return builder.fmul(half_bits_to_float(builder, d_bits(j, wp)), builder.load(builder.gep(row[2], [j])))

        done = builder.mul(builder.udiv(n_pairs, const(per)), const(per))
        with cgutils.for_range(builder, builder.sub(n_pairs, done)) as loop:
            p = builder.add(done, loop.index)
            for row, wp, row_accs in zip(rows, wps, accs):
                s2 = ir.Constant(vec(f32, 8), ir.Undefined)
                s2 = builder.insert_element(s2, scale_of(builder.shl(p, const(1)), row, wp), ir.Constant(i32, 0))
                s2 = builder.insert_element(s2, scale_of(builder.add(builder.shl(p, const(1)), const(1)), row, wp),
                                            ir.Constant(i32, 1))
                add(row_accs[0], p, row, wp, builder.shuffle_vector(s2, s2, ir.Constant(vec(i32, 8), [0] * 4 + [1] * 4)))
        with cgutils.if_unlikely(builder, builder.trunc(n_blocks, ir.IntType(1))):  # an odd last block
            j = builder.sub(n_blocks, const(1))
            for row, wp, row_accs in zip(rows, wps, accs):
                u = nibble_values_at(builder, wp, builder.add(builder.mul(j, const(18)), const(2)))
                xv = load_i8(builder, row[0], builder.mul(j, const(32)), 32)
                minus = builder.bitcast(row[1], i32.as_pointer())
                sub = builder.load(builder.bitcast(builder.gep(minus, [builder.mul(n_pairs, const(8))]),
                                                   vec(i32, 8).as_pointer()), align=4)
                ints = nibble_dot(builder, [u], [xv], sub)
                sj = builder.insert_element(ir.Constant(vec(f32, 8), ir.Undefined), scale_of(j, row, wp), ir.Constant(i32, 0))
                term = builder.fmul(builder.sitofp(ints, vec(f32, 8)),
                                    builder.shuffle_vector(sj, sj, ir.Constant(vec(i32, 8), [0] * 8)), flags=("fast",))
                builder.store(builder.fadd(builder.load(row_accs[0]), term, flags=("fast",)), row_accs[0])
        return [sum_accumulators(builder, row_accs) for row_accs in accs]

    def q4_0_dot(builder, us, xvs, sub):
        """Q4_0's nibbles us (<32 x i8> each) times xvs, minus sub (the 8 S terms): <8 x i32>.
        The byte dots add onto -sub (vpdpbusd's accumulator): no subtraction after them, and
        rows that share the activations share it."""
        ints = builder.neg(sub)
        for u, xv in zip(us, xvs):
            ints = adjacent_byte_dot(builder, u, xv, ints)
        return ints

    def iq4_nl_dot(builder, us, xvs, sub):
        """IQ4_NL's nibbles us (indices into kvalues_iq4nl) times xvs as <8 x i32>. Where the
        byte dot is vpdpbusd (no saturation) the values are looked up plus 128 (unsigned) and
        128 S taken off: sub (8 S in Q4_0's lanes) times 16; elsewhere (vpmaddubsw would
        saturate on u up to 241) the signed values' magnitudes times x with their signs."""
        offset = vnni_byte_dot()
        ints = builder.neg(builder.shl(sub, ir.Constant(vec(i32, 8), [4] * 8))) if offset else None
        for u, xv in zip(us, xvs):
            v = iq4_nl_values(builder, u, 128 if offset else 0)
            if not offset:
                v, xv = sign_moved(builder, v, xv)
            ints = adjacent_byte_dot(builder, v, xv, ints)
        return ints

    def lane_pairs(builder, v8, lane):
        """<8 x float> [v8[lane]] * 4 + [v8[lane + 1]] * 4: one vpermps on AVX2."""
        index = ir.Constant(vec(i32, 8), [lane] * 4 + [lane + 1] * 4)
        if "avx2" in target_features():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(f32, 8), [vec(f32, 8), vec(i32, 8)]),
                                                "llvm.x86.avx2.permps")
            return builder.call(fn, [v8, index])
        return builder.shuffle_vector(v8, v8, index)

    def adjacent_byte_dot(builder, u, xv, acc=None):
        """acc (<8 x i32>, or zeros) plus 32 unsigned bytes u (< 128) times 32 int8 xv, lane i
        the sum of products 4i..4i+3 (the byte dot instruction's lanes; the widening code folds
        alike)."""
        fast = _byte_dot_8(builder, u, xv, acc)
        if fast is not None:
            return fast
        wide = vec(i32, 32)
        dot = fold_adjacent_to_8(builder, builder.mul(builder.zext(u, wide), builder.sext(xv, wide)))
        return dot if acc is None else builder.add(acc, dot)

    def byte_at(builder, wp, at):
        return builder.zext(builder.load(builder.gep(wp, [at])), i32)

    def splat_f32(builder, x, n):
        one = builder.insert_element(ir.Constant(vec(f32, n), ir.Undefined), x, ir.Constant(i32, 0))
        return builder.shuffle_vector(one, one, ir.Constant(vec(i32, n), [0] * n))

    def k_blocks_dot(builder, wp, rows, n_blocks, block_bytes):
        """A row of ggml's Q4_K blocks in place (144 bytes per 256 values: float16 d and dmin,
        12 bytes of 6-bit scales and mins, 128 bytes of nibbles, each 32 bytes holding sub-block
        2p in the low nibbles and 2p + 1 in the high), or Q5_K's (176 bytes: the same and 32
        bytes of fifth bits, k_quant_values) times activations rounded as ggml's Q8_K
        (one scale xd a block of 256, sump: int16 sums of each 16 values), as ggml's kernels:
        per block, the integers sum_g sc_g (q_g . x_g) and sum_g m_g S_g exactly, then
        xd (d ints - dmin mins). rows: each activation row's (xp, sump, dp)."""
        const = lambda v: ir.Constant(n_blocks.type, v)  # noqa: E731
        pick = lambda v, lanes: builder.shuffle_vector(v, v, ir.Constant(vec(i32, len(lanes)), lanes))  # noqa: E731

        def half_at(at):
            return half_bits_to_float(builder, builder.load(builder.bitcast(builder.gep(wp, [at]), i16.as_pointer()),
                                                            align=1))

        def block_term(b, row):
            xp, sums, dp = row[0], builder.bitcast(row[1], i16.as_pointer()), row[2]
            base = builder.mul(b, const(block_bytes))
            scales_mins = q4_k_scales_and_mins_words(builder, wp, builder.add(base, const(4)))  # <16 x i16>
            sc16 = pick(scales_mins, list(range(8)) * 2)  # the 8 scales in both halves (vpshufb's lanes)
            chains = [None, None]  # two independent integer sums
            for p in range(4):
                for half in range(2):
                    g = 2 * p + half
                    u = k_quant_values(builder, wp, base, g, block_bytes)
                    xv = load_i8(builder, xp, builder.add(builder.mul(b, const(256)), const(32 * g)), 32)
                    chains[half] = scaled_byte_dot(builder, u, xv, spread_word(builder, sc16, [g] * 8), chains[half])
            ints = builder.add(chains[0], chains[1])
            # the mins' integer sum_g m_g S_g, S_g the sum of x over group g (two sums of 16):
            # each m_g against both of its sums in one word dot (vpmaddwd)
            s16 = builder.load(builder.bitcast(builder.gep(sums, [builder.mul(b, const(16))]), vec(i16, 16).as_pointer()),
                               align=2)
            mins = word_dot(builder, pick(scales_mins, [8 + g // 2 for g in range(16)]), s16)
            xd = builder.load(builder.gep(dp, [b]))
            d, dmin = builder.fmul(half_at(base), xd), builder.fmul(half_at(builder.add(base, const(2))), xd)
            return builder.fsub(builder.fmul(builder.sitofp(ints, vec(f32, 8)), splat_f32(builder, d, 8), flags=("fast",)),
                                builder.fmul(builder.sitofp(mins, vec(f32, 8)), splat_f32(builder, dmin, 8), flags=("fast",)),
                                flags=("fast",))
        return sum_terms_rows(builder, block_term, n_blocks, rows)  # each block's term from its exact integer sums

    def q6_k_blocks_dot(builder, wp, rows, n_blocks):
        """A row of ggml's Q6_K blocks in place (210 bytes per 256 values: 128 bytes of low
        nibbles, 64 of high bit pairs, 16 int8 scales, float16 d; value h*128 + l has its low
        nibble in byte h*64 + l % 64 (high half for l >= 64) and its top bits in byte
        h*32 + l % 32, bits 2 (l // 32)) times activations rounded as ggml's Q8_K (one scale xd
        a block, sump: int16 sums of each 16 values), as ggml's kernels: per block the integer
        sum_g sc_g ((u_g - 32) . x_g) = sum_g sc_g (u_g . x_g) - 32 sum_g sc_g S_g, exactly,
        then d xd times it. rows: each activation row's (xp, sump, dp)."""
        const = lambda v: ir.Constant(n_blocks.type, v)  # noqa: E731
        pick = lambda v, lanes: builder.shuffle_vector(v, v, ir.Constant(vec(i32, len(lanes)), lanes))  # noqa: E731
        c8 = lambda v: ir.Constant(vec(i8, 32), [v] * 32)  # noqa: E731

        def block_term(b, row):
            xp, sums, dp = row[0], builder.bitcast(row[1], i16.as_pointer()), row[2]
            base = builder.mul(b, const(210))
            at = lambda off: builder.add(base, const(off))  # noqa: E731
            sc16 = builder.sext(load_i8(builder, wp, at(192), 16), vec(i16, 16))
            chains = [None, None]
            for h in range(2):
                high_bytes = load_i8(builder, wp, at(128 + h * 32), 32)
                for t in range(4):  # values h*128 + 32t .. + 31: groups h*8 + 2t and h*8 + 2t + 1
                    low = builder.and_(builder.lshr(load_i8(builder, wp, at(h * 64 + 32 * (t % 2)), 32), c8(4 * (t // 2))),
                                       c8(15))
                    high = builder.and_(builder.lshr(high_bytes, c8(2 * t)), c8(3))
                    u = builder.or_(low, builder.shl(high, c8(4)))
                    g0 = h * 8 + 2 * t
                    xv = load_i8(builder, xp, builder.add(builder.mul(b, const(256)), const(h * 128 + 32 * t)), 32)
                    chains[t % 2] = scaled_byte_dot(builder, u, xv, pick(sc16, [g0] * 8 + [g0 + 1] * 8), chains[t % 2])
            s16 = builder.load(builder.bitcast(builder.gep(sums, [builder.mul(b, const(16))]), vec(i16, 16).as_pointer()),
                               align=2)
            offsets = word_dot(builder, sc16, s16)  # sum_g sc_g S_g over 8 lanes
            ints = builder.sub(builder.add(chains[0], chains[1]), builder.shl(offsets, ir.Constant(vec(i32, 8), [5] * 8)))
            d = half_bits_to_float(builder, builder.load(builder.bitcast(builder.gep(wp, [at(208)]), i16.as_pointer()),
                                                         align=1))
            scale = builder.fmul(d, builder.load(builder.gep(dp, [b])))
            return builder.fmul(builder.sitofp(ints, vec(f32, 8)), splat_f32(builder, scale, 8), flags=("fast",))
        return sum_terms_rows(builder, block_term, n_blocks, rows)  # each block's term from its exact integer sums

    def iq4_xs_blocks_dot(builder, wp, rows, n_blocks):
        """A row of ggml's IQ4_XS blocks in place (136 bytes per 256 values: float16 d, 6-bit
        sub-block scales ls in scales_h and scales_l, 8 x 16 bytes of nibbles, each 16 holding a
        sub-block of 32 as Q4_0's, indices into kvalues_iq4nl) times activations rounded as
        ggml's Q8_K (one scale xd a block), as ggml's kernels: per block the integer
        sum_g (ls_g - 32) (v_g . x_g), the values' magnitudes times x with their signs
        (vpmaddubsw cannot take them unsigned: up to 241), then d xd times it. rows: each
        activation row's (xp, sump (unread), dp)."""
        const = lambda v: ir.Constant(n_blocks.type, v)  # noqa: E731

        def block_term(b, row):
            xp, dp = row[0], row[2]
            base = builder.mul(b, const(136))
            sc = builder.trunc(iq4_xs_scales(builder, wp, base), vec(i16, 8))
            sc16 = builder.shuffle_vector(sc, sc, ir.Constant(vec(i32, 16), list(range(8)) * 2))
            chains = [None, None]
            for g in range(8):
                v = iq4_xs_values(builder, wp, base, g)
                xv = load_i8(builder, xp, builder.add(builder.mul(b, const(256)), const(32 * g)), 32)
                chains[g % 2] = scaled_byte_dot(builder, *sign_moved(builder, v, xv), spread_word(builder, sc16, [g] * 8),
                                                chains[g % 2])
            d = half_bits_to_float(builder, builder.load(builder.bitcast(builder.gep(wp, [base]), i16.as_pointer()),
                                                         align=1))
            scale = builder.fmul(d, builder.load(builder.gep(dp, [b])))
            return builder.fmul(builder.sitofp(builder.add(chains[0], chains[1]), vec(f32, 8)), splat_f32(builder, scale, 8),
                                flags=("fast",))
        return sum_terms_rows(builder, block_term, n_blocks, rows)  # each block's term from its exact integer sums

    def low_k_blocks_dot(builder, wp, rows, n_blocks, block_bytes):
        """A row of ggml's Q2_K or Q3_K blocks in place (LOW_K_KINDS; values u: low_k_values)
        times activations rounded per 16 values as Q8_0 rounds 32 (float32 scales xd_s, xsum_s
        = xd_s times the sum of the 16 rounded values: the converted layout's rounding, finer
        than ggml's Q8_K and closer to a float64 product): per block, Q2_K's
        d sum_s xd_s sc_s (u_s . x_s) - dmin sum_s m_s xsum_s, Q3_K's (q = u - 4, scales
        sc - 32) d (sum_s xd_s sc_s (u_s . x_s) - 4 sum_s sc_s xsum_s), each sc_s (u_s . x_s)
        an exact integer dot, two sub-blocks a vector of 8 lanes. rows: each activation row's
        (xp, xsum, dp)."""
        const = lambda v: ir.Constant(n_blocks.type, v)  # noqa: E731
        pick = lambda v, lanes: builder.shuffle_vector(v, v, ir.Constant(vec(i32, len(lanes)), lanes))  # noqa: E731
        q2 = block_bytes == 84
        fast = ("fast",)

        def half_at(at):
            return half_bits_to_float(builder, builder.load(builder.bitcast(builder.gep(wp, [at]), i16.as_pointer()),
                                                            align=1))

        def block_term(b, row):
            xp, sp, dp = row[0], row[1], row[2]
            base = builder.mul(b, const(block_bytes))
            if q2:
                sc16, offsets16 = q2_k_scales_and_mins(builder, wp, base)
                d = half_at(builder.add(base, const(80)))
                offset_scale = builder.fneg(half_at(builder.add(base, const(82))))  # -dmin m_s
            else:
                sc16 = offsets16 = q3_k_scales(builder, wp, builder.add(base, const(96)))
                d = half_at(builder.add(base, const(108)))
                offset_scale = builder.fmul(d, ir.Constant(f32, -4.0))  # -4 d sc_s
            total = None
            for g in range(8):  # sub-blocks 2g and 2g + 1
                u = low_k_values(builder, wp, base, g, block_bytes)
                xv = load_i8(builder, xp, builder.add(builder.mul(b, const(256)), const(32 * g)), 32)
                ints = scaled_byte_dot(builder, u, xv, pick(sc16, [2 * g] * 8 + [2 * g + 1] * 8), None)
                xd2 = builder.load(builder.bitcast(builder.gep(dp, [builder.add(builder.mul(b, const(16)), const(2 * g))]),
                                                   vec(f32, 2).as_pointer()), align=4)
                term = builder.fmul(builder.sitofp(ints, vec(f32, 8)), pick(xd2, [0] * 4 + [1] * 4), flags=fast)
                total = term if total is None else builder.fadd(total, term, flags=fast)
            # the offsets' sum over the block's 16 sub-blocks, from the activations' float sums
            xs = builder.load(builder.bitcast(builder.gep(sp, [builder.mul(b, const(16))]), vec(f32, 16).as_pointer()),
                              align=4)
            products = builder.fmul(builder.sitofp(offsets16, vec(f32, 16)), xs, flags=fast)
            offsets = builder.fadd(pick(products, list(range(8))), pick(products, list(range(8, 16))), flags=fast)
            return builder.fadd(builder.fmul(total, splat_f32(builder, d, 8), flags=fast),
                                builder.fmul(offsets, splat_f32(builder, offset_scale, 8), flags=fast), flags=fast)
        return sum_terms_rows(builder, block_term, n_blocks, rows)

    def scaled_byte_dot(builder, u, xv, sc16, acc):
        """acc (<8 x i32>, or None: zeros) plus the products of 32 unsigned bytes u (< 64) and 32
        int8 xv (|x| <= 127), each pair's sum times the int16 sc16 lane of the pair, lane i the
        sum of bytes 4i..4i+3: vpmaddubsw then vpdpwssd (AVX512-VNNI) or vpmaddwd (AVX2), as
        ggml's K-quant kernels (no saturation: 2 * 63 * 127 < 2^15); the widening code elsewhere."""
        feats = target_features()
        module = builder.module
        if "avx2" in feats:
            pairs = builder.call(cgutils.get_or_insert_function(
                module, ir.FunctionType(vec(i16, 16), [vec(i8, 32), vec(i8, 32)]), "llvm.x86.avx2.pmadd.ub.sw"), [u, xv])
            if ("avx512vnni" in feats and "avx512vl" in feats) or "avxvnni" in feats:
                fn = cgutils.get_or_insert_function(
                    module, ir.FunctionType(vec(i32, 8), [vec(i32, 8)] * 3), "llvm.x86.avx512.vpdpwssd.256")
                start = acc if acc is not None else ir.Constant(vec(i32, 8), [0] * 8)
                return builder.call(fn, [start, builder.bitcast(pairs, vec(i32, 8)), builder.bitcast(sc16, vec(i32, 8))])
            dot = word_dot(builder, pairs, sc16)
        else:
            wide = vec(i32, 32)
            scales = builder.sext(builder.shuffle_vector(sc16, sc16, ir.Constant(vec(i32, 32), [i // 2 for i in range(32)])),
                                  wide)
            products = builder.mul(builder.mul(builder.zext(u, wide), builder.sext(xv, wide)), scales)
            dot = fold_adjacent_to_8(builder, products)
        return dot if acc is None else builder.add(acc, dot)

    def spread_word(builder, v16, lanes):
        """<16 x i16> v16 (its two halves alike) -> lane i of each half = v16[lanes[i]]: one
        in-lane byte shuffle (vpshufb) on AVX2, where a broadcast of a lane takes two."""
        if "avx2" not in target_features():
            return builder.shuffle_vector(v16, v16, ir.Constant(vec(i32, 16), lanes * 2))
        mask = [b for lane in lanes for b in (2 * lane, 2 * lane + 1)] * 2
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(i8, 32), [vec(i8, 32)] * 2),
                                            "llvm.x86.avx2.pshuf.b")
        out = builder.call(fn, [builder.bitcast(v16, vec(i8, 32)), ir.Constant(vec(i8, 32), mask)])
        return builder.bitcast(out, vec(i16, 16))

    def word_dot(builder, a16, b16):
        """<16 x i16> a times b, adjacent pairs summed: <8 x i32> (vpmaddwd)."""
        if "avx2" in target_features():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(i32, 8), [vec(i16, 16)] * 2),
                                                "llvm.x86.avx2.pmadd.wd")
            return builder.call(fn, [a16, b16])
        products = builder.mul(builder.sext(a16, vec(i32, 16)), builder.sext(b16, vec(i32, 16)))
        even = builder.shuffle_vector(products, products, ir.Constant(vec(i32, 8), list(range(0, 16, 2))))
        odd = builder.shuffle_vector(products, products, ir.Constant(vec(i32, 8), list(range(1, 16, 2))))
        return builder.add(even, odd)

    def nibble_values(builder, w, j):
        """Group j's 32 4-bit values (16 bytes: value i low nibble, value i + 16 high) as <32 x i8>."""
        return nibble_values_at(builder, w, builder.mul(j, ir.Constant(j.type, 16)))

    def make_unpack(values):
        @intrinsic
        def unpack(typingctx, w, u):
            """u[:] = the packed row w's values, one byte each (for dequantizing)."""
            def codegen(context, builder, sig, args):
                wp = builder.bitcast(data_ptr(context, builder, sig.args[0], args[0]), i8.as_pointer())
                up = builder.bitcast(data_ptr(context, builder, sig.args[1], args[1]), i8.as_pointer())
                n = builder.extract_value(context.make_array(sig.args[1])(context, builder, args[1]).shape, 0)
                with cgutils.for_range(builder, builder.lshr(n, ir.Constant(n.type, 5))) as loop:
                    dst = builder.gep(up, [builder.mul(loop.index, ir.Constant(loop.index.type, 32))])
                    builder.store(values(builder, wp, loop.index), builder.bitcast(dst, vec(i8, 32).as_pointer()), align=1)
                return context.get_dummy_value()
            return types.none(w, u), codegen
        return unpack

    @intrinsic
    def blocks_to_float(typingctx, w, o, kind):
        """o[:] = the float32 values of one row of ggml blocks w (uint8; kind: row_dot's block
        kinds, 34 Q8_0, 18 Q4_0, 144 Q4_K, 176 Q5_K, 210 Q6_K, 136 IQ4_XS, IQ4_NL_KIND, 20 Q4_1, 22 Q5_0,
        24 Q5_1, 84 Q2_K, 110 Q3_K), 32 values a vector."""
        if not isinstance(kind, types.IntegerLiteral):
            return None
        k = kind.literal_value

        def codegen(context, builder, sig, args):
            wp = builder.bitcast(data_ptr(context, builder, sig.args[0], args[0]), i8.as_pointer())
            op = data_ptr(context, builder, sig.args[1], args[1])
            n = builder.extract_value(context.make_array(sig.args[1])(context, builder, args[1]).shape, 0)
            f32x32 = vec(f32, 32)

            def splat32(x):
                one = builder.insert_element(ir.Constant(f32x32, ir.Undefined), x, ir.Constant(i32, 0))
                return builder.shuffle_vector(one, one, ir.Constant(vec(i32, 32), [0] * 32))

            def store(values, at):
                builder.store(values, builder.bitcast(builder.gep(op, [at]), f32x32.as_pointer()), align=4)

            def half_at(at):
                return half_bits_to_float(builder, builder.load(builder.bitcast(builder.gep(wp, [at]), i16.as_pointer()),
                                                                align=1))
            const = lambda j, v: ir.Constant(j.type, v)  # noqa: E731
            if k in (34, 18, IQ4_NL_KIND):
                with cgutils.for_range(builder, builder.lshr(n, const(n, 5))) as loop:
                    j = loop.index
                    at = builder.mul(j, const(j, block_bytes(k)))
                    if k == 34:
                        q = load_i8(builder, wp, builder.add(at, const(j, 2)), 32)
                    elif k == IQ4_NL_KIND:
                        q = iq4_nl_values(builder, nibble_values_at(builder, wp, builder.add(at, const(j, 2))))
                    else:
                        q = builder.sub(nibble_values_at(builder, wp, builder.add(at, const(j, 2))),
                                        ir.Constant(vec(i8, 32), [8] * 32))
                    store(builder.fmul(builder.sitofp(q, f32x32), splat32(half_at(at))), builder.mul(j, const(j, 32)))
            elif k in OFFSET_BLOCK_KINDS:  # d (u - 16), or d u + m
                min_at = OFFSET_BLOCK_FIELDS[k][2]
                with cgutils.for_range(builder, builder.lshr(n, const(n, 5))) as loop:
                    j = loop.index
                    at = builder.mul(j, const(j, k))
                    u = offset_block_values(builder, wp, at, k)
                    if min_at is None:
                        values = builder.fmul(builder.sitofp(builder.sub(u, ir.Constant(vec(i8, 32), [16] * 32)), f32x32),
                                              splat32(half_at(at)))
                    else:
                        values = builder.fadd(builder.fmul(builder.uitofp(u, f32x32), splat32(half_at(at)), flags=("fast",)),
                                              splat32(half_at(builder.add(at, const(j, min_at)))), flags=("fast",))
                    store(values, builder.mul(j, const(j, 32)))
            elif k in (144, 176):
                with cgutils.for_range(builder, builder.lshr(n, const(n, 8))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(blk, k))
                    words = q4_k_scales_and_mins_words(builder, wp, builder.add(at, const(blk, 4)))
                    sc_f, m_f = (builder.uitofp(builder.shuffle_vector(words, words, ir.Constant(vec(i32, 8), lanes)),
                                                vec(f32, 8)) for lanes in (list(range(8)), list(range(8, 16))))
                    for g in range(8):
                        lane = ir.Constant(i32, g)
                        scale = builder.fmul(half_at(at), builder.extract_element(sc_f, lane))
                        offset = builder.fmul(half_at(builder.add(at, const(blk, 2))), builder.extract_element(m_f, lane))
                        u = k_quant_values(builder, wp, at, g, k)
                        values = builder.fsub(builder.fmul(builder.uitofp(u, f32x32), splat32(scale)), splat32(offset))
                        store(values, builder.add(builder.mul(blk, const(blk, 256)), const(blk, 32 * g)))
            elif k == 136:
                with cgutils.for_range(builder, builder.lshr(n, const(n, 8))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(blk, 136))
                    sc = builder.sitofp(iq4_xs_scales(builder, wp, at), vec(f32, 8))
                    for g in range(8):
                        dl = builder.fmul(half_at(at), builder.extract_element(sc, ir.Constant(i32, g)))
                        v = builder.sitofp(iq4_xs_values(builder, wp, at, g), f32x32)
                        store(builder.fmul(v, splat32(dl)), builder.add(builder.mul(blk, const(blk, 256)), const(blk, 32 * g)))
            elif k in LOW_K_KINDS:  # d sc u - dmin m (Q2_K), d (sc - 32) (u - 4) (Q3_K), per 16 values
                with cgutils.for_range(builder, builder.lshr(n, const(n, 8))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(blk, k))
                    d16 = lambda off: builder.shuffle_vector(  # noqa: E731
                        builder.insert_element(ir.Constant(vec(f32, 16), ir.Undefined), half_at(builder.add(at, const(blk, off))),
                                               ir.Constant(i32, 0)),
                        ir.Constant(vec(f32, 16), ir.Undefined), ir.Constant(vec(i32, 16), [0] * 16))
                    if k == 84:
                        sc16, m16 = q2_k_scales_and_mins(builder, wp, at)
                        scales = builder.fmul(d16(80), builder.uitofp(sc16, vec(f32, 16)))
                        offsets = builder.fmul(d16(82), builder.uitofp(m16, vec(f32, 16)))
                    else:
                        scales = builder.fmul(d16(108), builder.sitofp(q3_k_scales(builder, wp, builder.add(at, const(blk, 96))),
                                                                       vec(f32, 16)))
                    for g in range(8):
                        lanes = ir.Constant(vec(i32, 32), [2 * g] * 16 + [2 * g + 1] * 16)
                        u = low_k_values(builder, wp, at, g, k)
                        if k == 84:
                            values = builder.fsub(builder.fmul(builder.uitofp(u, f32x32), builder.shuffle_vector(scales, scales, lanes)),
                                                  builder.shuffle_vector(offsets, offsets, lanes))
                        else:
                            values = builder.fmul(builder.sitofp(builder.sub(u, ir.Constant(vec(i8, 32), [4] * 32)), f32x32),
                                                  builder.shuffle_vector(scales, scales, lanes))
                        store(values, builder.add(builder.mul(blk, const(blk, 256)), const(blk, 32 * g)))
            else:  # 210
                with cgutils.for_range(builder, builder.lshr(n, const(n, 8))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(blk, 210))
                    d = half_at(builder.add(at, const(blk, 208)))
                    d16 = builder.shuffle_vector(builder.insert_element(ir.Constant(vec(f32, 16), ir.Undefined), d,
                                                                        ir.Constant(i32, 0)),
                                                 ir.Constant(vec(f32, 16), ir.Undefined), ir.Constant(vec(i32, 16), [0] * 16))
                    scales = builder.fmul(d16, builder.sitofp(load_i8(builder, wp, builder.add(at, const(blk, 192)), 16),
                                                              vec(f32, 16)))
                    for h in range(2):
                        for t in range(4):
                            g0 = h * 8 + 2 * t
                            u = builder.sub(q6_k_values(builder, wp, at, h, t), ir.Constant(vec(i8, 32), [32] * 32))
                            s32 = builder.shuffle_vector(scales, scales, ir.Constant(vec(i32, 32), [g0] * 16 + [g0 + 1] * 16))
                            store(builder.fmul(builder.sitofp(u, f32x32), s32),
                                  builder.add(builder.mul(blk, const(blk, 256)), const(blk, h * 128 + 32 * t)))
            return context.get_dummy_value()
        return types.none(w, o, kind), codegen

    return row_dot, rows_dot, weight_rows_dot, make_unpack(nibble_values), make_unpack(six_bit_values), blocks_to_float


# ---------------------------------------------------------------- float sums in IR

def halves_to_float(builder, bits):
    """<n x i16> float16 bits -> <n x float> (one conversion where the CPU has it)."""
    from llvmlite import ir
    i32, f32, n = ir.IntType(32), ir.FloatType(), bits.type.count
    if native_half():
        return builder.fpext(builder.bitcast(bits, vec(ir.HalfType(), n)), vec(f32, n))
    out = ir.Constant(vec(f32, n), ir.Undefined)
    for lane in range(n):
        value = half_bits_to_float(builder, builder.extract_element(bits, ir.Constant(i32, lane)))
        out = builder.insert_element(out, value, ir.Constant(i32, lane))
    return out


def sum_terms(builder, term, n, lanes=8):
    """reduce(sum_{j<n} term(j)) over ACCUMULATORS independent <lanes x float> sums: one sum
    would wait on the adder's latency every group (~4.5 cycles a group on Zen 4, whatever
    the group's bytes), several overlap it."""
    return sum_terms_rows(builder, lambda j, _row: term(j), n, [None], lanes)[0]


def sum_terms_rows(builder, term, n, rows, lanes=8):
    """sum_terms of term(j, row) for each of rows, in one loop: each row's sums are added in
    sum_terms's order (the same result, bit for bit), and what term reads of the weight, the
    same for every row, LLVM computes once."""
    from llvmlite import ir
    from numba.core import cgutils
    u, f32 = ACCUMULATORS, ir.FloatType()
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(vec(f32, lanes), [0.0] * lanes)) for _ in range(u)]
            for _ in rows]

    def add(acc, j, row):
        builder.store(builder.fadd(builder.load(acc), term(j, row), flags=("fast",)), acc)
    with cgutils.for_range(builder, builder.udiv(n, ir.Constant(n.type, u))) as loop:
        base = builder.mul(loop.index, ir.Constant(n.type, u))
        for a in range(u):
            for row, row_accs in zip(rows, accs):
                add(row_accs[a], builder.add(base, ir.Constant(n.type, a)), row)
    tail = builder.mul(builder.udiv(n, ir.Constant(n.type, u)), ir.Constant(n.type, u))
    with cgutils.for_range(builder, builder.sub(n, tail)) as loop:
        for row, row_accs in zip(rows, accs):
            add(row_accs[0], builder.add(tail, loop.index), row)
    return [sum_accumulators(builder, row_accs) for row_accs in accs]


def sum_accumulators(builder, accs):
    """The sum of the lanes of the <lanes x float> sums accs hold (allocas), added in order."""
    total = builder.load(accs[0])
    for acc in accs[1:]:
        total = builder.fadd(total, builder.load(acc), flags=("fast",))
    return reduce_sum(builder, total)


def reduce_sum(builder, v):
    """The sum of a float vector's lanes."""
    from llvmlite import ir
    from numba.core import cgutils
    f32, n = ir.FloatType(), v.type.count
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, vec(f32, n)]),
                                        f"llvm.vector.reduce.fadd.v{n}f32")
    return builder.call(fn, [ir.Constant(f32, 0.0), v], fastmath=("fast",))


def _half_row_dot_intrinsic():
    """half_row_dot(w, x): sum_i w[i] x[i] over the first K - K % HALF_LANES values of an F16
    row (uint16 bits) and activations in F16 (uint16 bits: ggml's vec_dot type for F16 weights,
    half the bytes beside the streamed row) or float32, as one LLVM vector loop (ACCUMULATORS
    sums of HALF_LANES lanes, each 16 halves converted at once, as ggml's F16 vec_dot does with
    F16C); the caller adds the last K % HALF_LANES. LLVM's own vectorization of the scalar loop
    read the rows of a mapped GGUF file at ~2/3 of this speed on one thread."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
    i16, f32 = ir.IntType(16), ir.FloatType()

    @intrinsic
    def half_row_dot(typingctx, w, x):
        if w.layout != "C" or x.layout != "C":  # the loop reads both as contiguous memory
            return None
        half_x = x.dtype == types.uint16

        def codegen(context, builder, sig, args):
            warr = context.make_array(sig.args[0])(context, builder, args[0])
            xarr = context.make_array(sig.args[1])(context, builder, args[1])
            wp, xp = builder.bitcast(warr.data, i16.as_pointer()), xarr.data
            n = builder.udiv(builder.extract_value(warr.shape, 0), ir.Constant(ir.IntType(64), HALF_LANES))

            def load(ptr, at, t, align):
                return builder.load(builder.bitcast(builder.gep(ptr, [at]), vec(t, HALF_LANES).as_pointer()), align=align)

            def term(j):
                at = builder.mul(j, ir.Constant(j.type, HALF_LANES))
                xv = halves_to_float(builder, load(xp, at, i16, 2)) if half_x else load(xp, at, f32, 4)
                return builder.fmul(halves_to_float(builder, load(wp, at, i16, 2)), xv, flags=("fast",))
            return sum_terms(builder, term, n, HALF_LANES)
        return types.float32(w, x), codegen
    return half_row_dot


# the values a step of half_row_dot converts and multiplies
HALF_LANES = 16


# ---------------------------------------------------------------- ggml blocks' values in IR
# (shared by the row dots above and the prompt GEMM's panels, gemm_ir.py)

def _types():
    from llvmlite import ir
    return ir, ir.IntType(8), ir.IntType(16), ir.IntType(32)


def vec(t, n):
    from llvmlite import ir
    return ir.VectorType(t, n)


def load_i8(builder, base, offset, n):
    ir, i8, i16, i32 = _types()
    ptr = builder.bitcast(builder.gep(base, [offset]), vec(i8, n).as_pointer())
    return builder.load(ptr, align=1)


def q4_k_scales_and_mins_words(builder, wp, at):
    """A Q4_K block's 8 scales and 8 mins (6 bits each, packed in the 12 bytes at `at`) as
    <16 x i16> [sc0..sc7, m0..m7], unpacked in 32-bit scalar arithmetic as ggml's kernels
    do: the integer units take it, the vector units are busy with the products."""
    ir, i8, i16, i32 = _types()
    words = [builder.load(builder.bitcast(builder.gep(wp, [builder.add(at, ir.Constant(at.type, 4 * w))]),
                                          i32.as_pointer()), align=1) for w in range(3)]
    c = lambda v: ir.Constant(i32, v)  # noqa: E731
    low6, low4, top2 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    # scales 0-3: words[0] & 63; mins 0-3: words[1] & 63; scales 4-7: words[2] low nibbles
    # and words[0]'s top 2 bits; mins 4-7: words[2] high nibbles and words[1]'s top 2 bits
    sc_lo, m_lo = builder.and_(words[0], low6), builder.and_(words[1], low6)
    sc_hi = builder.or_(builder.and_(words[2], low4),
                        builder.shl(builder.and_(builder.lshr(words[0], c(6)), top2), c(4)))
    m_hi = builder.or_(builder.and_(builder.lshr(words[2], c(4)), low4),
                       builder.shl(builder.and_(builder.lshr(words[1], c(6)), top2), c(4)))
    packed = ir.Constant(vec(i32, 4), ir.Undefined)
    for lane, word in enumerate((sc_lo, sc_hi, m_lo, m_hi)):
        packed = builder.insert_element(packed, word, ir.Constant(i32, lane))
    return builder.zext(builder.bitcast(packed, vec(i8, 16)), vec(i16, 16))

def q6_k_values(builder, wp, at, h, t):
    """Values h*128 + 32t .. + 31 of the Q6_K block at `at` as <32 x i8> u = q + 32."""
    ir, i8, i16, i32 = _types()
    c8 = lambda v: ir.Constant(vec(i8, 32), [v] * 32)  # noqa: E731
    offset = lambda off: builder.add(at, ir.Constant(at.type, off))  # noqa: E731
    low = builder.and_(builder.lshr(load_i8(builder, wp, offset(h * 64 + 32 * (t % 2)), 32), c8(4 * (t // 2))), c8(15))
    high = builder.and_(builder.lshr(load_i8(builder, wp, offset(128 + h * 32), 32), c8(2 * t)), c8(3))
    return builder.or_(low, builder.shl(high, c8(4)))


def k_quant_values(builder, wp, base, g, block_bytes):
    """Group g's 32 values (g < 8) of the Q4_K (block_bytes 144) or Q5_K (176) block at `base`
    as <32 x i8> u in [0, 15] / [0, 31]: each 32 bytes of nibbles (at 16, Q5_K at 48) hold group
    2p in their low nibbles and 2p + 1 in their high; Q5_K's fifth bit of value l of group g is
    bit g of its byte l of qh (the 32 bytes at 16)."""
    ir, i8, i16, i32 = _types()
    c8 = lambda v: ir.Constant(vec(i8, 32), [v] * 32)  # noqa: E731
    at = lambda off: builder.add(base, ir.Constant(base.type, off))  # noqa: E731
    packed = load_i8(builder, wp, at((16 if block_bytes == 144 else 48) + (g // 2) * 32), 32)
    u = builder.and_(packed, c8(15)) if g % 2 == 0 else builder.lshr(packed, c8(4))
    if block_bytes == 176:
        high = builder.and_(builder.lshr(load_i8(builder, wp, at(16), 32), c8(g)), c8(1))
        u = builder.or_(u, builder.shl(high, c8(4)))
    return u


def iq4_xs_scales(builder, wp, at):
    """The IQ4_XS block at `at`'s 8 sub-block scales ls - 32 as <8 x i32>: ls_g is nibble g of
    scales_l (the 4 bytes at 4) and bits 2g, 2g + 1 of scales_h (the 2 bytes at 2) above it."""
    ir, i8, i16, i32 = _types()
    c = lambda values: ir.Constant(vec(i32, 8), values)  # noqa: E731

    def splat_word(off, t):
        word = builder.zext(builder.load(builder.bitcast(builder.gep(wp, [builder.add(at, ir.Constant(at.type, off))]),
                                                        t.as_pointer()), align=1), i32)
        one = builder.insert_element(ir.Constant(vec(i32, 8), ir.Undefined), word, ir.Constant(i32, 0))
        return builder.shuffle_vector(one, one, c([0] * 8))
    low = builder.and_(builder.lshr(splat_word(4, i32), c([4 * g for g in range(8)])), c([15] * 8))
    high = builder.and_(builder.lshr(splat_word(2, i16), c([2 * g for g in range(8)])), c([3] * 8))
    return builder.sub(builder.or_(low, builder.shl(high, c([4] * 8))), c([32] * 8))


def iq4_xs_values(builder, wp, at, g, offset=0):
    """Sub-block g's 32 values of the IQ4_XS block at `at` (its 16 bytes at 8 + 16 g, as Q4_0's)
    as kvalues_iq4nl + offset, <32 x i8>."""
    ir = _types()[0]
    return iq4_nl_values(builder, nibble_values_at(builder, wp, builder.add(at, ir.Constant(at.type, 8 + 16 * g))), offset)


def low_k_values(builder, wp, at, g, block_bytes):
    """Values 32g..32g+31 (g < 8; sub-blocks 2g and 2g + 1) of the Q2_K (block_bytes 84) or Q3_K
    (110) block at `at` as <32 x i8> u: value 128h + 32j + l (g = 4h + j) has its 2 low bits at
    bits 2j of byte 32h + l of the 2-bit values (at 16; Q3_K's at 32), Q3_K's third bit is bit
    4h + j of byte l of hmask (the 32 bytes at 0): u in [0, 7], its value q = u - 4."""
    ir, i8, i16, i32 = _types()
    c8 = lambda v: ir.Constant(vec(i8, 32), [v] * 32)  # noqa: E731
    offset = lambda off: builder.add(at, ir.Constant(at.type, off))  # noqa: E731
    h, j = divmod(g, 4)
    u = builder.and_(builder.lshr(load_i8(builder, wp, offset((16 if block_bytes == 84 else 32) + 32 * h), 32), c8(2 * j)),
                     c8(3))
    if block_bytes == 110:  # bit 4h + j of hmask moved to bit 2 (4) in one shift
        hm, bit = load_i8(builder, wp, at, 32), 4 * h + j
        moved = builder.lshr(hm, c8(bit - 2)) if bit >= 2 else builder.shl(hm, c8(2 - bit))
        u = builder.or_(u, builder.and_(moved, c8(4)))
    return u


def q2_k_scales_and_mins(builder, wp, at):
    """The Q2_K block at `at`'s 16 scales (low nibbles of its first 16 bytes) and 16 mins (high
    nibbles), each <16 x i16>."""
    ir, i8, i16, i32 = _types()
    b = load_i8(builder, wp, at, 16)
    return (builder.zext(builder.and_(b, ir.Constant(vec(i8, 16), [15] * 16)), vec(i16, 16)),
            builder.zext(builder.lshr(b, ir.Constant(vec(i8, 16), [4] * 16)), vec(i16, 16)))


def q3_k_scales(builder, wp, at):
    """Q3_K's 16 6-bit scales (packed in the 12 bytes at `at`) minus 32 as <16 x i16>: scale s's
    low 4 bits are nibble s // 8 of byte s % 8, its top 2 bits bits 2 (s // 4) of byte 8 + s % 4;
    unpacked in 32-bit scalar arithmetic, as q4_k_scales_and_mins_words."""
    ir, i8, i16, i32 = _types()
    a0, a1, a2 = (builder.load(builder.bitcast(builder.gep(wp, [builder.add(at, ir.Constant(at.type, 4 * w))]),
                                               i32.as_pointer()), align=1) for w in range(3))
    c = lambda v: ir.Constant(i32, v)  # noqa: E731
    low4, top2 = c(0x0F0F0F0F), c(0x03030303)
    words = [builder.or_(builder.and_(builder.lshr(low, c(shift_low)), low4),
                         builder.shl(builder.and_(builder.lshr(a2, c(shift_high)), top2), c(4)))
             for low, shift_low, shift_high in ((a0, 0, 0), (a1, 0, 2), (a0, 4, 4), (a1, 4, 6))]
    packed = ir.Constant(vec(i32, 4), ir.Undefined)
    for lane, word in enumerate(words):
        packed = builder.insert_element(packed, word, ir.Constant(i32, lane))
    return builder.sub(builder.zext(builder.bitcast(packed, vec(i8, 16)), vec(i16, 16)), ir.Constant(vec(i16, 16), [32] * 16))


# the offset kinds' fields: where a block holds its nibbles, its fifth bits (None: none) and its
# float16 min m (None: none, the values are u - 16)
OFFSET_BLOCK_FIELDS = {20: (4, None, 2), 22: (6, 2, None), 24: (8, 4, 2)}


def offset_block_values(builder, wp, at, block_bytes):
    """The 32 values u of the Q4_1 / Q5_0 / Q5_1 block (OFFSET_BLOCK_KINDS) at `at` as <32 x
    i8>: its nibbles (value i the low nibble of byte i, value i + 16 the high), and for Q5_0 and
    Q5_1 bit i of the 32-bit qh as value i's fifth bit."""
    ir, i8, i16, i32 = _types()
    nibbles_at, qh_at, _min_at = OFFSET_BLOCK_FIELDS[block_bytes]
    u = nibble_values_at(builder, wp, builder.add(at, ir.Constant(at.type, nibbles_at)))
    if qh_at is None:
        return u
    qh = builder.load(builder.bitcast(builder.gep(wp, [builder.add(at, ir.Constant(at.type, qh_at))]), i32.as_pointer()),
                      align=1)
    # bit i -> 16 in byte i (x86: little-endian), a select: one masked move from a mask register on AVX-512
    high = builder.select(builder.bitcast(qh, vec(ir.IntType(1), 32)), ir.Constant(vec(i8, 32), [16] * 32),
                          ir.Constant(vec(i8, 32), [0] * 32))
    return builder.or_(u, high)


def nibble_values_at(builder, w, at):
    """The 32 4-bit values of the 16 bytes at `at` (value i low nibble of byte i, value i + 16
    high) as <32 x i8>."""
    ir, i8, i16, i32 = _types()
    wv = load_i8(builder, w, at, 16)
    return builder.shuffle_vector(builder.and_(wv, ir.Constant(vec(i8, 16), [15] * 16)),
                                  builder.lshr(wv, ir.Constant(vec(i8, 16), [4] * 16)),
                                  ir.Constant(vec(i32, 32), list(range(32))))


def _row_output_helpers():
    """(float_row, store_row) for kernels that write float32 or bfloat16 rows: float_row(out_row)
    is where to compute the row in float32 (out_row itself, or a temporary when out is uint16
    bfloat16 bits); store_row(row, out_row) rounds the temporary to bfloat16 (nearest even, as
    torch's conversion) and stores it (nothing to do for float32). Dequantizing straight to
    bf16 saves the float32 pass a prompt's GEMM would otherwise convert."""
    import numpy as np
    from numba import types
    from numba.extending import overload, register_jitable

    def float_row(out_row):
        pass

    def store_row(row, out_row):
        pass

    @overload(float_row, inline="always")
    def _float_row(out_row):
        if out_row.dtype == types.float32:
            return lambda out_row: out_row
        return lambda out_row: np.empty(out_row.shape[0], np.float32)

    @register_jitable
    def _round_bf16(row, out_row):
        bits = row.view(np.uint32)
        for i in range(out_row.shape[0]):
            b = bits[i]
            out_row[i] = np.uint16((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))

    @overload(store_row, inline="always")
    def _store_row(row, out_row):
        if out_row.dtype == types.float32:
            return lambda row, out_row: None
        return _round_bf16

    return float_row, store_row


@functools.lru_cache(maxsize=None)
def target_features() -> frozenset:
    """The x86 features numba compiles for (NUMBA_CPU_NAME/NUMBA_CPU_FEATURES when set, else the
    host's), e.g. {"avx2", "avx512vnni", "f16c"}; empty elsewhere or without numba."""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return frozenset()
    from .loader import import_numba
    try:
        import_numba()  # without SciPy where it can (its first import may be this one)
        from numba.core import config
        from llvmlite import binding
    except ImportError:
        return frozenset()
    if not config.CPU_NAME or config.CPU_NAME == "host":
        return frozenset(k for k, v in binding.get_host_cpu_features().items() if v)
    # a named CPU: LLVM enables that CPU's features, then NUMBA_CPU_FEATURES' +f / -f
    feats = set(CPU_NAME_FEATURES.get(config.CPU_NAME, ()))
    for f in (config.CPU_FEATURES or "").split(","):
        if f[:1] == "+":
            feats.add(f[1:])
        elif f[:1] == "-":
            feats.discard(f[1:])
    return frozenset(feats)


# the features the kernels test of some CPUs numba may be told to compile for (NUMBA_CPU_NAME);
# a name not here counts as baseline x86-64 (the kernels' generic code, right on any x86)
_AVX2 = ("avx", "avx2", "fma", "f16c", "bmi2")
_AVX512 = _AVX2 + ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd")
CPU_NAME_FEATURES = {
    **{name: _AVX2 for name in ("haswell", "broadwell", "skylake", "x86-64-v3", "znver1", "znver2", "znver3")},
    **{name: _AVX2 + ("avxvnni",) for name in ("alderlake", "raptorlake", "meteorlake", "arrowlake", "lunarlake",
                                               "gracemont", "sierraforest")},
    **{name: _AVX512 for name in ("skylake-avx512", "x86-64-v4")},
    **{name: _AVX512 + ("avx512vnni",) for name in ("cascadelake", "icelake-client", "icelake-server", "tigerlake",
                                                     "rocketlake")},
    **{name: _AVX512 + ("avx512vnni", "avx512bf16") for name in ("cooperlake", "znver4", "znver5")},
    **{name: _AVX512 + ("avx512vnni", "avx512bf16", "avxvnni", "amx-int8") for name in ("sapphirerapids",
                                                                                       "emeraldrapids",
                                                                                       "graniterapids")},
}


@functools.lru_cache(maxsize=None)
def native_half() -> bool:
    """Whether numba's target CPU converts float16 in hardware (F16C on x86, every AArch64):
    without it LLVM's half casts become library calls numba's JIT cannot link (an abort)."""
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    return "f16c" in target_features()


def vnni_byte_dot() -> bool:
    """Whether _byte_dot_8 is vpdpbusd (whose u8 x s8 products cannot saturate)."""
    feats = target_features()
    return ("avx512vnni" in feats and "avx512vl" in feats) or "avxvnni" in feats


def iq4_nl_values(builder, u, offset=0):
    """<32 x i8> nibbles u (0-15) -> kvalues_iq4nl[u] + offset (offset 128: unsigned bytes) as
    <32 x i8>: one in-lane byte shuffle (vpshufb) on AVX2, a select per table entry elsewhere."""
    from llvmlite import ir
    from numba.core import cgutils
    from ....quants.tables import IQ4NL_VALUES
    i8 = ir.IntType(8)
    table = [(v + offset) & 255 for v in IQ4NL_VALUES]
    if "avx2" in target_features():
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec(i8, 32), [vec(i8, 32)] * 2),
                                            "llvm.x86.avx2.pshuf.b")
        return builder.call(fn, [ir.Constant(vec(i8, 32), table * 2), u])
    out = ir.Constant(vec(i8, 32), [table[0]] * 32)
    for index in range(1, 16):
        out = builder.select(builder.icmp_unsigned("==", u, ir.Constant(vec(i8, 32), [index] * 32)),
                             ir.Constant(vec(i8, 32), [table[index]] * 32), out)
    return out


def _byte_dot_8(builder, u, s, acc=None):
    """IR: <n x i8> u (unsigned, < 128 here) times <n x i8> s (signed), n 32 or 16, summed in
    groups of 4 into <8 x i32> (n 16: the upper 4 lanes 0), plus acc where given (n 32), by the
    CPU's byte dot instruction:
    vpdpbusd (AVX512-VNNI with VL, AVX-VNNI), else vpmaddubsw + vpmaddwd (AVX2, as ggml's AVX2
    kernels: no saturation for u < 128 and |s| <= 127); None where the target has neither (the
    generic widening code then)."""
    from llvmlite import ir
    from numba.core import cgutils
    feats = target_features()
    n = u.type.count
    i32, i16 = ir.IntType(32), ir.IntType(16)
    lanes, vb, vw = ir.VectorType(i32, n // 4), ir.VectorType(ir.IntType(8), n), ir.VectorType(i16, n // 2)
    module = builder.module
    if vnni_byte_dot():
        fn = cgutils.get_or_insert_function(module, ir.FunctionType(lanes, [lanes, lanes, lanes]),
                                            f"llvm.x86.avx512.vpdpbusd.{n * 8}")
        start = acc if acc is not None and n == 32 else ir.Constant(lanes, [0] * (n // 4))
        dot = builder.call(fn, [start, builder.bitcast(u, lanes), builder.bitcast(s, lanes)])
        if n == 32:
            return dot
    elif "avx2" in feats:
        maddubs, maddwd = (("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd") if n == 32 else
                           ("llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd"))
        pairs = builder.call(cgutils.get_or_insert_function(module, ir.FunctionType(vw, [vb, vb]), maddubs), [u, s])
        dot = builder.call(cgutils.get_or_insert_function(module, ir.FunctionType(lanes, [vw, vw]), maddwd),
                           [pairs, ir.Constant(vw, [1] * (n // 2))])
    else:
        return None
    if n == 16:  # <4 x i32> -> <8 x i32>, zeros above
        dot = builder.shuffle_vector(dot, ir.Constant(lanes, [0] * 4), ir.Constant(ir.VectorType(i32, 8), list(range(8))))
    return dot if acc is None else builder.add(acc, dot)


def half_bits_to_float(builder, bits):
    """IR: an i16 holding float16 bits as float32. fpext where the CPU converts halves, else
    integer arithmetic (exact for every value, infinities and NaN included)."""
    from llvmlite import ir
    i32, f32 = ir.IntType(32), ir.FloatType()
    if native_half():
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), f32)
    b = builder.zext(bits, i32)
    sign = builder.shl(builder.and_(b, ir.Constant(i32, 0x8000)), ir.Constant(i32, 16))
    magnitude = builder.and_(b, ir.Constant(i32, 0x7FFF))
    # exponent and mantissa moved into float32's fields, rebiased by 2^112: exact for normal and
    # subnormal halves (the product renormalizes them)
    finite = builder.fmul(builder.bitcast(builder.shl(magnitude, ir.Constant(i32, 13)), f32),
                          ir.Constant(f32, 2.0 ** 112))
    special = builder.or_(ir.Constant(i32, 0x7F800000), builder.shl(builder.and_(magnitude, ir.Constant(i32, 0x3FF)),
                                                                    ir.Constant(i32, 13)))
    is_special = builder.icmp_unsigned(">=", magnitude, ir.Constant(i32, 0x7C00))
    value = builder.select(is_special, special, builder.bitcast(finite, i32))
    return builder.bitcast(builder.or_(value, sign), f32)


def _half_bits_intrinsic():
    """half_to_f32(v): an int16 holding float16 bits as float32 (half_bits_to_float), and
    float32 passed through, for kernels whose scales are stored as float16."""
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def half_to_f32(typingctx, v):
        if v == types.float32:
            return types.float32(v), lambda context, builder, sig, args: args[0]
        if v not in (types.int16, types.uint16):
            return None

        def codegen(context, builder, sig, args):
            return half_bits_to_float(builder, args[0])
        return types.float32(v), codegen
    return half_to_f32


