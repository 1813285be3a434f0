"""The package against the CLI: the same request gives the same answer, and the same mistake
the same one line (`pipewright` is $PIPEWRIGHT_BIN, else the newest build in target/)."""

import json
import re

import pytest

import pipewright as pw
from torch_launch import REPO, cli

# A Llama-shaped GPT, small: grouped-query attention, SwiGLU, RMSNorm, rotary positions of
# Llama 3's base, no biases.
LLAMA = dict(layers=4, d_model=256, heads=8, seq_len=256, vocab=1024, ffn=688, kv_heads=2,
             mlp="swiglu", norm="rmsnorm", positions="rotary", rope_theta=500000.0, bias="none")
# A plan searches no timetable here: its figures are then the same in every run.
PLAN = dict(gpus=8, global_batch=32, max_searched=0)


def flags(**kwargs) -> list[str]:
    """Keywords as the CLI's flags of the same names (`True` a bare flag)."""
    out = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return out


def cli_json(*args: str) -> dict:
    return json.loads(cli(*args, "--format", "json").stdout)


def same_plan(ours: dict, theirs: dict) -> None:
    """Two plans' JSON, alike but for the seconds each took."""
    ours, theirs = dict(ours), dict(theirs)
    assert ours.pop("seconds") >= 0 and theirs.pop("seconds") >= 0
    assert ours == theirs


def refused(match: str, call, *args, **kwargs) -> str:
    """`call` refuses with one line starting as `match` does."""
    with pytest.raises(pw.PipewrightError) as e:
        call(*args, **kwargs)
    line = str(e.value)
    assert "\n" not in line and line.startswith(match), line
    return line


