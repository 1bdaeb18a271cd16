#include "template/model_chat.hpp"

#include "model/gguf.hpp"

namespace exa::jinja {

std::string token_text_or_empty(const model::vocab& v, std::optional<model::token_id> id) {
  if (!id || *id < 0 || static_cast<std::size_t>(*id) >= v.tokens.size()) return {};
  return v.tokens[static_cast<std::size_t>(*id)];
}

expected<chat_renderer> chat_renderer_for(const model::vocab& v, std::string_view override_spec,
                                          std::string_view deployment_template) {
  auto src = deployment_template.empty()
                 ? select_template(override_spec, v.chat_template)
                 : expected<template_source>(template_source{std::string(deployment_template), "the deployment's own"});
  if (!src) return std::unexpected(src.error());
  return chat_renderer::create(*src, token_text_or_empty(v, v.ids.bos), token_text_or_empty(v, v.ids.eos));
}

expected<chat_renderer> chat_renderer_for_file(const std::string& gguf_path, std::string_view override_spec,
                                               std::string_view deployment_template) {
  auto file = model::gguf_file::open(gguf_path);
  if (!file) return std::unexpected(file.error());
  auto v = model::vocab::from_gguf(*file);
  if (!v) return std::unexpected(v.error());
  return chat_renderer_for(*v, override_spec, deployment_template);
}

}  // namespace exa::jinja
