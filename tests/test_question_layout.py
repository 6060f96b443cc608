"""The layout of a batch's texts, their questions' tails and label segments in one row a text:
each query sees exactly its own prompt's positions 0 .. q (exact tables, no model)."""

from __future__ import annotations

import numpy as np

from mlxbatch.engine.question_layout import (
    QuestionRows,
    common_part,
    fed_tails,
    tail_parts,
    text_and_tails,
)

PREFIX = [1, 2, 3]


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


def test_a_label_segment_sees_the_text_its_questions_tail_and_itself():
    """One text, two questions, the second's two labels two tokens each (one teacher token):
    each label's segment sits after the tails, at the positions right after its tail."""
    rows = QuestionRows.build([([1, 5], [[6], [7, 8]])], [1], (None, np.array([[9], [10]])))
    assert rows.tokens().tolist() == [[5, 6, 7, 8, 9, 10]]
    assert rows.positions().tolist() == [[1, 2, 2, 3, 4, 4]]
    assert rows.kept().tolist() == [[1, 3, 4, 5]]  # the tails' last slots, the labels' slots
    assert rows.mask()[0, 0].astype(int).tolist() == [
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 1, 0, 0],
        [1, 1, 0, 1, 1, 1, 0],  # label 0: the text, question 1's tail, itself
        [1, 1, 0, 1, 1, 0, 1],  # label 1: not label 0
    ]


def test_each_tail_and_label_token_sees_exactly_its_whole_prompt_in_position_order():
    """Three questions of three texts, tails of different lengths, the last question's labels
    teacher-forced: the tokens any slot sees, ordered by position, are its question's whole
    prompt (then its label's earlier tokens) up to that slot."""
    questions = [[20, 21], [22], [23, 24, 25]]
    teacher = np.array([[40, 41], [42, 0]])  # two labels: 3 tokens, then 2
    commons = [[1, 2, 3, 10, 11, 12], [1, 2, 7, 13], [1, 2, 3, 14]]
    prompts = [[c + [30 + r] + q for q in questions] for r, c in enumerate(commons)]
    rows = QuestionRows.build([text_and_tails(p) for p in prompts], PREFIX, (None, None, teacher))
    tokens, positions, mask = rows.tokens(), rows.positions(), rows.mask()
    P = rows.text.prefix_width
    for r in range(rows.batch):
        slot_tokens = np.concatenate([PREFIX, tokens[r]])
        slot_pos = np.concatenate([np.arange(P), positions[r]])
        wholes = [*prompts[r], *(prompts[r][2] + teacher[j].tolist() for j in range(2))]
        for s, whole in zip(rows.segments(r), wholes):
            for i in range(s.start, s.start + len(s.tokens)):
                seen = np.flatnonzero(mask[r, 0, i])
                order = seen[np.argsort(slot_pos[seen])]
                assert slot_pos[order].tolist() == list(range(positions[r, i] + 1))
                assert slot_tokens[order].tolist() == whole[: positions[r, i] + 1]
        for k, end in enumerate(rows.last()[r]):
            assert tokens[r, end] == prompts[r][k][-1]
            assert positions[r, end] == len(prompts[r][k]) - 1
    assert rows.label_inputs().shape == (3, 4)


def test_tails_that_begin_alike_share_their_common_part_once():
    """Four tails: two share [5, 6], one of those two parts again after it is shared; a
    tail that is a shared part's first token alone keeps it as its own."""
    tails = [[5, 6, 7], [5, 6, 8, 9], [4, 1], [5, 6, 8, 2], [4]]
    parts, leaf = tail_parts(tails)
    whole = []
    for k in range(len(tails)):
        chain, at = [], leaf[k]
        while at >= 0:
            chain.insert(0, parts[at][0])
            at = parts[at][1]
        whole.append([t for c in chain for t in c])
    assert whole == tails
    assert sorted(map(len, (p for p, _ in parts))) == [1, 1, 1, 1, 1, 2, 2]
    assert fed_tails(tails) == [t for p, _ in parts for t in p]
    assert tail_parts([[3], [3]])[0] == [([3], -1), ([3], -1)]  # nothing left to share


def test_shared_tail_parts_keep_each_slot_seeing_exactly_its_whole_prompt():
    """Tails sharing parts at two depths, one question's labels teacher-forced: every slot
    sees its own prompt up to itself, in position order, and nothing else."""
    questions = [[20, 21, 22], [20, 21, 23, 24], [25], [20, 21, 23, 26], [20, 27]]
    teacher = np.array([[40, 41], [42, 0]])
    commons = [[1, 2, 3, 10, 11], [1, 2, 7]]
    prompts = [[c + [30 + r] + q for q in questions] for r, c in enumerate(commons)]
    label_q = 3
    rows = QuestionRows.build(
        [text_and_tails(p) for p in prompts], PREFIX, (None, None, None, teacher, None)
    )
    tokens, positions, mask = rows.tokens(), rows.positions(), rows.mask()
    P = rows.text.prefix_width
    for r in range(rows.batch):
        slot_tokens = np.concatenate([PREFIX, tokens[r]])
        slot_pos = np.concatenate([np.arange(P), positions[r]])
        wholes = {}
        for k, end in enumerate(rows.last()[r]):
            (tail,) = [s for s in rows.segments(r) if s.end - 1 == end]
            for a, b in (*tail.sees, (tail.start, tail.end)):  # every slot on its way
                for slot in range(a, b):
                    wholes[slot] = prompts[r][k][: positions[r, slot] + 1]
        for j, s in enumerate(rows.label_inputs()[r].reshape(2, 2)):
            for i, slot in enumerate(s):
                wholes[slot] = prompts[r][label_q] + teacher[j][: i + 1].tolist()
        for slot, whole in wholes.items():
            seen = np.flatnonzero(mask[r, 0, slot])
            order = seen[np.argsort(slot_pos[seen])]
            assert slot_pos[order].tolist() == list(range(len(whole)))
            assert slot_tokens[order].tolist() == whole
    fed = len(text_and_tails(prompts[0])[0]) - len(PREFIX)
    assert rows.row_lengths[0] == fed + 1 + 2 + 1 + 1 + 1 + 1 + 1 + 4  # parts, then labels
