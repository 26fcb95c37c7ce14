#include "pipeline/media/gpu_rgb_kernel.hpp"

#include <cuda_runtime.h>

#include <cstdint>

// Note [Converting NVDEC pictures on the GPU]
// NVDEC leaves each picture in device memory as NV12 (P010/P016 above 8 bits): a full-size luma
// plane and one half-size plane of interleaved U, V. Copying that to the host costs 1.4 MB a
// 720p frame; the encoder needs 150 KB (224 x 224 RGB). So the crop, the scaling and the colour
// conversion happen here, one thread per output pixel, and only the result is copied.
// The CPU path (RgbConverter in video_decoder.cpp, libswscale) is the reference, and this kernel
// follows it where it matters for the picture:
// - the same crop region (chosen on the host by the same function);
// - the same filter: libswscale's bicubic (B = 0, C = 0.6), widened by the scale factor when
//   shrinking so that every source pixel counts (an area-like low-pass, not point sampling);
//   edges clamp to the region, as libswscale sees only the region;
// - chroma sited at the centre of its 2x2 luma block (libswscale's default), interpolated to
//   each output pixel before the matrix is applied (full chroma interpolation);
// - the same matrix and range (libswscale's coefficient table, chosen on the host).
// The results are not bit-identical (libswscale works in fixed point, in two passes); the GPU
// test bounds the difference (tests/gpu/nvdec_parity.py).

