"""torchtitan 0.3's own pipeline path runs pipewright's timetables with the gradients of one
process (float64), with the settings `pipewright.torch.titan_config` derives: its
`_pipeline_module_split` splits the model, its `_build_pipeline_schedule` loads our CSV through
`pipeline_parallel_schedule_csv`, every family at p = 2 and 4 in loop and V placement (one
launch per rank count, gloo on the CPU). A mismatch of schedule name, degree, stage count or
microbatches is refused up front naming the setting, and `check_grads` names the parameter
that torchtitan's ChunkedLossWrapper with FSDP leaves without a gradient on a split-backward
timetable.

torchtitan is an optional install (CI installs 0.3.0, see .ci/python-tests, and sets
PIPEWRIGHT_REQUIRE_TORCHTITAN=1 so that these tests cannot skip there)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

if os.environ.get("PIPEWRIGHT_REQUIRE_TORCHTITAN"):
    import torchtitan.distributed.pipeline_parallel as titan_pp
else:
    titan_pp = pytest.importorskip("torchtitan.distributed.pipeline_parallel")

import pipewright.torch as pwt
from titan_cases import FQNS
from torch_launch import cli, run_cases

FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zbv", "dualpipev"]
VIRTUAL = {"interleaved-1f1b", "looped-bfs", "zbv", "dualpipev"}
V_PLACED = {"zbv", "dualpipev"}
M = 8
TOLERANCE = 1e-12


def write(tmp: Path, family: str, p: int, v: int | None = None) -> Path:
    v = v or (2 if family in VIRTUAL else 1)
    path = tmp / f"{family}-p{p}-v{v}.csv"
    if not path.exists():
        cli("schedule", "--schedule", family, "-p", p, "-v", v, "-m", M, "-o", path)
    return path


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("titan")


@pytest.fixture(scope="module")
def results(tmp):
    out = {}
    for p in (2, 4):
        cases = [{"kind": "titan", "name": f"{f}-p{p}", "timetable": str(write(tmp, f, p)), "p": p}
                 for f in FAMILIES]
        if p == 2:  # four stages per rank: torchtitan needs module_fqns_per_model_part
            cases.append({"kind": "titan", "name": "interleaved-v4",
                          "timetable": str(write(tmp, "interleaved-1f1b", 2, 4)), "p": 2})
            cases += [{"kind": "titan_chunked", "name": f"chunked-{f}",
                       "timetable": str(write(tmp, f, 2)), "p": 2}
                      for f in ("zb-h1", "zbv", "dualpipev", "1f1b")]
        out.update(run_cases(p, cases, timeout=400))
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("p", [2, 4])
def test_torchtitans_own_path_trains_every_family_as_one_process(results, family, p):
    r = results[f"{family}-p{p}"]
    v = 2 if family in VIRTUAL else 1
    assert r["stages"] == p * v and not r["missing"], r
    assert r["built"] == r["derived"], r  # torchtitan placed the stages where we said
    assert (r["schedule"] in ("ZBVZeroBubble", "DualPipeV")) == (family in V_PLACED), r
    assert r["max_grad_err"] <= TOLERANCE, r


def test_four_stages_per_rank_train_with_the_derived_module_split(results):
    r = results["interleaved-v4"]
    assert r["stages"] == 8 and r["built"] == [[0, 2, 4, 6], [1, 3, 5, 7]], r
    assert r["max_grad_err"] <= TOLERANCE, r


def test_a_lost_gradient_under_chunked_loss_and_split_backward_is_named(results):
    """torchtitan's ChunkedLossWrapper with FSDP on every part, as its llama3 configs run."""
    split = results["chunked-zb-h1"]["refusals"]
    assert split[0] is None  # rank 0's stage (embeddings, first layers) got its gradients
    assert "no gradient" in split[1] and "norm.weight (stage 1)" in split[1], split
    assert "ChunkedLossWrapper" in split[1] and "--no-split-backward" in split[1]
    zbv = results["chunked-zbv"]["refusals"]  # V placement: the last stage is on rank 0
    assert zbv[0].startswith("no gradient (none, or all zeros) after the step for "
                             "norm.weight (stage 3)"), zbv


def test_a_wrong_gradient_under_chunked_loss_and_dualpipev_is_named(results):
    refusals = results["chunked-dualpipev"]["refusals"]
    assert refusals[0].startswith("gradient differs from the fused-backward reference for "
                                  "norm.weight (stage 3"), refusals


