// NVRTC compiles without headers, so -inf comes from its bit pattern.
#define NEG_INF __int_as_float(0xff800000)
#define FULL 0xffffffffu
// Threads of a row block; a multiple of 32, at most 1024.
#define ROW_THREADS 256
#define ROW_WARPS (ROW_THREADS / 32)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
    return v;
}

// Sum over the block, returned to every thread; `buf` holds ROW_WARPS floats.
// Every thread of the block calls it (it synchronises). The leading barrier
// keeps a previous call's readers of `buf` ahead of this call's writers.
__device__ float block_sum(float v, float* buf) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) buf[w] = v;
    __syncthreads();
    return warp_sum(lane < ROW_WARPS ? buf[lane] : 0.0f);
}

// Maximum over the block, as block_sum.
__device__ float block_max(float v, float* buf) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) buf[w] = v;
    __syncthreads();
    return warp_max(lane < ROW_WARPS ? buf[lane] : NEG_INF);
}

// Two sums at once; `buf` holds 2 * ROW_WARPS floats.
__device__ void block_sum2(float& a, float& b, float* buf) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    a = warp_sum(a);
    b = warp_sum(b);
    __syncthreads();
    if (lane == 0) {
        buf[w] = a;
        buf[ROW_WARPS + w] = b;
    }
    __syncthreads();
    a = warp_sum(lane < ROW_WARPS ? buf[lane] : 0.0f);
    b = warp_sum(lane < ROW_WARPS ? buf[ROW_WARPS + lane] : 0.0f);
}

// Rows are read as float4 when their length is a multiple of 4 (every row then
// starts 16-byte aligned, allocations being 256-byte aligned), else as floats:
// quads 0..nq cover columns 0..4*nq, the scalar tail the rest.
__device__ __forceinline__ int quads(int n) { return (n & 3) == 0 ? (n >> 2) : 0; }

// LayerNorm forward. Grid: one block of ROW_THREADS per row; the block reduces
// the row's sum, then its centred sum of squares (two passes: precise for
// rows with a large mean), in f32. Biased variance, as the CPU op.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
ln_fwd(float* y, float* xhat, float* rstd, const float* x, const float* gamma,
       const float* beta, int n, float eps) {
    __shared__ float buf[ROW_WARPS];
    long long off = (long long)blockIdx.x * n;
    const float* xr = x + off;
    int nq = quads(n);
    const float4* x4 = (const float4*)xr;
    float s = 0.0f;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 a = x4[k];
        s += (a.x + a.y) + (a.z + a.w);
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS) s += xr[j];
    float mean = block_sum(s, buf) / (float)n;
    float q = 0.0f;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 a = x4[k];
        float d0 = a.x - mean, d1 = a.y - mean, d2 = a.z - mean, d3 = a.w - mean;
        q += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS) {
        float d = xr[j] - mean;
        q += d * d;
    }
    float var = block_sum(q, buf) / (float)n;
    float rs = 1.0f / sqrtf(var + eps);
    float4* h4 = (float4*)(xhat + off);
    float4* y4 = (float4*)(y + off);
    const float4* g4 = (const float4*)gamma;
    const float4* b4 = (const float4*)beta;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 a = x4[k], g = g4[k], b = b4[k], h, o;
        h.x = (a.x - mean) * rs; h.y = (a.y - mean) * rs;
        h.z = (a.z - mean) * rs; h.w = (a.w - mean) * rs;
        o.x = h.x * g.x + b.x; o.y = h.y * g.y + b.y;
        o.z = h.z * g.z + b.z; o.w = h.w * g.w + b.w;
        h4[k] = h;
        y4[k] = o;
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS) {
        float h = (xr[j] - mean) * rs;
        xhat[off + j] = h;
        y[off + j] = h * gamma[j] + beta[j];
    }
    if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

