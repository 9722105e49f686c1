"""The language-model recipes from Python: qatgraph.nn.parse_recipe, the dynamic_fake_quantize
attributes a recipe's quantizers use (what test_torch_torchao_conformance.py runs against
torchao on the GPU machine), their named errors, and one hand-checked float-zero-point
fake quantization through those attributes."""
import numpy as np
import pytest

import qatgraph as qg
from qatgraph import nn

F32_EPS = float(np.finfo(np.float32).eps)
F32_TINY = float(np.finfo(np.float32).tiny)


def test_recipe_names_and_presets():
    assert list(nn.recipe_names()) == ["float", "8da4w", "8da3w", "8da2w", "int4_weight_only",
                                       "w8a8_dynamic"]
    q = nn.parse_recipe("8da4w", 64)
    assert q.dynamic_weights and q.weight == nn.WeightQuant.int4
    assert q.activation == nn.ActQuant.int8_dynamic_token and q.weight_group_size == 64
    assert nn.parse_recipe("8da3w").weight == nn.WeightQuant.int3
    w4 = nn.parse_recipe("int4_weight_only", 128)
    assert w4.weight_mapping == nn.WeightMapping.float_zero
    assert w4.activation == nn.ActQuant.none
    assert repr(nn.QConfig.int8_dyn_act_int8_weight()) == (
        "<QConfig W8A8dyn (weights per channel, dynamic)>")


def test_the_quantizers_attributes():
    q = nn.parse_recipe("8da4w", 32)
    assert q.dynamic_activation_attrs() == {"group_size": 0, "mode": "asymmetric",
                                            "quant_min": -128, "quant_max": 127, "eps": F32_EPS}
    assert q.dynamic_weight_attrs("bf16") == {"group_size": 32, "mode": "symmetric",
                                              "quant_min": -8, "quant_max": 7, "eps": F32_TINY}
    assert q.dynamic_weight_attrs("f16")["eps"] == 2.0 ** -14
    assert nn.parse_recipe("8da2w", 64).dynamic_weight_attrs()["quant_min"] == -2
    assert nn.parse_recipe("w8a8_dynamic").dynamic_weight_attrs()["group_size"] == 0
    assert nn.parse_recipe("int4_weight_only", 256).dynamic_weight_attrs() == {
        "group_size": 256, "mode": "float_zero", "quant_min": 0, "quant_max": 15, "eps": 1e-6,
        "qparam_dtype": "bf16"}


def test_learned_weight_ranges_field():
    q = nn.parse_recipe("8da4w", 32)
    assert not q.learned_weight_ranges
    q.learned_weight_ranges = True
    assert repr(q) == "<QConfig W4A8dyn (weights per group of 32, learned ranges)>"
    w4 = nn.parse_recipe("int4_weight_only", 32)
    w4.learned_weight_ranges = True
    with pytest.raises(qg.Error, match="float zero point of int4 weight-only"):
        w4.validate()


def test_integer_forward_field():
    q = nn.parse_recipe("8da4w", 32)
    assert not q.integer_forward
    q.integer_forward = True
    q.validate()
    assert repr(q) == "<QConfig W4A8dyn (weights per group of 32, dynamic, integer forward)>"
    w4 = nn.parse_recipe("int4_weight_only", 32)
    w4.integer_forward = True
    with pytest.raises(qg.Error, match="integer forward multiplies per-token int8 activation"):
        w4.validate()


def test_bad_recipes_are_named_errors():
    with pytest.raises(qg.Error, match="recipe '4w4a' is not one of"):
        nn.parse_recipe("4w4a", 32)
    with pytest.raises(qg.Error, match="group size 48 is not one of 32, 64, 128, 256"):
        nn.parse_recipe("8da4w", 48)
    with pytest.raises(qg.Error, match="weight bits 5 are outside"):
        nn.QConfig.int8_dyn_act_intx_weight(5, 32)
    with pytest.raises(qg.Error, match="has no dynamic activations"):
        nn.parse_recipe("int4_weight_only", 32).dynamic_activation_attrs()


# [-1.5, 0, 6, 1.2]: scale 7.5 * f32(1/15) = 0.5, zero -1.5 + 8 * 0.5 = 2.5 (bf16 values);
# 1.2 -> rint(2.7 / 0.5) = 5 -> (5 - 8) * 0.5 + 2.5 = 1.0.
def test_float_zero_by_hand_through_the_recipes_attributes():
    attrs = nn.parse_recipe("int4_weight_only", 32).dynamic_weight_attrs()
    w = np.zeros((2, 32), np.float32)
    w[0, :4] = [-1.5, 0.0, 6.0, 1.2]
    w[0, 4:] = 0.5
    y, _, scale, zero = qg.run_op("dynamic_fake_quantize", [w], attrs)[0]
    assert scale[0, 0] == 0.5 and zero[0, 0] == 2.5 and zero.dtype == np.float32
    np.testing.assert_array_equal(y[0, :4], np.float32([-1.5, 0.0, 6.0, 1.0]))
