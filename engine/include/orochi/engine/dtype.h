// The engine's data types: one list, from which names, sizes, C++ types and conversions come.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string_view>
#include <type_traits>

#include "orochi/engine/export.h"
#include "orochi/engine/scalar_conversion.h"

namespace orochi::engine {

// IEEE half precision and bfloat16, stored as their bits; arithmetic goes through float.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// X(enumerator, C++ type, name as PyTorch spells it, safetensors code, category)
// Categories order the promotion lattice: bool < integral < floating.
#define OROCHI_ENGINE_DTYPES(X)                         \
  X(kBool, bool, "bool", "BOOL", kBoolean)              \
  X(kUInt8, uint8_t, "uint8", "U8", kIntegral)          \
  X(kInt8, int8_t, "int8", "I8", kIntegral)             \
  X(kInt16, int16_t, "int16", "I16", kIntegral)         \
  X(kInt32, int32_t, "int32", "I32", kIntegral)         \
  X(kInt64, int64_t, "int64", "I64", kIntegral)         \
  X(kFloat16, Half, "float16", "F16", kFloating)        \
  X(kBFloat16, BFloat16, "bfloat16", "BF16", kFloating) \
  X(kFloat32, float, "float32", "F32", kFloating)       \
  X(kFloat64, double, "float64", "F64", kFloating)

enum class DType : uint8_t {
#define OROCHI_DTYPE_ENUM(name, type, text, code, category) name,
  OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_ENUM)
#undef OROCHI_DTYPE_ENUM
};

// Every dtype, in enumeration order.
inline constexpr DType kAllDTypeList[] = {
#define OROCHI_DTYPE_LIST(name, type, text, code, category) DType::name,
    OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_LIST)
#undef OROCHI_DTYPE_LIST
};
inline constexpr int kDTypeCount = static_cast<int>(std::size(kAllDTypeList));
// Ten, a decision recorded in docs/ARCHITECTURE.md's dtype table: a dtype added or removed here
// changes that table, the KServe datatypes (OROCHI_PACKAGE_DATATYPES) and the Python package's
// tables (orochi.finfo, orochi.serving's datatypes) too.
static_assert(kDTypeCount == 10,
              "the dtype list, the tables built on it and docs/ARCHITECTURE.md's dtype table all "
              "name ten dtypes");

enum class DTypeCategory : uint8_t { kBoolean, kIntegral, kFloating };

// The C++ type of a dtype, and back.
template <DType D>
struct CppTypeOf;
template <typename T>
struct DTypeOf;
#define OROCHI_DTYPE_TRAITS(name, type, text, code, category) \
  template <>                                                 \
  struct CppTypeOf<DType::name> {                             \
    using type_t = type;                                      \
  };                                                          \
  template <>                                                 \
  struct DTypeOf<type> {                                      \
    static constexpr DType value = DType::name;               \
  };
OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_TRAITS)
#undef OROCHI_DTYPE_TRAITS
template <DType D>
using CppType = typename CppTypeOf<D>::type_t;

constexpr size_t ItemSize(DType dtype) {
  switch (dtype) {
#define OROCHI_DTYPE_SIZE(name, type, text, code, category) \
  case DType::name:                                         \
    return sizeof(type);
    OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_SIZE)
#undef OROCHI_DTYPE_SIZE
  }
  return 0;
}

constexpr std::string_view DTypeName(DType dtype) {
  switch (dtype) {
#define OROCHI_DTYPE_NAME(name, type, text, code, category) \
  case DType::name:                                         \
    return text;
    OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_NAME)
#undef OROCHI_DTYPE_NAME
  }
  return "?";
}

constexpr std::string_view SafetensorsCode(DType dtype) {
  switch (dtype) {
#define OROCHI_DTYPE_CODE(name, type, text, code, category) \
  case DType::name:                                         \
    return code;
    OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_CODE)
#undef OROCHI_DTYPE_CODE
  }
  return "?";
}

// NOLINTBEGIN(bugprone-branch-clone): one generated case per dtype, several share a category
constexpr DTypeCategory Category(DType dtype) {
  switch (dtype) {
#define OROCHI_DTYPE_CATEGORY(name, type, text, code, category) \
  case DType::name:                                             \
    return DTypeCategory::category;
    OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_CATEGORY)
#undef OROCHI_DTYPE_CATEGORY
  }
  return DTypeCategory::kBoolean;
}
// NOLINTEND(bugprone-branch-clone)

