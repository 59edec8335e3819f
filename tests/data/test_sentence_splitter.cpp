// The rule-based sentence splitter of preprocess_data --split-sentences (data/sentence_splitter):
// splits after terminators, white space going to the next sentence with nothing lost,
// abbreviations, initials and numbers, paragraph breaks, ideographic terminators, and invalid
// UTF-8 passing through unharmed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/sentence_splitter.hpp"

namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  for (std::size_t end : trident::split_sentences(text)) {
    out.push_back(text.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

using V = std::vector<std::string>;

}  // namespace

TEST(SentenceSplitter, Basic) {
  EXPECT_EQ(split("Hello there. The end."), (V{"Hello there.", " The end."}));
  EXPECT_EQ(split("Is it? Yes! Sure... Fine."), (V{"Is it?", " Yes!", " Sure...", " Fine."}));
  EXPECT_EQ(split("One sentence only"), (V{"One sentence only"}));
  EXPECT_EQ(split(""), V{});
  EXPECT_EQ(split("   "), (V{"   "}));
}

TEST(SentenceSplitter, WhiteSpaceGoesToTheNextSentenceAndNothingIsLost) {
  EXPECT_EQ(split("  One.   Two.\n\tThree.  \n"), (V{"  One.", "   Two.", "\n\tThree.  \n"}));
  const std::string t = "A b. C d! E f? \"G h.\" (I j.) K.";
  std::string joined;
  for (const auto& s : split(t)) joined += s;
  EXPECT_EQ(joined, t);
  EXPECT_EQ(split(t), (V{"A b.", " C d!", " E f?", " \"G h.\"", " (I j.)", " K."}));
}

TEST(SentenceSplitter, AbbreviationsInitialsNumbers) {
  EXPECT_EQ(split("Mr. Smith went home. He slept."), (V{"Mr. Smith went home.", " He slept."}));
  EXPECT_EQ(split("See e.g. Fig. 3 and the U.S. Army. Done."), (V{"See e.g. Fig. 3 and the U.S. Army.", " Done."}));
  EXPECT_EQ(split("J. R. R. Tolkien wrote it. Yes."), (V{"J. R. R. Tolkien wrote it.", " Yes."}));
  EXPECT_EQ(split("Pi is 3.14 roughly. ok then."), (V{"Pi is 3.14 roughly. ok then."}));  // lower case next
  EXPECT_EQ(split("In 1999. The year."), (V{"In 1999.", " The year."}));
  EXPECT_EQ(split("Wait.Then"), (V{"Wait.Then"}));  // no space: no split
}

TEST(SentenceSplitter, ParagraphsAndIdeographic) {
  EXPECT_EQ(split("Title\n\nBody text here"), (V{"Title", "\n\nBody text here"}));
  EXPECT_EQ(split("line one\nline two"), (V{"line one\nline two"}));
  EXPECT_EQ(split("今日は晴れ。明日は雨。"), (V{"今日は晴れ。", "明日は雨。"}));
  EXPECT_EQ(split("你好！世界？好。"), (V{"你好！", "世界？", "好。"}));
  EXPECT_EQ(split("「はい。」次"), (V{"「はい。」", "次"}));
}

TEST(SentenceSplitter, InvalidUtf8IsHarmless) {
  const std::string t = "Bad \xff\xfe bytes. Next \xe3\x80 one.";
  std::string joined;
  for (const auto& s : split(t)) joined += s;
  EXPECT_EQ(joined, t);
  EXPECT_EQ(split(t).size(), 2u);
}
