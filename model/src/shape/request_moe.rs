//! A mixture of experts as a user asks for it (`--experts`, `--top-k`, `--expert-ffn`,
//! `--shared-experts`, `--shared-ffn`, `--dense-layers`, `--moe-every`; Python's keywords of
//! the same names), refused in the flags' words.

use super::MoeShape;

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
}

impl MoeKinds {
    /// The flags given, by name.
    pub fn given(&self) -> Vec<&'static str> {
        [
            ("--experts", self.experts.is_some()),
            ("--top-k", self.top_k.is_some()),
            ("--expert-ffn", self.expert_ffn.is_some()),
            ("--shared-experts", self.shared_experts.is_some()),
            ("--shared-ffn", self.shared_ffn.is_some()),
            ("--dense-layers", self.dense_layers.is_some()),
            ("--moe-every", self.every.is_some()),
        ]
        .into_iter()
        .filter(|f| f.1)
        .map(|f| f.0)
        .collect()
    }

    /// The mixture of a model of `layers` layers whose dense MLP is `ffn` wide, or `None`
    /// where no flag of it is given; or why not, in one line naming the flags.
    pub fn moe(&self, layers: u32, ffn: u64) -> Result<Option<MoeShape>, String> {
        let bad = Err;
        let Some(experts) = self.experts else {
            return match self.given().first() {
                Some(flag) => bad(format!(
                    "{flag} describes a mixture of experts: also give --experts"
                )),
                None => Ok(None),
            };
        };
        let Some(top_k) = self.top_k else {
            return bad("--experts needs --top-k (the routed experts each token goes to)".into());
        };
        if experts == 0 || top_k == 0 {
            return bad(format!(
                "--experts {experts} and --top-k {top_k} must be at least 1"
            ));
        }
        if top_k > experts {
            return bad(format!(
                "--top-k {top_k} must be at most --experts {experts}"
            ));
        }
        let shared_experts = self.shared_experts.unwrap_or(0);
        if shared_experts == 0 && self.shared_ffn.is_some() {
            return bad(
                "--shared-ffn is the width of a shared expert: also give --shared-experts".into(),
            );
        }
        let expert_ffn = self.expert_ffn.unwrap_or(ffn);
        let widths = [
            ("--expert-ffn", Some(expert_ffn)),
            ("--shared-ffn", self.shared_ffn),
        ];
        for (flag, w) in widths {
            match w {
                Some(0) => return bad(format!("{flag} must be at least 1")),
                Some(w) if w >= 1 << 30 => {
                    return bad(format!("{flag} {w} is too large: at most 2^30"))
                }
                _ => {}
            }
        }
        let (dense_layers, every) = (self.dense_layers.unwrap_or(0), self.every.unwrap_or(1));
        if every == 0 {
            return bad("--moe-every must be at least 1".into());
        }
        let moe = MoeShape {
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
            return bad(format!(
                "--dense-layers {dense_layers} and --moe-every {every} leave none of the --layers {layers} an MoE layer"
            ));
        }
        Ok(Some(moe))
    }
}
