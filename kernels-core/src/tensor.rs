//! A dense, contiguous, row-major f32 tensor on the CPU, and its conversions
//! to bf16/f16 and to bytes for storage and transfer.

use crate::error::{shape_err, KernelError, Result};
use crate::float16::{Bf16, F16};

/// A dense row-major f32 tensor in host memory.
///
/// Compute always runs in f32; [`DType`] only chooses how a tensor is packed
/// into bytes for storage or transfer ([`Tensor::to_bytes`]). Most kernels see
/// a tensor as a matrix of [`Tensor::rows`] x [`Tensor::cols`] (all leading
/// dimensions folded into rows), which is free for contiguous storage.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// Element type used to store or transfer a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float (exact).
    F32,
    /// bfloat16: f32's range, 8 bits of mantissa.
    BF16,
    /// IEEE half: 11 bits of mantissa, range up to 65504.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Lower-case name, as in error messages.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

impl Tensor {
    /// A tensor of `shape` owning `data` (row-major); errors if the lengths disagree.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        let numel: usize = shape.iter().product();
        if numel != data.len() {
            return Err(shape_err(
                "Tensor::new",
                format!("shape {shape:?} needs {numel} elements, got {}", data.len()),
            ));
        }
        Ok(Self {
            shape: shape.to_vec(),
            data,
        })
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        let numel = shape.iter().product();
        Self {
            shape: shape.to_vec(),
            data: vec![0.0; numel],
        }
    }

    /// Constructor for kernels (here and in `pipewright-kernels`' layers) that already know
    /// the length is right; not for users, whose data goes through [`Tensor::new`].
    #[doc(hidden)]
    pub fn from_parts(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Size of the last dimension (1 for a scalar).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Product of all dimensions but the last: the row count of the matrix view.
    pub fn rows(&self) -> usize {
        self.numel().checked_div(self.cols()).unwrap_or(0)
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The elements, row-major, mutable.
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }

    /// Gives up the storage without copying.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }

    /// Same storage, new shape with the same element count (no copy).
    pub fn reshape(mut self, shape: &[usize]) -> Result<Self> {
        let numel: usize = shape.iter().product();
        if numel != self.numel() {
            return Err(shape_err(
                "Tensor::reshape",
                format!("cannot view {:?} as {shape:?}", self.shape),
            ));
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// Matrices with the same rows side by side: `[rows, c_0 + c_1 + ..]` (e.g. a
    /// gated MLP's gate and up weights fused into one).
    pub fn concat_cols(parts: &[&Tensor]) -> Result<Tensor> {
        let rows = parts.first().map_or(0, |t| t.rows());
        if parts
            .iter()
            .any(|t| t.shape().len() != 2 || t.rows() != rows)
        {
            let shapes: Vec<&[usize]> = parts.iter().map(|t| t.shape()).collect();
            return Err(shape_err(
                "Tensor::concat_cols",
                format!("{shapes:?} are not matrices of equal rows"),
            ));
        }
        let cols: usize = parts.iter().map(|t| t.cols()).sum();
        let mut data = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for t in parts {
                data.extend_from_slice(&t.data()[r * t.cols()..(r + 1) * t.cols()]);
            }
        }
        Tensor::new(&[rows, cols], data)
    }

    /// `self += other`, elementwise; errors on a shape mismatch.
    pub fn add_assign(&mut self, other: &Tensor) -> Result<()> {
        self.check_same("Tensor::add_assign", other)?;
        for (a, b) in self.data.iter_mut().zip(&other.data) {
            *a += b;
        }
        Ok(())
    }

    /// Multiplies every element by `s`.
    pub fn scale(&mut self, s: f32) {
        self.data.iter_mut().for_each(|x| *x *= s);
    }

    /// Sets every element to zero, keeping the allocation.
    pub fn fill_zero(&mut self) {
        self.data.iter_mut().for_each(|x| *x = 0.0);
    }

    /// Largest absolute elementwise difference; errors on a shape mismatch.
    pub fn max_abs_diff(&self, other: &Tensor) -> Result<f32> {
        self.check_same("Tensor::max_abs_diff", other)?;
        Ok(self
            .data
            .iter()
            .zip(&other.data)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max))
    }

    pub(crate) fn check_same(&self, op: &'static str, other: &Tensor) -> Result<()> {
        if self.shape != other.shape {
            return Err(shape_err(
                op,
                format!("{:?} vs {:?}", self.shape, other.shape),
            ));
        }
        Ok(())
    }

    /// Rounds to bf16 (round-to-nearest-even).
    pub fn to_bf16(&self) -> Vec<Bf16> {
        self.data.iter().map(|&x| Bf16::from_f32(x)).collect()
    }

    /// Rounds to IEEE f16 (values beyond 65504 become infinite).
    pub fn to_f16(&self) -> Vec<F16> {
        self.data.iter().map(|&x| F16::from_f32(x)).collect()
    }

    /// Widens bf16 values into an f32 tensor of `shape`.
    pub fn from_bf16(shape: &[usize], data: &[Bf16]) -> Result<Self> {
        Self::new(shape, data.iter().map(|x| x.to_f32()).collect())
    }

    /// Widens f16 values into an f32 tensor of `shape`.
    pub fn from_f16(shape: &[usize], data: &[F16]) -> Result<Self> {
        Self::new(shape, data.iter().map(|x| x.to_f32()).collect())
    }

    /// Packs the elements as little-endian bytes of `dtype` (shape not included).
    pub fn to_bytes(&self, dtype: DType) -> Vec<u8> {
        match dtype {
            DType::F32 => self.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DType::BF16 => self
                .to_bf16()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            DType::F16 => self.to_f16().iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Unpacks little-endian bytes of `dtype` into an f32 tensor of `shape`.
    pub fn from_bytes(shape: &[usize], dtype: DType, bytes: &[u8]) -> Result<Self> {
        let numel: usize = shape.iter().product();
        if bytes.len() != numel * dtype.size() {
            return Err(KernelError::Bytes {
                len: bytes.len(),
                numel,
                dtype: dtype.name(),
            });
        }
        let data = match dtype {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::BF16 => bytes
                .chunks_exact(2)
                .map(|c| Bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|c| F16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        };
        Ok(Self::from_parts(shape.to_vec(), data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_checks_length() {
        assert!(Tensor::new(&[2, 3], vec![0.0; 5]).is_err());
        let t = Tensor::new(&[2, 3], vec![1.0; 6]).unwrap();
        assert_eq!((t.rows(), t.cols()), (2, 3));
    }

    #[test]
    fn bytes_round_trip_per_dtype() {
        let t = Tensor::new(&[2, 2], vec![1.0, -2.5, 0.1, 3.0e4]).unwrap();
        let back = Tensor::from_bytes(&[2, 2], DType::F32, &t.to_bytes(DType::F32)).unwrap();
        assert_eq!(back, t);
        for dt in [DType::BF16, DType::F16] {
            let bytes = t.to_bytes(dt);
            assert_eq!(bytes.len(), 8);
            let back = Tensor::from_bytes(&[2, 2], dt, &bytes).unwrap();
            // bf16 keeps 8 mantissa bits, f16 11: relative error below 2^-8.
            for (a, b) in back.data().iter().zip(t.data()) {
                assert!((a - b).abs() <= b.abs() / 256.0, "{dt:?}: {a} vs {b}");
            }
            assert_ne!(back.data()[2], 0.1, "{dt:?} should have rounded 0.1");
        }
        assert!(Tensor::from_bytes(&[2, 2], DType::F16, &[0; 7]).is_err());
    }

    #[test]
    fn reshape_and_add() {
        let mut a = Tensor::zeros(&[2, 3]).reshape(&[3, 2]).unwrap();
        assert!(a.clone().reshape(&[4]).is_err());
        a.add_assign(&Tensor::new(&[3, 2], vec![1.0; 6]).unwrap())
            .unwrap();
        assert_eq!(a.data(), &[1.0; 6]);
        assert!(a.add_assign(&Tensor::zeros(&[6])).is_err());
    }
}