def test_chunked_loss_with_a_fused_backward_passes_both_checks(results):
    assert results["chunked-1f1b"]["refusals"] == [None, None]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("p", [2, 4])
def test_derived_stage_indices_are_torchtitans(tmp, family, p):
    cfg = pwt.titan_config(write(tmp, family, p), FQNS, local_batch_size=2 * M)
    assert cfg.microbatch_size == 2 and cfg.degree == p
    assert len(cfg.module_fqns_per_model_part) == cfg.num_stages
    assert [x for part in cfg.module_fqns_per_model_part for x in part] == FQNS
    for r in range(p):
        theirs = titan_pp._get_pp_rank_to_stage_indices_mapping(r, p, cfg.schedule, cfg.num_stages)
        assert tuple(theirs) == cfg.stage_indices[r]


def parallelism(**kw):
    from torchtitan.config import ParallelismConfig

    return ParallelismConfig(**kw)


def test_a_v_timetable_under_a_loop_name_is_refused_naming_the_setting(tmp):
    zbv = write(tmp, "zbv", 2)
    with pytest.raises(pwt.TitanError, match=r"^schedule 'Interleaved1F1B' makes torchtitan place stages "
                                             r"in loop placement, but .* is in v placement"):
        pwt.titan_config(zbv, FQNS, local_batch_size=M, schedule="Interleaved1F1B")
    cfg = pwt.titan_config(zbv, FQNS, local_batch_size=M)
    wrong = dataclasses.replace(parallelism(**cfg.fields()), pipeline_parallel_schedule="Interleaved1F1B")
    with pytest.raises(pwt.TitanError, match="^pipeline_parallel_schedule 'Interleaved1F1B'"):
        pwt.check_titan_config(zbv, wrong, local_batch_size=M)


def test_a_loop_timetable_under_a_v_name_is_refused(tmp):
    with pytest.raises(pwt.TitanError, match="'DualPipeV' makes torchtitan place stages in v"):
        pwt.titan_config(write(tmp, "interleaved-1f1b", 2), FQNS, local_batch_size=M,
                         schedule="DualPipeV")


def test_a_stage_count_torchtitan_cannot_infer_needs_the_layers(tmp):
    v4 = write(tmp, "interleaved-1f1b", 2, 4)
    with pytest.raises(pwt.TitanError, match="8 stages, but without module_fqns_per_model_part "
                                             "torchtitan makes 4 .* give layers"):
        pwt.titan_config(v4, local_batch_size=M)
    cfg = pwt.titan_config(v4, FQNS, local_batch_size=M)
    short = dataclasses.replace(parallelism(**cfg.fields()),
                                module_fqns_per_model_part=[["tok_embeddings"]] * 4)
    with pytest.raises(pwt.TitanError, match="^module_fqns_per_model_part has 4 parts, .* 8 stages"):
        pwt.check_titan_config(v4, short, local_batch_size=M)
    # torchtitan's own default split serves a timetable whose count it infers
    assert pwt.titan_config(write(tmp, "zbv", 2), local_batch_size=M).module_fqns_per_model_part is None


def test_degree_microbatches_and_layers_are_checked(tmp):
    path = write(tmp, "1f1b", 4)
    cfg = pwt.titan_config(path, FQNS, local_batch_size=M)
    with pytest.raises(pwt.TitanError, match="^pipeline_parallel_degree is 2, .* 4 ranks"):
        pwt.check_titan_config(path, dataclasses.replace(parallelism(**cfg.fields()),
                                                         pipeline_parallel_degree=2), local_batch_size=M)
    with pytest.raises(pwt.TitanError, match="^pipeline_parallel_microbatch_size is 1, .* 16 "
                                             "microbatches, .* has 8: use 2"):
        pwt.check_titan_config(path, parallelism(**cfg.fields()), local_batch_size=2 * M)
    with pytest.raises(pwt.TitanError, match="^local_batch_size 12 does not split into the 8"):
        pwt.titan_config(path, FQNS, local_batch_size=12)
    with pytest.raises(pwt.TitanError, match="^layers has 3 modules for 4 stages"):
        pwt.titan_config(path, FQNS[:3], local_batch_size=M)
    assert pwt.split_layers(FQNS, 4, cuts=[1, 7, 8])[0] == ("tok_embeddings",)
    with pytest.raises(pwt.TitanError, match=r"^cuts \[1, 1, 8\] must increase strictly"):
        pwt.split_layers(FQNS, 4, cuts=[1, 1, 8])
    with pytest.raises(pwt.TitanError, match="^cuts has 2 indices for 4 stages"):
        pwt.split_layers(FQNS, 4, cuts=[1, 2])


