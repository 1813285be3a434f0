//! Requests as users give them (the CLI's flags, Python's keywords): one check and one set of
//! words for both faces, each error naming the flag.

use pipewright_model::memory::{Accounting, MemoryRequest};
use pipewright_model::shape::{MlpKind, Named, PositionKind, ShapeKinds, ShapeRequest};
use pipewright_plan::launch::{launch, model_line};
use pipewright_plan::{plan, Fixed, RawPlanRequest};
use pipewright_schedule::{generate, RecomputePlan, ScheduleKind, ScheduleSpec};

fn gpt(layers: u32, d_model: u64, heads: u32, seq_len: u64) -> ShapeRequest {
    ShapeRequest {
        layers: Some(layers),
        d_model: Some(d_model),
        heads: Some(heads),
        seq_len: Some(seq_len),
        ..ShapeRequest::default()
    }
}

fn request(shape: ShapeRequest) -> RawPlanRequest {
    RawPlanRequest {
        shape,
        gpus: Some(8),
        global_batch: Some(32),
        ..RawPlanRequest::default()
    }
}

fn refused(raw: &RawPlanRequest) -> String {
    raw.build().map(|_| ()).unwrap_err().to_string()
}

#[test]
fn a_plan_request_is_refused_naming_the_flag() {
    let mut raw = request(gpt(8, 512, 7, 512));
    assert_eq!(refused(&raw), "--heads 7 must divide --d-model 512");
    raw.shape.heads = None;
    assert_eq!(refused(&raw), "--heads is required");
    raw = request(gpt(8, 512, 8, 512));
    raw.shape.kinds.kv_heads = Some(3);
    assert_eq!(refused(&raw), "--kv-heads 3 must divide --heads 8");
    raw.shape.kinds = ShapeKinds {
        rope_theta: Some("500000".parse().unwrap()),
        ..ShapeKinds::default()
    };
    assert_eq!(
        refused(&raw),
        "--rope-theta is the base of rotary positions: also give --positions rotary"
    );
    raw = request(gpt(8, 512, 8, 512));
    raw.gpus = None;
    assert_eq!(refused(&raw), "--gpus is required");
    raw.gpus = Some(0);
    assert_eq!(refused(&raw), "--gpus must be at least 1");
    raw.gpus = Some(8);
    raw.fixed = Fixed {
        schedule: Some(ScheduleKind::Zbv),
        v: Some(3),
        ..Fixed::default()
    };
    assert_eq!(
        refused(&raw),
        "--v 3 contradicts --schedule zbv, which places exactly 2 stages on each device"
    );
    raw.fixed = Fixed {
        zero: Some(2),
        ..Fixed::default()
    };
    assert_eq!(
        refused(&raw),
        "--zero 2: the ZeRO level is 0 or 1 (ZeRO-2/3 do not fit a pipeline)"
    );
    raw.fixed = Fixed::default();
    raw.max_simulated = 0;
    assert!(refused(&raw).starts_with("--max-simulated 0: "));
    raw.max_simulated = 200;
    raw.cluster = "nowhere".into();
    assert_eq!(
        refused(&raw),
        "--cluster nowhere: neither a preset (a100-80g, h100-80g) nor a file"
    );
    raw.cluster_file = Some("{".into());
    assert!(refused(&raw).starts_with("--cluster nowhere: cluster file, line "));
}

#[test]
fn a_config_gives_the_shape_and_its_notes_and_nothing_may_stand_beside_it() {
    let llama = r#"{"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256,
        "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
        "vocab_size": 1000, "max_position_embeddings": 128}"#;
    let mut shape = ShapeRequest {
        hf_config: Some(Named {
            name: "config.json".into(),
            text: llama.into(),
        }),
        ..ShapeRequest::default()
    };
    let (req, notes) = request(shape.clone()).build().unwrap();
    let s = req.model.gpt().unwrap();
    assert_eq!((s.layers, s.kv_heads, s.mlp), (4, 2, MlpKind::SwiGlu));
    assert_eq!(s.positions, PositionKind::Rotary);
    // Each face writes the note's fields its way: the CLI's flags, Python's keywords.
    assert_eq!(
        notes[0].to_string(),
        "note: --hf-config config.json: sequence 128 from its max_position_embeddings (--seq-len plans another)"
    );
    assert_eq!(
        notes[0].named(&keyword),
        "note: hf_config=config.json: sequence 128 from its max_position_embeddings (seq_len= plans another)"
    );
    assert!(model_line(&req).contains(&format!("({:.2}B parameters)", s.parameters() as f64 / 1e9)));
    shape.seq_len = Some(64);
    let (req, notes) = request(shape.clone()).build().unwrap();
    assert_eq!((req.model.gpt().unwrap().seq_len, notes.len()), (64, 0));
    shape.kinds.kv_heads = Some(4);
    assert_eq!(
        refused(&request(shape.clone())),
        "--hf-config config.json gives the model's shape: leave out --kv-heads (--seq-len alone may replace its sequence length)"
    );
    shape.kinds.kv_heads = None;
    shape.hf_config.as_mut().unwrap().text = "{".into();
    assert!(refused(&request(shape)).starts_with("--hf-config config.json: line 1, column 1"));
}

