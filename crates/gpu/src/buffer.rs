//! Typed buffers in device memory.

use cudarc::driver::CudaSlice;

mod private {
    /// What a [`super::Elem`] must be for the driver: plain bytes, valid when zeroed.
    pub trait Sealed: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {}
}

/// An element type device buffers and kernel arguments may hold.
pub trait Elem: private::Sealed + Copy + Default + std::fmt::Debug + 'static {}

macro_rules! elem {
    ($($t:ty),*) => {
        $(impl private::Sealed for $t {} impl Elem for $t {})*
    };
}
elem!(u8, i8, i32, u32, u64, i64, f32, f64);

/// `len` elements of `T` in device memory (allocated with room for at least `len`; a pooled
/// buffer may have more, see [`DeviceBuffer::capacity`]). Made, filled and read through a
/// [`crate::GpuContext`]; kernels receive it through a [`crate::Launch`].
pub struct DeviceBuffer<T> {
    slice: CudaSlice<T>,
    len: usize,
}

impl<T> DeviceBuffer<T> {
    pub(crate) fn new(slice: CudaSlice<T>, len: usize) -> Self {
        debug_assert!(len <= slice.len());
        Self { slice, len }
    }
    /// Elements in use.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether no element is in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Elements the allocation holds.
    pub fn capacity(&self) -> usize {
        self.slice.len()
    }
    pub(crate) fn set_len(&mut self, len: usize) {
        assert!(len <= self.slice.len(), "{len} beyond the allocation");
        self.len = len;
    }
    pub(crate) fn raw(&self) -> &CudaSlice<T> {
        &self.slice
    }
    pub(crate) fn raw_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>[{} of {}]",
            std::any::type_name::<T>(),
            self.len,
            self.slice.len()
        )
    }
}
