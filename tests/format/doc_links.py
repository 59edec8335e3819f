#!/usr/bin/env python3
"""Every relative link in the user documents resolves: README.md, docs/*.md and the READMEs of
inputs/, data/, jobscripts/, validation/ and perf/. A link [text](target) outside code blocks
and code spans whose target is not a URL must name a file or folder that exists, relative to the
document; a '#anchor' (alone or after a Markdown file) must be one of that file's headings as
GitHub writes its anchors (lower case, punctuation dropped, spaces as hyphens, repeats numbered).

usage: doc_links.py [ROOT]      exit 0 when every link resolves, 1 with the broken ones listed
"""
import glob
import os
import re
import sys

LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def documents(root):
    docs = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    docs += [os.path.join(root, d, "README.md") for d in ("inputs", "data", "jobscripts", "validation", "perf")]
    return [d for d in docs if os.path.isfile(d)]


def prose(text):
    """The text without fenced code blocks and code spans (links there are examples, not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(path):
    out, seen = set(), {}
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)
    for line in text.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    broken, count = [], 0
    for doc in documents(root):
        with open(doc, encoding="utf-8") as f:
            text = prose(f.read())
        for m in LINK.finditer(text):
            target = m.group(2)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            count += 1
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            where = f"{os.path.relpath(doc, root)}: [{m.group(1)}]({target})"
            if not os.path.exists(full):
                broken.append(f"{where}: {os.path.relpath(full, root)} does not exist")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                broken.append(f"{where}: no heading '#{anchor}' in {os.path.relpath(full, root)}")
    for b in broken:
        print("BROKEN", b)
    print(f"doc_links: {count} relative links in {len(documents(root))} documents, {len(broken)} broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