namespace precompute {
namespace {

constexpr int kMaxTaps = 64;  // per axis; shrinking by more than 16x uses a narrower filter

__device__ float cubic(float x) {
  constexpr float kB = 0.0f;
  constexpr float kC = 0.6f;
  x = fabsf(x);
  if (x < 1.0f) {
    return ((12.0f - 9.0f * kB - 6.0f * kC) * x * x * x +
            (-18.0f + 12.0f * kB + 6.0f * kC) * x * x + (6.0f - 2.0f * kB)) /
           6.0f;
  }
  if (x < 2.0f) {
    return ((-kB - 6.0f * kC) * x * x * x + (6.0f * kB + 30.0f * kC) * x * x +
            (-12.0f * kB - 48.0f * kC) * x + (8.0f * kB + 24.0f * kC)) /
           6.0f;
  }
  return 0.0f;
}

// The filter taps along one axis for one output sample: source positions first..first+n-1
// (clamped to the region by the caller) and their normalised weights.
struct Taps {
  int first = 0;
  int n = 0;
  float w[kMaxTaps];
};

// `center` is the source position the output sample lies over; `scale` >= 1 widens the filter.
__device__ void make_taps(float center, float scale, Taps& taps) {
  float radius = 2.0f * scale;
  if (2 * static_cast<int>(ceilf(radius)) + 1 > kMaxTaps) {
    scale = (kMaxTaps - 2) / 4.0f;
    radius = 2.0f * scale;
  }
  taps.first = static_cast<int>(floorf(center - radius)) + 1;
  const int last = static_cast<int>(ceilf(center + radius)) - 1;
  taps.n = last - taps.first + 1;
  float sum = 0.0f;
  for (int i = 0; i < taps.n; ++i) {
    const float w = cubic((static_cast<float>(taps.first + i) - center) / scale);
    taps.w[i] = w;
    sum += w;
  }
  const float inv = sum != 0.0f ? 1.0f / sum : 0.0f;
  for (int i = 0; i < taps.n; ++i) taps.w[i] *= inv;
}

template <class Sample>
__device__ float sample_at(const void* plane, int64_t pitch, int x, int y, int stride,
                          int offset) {
  const auto* row =
      reinterpret_cast<const Sample*>(static_cast<const uint8_t*>(plane) + y * pitch);
  const float v = static_cast<float>(row[x * stride + offset]);
  return sizeof(Sample) == 1 ? v : v * (1.0f / 256.0f);  // 16-bit: high-bit aligned
}

__device__ int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// One plane filtered at an output pixel. Positions are in the plane's own samples, relative to
// the region's origin (rx, ry) in that plane, clamped to [0, rw) x [0, rh).
template <class Sample>
__device__ void filter(const void* plane, int64_t pitch, int stride, int components, int rx,
                       int ry, int rw, int rh, const Taps& tx, const Taps& ty, float* out) {
  for (int c = 0; c < components; ++c) out[c] = 0.0f;
  for (int j = 0; j < ty.n; ++j) {
    const int y = ry + clamp_int(ty.first + j, 0, rh - 1);
    float row[2] = {0.0f, 0.0f};
    for (int i = 0; i < tx.n; ++i) {
      const int x = rx + clamp_int(tx.first + i, 0, rw - 1);
      for (int c = 0; c < components; ++c) {
        row[c] += tx.w[i] * sample_at<Sample>(plane, pitch, x, y, stride, c);
      }
    }
    for (int c = 0; c < components; ++c) out[c] += ty.w[j] * row[c];
  }
}

__device__ uint8_t to_byte(float v) {
  v = rintf(v);
  return static_cast<uint8_t>(v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v));
}

template <class Sample>
__global__ void gpu_rgb_kernel(GpuRgbParams p, uint8_t* out) {
  const int ox = blockIdx.x * blockDim.x + threadIdx.x;
  const int oy = blockIdx.y * blockDim.y + threadIdx.y;
  if (ox >= p.out_width || oy >= p.out_height) return;
  const float sx = static_cast<float>(p.region_width) / p.out_width;
  const float sy = static_cast<float>(p.region_height) / p.out_height;
  // Output pixel centres mapped into the region, in luma samples.
  const float lx = (ox + 0.5f) * sx - 0.5f;
  const float ly = (oy + 0.5f) * sy - 0.5f;

  Taps tx;
  Taps ty;
  float y = 0.0f;
  make_taps(lx, fmaxf(sx, 1.0f), tx);
  make_taps(ly, fmaxf(sy, 1.0f), ty);
  filter<Sample>(p.luma, p.luma_pitch, 1, 1, p.region_x, p.region_y, p.region_width,
                 p.region_height, tx, ty, &y);

  // Chroma samples sit at the centre of their 2x2 luma block: luma x is chroma (x + 0.5)/2 - 0.5.
  const int cw = (p.region_width + 1) / 2;
  const int ch = (p.region_height + 1) / 2;
  make_taps((lx + 0.5f) * 0.5f - 0.5f, fmaxf(sx * 0.5f, 1.0f), tx);
  make_taps((ly + 0.5f) * 0.5f - 0.5f, fmaxf(sy * 0.5f, 1.0f), ty);
  float uv[2];
  filter<Sample>(p.chroma, p.chroma_pitch, 2, 2, p.region_x / 2, p.region_y / 2, cw, ch, tx, ty,
                 uv);

  const float l = p.y_scale * (y - p.y_offset);
  const float u = uv[0] - 128.0f;
  const float v = uv[1] - 128.0f;
  uint8_t* px = out + (static_cast<int64_t>(oy) * p.out_width + ox) * 3;
  px[0] = to_byte(l + p.crv * v);
  px[1] = to_byte(l - p.cgu * u - p.cgv * v);
  px[2] = to_byte(l + p.cbu * u);
}

}  // namespace

int launch_gpu_rgb(const GpuRgbParams& params, uint8_t* out, void* stream) {
  const dim3 block(16, 16);
  const dim3 grid((params.out_width + block.x - 1) / block.x,
                  (params.out_height + block.y - 1) / block.y);
  auto* s = static_cast<cudaStream_t>(stream);
  if (params.bytes_per_sample == 1) {
    gpu_rgb_kernel<uint8_t><<<grid, block, 0, s>>>(params, out);
  } else {
    gpu_rgb_kernel<uint16_t><<<grid, block, 0, s>>>(params, out);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace precompute
