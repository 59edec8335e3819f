// Chat templates for instruction fine-tuning (docs/DESIGN.md "Instruction fine-tuning"): the
// Jinja chat_template of a tokenizer_config.json, recognised by its exact text (SHA-256) and
// rendered by a built-in renderer written from what the template does. Known templates:
//   llama3         Meta Llama 3 Instruct, first release: every message as
//                  <|start_header_id|>ROLE<|end_header_id|>\n\n + content|trim + <|eot_id|>, the
//                  first after bos_token; always ends with the assistant header
//   llama3-gen     the same, the assistant header only with add_generation_prompt (the later
//                  revision, shipped with the Llama 3.1 tokenizer package)
//   mistral-v3     Mistral's v3 (Tekken) instruct format (Mistral NeMo): bos, [INST]user[/INST],
//                  assistant content + eos_token; the system message is prefixed to the last user
//                  message only; roles must alternate user/assistant
//   qwen3          Qwen 3: <|im_start|>ROLE\n ... <|im_end|>\n; the assistant turns after the last
//                  user query carry a <think>...</think> block (empty when there is no reasoning)
// Any other template is refused with an error naming its digest and first line. Tool calls and
// tool roles are refused (not rendered).
// The assistant spans of a rendering are what the model generates at each assistant turn: from
// the end of the generation prompt (the assistant header) through the end-of-turn token; they are
// the tokens an SFT loss covers.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace trident {

struct ChatMessage {
  std::string role, content;
  std::string reasoning;  // Qwen 3's reasoning_content (empty: none given)
  bool has_reasoning = false;
};

struct RenderedChat {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> assistant;  // byte spans [begin, end) of text
};

class ChatTemplate {
 public:
  enum class Kind { Llama3, Llama3Gen, MistralV3, Qwen3 };
  // template_text: the exact chat_template; bos / eos: tokenizer_config.json's bos_token and
  // eos_token strings. Throws Error::all for an unknown template; `where` names its file.
  ChatTemplate(const std::string& template_text, std::string bos, std::string eos, const std::string& where);
  // The chat_template, bos_token and eos_token of a tokenizer_config.json (or of the directory
  // holding it, or the directory of a tokenizer.json path).
  static ChatTemplate from_config(const std::string& path);

  Kind kind() const { return kind_; }
  const char* name() const;
  // The text that ends an assistant turn (Llama 3: <|eot_id|>; Qwen 3: <|im_end|>; Mistral: its
  // eos_token): where a reply ends when the model generates it.
  std::string end_of_turn() const;
  // Throws Error::one with the template's own message when it refuses the messages (roles out of
  // order, an unknown role).
  RenderedChat render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = false) const;

 private:
  Kind kind_;
  std::string bos_, eos_;
};

// The SHA-256 of each known template's text and its name, for messages and docs.
std::vector<std::pair<std::string, std::string>> known_chat_templates();

// The messages of one JSON-lines record: {"messages": [{"role": ..., "content": ...}, ...]} or
// {"prompt": ..., "response": ...} with an optional "system" (user and assistant turns). false for
// a blank line; throws Error::one naming what is wrong (invalid JSON, a missing or non-string
// field, tool calls).
bool chat_messages_of_json(std::string_view line, std::vector<ChatMessage>& out);

// Python's str.strip() (what Jinja's trim filter calls): the Unicode whitespace that
// str.isspace() accepts, at both ends of a UTF-8 string.
std::string python_strip(std::string_view s);

}  // namespace trident
