// Built-in renderers of the known chat templates (data/chat_template.hpp), written from what each
// template does and checked against @huggingface/jinja rendering the real template text
// (tests/data/compare_chat_templates.py).
#include "data/chat_template.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.hpp"
#include "common/sha256.hpp"

namespace trident {

namespace {

struct Known {
  const char* sha256;
  ChatTemplate::Kind kind;
  const char* name;
};

// The SHA-256 of the exact template text (UTF-8) of each release recognised.
constexpr Known kKnown[] = {
    {"b48c47f6443892716176eb200bf4ef108f64e06ca26ed0fa8ebc0a4b3992fcb2", ChatTemplate::Kind::Llama3, "llama3"},
    {"ba03a121d097859c7b5b9cd03af99aafe95275210d2876f642ad9929a150f122", ChatTemplate::Kind::Llama3Gen, "llama3-gen"},
    {"7a29791b46bd731f43fbe4994f23c7b689daaa36c4d0294485fab19825a2ec5d", ChatTemplate::Kind::MistralV3, "mistral-v3"},
    {"87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5", ChatTemplate::Kind::Qwen3, "qwen3"},
};

std::string sha256_hex(const std::string& s) {
  Sha256 h;
  h.update(s);
  return h.hex();
}

// Decodes the code point at s[i] (valid UTF-8 assumed; a stray byte counts as itself) and its length.
char32_t code_point(std::string_view s, std::size_t i, std::size_t& len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  char32_t c = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
  for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  len = static_cast<std::size_t>(n);
  return c;
}

// str.isspace(): bidirectional class WS, B or S, or category Zs
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string_view strip_newlines(std::string_view s, bool left, bool right) {
  while (left && !s.empty() && s.front() == '\n') s.remove_prefix(1);
  while (right && !s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

// Appends text to the rendering; a span of what follows is recorded by the callers.
struct Out {
  RenderedChat r;
  void add(std::string_view s) { r.text.append(s); }
  std::size_t at() const { return r.text.size(); }
  void span(std::size_t begin) { r.assistant.emplace_back(begin, r.text.size()); }
};

}  // namespace

std::string python_strip(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e) {
    std::size_t len = 0;
    const char32_t c = code_point(s, b, len);
    if (!python_space(c)) break;
    b += len;
  }
  while (e > b) {  // find the start of the last code point
    std::size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    std::size_t len = 0;
    const char32_t c = code_point(s, start, len);
    if (start + len != e || !python_space(c)) break;
    e = start;
  }
  return std::string(s.substr(b, e - b));
}

std::vector<std::pair<std::string, std::string>> known_chat_templates() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& k : kKnown) out.emplace_back(k.sha256, k.name);
  return out;
}

ChatTemplate::ChatTemplate(const std::string& template_text, std::string bos, std::string eos, const std::string& where)
    : bos_(std::move(bos)), eos_(std::move(eos)) {
  const std::string digest = sha256_hex(template_text);
  for (const auto& k : kKnown)
    if (digest == k.sha256) {
      kind_ = k.kind;
      return;
    }
  std::string first = template_text.substr(0, template_text.find('\n'));
  if (first.size() > 80) first = first.substr(0, 80) + "...";
  std::string names;
  for (const auto& k : kKnown) names += std::string(names.empty() ? "" : ", ") + k.name;
  throw Error::all(where + ": unknown chat template (sha256 " + digest + ", beginning '" + first +
                   "'); Trident renders these templates only, recognised by their exact text: " + names +
                   " (docs/DESIGN.md \"Instruction fine-tuning\")");
}

ChatTemplate ChatTemplate::from_config(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  if (fs::is_directory(p))
    p /= "tokenizer_config.json";
  else if (p.filename() != "tokenizer_config.json")
    p = p.parent_path() / "tokenizer_config.json";
  std::ifstream in(p);
  if (!in) throw Error::all("chat template: cannot read '" + p.string() + "' (the tokenizer's tokenizer_config.json)");
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error::all("chat template: '" + p.string() + "' is not valid JSON (" + e.what() + ")");
  }
  auto token = [&](const char* key) -> std::string {
    if (!c.contains(key) || c[key].is_null()) return "";
    const auto& v = c[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    throw Error::all("chat template: '" + p.string() + "': " + key + " is neither a string nor an added token");
  };
  if (!c.contains("chat_template") || !c["chat_template"].is_string())
    throw Error::all("chat template: '" + p.string() +
                     "' has no chat_template string (named templates in a list are not supported)");
  return ChatTemplate(c["chat_template"].get<std::string>(), token("bos_token"), token("eos_token"), p.string());
}

std::string ChatTemplate::end_of_turn() const {
  switch (kind_) {
    case Kind::Llama3:
    case Kind::Llama3Gen: return "<|eot_id|>";
    case Kind::MistralV3: return eos_;
    case Kind::Qwen3: return "<|im_end|>";
  }
  return eos_;
}

const char* ChatTemplate::name() const {
  for (const auto& k : kKnown)
    if (k.kind == kind_) return k.name;
  return "?";
}

