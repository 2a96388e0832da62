"""The shape of the code: enum ids equal upstream's, imports run down the layers named in
docs/architecture.md with no circles, and no repeated code (`duplicates`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchggml.enums import GGML_COMMIT, GluOp, Op, UnaryOp
from torchggml.types import Type

DATA = Path(__file__).parent / "data"
UPSTREAM = json.loads((DATA / "ggml_enums.json").read_text())


# ---------------------------------------------------------------- enum ids

def test_upstream_table_is_the_commit_named_in_the_code():
    assert UPSTREAM["commit"] == GGML_COMMIT


@pytest.mark.parametrize("enum", [Type, Op, UnaryOp, GluOp], ids=lambda e: e.__name__)
def test_enum_ids_equal_upstream(enum):
    upstream = UPSTREAM[enum.__name__]
    ours = {m.name: int(m) for m in enum}
    assert {name: upstream.get(name) for name in ours} == ours