#[test]
fn a_profile_stands_alone() {
    let mut raw = request(ShapeRequest::default());
    raw.profile = Some(Named {
        name: "p.json".into(),
        text: "{}".into(),
    });
    raw.fixed.tp = Some(2);
    assert_eq!(
        refused(&raw),
        "--profile p.json plans a layer-list model at the tp and sizes it was measured at: leave out --tp"
    );
    raw.fixed.tp = None;
    assert!(refused(&raw).starts_with("--profile p.json: "));
}

#[test]
fn the_launch_line_trains_the_planned_shape() {
    let mut shape = gpt(8, 512, 8, 512);
    shape.kinds.kv_heads = Some(2);
    let (req, _) = request(shape).build().unwrap();
    let found = plan(&req, &mut |_| {}).unwrap();
    let line = launch(&req, &found.rows[0], None);
    assert!(line.starts_with("mpirun -np 8 pipewright train --transport nccl --precision bf16 "));
    assert!(
        line.ends_with(
            "--layers 8 --d-model 512 --heads 8 --seq-len 512 --vocab 51200 --kv-heads 2"
        ),
        "{line}"
    );
}

#[test]
fn the_memory_model_needs_the_whole_shape_and_answers_with_it() {
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 4, 1, 8, None).unwrap());
    let none = RecomputePlan::default();
    let mut req = MemoryRequest {
        tp: Some(2),
        ..MemoryRequest::default()
    };
    assert_eq!(
        req.predict(&tt, &none).unwrap_err().to_string(),
        "--tp is for the memory model, which needs the model's shape: also give --layers, --d-model, --heads, --seq-len, --vocab (or --hf-config)"
    );
    req.shape = gpt(8, 256, 4, 128);
    req.shape.vocab = Some(1000);
    req.tp = Some(3);
    assert_eq!(
        req.predict(&tt, &none).unwrap_err().to_string(),
        "memory model: tp (3) must divide heads (4)"
    );
    req.tp = None;
    let devices = req.predict(&tt, &none).unwrap().unwrap();
    // 1F1B: the first device holds 4 microbatches in flight, the last only one.
    assert!(devices[0].activations > 3 * devices[3].activations);
    req.accounting = Some("megatron".parse::<Accounting>().unwrap());
    assert!(req.predict(&tt, &none).unwrap().is_some());
    assert!(MemoryRequest::default()
        .predict(&tt, &none)
        .unwrap()
        .is_none());
}

/// Python's form of a field: its keyword, with the value where the message shows one.
fn keyword(field: &str, value: Option<String>) -> String {
    format!("{field}={}", value.unwrap_or_default())
}

/// A change that spoils a request.
type Spoil = fn(&mut RawPlanRequest);

