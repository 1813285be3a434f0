//! `Shape` (a GPT's shape, by sizes and kinds or from a Hugging Face config) and the memory
//! model's keywords of `simulate` and `search`. Every check is the schedule crate's
//! (`shape::request`, `memory::request`), the CLI's words included.

use std::path::PathBuf;

use pipewright_input::{expect_kind, FileKind};
use pipewright_model::memory::{MemoryBreakdown, MemoryRequest};
use pipewright_model::shape::request::describe;
use pipewright_model::shape::{
    AttentionKind, MoeKinds, Named, ResolvedShape, RopeTheta, ShapeKinds, ShapeRequest,
};
use pipewright_plan::Precision;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{err, read_file, to_py};

/// A file's text named by its path, JSON text named `what`, or a dict as its JSON: how a
/// config or a profile is handed over (`"config.json"`, `'{"model_type": ...}'`, `{...}`).
pub(crate) fn named_text(obj: &Bound<'_, PyAny>, what: &str, want: FileKind) -> PyResult<Named> {
    let named = raw_named_text(obj, what)?;
    // Another kind of pipewright file (or a config where a profile is wanted) is named for
    // what it is.
    expect_kind(&named.name, &named.text, want).map_err(crate::input_err)?;
    Ok(named)
}

fn raw_named_text(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Named> {
    if obj.is_instance_of::<PyDict>() {
        let text = crate::json_text(obj)?;
        return Ok(Named {
            name: what.to_string(),
            text,
        });
    }
    // A str that is not UTF-8 (a file name Python decoded with surrogates) is a path.
    if let Ok(s) = obj.extract::<String>() {
        if s.trim_start().starts_with('{') {
            return Ok(Named {
                name: what.to_string(),
                text: s,
            });
        }
    }
    let path: PathBuf = obj.extract().map_err(|_| {
        let ty = obj
            .get_type()
            .name()
            .map_or_else(|_| "?".into(), |n| n.to_string());
        err(format!(
            "{what}: give a file's path, JSON text or a dict, not {ty}"
        ))
    })?;
    let name = path.display().to_string();
    Ok(Named {
        text: read_file(&path)?,
        name,
    })
}

/// [`keyword`], but a config is `Shape.from_hf_config`'s `config=`, not `plan`'s `hf_config=`.
fn config_keyword(field: &str, value: Option<String>) -> String {
    match field {
        "hf_config" => keyword("config", value),
        f => keyword(f, value),
    }
}

/// Python's form of a field a library error names: `top_k=5`, or `top_k=` without a value;
/// a switch the CLI turns on by its flag alone (`--sequence-parallel`) is `=True`.
pub(crate) fn keyword(field: &str, value: Option<String>) -> String {
    const SWITCHES: [&str; 4] = [
        "sequence_parallel",
        "allow_cross_node_tp",
        "tied_embeddings",
        "fp8",
    ];
    match value {
        None if SWITCHES.contains(&field) => format!("{field}=True"),
        value => format!("{field}={}", value.unwrap_or_default()),
    }
}

/// A kind by its name, in the schedule crate's words when it is none.
pub(crate) fn kind<T: std::str::FromStr<Err = String>>(s: Option<&str>) -> PyResult<Option<T>> {
    s.map(|s| s.parse::<T>().map_err(err)).transpose()
}

/// The kinds from their keywords: sizes (`ffn`, `kv_heads`, `rope_theta`), words (`mlp`,
/// `norm`, `positions`, `bias`) and `tied_embeddings`.
pub(crate) fn kinds(
    (ffn, kv_heads, rope_theta): (Option<u64>, Option<u32>, Option<f64>),
    (mlp, norm, positions, bias): (Option<&str>, Option<&str>, Option<&str>, Option<&str>),
    tied_embeddings: bool,
) -> PyResult<ShapeKinds> {
    Ok(ShapeKinds {
        ffn,
        kv_heads,
        mlp: kind(mlp)?,
        norm: kind(norm)?,
        tied_embeddings,
        positions: kind(positions)?,
        rope_theta: rope_theta.map(RopeTheta::new).transpose().map_err(err)?,
        bias: kind(bias)?,
        moe: Default::default(),
    })
}

/// A decoder-only transformer's shape: sizes and kinds (the reference GPT's, GPT-2's, unless
/// given), or a Hugging Face config read by `Shape.from_hf_config`. What the memory model of
/// `simulate` and `search` reads (`shape=`).
#[pyclass(module = "pipewright", frozen)]
#[derive(Clone)]
pub struct Shape {
    pub(crate) request: ShapeRequest,
    pub(crate) resolved: ResolvedShape,
}

impl Shape {
    fn of(request: ShapeRequest) -> PyResult<Self> {
        let resolved = request.resolve().map_err(|e| err(e.named(&keyword)))?;
        Ok(Shape { request, resolved })
    }
}

#[pymethods]
impl Shape {
    /// A shape by its sizes and kinds, checked as `pipewright simulate --layers ...` checks
    /// it (the same words).
    #[new]
    #[pyo3(signature = (layers, d_model, heads, seq_len, vocab, *, ffn = None, kv_heads = None, mlp = None, norm = None, tied_embeddings = false, positions = None, rope_theta = None, bias = None, experts = None, top_k = None, expert_ffn = None, shared_experts = None, shared_ffn = None, dense_layers = None, moe_every = None, expert_groups = None, groups_per_token = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = crate::args::whole)] layers: u32,
        #[pyo3(from_py_with = crate::args::whole)] d_model: u64,
        #[pyo3(from_py_with = crate::args::whole)] heads: u32,
        #[pyo3(from_py_with = crate::args::whole)] seq_len: u64,
        #[pyo3(from_py_with = crate::args::whole)] vocab: u64,
        #[pyo3(from_py_with = crate::args::opt_whole)] ffn: Option<u64>,
        #[pyo3(from_py_with = crate::args::opt_whole)] kv_heads: Option<u32>,
        mlp: Option<&str>,
        norm: Option<&str>,
        tied_embeddings: bool,
        positions: Option<&str>,
        #[pyo3(from_py_with = crate::args::opt_real)] rope_theta: Option<f64>,
        bias: Option<&str>,
        #[pyo3(from_py_with = crate::args::opt_whole)] experts: Option<u32>,
        #[pyo3(from_py_with = crate::args::opt_whole)] top_k: Option<u32>,
        #[pyo3(from_py_with = crate::args::opt_whole)] expert_ffn: Option<u64>,
        #[pyo3(from_py_with = crate::args::opt_whole)] shared_experts: Option<u32>,
        #[pyo3(from_py_with = crate::args::opt_whole)] shared_ffn: Option<u64>,
        #[pyo3(from_py_with = crate::args::opt_whole)] dense_layers: Option<u32>,
        #[pyo3(from_py_with = crate::args::opt_whole)] moe_every: Option<u32>,
        #[pyo3(from_py_with = crate::args::opt_whole)] expert_groups: Option<u32>,
        #[pyo3(from_py_with = crate::args::opt_whole)] groups_per_token: Option<u32>,
    ) -> PyResult<Self> {
        let kinds = ShapeKinds {
            moe: MoeKinds {
                experts,
                top_k,
                expert_ffn,
                shared_experts,
                shared_ffn,
                dense_layers,
                every: moe_every,
                expert_groups,
                groups_per_token,
            },
            ..kinds(
                (ffn, kv_heads, rope_theta),
                (mlp, norm, positions, bias),
                tied_embeddings,
            )?
        };
        Shape::of(ShapeRequest {
            layers: Some(layers),
            d_model: Some(d_model),
            heads: Some(heads),
            seq_len: Some(seq_len),
            vocab: Some(vocab),
            kinds,
            hf_config: None,
        })
    }

    /// The shape of a Hugging Face config.json (a path, its text, or its dict; llama,
    /// mistral, qwen2, gpt2, gpt_neox, mixtral, qwen2_moe, qwen3_moe, deepseek_v3), as
    /// `--hf-config` reads it; `seq_len` replaces the
    /// context it was pretrained at. `notes` says how it was read.
    #[staticmethod]
    #[pyo3(signature = (config, seq_len = None))]
    fn from_hf_config(
        config: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::args::opt_whole)] seq_len: Option<u64>,
    ) -> PyResult<Self> {
        let request = ShapeRequest {
            seq_len,
            hf_config: Some(named_text(config, "config", FileKind::HfConfig)?),
            ..ShapeRequest::default()
        };
        let resolved = request
            .resolve()
            .map_err(|e| err(e.named(&config_keyword)))?;
        Ok(Shape { request, resolved })
    }

    /// Transformer blocks.
    #[getter]
    fn layers(&self) -> u32 {
        self.resolved.shape.layers
    }

    /// Width of the residual stream.
    #[getter]
    fn d_model(&self) -> u64 {
        self.resolved.shape.d_model
    }

    /// Query heads.
    #[getter]
    fn heads(&self) -> u32 {
        self.resolved.shape.heads
    }

    /// Key/value heads.
    #[getter]
    fn kv_heads(&self) -> u32 {
        self.resolved.shape.kv_heads
    }

    /// MLP hidden width.
    #[getter]
    fn ffn(&self) -> u64 {
        self.resolved.shape.ffn
    }

    /// Tokens per sequence.
    #[getter]
    fn seq_len(&self) -> u64 {
        self.resolved.shape.seq_len
    }

    /// Vocabulary size.
    #[getter]
    fn vocab(&self) -> u64 {
        self.resolved.shape.vocab
    }

    /// Parameters of the model, each counted once (a tied embedding once), every expert of
    /// a mixture counted.
    #[getter]
    fn parameters(&self) -> u64 {
        self.resolved.shape.parameters()
    }

    /// Parameters one token's forward uses: of a mixture of experts, the `top_k` routed
    /// experts and the shared ones only; `parameters` for a dense model.
    #[getter]
    fn active_parameters(&self) -> u64 {
        self.resolved.shape.active_parameters()
    }

    /// How a config was read (where its sequence length came from, what is not modelled),
    /// the notes `--hf-config` prints, its fields written as keywords (`config=PATH`);
    /// empty for a shape given by sizes.
    #[getter]
    fn notes(&self) -> Vec<String> {
        let notes = self.resolved.notes.iter();
        notes.map(|n| n.named(&config_keyword)).collect()
    }

    /// Every size and kind, as a dict (the model description's JSON).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_py(py, &self.resolved.shape)
    }

    fn __eq__(&self, other: &Self) -> bool {
        self.resolved.shape == other.resolved.shape
    }

    fn __repr__(&self) -> String {
        let s = &self.resolved.shape;
        format!(
            "Shape({}; {:.3}B parameters)",
            describe(s),
            s.parameters() as f64 / 1e9
        )
    }
}