// LayerNorm input gradient. Grid: one block of ROW_THREADS per row, reducing
// sum(g) and sum(g * xhat) with g = dy * gamma, then
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
ln_bwd_input(float* dx, const float* dy, const float* gamma, const float* xhat,
             const float* rstd, int n) {
    __shared__ float buf[2 * ROW_WARPS];
    long long off = (long long)blockIdx.x * n;
    int nq = quads(n);
    const float4* d4 = (const float4*)(dy + off);
    const float4* h4 = (const float4*)(xhat + off);
    const float4* g4 = (const float4*)gamma;
    float sg = 0.0f, sgx = 0.0f;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 d = d4[k], h = h4[k], g = g4[k];
        float a0 = d.x * g.x, a1 = d.y * g.y, a2 = d.z * g.z, a3 = d.w * g.w;
        sg += (a0 + a1) + (a2 + a3);
        sgx += (a0 * h.x + a1 * h.y) + (a2 * h.z + a3 * h.w);
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS) {
        float a = dy[off + j] * gamma[j];
        sg += a;
        sgx += a * xhat[off + j];
    }
    block_sum2(sg, sgx, buf);
    float mg = sg / (float)n, mgx = sgx / (float)n, rs = rstd[blockIdx.x];
    float4* o4 = (float4*)(dx + off);
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 d = d4[k], h = h4[k], g = g4[k], o;
        o.x = rs * (d.x * g.x - mg - h.x * mgx);
        o.y = rs * (d.y * g.y - mg - h.y * mgx);
        o.z = rs * (d.z * g.z - mg - h.z * mgx);
        o.w = rs * (d.w * g.w - mg - h.w * mgx);
        o4[k] = o;
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS)
        dx[off + j] = rs * (dy[off + j] * gamma[j] - mg - xhat[off + j] * mgx);
}

// RMSNorm forward. Grid: one block of ROW_THREADS per row; the block reduces
// the row's sum of squares in f32, rstd = 1 / sqrt(mean(x^2) + eps),
// xhat = x * rstd, y = xhat * gamma.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_fwd(float* y, float* xhat, float* rstd, const float* x, const float* gamma, int n,
        float eps) {
    __shared__ float buf[ROW_WARPS];
    long long off = (long long)blockIdx.x * n;
    const float* xr = x + off;
    int nq = quads(n);
    const float4* x4 = (const float4*)xr;
    float q = 0.0f;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 a = x4[k];
        q += (a.x * a.x + a.y * a.y) + (a.z * a.z + a.w * a.w);
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS) q += xr[j] * xr[j];
    float rs = 1.0f / sqrtf(block_sum(q, buf) / (float)n + eps);
    float4* h4 = (float4*)(xhat + off);
    float4* y4 = (float4*)(y + off);
    const float4* g4 = (const float4*)gamma;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 a = x4[k], g = g4[k], h, o;
        h.x = a.x * rs; h.y = a.y * rs; h.z = a.z * rs; h.w = a.w * rs;
        o.x = h.x * g.x; o.y = h.y * g.y; o.z = h.z * g.z; o.w = h.w * g.w;
        h4[k] = h;
        y4[k] = o;
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS) {
        float h = xr[j] * rs;
        xhat[off + j] = h;
        y[off + j] = h * gamma[j];
    }
    if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

// RMSNorm input gradient. Grid: one block of ROW_THREADS per row, reducing
// sum(g * xhat) with g = dy * gamma, then dx = rstd * (g - xhat * mean(g * xhat)).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
rms_bwd_input(float* dx, const float* dy, const float* gamma, const float* xhat,
              const float* rstd, int n) {
    __shared__ float buf[ROW_WARPS];
    long long off = (long long)blockIdx.x * n;
    int nq = quads(n);
    const float4* d4 = (const float4*)(dy + off);
    const float4* h4 = (const float4*)(xhat + off);
    const float4* g4 = (const float4*)gamma;
    float sgx = 0.0f;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 d = d4[k], h = h4[k], g = g4[k];
        sgx += (d.x * g.x * h.x + d.y * g.y * h.y) + (d.z * g.z * h.z + d.w * g.w * h.w);
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS)
        sgx += dy[off + j] * gamma[j] * xhat[off + j];
    float mgx = block_sum(sgx, buf) / (float)n, rs = rstd[blockIdx.x];
    float4* o4 = (float4*)(dx + off);
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 d = d4[k], h = h4[k], g = g4[k], o;
        o.x = rs * (d.x * g.x - h.x * mgx);
        o.y = rs * (d.y * g.y - h.y * mgx);
        o.z = rs * (d.z * g.z - h.z * mgx);
        o.w = rs * (d.w * g.w - h.w * mgx);
        o4[k] = o;
    }
    for (int j = 4 * nq + threadIdx.x; j < n; j += ROW_THREADS)
        dx[off + j] = rs * (dy[off + j] * gamma[j] - xhat[off + j] * mgx);
}

