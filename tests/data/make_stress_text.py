#!/usr/bin/env python3
"""Writes a deterministic UTF-8 stress text for the GPT-2 tokenizer comparison.

usage: make_stress_text.py OUTPUT [--seed N]

Hand-written lines cover contractions (also upper-case ones, which GPT-2 does not special-case),
white-space runs (trailing spaces, blank lines, tabs, CRLF, Unicode spaces), digits of many
scripts, letters of many scripts, combining marks, emoji with ZWJ sequences and skin tones,
long words and long punctuation runs; then a few thousand pseudo-random "sentences" mix them.

Characters on which JavaScript's \\s and Unicode's White_Space (the definition of Python's
`regex`, used by GPT-2) disagree are left out: U+0085, U+FEFF, U+180E, U+001C..U+001F.
"""
import random
import sys

HAND = [
    "Hello world! It's a test: don't, won't, can't, I'm, you're, we've, they'll, she'd.",
    "UPPER CASE: IT'S, DON'T, I'M, YOU'RE, WE'VE, THEY'LL, SHE'D, 'S 'T 'RE 'VE 'M 'LL 'D.",
    "Mixed: It'S, don'T, We'Ve, rock'n'roll, o'clock, ma'am, y'all, 'tis, '90s, ''s, '''ll.",
    "'s at the start, and at the end 's",
    "Quotes: 'single' \"double\" `back` ‘curly’ “curly” «guillemets» „low“",
    "Trailing spaces   ",
    "Tabs\tbetween\t\twords\t",
    "   leading spaces and    inner     runs",
    "CRLF line\r\nnext line\r\n\r\nafter a blank CRLF line\r\n",
    "Blank lines follow\n\n\n\nafter four newlines\n \n \t\n",
    "Unicode spaces: a\u00a0b c\u2003d e\u3000f g\u2009h i\u202fj k\u205fl m\u1680n",
    "Line separators: a\u2028b\u2029c and vertical tab a\u000bb form feed a\u000cb",
    "Digits: 0 7 42 123 1234 12345 3.14159 1,000,000 -17 +3e10 0xFF 1st 2nd 3rd v2.0 A1B2C3",
    "Long number: 98765432109876543210987654321098765432109876543210",
    "Scripts' digits: ٠١٢٣٤٥٦٧٨٩ ۰۱۲ १२३४ ১২৩ ๑๒๓ １２３ ²³¹ ½ ¾ Ⅻ ⅷ ① ㉑",
    "Latin: café naïve résumé Straße Ærøskøbing Łódź İstanbul ǅemal ﬁne ﬂow",
    "Greek: Ελληνικά αβγδε ΣΊΣΥΦΟΣ; Cyrillic: Привет, мир! Ёлка. Ukrainian: Їжак і ґанок.",
    "Hebrew: שָׁלוֹם עולם; Arabic: مرحبا بالعالم، كيف حالك؟ Persian: سلام",
    "Devanagari: नमस्ते दुनिया, हिन्दी; Bengali: আমার সোনার বাংলা; Tamil: வணக்கம்",
    "Thai: สวัสดีครับ ภาษาไทย; Lao: ສະບາຍດີ; Khmer: សួស្តី; Georgian: გამარჯობა; Armenian: Բարեւ",
    "CJK: 漢字と仮名が混じった文章です。中文句子，包括标点！한국어 문장도 있습니다.",
    "Fullwidth: ＡＢＣ ｆｕｌｌ ｗｉｄｔｈ！ Halfwidth: ｶﾀｶﾅ",
    "Emoji: 😀 😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✅ 🧪🔬 🏳️‍🌈 a😀b 1😀2",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0335a\u0336l\u0337g\u0338o \u0301leading mark",
    "Math: ∑ ∫ ∂ √ ∞ ≤ ≥ ≠ ≈ ∈ ∉ ⊂ ⊆ ∀ ∃ → ⇒ ∘ ×÷ ±  𝔸𝕓𝒞 𝟘𝟙𝟚",
    "Symbols: © ® ™ § ¶ † ‡ • … ‰ ′ ″ ‹ › € £ ¥ ₹ ₿ ° µ",
    "Punctuation runs: !!!!!!!! ???? ...... ------- ======= ******* ~~~~ ____ ;;;; ::::",
    "Commas and apostrophes: ,,,, ,',', ',' \",\" ,, ,a, ,1, ,\u00e9,",
    "Code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // comment /* block */",
    "Code: def f(x):\n    return {'a': [1, 2, 3], \"b\": (4, 5)}  # dict\n\tif x>=0: pass",
    "URL: https://example.com/path/to/page?query=1&x=%20y#frag and mail: someone@example.org",
    "Markup: <div class=\"x\">text</div> &amp; &lt; &#x41; [link](http://a.b) **bold** _it_",
    "The special string <|endoftext|> is ordinary text here, and so is <|endoftext|>.",
    "Control-ish: a\u0001b\u0007c\u007fd (C0 controls and DEL)",
    "Long word: " + "a" * 300,
    "Long word 2: " + "supercalifragilisticexpialidocious" * 12,
    "Long word 3: " + "Pneumonoultramicroscopicsilicovolcanoconiosis" * 5 + "!",
    "Long digits: " + "0123456789" * 40,
    "Long punctuation: " + "-=" * 150,
    "Long CJK: " + "漢字" * 150,
    "Long spaces before a word:" + " " * 80 + "word" + "\t" * 10 + "tabbed",
]

