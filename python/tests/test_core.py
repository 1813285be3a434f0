"""The package's functions and classes, each against what a user cares about: closed-form
bubbles, round trips, and refusals carrying the CLI's one line."""

import json

import pytest

import pipewright as pw


def test_error_is_a_value_error_with_the_clis_one_line():
    assert issubclass(pw.PipewrightError, ValueError)
    with pytest.raises(pw.PipewrightError) as e:
        pw.generate("zzz")
    assert str(e.value).startswith("unknown schedule `zzz` (known: gpipe, 1f1b")
    assert "\n" not in str(e.value)


def test_a_refusal_names_the_keywords_passed_not_the_clis_flags(tmp_path):
    # The libraries name fields; Python writes them as its keywords (the CLI as its flags).
    gpt = dict(layers=8, d_model=512, heads=8, seq_len=512, gpus=8, global_batch=32)
    cases = [
        (lambda: pw.plan(**gpt, zero=2),
         "zero=2: the ZeRO level is 0 or 1 (ZeRO-2/3 do not fit a pipeline)"),
        (lambda: pw.plan(**gpt, schedule="zbv", v=3),
         "v=3 contradicts schedule=zbv, which places exactly 2 stages on each device"),
        (lambda: pw.plan(**gpt, max_simulated=0),
         "max_simulated=0: at least 1 configuration must be simulated to rank any"),
        (lambda: pw.plan(**gpt, pp=3), "pp=3 fits no configuration of the other dimensions"),
        (lambda: pw.Shape(2, 64, 4, 16, 32, rope_theta=10000.0),
         "rope_theta= is the base of rotary positions: also give positions=rotary"),
        (lambda: pw.generate("1f1b", p=0), "p must be at least 1"),
        (lambda: pw.generate("gpipe", p=2, v=2), "gpipe places one stage per device, so v must"),
        (lambda: pw.Costs(1, 2, 3), "Costs: w = 3 is larger than b = 2"),
    ]
    for call, words in cases:
        with pytest.raises(pw.PipewrightError) as e:
            call()
        line = str(e.value)
        assert line.startswith(words) and "--" not in line, line
    # A switch to turn on is written as Python sets it.
    with pytest.raises(pw.PipewrightError) as e:
        pw.plan(layers=128, d_model=25600, heads=160, seq_len=2048, gpus=64, global_batch=64,
                tp=8, sequence_parallel=False, recompute="none")
    assert "recompute=full and sequence_parallel=True and" in str(e.value), str(e.value)
    # A config handed to `Shape.from_hf_config` is its `config=`.
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(pw.PipewrightError) as e:
        pw.Shape.from_hf_config(bad)
    assert str(e.value).startswith(f"config={bad}: "), str(e.value)


def test_generate_every_family_and_its_shape():
    for family, v in [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 3), ("looped-bfs", 2),
                      ("zb-h1", 1), ("zb-h2", 1), ("zbv", 2), ("dualpipev", 2)]:
        tt = pw.generate(family, p=4, v=v, m=8)
        assert (tt.name, tt.devices, tt.stages, tt.microbatches) == (family, 4, 4 * v, 8)
        assert len(tt.rows) == 4 and not tt.lowered
    v_shape = pw.generate("zbv", p=4, v=2, m=8).stage_device
    assert v_shape == [0, 1, 2, 3, 3, 2, 1, 0]
    with pytest.raises(pw.PipewrightError, match="^recompute: unknown recompute policy"):
        pw.generate("1f1b", recompute="sometimes")


def test_validate_proves_and_refuses_naming_device_and_step():
    tt = pw.generate("1f1b", p=2, m=4)
    v = pw.validate(tt)
    assert (v.compute_actions, v.lowered) == (16, False)
    assert pw.validate(tt.lower()).lowered
    # 1F1B's sends cross in the steady phase: blocking sends would deadlock, and it says so.
    with pytest.raises(pw.PipewrightError, match="deadlock: device 0 step 3"):
        pw.validate(tt.lower(), rendezvous=True)
    broken = pw.Timetable.from_csv("0F0,0B0\n1B0,1F0\n", validate=False)
    with pytest.raises(pw.PipewrightError, match="device 1, step 0"):
        pw.validate(broken)
    # Read with validation, the CSV's line and column are named, as `pipewright validate` does.
    with pytest.raises(pw.PipewrightError, match=r"^csv:2:1: device 1, step 0"):
        pw.Timetable.from_csv("0F0,0B0\n1B0,1F0\n")


