"""A transformer encoder over UTF-8 bytes: each text becomes one unit-length embedding (the mean
of its tokens' final states). Texts in a batch are padded and the padding is masked out of
attention and of the mean, so a text's embedding does not depend on its batch."""

import orochi
import orochi.nn as nn
import orochi.nn.functional as F
from orochi.serving import InputError

WIDTH = 256
HEADS = 4
LAYERS = 4
FEEDFORWARD = 1024
VOCABULARY = 258  # the 256 byte values, then [CLS] and [PAD]
CLS, PAD = 256, 257
POSITIONS = 512


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCABULARY, WIDTH, padding_idx=PAD)
        self.positions = nn.Embedding(POSITIONS, WIDTH)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, FEEDFORWARD, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, ids, padding):
        """ids: [batch, length] token ids; padding: [batch, length], True where padded."""
        x = self.tokens(ids) + self.positions(orochi.arange(ids.shape[1], device=ids.device))
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding)
        x = self.norm(x)
        keep = padding.logical_not().unsqueeze(-1).float()
        pooled = (x * keep).sum(dim=1) / keep.sum(dim=1)
        return pooled / pooled.pow(2).sum(dim=-1, keepdim=True).sqrt()


class SentenceEncoder:
    def __init__(self, context):
        # On the model's device, so that the weights (already there) are bound, not copied.
        self.encoder = Encoder().to(context.device)
        self.encoder.load_state_dict(context.weights)
        self.encoder.eval()
        self.max_tokens = int(context.config["max_tokens"])
        self.device = context.device  # the weights' device, where token ids must go too
        if not 1 < self.max_tokens <= POSITIONS:
            raise ValueError(f"max_tokens must be from 2 to {POSITIONS}, got {self.max_tokens}")

    def tokenize(self, raw: bytes) -> list:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(f"'text' must be UTF-8: {error}") from None
        return [CLS] + list(raw[:self.max_tokens - 1])

    def predict(self, inputs):
        rows = [self.tokenize(raw) for (raw,) in inputs["text"]]
        longest = max(len(row) for row in rows)
        ids = orochi.tensor([row + [PAD] * (longest - len(row)) for row in rows],
                            device=self.device)
        with orochi.no_grad():
            embedding = self.encoder(ids, ids == PAD)
        return {"embedding": embedding, "tokens": [[len(row)] for row in rows]}
