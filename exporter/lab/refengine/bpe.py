"""The reference engine's tokenizer: byte-level BPE trained at start-up, two implementations.

:func:`train` learns the merges from :mod:`exporter.lab.refengine.corpus` with the ``tokenizers``
package (Rust, a fraction of a second; nothing is downloaded). The trained model is then
used two ways, with identical token ids:

* :meth:`BpeTokenizer.encode` - the ``tokenizers`` encoder (Rust, "fast"): about a
  millisecond for a 512-token prompt, like HuggingFace's fast tokenizers;
* :meth:`BpeTokenizer.encode_slow` - the same ids computed in pure Python the way a "slow"
  tokenizer (HuggingFace ``use_fast=False``) computes them: a character-by-character trie
  scan that splits out special tokens, the pre-tokenization regex, the textbook GPT-2 merge
  loop (collect the adjacent pairs, take the lowest-ranked one, merge every occurrence,
  repeat) without a cache, and one dictionary lookup per token. It holds the GIL throughout
  and takes several times as long as the Rust path (pure-Python BPE is commonly measured
  5-10x slower). The ``tokenizer-slow`` injection puts it on the request path.

Pre-tokenization is a regular expression both engines evaluate the same way (ASCII letter
runs, single digits, runs of other symbols, whitespace), followed by the byte-to-character
map of GPT-2, so every input, in any script, tokenizes.
"""

from __future__ import annotations

import codecs
import functools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.lab.refengine import corpus

EOS = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 2048
# Letters (with one leading space), one digit at a time, other symbols, then whitespace (a
# run followed by a word keeps its last space for the word, as GPT-2's pattern does).
PATTERN = r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"
_SPLIT = re.compile(PATTERN)


_NEVER = float("inf")


def _pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


def _split_special(text: str, specials: Sequence[str]) -> list[tuple[str, bool]]:
    """Split ``text`` around special tokens with a character trie, one character at a time,
    as slow tokenizers split out their added tokens; returns (chunk, is_special) pairs."""
    trie: dict[str, Any] = {}
    for word in specials:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = word
    out: list[tuple[str, bool]] = []
    start = 0
    i = 0
    while i < len(text):
        node = trie
        j = i
        found = ""
        while j < len(text) and text[j] in node:
            node = node[text[j]]
            j += 1
            if "" in node:
                found = node[""]
                break
        if found:
            if start < i:
                out.append((text[start:i], False))
            out.append((found, True))
            i = start = i + len(found)
        else:
            i += 1
    if start < len(text):
        out.append((text[start:], False))
    return out


@functools.cache
def byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = list(keep)
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(keep, chars, strict=True)}


@functools.cache
def char_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_char().items()}


def _merge_pair(entry: Any) -> tuple[str, str]:
    """A merge as stored in tokenizer.json: ``"a b"`` (older) or ``["a", "b"]``."""
    if isinstance(entry, str):
        left, right = entry.split(" ", 1)
        return left, right
    left, right = entry
    return str(left), str(right)


@dataclass
class BpeTokenizer:
    """A trained byte-level BPE: the Rust encoder and the pure-Python one over its merges."""

    fast: Any  # tokenizers.Tokenizer (the package ships no type information mypy can use)
    vocab: dict[str, int]
    ranks: dict[tuple[str, str], int]
    eos_id: int
    _id_to_token: list[str] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        table = [""] * (max(self.vocab.values()) + 1)
        for token, index in self.vocab.items():
            table[index] = token
        self._id_to_token = table

    @property
    def vocab_size(self) -> int:
        return len(self._id_to_token)

    # --- encoding ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` by the Rust tokenizer."""
        return list(self.fast.encode(text, add_special_tokens=False).ids)

    def encode_slow(self, text: str) -> list[int]:
        """The same ids as :meth:`encode`, in pure Python, without any cache."""
        mapping = byte_to_char()
        tokens: list[str] = []
        for chunk, special in _split_special(text, (EOS,)):
            if special:
                tokens.append(chunk)
                continue
            for piece in _SPLIT.findall(chunk):
                tokens.extend(self._bpe("".join(mapping[b] for b in piece.encode("utf-8"))))
        return [self.vocab[token] for token in tokens]

    def _bpe(self, token: str) -> list[str]:
        """GPT-2's merge loop, as published, minus its cache."""
        ranks = self.ranks
        word = tuple(token)
        pairs = _pairs(word)
        if not pairs:
            return [token]
        while True:
            bigram = min(pairs, key=lambda pair: ranks.get(pair, _NEVER))
            if bigram not in ranks:
                break
            first, second = bigram
            merged: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    merged.extend(word[i:])
                    break
                merged.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
            if len(word) == 1:
                break
            pairs = _pairs(word)
        return list(word)

    # --- decoding ------------------------------------------------------------------------------
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (nothing for the end-of-text token)."""
        if token_id == self.eos_id or not 0 <= token_id < len(self._id_to_token):
            return b""
        back = char_to_byte()
        return bytes(back[c] for c in self._id_to_token[token_id])

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces; a character split across tokens is held
    back until its last byte arrives, so every piece is valid UTF-8."""

    def __init__(self, tokenizer: BpeTokenizer) -> None:
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, ids: Sequence[int]) -> str:
        data = b"".join(self._tokenizer.token_bytes(i) for i in ids)
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)


def train(vocab_size: int = DEFAULT_VOCAB_SIZE, texts: Sequence[str] | None = None) -> BpeTokenizer:
    """Learn byte-level BPE merges from the bundled corpus (or ``texts``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    fast = Tokenizer(models.BPE())
    fast.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    fast.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    fast.train_from_iterator(list(texts) if texts is not None else corpus.training_text(), trainer)
    model = json.loads(fast.to_str())["model"]
    vocab = {str(k): int(v) for k, v in model["vocab"].items()}
    ranks = {_merge_pair(m): rank for rank, m in enumerate(model["merges"])}
    return BpeTokenizer(fast=fast, vocab=vocab, ranks=ranks, eos_id=vocab[EOS])
