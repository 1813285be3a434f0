//! The parts of a shape beyond a uniform dense block: a mixture of experts in place of the
//! MLP of some layers ([`MoeShape`]), and DeepSeek's multi-head latent attention in place of
//! the query/key/value projections ([`MlaShape`]). Each counts its parameters (all of them)
//! and the parameters a token's forward multiplies (the active ones: the top-k routed
//! experts and the shared ones), from which a layer's FLOPs follow.

use serde::{Deserialize, Serialize};

use super::ShapeError;

/// A mixture of experts (Shazeer et al. 2017; Mixtral, Qwen-MoE, DeepSeekMoE): in an MoE
/// layer the MLP is `experts` MLPs of width `expert_ffn` of which a router (a `d x experts`
/// matrix) picks `top_k` per token, beside `shared_experts` MLPs of width `shared_ffn` that
/// every token passes through. The experts are the shape's MLP kind (gated or not), without
/// biases.
///
/// Which layers: the first `dense_layers` keep the dense MLP (`ffn` wide; DeepSeek's
/// `first_k_dense_replace`); after them every `every`-th layer is an MoE layer, the last of
/// each group of `every` (Qwen-MoE's `decoder_sparse_step`; DeepSeek's `moe_layer_freq` where
/// it is 1), and the others dense.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MoeShape {
    /// Routed experts of an MoE layer.
    pub experts: u32,
    /// Routed experts each token goes to.
    pub top_k: u32,
    /// Hidden width of one routed expert.
    pub expert_ffn: u64,
    /// Experts every token goes to (DeepSeek's and Qwen2-MoE's shared experts), 0 for none.
    #[serde(default)]
    pub shared_experts: u32,
    /// Hidden width of one shared expert.
    #[serde(default)]
    pub shared_ffn: u64,
    /// Qwen2-MoE's gate on the shared experts' output: a `d -> 1` projection a layer.
    #[serde(default)]
    pub shared_gate: bool,
    /// DeepSeek-V3's router bias for load balancing (`e_score_correction_bias`): one number
    /// per expert a layer, used in choosing experts, not in the output.
    #[serde(default)]
    pub router_bias: bool,
    /// Dense layers before the first MoE layer.
    #[serde(default)]
    pub dense_layers: u32,
    /// After the dense layers, one layer in `every` is an MoE layer (1: all of them).
    #[serde(default = "one")]
    pub every: u32,
    /// Group-limited routing (DeepSeek's `n_group` and `topk_group`), `None` for a router
    /// that may pick any `top_k` experts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_groups: Option<RouteGroups>,
}

/// DeepSeek's group-limited routing (DeepSeek-V2 and V3, `n_group` and `topk_group`): the
/// routed experts are `groups` equal runs, and a token's `top_k` experts come from the
/// `per_token` groups its router scores highest. DeepSeek-V3 puts a group on a node, so a
/// token reaches at most `per_token` nodes (its report's "node-limited routing"), which is
/// what the dispatch's inter-node traffic depends on. It changes no parameter or FLOP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RouteGroups {
    /// Groups the routed experts fall into (`n_group`).
    pub groups: u32,
    /// Groups a token's experts may come from (`topk_group`).
    pub per_token: u32,
}

/// Why group-limited routing does not fit a mixture: one check ([`RouteGroups::check`]), which
/// each reader words its own way (the shape's fields, the flags or keywords, a config's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GroupsError {
    /// No groups, or none a token.
    #[error("expert_groups {groups} and groups_per_token {per_token} must be at least 1")]
    Zero {
        /// Groups.
        groups: u32,
        /// Groups a token.
        per_token: u32,
    },
    /// Groups that do not divide the routed experts.
    #[error("expert_groups {groups} must divide the {experts} routed experts")]
    Divide {
        /// Groups.
        groups: u32,
        /// Routed experts.
        experts: u32,
    },
    /// More groups a token than there are.
    #[error("groups_per_token {per_token} must be at most expert_groups {groups}")]
    Above {
        /// Groups.
        groups: u32,
        /// Groups a token.
        per_token: u32,
    },
    /// A token's groups hold fewer experts than it goes to.
    #[error("top_k {top_k} is more than the {} experts of groups_per_token {per_token} groups of {per_group}", u64::from(*.per_token) * u64::from(*.per_group))]
    TooFew {
        /// Experts a token.
        top_k: u32,
        /// Groups a token.
        per_token: u32,
        /// Experts a group.
        per_group: u32,
    },
}

