"""LLVM IR for rounding a prompt's activations to int8 as ggml's vec_dot types (gemm_kernels.
quantize_activations drives it): a block's 32 values as one vector, its largest magnitude by an
integer max over the floats' bits without their sign (a non-negative float orders as its bits, and
bits at or over an infinity's mark a block that holds an infinity or a NaN), rint and the sums of
each 16 values in the same pass. numba's own loops over the same arithmetic stay scalar.

    round_row_q8_0(x, xq, dx, sums)
        row x f32 [K] -> xq int8 [K] as ggml's Q8_0 (per 32 values: d = max|x| / 127, q =
        rint(x * (1 / d)); d as the decode's rounding computes it, max|x| times 1/127 in
        float32, which can be one unit in the last place from ggml's division), dx f32 [K/32] the scales (NaN bits for a block with a non-finite value,
        its q 0), sums int32 [K/16] each 16 values' sum of q
    round_row_q8_0_pairs(x, xq, dx, sums)
        round_row_q8_0 with xq in the pair order of Q4_0's and IQ4_NL's decode product (llvm_ir's
        q4_0_pairs_dot): in each 64 values of a block pair, values 0-15 of both blocks, then 16-31
        of both (an odd last block as it is); dx and sums as round_row_q8_0's
    round_row_q8_k(x, xq, dx, sums)
        the same as ggml's Q8_K (per 256 values: d = m / -127 with m the first value of the largest
        magnitude, q = min(127, rint(x / d)); a block of zeros: d 0 and q 0), dx f32 [K/256]

The float steps are IEEE (no fast-math flags), those of the scalar code they replace, so the
rounding is the same bit for bit.
"""
from __future__ import annotations

import numpy as np



