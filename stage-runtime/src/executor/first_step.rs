//! Step 0's checks of what the user's model and data do, which no later step repeats: that
//! every rank built the same data for each microbatch id, and that every parameter of a
//! stage reached by a gradient got one. Both mistakes train without an error otherwise, and
//! a one-device reference with the same bug agrees with them.

use std::any::Any;

use pipewright_kernels::Tensor;

use super::*;

/// Whether `t` is a host tensor holding a value other than zero (a device tensor is not
/// read: the checks that use this are for host modules).
pub(super) fn nonzero<T: 'static>(t: &T) -> bool {
    (t as &dyn Any)
        .downcast_ref::<Tensor>()
        .is_some_and(|h| h.data().iter().any(|v| *v != 0.0))
}

/// A fingerprint as four 16-bit pieces, each exact in an f32 (`-1` each: none).
fn pieces(f: Option<u64>) -> [f32; 4] {
    match f {
        Some(f) => [0, 16, 32, 48].map(|s| ((f >> s) & 0xffff) as f32),
        None => [-1.0; 4],
    }
}

/// Up to 8 dimensions of a shape: its length, then each dimension's [`pieces`] (`-1` each:
/// none, or a shape of more dimensions, which is then not checked).
fn shape_pieces(shape: Option<&[usize]>) -> Vec<f32> {
    let mut out = vec![-1.0; 33];
    if let Some(s) = shape.filter(|s| s.len() <= 8) {
        out[0] = s.len() as f32;
        for (k, d) in s.iter().enumerate() {
            out[1 + 4 * k..5 + 4 * k].copy_from_slice(&pieces(Some(*d as u64)));
        }
    }
    out
}

fn unshape(p: &[f32]) -> Option<Vec<usize>> {
    let n = *p.first()?;
    if !(0.0..=8.0).contains(&n) {
        return None;
    }
    (0..n as usize)
        .map(|k| unpieces(p.get(1 + 4 * k..5 + 4 * k)?).map(|d| d as usize))
        .collect()
}

fn unpieces(p: &[f32]) -> Option<u64> {
    if p.first().is_some_and(|v| *v < 0.0) || p.is_empty() {
        return None;
    }
    Some(
        p.iter()
            .zip([0, 16, 32, 48])
            .fold(0, |f, (v, s)| f | (*v as u64) << s),
    )
}

