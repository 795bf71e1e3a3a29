"""Performance floors: the best batched throughput, and the row-blocks the causal trace must compute."""

import pytest
import torch
from conftest import live_steps

from timerome import load_backbone
from timerome.backbones.tiny import make_tiny_checkpoint
from timerome.engine.hooks import Hooks
from timerome.engine.throughput import (Throughput, best_throughput, block_calls, floor_by_length, floor_seconds,
                                        head_throughput, retimed, timed_block_calls)
from timerome.tracing.causal_trace import trace

FACTS = [
    dict(fact_id="born", subject="the author", prompt="where was the author born ?", object="city of books"),
    dict(fact_id="genre", subject="her first", prompt="what was her first genre ?", object="mystery poetry"),
]
K, N = 4, 2


@pytest.fixture(scope="module")
def bb(tmp_path_factory):
    bb = load_backbone(make_tiny_checkpoint("timerome", tmp_path_factory.mktemp("tiny") / "m", layers=3, hidden=32))
    with torch.no_grad():  # sharpen, so that patch runs diverge and rows stop coinciding (test_tracing does too)
        for name, p in bb.model.named_parameters():
            if "norm" not in name:
                p.mul_(5.0)
    return bb


def test_best_throughput_is_the_best_batch_size(bb):
    r = best_throughput(bb, 10, max_rows=16, repeats=1)
    assert set(r.table) <= {1, 2, 4, 8, 16} and 1 in r.table
    assert r.row_blocks_per_s == max(r.table.values()) and r.table[r.rows] == r.row_blocks_per_s
    assert r.token_blocks_per_s == pytest.approx(10 * r.row_blocks_per_s)


def test_best_throughput_times_what_it_reports():
    """A fake backbone whose forward of b rows takes (0.01 + 0.001 b) s of a fake clock: the rate
    is b * blocks / time, best at the largest batch, and the doubling stops at max_rows; `retimed`
    times the best batch size again."""
    now = [0.0]

    class Fake:
        vocab_size, n_layers, device = 10, 4, torch.device("cpu")

        def logits(self, ids):
            now[0] += 0.01 + 0.001 * ids.shape[0]

    r = best_throughput(Fake(), 5, max_rows=64, repeats=2, clock=lambda: now[0])
    assert r.rows == 64
    for b, rate in r.table.items():
        assert rate == pytest.approx(b * 4 / (0.01 + 0.001 * b))
    # timed again at its batch size on a machine now twice as slow: half the rate, the same table
    Fake.logits = lambda self, ids: now.__setitem__(0, now[0] + 2 * (0.01 + 0.001 * ids.shape[0]))
    again = retimed(Fake(), r, repeats=3, clock=lambda: now[0])
    assert (again.length, again.rows, again.table) == (5, 64, r.table)
    assert again.row_blocks_per_s == pytest.approx(r.row_blocks_per_s / 2)
    # a machine on which 64 rows now leave the cache (3x the time): the next best size of the table wins
    Fake.logits = lambda self, ids: now.__setitem__(0, now[0] + (3 if ids.shape[0] == 64 else 1) * (0.01 + 0.001 * ids.shape[0]))
    moved = retimed(Fake(), r, repeats=1, clock=lambda: now[0])
    assert moved.rows == 32 and moved.row_blocks_per_s == pytest.approx(32 * 4 / (0.01 + 0.032))
    assert retimed(Fake(), r, repeats=1, clock=lambda: now[0], candidates=1).rows == 64  # the search's best alone


