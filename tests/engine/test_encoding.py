"""engine/encoding.py: a fact's tokens (subject positions, answers, target) and the MDLM's answer masking."""

import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.data.facts import Fact
from timerome.engine.encoding import collate, encode_fact, fact_id, mask_answers


@pytest.fixture(scope="module")
def bb():
    return load_backbone()


@pytest.fixture(scope="module")
def fact(bb):
    from timerome.data.facts import facts_from_rows
    from timerome.data.tofu import load_split

    return facts_from_rows(load_split("forget01", "embedded")[:1])[0][0]


def test_the_subject_positions_cover_the_subject_tokens(bb, fact):
    it = encode_fact(bb, fact, target="I don't know.")
    pieces = bb.decode(it.prompt_ids[it.subject_pos].tolist())
    assert pieces.replace(" ", "") == fact.subject.replace(" ", "")
    assert bb.decode(it.object_ids.tolist()).replace(" ", "") == fact.object.replace(" ", "")
    assert it.target_ids is not None and bb.decode(it.target_ids.tolist()).strip() == "I don't know."
    # positions are contiguous and inside the prompt
    pos = it.subject_pos.tolist()
    assert pos == list(range(pos[0], pos[-1] + 1)) and pos[-1] < len(it.prompt_ids)


def test_a_subject_missing_from_its_prompt_is_refused(bb, fact):
    with pytest.raises(TimeromeError, match="is not in the prompt"):
        Fact("Nobody Here", fact.prompt, fact.object, fact_id="x")     # a Fact refuses it when made
    bad = {"subject": "Nobody Here", "prompt": fact.prompt, "object": fact.object, "fact_id": "x"}
    with pytest.raises(TimeromeError, match="does not occur in its prompt"):
        encode_fact(bb, bad)                                             # and so does a row given as a dict


def test_fact_ids_are_the_own_id_else_a_stable_hash():
    assert fact_id(Fact("a", "q a", "o", fact_id="mine")) == "mine"
    h = fact_id({"subject": "a", "prompt": "q a", "object": "o"})
    assert h == fact_id({"subject": "a", "prompt": "q a", "object": "o"}) and len(h) == 12
    assert h != fact_id({"subject": "a", "prompt": "q a", "object": "p"})


def test_masking_touches_answers_only_and_is_seeded():
    ids, ans, att = collate([([1, 2, 3], [4, 5]), ([6], [7, 8, 9, 10])], pad=0, device="cpu")
    assert ans.sum().item() == 6 and att.sum().item() == 10
    noisy, masked, t = mask_answers(ids, ans, 99, torch.Generator().manual_seed(3), fully_masked=1)
    assert not (masked & ~ans).any()                       # never a prompt or pad token
    assert torch.equal(noisy[masked], torch.full((int(masked.sum()),), 99))
    assert masked[0, 3:5].all() and t[0] == 1.0            # fully_masked rows: t = 1
    again = mask_answers(ids, ans, 99, torch.Generator().manual_seed(3), fully_masked=1)
    assert torch.equal(again[0], noisy)                    # the same seed, the same masks


def test_mask_answers_draws_on_the_generators_device():
    """A CPU generator gives the same masks for ids on another device (here "meta", which holds no
    numbers: the draws happen on the CPU and only the masks move), so a seed means the same masks
    on a GPU as on the CPU."""
    ids, ans, _ = collate([([1, 2, 3], [4, 5]), ([6], [7, 8, 9, 10])], pad=0, device="cpu")
    noisy, masked, t = mask_answers(ids.to("meta"), ans.to("meta"), 99, torch.Generator().manual_seed(3))
    assert noisy.device.type == masked.device.type == t.device.type == "meta"
    g = torch.Generator().manual_seed(3)
    mask_answers(ids.to("meta"), ans.to("meta"), 99, g)
    cpu = torch.Generator().manual_seed(3)
    mask_answers(ids, ans, 99, cpu)
    assert torch.equal(g.get_state(), cpu.get_state())  # the same draws were taken from the generator


def test_a_byte_level_tokenizer_is_known_by_its_pre_tokenizer_not_a_vocabulary_sample():
    """uses_leading_space read "Ġ" in the vocabulary's first 2,000 entries, whose order is the Rust
    map's: a byte-level BPE trained on text without spaces (few "Ġ" entries) gave True or False call
    to call (stop 62's training audit)."""
    from types import SimpleNamespace

    from tokenizers import pre_tokenizers

    from timerome.engine.encoding import uses_leading_space

    vocab = {f"x{i}": i for i in range(5000)} | {"Ġ": 5000}  # the one "Ġ" entry after the first 2,000

    def tokenizer(pre):
        return SimpleNamespace(is_fast=True, get_vocab=lambda: vocab, backend_tokenizer=SimpleNamespace(pre_tokenizer=pre))

    assert uses_leading_space(SimpleNamespace(tokenizer=tokenizer(pre_tokenizers.ByteLevel(add_prefix_space=False))))
    assert not uses_leading_space(SimpleNamespace(tokenizer=tokenizer(pre_tokenizers.Metaspace())))
    assert not uses_leading_space(SimpleNamespace(tokenizer=tokenizer(pre_tokenizers.WhitespaceSplit())))
    assert not uses_leading_space(SimpleNamespace(tokenizer=tokenizer(None)))