constexpr bool IsFloating(DType dtype) { return Category(dtype) == DTypeCategory::kFloating; }
constexpr bool IsIntegral(DType dtype) { return Category(dtype) == DTypeCategory::kIntegral; }

// Parses a name ("float32") or a safetensors code ("F32"); false if unknown.
OROCHI_ENGINE_API bool ParseDType(std::string_view text, DType* dtype);

// PyTorch's promotion of two dtypes of the same priority (torch.promote_types).
OROCHI_ENGINE_API DType PromoteTypes(DType a, DType b);

// --- conversions ---------------------------------------------------------------------------------

inline float HalfToFloat(Half value) {
  uint32_t sign = (value.bits & 0x8000U) << 16;
  uint32_t exponent = (value.bits >> 10) & 0x1FU;
  uint32_t mantissa = value.bits & 0x3FFU;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400U) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3FFU) << 13);
    }
  } else if (exponent == 0x1F) {
    bits = sign | 0x7F800000U | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

inline Half FloatToHalf(float value) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  uint32_t sign = (bits >> 16) & 0x8000U;
  uint32_t magnitude = bits & 0x7FFFFFFFU;
  if (magnitude >= 0x7F800000U) {  // inf or nan
    return {static_cast<uint16_t>(sign | 0x7C00U | (magnitude > 0x7F800000U ? 0x200U : 0U))};
  }
  if (magnitude >= 0x477FF000U) return {static_cast<uint16_t>(sign | 0x7C00U)};  // overflow
  if (magnitude < 0x38800000U) {  // subnormal or zero in half
    float absolute;
    std::memcpy(&absolute, &magnitude, sizeof(absolute));
    // 2^-24 is the smallest half subnormal; adding 0.5 (2^-1) aligns its bits for rounding.
    float shifted = absolute + 0.5F;
    uint32_t shifted_bits;
    std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
    return {static_cast<uint16_t>(sign | (shifted_bits - 0x3F000000U))};
  }
  uint32_t mantissa_odd = (magnitude >> 13) & 1U;
  magnitude += 0xC8000FFFU + mantissa_odd;  // rebias exponent (-112 << 23) and round
  return {static_cast<uint16_t>(sign | (magnitude >> 13))};
}

inline float BFloat16ToFloat(BFloat16 value) {
  uint32_t bits = static_cast<uint32_t>(value.bits) << 16;
  float result;
  std::memcpy(&result, &bits, sizeof(result));
  return result;
}

inline BFloat16 FloatToBFloat16(float value) {  // round to nearest even, NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7FFFFFFFU) > 0x7F800000U) return {static_cast<uint16_t>((bits >> 16) | 0x40U)};
  bits += 0x7FFFU + ((bits >> 16) & 1U);
  return {static_cast<uint16_t>(bits >> 16)};
}

// Converts between any two engine element types with C++ semantics, except that floating ->
// integer follows FloatingToInteger (defined for NaN and out-of-range values); anything -> bool
// is "!= 0".
template <typename To, typename From>
inline To Convert(From value) {
  if constexpr (std::is_same_v<From, Half>) {
    return Convert<To>(HalfToFloat(value));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return Convert<To>(BFloat16ToFloat(value));
  } else if constexpr (std::is_same_v<To, Half>) {
    return FloatToHalf(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return FloatToBFloat16(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From{0};
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    return FloatingToInteger<To>(value);
  } else {
    return static_cast<To>(value);
  }
}

// Calls fn.template operator()<T>() with T the C++ type of `dtype`.
template <typename Fn>
decltype(auto) VisitDType(DType dtype, Fn&& fn) {
  switch (dtype) {
#define OROCHI_DTYPE_VISIT(name, type, text, code, category) \
  case DType::name:                                          \
    return fn.template operator()<type>();
    OROCHI_ENGINE_DTYPES(OROCHI_DTYPE_VISIT)
#undef OROCHI_DTYPE_VISIT
  }
  return fn.template operator()<float>();  // unreachable: every enumerator is a case above
}

}  // namespace orochi::engine