def test_the_doubling_goes_on_past_a_rate_within_noise_of_the_best():
    """Two doublings in a row no better than the best stop the search only when they fall below 0.9 x
    the best: a plateau within the noise (here 97 % of the best) is searched past."""
    now = [0.0]
    per_row = {1: 1.0, 2: 0.5, 4: 0.25, 8: 0.26, 16: 0.26, 32: 0.2, 64: 0.5, 128: 0.5, 256: 0.1}

    class Fake:
        vocab_size, n_layers, device = 10, 1, torch.device("cpu")

        def logits(self, ids):
            now[0] += per_row[ids.shape[0]] * ids.shape[0]

    r = best_throughput(Fake(), 5, max_rows=256, repeats=1, clock=lambda: now[0], max_seconds=1e9)
    assert r.rows == 32 and set(r.table) == {1, 2, 4, 8, 16, 32, 64, 128}  # stopped after 64, 128 fell to 0.4x
    # a size whose first (warm-up) forward takes more than max_seconds ends the search untimed again
    calls = []
    Fake.logits = lambda self, ids: calls.append(ids.shape[0]) or now.__setitem__(0, now[0] + per_row[ids.shape[0]] * ids.shape[0])
    r = best_throughput(Fake(), 5, max_rows=256, repeats=3, clock=lambda: now[0], max_seconds=20)
    assert calls.count(64) == 1 and 128 not in calls and r.table[64] == pytest.approx(64 / 32)
    assert calls.count(32) == 4  # a warm-up and 3 timed forwards


def test_floor_charges_every_token_block_at_the_best_rate():
    rates = [Throughput(length=10, rows=8, row_blocks_per_s=100.0), Throughput(length=20, rows=4, row_blocks_per_s=60.0)]
    assert floor_seconds(token_blocks=2400, rates=rates) == pytest.approx(2400 / 1200)  # 60 x 20 beats 100 x 10


def test_floor_by_length_charges_each_length_its_own_rate():
    rates = [Throughput(length=10, rows=8, row_blocks_per_s=100.0), Throughput(length=20, rows=4, row_blocks_per_s=60.0)]
    assert floor_by_length({"10": 300, "20": 120}, rates) == pytest.approx(300 / 100 + 120 / 60)
    # never below the strict floor, which charges every token-block the best token rate
    assert floor_by_length({"10": 300, "20": 120}, rates) >= floor_seconds(token_blocks=300 * 10 + 120 * 20, rates=rates)
    with pytest.raises(ValueError, match="length"):
        floor_by_length({"15": 1}, rates)


def test_block_calls_are_timed_at_their_own_shapes(bb):
    """Each (L, B) one blocks-only forward's time (a clock that counts its reads: every timed call lasts 1),
    1 / n_layers of it per block call."""
    ticks = iter(range(10 ** 6))
    got = timed_block_calls(bb, {"6x3": 5, "9x2": 1}, clock=lambda: next(ticks))
    assert got == pytest.approx((5 + 1) / bb.n_layers)
    real = timed_block_calls(bb, {"6x3": 5, "9x2": 1})  # the real clock: positive and finite
    assert 0 < real < 60


def test_block_calls_of_a_deep_model_are_timed_on_its_first_blocks(bb):
    """blocks=k: each shape's forward is cut after block k - 1 (the blocks above never run), 1 / k of it
    per call: a deep model's hundreds of shapes no longer cost a forward through every block each."""
    assert bb.n_layers >= 3
    ticks = iter(range(10 ** 6))
    ran = []
    with Hooks(bb, edit={(l, "resid"): (lambda h, _s, l=l: ran.append(l)) for l in range(bb.n_layers)}):
        got = timed_block_calls(bb, {"6x3": 5, "9x2": 1}, clock=lambda: next(ticks), blocks=2)
    assert got == pytest.approx((5 + 1) / 2)
    assert set(ran) == {0, 1}


def test_block_batches_count_every_block_call(bb):
    """stats["block_batches"] adds up to the row-blocks computed, at the facts' own lengths, and a
    smaller batch_size runs smaller batches."""
    for batch_size in (256, 7):
        st = trace(bb, FACTS, steps=K, n_samples=N, progress=False, batch_size=batch_size).stats
        calls = {(length, rows): n for length, rows, n in block_calls(st["block_batches"])}
        assert len(calls) == len(st["block_batches"])
        assert sum(rows * n for (_, rows), n in calls.items()) == st["block_rows"]
        assert {length for length, _ in calls} == {int(L) for L in st["min_block_rows_by_length"]}
        assert sum(calls.values()) == st["forwards"] * bb.n_layers
        if batch_size == 7:
            assert max(rows for _, rows in calls) <= 7 + 2  # at most batch_size rows, + a few packed rows


