"""`musicrel bench serve`: rounds alternate which mode runs first; every phase decodes the same music."""

from __future__ import annotations

from musicrel.bench.serve import _in_process, _motif, _side_by_side


def test_side_by_side_alternates_order_and_pairs_results():
    calls: list[str] = []

    def phase(mode: str):
        def run() -> tuple[str, int]:
            calls.append(mode)
            return mode, len(calls)

        return run

    pairs = _side_by_side(4, phase("serial"), phase("concurrent"))
    assert calls == ["serial", "concurrent", "concurrent", "serial"] * 2
    # Each pair is (serial, concurrent) whatever the order they ran in; the call index shows that order.
    assert pairs == [
        (("serial", 1), ("concurrent", 2)),
        (("serial", 4), ("concurrent", 3)),
        (("serial", 5), ("concurrent", 6)),
        (("serial", 8), ("concurrent", 7)),
    ]


def test_in_process_rounds_decode_the_same_tokens(tiny_checkpoint):
    pairs = _in_process(tiny_checkpoint, _motif(), [0, 1, 2], 0.5, 2, primer_cache=4, rounds=3)
    assert len(pairs) == 3
    tokens = {mode[1] for pair in pairs for mode in pair}
    assert len(tokens) == 1 and tokens.pop() > 0  # same seeds -> same token counts, one at a time or batched
    assert all(wall > 0 for pair in pairs for wall, _ in pair)