// Column sums in two deterministic stages (no atomics): `col_part*` leaves one
// partial per (row chunk, column), `col_finish` adds a column's partials in
// chunk order into its accumulator.
#define COL_X 32
#define COL_Y 8

// Partial column sums of dy * xhat and of dy. Grid: (ceil(n / 32), chunks);
// block (32, 8): thread (x, y) sums rows y, y + 8, .. of chunk blockIdx.y for
// column blockIdx.x * 32 + x (reads coalesced across x); the 8 partials of a
// column are then added in y order through shared memory.
extern "C" __global__ void __launch_bounds__(COL_X * COL_Y)
col_part2(float* part_p, float* part_s, const float* dy, const float* xhat,
          int rows, int n, int chunk) {
    __shared__ float sp[COL_Y][COL_X];
    __shared__ float ss[COL_Y][COL_X];
    int j = blockIdx.x * COL_X + threadIdx.x;
    int r0 = blockIdx.y * chunk;
    int r1 = min(r0 + chunk, rows);
    float p = 0.0f, s = 0.0f;
    if (j < n) {
        for (int r = r0 + threadIdx.y; r < r1; r += COL_Y) {
            long long i = (long long)r * n + j;
            float g = dy[i];
            p += g * xhat[i];
            s += g;
        }
    }
    sp[threadIdx.y][threadIdx.x] = p;
    ss[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        for (int k = 1; k < COL_Y; ++k) {
            p += sp[k][threadIdx.x];
            s += ss[k][threadIdx.x];
        }
        part_p[(long long)blockIdx.y * n + j] = p;
        part_s[(long long)blockIdx.y * n + j] = s;
    }
}

// Partial column sums of dy alone (the bias gradient); mapping as col_part2.
extern "C" __global__ void __launch_bounds__(COL_X * COL_Y)
col_part1(float* part_s, const float* dy, int rows, int n, int chunk) {
    __shared__ float ss[COL_Y][COL_X];
    int j = blockIdx.x * COL_X + threadIdx.x;
    int r0 = blockIdx.y * chunk;
    int r1 = min(r0 + chunk, rows);
    float s = 0.0f;
    if (j < n) {
        for (int r = r0 + threadIdx.y; r < r1; r += COL_Y) s += dy[(long long)r * n + j];
    }
    ss[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        for (int k = 1; k < COL_Y; ++k) s += ss[k][threadIdx.x];
        part_s[(long long)blockIdx.y * n + j] = s;
    }
}

// acc[j] += sum over chunks c (in order) of part[c * n + j]. Grid: one thread
// per column, 1024-thread blocks.
extern "C" __global__ void col_finish(float* acc, const float* part, int chunks, int n) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float s = 0.0f;
    for (int c = 0; c < chunks; ++c) s += part[(long long)c * n + j];
    acc[j] += s;
}

// Softmax cross-entropy forward. Grid: one block of ROW_THREADS per row of v
// logits: block max, then the block sum of exp(z - max) (each exp stored in
// probs), then probs scaled by 1 / sum by the threads that wrote them. The
// row's loss in log-sum-exp form, in f32 (the host sums rows in f64).
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
ce_fwd(float* probs, float* row_loss, const float* logits, const unsigned int* targets, int v) {
    __shared__ float buf[ROW_WARPS];
    long long off = (long long)blockIdx.x * v;
    const float* z = logits + off;
    float* p = probs + off;
    int nq = quads(v);
    const float4* z4 = (const float4*)z;
    float4* p4 = (float4*)p;
    float mx = NEG_INF;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 a = z4[k];
        mx = fmaxf(mx, fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w)));
    }
    for (int j = 4 * nq + threadIdx.x; j < v; j += ROW_THREADS) mx = fmaxf(mx, z[j]);
    mx = block_max(mx, buf);
    float s = 0.0f;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 a = z4[k], e;
        e.x = expf(a.x - mx); e.y = expf(a.y - mx);
        e.z = expf(a.z - mx); e.w = expf(a.w - mx);
        p4[k] = e;
        s += (e.x + e.y) + (e.z + e.w);
    }
    for (int j = 4 * nq + threadIdx.x; j < v; j += ROW_THREADS) {
        float e = expf(z[j] - mx);
        p[j] = e;
        s += e;
    }
    float sum = block_sum(s, buf);
    float inv = 1.0f / sum;
    for (int k = threadIdx.x; k < nq; k += ROW_THREADS) {
        float4 e = p4[k];
        e.x *= inv; e.y *= inv; e.z *= inv; e.w *= inv;
        p4[k] = e;
    }
    for (int j = 4 * nq + threadIdx.x; j < v; j += ROW_THREADS) p[j] *= inv;
    if (threadIdx.x == 0) row_loss[blockIdx.x] = logf(sum) + (mx - z[targets[blockIdx.x]]);
}

