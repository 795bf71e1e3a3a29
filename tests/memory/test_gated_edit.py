"""memory/gated_edit.py: Eq. single, alpha * clip(<u, h> / |u|^2, 0, g_max) * d on one fact's key."""

import pytest
import torch

from timerome import TimeromeError, load_backbone
from timerome.memory.gated_edit import GatedEdit, gated_delta


def test_the_gate_is_the_clipped_projection_on_the_key():
    u = torch.tensor([2.0, 0.0], dtype=torch.float64)
    d = torch.tensor([0.0, 1.0], dtype=torch.float64)
    h = torch.tensor([[2.0, 5.0], [1.0, 0.0], [-3.0, 1.0], [8.0, 0.0]], dtype=torch.float64)
    out = gated_delta(h, u, d, alpha=2.0, g_max=1.5, eps=0.0)
    # gates: 1, 0.5, 0 (points away: clipped at 0), 4 -> 1.5 (clipped at g_max)
    torch.testing.assert_close(out[:, 1], torch.tensor([2.0, 1.0, 0.0, 3.0], dtype=torch.float64))
    assert torch.equal(out[:, 0], torch.zeros(4, dtype=torch.float64))


def test_applied_adds_the_delta_at_the_coordinate_only_inside_the_block():
    bb = load_backbone()
    ids = torch.tensor([bb.encode("where was the author born ?")])
    u = torch.randn(bb.hidden_size, generator=torch.Generator().manual_seed(0))
    edit = GatedEdit(u, torch.randn(bb.hidden_size, generator=torch.Generator().manual_seed(1)), (1, "resid"))
    with torch.no_grad():
        plain = bb.logits(ids)
        with edit.applied(bb):
            edited = bb.logits(ids)
        assert torch.equal(bb.logits(ids), plain) and not torch.equal(edited, plain)
    with pytest.raises(TimeromeError):
        GatedEdit(u, u[:3], (1, "resid"))
