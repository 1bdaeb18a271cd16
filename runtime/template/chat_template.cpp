#include "template/chat_template.hpp"

#include <fstream>
#include <sstream>

namespace exa::jinja {

std::optional<std::string_view> find_builtin_template(std::string_view name) {
  for (const auto& t : builtin_templates())
    if (t.name == name) return t.source;
  return std::nullopt;
}

expected<template_source> select_template(std::string_view override_spec,
                                          const std::optional<std::string>& file_template, std::size_t bytes_max) {
  if (override_spec.empty()) {
    if (file_template && !file_template->empty()) return template_source{*file_template, "model file"};
    return template_source{std::string(*find_builtin_template(default_template_name)),
                           "built-in '" + std::string(default_template_name) + "' (the model file has none)"};
  }
  if (auto b = find_builtin_template(override_spec))
    return template_source{std::string(*b), "built-in '" + std::string(override_spec) + "'"};
  const std::string path(override_spec);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::string names;
    for (const auto& t : builtin_templates()) names += (names.empty() ? "" : ", ") + std::string(t.name);
    return make_error(errc::not_found, "chat template '" + path + "' is neither a built-in (" + names +
                                           ") nor a readable file");
  }
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > bytes_max)
      return make_error(errc::invalid_argument, "chat template file '" + path + "' is larger than " +
                                                    std::to_string(bytes_max) + " bytes");
  }
  if (in.bad()) return make_error(errc::io_error, "reading chat template file '" + path + "' failed");
  return template_source{std::move(text), "file " + path};
}

expected<void> check_template_override(std::string_view override_spec) {
  if (override_spec.empty()) return {};
  auto src = select_template(override_spec, std::nullopt);
  if (!src) return std::unexpected(src.error());
  auto t = compiled_template::compile(src->text);
  if (!t) return make_error(t.error().code, t.error().message + " (template from " + src->origin + ")");
  return {};
}

expected<template_source> resolve_template_override(std::string_view override_spec, std::size_t bytes_max) {
  if (override_spec.empty()) return make_error(errc::invalid_argument, "chat template: empty name or file");
  auto src = select_template(override_spec, std::nullopt, bytes_max);
  if (!src) return std::unexpected(src.error());
  // An empty text would read as "no override" downstream: refuse it here.
  if (src->text.empty()) return make_error(errc::invalid_argument, "chat template from " + src->origin + " is empty");
  auto t = compiled_template::compile(src->text);
  if (!t) return make_error(t.error().code, t.error().message + " (template from " + src->origin + ")");
  return src;
}

expected<void> check_template_text(std::string_view text) {
  if (text.empty()) return {};
  if (text.size() > deployment_template_bytes_max)
    return make_error(errc::invalid_argument, "chat template is " + std::to_string(text.size()) +
                                                  " bytes, more than " +
                                                  std::to_string(deployment_template_bytes_max));
  auto t = compiled_template::compile(std::string(text));
  if (!t) return make_error(t.error().code, t.error().message + " (the deployment's chat template)");
  return {};
}

value make_message(std::string role, std::string content) {
  dict d;
  d.set("role", value(std::move(role)));
  d.set("content", value(std::move(content)));
  return value(std::move(d));
}

expected<chat_renderer> chat_renderer::create(const template_source& source, std::string bos_token,
                                              std::string eos_token, const template_limits& limits) {
  auto t = compiled_template::compile(source.text, limits);
  if (!t) return make_error(t.error().code, t.error().message + " (template from " + source.origin + ")");
  chat_renderer r;
  r.tpl_ = std::move(*t);
  r.origin_ = source.origin;
  r.bos_ = std::move(bos_token);
  r.eos_ = std::move(eos_token);
  return r;
}

expected<std::string> chat_renderer::render(const chat_inputs& in, std::int64_t now_unix_s) const {
  dict vars;
  vars.set("messages", in.messages);
  vars.set("tools", in.tools);
  vars.set("documents", value(none_t{}));
  vars.set("add_generation_prompt", value(in.add_generation_prompt));
  vars.set("bos_token", value(bos_));
  vars.set("eos_token", value(eos_));
  return tpl_.render(vars, now_unix_s);
}

std::string strip_special_affixes(std::string rendered, std::string_view bos_token, bool add_bos,
                                  std::string_view eos_token, bool add_eos) {
  if (add_bos && !bos_token.empty() && rendered.starts_with(bos_token)) rendered.erase(0, bos_token.size());
  if (add_eos && !eos_token.empty() && rendered.ends_with(eos_token))
    rendered.erase(rendered.size() - eos_token.size());
  return rendered;
}

}  // namespace exa::jinja
