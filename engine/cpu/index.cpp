// CPU indexing kernels.
#include <cstring>

#include "dispatch.h"
#include "kernels.h"

namespace orochi::engine::cpu {
void IndexSelect(const Tensor& input, const Tensor& index, Tensor& output) {
  const int64_t outer = input.shape()[0];
  const int64_t size = input.shape()[1];
  const size_t row_bytes = static_cast<size_t>(input.shape()[2]) * ItemSize(input.dtype());
  const int64_t count = index.numel();
  const auto* picks = index.data_as<int64_t>();
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
