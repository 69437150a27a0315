"""Trains the sentiment model's bag of embeddings and writes its package directory.

There is no review dataset on a machine without network access, so the corpus is generated
here from templates and word lists (seeded, so every build trains the same model): reviews of
films, books, restaurants and hotels whose sentiment comes from the adjectives and verbs they
use, flipped by negation ("not good"), plus neutral statements of fact. Training is plain numpy
(Adam on the cross-entropy) over the exact features textfeatures.py computes at serving time.

Writes OUT/package/ (weights/sentiment.safetensors) and OUT/request.json.
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "code")]
import build_support  # noqa: E402
import textfeatures  # noqa: E402

SEED = 7
EMBEDDING_DIM = 32
EXAMPLES = 6000
EPOCHS = 8
BATCH = 64
LEARNING_RATE = 0.01
LABELS = ["negative", "neutral", "positive"]

SUBJECTS = ["the film", "this movie", "the plot", "the acting", "the soundtrack", "the ending",
            "the script", "the cast", "the book", "the story", "the food", "the service",
            "our waiter", "the hotel", "the room", "the staff", "this album", "the show",
            "the dialogue", "the pacing", "the dessert", "the performance", "the sequel"]
POSITIVE = ["great", "excellent", "wonderful", "delightful", "brilliant", "superb", "enjoyable",
            "fantastic", "charming", "moving", "beautiful", "fun", "perfect", "gripping",
            "lovely", "outstanding", "clever", "touching", "fresh", "friendly", "amazing", "good"]
NEGATIVE = ["terrible", "awful", "boring", "dull", "disappointing", "horrible", "bland",
            "painful", "annoying", "poor", "clumsy", "tedious", "mediocre", "forgettable",
            "rude", "stale", "predictable", "messy", "weak", "bad", "dreadful", "lifeless"]
LIKE_POSITIVE = ["loved", "enjoyed", "adored", "recommend", "liked", "admired", "savoured"]
LIKE_NEGATIVE = ["hated", "regret", "disliked", "endured", "wasted my evening on"]
INTENSIFIERS = ["", "", "really ", "very ", "truly ", "absolutely ", "quite ", "sooo "]
NEUTRAL = ["{s} is two hours long.", "{s} opens on friday.", "{s} was released in 2019.",
           "i watched {s} on a tuesday.", "{s} is based on a novel.", "{s} has four chapters.",
           "we went to see {s} with friends.", "{s} was filmed in ireland.",
           "{s} is available in english and french.", "the review of {s} is below.",
           "{s} is the second in the series.", "tickets for {s} cost ten euros.",
           "i read about {s} in the newspaper.", "{s} starts at eight.",
           "{s} was shown at the festival.", "my sister chose {s}."]
CLOSERS = ["", "", " overall.", " to be honest.", " in my opinion.", "!", ", as expected.",
           " from start to finish."]


def review(rng):
    """One (text, label index) pair."""
    subject = SUBJECTS[rng.randint(len(SUBJECTS))]
    kind = rng.randint(5)
    if kind == 0:
        return NEUTRAL[rng.randint(len(NEUTRAL))].format(s=subject).capitalize(), 1
    polarity = rng.randint(2)  # 0 negative, 1 positive
    negated = rng.rand() < 0.3
    adjectives = POSITIVE if polarity else NEGATIVE
    word = adjectives[rng.randint(len(adjectives))]
    intensifier = INTENSIFIERS[rng.randint(len(INTENSIFIERS))]
    closer = CLOSERS[rng.randint(len(CLOSERS))]
    if kind in (1, 2):
        verb = ["was", "is", "felt", "seemed"][rng.randint(4)]
        text = f"{subject} {verb} {'not ' if negated else ''}{intensifier}{word}{closer}"
    elif kind == 3:
        verbs = LIKE_POSITIVE if polarity else LIKE_NEGATIVE
        verb = verbs[rng.randint(len(verbs))]
        text = f"i {'did not ' + verb.removesuffix('d') if negated else verb} {subject}{closer}"
    else:
        other = (NEGATIVE if polarity else POSITIVE)[rng.randint(len(NEGATIVE))]
        text = f"{subject} started {other}, but it was {intensifier}{word} in the end{closer}"
        negated = False
    label = 2 if polarity != negated else 0
    return text.capitalize(), label


def batches(rows, labels, rng):
    order = rng.permutation(len(rows))
    for start in range(0, len(rows), BATCH):
        chosen = order[start:start + BATCH]
        longest = max(len(rows[i]) for i in chosen)
        ids = np.zeros((len(chosen), longest), dtype=np.int64)
        for r, i in enumerate(chosen):
            ids[r, :len(rows[i])] = rows[i]
        yield ids, labels[chosen]


def forward(embedding, weight, bias, ids):
    counts = (ids > 0).sum(axis=1, keepdims=True).astype(np.float32)
    pooled = embedding[ids].sum(axis=1) / counts
    return pooled, counts, pooled @ weight.T + bias


def train(rows, labels, rng):
    embedding = (rng.randn(textfeatures.BUCKETS, EMBEDDING_DIM) * 0.1).astype(np.float32)
    embedding[0] = 0
    weight = (rng.randn(len(LABELS), EMBEDDING_DIM) * 0.1).astype(np.float32)
    bias = np.zeros(len(LABELS), dtype=np.float32)
    params = [embedding, weight, bias]
    moments = [np.zeros_like(p) for p in params]
    squares = [np.zeros_like(p) for p in params]
    step = 0
    for _ in range(EPOCHS):
        for ids, target in batches(rows, labels, rng):
            pooled, counts, logits = forward(embedding, weight, bias, ids)
            grad = np.exp(logits - logits.max(axis=1, keepdims=True))
            grad /= grad.sum(axis=1, keepdims=True)
            grad[np.arange(len(target)), target] -= 1
            grad /= len(target)
            grad_pooled = (grad @ weight) / counts
            grad_embedding = np.zeros_like(embedding)
            np.add.at(grad_embedding, ids, np.repeat(grad_pooled[:, None, :], ids.shape[1], 1))
            grad_embedding[0] = 0
            step += 1
            for p, g, m, v in zip(params, [grad_embedding, grad.T @ pooled, grad.sum(0)],
                                  moments, squares):
                m *= 0.9
                m += 0.1 * g
                v *= 0.999
                v += 0.001 * g * g
                p -= (LEARNING_RATE * (m / (1 - 0.9 ** step))
                      / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)).astype(np.float32)
    return embedding, weight, bias


def accuracy(params, rows, labels):
    correct = 0
    for ids, target in batches(rows, labels, np.random.RandomState(0)):
        correct += int((forward(*params, ids)[2].argmax(axis=1) == target).sum())
    return correct / len(rows)


def main():
    args = build_support.parse_args(__doc__.splitlines()[0])
    rng = np.random.RandomState(SEED)
    corpus = [review(rng) for _ in range(EXAMPLES)]
    rows = [textfeatures.features(text) for text, _ in corpus]
    labels = np.array([label for _, label in corpus])
    split = EXAMPLES * 4 // 5
    params = train(rows[:split], labels[:split], rng)
    print(f"sentiment: accuracy {accuracy(params, rows[split:], labels[split:]):.2%} on "
          f"{EXAMPLES - split} generated reviews held out of training")

    package = build_support.stage_package(HERE, args.out)
    embedding, weight, bias = params
    build_support.write_safetensors(package / "weights" / "sentiment.safetensors", {
        "embedding.weight": embedding, "classifier.weight": weight, "classifier.bias": bias})
    texts = ["The soundtrack was absolutely wonderful and the cast was charming!",
             "I didn't like the ending, it felt sooo predictable.",
             "The film opens on Friday."]
    build_support.write_json(args.out / "request.json", build_support.json_request(
        [("text", "BYTES", [len(texts), 1], texts)]), compact=True)


if __name__ == "__main__":
    main()
