//! A shape layer by layer, where its layers differ: the MLP of a mixture of experts' layers
//! ([`super::MoeShape`]) and latent attention ([`super::MlaShape`]) change a layer's
//! parameters and FLOPs from the dense block's ([`ModelShape::block_parameters`],
//! [`ModelShape::block_flops`]). A shape without either has every layer the dense block, and
//! these sums are then exactly the dense block's times `layers` (the same bits in `f64`).

use super::{ModelShape, ShapeError, MAX_COUNT};

impl ModelShape {
    /// Whether every layer is the dense block of [`ModelShape::block_linears`]: no mixture
    /// of experts, no latent attention. The memory model and the plan's time model take only
    /// such shapes so far.
    pub fn is_uniform(&self) -> bool {
        self.moe.is_none() && self.mla.is_none()
    }

    /// What of this shape the memory model and the plan's time model (which count a
    /// uniform block of `d_model / heads`-wide heads) do not model yet, in words for an error
    /// line; `None` where they model all of it.
    pub fn not_modelled(&self) -> Option<&'static str> {
        if self.moe.is_some() {
            Some("a mixture of experts")
        } else if self.mla.is_some() {
            Some("multi-head latent attention")
        } else if self.head_width.is_some() {
            Some("heads of their own width (head_width)")
        } else if self.qk_norm {
            Some("norms of the query and key heads (qk_norm)")
        } else {
            None
        }
    }

    /// Parameters of one layer's attention, whole: its projections (with their biases) and
    /// QK norms, or latent attention's matrices and norms.
    pub fn attention_parameters(&self) -> u64 {
        match self.mla {
            Some(m) => m.parameters(self.d_model, u64::from(self.heads), self.norm.vectors()),
            None => {
                let [qkv, out, _, _] = self.block_linears();
                qkv.rank_parameters(1) + out.rank_parameters(1) + self.qk_norm_parameters()
            }
        }
    }

    /// Parameters of the dense MLP, whole (with its biases).
    pub fn dense_mlp_parameters(&self) -> u64 {
        let [_, _, up, down] = self.block_linears();
        up.rank_parameters(1) + down.rank_parameters(1)
    }

    /// Whether layer `i` (0-based) is an MoE layer.
    pub fn is_moe_layer(&self, i: u32) -> bool {
        self.moe.is_some_and(|m| m.is_moe_layer(i))
    }

    /// MoE layers of the model.
    pub fn moe_layers(&self) -> u32 {
        self.moe.map_or(0, |m| m.moe_layers(self.layers))
    }

    /// Parameters of one layer, whole, of an MoE layer (`moe`) or a dense one; only those
    /// a token's forward multiplies where `active` (the router, shared and `top_k` experts).
    pub fn layer_parameters(&self, moe: bool, active: bool) -> u64 {
        let mlp = match (self.moe, moe) {
            (Some(m), true) => {
                let (d, up) = (self.d_model, self.mlp.up_matrices());
                if active {
                    m.active_layer_parameters(d, up)
                } else {
                    m.layer_parameters(d, up)
                }
            }
            _ => self.dense_mlp_parameters(),
        };
        self.attention_parameters() + mlp + 2 * self.norm_parameters()
    }

    /// Parameters of all the layers (only the active ones of MoE layers where `active`).
    /// A uniform shape's is `layers` times [`ModelShape::block_parameters`]`(1)`.
    pub(super) fn layers_parameters(&self, active: bool) -> u64 {
        if self.is_uniform() {
            return u64::from(self.layers) * self.block_parameters(1);
        }
        let moe = u64::from(self.moe_layers());
        let dense = u64::from(self.layers) - moe;
        dense * self.layer_parameters(false, active) + moe * self.layer_parameters(true, active)
    }

    /// Forward FLOPs for `b` sequences of one layer, whole: an MoE layer's (`moe`) or a dense
    /// one's. As [`ModelShape::block_flops`], with the weights a token multiplies (the router,
    /// the shared and the `top_k` routed experts of an MoE layer) and latent attention's
    /// matrices and core (scores over `qk_nope + qk_rope` per head, context over `v`).
    pub fn layer_flops(&self, moe: bool, b: f64) -> f64 {
        if self.is_uniform() {
            return self.block_flops(b);
        }
        let s = self.seq_len as f64;
        let biases_and_norms = {
            // Weights only multiply; biases and norms are element-wise work, not counted.
            let [qkv, out, up, down] = self.block_linears();
            let w = |l: super::Linear| l.inputs * l.outputs;
            let attention = w(qkv) + w(out);
            (attention, w(up) + w(down))
        };
        let heads = u64::from(self.heads);
        let (attention, core_width) = match self.mla {
            Some(m) => (
                m.matrices(self.d_model, heads)
                    .iter()
                    .map(|(i, o)| i * o)
                    .sum::<u64>(),
                heads * (m.qk_head_dim() + m.v_head_dim),
            ),
            None => (biases_and_norms.0, 2 * self.q_width()),
        };
        let mlp = match (self.moe, moe) {
            (Some(m), true) => {
                let (d, up) = (self.d_model, self.mlp.up_matrices());
                let e = m.active_layer_parameters(d, up) - m.router_parameters(d);
                // The router's matmul (the biases beside it are not multiplied).
                e + d * u64::from(m.experts) + if m.shared_gate { d } else { 0 }
            }
            _ => biases_and_norms.1,
        };
        2.0 * b * s * (attention + mlp) as f64 + 2.0 * b * s * s * core_width as f64
    }

    /// Forward FLOPs of all the layers for `b` sequences.
    pub(super) fn layers_flops(&self, b: f64) -> f64 {
        let moe = self.moe_layers();
        let dense = self.layers - moe;
        f64::from(dense) * self.layer_flops(false, b) + f64::from(moe) * self.layer_flops(true, b)
    }

    /// Checks latent attention's and the mixture's fields.
    pub(super) fn check_parts(&self) -> Result<(), ShapeError> {
        let widths = [("head_width", self.head_width.unwrap_or(1))]
            .into_iter()
            .chain(self.mla.iter().flat_map(|m| {
                [
                    ("q_lora_rank", m.q_lora_rank.unwrap_or(1)),
                    ("kv_lora_rank", m.kv_lora_rank),
                    ("qk_nope_head_dim", m.qk_nope_head_dim),
                    ("qk_rope_head_dim", m.qk_rope_head_dim),
                    ("v_head_dim", m.v_head_dim),
                ]
            }))
            .chain(
                self.moe
                    .iter()
                    .flat_map(|m| [("expert_ffn", m.expert_ffn), ("shared_ffn", m.shared_ffn)]),
            );
        // Far beyond any model's, and small enough that a layer's products fit a `u128`.
        for (name, v) in widths {
            if v >= 1 << 30 {
                return Err(ShapeError::Conflict(format!(
                    "{name} {v} is too large: at most 2^30"
                )));
            }
        }
        if let Some(m) = self.mla {
            m.check()?;
            if self.head_width.is_some() || self.qk_norm {
                return Err(ShapeError::Conflict(
                    "latent attention sets its heads' widths itself: no head_width or qk_norm beside it"
                        .into(),
                ));
            }
        }
        if self.head_width == Some(0) {
            return Err(ShapeError::NotPositive("head_width"));
        }
        match self.moe {
            Some(m) => m.check(self.layers),
            None => Ok(()),
        }
    }

    /// The counts of latent attention and of a mixture stay within [`MAX_COUNT`] (see
    /// `check_counts`), worked out in `u128` so that no product wraps unseen.
    pub(super) fn check_part_counts(&self) -> Result<(), ShapeError> {
        fn w<T: Into<u128>>(x: T) -> u128 {
            x.into()
        }
        let (d, layers, heads) = (w(self.d_model), w(self.layers), w(self.heads));
        let attention = match self.mla {
            Some(m) => {
                let r = w(m.q_lora_rank.unwrap_or(0));
                let qk = w(m.qk_nope_head_dim) + w(m.qk_rope_head_dim);
                let terms = [
                    d * r + r * heads * qk + d * heads * qk,
                    d * (w(m.kv_lora_rank) + w(m.qk_rope_head_dim)),
                    w(m.kv_lora_rank) * heads * (w(m.qk_nope_head_dim) + w(m.v_head_dim)),
                    heads * w(m.v_head_dim) * d,
                ];
                terms.iter().sum::<u128>()
            }
            None => d * (w(self.q_width()) * 2 + 2 * w(self.kv_width())),
        };
        let mlp = match self.moe {
            Some(m) => {
                let up = w(self.mlp.up_matrices()) + 1;
                w(m.experts) * up * d * w(m.expert_ffn)
                    + w(m.shared_experts) * up * d * w(m.shared_ffn)
                    + d * (w(m.experts) + 1)
                    + w(m.experts)
            }
            None => 0,
        };
        let dense = w(self.mlp.up_matrices() + 1) * d * w(self.ffn);
        // Every width is below 2^30 (`check_parts`), so only the product by layers can wrap.
        let total = layers.checked_mul(attention + mlp + dense + 8 * d);
        if total.is_some_and(|t| t <= u128::from(MAX_COUNT)) {
            return Ok(());
        }
        Err(ShapeError::TooLarge {
            what: "layers x (attention and experts)",
            layers: self.layers,
            d_model: self.d_model,
            ffn: self.ffn,
            seq_len: self.seq_len,
            vocab: self.vocab,
        })
    }
}
