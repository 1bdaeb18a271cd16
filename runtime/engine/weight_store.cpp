#include "engine/weight_store.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <new>

#include "common/assert.hpp"
#include "engine/q8_pack.hpp"
#include "engine/thread_pool.hpp"

namespace exa::engine {
namespace {

constexpr std::size_t huge_page = std::size_t{2} << 20;
constexpr std::size_t small_page = 4096;
constexpr std::size_t copy_alignment = 64;  // every copy starts on a cache line
constexpr std::size_t copy_chunk = std::size_t{1} << 20;  // a pool task's share of a plain copy

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

// Bytes `w`'s copy takes (0: left alone).
std::size_t copy_bytes(const model::weight_view& w, bool copy_unpacked) {
  if (w.rows == 0) return 0;
  if (w.type == model::tensor_type::q8_0) return (w.rows + q8p_group_rows - 1) / q8p_group_rows * q8p_group_bytes(w.cols);
  return copy_unpacked && !w.owned ? static_cast<std::size_t>(w.bytes()) : 0;
}

}  // namespace

std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!in || !std::getline(in, line)) return "unavailable";
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

weight_store::buffer::buffer(std::size_t bytes, bool huge) {
  // Huge pages only pay on a buffer of at least one: the mapping then starts
  // on a 2 MiB boundary and ends on one, so every page of it can be huge.
  if (huge && bytes >= huge_page) {
    const std::string mode = thp_mode();
    huge = mode != "never" && mode != "unavailable";
  } else {
    huge = false;
  }
  const std::size_t align = huge ? huge_page : small_page;
  const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), align);
  map_bytes_ = size + (huge ? huge_page : 0);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw std::bad_alloc();
  }
  const auto base = reinterpret_cast<std::uintptr_t>(map_);
  data_ = reinterpret_cast<std::byte*>(round_up(base, align));
  // Asked before the first write: the copy's faults then take whole pages.
  huge_ = huge && ::madvise(data_, size, MADV_HUGEPAGE) == 0;
}

weight_store::buffer::buffer(buffer&& o) noexcept
    : map_(o.map_), map_bytes_(o.map_bytes_), data_(o.data_), huge_(o.huge_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
  o.data_ = nullptr;
}

weight_store::buffer::~buffer() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

void weight_store::place(std::span<model::weight_view* const> views, thread_pool* pool) {
  std::vector<std::size_t> offset(views.size()), size(views.size());
  std::size_t total = 0, copies = 0, payload = 0;
  for (std::size_t i = 0; i < views.size(); ++i) {
    const std::size_t n = size[i] = copy_bytes(*views[i], options_.copy_unpacked);
    offset[i] = total;
    total += round_up(n, copy_alignment);
    payload += n;
    copies += n > 0 ? 1 : 0;
  }
  if (copies == 0) return;
  buffers_.reserve(buffers_.size() + 1);
  buffer buf(total, options_.huge_pages);
  std::byte* const base = buf.data();
  // Every copy made before any view changes: should one throw, the views
  // still read the file and the buffer goes with the exception.
  std::vector<model::weight_view> placed(views.size());
  for (std::size_t i = 0; i < views.size(); ++i) {
    model::weight_view& w = placed[i] = *views[i];
    const std::size_t n = size[i];
    if (n == 0) continue;
    std::byte* const out = base + offset[i];
    if (w.type == model::tensor_type::q8_0) {
      const std::size_t groups = (w.rows + q8p_group_rows - 1) / q8p_group_rows;
      const std::size_t gbytes = q8p_group_bytes(w.cols);
      const auto pack = [&](std::size_t g0, std::size_t g1) {
        q8p_pack_rows(w, g0 * q8p_group_rows, std::min<std::size_t>(g1 * q8p_group_rows, w.rows), out + g0 * gbytes);
      };
      if (pool != nullptr) pool->parallel_for(groups, 1, pack);
      else pack(0, groups);
      w.packed = out;
    } else {
      const std::size_t chunks = (n + copy_chunk - 1) / copy_chunk;
      const auto copy = [&](std::size_t c0, std::size_t c1) {
        const std::size_t from = c0 * copy_chunk, to = std::min(n, c1 * copy_chunk);
        std::memcpy(out + from, w.data + from, to - from);
      };
      if (pool != nullptr) pool->parallel_for(chunks, 1, copy);
      else copy(0, chunks);
      w.data = out;
    }
  }
  for (std::size_t i = 0; i < views.size(); ++i) {
    views[i]->data = placed[i].data;
    views[i]->packed = placed[i].packed;
  }
  memory_.bytes += payload;
  memory_.copies += copies;
  memory_.huge_pages = (buffers_.empty() || memory_.huge_pages) && buf.huge();
  buffers_.push_back(std::move(buf));
}

}  // namespace exa::engine
