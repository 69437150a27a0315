#include "dispatch.h"

#include "orochi/base/check.h"
#include "orochi/engine/error.h"

namespace orochi::engine {

// Registers the CPU kernels (cpu/register.cpp).
void RegisterCpuKernels(KernelRegistry& registry);
// Loads the device libraries that were built (device.cpp); they register their kernels.
void LoadDeviceLibraries(KernelRegistry& registry);

std::string_view OpName(Op op) {
  switch (op) {
#define OROCHI_OP_NAME(name, family) \
  case Op::name:                     \
    return #name;
    OROCHI_ENGINE_OPS(OROCHI_OP_NAME)
#undef OROCHI_OP_NAME
  }
  return "?";
}

void KernelRegistry::Register(DeviceType device, const KernelTable& table) {
  auto add = [&](Op op, void* kernel) {
    Entry& entry = entries_[static_cast<int>(op)][static_cast<int>(device)];
    OROCHI_INTERNAL_ASSERT(entry.kernel == nullptr, "a kernel was registered twice");
    entry = {kernel, KernelDTypes(op)};
  };
#define OROCHI_REGISTER_FROM_TABLE(name, family) add(Op::name, reinterpret_cast<void*>(table.name));
  OROCHI_ENGINE_OPS(OROCHI_REGISTER_FROM_TABLE)
#undef OROCHI_REGISTER_FROM_TABLE
}

void* KernelRegistry::FindErased(Op op, Device device, DType dtype) const {
  const Entry& entry = entries_[static_cast<int>(op)][static_cast<int>(device.type)];
  OROCHI_CHECK(entry.kernel != nullptr, StatusCode::kUnimplemented,
               OpName(op) << " has no kernel for " << DeviceName(device));
  OROCHI_CHECK((entry.dtypes >> static_cast<unsigned>(dtype) & 1U) != 0,
               StatusCode::kInvalidArgument,
               OpName(op) << " is not implemented for dtype " << DTypeName(dtype) << " on "
                          << DeviceName(device));
  return entry.kernel;
}

void KernelRegistry::CheckSignature(Op op, const std::type_info& kernel_type) {
  static const std::type_info* const kSignatures[] = {
#define OROCHI_OP_TYPEID(name, family) &typeid(family##Kernel),
      OROCHI_ENGINE_OPS(OROCHI_OP_TYPEID)
#undef OROCHI_OP_TYPEID
  };
  static_assert(std::size(kSignatures) == kOpCount);
  OROCHI_INTERNAL_ASSERT(*kSignatures[static_cast<int>(op)] == kernel_type,
                         "a kernel was looked up with the wrong signature");
}

std::vector<std::string> KernelRegistry::Missing(DeviceType device) const {
  std::vector<std::string> missing;
  for (int op = 0; op < kOpCount; ++op) {
    if (entries_[op][static_cast<int>(device)].kernel == nullptr) {
      missing.push_back(std::string(OpName(static_cast<Op>(op))) + " on " +
                        DeviceName({device, 0}));
    }
  }
  return missing;
}

const KernelRegistry& Kernels() {
  // Built once, in the engine library, on first use: never from a static initializer, and never
  // in a copy (copies only call into here).
  static const KernelRegistry registry = [] {
    KernelRegistry built;
    RegisterCpuKernels(built);
    LoadDeviceLibraries(built);
    return built;
  }();
  return registry;
}

}  // namespace orochi::engine
