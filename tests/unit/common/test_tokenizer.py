from tidal.common.tokenizer import ByteTokenizer


def test_round_trip_with_bos_and_unicode() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo>")
    assert ids[0] == tok.bos_id and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == "héllo>"


def test_specials_are_skipped_or_shown() -> None:
    tok = ByteTokenizer()
    ids = [*tok.encode("ab"), tok.eos_id]
    assert tok.decode(ids) == "ab"
    assert tok.decode(ids, skip_special=False) == "<bos>ab<eos>"
