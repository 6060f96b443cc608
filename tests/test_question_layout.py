"""The layout of a batch's texts and one question's tails: each query sees exactly its own
prompt's positions 0 .. q, in slot order (exact tables, no model)."""

from __future__ import annotations

import numpy as np

from mlxbatch.engine.layout import RowLayout
from mlxbatch.engine.question_layout import QuestionRows, TailLayout, common_part, text_and_tails

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


def test_a_texts_tails_share_its_row_with_exact_tokens_positions_and_mask():
    """Two texts behind a 2-token prefix (the second shares one prefix slot): each row is its
    text's tokens then its tails, a tail's positions restart at its text's end, and a tail
    token sees the prefix, the text and its own tail only."""
    texts = [([1, 2, 5], [[6, 7], [8]]), ([1, 9, 5, 5], [[6], [8]])]
    rows = QuestionRows.build(texts, [1, 2])
    assert rows.tokens().tolist() == [[5, 6, 7, 8, 0], [9, 5, 5, 6, 8]]
    assert rows.positions().tolist() == [[2, 3, 4, 3, 3], [1, 2, 3, 4, 4]]
    assert rows.last().tolist() == [[2, 3], [3, 4]]
    assert rows.row_lengths.tolist() == [4, 5] and rows.capacity == 7
    assert rows.mask()[:, 0].astype(int).tolist() == [
        [
            [1, 1, 1, 0, 0, 0, 0],  # the text's token
            [1, 1, 1, 1, 0, 0, 0],  # question 0's tail
            [1, 1, 1, 1, 1, 0, 0],
            [1, 1, 1, 0, 0, 1, 0],  # question 1's tail: not question 0's
            [1, 1, 1, 0, 0, 0, 0],  # padding: the text
        ],
        [
            [1, 0, 1, 0, 0, 0, 0],
            [1, 0, 1, 1, 0, 0, 0],
            [1, 0, 1, 1, 1, 0, 0],
            [1, 0, 1, 1, 1, 1, 0],
            [1, 0, 1, 1, 1, 0, 1],
        ],
    ]


def test_each_tail_token_sees_exactly_its_whole_prompt_in_position_order():
    """Three questions of three texts, tails of different lengths: the tokens a tail token
    sees, ordered by position, are its question's whole prompt up to that token."""
    questions = [[20, 21], [22], [23, 24, 25]]
    commons = [[1, 2, 3, 10, 11, 12], [1, 2, 7, 13], [1, 2, 3, 14]]
    prompts = [[c + [30 + r] + q for q in questions] for r, c in enumerate(commons)]
    rows = QuestionRows.build([text_and_tails(p) for p in prompts], PREFIX)
    tokens, positions, mask = rows.tokens(), rows.positions(), rows.mask()
    P = rows.text.prefix_width
    for r in range(rows.batch):
        slot_tokens = np.concatenate([PREFIX, tokens[r]])
        slot_pos = np.concatenate([np.arange(P), positions[r]])
        for k, end in enumerate(rows.last()[r]):
            whole = prompts[r][k]
            for i in range(end - len(rows.tails[r][k]) + 1, end + 1):
                seen = np.flatnonzero(mask[r, 0, i])
                order = seen[np.argsort(slot_pos[seen])]
                assert slot_pos[order].tolist() == list(range(positions[r, i] + 1))
                assert slot_tokens[order].tolist() == whole[: positions[r, i] + 1]
            assert tokens[r, end] == whole[-1] and positions[r, end] == len(whole) - 1