impl RouteGroups {
    /// Whether these groups fit `experts` routed experts and `top_k` a token.
    pub fn check(&self, experts: u32, top_k: u32) -> Result<(), GroupsError> {
        let (groups, per_token) = (self.groups, self.per_token);
        if groups == 0 || per_token == 0 {
            return Err(GroupsError::Zero { groups, per_token });
        }
        if experts % groups != 0 {
            return Err(GroupsError::Divide { groups, experts });
        }
        if per_token > groups {
            return Err(GroupsError::Above { groups, per_token });
        }
        let per_group = experts / groups;
        if u64::from(top_k) > u64::from(per_token) * u64::from(per_group) {
            return Err(GroupsError::TooFew {
                top_k,
                per_token,
                per_group,
            });
        }
        Ok(())
    }

    /// The groups as a router uses them: `None` where they limit nothing (one group, or a
    /// token may use them all).
    pub fn limiting(self) -> Option<RouteGroups> {
        (self.per_token < self.groups).then_some(self)
    }
}

fn one() -> u32 {
    1
}

impl MoeShape {
    /// Whether layer `i` (0-based) is an MoE layer (see the type's note).
    pub fn is_moe_layer(&self, i: u32) -> bool {
        i >= self.dense_layers && (i - self.dense_layers + 1) % self.every.max(1) == 0
    }

    /// MoE layers among `layers`.
    pub fn moe_layers(&self, layers: u32) -> u32 {
        let after = layers.saturating_sub(self.dense_layers);
        after / self.every.max(1)
    }

    /// Parameters of the router (with its bias where it has one) and the shared gate.
    pub fn router_parameters(&self, d: u64) -> u64 {
        let e = u64::from(self.experts);
        let bias = if self.router_bias { e } else { 0 };
        let gate = if self.shared_gate { d } else { 0 };
        d * e + bias + gate
    }

    /// Parameters of the shared experts together (`up` matrices of the up projection each).
    pub fn shared_parameters(&self, d: u64, up: u64) -> u64 {
        u64::from(self.shared_experts) * (up + 1) * d * self.shared_ffn
    }

    /// Parameters of one routed expert.
    pub fn expert_parameters(&self, d: u64, up: u64) -> u64 {
        (up + 1) * d * self.expert_ffn
    }

    /// Parameters of one MoE layer's MLP part, all experts counted.
    pub fn layer_parameters(&self, d: u64, up: u64) -> u64 {
        u64::from(self.experts) * self.expert_parameters(d, up)
            + self.shared_parameters(d, up)
            + self.router_parameters(d)
    }

    /// Parameters one token's forward multiplies in an MoE layer's MLP part: the router, the
    /// shared experts and `top_k` routed experts.
    pub fn active_layer_parameters(&self, d: u64, up: u64) -> u64 {
        u64::from(self.top_k) * self.expert_parameters(d, up)
            + self.shared_parameters(d, up)
            + self.router_parameters(d)
    }

