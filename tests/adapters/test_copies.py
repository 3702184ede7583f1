"""adapters/copies.replaced makes what dataclasses.replace makes, and leaves to it every class it cannot copy so."""
from __future__ import annotations

import dataclasses
import functools

import pytest

from adapters.copies import replaced
from adapters.protocol import ChatRequest, Message, SamplingOptions
from proxy.job import Caller, Job


@pytest.mark.parametrize("obj, changes", [
    (ChatRequest(model="m", messages=[Message(role="user", content="hi")], stream=False), {"stream": True}),
    (SamplingOptions(stop=["x"]), {"temperature": 0.5, "extra": {"k": 1}}),
    (Job(ChatRequest(model="m", messages=[])), {"request": ChatRequest(model="n", messages=[])}),
    (Caller(tenant="t", client="c"), {"request_id": "req_1"}),
])
def test_same_copy_as_replace(obj, changes):
    made, expected = replaced(obj, **changes), dataclasses.replace(obj, **changes)
    assert type(made) is type(expected) and vars(made) == vars(expected) and made is not obj
    assert all(getattr(made, name) is getattr(expected, name) for name in vars(expected))


def test_unknown_field_refused_as_replace_refuses():
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        replaced(Caller(), nope=1)


@dataclasses.dataclass
class _Counted:
    n: int = 0

    def __post_init__(self) -> None:
        self.n += 1


@dataclasses.dataclass
class _Cached:
    n: int = 0

    @functools.cached_property
    def double(self) -> int:
        return 2 * self.n


def test_post_init_and_values_beside_fields_go_through_replace():
    assert replaced(_Counted(1), n=5).n == 6
    cached = _Cached(1)
    assert cached.double == 2
    assert replaced(cached, n=5).double == 10
