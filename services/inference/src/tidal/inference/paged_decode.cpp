// Decode attention over the paged KV cache: one query token per sequence, read through
// its block table, no gathered copy. Built and loaded by native_decode.py.
//
// Layouts (all contiguous, one layer):
//   q      (B, H, D)              query of each sequence's new token
//   keys   (NB, Hkv, D, BS)       a block's keys with the position last, so the scores of
//                                 a block's BS keys are BS-wide vector FMAs over D
//   values (NB * BS, Hkv, D)      a position's values with D last, so the weighted sum
//                                 is D-wide vector FMAs over positions
//   table  (B, W) int64           blocks of each sequence, in position order
//   out    (B, H, D)              q's dtype
// Sequence b attends to its positions [0, positions[b]]; query head j * G + g reads kv
// head j (G = H / Hkv). Scores, softmax and the weighted sum are fp32 whatever the
// cache's dtype, so the result is at least as exact as SDPA's bf16 kernel.
//
// The loops are written for the compiler to vectorize (no intrinsics), so one source
// serves AVX2, AVX-512 and non-x86 CPUs; the common group sizes, head sizes and block size
// are instantiated as templates so the accumulators live in registers.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float to_f32(float x) { return x; }

inline float to_f32(uint16_t x) {  // bfloat16: the high half of a float
  uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline void from_f32(float x, float* out) { *out = x; }

inline void from_f32(float x, uint16_t* out) {  // round to nearest even, NaN kept NaN
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    *out = static_cast<uint16_t>((bits >> 16) | 0x40u);
    return;
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  *out = static_cast<uint16_t>(bits >> 16);
}

// exp(x) for x <= 0 (a score less the row's maximum): Cody-Waite range reduction and a
// degree-6 polynomial, relative error ~1e-7, branch-free so loops over it vectorize.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t exponent = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &exponent, sizeof scale);
  return p * scale;
}

struct Shape {
  int64_t heads, kv_heads, head_dim, block_size, width;
};

// A vector of kLanes floats, as GCC's and Clang's vector extension: one register of the
// widest kind the target has (AVX-512: 16 floats; AVX2: 8; NEON: 8 in two registers), so
// the compiler never splits one, and accumulator tiles sized to the register file.
#if defined(__AVX512F__)
#define TIDAL_LANES 16
constexpr int kAccumulators = 28;  // of 32 registers, 4 left for loads and broadcasts
#else
#define TIDAL_LANES 8
constexpr int kAccumulators = 12;  // of 16 (AVX2's ymm; on SSE-only x86, 8 xmm pairs: spills)
#endif
constexpr int kLanes = TIDAL_LANES;
typedef float f32xN __attribute__((vector_size(TIDAL_LANES * 4)));
typedef uint32_t u32xN __attribute__((vector_size(TIDAL_LANES * 4)));
typedef uint16_t u16xN __attribute__((vector_size(TIDAL_LANES * 2)));
constexpr int kBlock = 16;  // the block size the templates are written for

// The largest power of two that divides n (itself a power of two) and is at most limit;
// at least 1. How many vectors one pass keeps in registers.
constexpr int tile(int n, int limit) {
  int c = n;
  while (c > 1 && c > limit) c /= 2;
  return c;
}

