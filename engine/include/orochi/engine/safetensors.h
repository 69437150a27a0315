// The safetensors format: a little-endian u64 header length, a JSON header naming each tensor's
// dtype, shape and [begin, end) byte range in the data that follows, then the data.
//
// Loading memory-maps the file: tensors are read-only views of the one mapping (no copy; pages
// are read when first touched), shared by every thread and interpreter copy. Loading checks the
// whole header and rejects, naming the problem: truncated files, a header length beyond the
// file, invalid JSON, unknown dtypes, offsets out of range, overlapping or leaving holes, and
// shapes that disagree with their byte ranges.
#pragma once

#include <map>
#include <string>

#include "orochi/base/status.h"
#include "orochi/engine/export.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine {

struct SafetensorsContents {
  std::map<std::string, Tensor> tensors;        // read-only
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" entry
};

// Maps and parses the file at `path`. Errors: kNotFound (no file), kInvalidArgument (malformed).
OROCHI_ENGINE_API Result<SafetensorsContents> LoadSafetensors(const std::string& path);

// Parses a safetensors image held in `bytes` (all of it); tensors view `bytes`.
OROCHI_ENGINE_API Result<SafetensorsContents> ParseSafetensors(const StoragePtr& bytes);
// Parses the image stored at [offset, offset + size) of `bytes`, e.g. one member of a mapped
// archive; tensors view `bytes` (copied only where an offset is misaligned for the dtype).
OROCHI_ENGINE_API Result<SafetensorsContents> ParseSafetensors(const StoragePtr& bytes,
                                                               size_t offset, size_t size);

// Writes `tensors` (any strides and dtypes) and `metadata` to `path`, replacing it by a rename:
// tensors still mapping an earlier file at `path` keep their data, and a failed save leaves
// the earlier file in place.
OROCHI_ENGINE_API Status SaveSafetensors(const std::string& path,
                                         const std::map<std::string, Tensor>& tensors,
                                         const std::map<std::string, std::string>& metadata = {});

}  // namespace orochi::engine
