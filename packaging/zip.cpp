// Zip archives, read strictly and written deterministically (see zip.h).
//
// Format reference: PKWARE's APPNOTE.TXT. Only what packages need is supported: no ZIP64, no
// multi-disk archives, no encryption, methods stored (0) and deflate (8).
#include "orochi/packaging/zip.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace orochi::packaging {
namespace {

constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr uint16_t kUtf8Flag = 0x0800;
constexpr uint16_t kMethodStored = 0;
constexpr uint16_t kMethodDeflate = 8;
constexpr uint64_t kRatioExemptBytes = uint64_t{64} << 10;
constexpr uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // 1980-01-01, the earliest zip date
constexpr uint16_t kAlignmentExtraId = 0xD935;              // padding, as zipalign writes it
constexpr uint64_t kStoredAlignment = 64;

uint16_t Read16(const std::byte* at) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(at[0]) |
                               (std::to_integer<uint16_t>(at[1]) << 8));
}
uint32_t Read32(const std::byte* at) {
  return static_cast<uint32_t>(Read16(at)) | (static_cast<uint32_t>(Read16(at + 2)) << 16);
}

void Put16(std::string& out, uint16_t value) {
  out.push_back(static_cast<char>(value & 0xFF));
  out.push_back(static_cast<char>(value >> 8));
}
void Put32(std::string& out, uint32_t value) {
  Put16(out, static_cast<uint16_t>(value & 0xFFFF));
  Put16(out, static_cast<uint16_t>(value >> 16));
}

Status Bad(const std::string& message) { return InvalidArgument(message); }
Status BadMember(const std::string& name, const std::string& rule) {
  return InvalidArgument("member '" + name + "': " + rule);
}

// OK when member `name` follows the path rules of zip.h, else kInvalidArgument naming the rule
// it breaks.
Status CheckPath(std::string_view name) {
  const auto broken = [&](const char* rule) {
    return BadMember(IsValidUtf8(name) ? std::string(name) : "<non-UTF-8 name>", rule);
  };
  if (name.empty()) return broken("empty name");
  if (!IsValidUtf8(name)) return broken("the name is not valid UTF-8");
  if (name.front() == '/') return broken("absolute path");
  if (name.find('\\') != std::string_view::npos) return broken("backslash in the name");
  if (name.size() >= 2 && name[1] == ':') return broken("drive letter in the name");
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      return broken("control character in the name");
    }
  }
  std::string_view rest = name;
  if (rest.back() == '/') rest.remove_suffix(1);  // a directory entry
  while (true) {
    size_t slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    if (part.empty()) return broken("empty path component ('//')");
    if (part == "..") return broken("path traversal ('..')");
    if (part == ".") return broken("'.' path component");
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  return Status::Ok();
}

