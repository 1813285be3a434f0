// Fused causal attention, FlashAttention-2 style, f32 throughout.
//
// Layout (the CPU op's): qkv is [batch * T, W + 2 KV dh] with W = H * dh,
// each row [Q_0 .. Q_{H-1} | K_0 .. K_{KV-1} | V_0 .. V_{KV-1}]; query head h
// reads key/value head h / (H / KV) (grouped-query attention; KV = H is
// multi-head, KV = 1 multi-query); out, dout [batch * T, W]; lse, delta
// [batch, H, T]. Scores are scale * q.k, causal (key <= query).
//
// Templates: D is the head width rounded up to a power of two in 16..128
// (columns dh..D are loaded as zeros and never stored), R the rows (or
// keys) each of the WARPS warps owns; the Rust side instantiates them
// (attention.rs) and computes the grids with the same numbers. A lane owns
// one key (or query) of a 32-wide tile for the scores and head columns
// lane, lane + 32, .. for the products, so every row reduction is a warp
// reduction and no barrier sits in a divergent branch.
//
// Shared tiles read by lane-varying rows are stored rotated: element (j, d)
// at j * D + ((d + 4j) mod D). A float4 of 4 consecutive d stays contiguous
// and 16-byte aligned, and the 32 lanes of a warp (row j = lane) or the 32
// columns of one row (d = lane + ..) fall in distinct banks (2-way for D = 16).

#define NEG_INF __int_as_float(0xff800000)
#define FULL 0xffffffffu
#define WARPS 4
#define THREADS (WARPS * 32)
#define TILE 32
#define SMEM_MAX (48 * 1024)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

template <int D> __device__ __forceinline__ int rot(int j, int d) {
    return j * D + ((d + 4 * j) & (D - 1));
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return (a.x * b.x + a.y * b.y) + (a.z * b.z + a.w * b.w);
}

// Pointers to the first row of sequence b's Q columns of query head h, and
// of the K and V columns of the key/value head it reads; W3 is the qkv row.
struct Heads {
    const float* q;
    const float* k;
    const float* v;
};
__device__ __forceinline__ Heads heads_of(const float* qkv, int b, int h, int T, int H, int KV,
                                          int dh) {
    const int W = H * dh, W3 = W + 2 * KV * dh, kv = h / (H / KV);
    const float* row = qkv + (long long)b * T * W3;
    Heads p;
    p.q = row + h * dh;
    p.k = row + W + kv * dh;
    p.v = row + W + KV * dh + kv * dh;
    return p;
}

// Loads rows t0 .. t0 + rows - 1 of one head (columns 0 .. D - 1, zeros at
// t >= T or d >= dh) from `src` (row stride ld) into `dst`, rotated or plain.
template <int D, bool ROT>
__device__ void load_tile(float* dst, const float* src, long long ld, int t0, int rows, int T,
                          int dh) {
    for (int idx = threadIdx.x; idx < rows * D; idx += THREADS) {
        int j = idx / D, d = idx - j * D;
        int t = t0 + j;
        float v = (t < T && d < dh) ? src[(long long)t * ld + d] : 0.0f;
        dst[ROT ? rot<D>(j, d) : idx] = v;
    }
}