def cli_error(*args: str) -> str:
    """The one line the CLI prints after `error:` when it refuses `args`."""
    done = cli(*args, check=False)
    assert done.returncode != 0
    lines = [l for l in done.stderr.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1, done.stderr
    return lines[0].removeprefix("error: ")


def small_llama(tmp_path):
    """The committed Llama 3 8B config.json with its sizes made small, every other field as
    published; its path, and the same model as sizes and kinds."""
    config = json.loads((REPO / "model/tests/fixtures/hf/llama3-8b.json").read_text())
    small = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=160, vocab_size=128,
                 max_position_embeddings=32)
    for field, value in small.items():
        assert field in config, field
        config[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    kinds = dict(layers=2, d_model=64, heads=4, seq_len=32, vocab=128, ffn=160, kv_heads=2,
                 mlp="swiglu", norm="rmsnorm", positions="rotary", rope_theta=500000.0,
                 bias="none")
    return path, config, kinds


def test_a_llama_plan_from_kinds_is_the_clis():
    for extra in [{}, dict(attention="fused", precision="f32", tp=2, recompute="selective"),
                  dict(tied_embeddings=True, schedule="zbv", zero=1)]:
        plan = pw.plan(**LLAMA, **PLAN, **extra)
        same_plan(plan.to_dict(), cli_json("plan", *flags(**LLAMA, **PLAN, **extra)))
        assert plan.to_dict()["model"]["kv_heads"] == 2 and plan.notes == []
        assert plan.parameters == plan.to_dict()["model"]["parameters"]
        assert "swiglu" in plan.model and "rmsnorm" in plan.model
        line = plan.launch()
        assert line == plan.to_dict()["launch"]
        for flag in ["--kv-heads 2", "--mlp swiglu", "--norm rmsnorm",
                     "--positions rotary --rope-theta 500000", "--bias none"]:
            assert flag in line, line


def test_a_plans_chart_and_timetable_are_the_clis(tmp_path):
    plan = pw.plan(**LLAMA, **PLAN, recompute="selective", pp=2, schedule="1f1b")
    cli("plan", *flags(**LLAMA, **PLAN, recompute="selective", pp=2, schedule="1f1b"),
        "--chart", str(tmp_path / "best.svg"))
    assert plan.chart().data == (tmp_path / "best.svg").read_bytes()
    assert plan.chart("png", width=600).data[:8] == b"\x89PNG\r\n\x1a\n"
    # The best's timetable carries its recomputation to the memory model, as
    # `simulate --recompute selective` does for the same family.
    cfg = plan.best["config"]
    ours = pw.simulate(plan.timetable, shape=pw.Shape(**LLAMA)).predicted_memory
    theirs = cli_json("simulate", "-p", str(cfg["pp"]), "-m", str(cfg["microbatches"]),
                      "--recompute", "selective", *flags(**LLAMA))["predicted_memory"]
    assert [{k: v for k, v in o.to_dict().items() if k != "total"} for o in ours] == theirs


def test_explain_names_the_dimensions_as_keywords():
    """`Plan.explain` is the CLI's `--explain` (its JSON's `explain`) with each dimension a
    keyword: `zero=0 instead of 1: ...` for `--zero 0 instead of 1: ...`, and `tp=, pp=: no
    other value was simulated` for `--tp, --pp: ...`."""
    p = pw.plan(**LLAMA, **PLAN)
    assert p.explain and not any("--" in line for line in p.explain)
    dims = ("tp", "pp", "schedule", "microbatch_size", "recompute", "zero", "sequence_parallel")
    assert any(line.startswith(tuple(f"{d}=" for d in dims)) for line in p.explain)
    assert any(": no other value was simulated" in line for line in p.explain)

    def cli_words(line: str) -> str:
        flag = lambda m: "--" + m[1].replace("_", "-")
        line = re.sub(r"^([a-z_]+)=(?=[^,:])", lambda m: flag(m) + " ", line)
        return re.sub(r"\b([a-z_]+)=(?=[,:])", flag, line)
    assert [cli_words(line) for line in p.explain] == p.to_dict()["explain"]


def test_a_llama_plan_from_its_hf_config_is_the_clis(tmp_path):
    path, config, kinds = small_llama(tmp_path)
    run = dict(gpus=2, global_batch=8, precision="f32", tp=2, max_searched=0)
    by_path = pw.plan(hf_config=path, **run)
    done = cli("plan", "--hf-config", str(path), *flags(**run), "--format", "json")
    same_plan(by_path.to_dict(), json.loads(done.stdout))
    # The notes on how the config was read are the CLI's, which it prints after the plan, in
    # keywords (`hf_config=PATH`, `seq_len=`) where the CLI writes flags.
    assert by_path.notes and all(n.startswith(f"note: hf_config={path}: ") for n in by_path.notes)
    assert not any("--" in n.replace(str(path), "") for n in by_path.notes)
    assert any(n.endswith("(seq_len= plans another)") for n in by_path.notes)
    flagged = [n.replace(f"hf_config={path}", f"--hf-config {path}")
               .replace("(seq_len= ", "(--seq-len ") for n in by_path.notes]
    assert all(n in done.stderr.splitlines() for n in flagged)
    # Its text, its dict and its sizes and kinds plan the same model the same way.
    for other in [pw.plan(hf_config=path.read_text(), **run), pw.plan(hf_config=config, **run),
                  pw.plan(**kinds, **run)]:
        same_plan(other.to_dict(), by_path.to_dict())
    # --seq-len alone may replace the context it was pretrained at.
    longer = pw.plan(hf_config=str(path), seq_len=64, **run)
    assert longer.to_dict()["model"]["seq_len"] == 64
    shape = pw.Shape.from_hf_config(path)
    assert shape == pw.Shape(**kinds) and shape.parameters == by_path.parameters
    assert (shape.layers, shape.kv_heads, shape.ffn) == (2, 2, 160)
    # The same notes, naming this method's `config=` where `plan` names `hf_config=`.
    assert shape.notes == [n.replace("hf_config=", "config=") for n in by_path.notes]
    assert pw.Shape.from_hf_config(config, seq_len=64).seq_len == 64


# A small mixture of experts: four routed experts, two a token, one shared, a dense layer first.
MOE = dict(layers=4, d_model=64, heads=4, seq_len=16, vocab=64, experts=4, top_k=2,
           shared_experts=1, dense_layers=1)


def as_flags(words: str) -> str:
    """Python's refusal with each `field=value` written as the CLI's `--field value`."""
    def flag(m: re.Match) -> str:
        name = "--" + m.group(1).replace("_", "-")
        # A switch (`sequence_parallel=True`) is its flag alone.
        return f"{name} {m.group(2)}" if m.group(2) not in ("", "True") else name
    return re.sub(r"\b([a-z_]+)=(\S*)", flag, words)


def test_a_mixture_plan_is_the_clis():
    plans = {}
    for extra in [{}, dict(ep=2, etp=1, capacity_factor=1.5), dict(ep=2, dispatcher="deepep")]:
        plan = pw.plan(**MOE, **PLAN, **extra)
        same_plan(plan.to_dict(), cli_json("plan", *flags(**MOE, **PLAN, **extra)))
        plans.setdefault(bool(extra), plan.to_dict())
    assert "--experts 4 --top-k 2" in plans[False]["launch"]
    # The expert layout and the capacity factor reach the plan: it is another plan.
    assert plans[True]["rows"] != plans[False]["rows"]


def test_a_mixture_plan_is_refused_in_the_keywords_words():
    dense = {k: v for k, v in MOE.items() if k in ("layers", "d_model", "heads", "seq_len",
                                                   "vocab")}
    cases = [
        (dict(**MOE, ep=3), "ep=3 must divide the model's 4 routed experts"),
        (dict(**dense, ep=2), "ep= applies to a mixture of experts"),
        (dict(**dense, etp=2), "etp= applies to a mixture of experts"),
        (dict(**dense, dispatcher="deepep"), "dispatcher= applies to a mixture of experts"),
        (dict(**MOE, ep=0), "ep= and etp= must be at least 1"),
        (dict(**MOE, capacity_factor=0.5), "capacity_factor=0.5: must be a finite number"),
        (dict(**dense, experts=4), "experts= needs top_k="),
    ]
    for kwargs, words in cases:
        line = refused(words, pw.plan, **kwargs, **PLAN)
        assert "--" not in line
        # The CLI says the same, the fields written as its flags.
        assert cli_error("plan", *flags(**kwargs, **PLAN)) == as_flags(line)


def test_a_profile_plan_is_the_clis(tmp_path):
    layer = {"f_ms": 4.0, "i_ms": 4.0, "w_ms": 3.0, "params": 1000, "param_bytes": 4000,
             "stash_bytes": 1 << 20, "weight_stash_bytes": 1 << 18, "output_bytes": 1 << 16}
    profile = {"version": 1, "microbatch_size": 4, "device": "test GPU", "layers": [layer] * 8}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    plan = pw.plan(profile=path, **PLAN)
    same_plan(plan.to_dict(), cli_json("plan", "--profile", str(path), *flags(**PLAN)))
    assert plan.to_dict()["batch_unit"] == "samples" and plan.parameters is None
    assert plan.launch() is not None
    words = cli_error("plan", "--profile", str(path), "--recompute", "selective", *flags(**PLAN))
    line = refused("recompute=selective: ", pw.plan, profile=path, recompute="selective", **PLAN)
    assert as_flags(line) == words


def test_plan_refuses_a_bad_request_in_the_keywords_words(tmp_path):
    # The library names fields: Python writes them as its keywords (`layers=`), the CLI as
    # its flags (`--layers`), in otherwise the same line.
    path, _, _ = small_llama(tmp_path)
    kv = {**LLAMA, "kv_heads": 3}
    cases = [
        (dict(**{**LLAMA, "positions": None}, **PLAN),
         "rope_theta= is the base of rotary positions: also give positions=rotary"),
        (dict(**LLAMA, gpus=8, global_batch=0), "global_batch= must be at least 1"),
        (dict(**kv, **PLAN), "kv_heads=3 must divide heads=8"),
        (dict(**LLAMA, **PLAN, pp=1, schedule="gpipe"),
         "schedule=gpipe with pp=1: one device runs every schedule"),
        (dict(**LLAMA, **PLAN, cluster="nowhere"), "cluster=nowhere: neither a preset"),
        (dict(**LLAMA, **PLAN, tp=3), "tp=3 cannot split the 8 heads"),
    ]
    for kwargs, words in cases:
        line = refused(words, pw.plan, **kwargs)
        assert "--" not in line, line
        assert cli_error("plan", *flags(**kwargs)) == as_flags(line)
    # What the CLI's parser refuses before the request is built (a missing or out-of-range
    # flag, a size beside a config), Python refuses in the request's words.
    refused(f"hf_config={path} gives the model's shape: leave out layers= (seq_len= alone",
            pw.plan, hf_config=path, layers=2, **PLAN)
    refused("gpus= is required", pw.plan, **LLAMA, global_batch=8)
    assert "--" not in refused("zero=2: the ZeRO level is 0 or 1", pw.plan, **LLAMA, **PLAN,
                               zero=2)
    refused("profile=profile: ", pw.plan, profile={"version": 1}, **PLAN)
    # What the CLI's parser refuses before the request is built: the same value.
    for bad, words in [(dict(mlp="relu"), "relu"), (dict(norm="batchnorm"), "batchnorm")]:
        assert words in refused("", pw.plan, **{**LLAMA, **bad}, **PLAN)
    # The plan fixes one of the policies it searches; `every:N` is simulate's, not plan's.
    assert "`every:2`: expected none, selective or full" in cli_error(
        "plan", *flags(**LLAMA, **PLAN), "--recompute", "every:2")
    refused("recompute: `every:2`: expected none, selective or full", pw.plan, **LLAMA,
            recompute="every:2", **PLAN)
    nowhere = tmp_path / "missing.json"
    refused(f"cannot read {nowhere}", pw.plan, hf_config=nowhere, **PLAN)
    refused(f"{tmp_path} is a folder, not a file", pw.plan, hf_config=tmp_path, **PLAN)


def test_a_bad_timeline_is_refused_in_the_clis_words(tmp_path):
    good = pw.simulate(pw.generate("1f1b", p=2, m=1)).timeline
    events = json.loads(good.to_json())
    late = next(i for i, e in enumerate(events["events"])
                if e["device"] == 0 and e["action"]["kind"] == "B")
    overlap = json.loads(good.to_json())
    overlap["events"][late].update(start=0.5, end=2.5)
    elsewhere = json.loads(good.to_json())
    elsewhere["events"][0]["device"] = 5
    for name, bad, words in [("overlap.json", overlap, "device 0: 0B0 starts at 0.5"),
                             ("elsewhere.json", elsewhere, "event 0 (device 5"),
                             ("empty.json", {}, "")]:
        path = tmp_path / name
        path.write_text(json.dumps(bad))
        theirs = cli_error("viz", "--from", str(path), "-o", str(tmp_path / "x.svg"))
        assert words in theirs
        assert refused(str(path), pw.Timeline.read, path) == theirs
        # From text, the same words with the text called `json`.
        assert refused("json", pw.Timeline.from_json, json.dumps(bad)) == \
            theirs.replace(str(path), "json")
    assert not (tmp_path / "x.svg").exists()
    refused("json is a timetable", pw.Timeline.from_json, pw.generate("1f1b").to_json())


# A wrong kind of file's hint: the CLI's flag, Python's reader or keyword.
HINTS = {"draw it with viz --from": "read it with Timeline.read",
         "give it as --timetable": "read it with Timetable.read",
         "give it as --cost-file": "read it with Costs.read",
         "give it as plan --cluster": "give it as cluster=",
         "give it as plan --profile": "give it as profile=",
         "give it as --hf-config": "give it as hf_config="}


def test_a_file_of_another_kind_is_named_for_what_it_is(tmp_path):
    timeline = tmp_path / "t.json"
    pw.simulate(pw.generate("1f1b", p=2, m=2)).timeline.write(timeline)
    timetable = tmp_path / "tt.json"
    pw.generate("1f1b", p=2, m=2).write(timetable)
    for call, args in [(pw.Costs.read, ["simulate", "--cost-file", str(timeline)]),
                       (pw.Timetable.read, ["validate", str(timeline)]),
                       (pw.Timeline.read, ["viz", "--from", str(timetable)])]:
        path = timeline if "--from" not in args else timetable
        # The same line, its hint in Python's words: the class that reads such a file.
        ours, theirs = refused(f"{path} is a ", call, path), cli_error(*args)
        assert "--" not in ours.replace(str(path), "")
        for flag, words in HINTS.items():
            theirs = theirs.replace(flag, words)
        assert ours == theirs
    refused("costs is a timeline", pw.Costs.from_json, timeline.read_text())
    refused("json is a timeline", pw.Timetable.from_json, timeline.read_text())


def test_simulate_predicts_memory_as_the_clis_simulate():
    shape = pw.Shape(**LLAMA)
    mesh = dict(microbatch_size=2, precision="bf16", accounting="megatron", tp=2, dp=2, zero=1,
                sequence_parallel=True, attention="fused")
    for recompute in ["none", "selective", "0:full"]:
        tt = pw.generate("1f1b", p=4, m=8, recompute=recompute)
        for keywords in [dict(microbatch_size=2), mesh]:
            ours = pw.simulate(tt, shape=shape, **keywords).predicted_memory
            theirs = cli_json("simulate", "-p", "4", "-m", "8", "--recompute", recompute,
                              *flags(**LLAMA, **keywords))["predicted_memory"]
            assert len(ours) == 4
            for o, t in zip(ours, theirs):
                d = o.to_dict()
                assert d.pop("total") == o.total == sum(t.values()) and d == t
    steady = pw.simulate(pw.generate("1f1b", p=4, m=8), steps=3, shape=shape)
    assert steady.predicted_memory == steady.single.predicted_memory
    assert pw.simulate(tt).predicted_memory is None


def test_search_under_a_byte_cap_bounds_each_ranks_whole_memory():
    shape = pw.Shape(**LLAMA)
    found = pw.search(4, 8, "100MiB", shape=shape, time_budget=120)
    theirs = cli_json("search", "-p", "4", "-m", "8", "--memory-cap", "100MiB",
                      "--time-budget", "120", *flags(**LLAMA))
    assert found.cut_short is None and theirs["cut_short"] is None
    assert found.best["label"] == theirs["best"]["label"]
    assert found.best["makespan"] == pytest.approx(theirs["best"]["makespan"])
    totals = [d["total"] for d in found.predicted_memory]
    assert max(totals) <= 100 * 2**20 and found.simulation.predicted_memory is not None
    # A cap smaller than the weights' own memory: the CLI's words, the levers named as
    # keywords here (`tp`) and flags there (`--tp`).
    words = cli_error("search", "-p", "4", "-m", "8", "--memory-cap", "1MiB", *flags(**LLAMA))
    line = refused("a memory cap of 1048576 bytes per rank leaves nothing", pw.search, 4, 8,
                   "1MiB", shape=shape)
    assert line.endswith("(raise the cap, or shard more: tp, zero 1 with dp, more pipeline "
                         "devices)"), line
    assert re.sub(r"\b(tp|zero|dp)\b", r"--\1", line) == words


def test_memory_keywords_refuse_bad_input_in_one_line():
    tt = pw.generate("1f1b", p=4, m=8)
    shape = pw.Shape(**LLAMA)
    refused("tp is for the memory model, which needs the model's shape: also give shape=",
            pw.simulate, tt, tp=2)
    refused("accounting is for the memory model", pw.search, 4, 8, 4, accounting="megatron")
    refused("heads=7 must divide d_model=256", pw.Shape, **{**LLAMA, "heads": 7})
    refused("", pw.simulate, tt, shape=shape, precision="fp8")
    refused("", pw.simulate, tt, shape=shape, accounting="theirs")
    refused("", pw.simulate, tt, shape=shape, attention="sparse")
    words = cli_error("simulate", "-p", "4", "-m", "8", *flags(**LLAMA), "--tp", "3")
    assert refused("memory model: tp (3) must divide heads (8)", pw.simulate, tt, shape=shape,
                   tp=3) == words
    huge = pw.Shape(layers=4096, d_model=2**20, heads=8, seq_len=2**20, vocab=2**20)
    refused("the memory model's figures for 4096 layers", pw.simulate, tt, shape=huge)


def test_what_this_machine_cannot_hold_is_refused_before_it_is_built():
    # Each far beyond any machine (hundreds of GiB or more): refused in one line with the
    # figure, as the CLI refuses it, instead of being killed for memory.
    for call, args in [
        (lambda: pw.generate("1f1b", p=64, m=4_000_000), ["schedule", "-p", "64", "-m", "4000000"]),
        (lambda: pw.search(64, 4_000_000, 4), ["search", "-p", "64", "-m", "4000000",
                                                "--memory-cap", "4"]),
        (lambda: pw.sweep(64, [4_000_000]), ["sweep", "-p", "64", "--microbatches", "4000000"]),
    ]:
        words = cli_error(*args)
        assert "stage-microbatches" in words and "of memory, more than this machine's" in words
        assert refused("", call) == words
    # One step cap for both faces (pipewright-sim's SimulateRequest), each naming the field in
    # its own words; Python once had none and went by the machine's memory alone.
    for steps in (0, 100_000):
        words = cli_error("simulate", "--schedule", "1f1b", "-p", "8", "-m", "256",
                          "--steps", str(steps))
        assert words == f"--steps must be between 1 and 1000 (got {steps})"
        assert refused("", pw.simulate, pw.generate("1f1b", p=8, m=256), steps=steps) == \
            words.removeprefix("--")


def test_byte_arguments_take_the_clis_units():
    costs = pw.Costs(1, 2, activation_bytes="1MiB", p2p_bytes="2kB")
    assert costs.model_dict(1, 1)["stages"][0]["activation_bytes"] == 2**20
    assert pw.Costs(1, 2, activation_bytes=2**20, p2p_bytes=2000).model_dict(1, 1) == \
        costs.model_dict(1, 1)
    refused("activation_bytes: `lots` is not a byte count", pw.Costs, activation_bytes="lots")
    refused("p2p_bytes: `-1` is not a byte count", pw.Costs, p2p_bytes=-1)
    rows = pw.sweep(4, [8], schedules=["gpipe", "1f1b"], costs=costs, memory_cap="4MiB")
    assert [r.fits for r in rows] == [False, True]
    assert [r.fits for r in pw.sweep(4, [8], schedules=["gpipe", "1f1b"], costs=costs,
                                     memory_cap=4)] == [False, True]
    refused("", pw.sweep, 4, [8], memory_cap="4MiB")


def test_search_and_sweep_refuse_a_bad_request_in_the_clis_words():
    """One request type checks both faces' search and sweep: only the field's name differs."""
    cases = [
        (lambda: pw.search(4, 8, 4, max_virtual=0), "max_virtual", "--max-virtual",
         ("search", "--memory-cap", "4", "--max-virtual", "0")),
        (lambda: pw.search(4, 8, 4, time_budget=0), "time_budget", "--time-budget",
         ("search", "--memory-cap", "4", "--time-budget", "0")),
        (lambda: pw.search(4, 0, 4), "m", "--microbatches",
         ("search", "-m", "0", "--memory-cap", "4")),
        (lambda: pw.sweep(p=0), "p", "--stages", ("sweep", "-p", "0")),
        (lambda: pw.sweep(v=[0, 2]), "v", "--virtual", ("sweep", "-v", "0,2")),
        (lambda: pw.sweep(schedules=[]), "schedules", "--schedules",
         ("sweep", "--schedules", ",")),
    ]
    for call, ours, theirs, args in cases:
        line = refused(ours, call)
        assert line.replace(ours, theirs, 1) == cli_error(*args), (line, args)
    # Activation sizes live in Costs, not in a keyword of sweep or search: said so.
    for call in [lambda: pw.sweep(memory_cap="1GiB"), lambda: pw.search(4, 8, "1GiB")]:
        with pytest.raises(pw.PipewrightError) as e:
            call()
        line = str(e.value)
        assert "Costs(activation_bytes=...)" in line and "--" not in line, line
        assert "cost_file" not in line, line