# Pools for the random part.
WORDS = ("the of and to in is was he for it with as his on be at by I this had not are but from or have an "
         "they which one you were her all she there would their we him been has when who will more no if out so "
         "Hello World LORD THE Über Ärger naïve café résumé Straße mañana ønske Øresund "
         "мир Привет Ελλάδα λόγος שלום مرحبا नमस्ते 漢字 東京 中文 한국 ภาษา ქართული").split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "'", "''", "’s"]
NUMBERS = ["0", "7", "42", "2024", "3.14", "1,000", "٣٤", "१२", "１２", "²", "½", "Ⅻ", "10e-3", "007"]
PUNCT = [".", ",", "!", "?", ";", ":", "...", "--", "-", "(", ")", "[", "]", "{", "}", "\"", "'", "/", "\\",
         "@", "#", "$", "%", "^", "&", "*", "+", "=", "<", ">", "|", "~", "`", "…", "—", "–", "«", "»", "¿", "¡",
         "。", "、", "！", "？", ",,", ",'", "',", "😀", "👍🏽", "🇩🇪", "‍", "\u0301"]
SPACES = [" ", " ", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\u00a0", "\u3000", "\u2003",
          "    ", " \t ", "\n   ", "\t\t"]


def random_sentence(rng):
    parts = []
    for _ in range(rng.randint(3, 25)):
        r = rng.random()
        if r < 0.55:
            w = rng.choice(WORDS)
            if rng.random() < 0.15:
                w = w.upper()
            parts.append(w)
        elif r < 0.65:
            parts.append(rng.choice(WORDS) + rng.choice(CONTRACTIONS))
        elif r < 0.75:
            parts.append(rng.choice(NUMBERS))
        elif r < 0.90:
            parts.append(rng.choice(PUNCT) * rng.choice([1, 1, 1, 2, 3]))
        else:
            parts.append(rng.choice(WORDS) + rng.choice(PUNCT) + rng.choice(WORDS))
        parts.append(rng.choice(SPACES) if rng.random() < 0.8 else "")
    return "".join(parts)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    seed = 1234
    if "--seed" in sys.argv:
        seed = int(sys.argv[sys.argv.index("--seed") + 1])
    rng = random.Random(seed)
    text = "\n".join(HAND) + "\n"
    # Each hand line also inside other contexts (after a space, after a digit, at line start).
    for line in HAND[:30]:
        text += " " + line + "\n" + "7" + line + "\n"
    for _ in range(3000):
        text += random_sentence(rng) + "\n"
    text += "The end, with trailing white space at the very end of the text:  \n\n  "
    with open(sys.argv[1], "w", encoding="utf-8", newline="") as f:
        f.write(text)


if __name__ == "__main__":
    main()
