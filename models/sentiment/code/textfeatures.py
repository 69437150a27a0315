"""Text to hashed feature ids, in pure Python: the per-request work of the sentiment model.

Imports nothing from Orochi, so the build script trains on exactly these features and the
FastAPI baseline in bench/models serves exactly this code.
"""

import re
import unicodedata

BUCKETS = 1 << 14  # feature ids are 1 .. BUCKETS-1; 0 pads a batch
CHAR_NGRAMS = (3, 4, 5)
NEGATORS = frozenset({"not", "no", "never", "nothing", "nobody", "hardly", "without", "neither"})
CONTRACTIONS = (("won't", "will not"), ("can't", "can not"), ("n't", " not"), ("'re", " are"),
                ("'m", " am"), ("'ll", " will"), ("'ve", " have"), ("'d", " would"))
_TOKEN = re.compile(r"[a-z0-9]+|[.,;:!?]")
_REPEATS = re.compile(r"(.)\1{2,}")
_FNV_OFFSET, _FNV_PRIME = 0x811C9DC5, 0x01000193


def normalise(text: str) -> str:
    """Lower case, accents removed, typographic quotes folded, contractions expanded and
    letters repeated for emphasis cut to two ("sooo" -> "soo")."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = text.lower().replace("\u2019", "'").replace("\u2018", "'")
    for short, long in CONTRACTIONS:
        text = text.replace(short, long)
    return _REPEATS.sub(r"\1\1", text)


def tokenise(text: str) -> list:
    """Words, with the words after a negation marked until the end of the clause:
    "not good, but fun" -> ["not", "not_good", ",", "but", "fun"]."""
    words, negated = [], False
    for token in _TOKEN.findall(normalise(text)):
        if not token[0].isalnum():
            negated = False
            words.append(token)
        elif token in NEGATORS:
            negated = True
            words.append(token)
        else:
            words.append("not_" + token if negated else token)
    return words


def fnv1a(text: str) -> int:
    value = _FNV_OFFSET
    for byte in text.encode("utf-8"):
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return value


def bucket(feature: str) -> int:
    return 1 + fnv1a(feature) % (BUCKETS - 1)


def word_features(word: str) -> list:
    """The word itself and its character n-grams, with boundary marks."""
    marked = f"<{word}>"
    grams = [marked[i:i + n] for n in CHAR_NGRAMS for i in range(len(marked) - n + 1)]
    return ["w:" + word] + ["c:" + gram for gram in grams]


def analyse(text: str) -> tuple:
    """A text's hashed feature ids, in one pass: ([(word, the ids of the word and its character
    n-grams), ...], ids of the word pairs)."""
    words = [w for w in tokenise(text) if w[0].isalnum()]
    per_word = [(word, [bucket(name) for name in word_features(word)]) for word in words]
    pairs = [bucket(f"b:{a}|{b}") for a, b in zip(words, words[1:])]
    return per_word, pairs


def feature_ids(per_word: list, pairs: list) -> list:
    """analyse()'s ids as one list: every word's, then the pairs'."""
    ids = [i for _, word_ids in per_word for i in word_ids] + pairs
    return ids or [bucket("w:<empty>")]


def features(text: str) -> list:
    """Hashed feature ids of a text: words, word pairs and character n-grams."""
    return feature_ids(*analyse(text))