uint32_t Crc32(const std::byte* data, uint64_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    auto chunk = static_cast<uInt>(std::min<uint64_t>(size, 1U << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

Result<std::string> Deflate(const std::string& data) {
  z_stream stream{};
  if (deflateInit2(&stream, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    return Internal("deflateInit2 failed");
  }
  std::string out(deflateBound(&stream, data.size()), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  int result = deflate(&stream, Z_FINISH);
  deflateEnd(&stream);
  if (result != Z_STREAM_END) return Internal("deflate failed");
  out.resize(stream.total_out);
  return out;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    auto lead = static_cast<unsigned char>(text[i]);
    size_t length = lead < 0x80           ? 1
                    : (lead >> 5) == 0x6  ? 2
                    : (lead >> 4) == 0xE  ? 3
                    : (lead >> 3) == 0x1E ? 4
                                          : 0;
    if (length == 0 || i + length > text.size()) return false;
    uint32_t code = length == 1 ? lead : lead & (0x7F >> length);
    for (size_t k = 1; k < length; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if ((next >> 6) != 0x2) return false;
      code = (code << 6) | (next & 0x3F);
    }
    static constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    i += length;
  }
  return true;
}

Result<std::unique_ptr<ZipReader>> ZipReader::Open(const std::string& path,
                                                   const ZipLimits& limits) {
  OROCHI_ASSIGN_OR_RETURN(engine::StoragePtr file, engine::Storage::MapFile(path));
  const std::byte* base = file->data();
  const uint64_t size = file->size();
  if (size < kEndSize) return Bad("not a zip archive: only " + std::to_string(size) + " bytes");

  // The end record sits in the last 22 + 65535 bytes (its comment is at most 65535 long).
  uint64_t end = size;
  uint64_t lowest = size >= kEndSize + 0xFFFF ? size - kEndSize - 0xFFFF : 0;
  for (uint64_t at = size - kEndSize + 1; at-- > lowest;) {
    if (Read32(base + at) == kEndSignature && at + kEndSize + Read16(base + at + 20) == size) {
      end = at;
      break;
    }
  }
  if (end == size) {
    return Bad("not a zip archive, or truncated: no end-of-central-directory record");
  }
  const std::byte* record = base + end;
  uint16_t disk = Read16(record + 4);
  uint16_t directory_disk = Read16(record + 6);
  uint16_t entries_here = Read16(record + 8);
  uint16_t entries = Read16(record + 10);
  uint32_t directory_size = Read32(record + 12);
  uint32_t directory_offset = Read32(record + 16);
  if (entries == 0xFFFF || directory_size == 0xFFFFFFFF || directory_offset == 0xFFFFFFFF) {
    return Bad(
        "ZIP64 archives are not supported (packages are limited to 4 GiB and 65535 "
        "members)");
  }
  if (disk != 0 || directory_disk != 0 || entries_here != entries) {
    return Bad("multi-disk (split) archives are not supported");
  }
  if (entries > limits.max_members) {
    return Bad("the archive has " + std::to_string(entries) + " members, over the limit of " +
               std::to_string(limits.max_members));
  }
  if (uint64_t{directory_offset} + directory_size > end) {
    return Bad("truncated or corrupt: the central directory runs past the end record");
  }

  auto reader = std::unique_ptr<ZipReader>(new ZipReader());
  uint64_t at = directory_offset;
  uint64_t total = 0;
  for (uint16_t i = 0; i < entries; ++i) {
    if (at + kCentralHeaderSize > uint64_t{directory_offset} + directory_size ||
        Read32(base + at) != kCentralHeaderSignature) {
      return Bad("corrupt central directory at entry " + std::to_string(i));
    }
    const std::byte* header = base + at;
    uint16_t made_by = Read16(header + 4);
    uint16_t flags = Read16(header + 8);
    uint16_t method = Read16(header + 10);
    ZipMember member;
    member.crc32 = Read32(header + 16);
    member.compressed_size = Read32(header + 20);
    member.size = Read32(header + 24);
    uint16_t name_length = Read16(header + 28);
    uint16_t extra_length = Read16(header + 30);
    uint16_t comment_length = Read16(header + 32);
    uint32_t external_attributes = Read32(header + 38);
    uint32_t local_offset = Read32(header + 42);
    uint64_t next = at + kCentralHeaderSize + name_length + extra_length + comment_length;
    if (next > uint64_t{directory_offset} + directory_size) {
      return Bad("corrupt central directory at entry " + std::to_string(i));
    }
    member.name.assign(reinterpret_cast<const char*>(header + kCentralHeaderSize), name_length);
    const std::string& name = member.name;
    if (name_length > limits.max_name_bytes) {
      return BadMember(
          name.substr(0, 64) + "...",
          "the name is longer than " + std::to_string(limits.max_name_bytes) + " bytes");
    }
    OROCHI_RETURN_IF_ERROR(CheckPath(name));
    if ((flags & 0x41) != 0) return BadMember(name, "encrypted members are not allowed");
    if (method != kMethodStored && method != kMethodDeflate) {
      return BadMember(name, "compression method " + std::to_string(method) +
                                 " is not supported (only stored and deflate)");
    }
    const uint32_t mode = external_attributes >> 16;
    if ((made_by >> 8) == 3 && (mode & S_IFMT) == S_IFLNK) {
      return BadMember(name, "symbolic links are not allowed");
    }
    if (member.size == 0xFFFFFFFF || member.compressed_size == 0xFFFFFFFF ||
        local_offset == 0xFFFFFFFF) {
      return BadMember(name, "ZIP64 sizes are not supported");
    }
    member.stored = method == kMethodStored;
    if (member.is_directory() && member.size != 0) {
      return BadMember(name, "a directory entry with data");
    }
    if (member.stored && member.compressed_size != member.size) {
      return BadMember(name, "stored, but its compressed and uncompressed sizes differ");
    }
    if (member.size > limits.max_member_bytes) {
      return BadMember(name, "uncompressed size " + std::to_string(member.size) +
                                 " bytes is over the limit of " +
                                 std::to_string(limits.max_member_bytes));
    }
    total += member.size;
    if (total > limits.max_total_bytes) {
      return BadMember(name, "the members' total uncompressed size passes the limit of " +
                                 std::to_string(limits.max_total_bytes) + " bytes");
    }
    if (!member.stored && member.size >= kRatioExemptBytes &&
        (member.compressed_size == 0 ||
         static_cast<double>(member.size) / static_cast<double>(member.compressed_size) >
             limits.max_compression_ratio)) {
      return BadMember(
          name, "compression ratio " +
                    std::to_string(member.size / std::max<uint64_t>(1, member.compressed_size)) +
                    ":1 is over the limit of " +
                    std::to_string(static_cast<int>(limits.max_compression_ratio)) +
                    ":1 (a zip bomb?)");
    }

    // The local header must agree with the central directory.
    if (uint64_t{local_offset} + kLocalHeaderSize > directory_offset ||
        Read32(base + local_offset) != kLocalHeaderSignature) {
      return BadMember(name, "its local header is missing or corrupt");
    }
    const std::byte* local = base + local_offset;
    uint16_t local_name_length = Read16(local + 26);
    uint16_t local_extra_length = Read16(local + 28);
    if (Read16(local + 8) != method || local_name_length != name_length ||
        uint64_t{local_offset} + kLocalHeaderSize + local_name_length > directory_offset ||
        std::memcmp(local + kLocalHeaderSize, name.data(), name_length) != 0) {
      return BadMember(name, "its local header disagrees with the central directory");
    }
    member.header_offset = local_offset;
    member.data_offset =
        uint64_t{local_offset} + kLocalHeaderSize + local_name_length + local_extra_length;
    if (member.data_offset + member.compressed_size > directory_offset) {
      return BadMember(name, "its data runs past the central directory (truncated?)");
    }
    if (!reader->index_.emplace(name, reader->members_.size()).second) {
      return BadMember(name, "duplicate member name");
    }
    reader->members_.push_back(std::move(member));
    at = next;
  }

  // Members must not share bytes: overlapping entries are another way to build a zip bomb.
  std::vector<const ZipMember*> by_offset;
  for (const ZipMember& member : reader->members_) by_offset.push_back(&member);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ZipMember* a, const ZipMember* b) { return a->data_offset < b->data_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipMember& previous = *by_offset[i - 1];
    if (previous.data_offset + previous.compressed_size > by_offset[i]->header_offset) {
      return BadMember(by_offset[i]->name, "its data overlaps member '" + previous.name + "'");
    }
  }
  reader->file_ = std::move(file);
  return reader;
}

const ZipMember* ZipReader::Find(std::string_view name) const {
  auto found = index_.find(name);
  return found == index_.end() ? nullptr : &members_[found->second];
}

Status ZipReader::VerifyStored(const ZipMember& member) const {
  if (Crc32(file_->data() + member.data_offset, member.size) != member.crc32) {
    return BadMember(member.name, "CRC-32 mismatch (the data is corrupt)");
  }
  return Status::Ok();
}

Result<std::string> ZipReader::Read(const ZipMember& member) const {
  const std::byte* data = file_->data() + member.data_offset;
  if (member.stored) {
    OROCHI_RETURN_IF_ERROR(VerifyStored(member));
    return std::string(reinterpret_cast<const char*>(data), member.size);
  }
  std::string out(member.size, '\0');
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) return Internal("inflateInit2 failed");
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(data));
  stream.avail_in = static_cast<uInt>(member.compressed_size);
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  int result = inflate(&stream, Z_FINISH);
  uint64_t produced = stream.total_out;
  inflateEnd(&stream);
  if (result != Z_STREAM_END) {
    return BadMember(member.name, result == Z_BUF_ERROR && produced == member.size
                                      ? "inflates to more than its declared size"
                                      : "corrupt deflate data");
  }
  if (produced != member.size) {
    return BadMember(member.name, "inflates to " + std::to_string(produced) +
                                      " bytes, not its declared " + std::to_string(member.size));
  }
  if (Crc32(reinterpret_cast<const std::byte*>(out.data()), out.size()) != member.crc32) {
    return BadMember(member.name, "CRC-32 mismatch (the data is corrupt)");
  }
  return out;
}

Status WriteZip(const std::string& path, const std::vector<ZipEntry>& entries) {
  std::string archive;
  std::string directory;
  for (const ZipEntry& entry : entries) {
    OROCHI_RETURN_IF_ERROR(CheckPath(entry.name));
    std::string compressed;
    if (!entry.store) {
      OROCHI_ASSIGN_OR_RETURN(compressed, Deflate(entry.data));
    }
    const std::string& payload = entry.store ? entry.data : compressed;
    if (archive.size() > 0xFFFFFFF0U || payload.size() > 0xFFFFFFF0U) {
      return InvalidArgument("the package would need ZIP64 (over 4 GiB)");
    }
    const auto offset = static_cast<uint32_t>(archive.size());
    const uint32_t crc =
        Crc32(reinterpret_cast<const std::byte*>(entry.data.data()), entry.data.size());
    const uint16_t method = entry.store ? kMethodStored : kMethodDeflate;
    std::string extra;
    if (entry.store) {
      uint64_t unpadded = offset + kLocalHeaderSize + entry.name.size() + 4;
      auto padding = static_cast<uint16_t>((kStoredAlignment - unpadded % kStoredAlignment) %
                                           kStoredAlignment);
      Put16(extra, kAlignmentExtraId);
      Put16(extra, padding);
      extra.append(padding, '\0');
    }
    auto put_common = [&](std::string& out) {
      Put16(out, 20);  // version needed: 2.0
      Put16(out, kUtf8Flag);
      Put16(out, method);
      Put16(out, 0);  // time 00:00:00
      Put16(out, kDosDate1980);
      Put32(out, crc);
      Put32(out, static_cast<uint32_t>(payload.size()));
      Put32(out, static_cast<uint32_t>(entry.data.size()));
      Put16(out, static_cast<uint16_t>(entry.name.size()));
    };
    Put32(archive, kLocalHeaderSignature);
    put_common(archive);
    Put16(archive, static_cast<uint16_t>(extra.size()));
    archive += entry.name;
    archive += extra;
    archive += payload;

    Put32(directory, kCentralHeaderSignature);
    Put16(directory, (3 << 8) | 20);  // made by Unix, zip 2.0
    put_common(directory);
    Put16(directory, 0);  // extra
    Put16(directory, 0);  // comment
    Put16(directory, 0);  // disk
    Put16(directory, 0);  // internal attributes
    Put32(directory, (entry.name.back() == '/' ? 040755U : 0100644U) << 16);
    Put32(directory, offset);
    directory += entry.name;
  }
  if (entries.size() > 0xFFFE) return InvalidArgument("too many members for a zip archive");
  const auto directory_offset = static_cast<uint32_t>(archive.size());
  archive += directory;
  Put32(archive, kEndSignature);
  Put16(archive, 0);
  Put16(archive, 0);
  Put16(archive, static_cast<uint16_t>(entries.size()));
  Put16(archive, static_cast<uint16_t>(entries.size()));
  Put32(archive, static_cast<uint32_t>(directory.size()));
  Put32(archive, directory_offset);
  Put16(archive, 0);

  // Written beside the target and renamed over it, so a reader never sees half a package.
  std::string temporary = path + ".tmp." + std::to_string(getpid());
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Internal("cannot create " + temporary + ": " + std::strerror(errno));
  size_t written = 0;
  while (written < archive.size()) {
    ssize_t chunk = write(fd, archive.data() + written, archive.size() - written);
    if (chunk < 0 && errno == EINTR) continue;
    if (chunk <= 0) {
      Status error = Internal("cannot write " + temporary + ": " + std::strerror(errno));
      close(fd);
      unlink(temporary.c_str());
      return error;
    }
    written += static_cast<size_t>(chunk);
  }
  const bool synced = fsync(fd) == 0;
  const bool closed = close(fd) == 0;
  if (!synced || !closed || rename(temporary.c_str(), path.c_str()) != 0) {
    Status error = Internal("cannot finish " + path + ": " + std::strerror(errno));
    unlink(temporary.c_str());
    return error;
  }
  return Status::Ok();
}

}  // namespace orochi::packaging
