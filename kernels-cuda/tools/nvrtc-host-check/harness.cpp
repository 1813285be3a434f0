// Host emulation of the NVRTC kernels (see run.sh): CUDA's thread indices
// and intrinsics as C++ shims, each kernel run on every thread of its grid,
// results against straightforward double references.
#include <cmath>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <random>
using std::sqrt; using std::log; using std::tanh;
struct Dim3 { unsigned x; };
static Dim3 blockIdx{0}, blockDim{1024}, threadIdx{0};
#define __global__
static float __int_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static float atomicAdd(float* a, float v) { float o = *a; *a += v; return o; }
#include "rowops.cu.inc"
#include "kernels.cu.inc"

// Every thread of a grid of 1024-thread blocks covering n (at least one block).
template <class F> void launch(int n, F f) {
    int blocks = n < 1 ? 1 : (n + 1023) / 1024;
    for (int b = 0; b < blocks; ++b)
        for (int t = 0; t < 1024; ++t) { blockIdx.x = b; threadIdx.x = t; f(); }
}
static std::mt19937 rng(42);
static std::vector<float> zeros(size_t n) { return std::vector<float>(n); }
static std::vector<float> randn(size_t n, float s = 1, float m = 0) {
    std::normal_distribution<float> d(m, s); std::vector<float> v(n); for (auto& x : v) x = d(rng); return v;
}
static int fails = 0;
static void close(const char* what, const float* got, const std::vector<double>& want, double tol = 1e-5) {
    for (size_t i = 0; i < want.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= tol * (1 + std::fabs(want[i])))) {
            printf("FAIL %s[%zu]: %g vs %g\n", what, i, got[i], want[i]); ++fails; return;
        }
    printf("ok %s (%zu)\n", what, want.size());
}
// Exact-size heap copies so ASan flags any out-of-bounds access.
struct Buf { float* p; size_t n; Buf(const std::vector<float>& v) : p((float*)malloc(v.size()*4 + (v.empty()))), n(v.size()) { memcpy(p, v.data(), v.size()*4); } ~Buf() { free(p); } };

