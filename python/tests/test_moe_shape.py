"""Mixture-of-experts shapes in Python (issue 35): the same keywords as the CLI's flags,
refused naming the keywords where they contradict, and the published configs' total and active counts."""

from __future__ import annotations

from pathlib import Path

import pytest

import pipewright as pw

FIXTURES = Path(__file__).resolve().parents[2] / "model" / "tests" / "fixtures" / "hf"


def test_keywords_make_a_mixture_whose_counts_are_the_closed_form():
    s = pw.Shape(3, 8, 2, 4, 10, ffn=12, mlp="swiglu", norm="rmsnorm", positions="rotary",
                 bias="none", experts=4, top_k=2, expert_ffn=6, shared_experts=1,
                 shared_ffn=5, dense_layers=1)
    # Embedding, head and final norm 168; a dense layer 560; an MoE layer with all four
    # experts 1000, with the two a token goes to 712 (tests of model/src/shape).
    assert s.parameters == 168 + 560 + 2 * 1000
    assert s.active_parameters == 168 + 560 + 2 * 712
    dense = pw.Shape(2, 8, 2, 4, 10)
    assert dense.active_parameters == dense.parameters


def test_contradicting_keywords_are_refused_in_the_keywords_words():
    # The library names the fields; Python writes them as its keywords, not as flags.
    cases = [
        (dict(experts=4), "experts= needs top_k= (the routed experts each token goes to)"),
        (dict(experts=4, top_k=5), "top_k=5 must be at most experts=4"),
        (dict(top_k=2), "top_k= describes a mixture of experts: also give experts="),
        (dict(experts=4, top_k=2, shared_ffn=8),
         "shared_ffn= is the width of a shared expert: also give shared_experts="),
        (dict(experts=4, top_k=2, dense_layers=2),
         "dense_layers=2 and moe_every=1 leave none of the layers=2 an MoE layer"),
        (dict(experts=4, top_k=2, groups_per_token=1),
         "groups_per_token= needs expert_groups= (group-limited routing takes both)"),
        (dict(experts=4, top_k=2, expert_groups=3, groups_per_token=1),
         "expert_groups=3 must divide experts=4"),
    ]
    for kwargs, words in cases:
        with pytest.raises(pw.PipewrightError) as e:
            pw.Shape(2, 8, 2, 4, 10, **kwargs)
        assert str(e.value) == words
        assert "--" not in str(e.value)


def test_published_configs_give_their_counts():
    mixtral = pw.Shape.from_hf_config(str(FIXTURES / "mixtral-8x7b-v0.1.json"))
    assert mixtral.parameters == 46_702_792_704
    deepseek = pw.Shape.from_hf_config(str(FIXTURES / "deepseek-v3.json"))
    assert abs(deepseek.parameters / 671e9 - 1) < 1e-3
    assert any("multi-token-prediction" in n for n in deepseek.notes)
    # Its notes name the fields as keywords, where the CLI's name its flags.
    path = str(FIXTURES / "deepseek-v3.json")
    assert all(n.startswith(f"note: config={path}: ") for n in deepseek.notes)
    assert not any("--" in n for n in deepseek.notes)
    assert any(n.endswith("(seq_len= plans another)") for n in deepseek.notes)
    assert any("rope_scaling `yarn` is not modelled" in n for n in deepseek.notes)


def test_fp8_and_node_limited_routing_are_planned_and_refused_in_keywords():
    deepseek = str(FIXTURES / "deepseek-v3.json")
    fixed = dict(hf_config=deepseek, seq_len=1024, gpus=512, global_batch=64, tp=1, pp=16,
                 ep=32, microbatch_size=1, recompute="full", zero=1, dispatcher="deepep",
                 cluster="h100-80g", top=1)
    bf16 = pw.plan(**fixed)
    fp8 = pw.plan(**fixed, fp8=True)
    assert fp8.rows[0].step_time_s < bf16.rows[0].step_time_s
    with pytest.raises(pw.PipewrightError) as e:
        pw.plan(**{**fixed, "cluster": "a100-80g"}, fp8=True)
    assert str(e.value).startswith("fp8=True on cluster=a100-80g: the cluster has no FP8 peak")
