"""Says whether an English review is negative, neutral or positive, and which words said so.

Most of the work is Python (textfeatures.py); the network is a bag of embeddings: the mean of
the feature ids' embeddings, then a linear layer to the three classes.
"""

import orochi
import orochi.nn as nn
import orochi.nn.functional as F
from orochi.serving import InputError

from textfeatures import BUCKETS, analyse, feature_ids

EMBEDDING_DIM = 32
KEYWORDS = 3  # the manifest's 'keywords' shape


class BagOfEmbeddings(nn.Module):
    def __init__(self, buckets: int, dim: int, classes: int):
        super().__init__()
        self.embedding = nn.Embedding(buckets, dim, padding_idx=0)
        self.classifier = nn.Linear(dim, classes)

    def pooled(self, ids, counts):
        """ids: [batch, length], padded with 0 (a zero row); counts: [batch, 1]."""
        return self.embedding(ids).sum(dim=1) / counts

    def forward(self, ids, counts):
        return self.classifier(self.pooled(ids, counts))


class SentimentModel:
    def __init__(self, context):
        self.labels = context.resource("labels.txt", encoding="utf-8").split()
        self.network = BagOfEmbeddings(BUCKETS, EMBEDDING_DIM, len(self.labels))
        self.network.load_state_dict(context.weights)
        self.network.eval()

    def predict(self, inputs):
        texts = []
        for (raw,) in inputs["text"]:
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError as error:
                raise InputError(f"'text' must be UTF-8: {error}") from None
        analyses = [analyse(text) for text in texts]  # tokenised and hashed once per text
        rows = [feature_ids(*analysis) for analysis in analyses]
        longest = max(len(row) for row in rows)
        ids = orochi.tensor([row + [0] * (longest - len(row)) for row in rows])
        counts = orochi.tensor([[float(len(row))] for row in rows])
        with orochi.no_grad():
            scores = self.network(ids, counts).softmax(-1)
        best = scores.argmax(-1).tolist()
        return {"label": [[self.labels[i]] for i in best],
                "scores": scores,
                "keywords": [self.explain(per_word, label)
                             for (per_word, _), label in zip(analyses, best)]}

    def explain(self, words, label):
        """The words that pushed hardest towards `label`: each word's own features scored by
        the class's row of the classifier, strongest first, padded with empty strings.
        `words`: [(word, its feature ids), ...] from analyse()."""
        if not words:
            return [""] * KEYWORDS
        longest = max(len(ids) for _, ids in words)
        ids = orochi.tensor([ids + [0] * (longest - len(ids)) for _, ids in words])
        counts = orochi.tensor([[float(len(ids))] for _, ids in words])
        with orochi.no_grad():
            pooled = self.network.pooled(ids, counts)
            logits = F.linear(pooled, self.network.classifier.weight)
            push = logits[:, label] - logits.mean(dim=-1)
        ranked = sorted(zip(push.tolist(), range(len(words))), reverse=True)
        chosen, seen = [], set()
        for _, index in ranked:
            word = words[index][0]
            if word not in seen:
                seen.add(word)
                chosen.append(word)
            if len(chosen) == KEYWORDS:
                break
        return chosen + [""] * (KEYWORDS - len(chosen))