def test_a_config_whose_csv_is_not_the_timetable_is_refused(tmp):
    path = write(tmp, "1f1b", 2)
    good = parallelism(**pwt.titan_config(path, FQNS, local_batch_size=M).fields())
    pwt.check_titan_config(path, good, local_batch_size=M)
    unset = dataclasses.replace(good, pipeline_parallel_schedule_csv="")
    with pytest.raises(pwt.TitanError, match="^pipeline_parallel_schedule_csv is not set, so "
                                             "torchtitan would run its own 1F1B schedule"):
        pwt.check_titan_config(path, unset, local_batch_size=M)
    other = write(tmp, "gpipe", 2)
    with pytest.raises(pwt.TitanError, match="does not hold the actions of"):
        pwt.check_titan_config(path, dataclasses.replace(
            good, pipeline_parallel_schedule_csv=str(other)), local_batch_size=M)
    comms = tmp / "1f1b-comms.csv"
    cli("schedule", "--schedule", "1f1b", "-p", 2, "-m", M, "--comms", "-o", comms)
    with pytest.raises(pwt.TitanError, match="holds the compute_comms form; torchtitan reads "
                                             "the compute-only one"):
        pwt.check_titan_config(path, dataclasses.replace(
            good, pipeline_parallel_schedule_csv=str(comms)), local_batch_size=M)
    with pytest.raises(pwt.TitanError, match="^pipeline_parallel_schedule_csv: .*nonexistent"):
        pwt.check_titan_config(path, dataclasses.replace(
            good, pipeline_parallel_schedule_csv="/nonexistent/other.csv"), local_batch_size=M)


def test_the_csv_torchtitan_reads_is_compute_only(tmp):
    comms = tmp / "zbv-comms.csv"
    cli("schedule", "--schedule", "zbv", "-p", 2, "-v", 2, "-m", M, "--comms", "-o", comms)
    with pytest.raises(pwt.TitanError, match="not a compute-only .csv file.*csv_path="):
        pwt.titan_config(comms, FQNS, local_batch_size=M)
    out = tmp / "for-titan.csv"
    before = comms.read_bytes()
    with pytest.raises(pwt.RecordError, match="^csv_path .* is the timetable .* this run reads"):
        pwt.titan_config(comms, FQNS, local_batch_size=M, csv_path=comms)
    assert comms.read_bytes() == before  # the compute+comms file it was read from, untouched
    cfg = pwt.titan_config(comms, FQNS, local_batch_size=M, csv_path=out)
    assert cfg.schedule_csv == str(out) and pwt.load(out).form == "compute_only"
    assert pwt.load(out).rows == pwt.load(comms, form="compute_only").rows


def test_check_grads_names_a_missing_or_differing_gradient():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    model(torch.ones(1, 2))[0, 0].backward()
    pwt.check_grads(model)
    model[1].weight.grad = None
    with pytest.raises(pwt.GradError,
                       match=r"^no gradient \(none, or all zeros\) after the step for 1.weight \(model part 0\)"):
        pwt.check_grads([model])
    model[1].weight.grad = torch.zeros(2)  # zero_grad(set_to_none=False), then nothing added
    with pytest.raises(pwt.GradError, match=r"for 1.weight \(model part 0\)"):
        pwt.check_grads(model)
    pwt.check_grads(model, zeros_are_lost=False)  # zeros that are right (a LoRA pair at zero)
    zero_ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    pwt.check_grads(model, reference=zero_ref)  # the reference says zero too: it decides
    pwt.check_grads(model, reference={"1.weight": zero_ref["1.weight"]})  # a partial one
    model[1].weight.requires_grad_(False)
    pwt.check_grads(model)  # frozen parameters are not asked for
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    pwt.check_grads(model, reference=ref)
    with pytest.raises(pwt.GradError, match=r"^reference has no gradient for 0.weight"):
        pwt.check_grads(model, reference={"_orig_mod." + n: g for n, g in ref.items()})
    ref["0.bias"] = ref["0.bias"] + 1
    with pytest.raises(pwt.GradError, match=r"differs from the fused-backward reference for 0.bias"):
        pwt.check_grads(model, reference=ref)
