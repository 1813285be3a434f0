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

/// How a face writes where a file of a kind is given, from the field that takes it
/// ([`FileKind::field`]): the CLI's `give it as --cost-file`, Python's `read it with
/// Costs.read`.
pub type Hint<'a> = &'a dyn Fn(&str) -> String;

/// The command line's hint for `field`: its flag, after the one command that reads it where
/// others do not (`plan --cluster`); a timeline is drawn, not given.
pub fn flag_hint(field: &str) -> String {
    match field {
        "timeline" => "draw it with viz --from".into(),
        "cluster" | "profile" => format!("give it as plan --{field}"),
        f => format!("give it as --{}", f.replace('_', "-")),
    }
}

impl FileKind {
    /// The field a file of this kind is given as (`timetable`, `timeline`, `cost_file`,
    /// `cluster`, `profile`, `hf_config`), `None` for a kind pipewright does not read.
    pub fn field(self) -> Option<&'static str> {
        match self {
            FileKind::Timetable => Some("timetable"),
            FileKind::Timeline => Some("timeline"),
            FileKind::CostFile => Some("cost_file"),
            FileKind::Cluster => Some("cluster"),
            FileKind::LayerProfile => Some("profile"),
            FileKind::HfConfig => Some("hf_config"),
            FileKind::OtherJson | FileKind::Text => None,
        }
    }

    /// What the file is, with the flag that reads it (the command line's words).
    pub fn describe(self) -> String {
        self.describe_named(&flag_hint)
    }

    /// What the file is, with where it is given as `hint` writes it: the CLI's
    /// `a cost file (give it as --cost-file)`.
    pub fn describe_named(self, hint: Hint<'_>) -> String {
        let what = match self {
            FileKind::HfConfig => "a Hugging Face config",
            FileKind::OtherJson => "JSON of no kind pipewright reads",
            FileKind::Text => "not JSON",
            k => k.with_article(),
        };
        match self.field() {
            Some(f) => format!("{what} ({})", hint(f)),
            None => what.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The hint names the field that takes the file, each face its way: the command line's
    /// flag (its words unchanged), or another face's.
    #[test]
    fn a_hint_names_the_field_each_face_writes_its_way() {
        let (costs, timeline) = (r#"{"default": {}}"#, r#"{"events": []}"#);
        let err = |text: &str| crate::expect_kind("f.json", text, FileKind::Timetable);
        let e = err(costs).unwrap_err();
        assert_eq!(
            e.to_string(),
            "f.json is a cost file (give it as --cost-file), not a timetable"
        );
        let python = |f: &str| format!("give it as {f}=");
        assert_eq!(
            e.named(&python),
            "f.json is a cost file (give it as cost_file=), not a timetable"
        );
        let e = err(timeline).unwrap_err().to_string();
        assert_eq!(
            e,
            "f.json is a timeline (draw it with viz --from), not a timetable"
        );
        let cluster = crate::expect_kind("c", r#"{"gpus_per_node": 8}"#, FileKind::CostFile);
        assert!(cluster
            .unwrap_err()
            .to_string()
            .contains("(give it as plan --cluster)"));
        assert_eq!(
            FileKind::OtherJson.describe(),
            "JSON of no kind pipewright reads"
        );
    }
}
