//! A mixture of experts as a user asks for it (`--experts`, `--top-k`, `--expert-ffn`,
//! `--shared-experts`, `--shared-ffn`, `--dense-layers`, `--moe-every`, `--expert-groups`,
//! `--groups-per-token`; Python's keywords of
//! the same names), refused naming the fields, in each face's words.

use super::{GroupsError, MoeShape, RouteGroups};

/// The mixture's flags, as given (all `None`: a dense model).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeKinds {
    /// Routed experts of an MoE layer (`--experts`).
    pub experts: Option<u32>,
    /// Routed experts a token goes to (`--top-k`).
    pub top_k: Option<u32>,
    /// Hidden width of one routed expert (`--expert-ffn`; default: the dense MLP's width).
    pub expert_ffn: Option<u64>,
    /// Experts every token goes to (`--shared-experts`; default 0).
    pub shared_experts: Option<u32>,
    /// Hidden width of one shared expert (`--shared-ffn`; default: `--expert-ffn`).
    pub shared_ffn: Option<u64>,
    /// Dense layers before the first MoE layer (`--dense-layers`; default 0).
    pub dense_layers: Option<u32>,
    /// After the dense layers, one layer in this many is an MoE layer (`--moe-every`;
    /// default 1).
    pub every: Option<u32>,
    /// Groups the routed experts fall into for group-limited routing (`--expert-groups`,
    /// DeepSeek's `n_group`; default: none).
    pub expert_groups: Option<u32>,
    /// Groups a token's experts may come from (`--groups-per-token`, DeepSeek's
    /// `topk_group`).
    pub groups_per_token: Option<u32>,
}

impl MoeKinds {
    /// The fields given, in the library's words (`top_k`; as [`super::ShapeKinds::given`]
    /// names the other kinds').
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("experts", self.experts.is_some()),
            ("top_k", self.top_k.is_some()),
            ("expert_ffn", self.expert_ffn.is_some()),
            ("shared_experts", self.shared_experts.is_some()),
            ("shared_ffn", self.shared_ffn.is_some()),
            ("dense_layers", self.dense_layers.is_some()),
            ("moe_every", self.every.is_some()),
            ("expert_groups", self.expert_groups.is_some()),
            ("groups_per_token", self.groups_per_token.is_some()),
        ]
        .into_iter()
        .filter(|f| f.1)
        .map(|f| f.0)
        .collect()
    }

    /// The mixture of a model of `layers` layers whose dense MLP is `ffn` wide, or `None`
    /// where no flag of it is given; or why not, naming the fields (each face renders them).
    pub fn moe(&self, layers: u32, ffn: u64) -> Result<Option<MoeShape>, MoeError> {
        let Some(experts) = self.experts else {
            return match self.given().first() {
                Some(field) => Err(MoeError::WithoutExperts(field)),
                None => Ok(None),
            };
        };
        let Some(top_k) = self.top_k else {
            return Err(MoeError::NeedsTopK);
        };
        if experts == 0 || top_k == 0 {
            return Err(MoeError::Zero { experts, top_k });
        }
        if top_k > experts {
            return Err(MoeError::TopKAbove { experts, top_k });
        }
        let shared_experts = self.shared_experts.unwrap_or(0);
        if shared_experts == 0 && self.shared_ffn.is_some() {
            return Err(MoeError::SharedFfnAlone);
        }
        let expert_ffn = self.expert_ffn.unwrap_or(ffn);
        let widths = [
            ("expert_ffn", Some(expert_ffn)),
            ("shared_ffn", self.shared_ffn),
        ];
        for (field, w) in widths {
            match w {
                Some(0) => return Err(MoeError::WidthZero(field)),
                Some(w) if w >= 1 << 30 => return Err(MoeError::WidthTooLarge { field, w }),
                _ => {}
            }
        }
        let (dense_layers, every) = (self.dense_layers.unwrap_or(0), self.every.unwrap_or(1));
        if every == 0 {
            return Err(MoeError::EveryZero);
        }
        let route_groups = match (self.expert_groups, self.groups_per_token) {
            (None, None) => None,
            (Some(groups), Some(per_token)) => {
                let g = RouteGroups { groups, per_token };
                g.check(experts, top_k).map_err(MoeError::Groups)?;
                g.limiting()
            }
            (Some(_), None) => return Err(MoeError::GroupsPair("expert_groups")),
            (None, Some(_)) => return Err(MoeError::GroupsPair("groups_per_token")),
        };
        let moe = MoeShape {
            route_groups,
            experts,
            top_k,
            expert_ffn,
            shared_experts,
            shared_ffn: if shared_experts > 0 {
                self.shared_ffn.unwrap_or(expert_ffn)
            } else {
                0
            },
            shared_gate: false,
            router_bias: false,
            dense_layers,
            every,
        };
        if moe.moe_layers(layers) == 0 {
            return Err(MoeError::NoMoeLayer {
                dense_layers,
                every,
                layers,
            });
        }
        Ok(Some(moe))
    }
}

/// How a face writes a field, with the value given where the message shows it: the CLI's
/// `--top-k 5`, Python's `top_k=5`.
pub type FieldName<'a> = &'a dyn Fn(&str, Option<String>) -> String;