impl<C, M> Executor<C, M>
where
    C: Communicator + 'static,
    C::Tensor: 'static,
    M: StageModule<Tensor = C::Tensor>,
{
    /// Refuse, in step 0, a data function that gave two ranks of one replica different data
    /// for the same microbatch id: every rank fingerprints its microbatches (through its
    /// first module that offers [`StageModule::data_fingerprint`]) and the ranks gather all
    /// fingerprints. Every rank reaches the same verdict. Host-tensor transports only (the
    /// fingerprints travel as a host tensor); a run of one rank has nothing to compare.
    pub(super) fn check_data(
        &self,
        step: u64,
        batch: &StepBatch<M::Data>,
    ) -> Result<(), RuntimeError> {
        let world = self.mesh.world_size();
        if step != 0 || world < 2 {
            return Ok(());
        }
        let mut stages: Vec<&u32> = self.modules.keys().collect();
        stages.sort_unstable();
        let mut mine = Vec::with_capacity(4 * batch.microbatches.len());
        for data in &batch.microbatches {
            let mut found = None;
            for stage in &stages {
                let module = &self.modules[*stage];
                let f = guard(|| module.data_fingerprint(data)).map_err(|e| {
                    self.fail(
                        step,
                        None,
                        format!("data fingerprint of stage {stage}: {e}"),
                    )
                })?;
                if f.is_some() {
                    found = f;
                    break;
                }
            }
            mine.extend(pieces(found));
        }
        let Some(all) = self.gather_host(step, mine, "data fingerprints")? else {
            return Ok(());
        };
        match self.first_disagreement(&all, batch.microbatches.len(), "data") {
            Some(message) => Err(self.fail(step, None, message)),
            None => Ok(()),
        }
    }

    /// Every rank's `mine`, gathered over the world (one collective, every rank calls it);
    /// `None` on a device transport (the values travel as a host tensor).
    fn gather_host(
        &self,
        step: u64,
        mine: Vec<f32>,
        what: &str,
    ) -> Result<Option<Vec<Vec<f32>>>, RuntimeError> {
        let n = mine.len();
        let Ok(t) = Tensor::new(&[n], mine) else {
            return Ok(None);
        };
        let Ok(t) = (Box::new(t) as Box<dyn Any>).downcast::<C::Tensor>() else {
            return Ok(None); // a device transport: not checked
        };
        let group = self
            .mesh
            .group(GroupKind::World, self.mesh.rank(self.coord))?;
        let all = self
            .comm
            .all_gather(&group, &t)
            .map_err(|e| self.fail(step, None, format!("gathering {what}: {e}")))?;
        Ok(Some(
            all.iter()
                .filter_map(|t| (t as &dyn Any).downcast_ref::<Tensor>())
                .map(|h| h.data().to_vec())
                .collect(),
        ))
    }

    /// Refuse, at the end of step 0, targets that two ranks of one replica built apart: the
    /// last stage's prediction shape is gathered first, then every rank fingerprints what
    /// its loss reads of each microbatch (through its first module that offers
    /// [`StageModule::target_fingerprint`]) and the ranks compare, as [`Self::check_data`].
    pub(super) fn check_targets(
        &self,
        step: u64,
        batch: &StepBatch<M::Data>,
    ) -> Result<(), RuntimeError> {
        if step != 0 || self.mesh.world_size() < 2 {
            return Ok(());
        }
        let mut stages: Vec<&u32> = self.modules.keys().collect();
        stages.sort_unstable();
        let shape = stages
            .iter()
            .find_map(|s| self.modules[*s].prediction_shape());
        let Some(shapes) = self.gather_host(step, shape_pieces(shape.as_deref()), "shapes")? else {
            return Ok(());
        };
        let Some(shape) = shapes.iter().find_map(|p| unshape(p)) else {
            return Ok(());
        };
        let mut mine = Vec::with_capacity(4 * batch.microbatches.len());
        for data in &batch.microbatches {
            let mut found = None;
            for stage in &stages {
                let f = guard(|| self.modules[*stage].target_fingerprint(data, &shape));
                let f = f.map_err(|e| {
                    self.fail(
                        step,
                        None,
                        format!("target fingerprint of stage {stage}: {e}"),
                    )
                })?;
                if f.is_some() {
                    found = f;
                    break;
                }
            }
            mine.extend(pieces(found));
        }
        let Some(all) = self.gather_host(step, mine, "target fingerprints")? else {
            return Ok(());
        };
        match self.first_disagreement(
            &all,
            batch.microbatches.len(),
            "targets (what the loss reads)",
        ) {
            Some(message) => Err(self.fail(step, None, message)),
            None => Ok(()),
        }
    }

    /// The first microbatch for which two ranks of one replica hold different fingerprints.
    fn first_disagreement(&self, all: &[Vec<f32>], m: usize, what: &str) -> Option<String> {
        let coords: Vec<Coord> = (0..all.len())
            .filter_map(|r| self.mesh.coord(r).ok())
            .collect();
        for i in 0..m {
            let of = |r: usize| all[r].get(4 * i..4 * i + 4).and_then(unpieces);
            for a in 0..all.len() {
                let Some(fa) = of(a) else { continue };
                for b in a + 1..all.len() {
                    let Some(fb) = of(b) else { continue };
                    if coords.get(a).map(|c| c.dp) != coords.get(b).map(|c| c.dp) || fa == fb {
                        continue;
                    }
                    let dp = coords.get(a).map_or(0, |c| c.dp);
                    let global = dp as u64 * m as u64 + i as u64;
                    return Some(format!(
                        "the data function gave ranks {a} and {b} different {what} for microbatch \
                         {global} of step 0 (replica {dp}, microbatch {i}; fingerprints \
                         {fa:016x} and {fb:016x}): every rank that needs microbatch id builds \
                         it by calling data(id), so data must be a function of the id \
                         (id.global(), id.step), never of the thread, the rank or a reader's \
                         position"
                    ));
                }
            }
        }
        None
    }

    /// Refuse, at the end of step 0 (after the data-parallel all-reduce, before the
    /// optimizer), a parameter whose gradient is exactly zero on a stage that received a
    /// non-zero gradient or loss, naming it and the stage; [`RunOptions::allow_unused`]
    /// lets named ones through. Only for modules that name their parameters, with host
    /// gradients, and not under ZeRO-1 (each replica holds only its own gradients).
    pub(super) fn check_unused(&mut self, step: u64) -> Result<(), RuntimeError> {
        if step != 0 || self.sharded {
            return Ok(());
        }
        let mut stages: Vec<u32> = self.reached.iter().copied().collect();
        stages.sort_unstable();
        for stage in stages {
            let module = self
                .modules
                .get_mut(&stage)
                .ok_or_else(|| RuntimeError::missing_stage(stage))?;
            let Some(names) = module.parameter_names() else {
                continue;
            };
            let grads = guard(|| module.flat_grads());
            let grads = grads.map_err(|e| self.fail(step, None, format!("stage {stage}: {e}")))?;
            let Some(g) = grads else { continue };
            let Some(h) = (&g as &dyn Any).downcast_ref::<Tensor>() else {
                continue;
            };
            if names.iter().map(|n| n.numel).sum::<usize>() != h.numel() {
                continue; // names that do not describe the flat layout cannot place a value
            }
            let mut unused = Vec::new();
            let mut off = 0;
            for n in &names {
                let g = &h.data()[off..off + n.numel];
                off += n.numel;
                let allowed = self
                    .allow_unused
                    .iter()
                    .any(|a| n.name.starts_with(a.as_str()));
                if n.numel > 0 && !allowed && g.iter().all(|v| *v == 0.0) {
                    unused.push(n.name.clone());
                }
            }
            if !unused.is_empty() {
                return Err(RuntimeError::UnusedParameters {
                    rank: self.mesh.rank(self.coord),
                    coord: self.coord,
                    stage,
                    names: unused,
                });
            }
        }
        Ok(())
    }
}
