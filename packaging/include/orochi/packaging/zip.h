// A strict reader and a deterministic writer for the zip archives that carry model packages.
//
// The reader trusts nothing in the file: it reads the central directory once, checks every
// entry against ZipLimits and the path rules below, and refuses the whole archive on the first
// problem, naming the member and the rule. It never writes anything: members are read into
// memory (deflate) or viewed where they lie (stored), never extracted.
//
// Path rules: names are UTF-8, relative, '/'-separated, without backslashes, empty or '.'/'..'
// components, NUL or control characters; no two members share a name; no symlinks; no
// encryption; compression is stored or deflate.
//
// Thread-safety: a ZipReader is immutable after Open and may be read from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/engine/storage.h"

namespace orochi::packaging {

struct ZipLimits {
  size_t max_members = 10'000;
  uint64_t max_member_bytes = uint64_t{4} << 30;  // uncompressed, per member
  uint64_t max_total_bytes = uint64_t{4} << 30;   // uncompressed, all members together
  // Deflated members may expand at most this many times (zip bombs expand by 1000x and more).
  // Members under 64 KiB are exempt: small text compresses well and cannot hurt.
  double max_compression_ratio = 200;
  size_t max_name_bytes = 1024;
};

struct ZipMember {
  std::string name;
  bool stored = false;  // method 0; otherwise deflate
  uint64_t compressed_size = 0;
  uint64_t size = 0;  // uncompressed
  uint32_t crc32 = 0;
  uint64_t header_offset = 0;  // of the member's local header in the file
  uint64_t data_offset = 0;    // of the (compressed) data in the file
  bool is_directory() const { return !name.empty() && name.back() == '/'; }
};

class ZipReader {
 public:
  // Maps `path` and validates the archive. Errors: kNotFound (no file), kInvalidArgument (not
  // a clean archive; the message names the member and the rule).
  static Result<std::unique_ptr<ZipReader>> Open(const std::string& path,
                                                 const ZipLimits& limits = {});

  const std::vector<ZipMember>& members() const { return members_; }
  const ZipMember* Find(std::string_view name) const;
  // The whole file, mapped read-only (stored members can be viewed in place).
  const engine::StoragePtr& file() const { return file_; }
  // The member's bytes, inflated if needed, with the CRC checked.
  Result<std::string> Read(const ZipMember& member) const;
  // Checks a stored member's CRC without copying it.
  Status VerifyStored(const ZipMember& member) const;

 private:
  ZipReader() = default;
  engine::StoragePtr file_;
  std::vector<ZipMember> members_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Writes an archive whose bytes depend only on the members given: names in order as given,
// fixed timestamps and attributes, deflate level 9 for compressed members. Stored members are
// padded (in the local header's extra field) so their data starts at a multiple of 64 bytes,
// which lets safetensors inside them be memory-mapped with aligned tensors.
struct ZipEntry {
  std::string name;
  std::string data;
  bool store = false;
};
Status WriteZip(const std::string& path, const std::vector<ZipEntry>& entries);

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF).
bool IsValidUtf8(std::string_view text);

}  // namespace orochi::packaging