/// The command line's form of a field: `top_k` is `--top-k`, followed by its value.
pub fn flag_form(field: &str, value: Option<String>) -> String {
    let flag = format!("--{}", field.replace('_', "-"));
    match value {
        Some(v) => format!("{flag} {v}"),
        None => flag,
    }
}

/// A mixture of experts asked for that is not one, naming the fields (`experts`, `top_k`,
/// `expert_ffn`, `shared_experts`, `shared_ffn`, `dense_layers`, `moe_every`); each face
/// renders them in its words ([`MoeError::named`]). `Display` is the command line's.
#[derive(Clone, Debug, PartialEq)]
pub enum MoeError {
    /// A field of a mixture without `experts`.
    WithoutExperts(&'static str),
    /// `experts` without `top_k`.
    NeedsTopK,
    /// `experts` or `top_k` of 0.
    Zero {
        /// Routed experts asked for.
        experts: u32,
        /// Experts per token asked for.
        top_k: u32,
    },
    /// More experts per token than there are.
    TopKAbove {
        /// Routed experts asked for.
        experts: u32,
        /// Experts per token asked for.
        top_k: u32,
    },
    /// `shared_ffn` without shared experts.
    SharedFfnAlone,
    /// An expert's width of 0.
    WidthZero(&'static str),
    /// An expert's width past 2^30.
    WidthTooLarge {
        /// The width's field.
        field: &'static str,
        /// The width asked for.
        w: u64,
    },
    /// `moe_every` of 0.
    EveryZero,
    /// One of `expert_groups` and `groups_per_token` without the other (the one given).
    GroupsPair(&'static str),
    /// Groups that do not fit the experts or `top_k` ([`RouteGroups::check`]).
    Groups(GroupsError),
    /// No layer left an MoE layer.
    NoMoeLayer {
        /// Dense layers first.
        dense_layers: u32,
        /// One layer in this many after them.
        every: u32,
        /// The model's layers.
        layers: u32,
    },
}

impl MoeError {
    /// The message with each field written as `name` writes it (see [`flag_form`]).
    pub fn named(&self, name: FieldName<'_>) -> String {
        let bare = |f: &str| name(f, None);
        let with = |f: &str, v: &dyn std::fmt::Display| name(f, Some(v.to_string()));
        match self {
            MoeError::WithoutExperts(field) => format!(
                "{} describes a mixture of experts: also give {}",
                bare(field),
                bare("experts")
            ),
            MoeError::NeedsTopK => format!(
                "{} needs {} (the routed experts each token goes to)",
                bare("experts"),
                bare("top_k")
            ),
            MoeError::Zero { experts, top_k } => format!(
                "{} and {} must be at least 1",
                with("experts", experts),
                with("top_k", top_k)
            ),
            MoeError::TopKAbove { experts, top_k } => format!(
                "{} must be at most {}",
                with("top_k", top_k),
                with("experts", experts)
            ),
            MoeError::SharedFfnAlone => format!(
                "{} is the width of a shared expert: also give {}",
                bare("shared_ffn"),
                bare("shared_experts")
            ),
            MoeError::WidthZero(field) => format!("{} must be at least 1", bare(field)),
            MoeError::WidthTooLarge { field, w } => {
                format!("{} is too large: at most 2^30", with(field, w))
            }
            MoeError::EveryZero => format!("{} must be at least 1", bare("moe_every")),
            MoeError::GroupsPair(given) => {
                let other = if *given == "expert_groups" {
                    "groups_per_token"
                } else {
                    "expert_groups"
                };
                format!(
                    "{} needs {} (group-limited routing takes both)",
                    bare(given),
                    bare(other)
                )
            }
            MoeError::Groups(e) => groups_message(name, e),
            MoeError::NoMoeLayer {
                dense_layers,
                every,
                layers,
            } => format!(
                "{} and {} leave none of the {} an MoE layer",
                with("dense_layers", dense_layers),
                with("moe_every", every),
                with("layers", layers)
            ),
        }
    }
}

/// Why the groups do not fit, in a face's words (the same check's [`GroupsError`]).
fn groups_message(name: FieldName<'_>, e: &GroupsError) -> String {
    let with = |f: &str, v: u32| name(f, Some(v.to_string()));
    match *e {
        GroupsError::Zero { groups, per_token } => format!(
            "{} and {} must be at least 1",
            with("expert_groups", groups),
            with("groups_per_token", per_token)
        ),
        GroupsError::Divide { groups, experts } => format!(
            "{} must divide {}",
            with("expert_groups", groups),
            with("experts", experts)
        ),
        GroupsError::Above { groups, per_token } => format!(
            "{} must be at most {}",
            with("groups_per_token", per_token),
            with("expert_groups", groups)
        ),
        GroupsError::TooFew {
            top_k,
            per_token,
            per_group,
        } => format!(
            "{} is more than the {} experts of {} groups of {per_group}",
            with("top_k", top_k),
            u64::from(per_token) * u64::from(per_group),
            with("groups_per_token", per_token)
        ),
    }
}

impl std::fmt::Display for MoeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.named(&flag_form))
    }
}

impl std::error::Error for MoeError {}
