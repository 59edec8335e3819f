// sft_render: renders and tokenizes chat records as instruction fine-tuning does (data/chat_template,
// data/sft_dataset), for the comparison with @huggingface/jinja and @huggingface/tokenizers
// (tests/data/compare_chat_templates.py).
//   sft_render TOKENIZER_DIR RECORDS OUT [--generation-prompt]
// RECORDS: JSON lines as sft.train_data takes them. OUT: one JSON line per record, {"text": the
// rendering, "ids": its tokens, "learned": 0/1 per token (in an assistant span)} or {"error": the
// message} when the record is refused. Exit 0 unless the tokenizer or template cannot be loaded.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.hpp"
#include "data/chat_template.hpp"
#include "data/hf_tokenizer.hpp"
#include "data/sft_dataset.hpp"

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 5 && std::string(argv[4]) == "--generation-prompt")) {
    std::cerr << "usage: sft_render TOKENIZER_DIR RECORDS OUT [--generation-prompt]\n";
    return 2;
  }
  try {
    const trident::HfTokenizer tok(argv[1]);
    const trident::ChatTemplate tmpl = trident::ChatTemplate::from_config(argv[1]);
    const bool generation_prompt = argc == 5;
    std::ifstream in(argv[2]);
    if (!in) throw std::runtime_error(std::string("cannot read ") + argv[2]);
    std::ofstream out(argv[3]);
    std::string line;
    std::vector<trident::ChatMessage> messages;
    while (std::getline(in, line)) {
      nlohmann::json j;
      try {
        if (!trident::chat_messages_of_json(line, messages)) continue;
        const trident::RenderedChat r = tmpl.render(messages, generation_prompt);
        const trident::SftConversation c = trident::tokenize_chat(tok, r);
        j["text"] = r.text;
        j["ids"] = c.tokens;
        j["learned"] = c.learned;
      } catch (const trident::Error& e) {
        j = nlohmann::json::object();
        j["error"] = e.what();
      }
      out << j.dump() << '\n';
    }
    if (!out) throw std::runtime_error(std::string("cannot write ") + argv[3]);
    std::cerr << "sft_render: template " << tmpl.name() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "sft_render: " << e.what() << "\n";
    return 1;
  }
}
