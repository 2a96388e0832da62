"""LLVM IR for the prompt's int8 GEMM over ggml's blocks (gemm_kernels.py drives it).

A micro-batch's product out[m, n] = sum_k W[n, k] x[m, k] runs as ggml's integer dot products
do, with ggml's per-block scales: the activations rounded to int8 as ggml's vec_dot types
(Q8_0 for Q8_0/Q4_0 weights, Q8_K for the K-quants), each weight group's integer dot times its
scale and the activations' scale. The weight's rows are laid out per call in panels of
PANEL_ROWS rows in which one 16-lane vector holds 4 consecutive values of 16 rows (lanes =
rows), so that one vpdpbusd multiplies 64 bytes of weights by 4 activation values broadcast to
every lane, and a group's scales are applied once per 16 rows (a vector of the rows' scales),
not once per row as in a row's dot product, and the K-quants' integer sub-scales multiply the
groups' integer dots (vpmulld) with one float step per 256 values, as ggml's kernels (its rates
beside oneDNN's bf16 GEMM and the vpdpbusd peak: scripts/bench_cpu_peaks.py, docs/benchmarks.md).

    pack_rows(w0, w1, w2, w3, panel, scales, mins, r0, kind)
        rows r0..r0+3 (r0 % 4 == 0) of a panel from four rows of ggml blocks (uint8 [row bytes];
        kind: 34 Q8_0, 18 Q4_0, 144 Q4_K, 176 Q5_K, 210 Q6_K, 136 IQ4_XS, IQ4_NL_KIND IQ4_NL, 20 Q4_1, 22 Q5_0,
        24 Q5_1, 84 Q2_K, 110 Q3_K), K values each: row r's u8 values
        u = q + ZERO[kind] at panel[(k // 4) * 4 * PANEL_ROWS + 4 r + k % 4], group j's scale
        at scales[j * PANEL_ROWS + r] (float32 d; the K-quants' integer sc as int32, their
        super-block b's d at scales[(K / G + b) * PANEL_ROWS + r], Q2_K's and Q3_K's at each of
        its 8 scale blocks of 32 b' at scales[(K / G + b') * PANEL_ROWS + r]), and Q4_K's and Q5_K's
        -dmin * m_j (Q4_1's and Q5_1's m_j, Q2_K's -dmin m of each 16) at mins[j * PANEL_ROWS + r]
    tile(panel, scales, mins, xq, dx, xz, xm, out, cols, kind)
        out[c, :PANEL_ROWS] = sum_j scales[j, :] dx[c, j G / B] (sum_{k in j} u[k, :] xq[c, k]
        + xz[c, j]) (+ sum_j mins[j, :] xm[c, j] for the kinds with a bias: Q4_K, Q5_K and
        the layout's BIAS_KINDS; the K-quants' groups summed
        as integers times their sc over each super-block, then times d dx), c < cols (a compile-time
        1..TILE_COLS); xq int8 [cols, K], dx f32 [cols, K/B] (B the kind's activation scale
        block), xz int32 [cols, K/G] (minus ZERO times each group's sum of xq), xm f32
        [cols, K/G] (the scale times the sum of xq per group, for the biases)

Where numba's target has AVX512-VNNI the vectors are 512 bits (16 rows); with AVX-VNNI's 256-bit
vpdpbusd or AVX2 they are 256 bits (8 rows, gemm_isa), the panel's layout the same. AVX2 has no
byte dot into int32: vpmaddubsw sums pairs of u8 x s8 products in int16, then vpmaddwd by ones
sums those pairs into int32, as ggml's AVX2 kernels do; the values (u <= 63, |x| <= 127) cannot
saturate the int16 pairs, except Q8_0's u = q + 128, so there Q8_0's panel holds q and the tile
multiplies |q| by x with q's sign (vpabsb, vpsignb). Every path's integer dots are exact and its
float steps the same per lane, so all give the same products bit for bit. Without AVX2 (or off
x86) prompts keep the bf16/f32 GEMM.
"""
from __future__ import annotations