    /// Checks the fields against each other and `layers`, naming the first that does not fit.
    pub fn check(&self, layers: u32) -> Result<(), ShapeError> {
        let positive = [
            ("experts", u64::from(self.experts)),
            ("top_k", u64::from(self.top_k)),
            ("expert_ffn", self.expert_ffn),
            ("moe every", u64::from(self.every)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, x)| *x == 0) {
            return Err(ShapeError::NotPositive(name));
        }
        if self.top_k > self.experts {
            return Err(ShapeError::Conflict(format!(
                "top_k {} is more than the {} routed experts",
                self.top_k, self.experts
            )));
        }
        if (self.shared_experts > 0) != (self.shared_ffn > 0) {
            return Err(ShapeError::Conflict(format!(
                "shared_experts {} and shared_ffn {}: both are 0 or neither",
                self.shared_experts, self.shared_ffn
            )));
        }
        if self.shared_gate && self.shared_experts == 0 {
            return Err(ShapeError::Conflict(
                "shared_gate without shared experts: there is nothing to gate".into(),
            ));
        }
        if let Some(g) = self.route_groups {
            let fits = g.check(self.experts, self.top_k);
            fits.map_err(|e| ShapeError::Conflict(e.to_string()))?;
        }
        if self.moe_layers(layers) == 0 {
            return Err(ShapeError::Conflict(format!(
                "dense_layers {} and every {} leave none of the {layers} layers an MoE layer",
                self.dense_layers, self.every
            )));
        }
        Ok(())
    }
}

/// DeepSeek's multi-head latent attention (DeepSeek-V2, 2024): queries through a low-rank
/// bottleneck of width `q_lora_rank` (or a plain `d -> heads x qk` projection where it has
/// none), keys and values through a shared latent of width `kv_lora_rank` plus one rotary key
/// of width `qk_rope_head_dim` shared by the heads; each head's query and key are
/// `qk_nope_head_dim + qk_rope_head_dim` wide, its value `v_head_dim`. The two bottlenecks
/// each have a norm of the shape's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MlaShape {
    /// Width of the queries' bottleneck; `None` projects `d -> heads x qk` directly
    /// (DeepSeek-V2-Lite).
    pub q_lora_rank: Option<u64>,
    /// Width of the keys' and values' shared latent.
    pub kv_lora_rank: u64,
    /// Per head, the query and key width without positions.
    pub qk_nope_head_dim: u64,
    /// Per head, the query and key width turned by rotary positions.
    pub qk_rope_head_dim: u64,
    /// Per head, the value width.
    pub v_head_dim: u64,
}

impl MlaShape {
    /// Per head, the query and key width.
    pub fn qk_head_dim(&self) -> u64 {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// The weights of one layer's attention, `(inputs, outputs)` of each matmul in order:
    /// the query path (down and up, or the one projection), the keys' and values' down
    /// projection with the rotary key, their up projection, and the output projection.
    pub fn matrices(&self, d: u64, heads: u64) -> Vec<(u64, u64)> {
        let q = heads * self.qk_head_dim();
        let mut m = match self.q_lora_rank {
            Some(r) => vec![(d, r), (r, q)],
            None => vec![(d, q)],
        };
        m.push((d, self.kv_lora_rank + self.qk_rope_head_dim));
        m.push((
            self.kv_lora_rank,
            heads * (self.qk_nope_head_dim + self.v_head_dim),
        ));
        m.push((heads * self.v_head_dim, d));
        m
    }

    /// Parameters of one layer's attention: its matrices and the bottlenecks' norms
    /// (`norm_vectors` vectors each).
    pub fn parameters(&self, d: u64, heads: u64, norm_vectors: u64) -> u64 {
        let weights: u64 = self.matrices(d, heads).iter().map(|(i, o)| i * o).sum();
        let norms = self.q_lora_rank.unwrap_or(0) + self.kv_lora_rank;
        weights + norm_vectors * norms
    }

    /// Checks the widths, naming the first that is 0.
    pub fn check(&self) -> Result<(), ShapeError> {
        let positive = [
            ("q_lora_rank", self.q_lora_rank.unwrap_or(1)),
            ("kv_lora_rank", self.kv_lora_rank),
            ("qk_nope_head_dim", self.qk_nope_head_dim),
            ("qk_rope_head_dim", self.qk_rope_head_dim),
            ("v_head_dim", self.v_head_dim),
        ];
        match positive.iter().find(|(_, x)| *x == 0) {
            Some((name, _)) => Err(ShapeError::NotPositive(name)),
            None if self.qk_rope_head_dim % 2 != 0 => Err(ShapeError::Conflict(format!(
                "qk_rope_head_dim {}: rotary positions turn pairs, so it is even",
                self.qk_rope_head_dim
            ))),
            None => Ok(()),
        }
    }
}