/// The memory model's request from `simulate`'s and `search`'s keywords (the CLI's memory
/// flags, by the same names).
#[allow(clippy::too_many_arguments)]
pub(crate) fn memory_request(
    shape: Option<&Shape>,
    tp: Option<u32>,
    dp: Option<u32>,
    zero: Option<u8>,
    microbatch_size: Option<u64>,
    sequence_parallel: bool,
    precision: Option<&str>,
    accounting: Option<&str>,
    attention: Option<&str>,
) -> PyResult<MemoryRequest> {
    if shape.is_none() {
        // The schedule crate would name the CLI's five size flags; Python's is `shape=`.
        let given = [
            ("tp", tp.is_some()),
            ("dp", dp.is_some()),
            ("zero", zero.is_some()),
            ("microbatch_size", microbatch_size.is_some()),
            ("sequence_parallel", sequence_parallel),
            ("precision", precision.is_some()),
            ("accounting", accounting.is_some()),
            ("attention", attention.is_some()),
        ];
        if let Some((name, _)) = given.iter().find(|g| g.1) {
            return Err(err(format!(
                "{name} is for the memory model, which needs the model's shape: also give shape=pipewright.Shape(...) (or Shape.from_hf_config(...))"
            )));
        }
    }
    Ok(MemoryRequest {
        shape: shape.map(|s| s.request.clone()).unwrap_or_default(),
        attention: kind::<AttentionKind>(attention)?,
        microbatch_size,
        tp,
        dp,
        zero,
        sequence_parallel,
        precision: kind::<Precision>(precision)?.map(Into::into),
        accounting: kind(accounting)?,
    })
}

/// Each device's predicted memory as a list of `MemoryPeak` (bytes by category, `total`).
pub(crate) fn memory_to_py(
    py: Python<'_>,
    memory: Option<&[MemoryBreakdown]>,
) -> PyResult<Option<Py<PyAny>>> {
    let Some(devices) = memory else {
        return Ok(None);
    };
    let list = pyo3::types::PyList::new(py, crate::results::peaks(devices))?;
    Ok(Some(list.into_any().unbind()))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Shape>()?;
    Ok(())
}