def test_timetable_forms_round_trip(tmp_path):
    tt = pw.generate("zb-h1", p=4, m=8)
    for form in ["compute_only", "compute_comms"]:
        back = pw.Timetable.from_csv(tt.to_csv(form))
        assert back.csv_form == form and back.rows == tt.rows
    lowered = tt.lower()
    back = pw.Timetable.from_csv(lowered.to_csv("lowered"))
    assert back.csv_form == "lowered" and back.rows == lowered.rows
    assert pw.Timetable.from_json(tt.to_json()) == tt
    with pytest.raises(pw.PipewrightError, match="form `pytorch`"):
        tt.to_csv("pytorch")
    for name, comms in [("a.csv", False), ("b.csv", True), ("c.json", False)]:
        tt.write(tmp_path / name, comms=comms)
        assert pw.Timetable.read(tmp_path / name).rows == tt.rows
    assert "WAIT_SEND_F" in (tmp_path / "b.csv").read_text()
    with pytest.raises(pw.PipewrightError, match="comms=True applies to a .csv"):
        tt.write(tmp_path / "d.json", comms=True)
    with pytest.raises(pw.PipewrightError, match="use a .csv"):
        tt.write(tmp_path / "e.txt")
    assert not (tmp_path / "d.json").exists() and not (tmp_path / "e.txt").exists()
    assert len(tt) == 4 * 8 * 3 and "Timetable(" in repr(tt) and "dev 0" in tt.grid()
    assert tt.lower().compute_only() == tt


def test_simulate_one_step_gives_the_closed_form_bubble():
    p, v, m = 4, 2, 8
    sim = pw.simulate(pw.generate("interleaved-1f1b", p=p, v=v, m=m), pw.Costs(1.0, 2.0))
    assert sim.report.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)
    assert sim.report.ideal == pytest.approx(m * 3.0)
    assert len(sim.report.devices) == p and sim.report.to_dict()["makespan"] == sim.report.makespan
    assert sim.timeline.makespan == pytest.approx(sim.report.makespan)


def test_simulate_k_unfenced_steps_gives_the_steady_period():
    tt = pw.generate("1f1b", p=4, m=8)
    steady = pw.simulate(tt, steps=4)
    assert isinstance(steady, pw.SteadySimulation)
    assert steady.steps == 4 and len(steady.step_makespans) == 4
    assert steady.period <= steady.single_step_makespan + 1e-9
    assert set(steady.bubble.to_dict()) == {"single_step", "steady_state", "largest_span"}
    assert isinstance(steady.single, pw.Simulation)
    with pytest.raises(pw.PipewrightError):
        pw.simulate(tt, steps=0)


def test_costs_uniform_file_and_measured(tmp_path):
    with pytest.raises(pw.PipewrightError, match="w_memory = 1.5 is not a fraction"):
        pw.Costs(1, 2, w_memory=1.5)
    with pytest.raises(pw.PipewrightError, match="bandwidth must be"):
        pw.Costs(1, 2, bandwidth=0)
    text = json.dumps({"default": {"f": 1, "b": 2}, "stages": [{}, {"f": 2, "b": 4}]})
    costs = pw.Costs.from_json(text)
    tt = pw.generate("1f1b", p=2, m=4)
    assert pw.simulate(tt, costs).report.ideal == pytest.approx(4 * 6)
    (tmp_path / "c.json").write_text(text)
    assert pw.Costs.read(tmp_path / "c.json").model_dict(2, 2)["stages"][1]["f"] == 2
    with pytest.raises(pw.PipewrightError, match="cost file, line 1"):
        pw.Costs.from_json("{nope")
    # Costs measured from timelines feed the simulator again.
    timeline = pw.simulate(tt, costs).timeline
    measured = pw.Costs.from_timelines([timeline])
    again = pw.simulate(tt, measured)
    assert again.report.makespan == pytest.approx(pw.simulate(tt, costs).report.makespan)
    assert json.loads(measured.to_json())["stages"][1]["f"] == pytest.approx(2)
    uniform = json.loads(pw.Costs(1, 2).to_json(stages=4, devices=2))
    assert uniform["stages"][0]["f"] == pytest.approx(0.5)
    assert pw.Costs(3, 4).with_overrides(p2p_latency=0.5).model_dict(1, 1)["p2p_latency"] == 0.5


def test_timeline_json_chrome_trace_and_chart(tmp_path):
    tl = pw.simulate(pw.generate("1f1b", p=2, m=2)).timeline
    back = pw.Timeline.from_json(tl.to_json())
    assert len(back) == len(tl) == 16 and back.meta["devices"] == 2
    assert back.events[0].keys() >= {"device", "action", "start", "end"}
    tl.write(tmp_path / "t.json")
    assert len(pw.Timeline.read(tmp_path / "t.json")) == 16
    assert "traceEvents" in json.loads(tl.to_chrome_trace())
    assert 0 < tl.bubble_fraction < 1
    with pytest.raises(pw.PipewrightError, match="not a timeline JSON"):
        pw.Timeline.from_json("{}")