def test_trace_floor_is_a_property_of_the_definition_not_of_the_engine(bb):
    """min_block_rows is the same whatever the engine's switches, and no variant computes less."""
    runs = [trace(bb, FACTS, steps=K, n_samples=N, progress=False, share_rows=s, reuse_layers=r, pack_splices=p)
            for s in (True, False) for r in (True, False) for p in (True, False)]
    need = {r.stats["min_block_rows"] for r in runs}
    assert len(need) == 1
    need = need.pop()
    assert all(r.stats["block_rows"] >= need for r in runs)
    # below the literal count (every run of the definition through every block) ...
    C, n = 3 * bb.n_layers, bb.n_layers
    literal = len(FACTS) * n * ((K + 1) * (1 + N) + C * N * sum(K - k + 1 for k in range(K)))
    assert need < literal
    # ... and above what it keeps even when every run coincides with its corrupted run: clean and
    # corrupted rows through every block at every step its fact still reads, each splice through
    # the blocks above its layer (and nothing at all once every answer token is committed)
    above = sum(n - l - 1 for m in ("resid", "attn", "mlp") for l in range(n))
    live = [live_steps(bb, f, K) for f in FACTS]
    assert need >= sum(s * (1 + N) * n + min(s, K) * N * above for s in live)
    assert need < len(FACTS) * ((K + 1) * (1 + N) * n + K * N * above)  # the dead steps cost nothing
    assert runs[0].stats["min_block_tokens"] > need
    by_length = runs[0].stats["min_block_rows_by_length"]
    assert sum(by_length.values()) == need and len(by_length) == 2  # the two facts differ in length
    assert sum(int(n) * v for n, v in by_length.items()) == runs[0].stats["min_block_tokens"]


def test_blocks_only_and_head_rates(bb):
    """The floor's two rates: forwards cut after the last block, and the read-out alone."""
    blocks = best_throughput(bb, 10, max_rows=8, repeats=1, blocks_only=True)
    assert blocks.row_blocks_per_s == max(blocks.table.values()) > 0
    assert head_throughput(bb, max_positions=64, repeats=1) > 0


def test_head_rate_with_its_log_normaliser_times_both_ways_and_keeps_the_faster(bb, monkeypatch):
    """log_normaliser=True times the read-out followed by a float32 normaliser over the vocabulary
    (what reading a log-probability must compute), both as logsumexp and as log_softmax, and the
    rate is the faster way's: on a fake clock where log_softmax costs half, its rate is the answer,
    and where it costs double, logsumexp's."""
    seen, now, cost = [], [0.0], {}
    real = {name: getattr(torch.Tensor, name) for name in ("logsumexp", "log_softmax")}

    def spy(name):
        def fn(self, *a, **k):
            seen.append((name, tuple(self.shape), self.dtype))
            now[0] += cost[name]
            return real[name](self, *a, **k)

        return fn

    for name in real:
        monkeypatch.setattr(torch.Tensor, name, spy(name))
    clock = lambda: now[0]  # noqa: E731 - the fake clock moves only inside the spies
    cost.update(logsumexp=1.0, log_softmax=1.0)
    assert head_throughput(bb, max_positions=32, repeats=1, clock=clock) > 0  # the logits alone: no normaliser
    assert not seen
    cost.update(logsumexp=1.0, log_softmax=0.5)
    assert head_throughput(bb, max_positions=32, repeats=1, log_normaliser=True, clock=clock) == 32 / 0.5
    assert {(n, s) for n, s, _ in seen} == {(n, (m, bb.vocab_size)) for n in real for m in (16, 32)}
    assert {d for _, _, d in seen} == {torch.float32}
    cost.update(logsumexp=0.25, log_softmax=0.5)
    assert head_throughput(bb, max_positions=32, repeats=1, log_normaliser=True, clock=clock) == 32 / 0.25