// Forward. Grid: (ceil(T / (WARPS * R)), batch * H); block: THREADS. Block
// owns query rows q0 .. q0 + WARPS * R - 1 of head (b, h), warp w rows
// q0 + w * R + r. Loops over key tiles of TILE up to the block's last row:
// scores (lane = key), online softmax per row (running max m, sum l),
// P through shared memory, O += P V (lane = head columns). Writes out and
// lse = m + log(l) for rows < T.
template <int D, int R>
__device__ void attn_fwd(float* out, float* lse, const float* qkv, int T, int H, int KV,
                         int dh, float scale) {
    constexpr int BQ = WARPS * R, NC = (D + 31) / 32;
    __shared__ __align__(16) float Qs[BQ * D];
    __shared__ __align__(16) float Ks[TILE * D];
    __shared__ __align__(16) float Vs[TILE * D];
    __shared__ __align__(16) float Ps[BQ * TILE];
    static_assert(sizeof(float) * (BQ * D + 2 * TILE * D + BQ * TILE) <= SMEM_MAX, "smem");
    const int W = H * dh, W3 = W + 2 * KV * dh;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q0 = blockIdx.x * BQ, bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const Heads hp = heads_of(qkv, b, h, T, H, KV, dh);
    load_tile<D, false>(Qs, hp.q, W3, q0, BQ, T, dh);
    float m[R], l[R], o[R][NC];
    for (int r = 0; r < R; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
        for (int c = 0; c < NC; ++c) o[r][c] = 0.0f;
    }
    const int kend = min(q0 + BQ, T);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();  // the last tile's readers are done (and Qs is written)
        load_tile<D, true>(Ks, hp.k, W3, k0, TILE, T, dh);
        load_tile<D, true>(Vs, hp.v, W3, k0, TILE, T, dh);
        __syncthreads();
        float s[R];
        for (int r = 0; r < R; ++r) s[r] = 0.0f;
        for (int d = 0; d < D; d += 4) {
            float4 k4 = *(const float4*)&Ks[rot<D>(lane, d)];
            for (int r = 0; r < R; ++r)
                s[r] += dot4(*(const float4*)&Qs[(warp * R + r) * D + d], k4);
        }
        const int kj = k0 + lane;
        for (int r = 0; r < R; ++r) {
            const int qi = q0 + warp * R + r;
            const bool live = kj <= qi && kj < T;
            const float x = live ? s[r] * scale : NEG_INF;
            // Key 0 is live for every row, so m is finite from the first tile on.
            const float mn = fmaxf(m[r], warp_max(x));
            const float p = live ? expf(x - mn) : 0.0f;
            const float alpha = expf(m[r] - mn);
            l[r] = l[r] * alpha + warp_sum(p);
            m[r] = mn;
            for (int c = 0; c < NC; ++c) o[r][c] *= alpha;
            Ps[(warp * R + r) * TILE + lane] = p;
        }
        __syncwarp();  // each warp reads only its own rows of Ps
        for (int j = 0; j < TILE; j += 4) {
            for (int c = 0; c < NC; ++c) {
                const int d = lane + 32 * c;
                if (D < 32 && d >= D) continue;
                const float v0 = Vs[rot<D>(j, d)], v1 = Vs[rot<D>(j + 1, d)];
                const float v2 = Vs[rot<D>(j + 2, d)], v3 = Vs[rot<D>(j + 3, d)];
                for (int r = 0; r < R; ++r) {
                    float4 p4 = *(const float4*)&Ps[(warp * R + r) * TILE + j];
                    o[r][c] += (p4.x * v0 + p4.y * v1) + (p4.z * v2 + p4.w * v3);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        const int qi = q0 + warp * R + r;
        if (qi >= T) continue;
        const float inv = 1.0f / l[r];
        float* orow = out + ((long long)b * T + qi) * W + h * dh;
        for (int c = 0; c < NC; ++c) {
            const int d = lane + 32 * c;
            if (d < dh) orow[d] = o[r][c] * inv;
        }
        if (lane == 0) lse[(long long)bh * T + qi] = m[r] + logf(l[r]);
    }
}

// delta = rowsum(dO * O) per (b, h, t). Grid: ceil(batch * T * H / WARPS)
// blocks of THREADS; warp g = (b * T + t) * H + h sums its dh columns.
extern "C" __global__ void __launch_bounds__(THREADS)
attn_delta(float* delta, const float* out, const float* dout, int rows, int T, int H, int dh) {
    const int lane = threadIdx.x & 31;
    const long long g = (long long)blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (g >= (long long)rows * H) return;  // whole warps leave; no barrier below
    const long long row = g / H;
    const int h = (int)(g - row * H);
    const long long off = row * H * dh + (long long)h * dh;
    float s = 0.0f;
    for (int d = lane; d < dh; d += 32) s += dout[off + d] * out[off + d];
    s = warp_sum(s);
    const long long b = row / T, t = row - b * T;
    if (lane == 0) delta[(b * H + h) * T + t] = s;
}

// dQ. Grid: (ceil(T / (WARPS * R)), batch * H); block: THREADS. Block owns
// query rows as the forward; per key tile: P = exp(scale q.k - lse) and
// dP = dO.v (lane = key), dS = P (dP - delta) through shared memory, then
// dQ += dS K (lane = head columns). Writes scale * dQ into Q's columns.
template <int D, int R>
__device__ void attn_bwd_dq(float* dqkv, const float* qkv, const float* dout, const float* lse,
                            const float* delta, int T, int H, int KV, int dh, float scale) {
    constexpr int BQ = WARPS * R, NC = (D + 31) / 32;
    __shared__ __align__(16) float Qs[BQ * D];
    __shared__ __align__(16) float Os[BQ * D];
    __shared__ __align__(16) float Ks[TILE * D];
    __shared__ __align__(16) float Vs[TILE * D];
    __shared__ __align__(16) float Ss[BQ * TILE];
    static_assert(sizeof(float) * (2 * BQ * D + 2 * TILE * D + BQ * TILE) <= SMEM_MAX, "smem");
    const int W = H * dh, W3 = W + 2 * KV * dh;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int q0 = blockIdx.x * BQ, bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const Heads hp = heads_of(qkv, b, h, T, H, KV, dh);
    load_tile<D, false>(Qs, hp.q, W3, q0, BQ, T, dh);
    load_tile<D, false>(Os, dout + (long long)b * T * W + h * dh, W, q0, BQ, T, dh);
    float lr[R], dr[R], acc[R][NC];
    for (int r = 0; r < R; ++r) {
        const int qi = q0 + warp * R + r;
        lr[r] = qi < T ? lse[(long long)bh * T + qi] : 0.0f;
        dr[r] = qi < T ? delta[(long long)bh * T + qi] : 0.0f;
        for (int c = 0; c < NC; ++c) acc[r][c] = 0.0f;
    }
    const int kend = min(q0 + BQ, T);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();
        load_tile<D, true>(Ks, hp.k, W3, k0, TILE, T, dh);
        load_tile<D, true>(Vs, hp.v, W3, k0, TILE, T, dh);
        __syncthreads();
        float s[R], dp[R];
        for (int r = 0; r < R; ++r) s[r] = dp[r] = 0.0f;
        for (int d = 0; d < D; d += 4) {
            float4 k4 = *(const float4*)&Ks[rot<D>(lane, d)];
            float4 v4 = *(const float4*)&Vs[rot<D>(lane, d)];
            for (int r = 0; r < R; ++r) {
                s[r] += dot4(*(const float4*)&Qs[(warp * R + r) * D + d], k4);
                dp[r] += dot4(*(const float4*)&Os[(warp * R + r) * D + d], v4);
            }
        }
        const int kj = k0 + lane;
        for (int r = 0; r < R; ++r) {
            const int qi = q0 + warp * R + r;
            const bool live = kj <= qi && kj < T && qi < T;
            const float p = live ? expf(s[r] * scale - lr[r]) : 0.0f;
            Ss[(warp * R + r) * TILE + lane] = p * (dp[r] - dr[r]);
        }
        __syncwarp();
        for (int j = 0; j < TILE; j += 4) {
            for (int c = 0; c < NC; ++c) {
                const int d = lane + 32 * c;
                if (D < 32 && d >= D) continue;
                const float k0v = Ks[rot<D>(j, d)], k1v = Ks[rot<D>(j + 1, d)];
                const float k2v = Ks[rot<D>(j + 2, d)], k3v = Ks[rot<D>(j + 3, d)];
                for (int r = 0; r < R; ++r) {
                    float4 s4 = *(const float4*)&Ss[(warp * R + r) * TILE + j];
                    acc[r][c] += (s4.x * k0v + s4.y * k1v) + (s4.z * k2v + s4.w * k3v);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        const int qi = q0 + warp * R + r;
        if (qi >= T) continue;
        float* row = dqkv + ((long long)b * T + qi) * W3 + h * dh;
        for (int c = 0; c < NC; ++c) {
            const int d = lane + 32 * c;
            if (d < dh) row[d] = acc[r][c] * scale;
        }
    }
}

// dK and dV. Grid: (ceil(T / (WARPS * R)), batch * KV); block: THREADS.
// Block owns keys k0 .. k0 + WARPS * R - 1 of key/value head (b, kv), warp w
// keys k0 + w * R + r; for each query head h of the group, in order, loops
// over query tiles of TILE from the one holding k0 to the end:
// P = exp(scale k.q - lse) and dP = v.dO (lane = query), P and
// dS = P (dP - delta) through shared memory, then dV += P^T dO and
// dK += dS^T Q (lane = head columns). Writes scale * dK and dV once.
template <int D, int R>
__device__ void attn_bwd_dkv(float* dqkv, const float* qkv, const float* dout, const float* lse,
                             const float* delta, int T, int H, int KV, int dh, float scale) {
    constexpr int BK = WARPS * R, NC = (D + 31) / 32;
    __shared__ __align__(16) float Ks[BK * D];
    __shared__ __align__(16) float Vs[BK * D];
    __shared__ __align__(16) float Qs[TILE * D];
    __shared__ __align__(16) float Os[TILE * D];
    __shared__ __align__(16) float Ps[BK * TILE];
    __shared__ __align__(16) float Ss[BK * TILE];
    __shared__ float Ls[TILE];
    __shared__ float Ds[TILE];
    static_assert(sizeof(float) * (2 * BK * D + 2 * TILE * D + 2 * BK * TILE + 2 * TILE)
                      <= SMEM_MAX, "smem");
    const int W = H * dh, W3 = W + 2 * KV * dh, G = H / KV;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int k0 = blockIdx.x * BK, bkv = blockIdx.y, b = bkv / KV, kv = bkv - b * KV;
    const Heads first = heads_of(qkv, b, kv * G, T, H, KV, dh);
    load_tile<D, false>(Ks, first.k, W3, k0, BK, T, dh);
    load_tile<D, false>(Vs, first.v, W3, k0, BK, T, dh);
    float dk[R][NC], dv[R][NC];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < NC; ++c) dk[r][c] = dv[r][c] = 0.0f;
    for (int h = kv * G; h < (kv + 1) * G; ++h) {
        const int bh = b * H + h;
        const float* qbase = heads_of(qkv, b, h, T, H, KV, dh).q;
        const float* obase = dout + (long long)b * T * W + h * dh;
        for (int q0 = (k0 / TILE) * TILE; q0 < T; q0 += TILE) {
            __syncthreads();
            load_tile<D, true>(Qs, qbase, W3, q0, TILE, T, dh);
            load_tile<D, true>(Os, obase, W, q0, TILE, T, dh);
            if (threadIdx.x < TILE) {
                const int qi = q0 + threadIdx.x;
                Ls[threadIdx.x] = qi < T ? lse[(long long)bh * T + qi] : 0.0f;
                Ds[threadIdx.x] = qi < T ? delta[(long long)bh * T + qi] : 0.0f;
            }
            __syncthreads();
            float s[R], dp[R];
            for (int r = 0; r < R; ++r) s[r] = dp[r] = 0.0f;
            for (int d = 0; d < D; d += 4) {
                float4 q4 = *(const float4*)&Qs[rot<D>(lane, d)];
                float4 o4 = *(const float4*)&Os[rot<D>(lane, d)];
                for (int r = 0; r < R; ++r) {
                    s[r] += dot4(q4, *(const float4*)&Ks[(warp * R + r) * D + d]);
                    dp[r] += dot4(o4, *(const float4*)&Vs[(warp * R + r) * D + d]);
                }
            }
            const int qi = q0 + lane;
            for (int r = 0; r < R; ++r) {
                const int kj = k0 + warp * R + r;
                const bool live = kj <= qi && qi < T && kj < T;
                const float p = live ? expf(s[r] * scale - Ls[lane]) : 0.0f;
                Ps[(warp * R + r) * TILE + lane] = p;
                Ss[(warp * R + r) * TILE + lane] = p * (dp[r] - Ds[lane]);
            }
            __syncwarp();
            for (int i = 0; i < TILE; i += 4) {
                for (int c = 0; c < NC; ++c) {
                    const int d = lane + 32 * c;
                    if (D < 32 && d >= D) continue;
                    const float o0 = Os[rot<D>(i, d)], o1 = Os[rot<D>(i + 1, d)];
                    const float o2 = Os[rot<D>(i + 2, d)], o3 = Os[rot<D>(i + 3, d)];
                    const float x0 = Qs[rot<D>(i, d)], x1 = Qs[rot<D>(i + 1, d)];
                    const float x2 = Qs[rot<D>(i + 2, d)], x3 = Qs[rot<D>(i + 3, d)];
                    for (int r = 0; r < R; ++r) {
                        float4 p4 = *(const float4*)&Ps[(warp * R + r) * TILE + i];
                        float4 s4 = *(const float4*)&Ss[(warp * R + r) * TILE + i];
                        dv[r][c] += (p4.x * o0 + p4.y * o1) + (p4.z * o2 + p4.w * o3);
                        dk[r][c] += (s4.x * x0 + s4.y * x1) + (s4.z * x2 + s4.w * x3);
                    }
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        const int kj = k0 + warp * R + r;
        if (kj >= T) continue;
        float* row = dqkv + ((long long)b * T + kj) * W3 + W + kv * dh;
        for (int c = 0; c < NC; ++c) {
            const int d = lane + 32 * c;
            if (d < dh) {
                row[d] = dk[r][c] * scale;
                row[KV * dh + d] = dv[r][c];
            }
        }
    }
}
