"""The two workloads of bench/http, shared word for word by the Orochi models (bench_http.py
copies this file into each package's code/) and the FastAPI baseline."""

import collections
import re

_WORD = re.compile(r"[a-z0-9']+")


def identity(x):
    return x


def text_score(text: str) -> float:
    """Normalise, tokenise and count words and bigrams: typical pre-processing, all Python."""
    words = _WORD.findall(text.lower())
    counts = collections.Counter(words)
    bigrams = collections.Counter(zip(words, words[1:]))
    score = 0.0
    for word, count in counts.items():
        score += count * (len(word) % 7) / (1 + len(word))
    for (first, second), count in bigrams.items():
        score += count * ((len(first) * 31 + len(second)) % 11) / 100.0
    return score
