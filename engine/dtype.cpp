#include "orochi/engine/dtype.h"

#include <algorithm>

namespace orochi::engine {

bool ParseDType(std::string_view text, DType* dtype) {
#define OROCHI_DTYPE_PARSE(name, type, spelled, code, category) \
  if (text == (spelled) || text == (code)) {                    \
    *dtype = DType::name;                                       \
    return true;                                                \
  }
  OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_PARSE)
#undef OROCHI_DTYPE_PARSE
  return false;
}

DType PromoteTypes(DType a, DType b) {
  if (a == b) return a;
  DTypeCategory category_a = Category(a);
  DTypeCategory category_b = Category(b);
  if (category_a != category_b) return category_a > category_b ? a : b;
  if (category_a == DTypeCategory::kIntegral) {
    // uint8 is the only unsigned type: with a signed type it needs one more bit.
    if (a == DType::kUInt8 || b == DType::kUInt8) {
      DType other = a == DType::kUInt8 ? b : a;
      return other == DType::kInt8 ? DType::kInt16 : other;
    }
    return ItemSize(a) >= ItemSize(b) ? a : b;
  }
  // Floating: float16 and bfloat16 have no common 16-bit type.
  if (ItemSize(a) == 2 && ItemSize(b) == 2) return DType::kFloat32;
  return ItemSize(a) >= ItemSize(b) ? a : b;
}

}  // namespace orochi::engine
