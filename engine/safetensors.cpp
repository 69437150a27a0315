#include "orochi/engine/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

namespace orochi::engine {
namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // 100 MiB

Status Malformed(const std::string& message) {
  return InvalidArgument("malformed safetensors: " + message);
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

Result<Entry> ParseEntry(const std::string& name, const nlohmann::json& value) {
  const std::string where = "tensor '" + name + "'";
  if (!value.is_object()) return Malformed(where + " is not a JSON object");
  auto dtype_field = value.find("dtype");
  auto shape_field = value.find("shape");
  auto offsets_field = value.find("data_offsets");
  if (dtype_field == value.end() || !dtype_field->is_string()) {
    return Malformed(where + " has no \"dtype\" string");
  }
  Entry entry{name, DType::kFloat32, {}, 0, 0};
  std::string dtype_code = dtype_field->get<std::string>();
  DType parsed{};
  if (!ParseDType(dtype_code, &parsed) || dtype_code != SafetensorsCode(parsed)) {
    return Malformed(where + " has unknown dtype '" + dtype_code + "'");
  }
  entry.dtype = parsed;
  if (shape_field == value.end() || !shape_field->is_array()) {
    return Malformed(where + " has no \"shape\" array");
  }
  if (shape_field->size() > kMaxDims) {
    return Malformed(where + " has " + std::to_string(shape_field->size()) +
                     " dimensions, more than the " + std::to_string(kMaxDims) +
                     " a tensor can have");
  }
  // The byte count is built with every product checked: a shape whose size wraps around 64
  // bits must not pass as a small tensor (its reads would leave the file). So is the first
  // stride (ContiguousStrides, which counts a 0 as 1): beside a 0 the other sizes make no
  // elements, but they still make the strides, which must not wrap either.
  uint64_t expected = ItemSize(entry.dtype);
  int64_t elements = 1;
  int64_t first_stride = 1;
  for (const auto& size : *shape_field) {
    if (!size.is_number_unsigned() ||
        size.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Malformed(where + " has a shape that is not all sizes");
    }
    entry.shape.push_back(size.get<int64_t>());
    if (__builtin_mul_overflow(elements, entry.shape.back(), &elements) ||
        __builtin_mul_overflow(expected, size.get<uint64_t>(), &expected)) {
      return Malformed(where + " has a shape whose size does not fit in 64 bits");
    }
    if (entry.shape.size() > 1 &&
        __builtin_mul_overflow(first_stride, std::max<int64_t>(entry.shape.back(), 1),
                               &first_stride)) {
      return Malformed(where + " has a shape whose strides do not fit in 64 bits");
    }
  }
  if (offsets_field == value.end() || !offsets_field->is_array() || offsets_field->size() != 2 ||
      !(*offsets_field)[0].is_number_unsigned() || !(*offsets_field)[1].is_number_unsigned()) {
    return Malformed(where + " needs \"data_offsets\": [begin, end]");
  }
  entry.begin = (*offsets_field)[0].get<uint64_t>();
  entry.end = (*offsets_field)[1].get<uint64_t>();
  if (entry.begin > entry.end) return Malformed(where + " has data_offsets with begin > end");
  if (entry.end - entry.begin != expected) {
    return Malformed(where + ": shape " + ShapeString(entry.shape) + " of " +
                     std::string(DTypeName(entry.dtype)) + " needs " + std::to_string(expected) +
                     " bytes, but data_offsets give " + std::to_string(entry.end - entry.begin));
  }
  return entry;
}

}  // namespace

Result<SafetensorsContents> ParseSafetensors(const StoragePtr& bytes) {
  return ParseSafetensors(bytes, 0, bytes->size());
}

Result<SafetensorsContents> ParseSafetensors(const StoragePtr& bytes, size_t region_offset,
                                             size_t size) {
  OROCHI_CHECK_ARG(region_offset <= bytes->size() && size <= bytes->size() - region_offset,
                   "safetensors region [" << region_offset << ", +" << size
                                          << ") is outside the storage of " << bytes->size()
                                          << " bytes");
  const std::byte* region = bytes->data() + region_offset;
  if (size < 8) {
    return Malformed("truncated: " + std::to_string(size) +
                     " bytes, but the file must start with an 8-byte header length");
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, region, 8);  // little-endian, as is x86-64
  if (header_length > size - 8) {
    return Malformed("the header length " + std::to_string(header_length) +
                     " runs past the end of the file (" + std::to_string(size) + " bytes)");
  }
  if (header_length > kMaxHeaderBytes) {
    return Malformed("the header is " + std::to_string(header_length) +
                     " bytes, over the limit of " + std::to_string(kMaxHeaderBytes));
  }
  const char* header_text = reinterpret_cast<const char*>(region) + 8;
  nlohmann::json header =
      nlohmann::json::parse(header_text, header_text + header_length, nullptr, false);
  if (header.is_discarded()) return Malformed("the header is not valid JSON");
  if (!header.is_object()) return Malformed("the header is not a JSON object");

  SafetensorsContents contents;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Malformed("__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) return Malformed("__metadata__['" + key + "'] is not a string");
        contents.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    OROCHI_ASSIGN_OR_RETURN(Entry entry, ParseEntry(name, value));
    entries.push_back(std::move(entry));
  }

  // The data must be covered exactly: in range, no overlaps, no holes.
  const uint64_t data_start = 8 + header_length;
  const uint64_t data_size = size - data_start;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    if (entry.end > data_size) {
      return Malformed("tensor '" + entry.name + "' has data_offsets [" +
                       std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                       "] outside the data (" + std::to_string(data_size) + " bytes)");
    }
    if (entry.begin < covered) {
      return Malformed("tensors '" + previous->name + "' and '" + entry.name + "' overlap");
    }
    if (entry.begin > covered) {
      return Malformed("data bytes [" + std::to_string(covered) + ", " +
                       std::to_string(entry.begin) + ") belong to no tensor");
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_size) {
    return Malformed("data bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) +
                     ") belong to no tensor");
  }

  for (const Entry& entry : entries) {
    const uint64_t offset = region_offset + data_start + entry.begin;
    const size_t item = ItemSize(entry.dtype);
    if (offset % item == 0) {
      contents.tensors[entry.name] = Tensor(bytes, entry.shape, ContiguousStrides(entry.shape),
                                            static_cast<int64_t>(offset / item), entry.dtype);
    } else {  // misaligned for its dtype: the one case that copies
      StoragePtr copy = Storage::Allocate(entry.end - entry.begin);
      std::memcpy(copy->mutable_data(), bytes->data() + offset, entry.end - entry.begin);
      copy->MarkReadOnly();
      contents.tensors[entry.name] =
          Tensor(std::move(copy), entry.shape, ContiguousStrides(entry.shape), 0, entry.dtype);
    }
  }
  return contents;
}

Result<SafetensorsContents> LoadSafetensors(const std::string& path) {
  OROCHI_ASSIGN_OR_RETURN(StoragePtr mapped, Storage::MapFile(path));
  Result<SafetensorsContents> contents = ParseSafetensors(mapped);
  if (!contents.ok()) {
    return Status(contents.status().code(), path + ": " + contents.status().message());
  }
  return contents;
}

Status SaveSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  // Widest dtypes first: with the header padded to 8 bytes every tensor is then aligned for its
  // dtype without padding (the format allows no holes), so loading never has to copy.
  std::vector<std::pair<std::string, Tensor>> by_alignment(tensors.begin(), tensors.end());
  for (const auto& [name, tensor] : by_alignment) {
    if (name == "__metadata__") return InvalidArgument("'__metadata__' cannot name a tensor");
    if (!tensor.defined()) return InvalidArgument("tensor '" + name + "' is undefined");
    if (tensor.device().type != DeviceType::kCpu) {
      return FailedPrecondition("saving tensor '" + name + "': the tensor is on " +
                                DeviceName(tensor.device()) + "; move it to the CPU first");
    }
  }
  std::stable_sort(by_alignment.begin(), by_alignment.end(), [](const auto& a, const auto& b) {
    return ItemSize(a.second.dtype()) > ItemSize(b.second.dtype());
  });
  std::vector<Tensor> ordered;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : by_alignment) {
    Tensor contiguous = tensor.Contiguous();
    uint64_t bytes = static_cast<uint64_t>(contiguous.numel()) * ItemSize(contiguous.dtype());
    header[name] = {{"dtype", SafetensorsCode(contiguous.dtype())},
                    {"shape", contiguous.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    ordered.push_back(std::move(contiguous));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data 8-byte aligned

  // The file is written beside `path` and renamed over it: tensors loaded from the old file map
  // it, and truncating a mapped file would make reading them fault (SIGBUS), as saving weights
  // back to where they were loaded from would. A rename leaves the old file to its mappings.
  static std::atomic<uint64_t> saves{0};
  const std::string partial =
      path + ".partial-" + std::to_string(::getpid()) + "-" + std::to_string(saves++);
  std::ofstream file(partial, std::ios::binary | std::ios::trunc);
  if (!file) return Internal("cannot write " + partial + ": " + std::strerror(errno));
  uint64_t length = text.size();
  file.write(reinterpret_cast<const char*>(&length), 8);
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Tensor& tensor : ordered) {
    file.write(static_cast<const char*>(tensor.data()),
               static_cast<std::streamsize>(tensor.numel() * ItemSize(tensor.dtype())));
  }
  file.close();
  if (!file || std::rename(partial.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(partial.c_str());
    return Internal("writing " + path + " failed: " + std::strerror(error));
  }
  return Status::Ok();
}

}  // namespace orochi::engine
