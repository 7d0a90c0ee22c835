"""The reference tokenizer: trained at start-up, the Rust and pure-Python paths agree."""

from __future__ import annotations

import pytest
from support.paths import ROOT

from exporter.lab.refengine import corpus
from exporter.lab.refengine.bpe import EOS, BpeTokenizer, train

PROBE = (ROOT / "exporter" / "data" / "tokenizer-probe.txt").read_text(encoding="utf-8")
TEXTS = [
    PROBE,
    "Hi",
    "",
    " leading and  double  spaces, tabs\tand\nnew lines\n\n",
    "café, naïve, Straße, 日本語, emoji 🙂 and numbers 2024-05-17 14:30 99.9%",
    f"two documents{EOS}joined",
    *corpus.training_text()[:3],
]


@pytest.fixture(scope="module")
def tok() -> BpeTokenizer:
    return train()


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_slow_path_gives_the_fast_paths_ids(tok: BpeTokenizer, text: str) -> None:
    assert tok.encode_slow(text) == tok.encode(text)


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_decode_round_trips(tok: BpeTokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text.replace(EOS, "")


def test_vocabulary_and_special_token(tok: BpeTokenizer) -> None:
    assert 1000 < tok.vocab_size <= 2048
    assert tok.encode(EOS) == [tok.eos_id]
    assert tok.token_bytes(tok.eos_id) == b""
    # The probe prompt is several hundred tokens, as the sidecar expects (~512).
    assert 400 < len(tok.encode(PROBE)) < 1200


def test_training_is_deterministic() -> None:
    assert train().vocab == train().vocab


def test_incremental_detokenizer_holds_split_characters(tok: BpeTokenizer) -> None:
    text = "日本語 🙂 café"
    ids = tok.encode(text)
    detok = tok.detokenizer()
    pieces = [detok.push([i]) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
