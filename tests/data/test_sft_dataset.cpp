// Instruction fine-tuning data (data/chat_template, data/sft_dataset) beyond what the comparison
// with @huggingface/jinja (compare_chat_templates.py) covers: Python's strip, the record parser's
// refusals, first-fit-decreasing packing against a plain implementation, and the packed records of
// real conversations with the Llama 3 tokenizer of the sample data (TRIDENT_SAMPLE_DIR/hf/llama3):
// targets only on assistant tokens, conversation indices, padding, epochs, the overlong policy.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "common/error.hpp"
#include "data/chat_template.hpp"
#include "data/sft_dataset.hpp"
#include "data_test_helpers.hpp"

using namespace trident;
using trident::test::sample_dir;
namespace fs = std::filesystem;

TEST(ChatTemplate, PythonStrip) {
  EXPECT_EQ(python_strip("  a b \n\t"), "a b");
  EXPECT_EQ(python_strip("\u00a0\u3000x\u2028\u0085"), "x");  // NBSP, ideographic space, LS, NEL
  EXPECT_EQ(python_strip("\x1c\x1fx\x1e"), "x");              // Python counts the separators as space
  EXPECT_EQ(python_strip("\ufeffx"), "\ufeffx");              // Python keeps the BOM; JavaScript's trim does not
  EXPECT_EQ(python_strip("\u200bx"), "\u200bx");              // zero width space is not white space
  EXPECT_EQ(python_strip(" \n "), "");
  EXPECT_EQ(python_strip("é"), "é");
}

TEST(ChatTemplate, RecordsAndRefusals) {
  std::vector<ChatMessage> m;
  EXPECT_FALSE(chat_messages_of_json("  ", m));
  ASSERT_TRUE(chat_messages_of_json(R"({"system": "s", "prompt": "p", "response": "r"})", m));
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[2].content, "r");
  ASSERT_TRUE(chat_messages_of_json(
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"}]})",
      m));
  EXPECT_TRUE(m[1].has_reasoning);
  auto refused = [&](const std::string& line, const std::string& what) {
    try {
      chat_messages_of_json(line, m);
      ADD_FAILURE() << "accepted: " << line;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused("{not json", "invalid JSON");
  refused(R"(["a"])", "not an object");
  refused(R"({"text": "pretraining"})", "neither 'messages' nor 'prompt'");
  refused(R"({"messages": []})", "non-empty list");
  refused(R"({"messages": [{"role": "user"}]})", "has no 'content'");
  refused(R"({"messages": [{"role": "user", "content": 3}]})", "is not a string");
  refused(R"({"messages": [{"role": "tool", "content": "x"}]})", "role 'tool'");
  refused(R"({"messages": [{"role": "assistant", "content": "", "tool_calls": []}]})", "tool calls");
  refused(R"({"messages": [{"role": "user", "content": "only a question"}]})", "no assistant turn");
  refused(R"({"prompt": "p"})", "has no 'response'");
}

TEST(ChatTemplate, SpansAndUnknownTemplates) {
  // the renderers are selected by the template's digest: text that is not a known template is refused
  EXPECT_THROW(ChatTemplate("{{ messages }}", "<s>", "</s>", "test"), Error);
  const std::string d = sample_dir();
  if (d.empty()) GTEST_SKIP() << "TRIDENT_SAMPLE_DIR is not set";
  const ChatTemplate llama = ChatTemplate::from_config(d + "/hf/llama3");
  EXPECT_STREQ(llama.name(), "llama3");
  const RenderedChat r = llama.render(
      {{"system", " sys ", "", false}, {"user", "q", "", false}, {"assistant", " the answer ", "", false}});
  ASSERT_EQ(r.assistant.size(), 1u);
  EXPECT_EQ(r.text.substr(r.assistant[0].first, r.assistant[0].second - r.assistant[0].first), "the answer<|eot_id|>");
  EXPECT_EQ(r.text.rfind("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nsys<|eot_id|>", 0), 0u);
  const ChatTemplate qwen = ChatTemplate::from_config(d + "/hf/qwen3/tokenizer.json");
  const RenderedChat q = qwen.render({{"user", "q", "", false}, {"assistant", "a", "", false}});
  EXPECT_EQ(q.text.substr(q.assistant[0].first, q.assistant[0].second - q.assistant[0].first),
            "<think>\n\n</think>\n\na<|im_end|>");
  const ChatTemplate mistral = ChatTemplate::from_config(d + "/hf/mistral_nemo");
  const RenderedChat ms = mistral.render({{"system", "S", "", false},
                                          {"user", "q1", "", false},
                                          {"assistant", "a1", "", false},
                                          {"user", "q2", "", false}});
  EXPECT_EQ(ms.text, "<s>[INST]q1[/INST]a1</s>[INST]S\n\nq2[/INST]");  // the system goes with the last user turn
  EXPECT_THROW(mistral.render({{"assistant", "first", "", false}}), Error);
}

namespace {
// first-fit-decreasing the plain way: every open bin tried in order
std::vector<std::vector<std::int64_t>> plain_ffd(const std::vector<std::int64_t>& len, std::int64_t cap) {
  std::vector<std::int64_t> order(len.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return len[a] > len[b]; });
  std::vector<std::vector<std::int64_t>> bins;
  std::vector<std::int64_t> room;
  for (auto d : order) {
    size_t b = 0;
    while (b < bins.size() && room[b] < len[d]) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      room.push_back(cap);
    }
    bins[b].push_back(d);
    room[b] -= len[d];
  }
  return bins;
}
}  // namespace

