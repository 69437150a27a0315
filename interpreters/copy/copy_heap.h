// Tracking of everything a copy allocates, so an unloaded copy leaves no memory behind.
#pragma once

#include <cstddef>

namespace orochi::copy {

// Routes obmalloc's arenas through the tracker and keeps the tracker's lock safe across fork().
// Call before CPython starts.
void InstallHeapTracking();

// Frees every block and arena the copy still holds and returns how many bytes that was.
// Precondition: CPython is finalized and no thread runs in the copy.
size_t ReleaseHeap();

}  // namespace orochi::copy
