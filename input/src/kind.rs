//! What a file is, judged from its content, so that a file given where another kind is
//! wanted is named for what it is ("this is a cost file, not a timeline").

/// What a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A pipewright timetable (JSON).
    Timetable,
    /// A timeline (`simulate --timeline`, `train --trace`).
    Timeline,
    /// A cost file (`--cost-file`, `--costs-out`).
    CostFile,
    /// A cluster file (`plan --cluster`).
    Cluster,
    /// A layer profile (`plan --profile`).
    LayerProfile,
    /// A Hugging Face `config.json` (`--hf-config`).
    HfConfig,
    /// JSON of another kind.
    OtherJson,
    /// Not JSON: a PyTorch CSV timetable, or something else.
    Text,
}

impl FileKind {
    /// What the file is, with the flag that reads it.
    pub fn describe(self) -> &'static str {
        match self {
            FileKind::Timetable => "a timetable (give it as --timetable)",
            FileKind::Timeline => "a timeline (draw it with viz --from)",
            FileKind::CostFile => "a cost file (give it as --cost-file)",
            FileKind::Cluster => "a cluster file (give it as plan --cluster)",
            FileKind::LayerProfile => "a layer profile (give it as plan --profile)",
            FileKind::HfConfig => "a Hugging Face config (give it as --hf-config)",
            FileKind::OtherJson => "JSON of no kind pipewright reads",
            FileKind::Text => "not JSON",
        }
    }

    /// The kind with its article, as what a reader wanted.
    pub fn with_article(self) -> &'static str {
        match self {
            FileKind::Timetable => "a timetable",
            FileKind::Timeline => "a timeline",
            FileKind::CostFile => "a cost file",
            FileKind::Cluster => "a cluster file",
            FileKind::LayerProfile => "a layer profile",
            FileKind::HfConfig => "a Hugging Face config.json",
            FileKind::OtherJson => "JSON",
            FileKind::Text => "text",
        }
    }

    /// Judge JSON text by its top-level keys (the values are skipped, not built).
    pub fn of(text: &str) -> FileKind {
        type Keys = std::collections::HashMap<String, serde::de::IgnoredAny>;
        let Ok(map) = serde_json::from_str::<Keys>(text) else {
            return if text.trim_start().starts_with(['{', '[']) {
                FileKind::OtherJson
            } else {
                FileKind::Text
            };
        };
        let has = |k: &str| map.contains_key(k);
        if has("devices") && (has("stage_device") || has("microbatches")) {
            FileKind::Timetable
        } else if has("events") || has("meta") {
            FileKind::Timeline
        } else if ["default", "stages", "p2p_latency", "bandwidth", "time_unit"]
            .iter()
            .any(|k| has(k))
        {
            FileKind::CostFile
        } else if has("gpus_per_node") || (has("memory_gib") && has("peak_tflops")) {
            FileKind::Cluster
        } else if has("layers") && (has("version") || has("microbatch_size")) {
            FileKind::LayerProfile
        } else if has("model_type") || has("architectures") {
            FileKind::HfConfig
        } else {
            FileKind::OtherJson
        }
    }
}
