"""The layout of a batch's texts and one question's tails: each query sees exactly its own
prompt's positions 0 .. q, in slot order (exact tables, no model)."""

from __future__ import annotations

import numpy as np

from mlxbatch.engine.layout import RowLayout
from mlxbatch.engine.question_layout import TailLayout, common_part, text_and_tails

PREFIX = [1, 2, 3]


def layouts():
    # text r: its whole prompt for one question is prefix[:shared] + common + tail
    prompts = [[1, 2, 3, 10, 11, 12, 20], [1, 2, 7, 13, 21, 22, 23], [1, 2, 3, 14, 24]]
    commons = [[1, 2, 3, 10, 11, 12], [1, 2, 7, 13], [1, 2, 3, 14]]
    text = RowLayout.build(commons, PREFIX, 0)
    tails = tuple(tuple(p[len(c) :]) for p, c in zip(prompts, commons))
    return prompts, TailLayout(text, tails)


def visible_positions(mask_row: np.ndarray, slot_positions: np.ndarray) -> list[int]:
    return sorted(slot_positions[np.flatnonzero(mask_row)].tolist())


def slot_positions(lay: TailLayout, r: int) -> np.ndarray:
    """The rotary position each cache slot holds for row r (-1: padding or another's)."""
    t = lay.text
    pos = np.full(lay.capacity, -1)
    pos[: t.shared[r]] = np.arange(t.shared[r])
    n, m = t.lengths[r], lay.tail_lengths[r]
    pos[t.prefix_width : t.prefix_width + n] = t.shared[r] + np.arange(n)
    pos[lay.start : lay.start + m] = t.shared[r] + n + np.arange(m)
    return pos


def test_each_tail_and_label_query_sees_its_prompt_up_to_itself():
    prompts, lay = layouts()
    teacher = np.array([[30, 31], [32, 0]])  # two labels: 3 tokens, then 2
    lab = lay.repeated(teacher)
    for rows, n_labels in ((lay, 1), (lab, 2)):
        mask = rows.mask()
        assert mask.shape == (3 * n_labels, 1, rows.width, rows.start + rows.width)
        for r in range(rows.batch):
            prompt = prompts[r // n_labels]
            pos, first = slot_positions(rows, r), rows.positions()[r]
            assert first == len(prompt) - lay.tail_lengths[r // n_labels]
            for i in range(rows.tail_lengths[r]):
                assert visible_positions(mask[r, 0, i], pos) == list(range(first + i + 1))
    assert lab.tokens()[2].tolist()[:5] == [21, 22, 23, 30, 31]  # text 1, label 0
    assert lab.tokens()[3].tolist()[:5] == [21, 22, 23, 32, 0]  # text 1, label 1
    assert lay.label_inputs(2, 2).tolist()[2:4] == [[2, 3, 4], [2, 3, 4]]
    assert lay.last().tolist() == [0, 2, 0]


def test_the_common_part_leaves_each_prompt_a_token():
    assert common_part([[1, 2, 3], [1, 2, 4]]) == 2
    assert common_part([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_part([[1, 2], [1, 2, 3]]) == 1
    assert text_and_tails([[5, 6, 7], [5, 8]]) == ([5], [[6, 7], [8]])
