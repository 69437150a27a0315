// What the server's two seccomp filters (supervisor_shield.h, exit_guard.h) are written with:
// the processor they know, where a call's fields lie, and a builder with named jumps. Private
// to the server module.
#pragma once

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "orochi/base/check.h"

namespace orochi::server::seccomp {

#if defined(__x86_64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_X86_64;
// x32 calls come with the native arch and this bit in their number: refused, like the i386
// calls (a different arch), since nothing in a 64-bit server makes them and a filter's rules
// look at native numbers only.
constexpr uint32_t kForeignCallBit = 0x40000000;
#elif defined(__aarch64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_AARCH64;
constexpr uint32_t kForeignCallBit = 0;
#else
constexpr uint32_t kNativeArch = 0;
constexpr uint32_t kForeignCallBit = 0;
#endif

// The low 32 bits of a call's argument: where the kernel reads a pid_t or an int from.
constexpr uint32_t Argument(size_t index) {
  return static_cast<uint32_t>(offsetof(seccomp_data, args) + sizeof(uint64_t) * index) +
         (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 0 : 4);
}
// The high 32 bits of a call's argument: with the low ones, whether a pointer is null.
constexpr uint32_t ArgumentHigh(size_t index) {
  return static_cast<uint32_t>(offsetof(seccomp_data, args) + sizeof(uint64_t) * index) +
         (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 4 : 0);
}
constexpr uint32_t kCallNumber = offsetof(seccomp_data, nr);
constexpr uint32_t kArch = offsetof(seccomp_data, arch);

// A seccomp program written with named jump targets, resolved by Finish. Every jump goes
// forward, as BPF requires.
class FilterBuilder {
 public:
  using Label = size_t;

  Label NewLabel() {
    bound_.push_back(kUnbound);
    return bound_.size() - 1;
  }
  void Bind(Label label) { bound_[label] = program_.size(); }

  void Load(uint32_t offset) {
    program_.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset));  // NOLINT(hicpp-signed-bitwise)
  }
  void Return(uint32_t action) {
    program_.push_back(BPF_STMT(BPF_RET | BPF_K, action));  // NOLINT(hicpp-signed-bitwise)
  }
  // To `target` when the loaded word equals `value`; on to the next instruction otherwise.
  void JumpIfEqual(uint32_t value, Label target) {
    Jump(BPF_JEQ, value, target);  // NOLINT(hicpp-signed-bitwise)
  }
  // To `target` when the loaded word, unsigned, is greater than `value`.
  void JumpIfGreater(uint32_t value, Label target) {
    Jump(BPF_JGT, value, target);  // NOLINT(hicpp-signed-bitwise)
  }
  // To `target` when the loaded word, unsigned, is at least `value`.
  void JumpIfAtLeast(uint32_t value, Label target) {
    Jump(BPF_JGE, value, target);  // NOLINT(hicpp-signed-bitwise)
  }
  // To `target` when the loaded word has any of `bits`.
  void JumpIfAnyBit(uint32_t bits, Label target) {
    Jump(BPF_JSET, bits, target);  // NOLINT(hicpp-signed-bitwise)
  }
  // For each of `values`, to `target` when the loaded word equals it.
  template <typename Values>
  void JumpIfOneOf(const Values& values, Label target) {
    for (auto value : values) JumpIfEqual(static_cast<uint32_t>(value), target);
  }
  // Loads the call's argument `index` (its low word), then JumpIfOneOf.
  template <typename Values>
  void JumpIfArgumentIsOneOf(size_t index, const Values& values, Label target) {
    Load(Argument(index));
    JumpIfOneOf(values, target);
  }
  void JumpIfArgumentIs(size_t index, uint32_t value, Label target) {
    JumpIfArgumentIsOneOf(index, std::array{value}, target);
  }

  std::vector<sock_filter> Finish() {
    for (const auto& [at, label] : jumps_) {
      const size_t distance = bound_[label] - at - 1;
      OROCHI_INTERNAL_ASSERT(bound_[label] != kUnbound && bound_[label] > at && distance <= 255,
                             "seccomp filter: a jump to an unbound or distant label");
      program_[at].jt = static_cast<uint8_t>(distance);
    }
    return program_;
  }

 private:
  static constexpr size_t kUnbound = static_cast<size_t>(-1);

  void Jump(uint16_t condition, uint32_t value, Label target) {
    jumps_.emplace_back(program_.size(), target);
    // NOLINTNEXTLINE(hicpp-signed-bitwise)
    program_.push_back(BPF_JUMP(static_cast<uint16_t>(BPF_JMP | condition | BPF_K), value, 0, 0));
  }

  std::vector<sock_filter> program_;
  std::vector<size_t> bound_;                    // by label: its instruction
  std::vector<std::pair<size_t, Label>> jumps_;  // instruction, where it jumps when true
};

}  // namespace orochi::server::seccomp