def test_charts_are_svg_or_png_bytes_that_show_in_a_notebook(tmp_path):
    sim = pw.simulate(pw.generate("zbv", p=4, v=2, m=8))
    svg = sim.chart()
    assert svg.format == "svg" and svg.data.startswith(b"<svg")
    assert svg._repr_svg_().startswith("<svg") and svg._repr_png_() is None
    png = sim.chart("png", width=800)
    assert png.data[:8] == b"\x89PNG\r\n\x1a\n" and png._repr_png_() == png.data
    assert sim._repr_svg_().startswith("<svg")
    png.save(tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes() == png.data
    with pytest.raises(pw.PipewrightError, match="this chart is png"):
        png.save(tmp_path / "c.svg")
    with pytest.raises(pw.PipewrightError, match="use svg or png"):
        sim.chart("gif")
    both = pw.chart([sim.timeline, sim.timeline], labels=["a", "b"])
    assert b">a<" in both.data and b">b<" in both.data
    with pytest.raises(pw.PipewrightError, match="one label per timeline"):
        pw.chart([sim.timeline], labels=["a", "b"])


def test_search_beats_or_matches_every_fixed_family_under_its_cap():
    found = pw.search(4, 8, memory_cap=4, costs=pw.Costs(1, 2), time_budget=10)
    best, fixed = found.best, found.best_fixed
    assert best["fits"] and best["peak_microbatches"] <= 4
    assert fixed is None or best["period"] <= fixed["period"] + 1e-9
    assert found.timetable.name.startswith("search: ")
    assert pw.validate(found.timetable)
    assert pw.simulate(found.timetable).report.makespan == pytest.approx(best["makespan"])
    assert found.front and found.candidates and found.cut_short is None
    assert found.chart().format == "svg" and found.pareto_chart("png").format == "png"
    with pytest.raises(pw.PipewrightError):
        pw.search(4, 8, memory_cap="lots")
    with pytest.raises(pw.PipewrightError, match="objective"):
        pw.search(4, 8, memory_cap=4, objective="fastest")


def test_sweep_rows_follow_the_closed_form():
    rows = pw.sweep(4, [4, 8], schedules=["gpipe", "interleaved-1f1b"], v=[2])
    assert [(r.schedule, r.virtual_stages, r.microbatches) for r in rows] == [
        ("gpipe", 1, 4), ("gpipe", 1, 8), ("interleaved-1f1b", 2, 4), ("interleaved-1f1b", 2, 8)]
    for r in rows:
        v, m = r.virtual_stages, r.microbatches
        assert r.error is None
        assert r.bubble_fraction == pytest.approx(3 / (v * m + 3))
    with pytest.raises(pw.PipewrightError, match="at least 1"):
        pw.sweep(4, [0])


def test_plan_ranks_configurations_and_hands_over_a_timetable():
    plan = pw.plan(layers=8, d_model=512, heads=8, seq_len=512, gpus=8, global_batch=32)
    assert len(plan) >= 1 and plan.rows[0] == plan.best
    cfg = plan.best["config"]
    assert cfg["tp"] * cfg["pp"] * cfg["dp"] == 8
    times = [r["step_time_s"] for r in plan.rows]
    assert times == sorted(times)
    tt = plan.timetable
    assert tt.devices == cfg["pp"] and tt.microbatches == cfg["microbatches"]
    fixed = pw.plan(layers=8, d_model=512, heads=8, seq_len=512, gpus=8, global_batch=32,
                    pp=4, schedule="1f1b")
    assert all(r["config"]["pp"] == 4 for r in fixed.rows)
    with pytest.raises(pw.PipewrightError, match="^heads=7 must divide d_model=512$"):
        pw.plan(layers=8, d_model=512, heads=7, seq_len=512, gpus=8, global_batch=32)
    with pytest.raises(pw.PipewrightError, match="^cluster=nowhere: neither a preset"):
        pw.plan(layers=8, d_model=512, heads=8, seq_len=512, gpus=8, global_batch=32,
                cluster="nowhere")


def test_the_stubs_name_every_export():
    import pathlib

    stubs = (pathlib.Path(pw.__file__).parent / "_native.pyi").read_text()
    assert (pathlib.Path(pw.__file__).parent / "py.typed").exists()
    for name in pw.__all__:
        if name != "__version__":
            assert f"class {name}" in stubs or f"def {name}(" in stubs, name


def test_search_hands_back_its_runners_up_and_refuses_a_count_it_does_not_keep():
    found = pw.search(4, 8, memory_cap=4, costs=pw.Costs(1, 2), time_budget=10)
    tts = found.timetables(3)
    assert len(tts) == 3 and tts[0].name == found.timetable.name
    assert len({t.to_csv() for t in tts}) == 3  # three different timetables
    for k in (0, 6):
        with pytest.raises(pw.PipewrightError) as e:
            found.timetables(k)
        assert f"k {k}: give 1 to 5" in str(e.value)
    fused = pw.search(4, 8, memory_cap=4, costs=pw.Costs(1, 2), time_budget=10,
                      split_backward=False)
    assert not any(c in t.to_csv() for t in fused.timetables(5) for c in "IW")
