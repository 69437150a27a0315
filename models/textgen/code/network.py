"""The text generator's network: a small GPT over bytes (pre-norm transformer decoder, learned
positions), with a key/value cache for generation.

The same code trains under PyTorch (build.py imports it with `orochi` standing for `torch`) and
serves under Orochi, so the trained state_dict loads unchanged. `forward` recomputes a whole
sequence (training, and the tests' reference); `prefill` and `decode` are generation's two
halves, which keep every layer's keys and values in a KeyValueCache instead of recomputing them.
"""

import math

import orochi
import orochi.nn as nn
import orochi.nn.functional as F

BOUNDARY = 256  # between documents: the first token of every prompt, and the end of a text
VOCABULARY = 257  # the 256 byte values, then BOUNDARY
WIDTH = 64
HEADS = 4
HEAD_WIDTH = WIDTH // HEADS
LAYERS = 3
CONTEXT = 256  # positions: the prompt's tokens and the generated ones together


class Block(nn.Module):
    """Pre-norm self-attention, then a GELU feed-forward layer, each around a residual."""

    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def heads(self, x):
        """x [batch, length, WIDTH] -> queries, keys, values, each [batch, HEADS, length, HEAD_WIDTH]."""
        batch, length, _ = x.shape
        return tuple(part.reshape(batch, length, HEADS, HEAD_WIDTH).transpose(1, 2)
                     for part in self.qkv(self.norm1(x)).split(WIDTH, dim=-1))

    def mix(self, x, queries, keys, values, blocked):
        """The block's output for residual x [batch, length, WIDTH] given its queries and the keys
        and values they attend to ([batch, HEADS, keys, HEAD_WIDTH]); `blocked` (bool, broadcast
        to [batch, HEADS, length, keys]) is True where a query must not see a key."""
        batch, length, _ = x.shape
        scores = (queries @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(HEAD_WIDTH))
        weights = scores.masked_fill(blocked, float("-inf")).softmax(-1)
        attended = (weights @ values).transpose(1, 2).reshape(batch, length, WIDTH)
        x = x + self.proj(attended)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class LanguageModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCABULARY, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCABULARY, bias=False)

    def embed(self, ids, positions):
        return self.tokens(ids) + self.positions(positions)

    def forward(self, ids):
        """ids [batch, length] from position 0 -> next-token logits [batch, length, VOCABULARY],
        each position seeing itself and those before it; nothing is cached."""
        positions = orochi.arange(ids.shape[1], device=ids.device)
        x = self.embed(ids, positions)
        blocked = positions.unsqueeze(0) > positions.unsqueeze(1)
        for block in self.blocks:
            queries, keys, values = block.heads(x)
            x = block.mix(x, queries, keys, values, blocked)
        return self.head(self.norm(x))

    def prefill(self, cache, slot: int, ids):
        """Runs a prompt (ids [length]) from position 0, keeping its keys and values in `slot`
        of the cache; returns the logits [VOCABULARY] of the token after it."""
        length = ids.shape[0]
        positions = orochi.arange(length, device=ids.device)
        x = self.embed(ids, positions).unsqueeze(0)
        blocked = positions.unsqueeze(0) > positions.unsqueeze(1)
        for layer, block in enumerate(self.blocks):
            queries, keys, values = block.heads(x)
            cache.keys[layer][slot, :, :length] = keys[0]
            cache.values[layer][slot, :, :length] = values[0]
            x = block.mix(x, queries, keys, values, blocked)
        return self.head(self.norm(x[0, -1]))

    def decode(self, cache, tokens: list, positions: list, slots: list):
        """One token for each of several sequences at once: sequence i's token tokens[i] at
        position positions[i], whose earlier keys and values are in cache slot slots[i].
        Appends the new keys and values and returns the next-token logits [len(tokens),
        VOCABULARY].

        Attention reads the cache's slots 0..max(slots) as one view, without copying them out:
        rows of slots outside this call attend to their position 0 only, and their results are
        dropped. The cache hands out its lowest free slot first, so that range stays tight."""
        device = cache.device
        count, rows, span = len(tokens), max(slots) + 1, max(positions) + 1
        dense = slots == list(range(rows))  # the common case: rows are the sequences, in order
        row_positions = list(positions) if dense else [0] * rows
        if not dense:
            for slot, position in zip(slots, positions):
                row_positions[slot] = position
        slot_index = orochi.tensor(slots, device=device)
        position_index = orochi.tensor(positions, device=device)
        x = self.embed(orochi.tensor(tokens, device=device), position_index)  # [count, WIDTH]
        blocked = (orochi.arange(span, device=device).unsqueeze(0)
                   > orochi.tensor(row_positions, device=device).unsqueeze(1)).reshape(
                       rows, 1, 1, span)
        for layer, (block, weights) in enumerate(zip(self.blocks, self._decoding_weights())):
            qkv, qkv_bias, proj, proj_bias, up, up_bias, down, down_bias = weights
            queries, keys, values = (part.reshape(count, HEADS, HEAD_WIDTH) for part in (
                block.norm1(x) @ qkv + qkv_bias).split(WIDTH, dim=-1))
            cache.keys[layer][slot_index, :, position_index] = keys
            cache.values[layer][slot_index, :, position_index] = values
            queries = queries.unsqueeze(2)
            if not dense:
                scattered = orochi.zeros(rows, HEADS, 1, HEAD_WIDTH, device=device)
                scattered[slot_index] = queries
                queries = scattered
            scores = (queries @ cache.keys[layer][:rows, :, :span].transpose(-1, -2)) * (
                1.0 / math.sqrt(HEAD_WIDTH))
            weights = scores.masked_fill(blocked, float("-inf")).softmax(-1)
            attended = weights @ cache.values[layer][:rows, :, :span]
            if not dense:
                attended = attended[slot_index]
            x = x + attended.reshape(count, WIDTH) @ proj + proj_bias
            x = x + F.gelu(block.norm2(x) @ up + up_bias) @ down + down_bias
        return self.norm(x) @ self._transposed_head

    def _decoding_weights(self):
        """Each block's linear weights transposed into contiguous [in, out] copies (and their
        biases), made once: with a few rows, `x @ w_t` is 2-2.5x faster in Orochi's engine than
        `linear(x, w)` on the shared [out, in] weight, which is most of a decode step's time."""
        if getattr(self, "_transposed", None) is None:
            def transposed(linear):
                return linear.weight.t().contiguous(), linear.bias
            self._transposed = [
                (*transposed(block.qkv), *transposed(block.proj), *transposed(block.up),
                 *transposed(block.down)) for block in self.blocks]
            self._transposed_head = self.head.weight.t().contiguous()
        return self._transposed


class KeyValueCache:
    """Every layer's keys and values for a number of sequences, one slot each:
    [slots, HEADS, CONTEXT, HEAD_WIDTH] per layer. Slots are handed out lowest first and the
    cache doubles when all are taken (a sequence's slot never moves while it lives)."""

    def __init__(self, device, slots: int = 4):
        self.device = device
        self.keys = [self._empty(slots) for _ in range(LAYERS)]
        self.values = [self._empty(slots) for _ in range(LAYERS)]
        self.free = set(range(slots))

    def _empty(self, slots):
        return orochi.zeros(slots, HEADS, CONTEXT, HEAD_WIDTH, device=self.device)

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0]

    def take(self) -> int:
        if not self.free:
            grown = self.slots
            self.keys = [orochi.cat([kept, self._empty(grown)]) for kept in self.keys]
            self.values = [orochi.cat([kept, self._empty(grown)]) for kept in self.values]
            self.free = set(range(grown, 2 * grown))
        slot = min(self.free)
        self.free.remove(slot)
        return slot

    def give_back(self, slot: int):
        self.free.add(slot)

    @property
    def live(self) -> int:
        return self.slots - len(self.free)