TEST(SftPacking, FirstFitDecreasing) {
  EXPECT_EQ(pack_first_fit_decreasing({5, 3, 7, 2, 4}, 10),
            (std::vector<std::vector<std::int64_t>>{{2, 1}, {0, 4}, {3}}));
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    const std::int64_t cap = 16 + static_cast<std::int64_t>(rng() % 200);
    std::vector<std::int64_t> len(1 + rng() % 400);
    for (auto& l : len) l = 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cap));
    ASSERT_EQ(pack_first_fit_decreasing(len, cap), plain_ffd(len, cap)) << "trial " << trial;
  }
  EXPECT_THROW(pack_first_fit_decreasing({3, 11}, 10), Error);
}

namespace {
std::string write_file(const std::string& name, const std::string& text) {
  const fs::path d = fs::temp_directory_path() / ("trident_sft_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::ofstream(d / name) << text;
  return (d / name).string();
}
}  // namespace

TEST(SftDataset, PackedRecordsOfRealConversations) {
  const std::string d = sample_dir();
  if (d.empty()) GTEST_SKIP() << "TRIDENT_SAMPLE_DIR is not set";
  const HfTokenizer tok(d + "/hf/llama3");
  const ChatTemplate tmpl = ChatTemplate::from_config(d + "/hf/llama3");
  const std::string records =
      R"({"prompt": "Continue the verse: In the beginning", "response": "God created the heaven and the earth."})"
      "\n\n"
      R"({"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2 longer"}]})"
      "\n"
      R"({"prompt": "Which word ends this sentence? And God saw the light", "response": "good"})"
      "\n";
  const std::string path = write_file("convs.jsonl", records);
  SftOptions o;
  o.seq_length = 64;
  const std::int32_t pad = tok.eod_id();
  const SftDataset ds(path, tok, tmpl, o, pad);
  EXPECT_EQ(ds.conversations(), 3);
  // each conversation alone, as the renderer and tokenize_chat give it
  std::vector<SftConversation> convs;
  std::vector<ChatMessage> m;
  std::istringstream lines(records);
  for (std::string line; std::getline(lines, line);)
    if (chat_messages_of_json(line, m)) convs.push_back(tokenize_chat(tok, tmpl.render(m)));
  std::int64_t total = 0, learned = 0;
  for (const auto& c : convs) {
    total += static_cast<std::int64_t>(c.tokens.size());
    for (size_t k = 1; k < c.learned.size(); ++k) learned += c.learned[k];
    // what is learned decodes to the assistant turns and their <|eot_id|>
    std::vector<std::int32_t> a;
    for (size_t k = 0; k < c.tokens.size(); ++k)
      if (c.learned[k]) a.push_back(c.tokens[k]);
    const std::string text = tok.decode(a, false);
    EXPECT_NE(text.find("<|eot_id|>"), std::string::npos) << text;
    EXPECT_EQ(text.find("user"), std::string::npos) << text;
    EXPECT_EQ(text.find("<|start_header_id|>"), std::string::npos) << text;
  }
  EXPECT_EQ(ds.tokens(), total);
  EXPECT_EQ(ds.learned_tokens(), learned);
  ASSERT_LE(total, 2 * o.seq_length);
  // every record: conversations whole and in order, targets the next token where learned
  std::multiset<std::vector<std::int32_t>> seen;
  std::int64_t targets = 0;
  std::vector<std::int32_t> rec(static_cast<size_t>(3 * o.seq_length));
  for (std::int64_t b = 0; b < ds.packed_samples(); ++b) {
    ds.write_bin(b, rec.data());
    const std::int32_t *tk = rec.data(), *tg = tk + o.seq_length, *sg = tk + 2 * o.seq_length;
    std::int64_t t = 0;
    for (std::int32_t seg = 0; t < o.seq_length && sg[t] == seg; ++seg) {
      std::vector<std::int32_t> one;
      for (; t < o.seq_length && sg[t] == seg; ++t) {
        one.push_back(tk[t]);
        if (tg[t] >= 0) {
          EXPECT_EQ(tg[t], tk[t + 1]);
          ++targets;
        }
      }
      EXPECT_EQ(tg[t - 1], -1);  // a conversation's last token predicts nothing
      seen.insert(one);
    }
    for (; t < o.seq_length; ++t) {
      EXPECT_EQ(sg[t], -1);
      EXPECT_EQ(tk[t], pad);
      EXPECT_EQ(tg[t], -1);
    }
  }
  EXPECT_EQ(targets, learned);
  std::multiset<std::vector<std::int32_t>> want;
  for (const auto& c : convs) want.insert(c.tokens);
  EXPECT_EQ(seen, want);
  // an epoch serves every packed sample once; later epochs in another order, deterministically
  std::set<std::vector<std::int32_t>> epoch0;
  std::vector<std::int32_t> again(rec.size());
  for (std::int64_t i = 0; i < ds.packed_samples(); ++i) {
    ds.get(i, rec.data());
    epoch0.insert(rec);
    ds.get(i, again.data());
    EXPECT_EQ(rec, again);
  }
  EXPECT_EQ(static_cast<std::int64_t>(epoch0.size()), ds.packed_samples());
  // longer than the sequence: refused naming the line, or cut to it
  o.seq_length = 12;
  try {
    SftDataset refused(path, tok, tmpl, o, pad);
    ADD_FAILURE() << "an overlong conversation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 1: the conversation has"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sft.overlong = truncate"), std::string::npos) << e.what();
  }
  o.truncate = true;
  const SftDataset cut(path, tok, tmpl, o, pad);
  EXPECT_EQ(cut.truncated(), 3);
  EXPECT_EQ(cut.packed_samples(), 3);
  EXPECT_EQ(cut.tokens(), 36);
  // a bad record names its line
  const std::string bad = write_file("bad.jsonl", records + R"({"messages": [{"role": "user", "content": "x"}]})"
                                                            "\n");
  o.truncate = false;
  o.seq_length = 64;
  try {
    SftDataset refused(bad, tok, tmpl, o, pad);
    ADD_FAILURE() << "a record without an assistant turn was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("line 5: the conversation has no assistant turn"), std::string::npos)
        << e.what();
  }
}
