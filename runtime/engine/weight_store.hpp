#pragma once
// A forward pass's own copies of its matmul weights (llama_forward.cpp):
// q8_0 repacked for the kernels (q8_pack.hpp), every other type copied byte
// for byte out of the file's mapping, all in one anonymous buffer for which
// the kernel is asked for 2 MiB pages (transparent huge pages, madvise).
//
// Why copy what the file's mapping already holds: on the Zen 5 host, against
// the mapping's page-cache pages, f16 ran one-thread decode 1.44x and prefill
// 1.42x as fast from such a copy, f32 prefill 1.55x (its decode within the
// noise), and a copy in ordinary 4 KiB pages gave f16 decode 1.08-1.17x
// (docs/PERFORMANCE.md, "Weights in memory of their own"). The cost is
// memory: each forward holds its copy instead of sharing the page cache with
// every process that maps the file (the placement ledger counts a replica's
// weights as its own; docs/MODELS.md says where it does not), and the copy
// is made at load, not during a request. `copy_unpacked = false` keeps reading
// the mapping (q8_0 is packed either way, as before).

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "model/llama_weights.hpp"

namespace exa::engine {

class thread_pool;

struct resident_options {
  /// Copy the matmul weights of every type but q8_0 (always packed) out of
  /// the file's mapping; false: the kernels read them from the mapping.
  bool copy_unpacked = true;
  /// Ask for 2 MiB pages (madvise(MADV_HUGEPAGE)) for the buffer.
  bool huge_pages = true;
};

/// What a forward's weights occupy of memory of its own.
struct resident_memory {
  std::size_t bytes = 0;   // of the copies, padding left out
  std::size_t copies = 0;  // matrices copied or packed
  /// The kernel was asked for 2 MiB pages and its THP mode allows them
  /// (whether it found free ones shows in /proc/PID/smaps' AnonHugePages).
  bool huge_pages = false;
};

/// The kernel's transparent huge page mode, /sys/kernel/mm/transparent_
/// hugepage/enabled's bracketed word: "always", "madvise", "never", or
/// "unavailable" when the file cannot be read.
std::string thp_mode();

/// Owns the copies; they stay valid while it lives, also when it moves.
class weight_store {
 public:
  explicit weight_store(resident_options options = {}) : options_(options) {}

  /// Gives each of `views` (distinct matrices) a copy in one new buffer and
  /// rewrites it to use it: q8_0 gets `packed` (whole rows, 16-row groups
  /// from row 0), any other type, when copy_unpacked and the view is not
  /// `owned` already, `data` pointing at a byte-for-byte copy; a view left
  /// alone is unchanged. Across `pool` when given. Throws std::bad_alloc
  /// when the memory cannot be had, leaving every view as it was.
  void place(std::span<model::weight_view* const> views, thread_pool* pool = nullptr);

  const resident_memory& memory() const noexcept { return memory_; }

 private:
  class buffer {
   public:
    buffer(std::size_t bytes, bool huge);
    buffer(buffer&& o) noexcept;
    buffer& operator=(buffer&&) = delete;
    buffer(const buffer&) = delete;
    ~buffer();
    std::byte* data() const noexcept { return data_; }
    bool huge() const noexcept { return huge_; }

   private:
    void* map_ = nullptr;
    std::size_t map_bytes_ = 0;
    std::byte* data_ = nullptr;
    bool huge_ = false;
  };

  resident_options options_;
  std::vector<buffer> buffers_;
  resident_memory memory_;
};

}  // namespace exa::engine
