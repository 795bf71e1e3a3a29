"""A GGUF file's conversion as the user sees it: one line of ours on stderr, none of transformers' bars
(its GGUF reader opens a tqdm that ignores transformers' progress-bar switch) and nothing else hidden,
and a reader's failure as one line naming the file. transformers' readers are replaced here by
stand-ins that write what the real ones write, so this runs in a second;
tests/backbones/test_real_model.py converts a real file."""

from __future__ import annotations

import sys

import pytest

from timerome.errors import TimeromeError

pytest.importorskip("gguf", reason="the test extra installs gguf; without it the conversion is refused first")


def _noisy_reader(fail: bool):
    def from_pretrained(*args, **kwargs):
        from transformers import modeling_gguf_pytorch_utils as reader

        for _ in reader.tqdm(range(272), desc="Converting and de-quantizing GGUF tensors..."):  # as the real one
            pass
        sys.stderr.write("a warning the user should see\n")
        if fail:
            raise ValueError("GGUF model with architecture bogus is not supported yet.")
        raise AssertionError("unreachable in this test")
    return from_pretrained


def test_a_conversion_says_one_line_and_keeps_transformers_bar_off_stderr(tmp_path, monkeypatch, capfd):
    import transformers

    from timerome.backbones.gguf import gguf_folder

    monkeypatch.setenv("TIMEROME_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", _noisy_reader(fail=True))
    f = tmp_path / "tiny.gguf"
    f.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(TimeromeError, match=r"could not read tiny\.gguf as a causal LM \(ValueError: GGUF model"):
        gguf_folder(f)
    err = capfd.readouterr().err
    assert "note: converting tiny.gguf to a checkpoint in the cache" in err
    assert "Converting and de-quantizing" not in err, err
    assert "a warning the user should see" in err  # only the bar is kept off
    # nothing half-made or locked is left for the next try
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == []
    from transformers import modeling_gguf_pytorch_utils as reader

    for _ in reader.tqdm(range(3), desc="after"):  # the module's own bar again
        pass
    assert "after" in capfd.readouterr().err
