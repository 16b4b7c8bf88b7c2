"""The train layer's method table covers every method of the config layer's table, EBFT's strided mode its own entry."""

from rlft.config.methods import METHODS, method_spec
from rlft.train.methods import SETUPS, ebft_strided_setup, ebft_structured_setup, kto_setup, pair_setup


def test_every_method_spec_has_a_setup():
    specs = set(METHODS.values()) | {spec.strided for spec in METHODS.values() if spec.strided is not None}
    assert set(SETUPS) == specs
    assert SETUPS[method_spec("ebft", "strided")] is ebft_strided_setup
    assert SETUPS[method_spec("ebft", "structured")] is ebft_structured_setup
    assert [name for name, spec in METHODS.items() if SETUPS[spec] is pair_setup] == ["dpo", "ipo", "orpo", "simpo"]
    assert SETUPS[METHODS["kto"]] is kto_setup
