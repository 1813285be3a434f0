//! The CPU backend: every op of the crate on host [`Tensor`](crate::Tensor)s, and
//! [`Cpu`](struct@Cpu), the [`Backend`](crate::Backend) that runs them (with its own AdamW
//! update).
//!
//! Each op is a plain function; those of layers with weights come as a
//! forward, an input-gradient (I) and a weight-gradient (W) function, so a
//! zero-bubble schedule can run I and W at different times.

pub mod adamw;
pub mod attention;
mod backend;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod glu;
pub mod layernorm;
pub mod loss;
pub mod rmsnorm;
pub mod rotary;

pub use attention::{causal_attention, causal_attention_backward, AttnShape};
pub use backend::Cpu;
pub use elementwise::{add, add_bias, bias_grad_acc, gelu, gelu_backward};
pub use embedding::{embedding, embedding_backward_weight};
pub use gemm::{
    gemm, matmul, matmul_into, matmul_nt, matmul_stats, matmul_tn_acc, reset_matmul_stats, MatMut,
    MatRef, MatmulStats,
};
pub use glu::{glu, glu_backward, GluKind};
pub use layernorm::{
    layer_norm, layer_norm_backward_input, layer_norm_backward_input_from,
    layer_norm_backward_weight, LayerNormStash,
};
pub use loss::{cross_entropy, cross_entropy_backward};
pub use rmsnorm::{rms_norm, rms_norm_backward_input_from, rms_norm_backward_weight};
pub use rotary::{rotary, rotary_backward, rotary_table};