inline f32xN load_lanes(const float* p) {
  f32xN v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline f32xN load_lanes(const uint16_t* p) {  // kLanes bfloat16 widened to float
  u16xN half;
  std::memcpy(&half, p, sizeof half);
  const u32xN bits = __builtin_convertvector(half, u32xN) << 16;
  f32xN v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// Scores of G query rows (scaled, fp32, (G, D)) against the keys of `blocks`, written to
// scores (G, stride) for positions [0, n) rounded up to whole blocks of kBlock. A block's
// keys are S = kBlock / kLanes vectors per key element, taken SC at a time.
template <typename T, int G>
void block_scores(const float* __restrict__ qf, const T* __restrict__ keys,
                  const int64_t* blocks, int64_t n, int64_t j, const Shape& s,
                  float* __restrict__ scores, int64_t stride) {
  constexpr int S = kBlock / kLanes;
  constexpr int SC = tile(S, kAccumulators / G);
  const int64_t d = s.head_dim;
  for (int64_t c = 0; c * kBlock < n; c++) {
    const T* kb = keys + (blocks[c] * s.kv_heads + j) * d * kBlock;  // (D, kBlock)
    for (int s0 = 0; s0 < S; s0 += SC) {
      f32xN acc[G][SC] = {};
      for (int64_t i = 0; i < d; i++) {
        f32xN k[SC];  // key element i of SC * kLanes of the block's keys
        for (int u = 0; u < SC; u++) k[u] = load_lanes(kb + i * kBlock + (s0 + u) * kLanes);
        for (int g = 0; g < G; g++)
          for (int u = 0; u < SC; u++) acc[g][u] += qf[g * d + i] * k[u];
      }
      for (int g = 0; g < G; g++)
        for (int u = 0; u < SC; u++)
          std::memcpy(scores + g * stride + c * kBlock + (s0 + u) * kLanes, &acc[g][u],
                      sizeof acc[g][u]);
    }
  }
}

// The same for any group and block size (shapes no template was instantiated for).
template <typename T>
void any_scores(const float* __restrict__ qf, const T* __restrict__ keys, const int64_t* blocks,
                int64_t n, int64_t j, const Shape& s, int64_t groups,
                float* __restrict__ scores, int64_t stride) {
  const int64_t d = s.head_dim, bs = s.block_size;
  for (int64_t c = 0; c * bs < n; c++) {
    const T* kb = keys + (blocks[c] * s.kv_heads + j) * d * bs;
    for (int64_t g = 0; g < groups; g++) {
      float* dst = scores + g * stride + c * bs;
      for (int64_t t = 0; t < bs; t++) dst[t] = 0.0f;
      for (int64_t i = 0; i < d; i++) {
        const float qi = qf[g * d + i];
        const T* row = kb + i * bs;
        for (int64_t t = 0; t < bs; t++) dst[t] += qi * to_f32(row[t]);
      }
    }
  }
}

// Softmax numerators of one row of n scores in place; returns their sum.
inline float exponentiate(float* __restrict__ row, int64_t n) {
  float top = row[0];
  for (int64_t t = 1; t < n; t++) top = row[t] > top ? row[t] : top;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < n; t++) {
    const float e = exp_nonpositive(row[t] - top);
    row[t] = e;
    sum += e;
  }
  return sum;
}

// acc (G, D) = sum over positions [0, n) of weights (G, stride) times values (D = kLanes *
// V), VC vectors of D a pass so the accumulators stay in registers.
template <typename T, int G, int V>
void weighted_values(const float* __restrict__ weights, int64_t stride,
                     const T* __restrict__ values, const int64_t* blocks, int64_t n, int64_t j,
                     const Shape& s, float* __restrict__ acc) {
  constexpr int VC = tile(V, kAccumulators / G);
  const int64_t bs = s.block_size;
  for (int v0 = 0; v0 < V; v0 += VC) {
    f32xN sum[G][VC] = {};
    for (int64_t p = 0; p < n; p++) {
      const T* row = values + ((blocks[p / bs] * bs + p % bs) * s.kv_heads + j) * V * kLanes;
      f32xN v[VC];
      for (int u = 0; u < VC; u++) v[u] = load_lanes(row + (v0 + u) * kLanes);
      for (int g = 0; g < G; g++) {
        const float w = weights[g * stride + p];
        for (int u = 0; u < VC; u++) sum[g][u] += w * v[u];
      }
    }
    for (int g = 0; g < G; g++)
      for (int u = 0; u < VC; u++)
        std::memcpy(acc + (g * V + v0 + u) * kLanes, &sum[g][u], sizeof sum[g][u]);
  }
}

template <typename T>
void any_weighted_values(const float* __restrict__ weights, int64_t stride,
                         const T* __restrict__ values, const int64_t* blocks, int64_t n,
                         int64_t j, const Shape& s, int64_t groups, float* __restrict__ acc) {
  const int64_t d = s.head_dim, bs = s.block_size;
  for (int64_t i = 0; i < groups * d; i++) acc[i] = 0.0f;
  for (int64_t p = 0; p < n; p++) {
    const T* row = values + ((blocks[p / bs] * bs + p % bs) * s.kv_heads + j) * d;
    for (int64_t g = 0; g < groups; g++) {
      const float w = weights[g * stride + p];
      for (int64_t i = 0; i < d; i++) acc[g * d + i] += w * to_f32(row[i]);
    }
  }
}

// G = 0: any shape, through the loops above that take it at run time.
template <typename T, int G, int V>
void attend(const T* q, const T* keys, const T* values, const int64_t* table,
            const int64_t* positions, int64_t batch, const Shape& s, T* out) {
  const int64_t groups = s.heads / s.kv_heads, d = s.head_dim;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; b++) longest = positions[b] + 1 > longest ? positions[b] + 1 : longest;
  const int64_t stride = (longest + s.block_size - 1) / s.block_size * s.block_size;
  std::vector<float> scores(groups * stride), qf(groups * d), acc(groups * d), sums(groups);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t b = 0; b < batch; b++) {
    const int64_t n = positions[b] + 1;
    const int64_t* blocks = table + b * s.width;
    for (int64_t j = 0; j < s.kv_heads; j++) {
      const T* qj = q + (b * s.heads + j * groups) * d;  // (G, D): this kv head's queries
      for (int64_t i = 0; i < groups * d; i++) qf[i] = to_f32(qj[i]) * scale;
      if constexpr (G > 0) {
        block_scores<T, G>(qf.data(), keys, blocks, n, j, s, scores.data(), stride);
      } else {
        any_scores<T>(qf.data(), keys, blocks, n, j, s, groups, scores.data(), stride);
      }
      for (int64_t g = 0; g < groups; g++) sums[g] = exponentiate(scores.data() + g * stride, n);
      if constexpr (G > 0) {
        weighted_values<T, G, V>(scores.data(), stride, values, blocks, n, j, s, acc.data());
      } else {
        any_weighted_values<T>(scores.data(), stride, values, blocks, n, j, s, groups, acc.data());
      }
      T* oj = out + (b * s.heads + j * groups) * d;
      for (int64_t g = 0; g < groups; g++) {
        const float inverse = 1.0f / sums[g];
        for (int64_t i = 0; i < d; i++) from_f32(acc[g * d + i] * inverse, oj + g * d + i);
      }
    }
  }
}