/// The same refusal in each face's words: the CLI's flags (`Display`) and Python's keywords
/// (`named`), from one error that names fields, not flags.
#[test]
fn a_refusal_names_fields_each_face_writes_its_way() {
    let both = |raw: &RawPlanRequest| {
        let e = raw.build().map(|_| ()).unwrap_err();
        (e.to_string(), e.named(&keyword))
    };
    let mut raw = request(gpt(8, 512, 7, 512));
    let cases: Vec<(Spoil, &str, &str)> = vec![
        (
            |_| {},
            "--heads 7 must divide --d-model 512",
            "heads=7 must divide d_model=512",
        ),
        (
            |r| r.shape.heads = None,
            "--heads is required",
            "heads= is required",
        ),
        (
            |r| {
                r.shape.heads = Some(8);
                r.shape.kinds.rope_theta = Some("500000".parse().unwrap());
            },
            "--rope-theta is the base of rotary positions: also give --positions rotary",
            "rope_theta= is the base of rotary positions: also give positions=rotary",
        ),
        (
            |r| {
                r.shape.kinds.rope_theta = None;
                r.global_batch = Some(0);
            },
            "--global-batch must be at least 1",
            "global_batch= must be at least 1",
        ),
        (
            |r| {
                r.global_batch = Some(32);
                r.fixed.zero = Some(2);
            },
            "--zero 2: the ZeRO level is 0 or 1 (ZeRO-2/3 do not fit a pipeline)",
            "zero=2: the ZeRO level is 0 or 1 (ZeRO-2/3 do not fit a pipeline)",
        ),
        (
            |r| r.fixed = Fixed { schedule: Some(ScheduleKind::Zbv), v: Some(3), ..Fixed::default() },
            "--v 3 contradicts --schedule zbv, which places exactly 2 stages on each device",
            "v=3 contradicts schedule=zbv, which places exactly 2 stages on each device",
        ),
        (
            |r| r.fixed = Fixed { schedule: Some(ScheduleKind::GPipe), pp: Some(1), ..Fixed::default() },
            "--schedule gpipe with --pp 1: one device runs every schedule as the same sequence of forwards and backwards; leave --schedule out, or give --pp 2 or more",
            "schedule=gpipe with pp=1: one device runs every schedule as the same sequence of forwards and backwards; leave schedule= out, or give pp=2 or more",
        ),
        (
            |r| {
                r.fixed = Fixed::default();
                r.cluster = "nowhere".into();
            },
            "--cluster nowhere: neither a preset (a100-80g, h100-80g) nor a file",
            "cluster=nowhere: neither a preset (a100-80g, h100-80g) nor a file",
        ),
        (
            |r| {
                r.cluster = "a100-80g".into();
                r.shape.hf_config = Some(Named { name: "c.json".into(), text: "{}".into() });
            },
            "--hf-config c.json gives the model's shape: leave out --layers (--seq-len alone may replace its sequence length)",
            "hf_config=c.json gives the model's shape: leave out layers= (seq_len= alone may replace its sequence length)",
        ),
        (
            |r| {
                r.shape = ShapeRequest::default();
                r.profile = Some(Named { name: "p.json".into(), text: "{}".into() });
                r.fixed.tp = Some(2);
            },
            "--profile p.json plans a layer-list model at the tp and sizes it was measured at: leave out --tp",
            "profile=p.json plans a layer-list model at the tp and sizes it was measured at: leave out tp=",
        ),
    ];
    for (change, cli, python) in cases {
        change(&mut raw);
        assert_eq!(both(&raw), (cli.to_string(), python.to_string()));
    }
    // The memory model's refusal likewise.
    let tt = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 1, 2, None).unwrap());
    let req = MemoryRequest {
        zero: Some(1),
        shape: ShapeRequest {
            layers: Some(2),
            ..ShapeRequest::default()
        },
        ..MemoryRequest::default()
    };
    let e = req.predict(&tt, &RecomputePlan::default()).unwrap_err();
    assert_eq!(
        e.named(&keyword),
        "layers= is for the memory model, which needs the model's shape: also give d_model=, heads=, seq_len=, vocab= (or hf_config=)"
    );
}

/// FP8 needs a cluster with an FP8 peak and a bf16 run, and times the linear layers' GEMMs
/// at that peak: a plan of the same model on H100s takes less time a step with it.
#[test]
fn fp8_is_refused_where_it_cannot_run_and_speeds_the_gemms_where_it_can() {
    let mut raw = request(gpt(8, 2048, 16, 2048));
    raw.fp8 = true;
    assert_eq!(
        refused(&raw),
        "--fp8 on --cluster a100-80g: the cluster has no FP8 peak (give peak_tflops.fp8 in a cluster file)"
    );
    raw.cluster = "h100-80g".into();
    raw.precision = "f32".parse().unwrap();
    assert_eq!(
        refused(&raw),
        "--fp8 runs the linear layers' GEMMs in FP8 beside bf16 activations: it takes --precision bf16, not --precision f32"
    );
    let python = |f: &str, v: Option<String>| format!("{f}={}", v.unwrap_or_default());
    let e = raw.build().map(|_| ()).unwrap_err().named(&python);
    assert!(e.starts_with("fp8= runs the linear"), "{e}");
    raw.precision = "bf16".parse().unwrap();
    let step = |fp8: bool| {
        let raw = RawPlanRequest { fp8, ..raw.clone() };
        let (req, _) = raw.build().unwrap();
        plan(&req, &mut |_| {}).unwrap().rows[0].step_time_s
    };
    let (bf16, fp8) = (step(false), step(true));
    // The GEMMs are most of a step; casts, attention's core and the rest are not halved.
    assert!(fp8 < 0.85 * bf16 && fp8 > 0.5 * bf16, "{fp8} vs {bf16}");
}
