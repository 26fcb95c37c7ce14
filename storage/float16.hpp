#pragma once
// IEEE 754 binary16 ("half") <-> binary32 conversion, for embeddings stored as float16. Done here
// rather than by HDF5's type conversion so that the rounding is known and tested: round to
// nearest, ties to even; values beyond the half range become +-inf; NaN stays NaN (quiet, sign
// and the top payload bits kept); results below the smallest half subnormal round to +-0.
// Pure functions, thread-safe.

#include <bit>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace precompute {

inline uint16_t float_to_half(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;

  if (magnitude >= 0x7f800000u) {  // inf or NaN
    if (magnitude == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 is halfway between the largest half (65504) and 65536; it and everything above round
  // to infinity (the tie goes to the even neighbour, which is the one past the largest).
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;

  const uint32_t exponent = magnitude >> 23;  // biased by 127
  if (exponent >= 113) {                      // at least 2^-14: a normal half
    uint32_t half = ((exponent - 112) << 10) | ((magnitude >> 13) & 0x3ffu);
    const uint32_t rest = magnitude & 0x1fffu;
    // A carry out of the mantissa correctly moves to the next exponent.
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }

  // A half subnormal, m * 2^-24: shift the float's mantissa (implicit bit included) into place.
  const uint32_t shift = 126 - exponent;
  if (shift > 24) return sign;  // below half of the smallest subnormal: rounds to zero
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  // Rounding the largest subnormal up gives 0x400, the smallest normal, as it should.
  if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

namespace detail {
#if defined(__x86_64__)
// The processor's F16C conversion rounds the same way (to nearest, ties to even) and gives the
// same infinities, NaNs and subnormals as float_to_half, eight values per instruction.
__attribute__((target("avx,f16c"))) inline void floats_to_halves_f16c(const float* in,
                                                                      uint16_t* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = float_to_half(in[i]);
}
#endif
}  // namespace detail

// float_to_half over an array, with F16C where the processor has it.
inline void floats_to_halves(const float* in, uint16_t* out, size_t n) {
#if defined(__x86_64__)
  static const bool f16c = [] {
    // F16C is CPUID leaf 1, ECX bit 29 (clang 14 has no "f16c" for __builtin_cpu_supports).
    unsigned a = 0, b = 0, c = 0, d = 0;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) != 0 &&
           (c & bit_F16C) != 0;
  }();
  if (f16c) {
    detail::floats_to_halves_f16c(in, out, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
}

inline float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;

  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) return std::bit_cast<float>(sign);
  // Subnormal: normalise, every half subnormal is a normal float.
  uint32_t float_exponent = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --float_exponent;
  }
  return std::bit_cast<float>(sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13));
}

}  // namespace precompute
