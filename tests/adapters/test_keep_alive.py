"""keep_alive read as Ollama's api.Duration reads it (numbers are seconds, strings Go durations)."""
import math

import pytest

from adapters import keep_alive
from adapters.errors import BadRequest


@pytest.mark.parametrize("value, seconds", [(None, 300.0), (0, 0.0), ("0", 0.0), ("0s", 0.0), (30, 30.0),
                                            (2.5, 2.5), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5),
                                            ("250ms", 0.25), (-1, math.inf), ("-1m", math.inf)])
def test_durations(value, seconds):
    assert keep_alive.seconds(value) == seconds


@pytest.mark.parametrize("value, message", [("bogus", 'time: invalid duration "bogus"'),
                                            ("300", 'time: missing unit in duration "300"'),
                                            ("", 'time: invalid duration ""'), (".s", 'time: invalid duration ".s"'),
                                            # the unit is all up to the next digit or ".": Velo said "invalid
                                            # duration" of a unit Go does not know
                                            ("5x", 'time: unknown unit "x" in duration "5x"'),
                                            ("1d", 'time: unknown unit "d" in duration "1d"'),
                                            ("5min", 'time: unknown unit "min" in duration "5min"'),
                                            ("5m30", 'time: missing unit in duration "5m30"'),
                                            # Go's names of the types: Velo said 'dict' and 'list'
                                            (True, "Unsupported type: 'bool'"),
                                            ([1], "Unsupported type: '[]interface {}'"),
                                            ({"m": 5}, "Unsupported type: 'map[string]interface {}'")])
def test_what_go_refuses_is_a_400_in_gos_words(value, message):
    with pytest.raises(BadRequest) as e:
        keep_alive.seconds(value)
    assert message in e.value.message


def test_unloads_only_on_zero():
    assert keep_alive.unloads(0) and keep_alive.unloads("0s") and not keep_alive.unloads(None)
    assert not keep_alive.unloads("5m") and not keep_alive.unloads(-1)