from .llvm_ir import (IQ4_NL_KIND, LOW_K_KINDS, OFFSET_BLOCK_FIELDS, OFFSET_BLOCK_KINDS, block_bytes,
                      half_bits_to_float, iq4_nl_values, iq4_xs_scales, iq4_xs_values, k_quant_values, load_i8,
                      low_k_values, nibble_values_at, offset_block_values, q2_k_scales_and_mins, q3_k_scales,
                      q4_k_scales_and_mins_words, q6_k_values, target_features)

PANEL_ROWS = 32   # two 16-lane vectors of rows (four 8-lane ones)
TILE_COLS = 4     # activation rows an AVX-512 tile multiplies (4 x 2 int and 4 x 2 float accumulators)
# kind -> (group size G, zero point ZERO: the u8 values are q + ZERO, the activations' scale
# block: 32 values (Q8_0's rounding) or 256 (Q8_K's, the K-quants' vec_dot type in ggml))
GEMM_KINDS = {34: (32, 128, 32), 18: (32, 8, 32), 144: (32, 0, 256), 176: (32, 0, 256), 210: (16, 32, 256),
              IQ4_NL_KIND: (32, 128, 32), 136: (32, 128, 256),
              32: (32, 128, 32), 33: (32, 128, 32), 16: (16, 128, 32), 17: (16, 128, 32), 4: (32, 0, 32),
              20: (32, 0, 32), 22: (32, 16, 32), 24: (32, 0, 32), 84: (16, 0, 32), 110: (16, 4, 32)}
# kind -> its block's values
BLOCK_VALUES = {34: 32, 18: 32, 144: 256, 176: 256, 210: 256, 136: 256, IQ4_NL_KIND: 32,
                **{k: 32 for k in OFFSET_BLOCK_KINDS}, **{k: 256 for k in LOW_K_KINDS}}
# the fused layout's rows (layouts/fused.py: q, float32 group scales, float32 biases), packed by
# gemm_kernels.pack_layout_rows, not by pack_rows: int8 q in groups of 32 (32, 33 with a bias)
# or 16 (16, 17), and Q4_1's nibbles with its bias (4). Their activations round as Q8_0 per 32.
LAYOUT_KINDS = (32, 33, 16, 17, 4)
# weights of any int8 value: u = q + 128 (q itself on AVX2); IQ4_NL's and IQ4_XS's values (-127..113) too
INT8_KINDS = (34, IQ4_NL_KIND, 136, 32, 33, 16, 17)
# integer group scales summed over each activation scale block (the K-quants' super-blocks of 256;
# Q2_K's and Q3_K's activations round per 32, as their matvec's)
K_QUANT_KINDS = (144, 176, 210, 136) + LOW_K_KINDS
BIAS_KINDS = (144, 176, 33, 17, 4, 20, 24, 84)  # a float offset per group (the mins): times the activations' group sums


def gemm_isa() -> str | None:
    """The byte dot the GEMM runs on numba's target: "avx512vnni" (512-bit vpdpbusd, 16 rows a
    vector), "vnni256" (256-bit vpdpbusd: AVX-VNNI, or AVX512-VNNI with VL but not BW), "avx2"
    (vpmaddubsw + vpmaddwd over 256 bits, as ggml's AVX2 kernels), or None (the float GEMM)."""
    feats = target_features()
    if {"avx512vnni", "avx512bw", "avx512f"} <= feats:
        return "avx512vnni"
    if "avxvnni" in feats or {"avx512vnni", "avx512vl"} <= feats:
        return "vnni256"
    if "avx2" in feats:
        return "avx2"
    return None


def gemm_available() -> bool:
    """Whether numba's target has a byte dot the GEMM runs on (gemm_isa)."""
    return gemm_isa() is not None


def vector_rows(isa: str) -> int:
    """The panel rows one vector holds (its 32-bit lanes)."""
    return 16 if isa == "avx512vnni" else 8


def tile_cols(isa: str) -> int:
    """Activation rows a tile multiplies: its int and float accumulators, TILE_COLS x
    PANEL_ROWS / vector_rows each, fit the register file (32 vectors with AVX-512, 16 without)."""
    return TILE_COLS if isa == "avx512vnni" else 2


