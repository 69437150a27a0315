// CPU indexing kernels.
#include <cstring>

#include "dispatch.h"
#include "kernels.h"

namespace orochi::engine::cpu {
void IndexSelect(const Tensor& input, const Tensor& index, Tensor& output) {
  const int64_t count = index.numel();
  const auto* picks = index.data_as<int64_t>();
  if (!input.is_contiguous()) {
    // A view (a narrowed cache, a slice of a table): only the picked slices are read, each
    // through the view's strides, instead of copying the whole view to contiguous first.
    for (int64_t o = 0; o < input.shape()[0]; ++o) {
      const Tensor from = input.Select(0, o);
      Tensor to = output.Select(0, o);
      for (int64_t n = 0; n < count; ++n) {
        Tensor slice = to.Select(0, n);
        Copy(from.Select(0, picks[n]), slice);
      }
    }
    return;
  }
  const int64_t outer = input.shape()[0];
  const int64_t size = input.shape()[1];
  const size_t row_bytes = static_cast<size_t>(input.shape()[2]) * ItemSize(input.dtype());
  const auto* in = static_cast<const std::byte*>(input.data());
  auto* out = static_cast<std::byte*>(output.mutable_data());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t n = 0; n < count; ++n) {
      std::memcpy(out + (o * count + n) * row_bytes, in + (o * size + picks[n]) * row_bytes,
                  row_bytes);
    }
  }
}

}  // namespace orochi::engine::cpu
