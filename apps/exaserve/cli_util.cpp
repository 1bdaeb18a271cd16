#include "cli_util.hpp"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "engine/isa.hpp"
#include "model/model_gen.hpp"

namespace exa::app {

expected<void> init_engine_isa() {
  const char* env = std::getenv("EXA_ENGINE_ISA");
  const std::string requested = env != nullptr ? env : "";
  auto chosen = engine::set_active_isa(requested);
  if (!chosen) return make_error(chosen.error().code, "EXA_ENGINE_ISA: " + chosen.error().message);
  spdlog::info("event=engine_isa isa={} requested={} cpu=\"{}\"", engine::to_string(*chosen),
               requested.empty() ? "auto" : requested, engine::describe(engine::detect_cpu()));
  return {};
}

int fail(const char* command, const error& e) {
  std::fprintf(stderr, "exaserve %s: %s\n", command, to_string(e).c_str());
  return e.code == errc::invalid_argument ? 2 : 1;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

expected<std::string> cache_dir() {
  std::filesystem::path dir;
  if (const char* c = std::getenv("EXASERVE_CACHE"); c && *c) {
    dir = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    dir = std::filesystem::path(x) / "exaserve";
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    dir = std::filesystem::path(h) / ".cache" / "exaserve";
  } else {
    return make_error(errc::invalid_argument, "no cache directory: set EXASERVE_CACHE or HOME");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir / "models", ec);
  if (ec) return make_error(errc::io_error, "cannot create " + (dir / "models").string() + ": " + ec.message());
  return dir.string();
}

expected<std::string> default_model_path() {
  auto dir = cache_dir();
  if (!dir) return std::unexpected(dir.error());
  const auto path = (std::filesystem::path(*dir) / "models" / "tiny-f32-seed1.gguf").string();
  if (std::filesystem::exists(path)) return path;
  auto spec = model::preset_spec("tiny");
  spdlog::info("event=default_model_generate path={} preset=tiny", path);
  if (auto ok = model::generate_model(*spec, path); !ok) return std::unexpected(ok.error());
  return path;
}

}  // namespace exa::app