def gains(kind: int, isa: str) -> bool:
    """Whether the int8 GEMM beats dequantizing the weight for the float GEMM on this kind by
    default: every kind but the int8 ones (Q8_0's, the fused layout's int8 q) on AVX2, whose |q|
    and sign of q cost half as many instructions again as the other kinds' products, which left
    Q8_0 slower than the f32 GEMM (measured with scripts/bench_int8_gemm.py;
    TORCHGGML_CPU_GEMM=int8 still runs it), and Q4_1's nibbles (4): their int8 activations put
    one of SmolLM2 Q4_1's greedy tokens off llama.cpp's (tests/test_real_models.py), in the
    fused layout or in place (20). The fused layout's kinds and the offset kinds in place take
    it from fused.LAYOUT_INT8_MIN_ROWS rows (a short prompt keeps the float GEMM's finer
    rounding)."""
    return not (kind in INT8_KINDS and isa == "avx2") and kind not in (4, 20)


def kind_params(kind: int, isa: str) -> tuple[int, int, int]:
    """(group size, zero point, activation scale block) of a kind on an ISA: AVX2's vpmaddubsw
    sums pairs of u8 x s8 products in int16, which an int8 kind's u = q + 128 would overflow, so
    there its panel holds q itself (zero 0) and the tile multiplies |q| by x with q's sign, as
    ggml's AVX2 kernels do for Q8_0."""
    group, zero, scale_block = GEMM_KINDS[kind]
    return (group, 0, scale_block) if kind in INT8_KINDS and isa == "avx2" else (group, zero, scale_block)


