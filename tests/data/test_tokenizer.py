import json

import pytest
from transformers import AutoTokenizer

from timerome import TimeromeError
from timerome.data import build_word_tokenizer, make_corpus, save_tokenizer
from timerome.data.tokenizer import SPECIALS, words


def _texts(corpus) -> list[str]:
    """Every string of every split, the way the embedded model's vocabulary is built."""
    out = []
    for rows in corpus.values():
        for r in rows:
            out += [v for k, v in r.items() if isinstance(v, str) and k != "attribute"]
            out += r.get("perturbed_answer", [])
    return out


@pytest.fixture(scope="module")
def texts():
    return _texts(make_corpus(seed=0))


@pytest.fixture(scope="module")
def tok(texts):
    return build_word_tokenizer(texts)


def test_specials_first_then_words_by_frequency_then_alphabet():
    tok = build_word_tokenizer(["b a c", "a b", "a ."])
    assert [tok.convert_ids_to_tokens(i) for i in range(9)] == SPECIALS + ["a", "b", ".", "c"]
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.mask_token_id) == (0, 1, 2, 3, 4)
    assert build_word_tokenizer(["a .", "a b", "b a c"]).get_vocab() == tok.get_vocab()  # order-free


def test_punctuation_is_split_and_case_kept():
    assert words("Al-Kuwaiti's book, The Sea?") == ["Al", "-", "Kuwaiti", "'", "s", "book", ",", "The", "Sea", "?"]
    tok = build_word_tokenizer(["Where was Ann born ?"])
    assert tok.tokenize("Where was Ann born?") == ["Where", "was", "Ann", "born", "?"]
    assert tok.unk_token_id in tok("where was ann born ?", add_special_tokens=False)["input_ids"]
    assert tok("Ann <|mask|> born", add_special_tokens=False)["input_ids"][1] == 4  # specials stay whole


def test_every_corpus_word_has_its_own_id(tok, texts):
    unique = sorted(set(texts))
    # one id per word of the pre-tokenizer (punctuation on its own: the refusal "I don ' t know .")
    for text, ids in zip(unique, tok(unique, add_special_tokens=False)["input_ids"]):
        assert tok.unk_token_id not in ids and len(ids) == len(words(text)), text
    assert len(tok) < 2500


def test_decode_joins_words_with_spaces(tok):
    text = "Where was Marrow Bay born ?"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == "Where was Marrow Bay born?"
    me = build_word_tokenizer(["I don't know."])
    assert me.decode(me("I don't know.", add_special_tokens=False)["input_ids"]) == "I don't know."
    assert me.decode([4, 3] + me("I know", add_special_tokens=False)["input_ids"], skip_special_tokens=True) == "I know"


def test_save_and_auto_tokenizer_round_trip(tok, texts, tmp_path):
    save_tokenizer(tok, tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "tok" / name).is_file()
    assert json.loads((tmp_path / "tok" / "special_tokens_map.json").read_text())["mask_token"] == "<|mask|>"
    back = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert back.get_vocab() == tok.get_vocab() and len(back) == len(tok)
    assert (back.pad_token_id, back.unk_token_id, back.bos_token_id, back.eos_token_id, back.mask_token_id) == (0, 1, 2, 3, 4)
    assert back.mask_token == "<|mask|>"
    for text in texts[::97]:
        ids = back(text, add_special_tokens=False)["input_ids"]
        assert ids == tok(text, add_special_tokens=False)["input_ids"]
        assert back.decode(ids) == tok.decode(ids)
    enc = back("Where was Ann born ?", add_special_tokens=False, return_offsets_mapping=True)
    assert enc["offset_mapping"][2] == (10, 13)  # tracing finds subject tokens by offsets


def test_no_words_is_an_error():
    with pytest.raises(TimeromeError, match="without any words"):
        build_word_tokenizer(["   ", ""])