int main() {
    // LayerNorm
    {
        int rows = 1100, n = 37; float eps = 1e-5f;  // rows > 1024: two blocks
        auto x = randn(rows * n, 2, 5), g = randn(n), b = randn(n), dy = randn(rows * n);
        Buf X(x), G(g), B(b), DY(dy), Y(zeros(rows*n)), XH(zeros(rows*n)), R(zeros(rows));
        launch(rows, [&] { ln_fwd(Y.p, XH.p, R.p, X.p, G.p, B.p, rows, n, eps); });
        std::vector<double> yw(rows*n), xhw(rows*n), rw(rows), dxw(rows*n), dgw(n), dbw(n);
        auto dg0 = randn(n), db0 = randn(n);
        for (int j = 0; j < n; ++j) { dgw[j] = dg0[j]; dbw[j] = db0[j]; }
        for (int r = 0; r < rows; ++r) {
            double m = 0, v = 0;
            for (int j = 0; j < n; ++j) m += x[r*n+j];
            m /= n;
            for (int j = 0; j < n; ++j) v += (x[r*n+j]-m)*(x[r*n+j]-m);
            v /= n;
            double rs = 1 / sqrt(v + eps); rw[r] = rs;
            double sg = 0, sgx = 0;
            for (int j = 0; j < n; ++j) { double h = (x[r*n+j]-m)*rs; xhw[r*n+j] = h; yw[r*n+j] = h*g[j]+b[j];
                double gg = dy[r*n+j]*g[j]; sg += gg; sgx += gg*h; dgw[j] += dy[r*n+j]*h; dbw[j] += dy[r*n+j]; }
            for (int j = 0; j < n; ++j) dxw[r*n+j] = rs*(dy[r*n+j]*g[j] - sg/n - xhw[r*n+j]*sgx/n);
        }
        close("ln y", Y.p, yw); close("ln xhat", XH.p, xhw); close("ln rstd", R.p, rw);
        Buf DX(zeros(rows*n)), DG(dg0), DB(db0);
        launch(rows, [&] { ln_bwd_input(DX.p, DY.p, G.p, XH.p, R.p, rows, n); });
        close("ln dx", DX.p, dxw, 1e-4);
        launch(n, [&] { ln_bwd_weight(DG.p, DB.p, DY.p, XH.p, rows, n); });
        close("ln dgamma", DG.p, dgw, 1e-4); close("ln dbeta", DB.p, dbw, 1e-4);
    }
    // Cross-entropy
    {
        int rows = 1030, v = 13; float scale = 0.5f;
        auto z = randn(rows * v, 3);
        std::vector<unsigned> t(rows); for (int r = 0; r < rows; ++r) t[r] = (r * 7 + 3) % v;
        unsigned* T = (unsigned*)malloc(rows*4); memcpy(T, t.data(), rows*4);
        Buf Z(z), P(zeros(rows*v));
        double* L = (double*)malloc(rows*8);
        launch(rows, [&] { ce_fwd(P.p, L, Z.p, T, rows, v); });
        std::vector<double> pw(rows*v), gw(rows*v); double total = 0, tot_k = 0;
        for (int r = 0; r < rows; ++r) {
            double mx = -1e30, s = 0; for (int j = 0; j < v; ++j) mx = std::max(mx, (double)z[r*v+j]);
            for (int j = 0; j < v; ++j) s += std::exp(z[r*v+j]-mx);
            for (int j = 0; j < v; ++j) { pw[r*v+j] = std::exp(z[r*v+j]-mx)/s; gw[r*v+j] = scale/rows*(pw[r*v+j] - (j == (int)t[r])); }
            total += std::log(s) + mx - z[r*v+t[r]]; tot_k += L[r];
        }
        close("ce probs", P.p, pw);
        std::vector<double> lw{total / rows * scale}; float lk = tot_k / rows * scale;
        close("ce loss", &lk, lw);
        float k = scale / (float)rows; int n = rows * v;
        launch(n, [&] { ce_bwd(P.p, T, n, v, k); });
        close("ce grad", P.p, gw);
        free(T); free(L);
    }
    // Embedding
    {
        int vocab = 29, d = 6, pos = 11, seq = 9, batch = 21, rows = seq * batch;
        auto wte = randn(vocab*d), wpe = randn(pos*d), dy = randn(rows*d), dwte0 = randn(vocab*d), dwpe0 = randn(pos*d);
        std::vector<unsigned> ids(rows); for (int i = 0; i < rows; ++i) ids[i] = (i*i+1) % vocab;
        unsigned* I = (unsigned*)malloc(rows*4); memcpy(I, ids.data(), rows*4);
        Buf TE(wte), PE(wpe), DY(dy), OUT(zeros(rows*d)), DTE(dwte0), DPE(dwpe0);
        int n = rows * d;
        launch(n, [&] { emb_fwd(OUT.p, I, TE.p, PE.p, n, d, seq); });
        launch(n, [&] { emb_bwd(DTE.p, DPE.p, I, DY.p, n, d, seq); });
        std::vector<double> ow(n), dtw(dwte0.begin(), dwte0.end()), dpw(dwpe0.begin(), dwpe0.end());
        for (int r = 0; r < rows; ++r) for (int j = 0; j < d; ++j) {
            ow[r*d+j] = wte[ids[r]*d+j] + wpe[(r%seq)*d+j];
            dtw[ids[r]*d+j] += dy[r*d+j]; dpw[(r%seq)*d+j] += dy[r*d+j]; }
        close("emb out", OUT.p, ow); close("emb dwte", DTE.p, dtw, 1e-4); close("emb dwpe", DPE.p, dpw, 1e-4);
        free(I);
    }
    // Causal softmax and its backward
    {
        int t = 7, blocks = 150, rows = blocks * t;  // > 1024 rows
        auto s = randn(rows * t, 2), dp = randn(rows * t);
        Buf S(s), DS(dp);
        launch(rows, [&] { causal_softmax(S.p, rows, t); });
        std::vector<double> pw(rows*t, 0.0), dsw(rows*t);
        for (int r = 0; r < rows; ++r) {
            int q = r % t; double mx = -1e30, sum = 0;
            for (int j = 0; j <= q; ++j) mx = std::max(mx, (double)s[r*t+j]);
            for (int j = 0; j <= q; ++j) sum += std::exp(s[r*t+j]-mx);
            for (int j = 0; j <= q; ++j) pw[r*t+j] = std::exp(s[r*t+j]-mx)/sum;
        }
        close("causal softmax", S.p, pw);
        for (int r = 0; r < rows; ++r) for (int j = r % t + 1; j < t; ++j) if (S.p[r*t+j] != 0.0f) { printf("FAIL mask\n"); ++fails; }
        for (int r = 0; r < rows; ++r) { double dot = 0; for (int j = 0; j < t; ++j) dot += (double)S.p[r*t+j]*dp[r*t+j];
            for (int j = 0; j < t; ++j) dsw[r*t+j] = S.p[r*t+j]*(dp[r*t+j]-dot); }
        launch(rows, [&] { softmax_bwd(DS.p, S.p, rows, t); });
        close("softmax bwd", DS.p, dsw);
    }
    printf(fails ? "FAILURES: %d\n" : "all ok\n", fails);
    return fails != 0;
}
