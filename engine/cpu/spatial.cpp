// CPU kernels for images: unfolding (im2col), the first half of pooling, and convolution.
#include "dispatch.h"
#include "kernels.h"
#include "onednn.h"

namespace orochi::engine::cpu {
void Im2col(const Tensor& input, const Im2colGeometry& g, Tensor& output) {
  const int64_t batch = input.shape()[0];
  const int64_t channels = input.shape()[1];
  const int64_t height = input.shape()[2];
  const int64_t width = input.shape()[3];
  const int64_t out_h = output.shape()[4];
  const int64_t out_w = output.shape()[5];
  VisitDType(input.dtype(), [&]<typename T>() {
    const T* in = input.data_as<T>();
    T* out = output.mutable_data_as<T>();
    const T pad = Convert<T>(g.pad_value);
    for (int64_t plane = 0; plane < batch * channels; ++plane) {
      const T* image = in + plane * height * width;
      for (int64_t ky = 0; ky < g.kernel[0]; ++ky) {
        for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
          for (int64_t oy = 0; oy < out_h; ++oy) {
            const int64_t y = oy * g.stride[0] - g.padding[0] + ky * g.dilation[0];
            for (int64_t ox = 0; ox < out_w; ++ox) {
              const int64_t x = ox * g.stride[1] - g.padding[1] + kx * g.dilation[1];
              *out++ = y >= 0 && y < height && x >= 0 && x < width ? image[y * width + x] : pad;
            }
          }
        }
      }
    }
  });
}

void Conv2d(const Tensor& input, const Tensor& weight, const ConvGeometry& geometry,
            Tensor& output) {
  if (output.numel() == 0) return;
  if (input.dtype() != DType::kFloat32 || input.numel() == 0 || weight.numel() == 0) {
    Conv2dThroughIm2col(input, weight, geometry, output);
    return;
  }
  OnednnConv2d(input, weight, /*bias=*/nullptr, geometry, /*epilogue=*/{}, output);
}

}  // namespace orochi::engine::cpu
