"""The YAML guard's lexical depth pre-scan against PyYAML's own parse events, and its hand cases."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim.io.yaml_guard import MAX_DEPTH, ExpansionError, flow_depth, load

_TRICKY = st.text(alphabet="ab []{}'\"#:,-?|>\\\n\t", max_size=12)
_DOCS = st.recursive(
    st.one_of(_TRICKY, st.integers(), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_TRICKY, inner, max_size=3)),
    max_leaves=20,
)


def _flow_depth_by_events(text: str) -> int:
    """The oracle: PyYAML's parse events, counting the open collections written in flow style."""
    stack: list[bool] = []
    deepest = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append(bool(event.flow_style))
            deepest = max(deepest, sum(stack))
        elif isinstance(event, yaml.CollectionEndEvent):
            stack.pop()
    return deepest


@settings(max_examples=150, deadline=None)
@given(doc=_DOCS, flow=st.booleans())
def test_flow_depth_matches_the_parser_on_dumped_documents(doc: Any, flow: bool) -> None:
    text = yaml.safe_dump({"k": doc}, default_flow_style=flow, allow_unicode=True)
    assert flow_depth(text, 10_000) == _flow_depth_by_events(text)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("a: [1, [2, {b: [3]}]]\n", 4),
        ("a: x[1\nb: y{2\n", 0),  # brackets inside plain scalars
        ("a: 1  # [[[[ a comment\n", 0),
        ("a: '[[[['\nb: \"[[\\\" [[\"\n", 0),  # quoted, with escaped quotes
        ("a: 'it''s [['\n", 0),
        ("a: |\n  [[[[\n  ]]\nb: [1]\n", 1),  # a block scalar's text
        ("- >-\n    {{{{\n- [[x]]\n", 2),
        ('{"a":[1,{"b":[]}]}', 4),  # JSON is YAML
        ("[it's, [x]]\n", 2),  # an apostrophe inside a plain scalar in flow context
        ("k: :? [\n", 0),  # "? " inside a plain scalar (which began with ':') starts no node
        ("a - [b]\n", 0),
    ],
)  # fmt: skip
def test_flow_depth_hand_cases(text: str, depth: int) -> None:
    assert flow_depth(text, 100) == depth == _flow_depth_by_events(text)


def test_flow_depth_stops_counting_past_the_limit() -> None:
    assert flow_depth("[" * 10**6, 100) == 101


@pytest.mark.parametrize("deep", ["[" * 5000 + "]" * 5000, "{a: " * 5000 + "1" + "}" * 5000])
def test_deep_flow_nesting_is_refused_in_distsims_words_before_the_parser_runs(deep: str) -> None:
    """PyYAML >= 6.0.4's libyaml has a nesting limit of its own that its scanner reaches first (it reads a flow
    collection's brackets ahead); the guard answers before PyYAML sees the text, on every release."""
    with pytest.raises(ExpansionError, match=f"more than {MAX_DEPTH} deep"):
        load("name: x\ndescription: " + deep + "\n", max_chars=10**7)


def test_block_nesting_is_refused_too() -> None:
    deep = "".join(" " * i + f"k{i}:\n" for i in range(MAX_DEPTH + 5)) + " " * (MAX_DEPTH + 5) + "v\n"
    with pytest.raises(ExpansionError, match=f"more than {MAX_DEPTH} deep"):
        load(deep, max_chars=10**7)
