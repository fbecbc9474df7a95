"""The chain check: parts chained as the engine launches them, against the chained float64 truth."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.check_user_chains import (
    numpy_link,
    qwen35_chain,
    qwen35_chain_bf16_state,
    qwen35_chain_zero_centred_twice,
    tail_without_second_add,
)
from workbench.check import ChainDims, chained_outputs, check_chain, wire
from workbench.check.chain_links import LINKS
from workbench.check.chain_wiring import draw_case

SEEDS = range(20)


def test_mlx_lm_qwen35_layers_are_judged_correct_as_one_implementation():
    rep = check_chain(qwen35_chain, ("tail", "gdn_in", "gdn"), seeds=SEEDS)
    assert rep.passed, str(rep)
    assert rep.first_failing is None
    rows = {r["link"]: r for r in rep.rows()}
    assert list(rows) == ["1 tail", "2 gdn_in", "3 gdn"]
    for r in rows.values():
        assert r["verdict"] == "pass"
        assert 0 < r["max"] < 1e-5 and 0 < r["ref max"] < 1e-5  # float32 rounding, chained


def test_a_faulty_step_in_mlx_lm_chain_is_caught_and_named():
    rep = check_chain(qwen35_chain_bf16_state, seeds=SEEDS)
    assert not rep.passed
    assert rep.first_failing == "gdn"
    assert rep.failing == ["gdn"]  # the links before it pass
    assert "link 3 gdn (part gdn)" in str(rep)


def test_a_faulty_input_norm_is_named_first_and_the_step_after_it_fails_with_it():
    rep = check_chain(qwen35_chain_zero_centred_twice, seeds=SEEDS)
    assert rep.first_failing == "gdn_in"
    assert rep.failing == ["gdn_in", "gdn"]  # the step reads the norm's error
    assert "FAIL (first failing link: gdn_in)" in str(rep)


def test_one_callable_a_link_each_fed_the_users_previous_output():
    seen = []

    def my_gdn_in(c):
        out = numpy_link("gdn_in")(c)
        seen.append(out[0].copy())
        return out

    def my_gdn(c):
        # the user's previous link's output, not the reference's or the truth's
        assert np.array_equal(c.inputs["mixed"], seen[-1])
        return LINKS["gdn"].reference(c.weights, c.inputs, c.dims)

    rep = check_chain([numpy_link("tail"), my_gdn_in, my_gdn], seeds=range(6))
    assert rep.passed, str(rep)
    assert len(seen) == 12 and rep.given == ["tail", "my_gdn_in", "my_gdn"]


def test_a_faulty_link_in_a_chain_of_callables_compounds_and_is_named_first():
    rep = check_chain({"tail": tail_without_second_add}, seeds=SEEDS)
    assert rep.given == ["tail_without_second_add", "reference", "reference"]
    assert rep.first_failing == "tail" and rep.failing == ["tail", "gdn_in", "gdn"]
    rec = json.loads(json.dumps(rep.to_record()))
    assert rec["first_failing"] == "tail" and rec["passed"] is False


def test_the_truth_is_each_oracle_fed_the_truths_previous_output():
    chain = wire("tail,gdn_in,gdn")
    case = draw_case(chain, 3, scale=1.0, gate="typical", state_scale=1.0, label="x")
    truth = chained_outputs(chain, case, truth=True)
    hidden = LINKS["tail"].oracle(
        case.weights["tail"], {k: v.astype(np.float64) for k, v in case.inputs.items()}, case.dims
    )
    assert truth[0]["hidden"].dtype == np.float64
    np.testing.assert_array_equal(truth[0]["hidden"], hidden[0])
    proj = LINKS["gdn_in"].oracle(case.weights["gdn_in"], {"hidden": hidden[0]}, case.dims)
    for name, v in zip(LINKS["gdn_in"].outputs, proj):
        np.testing.assert_array_equal(truth[1][name], v)


def test_a_step_then_the_recurrent_layers_tail_is_wired_by_the_steps_output():
    d = ChainDims(hidden=32, ffn=48)
    chain = wire(["gdn", "tail"], d)
    tail = chain.links[1]
    assert tail.sources["branch"] == (0, "out") and tail.sources["residual"] == (None, "residual")
    assert tail.weight_shapes["wo"] == (32, d.value)
    assert set(chain.inputs) == {"mixed", "z", "b", "a", "conv_state", "state", "residual"}
    rep = check_chain({"tail": numpy_link("tail")}, ["gdn", "tail"], dims=d, seeds=range(8))
    assert rep.passed, str(rep)


@pytest.mark.parametrize(
    ("links", "message"),
    [
        ("tail,gdn_in,nope", "chain: must be one of"),
        ("tail,gdn", "chain: link 2 gdn reads nothing link 1 tail writes"),
        ([], "chain:"),
    ],
)
def test_a_bad_chain_is_refused_naming_it(links, message):
    with pytest.raises(ValueError, match=message):
        check_chain(qwen35_chain, links, seeds=range(2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"subject": [None, None]}, "subject: one callable .* a link, 3 for"),
        ({"subject": {"tial": None}}, r"subject: names links \['tial'\]"),
        ({"subject": [None, 3, None]}, "subject: link gdn_in: must be a function of a LinkCase"),
        ({"dims": {"hidden": 64}}, "dims: must be a ChainDims"),
        ({"scales": [0]}, "scales"),
        ({"gates": ["sticky"]}, "gates"),
        ({"tolerance": -1}, "tolerance"),
    ],
)
def test_bad_arguments_are_refused_naming_the_parameter(kwargs, message):
    subject = kwargs.pop("subject", qwen35_chain)
    with pytest.raises(ValueError, match=message):
        check_chain(subject, seeds=range(2), **kwargs)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hidden", 0, "dims hidden: must be an integer >= 1"),
        ("v_heads", 5, "dims: v_heads must be a multiple"),
        ("conv", 1, "dims: conv"),
        ("eps", -1.0, "dims eps"),
    ],
)
def test_bad_dims_are_refused_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        ChainDims(**{field: value})


def _returning(link, bad):
    def fn(c):
        out = list(LINKS[link].reference(c.weights, c.inputs, c.dims))
        return bad(out)

    return fn


@pytest.mark.parametrize(
    ("link", "bad", "message"),
    [
        ("gdn_in", lambda o: (o[0], o[1][:-1], o[2], o[3]), r"link 2 gdn_in \(part gdn_in\), tensor z: returned shape"),
        ("gdn_in", lambda o: (o[0], o[1], o[2], o[3].astype(np.float64)), "tensor a: returned dtype float64"),
        (
            "gdn",
            lambda o: {"out": o[0], "state": o[2]},
            r"link 3 gdn \(part gdn\): returned tensors .*missing \['conv_state'\]",
        ),
        ("gdn", lambda o: (o[0], o[1], "state"), r"tensor state: returned 'state'.*not an array"),
        ("gdn", lambda o: o[:2], "returned 2 tensors, expected 3"),
        ("gdn", lambda o: 1 / 0, r"link 3 gdn \(part gdn\), case .*: raised ZeroDivisionError"),
    ],
)
def test_a_bad_return_is_named_by_part_link_and_tensor(link, bad, message):
    rep = check_chain({link: _returning(link, bad)}, seeds=range(3), scales=[1.0])
    assert not rep.passed
    assert rep.first_failing == link
    assert len(rep.problems) == 3  # one a case, the case named
    assert re.search(message, rep.problems[0]) and "seed 0" in rep.problems[0], rep.problems[0]
    assert "gave no usable result" in rep.reasons[link][0]


def test_one_implementation_that_leaves_out_a_link_is_named():
    def partial(case):
        out = qwen35_chain(case)
        del out["gdn"]
        return out

    rep = check_chain(partial, seeds=range(2), scales=[1.0])
    assert "returned links ['gdn_in', 'tail'], expected one entry a link" in rep.problems[0]
    assert rep.first_failing == "tail"  # nothing of the chain was usable


def test_the_reference_alone_judges_nothing():
    rep = check_chain(None, seeds=range(2))
    assert not rep.passed and not rep.errors and "reference chain alone" in str(rep)


def test_the_run_end_then_the_next_head_through_mlx_lm_pieces_passes_and_a_rope_fault_is_named():
    from tests.check_user_chains import RUN_END, mlx_lm_head_rope_at_next_position

    rep = check_chain(RUN_END, "gdn,tail,head", seeds=SEEDS)
    assert rep.passed, str(rep)
    assert [r["run by"] for r in rep.rows()] == ["mlx_lm_gdn_link", "tail", "mlx_lm_head_link"]
    bad = check_chain({**RUN_END, "head": mlx_lm_head_rope_at_next_position}, "gdn,tail,head", seeds=SEEDS)
    assert bad.failing == ["head"]


def test_a_call_past_the_time_limit_is_that_cases_problem_and_the_check_goes_on():
    import time

    def slow_on_seed_1(c):
        if c.case.endswith("seed 1"):
            time.sleep(1.0)
        return numpy_link("tail")(c)

    rep = check_chain({"tail": slow_on_seed_1}, seeds=range(3), scales=[1.0], time_limit=0.3)
    assert len(rep.problems) == 1 and "seed 1: raised TimeoutError: took over 0.3 s (time_limit)" in rep.problems[0]
    assert rep.first_failing == "tail"  # a case that gave nothing usable fails its link
    with pytest.raises(ValueError, match="time_limit"):
        check_chain(qwen35_chain, seeds=range(1), time_limit=0)


def test_a_parts_own_forms_run_as_links_and_a_form_of_another_part_is_refused():
    from tests.check_user_steps import correct
    from workbench.check import CallableHead, CallableStep
    from workbench.check.gdn_subjects import KernelsFolderStep

    def numpy_head(h):
        return LINKS["head"].reference(
            {k: getattr(h, k) for k in ("attn_norm", "q_w", "k_w", "v_w", "q_norm", "k_norm")},
            {"hidden": h.hidden},
            ChainDims(position=h.position),
        )

    links = {"gdn": CallableStep(correct, name="correct"), "head": CallableHead(numpy_head, name="numpy_head")}
    rep = check_chain(links, "gdn,tail,head", seeds=range(8))
    assert rep.passed, str(rep)
    assert rep.given == ["correct", "reference", "numpy_head"]
    with pytest.raises(
        ValueError, match="subject: link tail: must be a function of a LinkCase, a KernelsFolderSubject"
    ):
        check_chain({"tail": KernelsFolderStep("kernels")}, seeds=range(1))


def test_the_workbenchs_own_kernels_folder_as_the_tail_and_the_step_on_the_emulator(emulator):
    from workbench.check import KernelsFolderSubject
    from workbench.check.gdn_subjects import KernelsFolderStep
    from workbench.files import PROJECT_ROOT

    folder = PROJECT_ROOT / "kernels"
    links = {"tail": KernelsFolderSubject(folder), "gdn": KernelsFolderStep(folder)}
    rep = check_chain(links, "tail,gdn_in,gdn", seeds=range(4), scales=[1.0], time_limit=None)
    assert rep.passed and rep.given == ["kernels", "reference", "kernels"], str(rep)


@pytest.mark.parametrize(
    ("links", "link", "fault"),
    [
        ("tail,gdn_in,gdn", "tail", "dropped_residual"),
        ("tail,gdn_in,gdn", "gdn_in", "norm_weight_plus_one"),
        ("tail,gdn_in,gdn", "gdn", "state_bfloat16"),
        ("gdn,tail,head", "head", "rope_interleaved"),
        ("gdn,tail,head", "gdn", "l2_eps_outside_root"),  # the step's inputs are the chain's: scale 0.01 shows it
    ],
)
def test_a_links_fault_model_in_a_chain_is_caught_at_that_link(links, link, fault):
    from workbench.check import faulty_link

    rep = check_chain({link: faulty_link(link, fault)}, links, seeds=range(12))
    assert rep.first_failing == link, str(rep)


def test_eps_outside_a_norm_after_the_tail_cannot_show_in_the_chain():
    # the tail's output reaches the next norm at O(1) whatever the chain's input scale (its FFN's output dominates)
    from workbench.check import faulty_link

    rep = check_chain({"gdn_in": faulty_link("gdn_in", "eps_outside_root")}, seeds=range(12))
    assert rep.passed


def test_the_fault_models_a_link_has():
    from workbench.check import link_faults

    assert set(link_faults("gdn_in")) == {"eps_outside_root", "norm_weight_plus_one"}
    assert "state_bfloat16" in link_faults("gdn") and "dropped_residual" in link_faults("tail")
    assert "rotation_skipped" not in link_faults("tail")  # needs a fold: the chain's wo is dense, unfolded
    assert "rope_position_plus_one" in link_faults("head") and "bias_dropped" not in link_faults("head")
    with pytest.raises(ValueError, match="fault: must be one of"):
        __import__("workbench.check", fromlist=["faulty_link"]).faulty_link("gdn", "nope")


def test_a_metal_step_of_ones_own_as_the_chains_step_on_the_emulator(emulator):
    # the step's Metal body of tests/test_check_gdn.py (a thread a value head: the chain's dims have 6), in the chain
    from tests.test_check_gdn import _metal

    rep = check_chain({"gdn": _metal()}, "tail,gdn_in,gdn", seeds=range(4), scales=[1.0], time_limit=None)
    assert rep.passed and not rep.problems, str(rep)
    assert rep.given == ["reference", "reference", "user_gdn_step"]


RUN = "tail,gdn_in,gdn,tail,gdn_in,gdn,tail,head"  # an attention tail, two recurrent layers, the next head


def test_a_run_of_recurrent_layers_is_wired_layer_by_layer_each_with_its_own_state():
    chain = wire(RUN)
    assert chain.names == ("tail", "gdn_in", "gdn", "tail@2", "gdn_in@2", "gdn@2", "tail@3", "head")
    gdn2, tail2, tail3 = chain.links[5], chain.links[3], chain.links[6]
    assert gdn2.sources["state"] == (None, "state@2") and gdn2.sources["conv_state"] == (None, "conv_state@2")
    assert gdn2.sources["mixed"] == (4, "mixed")  # the second layer's own projections
    assert tail2.sources == {"branch": (2, "out"), "residual": (0, "hidden")}
    assert tail3.sources == {"branch": (5, "out"), "residual": (3, "hidden")}
    assert set(chain.inputs) == {"branch", "residual", "conv_state", "state", "conv_state@2", "state@2"}
    case = draw_case(chain, 0, scale=1.0, gate="typical", state_scale=1.0, label="x")
    assert not np.array_equal(case.weights["gdn"]["conv_w"], case.weights["gdn@2"]["conv_w"])


def test_a_run_through_mlx_lm_pieces_passes_and_a_fault_in_the_second_layer_is_named_there():
    from tests.check_user_chains import RUN_END
    from workbench.check import faulty_link

    rep = check_chain(RUN_END, RUN, seeds=range(12))  # a link's name gives every occurrence of it
    assert rep.passed, str(rep)
    assert rep.given == ["tail", "reference", "mlx_lm_gdn_link", "tail", "reference", "mlx_lm_gdn_link", "tail"] + [
        "mlx_lm_head_link"
    ]
    bad = check_chain({"gdn@2": faulty_link("gdn", "state_bfloat16")}, RUN, seeds=range(12))
    assert bad.first_failing == "gdn@2" and "gdn" not in bad.failing


def test_a_case_not_of_the_chain_is_refused_naming_link_part_and_tensor():
    import dataclasses

    chain = wire("tail,gdn_in,gdn")
    case = draw_case(chain, 0, scale=1.0, gate="typical", state_scale=1.0, label="x")
    bad_w = {**case.weights, "gdn_in": {**case.weights["gdn_in"], "in_proj_z": np.zeros((3, 3), np.float32)}}
    with pytest.raises(ValueError, match=r"case: link 2 gdn_in \(part gdn_in\), tensor in_proj_z: shape \(3, 3\)"):
        chained_outputs(chain, dataclasses.replace(case, weights=bad_w), truth=True)
    bad_x = {**case.inputs, "state": case.inputs["state"][:1]}
    with pytest.raises(ValueError, match="case: the chain's inputs, tensor state: shape"):
        chained_outputs(chain, dataclasses.replace(case, inputs=bad_x), truth=False)
    with pytest.raises(ValueError, match=r"case: its links \['tail'\] are not the chain's"):
        chained_outputs(chain, dataclasses.replace(case, links=("tail",)), truth=True)
    with pytest.raises(ValueError, match="case: must be a ChainCase"):
        chained_outputs(chain, {}, truth=True)