template <typename T, int V>
bool dispatch_groups(const T* q, const T* keys, const T* values, const int64_t* table,
                     const int64_t* positions, int64_t batch, const Shape& s, T* out) {
  switch (s.heads / s.kv_heads) {
    case 1: attend<T, 1, V>(q, keys, values, table, positions, batch, s, out); return true;
    case 2: attend<T, 2, V>(q, keys, values, table, positions, batch, s, out); return true;
    case 3: attend<T, 3, V>(q, keys, values, table, positions, batch, s, out); return true;
    case 4: attend<T, 4, V>(q, keys, values, table, positions, batch, s, out); return true;
    case 5: attend<T, 5, V>(q, keys, values, table, positions, batch, s, out); return true;
    case 6: attend<T, 6, V>(q, keys, values, table, positions, batch, s, out); return true;
    case 7: attend<T, 7, V>(q, keys, values, table, positions, batch, s, out); return true;
    case 8: attend<T, 8, V>(q, keys, values, table, positions, batch, s, out); return true;
    default: return false;
  }
}

template <typename T>
void dispatch(const void* q, const void* keys, const void* values, const int64_t* table,
              const int64_t* positions, int64_t batch, const Shape& s, void* out) {
  const auto* tq = static_cast<const T*>(q);
  const auto* tk = static_cast<const T*>(keys);
  const auto* tv = static_cast<const T*>(values);
  auto* to = static_cast<T*>(out);
  if (s.block_size == kBlock) {  // the common shapes, with register accumulators
    if (s.head_dim == 32 && dispatch_groups<T, 32 / kLanes>(tq, tk, tv, table, positions, batch, s, to)) return;
    if (s.head_dim == 64 && dispatch_groups<T, 64 / kLanes>(tq, tk, tv, table, positions, batch, s, to)) return;
    if (s.head_dim == 128 && dispatch_groups<T, 128 / kLanes>(tq, tk, tv, table, positions, batch, s, to)) return;
  }
  attend<T, 0, 0>(tq, tk, tv, table, positions, batch, s, to);
}

}  // namespace

// dtype: 0 float32, 1 bfloat16. Returns 0, or 1 for an unknown dtype or a head count
// that is not a multiple of the kv heads (the caller checks both first).
extern "C" int tidal_paged_decode(int dtype, const void* q, const void* keys, const void* values,
                                  const int64_t* table, int64_t width, const int64_t* positions,
                                  int64_t batch, int64_t heads, int64_t kv_heads,
                                  int64_t head_dim, int64_t block_size, void* out) {
  if (kv_heads <= 0 || heads % kv_heads != 0) return 1;
  const Shape s{heads, kv_heads, head_dim, block_size, width};
  if (dtype == 0) {
    dispatch<float>(q, keys, values, table, positions, batch, s, out);
  } else if (dtype == 1) {
    dispatch<uint16_t>(q, keys, values, table, positions, batch, s, out);
  } else {
    return 1;
  }
  return 0;
}
