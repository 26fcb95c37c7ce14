#pragma once
// The CUDA kernel that turns an NVDEC picture (a luma plane and an interleaved 4:2:0 chroma
// plane, NV12 or its 16-bit forms P010/P016, in device memory) into packed RGB24 of the
// encoder's input size, on the device: crop, scale and colour in one pass, so only the small
// result leaves the GPU (Note [Converting NVDEC pictures on the GPU] in gpu_rgb_kernel.cu).
// Plain types only: callers need no CUDA headers.

#include <cstdint>

namespace precompute {

struct GpuRgbParams {
  const void* luma = nullptr;  // first sample of the picture (not of the region)
  int64_t luma_pitch = 0;      // bytes per row
  const void* chroma = nullptr;  // interleaved U, V at half width and half height
  int64_t chroma_pitch = 0;
  int bytes_per_sample = 1;    // 1: NV12; 2: P010/P016 (samples in the high bits)
  // The part of the picture scaled to the output, in luma samples; x and y even.
  int region_x = 0;
  int region_y = 0;
  int region_width = 0;
  int region_height = 0;
  int out_width = 0;
  int out_height = 0;
  // YUV -> RGB on 8-bit scaled values: R = ys (Y - y0) + crv (V - 128), G = ys (Y - y0) -
  // cgu (U - 128) - cgv (V - 128), B = ys (Y - y0) + cbu (U - 128). 16-bit samples are divided by
  // 256 first.
  float y_offset = 16.0f;
  float y_scale = 255.0f / 219.0f;
  float crv = 0.0f;
  float cbu = 0.0f;
  float cgu = 0.0f;
  float cgv = 0.0f;
};

// Writes out_height rows of out_width * 3 bytes to `out` (device memory), on `stream` (a
// cudaStream_t). Returns the CUDA error code of the launch (0: none).
int launch_gpu_rgb(const GpuRgbParams& params, uint8_t* out, void* stream);

}  // namespace precompute