RenderedChat ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  Out o;
  switch (kind_) {
    case Kind::Llama3:
    case Kind::Llama3Gen: {
      const std::string header_end = "<|end_header_id|>\n\n";
      for (std::size_t i = 0; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (i == 0) o.add(bos_);
        o.add("<|start_header_id|>" + m.role + header_end);
        const std::size_t begin = o.at();
        o.add(python_strip(m.content));
        o.add("<|eot_id|>");
        if (m.role == "assistant") o.span(begin);
      }
      if (kind_ == Kind::Llama3 || add_generation_prompt) o.add("<|start_header_id|>assistant" + header_end);
      break;
    }
    case Kind::MistralV3: {
      std::size_t first = 0;
      const std::string* system = nullptr;
      if (!messages.empty() && messages[0].role == "system") {
        system = &messages[0].content;
        first = 1;
      }
      for (std::size_t i = first; i < messages.size(); ++i)
        if ((messages[i].role == "user") != ((i - first) % 2 == 0))
          throw Error::one(
              "After the optional system message, conversation roles must alternate user/assistant/user/assistant/...");
      o.add(bos_);
      for (std::size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role == "user") {
          if (i + 1 == messages.size() && system)
            o.add("[INST]" + *system + "\n\n" + m.content + "[/INST]");
          else
            o.add("[INST]" + m.content + "[/INST]");
        } else if (m.role == "assistant") {
          const std::size_t begin = o.at();
          o.add(m.content + eos_);
          o.span(begin);
        } else {
          throw Error::one(
              "Only user and assistant roles are supported, with the exception of an initial optional system "
              "message!");
        }
      }
      break;
    }
    case Kind::Qwen3: {
      const std::size_t n = messages.size();
      if (n > 0 && messages[0].role == "system") o.add("<|im_start|>system\n" + messages[0].content + "<|im_end|>\n");
      // the last user query: the last user message that is not a tool response
      std::size_t last_query = n == 0 ? 0 : n - 1;
      for (std::size_t k = n; k-- > 0;) {
        const auto& c = messages[k].content;
        const bool tool_response = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                                   c.compare(c.size() - 16, 16, "</tool_response>") == 0;
        if (messages[k].role == "user" && !tool_response) {
          last_query = k;
          break;
        }
      }
      for (std::size_t i = 0; i < n; ++i) {
        const auto& m = messages[i];
        if (m.role == "system" && i == 0) {
          continue;  // rendered above
        } else if (m.role == "user" || m.role == "system") {
          o.add("<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n");
        } else if (m.role == "assistant") {
          std::string content = m.content, reasoning;
          if (m.has_reasoning) {
            reasoning = m.reasoning;
          } else if (const auto close = content.find("</think>"); close != std::string::npos) {
            const std::string_view all(m.content);
            const auto last_close = all.rfind("</think>");
            content = std::string(strip_newlines(all.substr(last_close + 8), true, false));
            std::string_view before = strip_newlines(all.substr(0, close), false, true);
            const auto open = before.rfind("<think>");
            if (open != std::string_view::npos) before = before.substr(open + 7);
            reasoning = std::string(strip_newlines(before, true, false));
          }
          o.add("<|im_start|>assistant\n");
          const std::size_t begin = o.at();
          if (i > last_query && (i + 1 == n || !reasoning.empty()))
            o.add("<think>\n" + std::string(strip_newlines(reasoning, true, true)) + "\n</think>\n\n" +
                  std::string(strip_newlines(content, true, false)));
          else
            o.add(content);
          o.add("<|im_end|>");
          o.span(begin);
          o.add("\n");
        } else {
          throw Error::one("role '" + m.role + "': Trident's Qwen 3 renderer takes system, user and assistant turns");
        }
      }
      if (add_generation_prompt) o.add("<|im_start|>assistant\n");
      break;
    }
  }
  return std::move(o.r);
}

bool chat_messages_of_json(std::string_view line, std::vector<ChatMessage>& out) {
  out.clear();
  std::size_t b = 0;
  while (b < line.size() && (line[b] == ' ' || line[b] == '\t' || line[b] == '\r')) ++b;
  if (b == line.size()) return false;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line.begin(), line.end());
  } catch (const std::exception& e) {
    throw Error::one(std::string("invalid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw Error::one("the JSON line is not an object");
  auto text = [](const nlohmann::json& o, const char* key, const std::string& where) -> std::string {
    if (!o.contains(key)) throw Error::one(where + " has no '" + key + "'");
    if (!o[key].is_string()) throw Error::one(where + "'s '" + key + "' is not a string");
    return o[key].get<std::string>();
  };
  if (j.contains("messages")) {
    const auto& ms = j["messages"];
    if (!ms.is_array() || ms.empty()) throw Error::one("'messages' is not a non-empty list");
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const std::string where = "message " + std::to_string(i);
      if (!ms[i].is_object()) throw Error::one(where + " is not an object");
      if (ms[i].contains("tool_calls") || ms[i].contains("tools"))
        throw Error::one(where + " has tool calls: SFT takes system, user and assistant text turns");
      ChatMessage m;
      m.role = text(ms[i], "role", where);
      if (m.role != "system" && m.role != "user" && m.role != "assistant")
        throw Error::one(where + " has role '" + m.role + "' (system, user or assistant)");
      m.content = text(ms[i], "content", where);
      if (ms[i].contains("reasoning_content") && !ms[i]["reasoning_content"].is_null()) {
        m.reasoning = text(ms[i], "reasoning_content", where);
        m.has_reasoning = true;
      }
      out.push_back(std::move(m));
    }
  } else if (j.contains("prompt") || j.contains("response")) {
    if (j.contains("system")) out.push_back({"system", text(j, "system", "the record"), "", false});
    out.push_back({"user", text(j, "prompt", "the record"), "", false});
    out.push_back({"assistant", text(j, "response", "the record"), "", false});
  } else {
    throw Error::one("the JSON line has neither 'messages' nor 'prompt' and 'response'");
  }
  if (j.contains("tools")) throw Error::one("the record has tools: SFT takes system, user and assistant text turns");
  bool any = false;
  for (const auto& m : out) any = any || m.role == "assistant";
  if (!any) throw Error::one("the conversation has no assistant turn (nothing to learn)");
  return true;
}

}  // namespace trident