def _gemm_intrinsics(isa: str):
    """(pack_rows, tile) for the ISA (gemm_isa)."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    i8, i16, i32, f32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()
    vec = ir.VectorType
    width = vector_rows(isa)  # rows (int32 lanes) a vector holds
    lanes = PANEL_ROWS // width  # vectors a panel's rows take
    FAST = ("fast",)

    def array(context, builder, sig, args, i):
        return context.make_array(sig.args[i])(context, builder, args[i])

    def splat(builder, x, n):
        one = builder.insert_element(ir.Constant(vec(x.type, n), ir.Undefined), x, ir.Constant(i32, 0))
        return builder.shuffle_vector(one, one, ir.Constant(vec(i32, n), [0] * n))

    @intrinsic
    def pack_rows(typingctx, w0, w1, w2, w3, panel, scales, mins, r0, kind):
        if not isinstance(kind, types.IntegerLiteral):
            return None
        k = kind.literal_value

        def codegen(context, builder, sig, args):
            wps = [builder.bitcast(array(context, builder, sig, args, i).data, i8.as_pointer()) for i in range(4)]
            pp = builder.bitcast(array(context, builder, sig, args, 4).data, i8.as_pointer())
            sp = array(context, builder, sig, args, 5).data
            mp = array(context, builder, sig, args, 6).data
            row0 = args[7]
            row_bytes = builder.extract_value(array(context, builder, sig, args, 0).shape, 0)
            i64 = row_bytes.type
            const = lambda v: ir.Constant(i64, v)  # noqa: E731
            n_values = builder.mul(builder.udiv(row_bytes, const(block_bytes(k))), const(BLOCK_VALUES[k]))
            row_at = builder.mul(row0, const(4))

            def store_values(rows_u, at):
                """The 4 rows' <32 x i8> values at..at+31 into the panel: a 4 x 8 transpose of
                4-byte words, then one 16-byte store per 4 values (the 4 rows side by side)."""
                a, b, c, d = (builder.bitcast(u, vec(i32, 8)) for u in rows_u)
                mask = lambda lanes: ir.Constant(vec(i32, len(lanes)), lanes)  # noqa: E731
                low, high = [0, 8, 1, 9, 2, 10, 3, 11], [4, 12, 5, 13, 6, 14, 7, 15]
                ab = (builder.shuffle_vector(a, b, mask(low)), builder.shuffle_vector(a, b, mask(high)))
                cd = (builder.shuffle_vector(c, d, mask(low)), builder.shuffle_vector(c, d, mask(high)))
                quad = builder.udiv(at, const(4))
                for q in range(8):
                    h, e = q // 4, 2 * (q % 4)
                    words = builder.shuffle_vector(ab[h], cd[h], mask([e, e + 1, 8 + e, 9 + e]))
                    dst = builder.add(builder.mul(builder.add(quad, const(q)), const(4 * PANEL_ROWS)), row_at)
                    builder.store(words, builder.bitcast(builder.gep(pp, [dst]), vec(i32, 4).as_pointer()), align=4)

            # the K-quants' scales as int32 (the groups' integer dots times them are summed as
            # integers over each super-block, as ggml's kernels do), their d after the groups'
            int_scales = builder.bitcast(sp, i32.as_pointer())

            def store_float(ptr, value, group, row):
                at = builder.add(builder.add(builder.mul(group, const(PANEL_ROWS)), row0), const(row))
                builder.store(value, builder.gep(ptr, [at]))

            def half_at(wp, at):
                bits = builder.load(builder.bitcast(builder.gep(wp, [at]), i16.as_pointer()), align=1)
                return half_bits_to_float(builder, bits)
            if k in (34, 18, IQ4_NL_KIND):
                with cgutils.for_range(builder, builder.udiv(n_values, const(32))) as loop:
                    j = loop.index
                    at = builder.mul(j, const(block_bytes(k)))
                    if k == 34:  # q + 128 (the sign bit flipped) or, with zero 0, q
                        us = [load_i8(builder, wp, builder.add(at, const(2)), 32) for wp in wps]
                        if kind_params(34, isa)[1]:
                            us = [builder.xor(u, ir.Constant(vec(i8, 32), [-128] * 32)) for u in us]
                    elif k == IQ4_NL_KIND:  # the table's values plus the zero point
                        us = [iq4_nl_values(builder, nibble_values_at(builder, wp, builder.add(at, const(2))),
                                            kind_params(k, isa)[1]) for wp in wps]
                    else:
                        us = [nibble_values_at(builder, wp, builder.add(at, const(2))) for wp in wps]
                    store_values(us, builder.mul(j, const(32)))
                    for row, wp in enumerate(wps):
                        store_float(sp, half_at(wp, at), j, row)
            elif k in OFFSET_BLOCK_KINDS:  # u (Q5_0's q + 16), d, and Q4_1's and Q5_1's m
                min_at = OFFSET_BLOCK_FIELDS[k][2]
                with cgutils.for_range(builder, builder.udiv(n_values, const(32))) as loop:
                    j = loop.index
                    at = builder.mul(j, const(k))
                    store_values([offset_block_values(builder, wp, at, k) for wp in wps], builder.mul(j, const(32)))
                    for row, wp in enumerate(wps):
                        store_float(sp, half_at(wp, at), j, row)
                        if min_at is not None:
                            store_float(mp, half_at(wp, builder.add(at, const(min_at))), j, row)
            elif k in (144, 176):
                with cgutils.for_range(builder, builder.udiv(n_values, const(256))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(k))
                    for row, wp in enumerate(wps):  # integer scales, d, and the mins
                        words = q4_k_scales_and_mins_words(builder, wp, builder.add(at, const(4)))
                        d, dmin = half_at(wp, at), half_at(wp, builder.add(at, const(2)))
                        store_float(sp, d, builder.add(builder.udiv(n_values, const(32)), blk), row)
                        for g in range(8):
                            group = builder.add(builder.mul(blk, const(8)), const(g))
                            sc = builder.zext(builder.extract_element(words, ir.Constant(i32, g)), i32)
                            m = builder.uitofp(builder.extract_element(words, ir.Constant(i32, 8 + g)), f32)
                            store_float(int_scales, sc, group, row)
                            store_float(mp, builder.fneg(builder.fmul(dmin, m)), group, row)
                    for g in range(8):
                        store_values([k_quant_values(builder, wp, at, g, k) for wp in wps],
                                     builder.add(builder.mul(blk, const(256)), const(32 * g)))
            elif k == 136:  # IQ4_XS: the table's values plus the zero point, ls - 32 as integer scales
                zero = kind_params(k, isa)[1]
                with cgutils.for_range(builder, builder.udiv(n_values, const(256))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(136))
                    for row, wp in enumerate(wps):
                        store_float(sp, half_at(wp, at), builder.add(builder.udiv(n_values, const(32)), blk), row)
                        scales8 = iq4_xs_scales(builder, wp, at)
                        for g in range(8):
                            store_float(int_scales, builder.extract_element(scales8, ir.Constant(i32, g)),
                                        builder.add(builder.mul(blk, const(8)), const(g)), row)
                    for g in range(8):
                        store_values([iq4_xs_values(builder, wp, at, g, zero) for wp in wps],
                                     builder.add(builder.mul(blk, const(256)), const(32 * g)))
            elif k in LOW_K_KINDS:  # groups of 16: u (Q3_K's q + 4), integer scales, Q2_K's mins
                with cgutils.for_range(builder, builder.udiv(n_values, const(256))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(k))
                    for g in range(8):
                        store_values([low_k_values(builder, wp, at, g, k) for wp in wps],
                                     builder.add(builder.mul(blk, const(256)), const(32 * g)))
                    for row, wp in enumerate(wps):
                        if k == 84:
                            sc16, m16 = q2_k_scales_and_mins(builder, wp, at)
                            dmin = half_at(wp, builder.add(at, const(82)))
                        else:
                            sc16 = q3_k_scales(builder, wp, builder.add(at, const(96)))
                        d = half_at(wp, builder.add(at, const(80 if k == 84 else 108)))
                        for t in range(8):  # d for each 32 values (the activations' scale block)
                            store_float(sp, d, builder.add(builder.udiv(n_values, const(16)),
                                                           builder.add(builder.mul(blk, const(8)), const(t))), row)
                        for g in range(16):
                            group = builder.add(builder.mul(blk, const(16)), const(g))
                            store_float(int_scales, builder.sext(builder.extract_element(sc16, ir.Constant(i32, g)), i32),
                                        group, row)
                            if k == 84:
                                m = builder.uitofp(builder.extract_element(m16, ir.Constant(i32, g)), f32)
                                store_float(mp, builder.fneg(builder.fmul(dmin, m)), group, row)
            else:  # 210: groups of 16
                with cgutils.for_range(builder, builder.udiv(n_values, const(256))) as loop:
                    blk = loop.index
                    at = builder.mul(blk, const(210))
                    for h in range(2):
                        for t in range(4):
                            store_values([q6_k_values(builder, wp, at, h, t) for wp in wps],
                                         builder.add(builder.mul(blk, const(256)), const(h * 128 + 32 * t)))
                    for row, wp in enumerate(wps):
                        store_float(sp, half_at(wp, builder.add(at, const(208))),
                                    builder.add(builder.udiv(n_values, const(16)), blk), row)
                        for g in range(16):
                            sc = builder.load(builder.gep(wp, [builder.add(at, const(192 + g))]))
                            store_float(int_scales, builder.sext(sc, i32),
                                        builder.add(builder.mul(blk, const(16)), const(g)), row)
            return context.get_dummy_value()
        return types.none(w0, w1, w2, w3, panel, scales, mins, r0, kind), codegen

    @intrinsic
    def tile(typingctx, panel, scales, mins, xq, dx, xz, xm, out, cols, kind):
        if not (isinstance(cols, types.IntegerLiteral) and isinstance(kind, types.IntegerLiteral)):
            return None
        n_cols, k = cols.literal_value, kind.literal_value
        group, zero, scale_block = kind_params(k, isa)
        quads = group // 4
        vi32, vf32 = vec(i32, width), vec(f32, width)

        def codegen(context, builder, sig, args):
            pp = builder.bitcast(array(context, builder, sig, args, 0).data, i8.as_pointer())
            sp = array(context, builder, sig, args, 1).data
            mp = array(context, builder, sig, args, 2).data
            xa = array(context, builder, sig, args, 3)
            xp = builder.bitcast(xa.data, i8.as_pointer())
            dp = array(context, builder, sig, args, 4).data
            zp = array(context, builder, sig, args, 5).data
            mxp = array(context, builder, sig, args, 6).data
            oa = array(context, builder, sig, args, 7)
            op = builder.bitcast(oa.data, i8.as_pointer())
            n_values = builder.extract_value(xa.shape, 1)
            i64 = n_values.type
            const = lambda v: ir.Constant(i64, v)  # noqa: E731
            x_stride = builder.extract_value(xa.strides, 0)
            out_stride = builder.extract_value(oa.strides, 0)
            n_groups = builder.udiv(n_values, const(group))
            n_scales = builder.udiv(n_values, const(scale_block))
            dot = _byte_dot(builder, isa, width, signed_weights=k in INT8_KINDS and not zero)
            zeros_f = ir.Constant(vf32, [0.0] * width)
            accs = [[cgutils.alloca_once_value(builder, zeros_f) for _ in range(lanes)] for _ in range(n_cols)]

            def store_out():
                for c in range(n_cols):
                    for r in range(lanes):
                        at = builder.add(builder.mul(const(c), out_stride), const(4 * width * r))
                        out_ptr = builder.bitcast(builder.gep(op, [at]), vf32.as_pointer())
                        builder.store(builder.load(accs[c][r]), out_ptr, align=4)
                return context.get_dummy_value()

            def rows_vector(ptr, j, r):
                at = builder.add(builder.mul(j, const(PANEL_ROWS)), const(width * r))
                return builder.load(builder.bitcast(builder.gep(ptr, [at]), vf32.as_pointer()), align=4)

            def group_ints(j):
                """Group j's integer dots, [column][vector of rows]."""
                # the integer sums start at -ZERO * (the activations' group sum): the zero
                # point's share, one broadcast load a row instead of a subtraction per vector
                ints = []
                for c in range(n_cols):
                    if zero:
                        z = builder.load(builder.gep(zp, [builder.add(builder.mul(const(c), n_groups), j)]))
                        ints.append([splat(builder, z, width)] * lanes)
                    else:
                        ints.append([ir.Constant(vi32, [0] * width)] * lanes)
                for q in range(quads):
                    quad = builder.add(builder.mul(j, const(quads)), const(q))
                    weights = [builder.load(builder.bitcast(
                        builder.gep(pp, [builder.add(builder.mul(quad, const(4 * PANEL_ROWS)), const(4 * width * r))]),
                        vi32.as_pointer()), align=1) for r in range(lanes)]
                    for c in range(n_cols):
                        at = builder.add(builder.mul(const(c), x_stride), builder.mul(quad, const(4)))
                        x4 = builder.load(builder.bitcast(builder.gep(xp, [at]), i32.as_pointer()), align=1)
                        xs = splat(builder, x4, width)
                        for r in range(lanes):
                            ints[c][r] = dot(ints[c][r], weights[r], xs)
                return ints

            def add_scaled(c, r, ints, scale):
                term = builder.fmul(builder.sitofp(ints, vf32), scale, flags=FAST)
                builder.store(builder.fadd(builder.load(accs[c][r]), term, flags=FAST), accs[c][r])

            def dx_splat(c, block):
                return splat(builder, builder.load(builder.gep(dp, [builder.add(builder.mul(const(c), n_scales), block)])), width)

            if k in K_QUANT_KINDS:  # K-quants, IQ4_XS: sum_g sc_g (q_g . x_g) in integers over each super-block
                zeros_i = ir.Constant(vi32, [0] * width)
                totals = [[cgutils.alloca_once_value(builder, zeros_i) for _ in range(lanes)] for _ in range(n_cols)]
                int_scales = builder.bitcast(sp, i32.as_pointer())
                with cgutils.for_range(builder, n_scales) as outer:
                    sb = outer.index
                    for c in range(n_cols):
                        for r in range(lanes):
                            builder.store(zeros_i, totals[c][r])
                    with cgutils.for_range(builder, const(scale_block // group)) as inner:
                        j = builder.add(builder.mul(sb, const(scale_block // group)), inner.index)
                        ints = group_ints(j)
                        sc = [builder.load(builder.bitcast(
                            builder.gep(int_scales, [builder.add(builder.mul(j, const(PANEL_ROWS)), const(width * r))]),
                            vi32.as_pointer()), align=4) for r in range(lanes)]
                        for c in range(n_cols):
                            for r in range(lanes):
                                builder.store(builder.add(builder.load(totals[c][r]), builder.mul(ints[c][r], sc[r])),
                                              totals[c][r])
                        if k in BIAS_KINDS:  # the mins: -dmin m_g times the activations' sums, in float
                            row_mins = [rows_vector(mp, j, r) for r in range(lanes)]
                            for c in range(n_cols):
                                xm_at = builder.add(builder.mul(const(c), n_groups), j)
                                xmc = splat(builder, builder.load(builder.gep(mxp, [xm_at])), width)
                                for r in range(lanes):
                                    acc = builder.fadd(builder.load(accs[c][r]), builder.fmul(row_mins[r], xmc, flags=FAST),
                                                       flags=FAST)
                                    builder.store(acc, accs[c][r])
                    row_d = [rows_vector(sp, builder.add(n_groups, sb), r) for r in range(lanes)]
                    for c in range(n_cols):
                        dxs = dx_splat(c, sb)
                        for r in range(lanes):
                            add_scaled(c, r, builder.load(totals[c][r]), builder.fmul(row_d[r], dxs, flags=FAST))
                return store_out()

            with cgutils.for_range(builder, n_groups) as loop:
                j = loop.index
                ints = group_ints(j)
                block = builder.udiv(j, const(scale_block // group))
                row_scales = [rows_vector(sp, j, r) for r in range(lanes)]
                row_mins = [rows_vector(mp, j, r) for r in range(lanes)] if k in BIAS_KINDS else None
                for c in range(n_cols):
                    dxc = builder.load(builder.gep(dp, [builder.add(builder.mul(const(c), n_scales), block)]))
                    dxs = splat(builder, dxc, width)
                    if row_mins is not None:
                        xm_at = builder.add(builder.mul(const(c), n_groups), j)
                        xmc = splat(builder, builder.load(builder.gep(mxp, [xm_at])), width)
                    for r in range(lanes):
                        scale = builder.fmul(row_scales[r], dxs, flags=FAST)
                        term = builder.fmul(builder.sitofp(ints[c][r], vf32), scale, flags=FAST)
                        acc = builder.fadd(builder.load(accs[c][r]), term, flags=FAST)
                        if row_mins is not None:
                            acc = builder.fadd(acc, builder.fmul(row_mins[r], xmc, flags=FAST), flags=FAST)
                        builder.store(acc, accs[c][r])
            return store_out()
        return types.none(panel, scales, mins, xq, dx, xz, xm, out, cols, kind), codegen

    return pack_rows, tile


def _byte_dot(builder, isa: str, width: int, signed_weights: bool):
    """dot(acc, w, x): acc (<width x i32>) plus, in each lane, the sum of its 4 byte products
    w * x, w unsigned (signed where signed_weights: AVX2's Q8_0) and x signed, exact: vpdpbusd
    (AVX512-VNNI, AVX-VNNI), else vpmaddubsw (pairs summed in int16: |w| <= 128 and |x| <= 127
    cannot saturate) then vpmaddwd by ones (AVX2). Signed weights multiply |w| by x with w's
    sign (vpabsb, vpsignb; w = 0 zeroes x)."""
    from llvmlite import ir
    from numba.core import cgutils
    i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
    vec, module = ir.VectorType, builder.module
    lanes, vb, vw = vec(i32, width), vec(i8, 4 * width), vec(i16, 2 * width)

    def fn(name, ret, *args):
        return cgutils.get_or_insert_function(module, ir.FunctionType(ret, list(args)), name)
    if isa in ("avx512vnni", "vnni256"):
        vpdpbusd = fn(f"llvm.x86.avx512.vpdpbusd.{32 * width}", lanes, lanes, lanes, lanes)
        return lambda acc, w, x: builder.call(vpdpbusd, [acc, w, x])
    maddubs = fn("llvm.x86.avx2.pmadd.ub.sw", vw, vb, vb)
    maddwd = fn("llvm.x86.avx2.pmadd.wd", lanes, vw, vw)
    sign = fn("llvm.x86.avx2.psign.b", vb, vb, vb)
    absolute = fn("llvm.abs.v32i8", vb, vb, ir.IntType(1))
    ones = ir.Constant(vw, [1] * (2 * width))

    def dot(acc, w, x):
        wb, xb = builder.bitcast(w, vb), builder.bitcast(x, vb)
        if signed_weights:
            wb, xb = builder.call(absolute, [wb, ir.Constant(ir.IntType(1), 0)]), builder.call(sign, [xb, wb])
        return builder.add(acc, builder.call(maddwd, [builder.call(maddubs, [wb, xb]), ones]))
    return dot