__device__ __forceinline__ float ce_grad(float p, int j, unsigned int t, float k) {
    if ((unsigned int)j == t) p -= 1.0f;
    return p * k;
}

// Cross-entropy backward in place over probs: k * (p - onehot(target)), the
// CPU op's two roundings. Grid: one block of ROW_THREADS per row.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
ce_bwd(float* g, const unsigned int* targets, int v, float k) {
    float* row = g + (long long)blockIdx.x * v;
    unsigned int t = targets[blockIdx.x];
    int nq = quads(v);
    float4* r4 = (float4*)row;
    for (int q = threadIdx.x; q < nq; q += ROW_THREADS) {
        float4 a = r4[q];
        int j = 4 * q;
        a.x = ce_grad(a.x, j, t, k); a.y = ce_grad(a.y, j + 1, t, k);
        a.z = ce_grad(a.z, j + 2, t, k); a.w = ce_grad(a.w, j + 3, t, k);
        r4[q] = a;
    }
    for (int j = 4 * nq + threadIdx.x; j < v; j += ROW_THREADS) row[j] = ce_grad(row[j], j, t, k);
}

// Embedding forward, one thread per output element of the [rows, d] result:
// out[r] = wte[ids[r]] + wpe[r % seq], or wte[ids[r]] alone where has_pos is 0 (rotary
// positions: no table, wpe is not read); 1024-thread blocks.
extern "C" __global__ void emb_fwd(float* out, const unsigned int* ids, const float* wte,
                                   const float* wpe, int n, int d, int seq, int has_pos) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int r = i / d;
    int j = i - r * d;
    float tok = wte[(long long)ids[r] * d + j];
    out[i] = has_pos ? tok + wpe[(long long)(r % seq) * d + j] : tok;
}

// Token embedding gradient without atomics. Grid: one block of ROW_THREADS
// per distinct token u, threads over the d columns: rows
// rows_of[start[u] .. start[u + 1]] (ascending) are added into dwte[tok[u]]
// in that order, the CPU's, so each sum has the CPU's bits.
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
emb_bwd_tok(float* dwte, const float* dy, const unsigned int* tok, const unsigned int* start,
            const unsigned int* rows_of, int d) {
    unsigned int s0 = start[blockIdx.x], s1 = start[blockIdx.x + 1];
    float* dst = dwte + (long long)tok[blockIdx.x] * d;
    for (int j = threadIdx.x; j < d; j += ROW_THREADS) {
        float acc = dst[j];
        for (unsigned int k = s0; k < s1; ++k) acc += dy[(long long)rows_of[k] * d + j];
        dst[j] = acc;
    }
}

// Positional embedding gradient. Grid: one block of ROW_THREADS per position
// t, threads over columns: rows t, t + seq, .. (the CPU's order) into dwpe[t].
extern "C" __global__ void __launch_bounds__(ROW_THREADS)
emb_bwd_pos(float* dwpe, const float* dy, int nseq, int seq, int d) {
    int t = blockIdx.x;
    float* dst = dwpe + (long long)t * d;
    for (int j = threadIdx.x; j < d; j += ROW_THREADS) {
        float acc = dst[j];
        for (int b = 0; b < nseq; ++b) acc += dy[((long long)b * seq + t) * d + j];
        dst[j] = acc;
    }
}
