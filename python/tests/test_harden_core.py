"""Issue 32's core classes from Python: a plan that one refused candidate used to end, shape
counts that wrapped, absurd cluster figures, readers given another kind of file, and the
smaller wrong answers (timetable equality, lowered CSV, mixed timelines, events before 0,
a rope_scaling of another form, a batch that does not split into microbatches)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

import pipewright as pw


def one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


CLUSTER = {
    "name": "odd", "gpus_per_node": 8, "memory_gib": 80,
    "peak_tflops": {"bf16": 312, "tf32": 156, "f32": 19.5},
    "memory_bandwidth_gbs": 2039,
    "intra_node": {"bandwidth_gbs": 240, "latency_us": 5},
    "inter_node": {"bandwidth_gbs": 23, "latency_us": 10},
}
SMALL = dict(layers=8, d_model=1024, heads=8, seq_len=1024, gpus=8, global_batch=16)


def test_class5_a_refused_candidate_is_dropped_not_the_plan():
    plan = pw.plan(layers=32, d_model=4096, heads=32, seq_len=1, gpus=8, global_batch=64)
    assert plan.best is not None
    assert any("must divide seq_len (1)" in line for line in plan.explain)


def test_class8_shape_counts_that_would_wrap_are_refused():
    with pytest.raises(pw.PipewrightError) as e:
        pw.Shape(4096, 2**40, 1, 1, 1)
    msg = one_line(e)
    assert "pass 2^60" in msg and "d_model=1099511627776" in msg and "--" not in msg


def test_class7_and_12_cluster_files_out_of_range_or_of_another_kind(tmp_path: Path):
    bytes_ = tmp_path / "bytes.json"
    bytes_.write_text(json.dumps(dict(CLUSTER, memory_gib=85899345920)))
    with pytest.raises(pw.PipewrightError) as e:
        pw.plan(**SMALL, cluster=str(bytes_))
    assert "memory_gib is 85899345920, outside" in one_line(e) and "bytes.json" in str(e.value)
    costs = tmp_path / "costs.json"
    costs.write_text('{"default": {"f": 1, "b": 2}}')
    with pytest.raises(pw.PipewrightError) as e:
        pw.plan(**SMALL, cluster=str(costs))
    assert "is a cost file" in one_line(e) and "not a cluster file" in str(e.value)
    with pytest.raises(pw.PipewrightError) as e:
        pw.plan(profile=CLUSTER, gpus=2, global_batch=4)
    assert "is a cluster file" in one_line(e) and "not a layer profile" in str(e.value)


def test_class11_a_timetable_equals_itself_read_back_and_lowered_csv_has_sends():
    tt = pw.generate("interleaved-1f1b", p=2, v=2, m=4)
    back = pw.Timetable.from_csv(tt.to_csv())
    assert back.name != tt.name and back == tt
    assert pw.Timetable.from_csv(tt.lower().to_csv("lowered")) == tt.lower()
    lowered = tt.to_csv("lowered")
    assert "SEND_F" in lowered and lowered == tt.lower().to_csv("lowered")


def test_class11_timelines_of_other_pipelines_and_before_zero_are_refused():
    four = pw.simulate(pw.generate("1f1b", p=2, m=4)).timeline
    eight = pw.simulate(pw.generate("1f1b", p=2, m=8)).timeline
    with pytest.raises(pw.PipewrightError) as e:
        pw.Costs.from_timelines([four, eight])
    assert "timeline 1" in one_line(e) and "microbatches is 8" in str(e.value)
    pw.Costs.from_timelines([four, four])
    tl = json.loads(four.to_json())
    for ev in tl["events"]:
        ev["start"] -= 3.0
        ev["end"] -= 3.0
    with pytest.raises(pw.PipewrightError) as e:
        pw.Timeline.from_json(json.dumps(tl))
    assert "before the step's start at 0" in one_line(e)


def test_class11_a_rope_scaling_that_is_not_an_object_is_refused():
    config = {
        "model_type": "llama", "num_attention_heads": 32, "hidden_size": 4096,
        "num_hidden_layers": 2, "intermediate_size": 11008, "vocab_size": 32000,
        "max_position_embeddings": 4096, "rope_scaling": "linear",
    }
    with pytest.raises(pw.PipewrightError) as e:
        pw.Shape.from_hf_config(config)
    assert "rope_scaling" in one_line(e) and "an object" in str(e.value)


def test_class11_a_batch_that_does_not_split_into_microbatches_is_refused(tmp_path: Path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    import pipewright.torch as pwt

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
        timeout=timedelta(seconds=30),
    )
    try:
        path = tmp_path / "t.csv"
        path.write_text("0F0,1F0,0F1,1F1,1B0,0B0,1B1,0B1\n")
        tt = pwt.load(path)
        stages = pwt.pipeline_stages(tt, lambda s: torch.nn.Linear(2, 2))
        sched = pwt.schedule(tt, stages, loss_fn=torch.nn.functional.mse_loss)
        with pytest.raises(pwt.BatchError) as e:
            sched.step(torch.randn(3, 2), target=torch.randn(3, 2))
        msg = one_line(e)
        assert "batch of 3" in msg and "2 microbatches" in msg
        sched.step(torch.randn(4, 2), target=torch.randn(4, 2))  # 2 x 2: it runs
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_class8_a_width_whose_default_mlp_would_wrap_is_refused_not_a_panic(mlp):
    with pytest.raises(pw.PipewrightError) as e:
        pw.Shape(2, 2**62, 1, 1, 2, mlp=mlp)
    assert "pass 2^60" in one_line(e)