def _rounding_intrinsics(nan_bits: int):
    """(round_row_q8_0, round_row_q8_0_pairs, round_row_q8_k); nan_bits: the scale of a block that holds a non-finite
    value (quant_kernels.NAN_BITS)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    i1, i8, i32, f32 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.FloatType()
    vec = ir.VectorType
    v32f, v32i, v32b = vec(f32, 32), vec(i32, 32), vec(i8, 32)

    def fn(module, name, ret, *args):
        return cgutils.get_or_insert_function(module, ir.FunctionType(ret, list(args)), name)

    def splat(builder, x, n):
        one = builder.insert_element(ir.Constant(vec(x.type, n), ir.Undefined), x, ir.Constant(i32, 0))
        return builder.shuffle_vector(one, one, ir.Constant(vec(i32, n), [0] * n))

    def pointers(context, builder, sig, args):
        arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in range(4)]
        n_values = builder.extract_value(arrays[0].shape, 0)
        return [a.data for a in arrays], n_values

    def load_block(builder, xp, at):
        """The 32 floats at x[at] and their magnitudes' bits."""
        values = builder.load(builder.bitcast(builder.gep(xp, [at]), v32f.as_pointer()), align=4)
        bits = builder.and_(builder.bitcast(values, v32i), ir.Constant(v32i, [0x7FFFFFFF] * 32))
        return values, bits

    def store_block(builder, q, bad, qp, sp, at, halves=None):
        """q (<32 x i32>, 0 where bad) into xq[at..at+31] (or its two 16-value halves at the
        positions halves) and its two 16-value sums."""
        q = builder.select(bad, ir.Constant(v32i, [0] * 32), q)
        qb = builder.trunc(q, v32b)
        if halves is None:
            builder.store(qb, builder.bitcast(builder.gep(qp, [at]), v32b.as_pointer()), align=1)
        else:
            for h, where in enumerate(halves):
                part = builder.shuffle_vector(qb, qb, ir.Constant(vec(i32, 16), list(range(16 * h, 16 * h + 16))))
                builder.store(part, builder.bitcast(builder.gep(qp, [where]), vec(i8, 16).as_pointer()), align=1)
        reduce_add = fn(builder.module, "llvm.vector.reduce.add.v16i32", i32, vec(i32, 16))
        half = builder.udiv(at, ir.Constant(at.type, 16))
        for h in range(2):
            part = builder.shuffle_vector(q, q, ir.Constant(vec(i32, 16), list(range(16 * h, 16 * h + 16))))
            builder.store(builder.call(reduce_add, [part]), builder.gep(sp, [builder.add(half, ir.Constant(at.type, h))]))

    def rounded(builder, values, scale):
        rint = fn(builder.module, "llvm.rint.v32f32", v32f, v32f)
        return builder.fptosi(builder.call(rint, [builder.fmul(values, splat(builder, scale, 32))]), v32i)

    def store_scale(builder, dp, at, d, bad):
        nan = builder.bitcast(ir.Constant(i32, nan_bits), f32)
        builder.store(builder.select(bad, nan, d), builder.gep(dp, [at]))

    def row_rounding(block_values, round_block):
        """An intrinsic (x, xq, dx, sums) that runs round_block(builder, pointers, block index, its
        first value, const) for each block of block_values values of the row."""
        @intrinsic
        def round_row(typingctx, x, xq, dx, sums):
            def codegen(context, builder, sig, args):
                ptrs, n_values = pointers(context, builder, sig, args)
                const = lambda v: ir.Constant(n_values.type, v)  # noqa: E731
                count = builder.udiv(n_values, const(block_values))
                with cgutils.for_range(builder, count) as loop:
                    round_block(builder, ptrs, loop.index, builder.mul(loop.index, const(block_values)), const,
                                count)
                return context.get_dummy_value()
            return types.none(x, xq, dx, sums), codegen
        return round_row

    def largest_bits(builder, bits):
        return builder.call(fn(builder.module, "llvm.vector.reduce.umax.v32i32", i32, v32i), [bits])

    def pair_halves(builder, b, const, count):
        """Where block b's two 16-value halves go in pair order: its pair's 64 values hold values
        0-15 of both blocks, then 16-31 of both; an odd last block (no partner) stays as it is."""
        first = builder.add(builder.mul(builder.lshr(b, const(1)), const(64)),
                            builder.mul(builder.and_(b, const(1)), const(16)))
        partner = builder.icmp_unsigned("<", builder.or_(b, const(1)), count)
        return first, builder.add(first, builder.select(partner, const(32), const(16)))

    def q8_0_block(builder, ptrs, b, at, const, count, paired=False):
        xp, qp, dp, sp = ptrs
        values, bits = load_block(builder, xp, at)
        top = largest_bits(builder, bits)
        bad = builder.icmp_unsigned(">=", top, ir.Constant(i32, 0x7F800000))
        d = builder.fmul(builder.bitcast(top, f32), ir.Constant(f32, float(np.float32(1 / 127))))
        positive = builder.fcmp_ordered(">", d, ir.Constant(f32, 0.0))
        inv = builder.select(positive, builder.fdiv(ir.Constant(f32, 1.0), d), ir.Constant(f32, 0.0))
        halves = pair_halves(builder, b, const, count) if paired else None
        store_block(builder, rounded(builder, values, inv), bad, qp, sp, at, halves)
        store_scale(builder, dp, b, d, bad)

    def q8_0_pairs_block(builder, ptrs, b, at, const, count):
        q8_0_block(builder, ptrs, b, at, const, count, paired=True)

    def q8_k_block(builder, ptrs, sb, base, const, _count):
        xp, qp, dp, sp = ptrs
        cttz = fn(builder.module, "llvm.cttz.i32", i32, i32, i1)
        chunks = [load_block(builder, xp, builder.add(base, const(32 * c))) for c in range(8)]
        top = largest_bits(builder, chunks[0][1])
        for _, bits in chunks[1:]:
            other = largest_bits(builder, bits)
            top = builder.select(builder.icmp_unsigned(">", other, top), other, top)
        bad = builder.icmp_unsigned(">=", top, ir.Constant(i32, 0x7F800000))
        # the first value of that magnitude: its chunk's lowest matching lane, the first chunk that has one
        first = const(0)
        for c in reversed(range(8)):
            hits = builder.icmp_unsigned("==", chunks[c][1], splat(builder, top, 32))
            word = builder.bitcast(hits, i32)
            lane = builder.zext(builder.call(cttz, [word, ir.Constant(i1, 0)]), first.type)
            found = builder.icmp_unsigned("!=", word, ir.Constant(i32, 0))
            first = builder.select(found, builder.add(const(32 * c), lane), first)
        vmax = builder.load(builder.gep(xp, [builder.add(base, first)]))
        zero = builder.icmp_unsigned("==", top, ir.Constant(i32, 0))
        iscale = builder.select(zero, ir.Constant(f32, 0.0), builder.fdiv(ir.Constant(f32, -127.0), vmax))
        cap = ir.Constant(v32i, [127] * 32)
        for c, (values, _) in enumerate(chunks):
            q = rounded(builder, values, iscale)
            q = builder.select(builder.icmp_signed(">", q, cap), cap, q)
            store_block(builder, q, bad, qp, sp, builder.add(base, const(32 * c)))
        d = builder.select(zero, ir.Constant(f32, 0.0), builder.fdiv(ir.Constant(f32, 1.0), iscale))
        store_scale(builder, dp, sb, d, bad)

    return row_rounding(32, q8_0_block), row_rounding(32, q8_0_pairs_block), row_rounding(256, q8_k_block)
