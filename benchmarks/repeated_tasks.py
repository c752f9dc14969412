"""Repeated-task workloads: one instruction applied to 20 different Python
snippets, one request after another (an agent applying the same change file
by file).

* ``edit``: add a docstring, reply with the function. SmolLM2-135M rewrites
  the function (it seldom adds the docstring): short replies that copy the
  prompt's names, little shared between replies.
* ``unittest``: write a unit test. The replies share a frame that is not in
  the prompt (``import unittest``, the ``TestCase`` class, ``unittest.main()``,
  the closing explanation), which ``suffix`` decoding drafts from earlier
  replies and prompt lookup (``ngram``) cannot see.
"""

from __future__ import annotations

INSTRUCTIONS = {
    "edit": ("Add a one-line docstring to this Python function and keep the code the same. "
             "Reply with the whole function in a Python code block."),
    "unittest": "Write a unit test for this function using unittest.",
}

SNIPPETS = [
    "def merge_counts(left, right):\n    result = dict(left)\n    for key, value in right.items():\n"
    "        result[key] = result.get(key, 0) + value\n    return result",
    "def read_chunks(stream, size):\n    chunks = []\n    while True:\n        data = stream.read(size)\n"
    "        if not data:\n            break\n        chunks.append(data)\n    return chunks",
    "def clamp(value, low, high):\n    if value < low:\n        return low\n    if value > high:\n"
    "        return high\n    return value",
    "def word_lengths(text):\n    lengths = {}\n    for word in text.split():\n"
    "        lengths[word] = len(word)\n    return lengths",
    "def flatten(rows):\n    out = []\n    for row in rows:\n        for item in row:\n            out.append(item)\n"
    "    return out",
    "def is_palindrome(text):\n    cleaned = [c.lower() for c in text if c.isalnum()]\n"
    "    return cleaned == cleaned[::-1]",
    "def average(numbers):\n    if not numbers:\n        return 0.0\n    return sum(numbers) / len(numbers)",
    "def count_lines(path):\n    with open(path) as handle:\n        return sum(1 for _ in handle)",
    "def unique_sorted(items):\n    seen = set()\n    for item in items:\n        seen.add(item)\n"
    "    return sorted(seen)",
    "def parse_pairs(text):\n    pairs = {}\n    for part in text.split(','):\n        key, value = part.split('=')\n"
    "        pairs[key.strip()] = value.strip()\n    return pairs",
    "def chunk_list(items, size):\n    return [items[i:i + size] for i in range(0, len(items), size)]",
    "def fahrenheit(celsius):\n    return celsius * 9 / 5 + 32",
    "def first_word(sentence):\n    words = sentence.split()\n    if not words:\n        return ''\n"
    "    return words[0]",
    "def invert(mapping):\n    result = {}\n    for key, value in mapping.items():\n        result[value] = key\n"
    "    return result",
    "def running_total(values):\n    total = 0\n    out = []\n    for value in values:\n        total += value\n"
    "        out.append(total)\n    return out",
    "def max_index(values):\n    best = 0\n    for i in range(1, len(values)):\n        if values[i] > values[best]:\n"
    "            best = i\n    return best",
    "def strip_comments(lines):\n    kept = []\n    for line in lines:\n        if not line.startswith('#'):\n"
    "            kept.append(line)\n    return kept",
    "def repeat_string(text, times):\n    parts = []\n    for _ in range(times):\n        parts.append(text)\n"
    "    return ''.join(parts)",
    "def count_vowels(text):\n    return sum(1 for c in text.lower() if c in 'aeiou')",
    "def safe_divide(a, b):\n    if b == 0:\n        return None\n    return a / b",
]


def conversations(task: str = "unittest") -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"{INSTRUCTIONS[task]}\n\n```python\n{code}\n```"}] for code in SNIPPETS]
