//! [`ParamName`]: a parameter as a module names it, for errors that point at it.

use pipewright_kernels::Shaped;

/// One parameter as [`StageModule::parameter_names`](crate::StageModule::parameter_names) lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamName {
    /// What errors call it.
    pub name: String,
    /// Its number of values (its share of the flat views).
    pub numel: usize,
}

impl ParamName {
    /// `name` for a parameter `p` (its number of values).
    pub fn new<S: Shaped>(name: String, p: &pipewright_kernels::layers::Param<S>) -> Self {
        ParamName {
            name,
            numel: p.value.numel(),
        }
    }

    /// The name of flat index `i` of a module with `names`: `w (layer 2, Dense)[5]`.
    pub fn at(names: &[ParamName], mut i: usize) -> Option<String> {
        for n in names {
            if i < n.numel {
                return Some(format!("{}[{i}]", n.name));
            }
            i -= n.numel;
        }
        None
    }
}
