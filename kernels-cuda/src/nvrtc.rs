//! NVRTC compilation, shared by the backend and by the test that compiles
//! every kernel source wherever NVRTC is present (no driver or GPU needed),
//! so a CUDA syntax or type error fails CI rather than the first GPU run.

use super::cuda_err;
use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::Ptx;
use pipewright_kernels_core::error::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Compiles `src` to PTX with the options every module of the backend uses
/// (NVRTC's defaults: its default virtual architecture, IEEE `expf`, `sqrtf`
/// and division; no fast math).
///
/// Once per source and process: the attention source alone takes NVRTC
/// seconds, and every backend (each test's, each rank's) loads every module.
pub(super) fn ptx(src: &str) -> Result<Ptx> {
    static DONE: OnceLock<Mutex<HashMap<String, Ptx>>> = OnceLock::new();
    let done = DONE.get_or_init(Default::default);
    // A panic elsewhere while holding the lock leaves the map intact.
    let mut done = done.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(ptx) = done.get(src) {
        return Ok(ptx.clone());
    }
    let ptx = cudarc::nvrtc::compile_ptx(src).map_err(cuda_err)?;
    done.insert(src.to_string(), ptx.clone());
    Ok(ptx)
}

/// Compiles `src`, loads it on `ctx` and returns its kernels `names`, in order.
pub(super) fn load(ctx: &Arc<CudaContext>, src: &str, names: &[&str]) -> Result<Vec<CudaFunction>> {
    let module = ctx.load_module(ptx(src)?).map_err(cuda_err)?;
    names
        .iter()
        .map(|n| module.load_function(n).map_err(cuda_err))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module's source and the kernels the backend loads from it.
    fn sources() -> Vec<(&'static str, String, Vec<String>)> {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        vec![
            (
                "elementwise",
                super::super::kernels::SOURCE.to_string(),
                owned(super::super::kernels::NAMES),
            ),
            (
                "rowops",
                super::super::rowops::SOURCE.to_string(),
                owned(super::super::rowops::NAMES),
            ),
            (
                "mixed",
                super::super::mixed::SOURCE.to_string(),
                owned(super::super::mixed::NAMES),
            ),
            (
                "attention",
                super::super::attention::source(),
                super::super::attention::names(),
            ),
            (
                "rotary",
                super::super::rotary::SOURCE.to_string(),
                owned(super::super::rotary::NAMES),
            ),
        ]
    }

    #[test]
    fn every_nvrtc_source_compiles() {
        // Today's shapes' kernels are among those checked: the gated units, RMSNorm's rows,
        // grouped-query attention (every attention kernel takes the key/value heads) and
        // rotary positions (and the embedding without a position table).
        let all: Vec<String> = sources().into_iter().flat_map(|(_, _, n)| n).collect();
        for name in [
            "glu_fwd",
            "glu_bwd",
            "rms_fwd",
            "rms_bwd_input",
            "attn_bwd_dkv_64",
            "rope",
            "emb_fwd",
        ] {
            assert!(all.iter().any(|n| n == name), "{name} is not compiled");
        }
        assert!(super::super::attention::source().contains("int H, int KV, int dh"));
        assert!(super::super::rowops::SOURCE.contains("int seq, int has_pos"));
        // SAFETY: only tries to dlopen the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: the NVRTC library is not present");
            return;
        }
        for (module, src, names) in sources() {
            let ptx = ptx(&src)
                .unwrap_or_else(|e| panic!("{module}: NVRTC rejects the source: {e}"))
                .to_src();
            for name in names {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "{module}: kernel {name} is not in the PTX"
                );
            }
            println!("{module}: {} bytes of PTX", ptx.len());
        }
    }
}
