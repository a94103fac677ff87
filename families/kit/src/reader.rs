//! Reading weights for a CPU forward pass through the seam, in bounded
//! memory.
//!
//! Every read asks [`seam::resident_weight`] for the weight (every call, as
//! a real engine does each step; the memoized path costs nanoseconds) and
//! reads what a kernel may read: the host view (the CPU), or the device copy
//! read back (a staging device; the CPU kernels stand in for the device's).
//! Matrices are never dequantized whole: [`WeightReader::matvec`] reads a
//! chunk of rows at a time and dequantizes one row at a time
//! (`family_ops::matvec_f64`). Only small tensors (norm gammas, biases,
//! convolution kernels, scales: at most [`VECTOR_MAX_ELEMENTS`]) are kept
//! dequantized, in one cache keyed by the [`Weight`] itself, so a table two
//! models share (a draft and its target) is one entry.
//!
//! Peak host memory of a decode step is then the activations, the caches
//! and a chunk of rows, not the model in `f32`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use seam::platform::{Platform, Queue};
use seam::weight::{HostBytes, Weight};
use seam::{Resident, resident_weight};

use crate::error::LoadError;
use crate::family::Traffic;
use crate::weights::row_bytes;

/// The most elements a weight may have to be kept dequantized
/// ([`WeightReader::vector`]): 4 MiB of `f32`.
pub const VECTOR_MAX_ELEMENTS: u64 = 1 << 20;

/// Bytes read back from a device per chunk of rows (at least one row).
const READ_CHUNK: u64 = 1 << 20;

/// Reads weights through the seam on one platform and queue.
pub struct WeightReader<'w> {
    platform: &'w dyn Platform,
    queue: &'w dyn Queue,
    /// Small weights dequantized, keyed by the weight's address: weights
    /// are borrowed for `'w`, so an address is not reused while the reader
    /// lives.
    vectors: Mutex<HashMap<usize, Arc<[f32]>>>,
    /// Chunks read back from a device, and their bytes.
    read_backs: AtomicU64,
    read_back_bytes: AtomicU64,
}

impl std::fmt::Debug for WeightReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightReader")
            .field("device", &self.platform.backend().name())
            .finish()
    }
}

fn read_err(w: &Weight, reason: impl std::fmt::Display) -> LoadError {
    LoadError::Read {
        name: w.name().to_owned(),
        reason: reason.to_string(),
    }
}

impl<'w> WeightReader<'w> {
    /// A reader of weights staged on `platform` through `queue`.
    pub fn new(platform: &'w dyn Platform, queue: &'w dyn Queue) -> WeightReader<'w> {
        WeightReader {
            platform,
            queue,
            vectors: Mutex::new(HashMap::new()),
            read_backs: AtomicU64::new(0),
            read_back_bytes: AtomicU64::new(0),
        }
    }

    /// What the reader moved so far: every chunk of a staged weight it
    /// read back from the device (nothing on a device whose weights the
    /// host reads in place). Its products run on the host CPU, so it
    /// launches no device kernel: a decoder over it reports 0 launches.
    pub fn traffic(&self) -> Traffic {
        let bytes = self.read_back_bytes.load(Ordering::Relaxed);
        Traffic {
            read_back_bytes: bytes,
            weight_read_back_bytes: bytes,
            read_backs: self.read_backs.load(Ordering::Relaxed),
            kernel_launches: Some(0),
        }
    }

    /// The platform.
    pub fn platform(&self) -> &'w dyn Platform {
        self.platform
    }

    /// The queue.
    pub fn queue(&self) -> &'w dyn Queue {
        self.queue
    }

    /// Calls `f(first_row_of_chunk, bytes)` over rows `first..first + n` of
    /// `w` (rows of `dims[0]` elements), in chunks, from what
    /// `resident_weight` hands out.
    fn for_each_chunk(
        &self,
        w: &'w Weight,
        first: u64,
        n: u64,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), LoadError>,
    ) -> Result<(), LoadError> {
        let rb = row_bytes(w)?;
        let rows: u64 = w.dims().iter().skip(1).product();
        if first.checked_add(n).is_none_or(|end| end > rows) {
            return Err(LoadError::RowOutOfRange {
                name: w.name().to_owned(),
                row: first.saturating_add(n).saturating_sub(1),
                rows,
            });
        }
        match resident_weight(w, self.platform, self.queue)? {
            Resident::Host(view) => {
                let start = (first * rb) as usize;
                f(first, &view[start..start + (n * rb) as usize])
            }
            Resident::Device(copy) => {
                let per_chunk = (READ_CHUNK / rb.max(1)).max(1);
                let mut buf = vec![0u8; (per_chunk.min(n) * rb) as usize];
                let mut at = first;
                while at < first + n {
                    let take = per_chunk.min(first + n - at);
                    let bytes = &mut buf[..(take * rb) as usize];
                    self.platform
                        .backend()
                        .read_back(copy.buffer(), at * rb, bytes)
                        .map_err(|e| read_err(w, e))?;
                    self.read_backs.fetch_add(1, Ordering::Relaxed);
                    self.read_back_bytes
                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    f(at, bytes)?;
                    at += take;
                }
                Ok(())
            }
        }
    }

    /// `W[first..first + n] · x`: rows `first..first + n` of `w` (rows of
    /// `x.len()` elements) times `x`, in `f64`, reading the quantized rows
    /// a chunk at a time.
    ///
    /// # Errors
    ///
    /// The rows or `x` do not fit `w`, the seam failed, or the type cannot
    /// be dequantized.
    pub fn matvec(
        &self,
        w: &'w Weight,
        first: usize,
        n: usize,
        x: &[f64],
    ) -> Result<Vec<f64>, LoadError> {
        let ne0 = w.dims()[0] as usize;
        if x.len() != ne0 {
            return Err(read_err(
                w,
                format!("x has {} values, rows have {ne0}", x.len()),
            ));
        }
        let mut out = vec![0f64; n];
        let rb = row_bytes(w)?;
        self.for_each_chunk(w, first as u64, n as u64, |at, bytes| {
            let rows = (bytes.len() as u64 / rb.max(1)) as usize;
            let o = at as usize - first;
            family_ops::matvec_f64(w.ggml_type(), bytes, ne0, rows, x, &mut out[o..o + rows])
                .map_err(|e| read_err(w, e))
        })?;
        Ok(out)
    }

    /// [`WeightReader::matvec_all`] for `f32` activations
    /// (`family_ops::matvec`: each row dequantized, dotted in `f64`, rounded
    /// once).
    ///
    /// # Errors
    ///
    /// As [`WeightReader::matvec`].
    pub fn matvec_f32(&self, w: &'w Weight, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        let ne0 = w.dims()[0] as usize;
        if x.len() != ne0 {
            return Err(read_err(
                w,
                format!("x has {} values, rows have {ne0}", x.len()),
            ));
        }
        let n: u64 = w.dims().iter().skip(1).product();
        let mut out = vec![0f32; n as usize];
        let rb = row_bytes(w)?;
        self.for_each_chunk(w, 0, n, |at, bytes| {
            let rows = (bytes.len() as u64 / rb.max(1)) as usize;
            let o = at as usize;
            family_ops::matvec(w.ggml_type(), bytes, ne0, rows, x, &mut out[o..o + rows])
                .map_err(|e| read_err(w, e))
        })?;
        Ok(out)
    }

    /// `W · x` for one token of a ubatch of `ubatch` tokens as ggml's x86
    /// CPU `mul_mat` computes it, bit for bit
    /// (`family_ops::ggml_cpu::matvec`), for the types it covers
    /// (`family_ops::ggml_cpu::is_emulated`).
    ///
    /// # Errors
    ///
    /// As [`WeightReader::matvec`]; a type it does not cover.
    pub fn matvec_ggml(
        &self,
        w: &'w Weight,
        x: &[f32],
        ubatch: family_ops::ggml_cpu::Ubatch,
    ) -> Result<Vec<f32>, LoadError> {
        let n: u64 = w.dims().iter().skip(1).product();
        self.matvec_ggml_rows(w, 0, n as usize, x, ubatch)
    }

    /// [`WeightReader::matvec_ggml`] over rows `first..first + n` of `w`.
    ///
    /// # Errors
    ///
    /// As [`WeightReader::matvec_ggml`].
    pub fn matvec_ggml_rows(
        &self,
        w: &'w Weight,
        first: usize,
        n: usize,
        x: &[f32],
        ubatch: family_ops::ggml_cpu::Ubatch,
    ) -> Result<Vec<f32>, LoadError> {
        let ne0 = w.dims()[0] as usize;
        if x.len() != ne0 {
            return Err(read_err(
                w,
                format!("x has {} values, rows have {ne0}", x.len()),
            ));
        }
        let ne1 = w.dims().get(1).copied().unwrap_or(1) as usize;
        let mut out = vec![0f32; n];
        let rb = row_bytes(w)?;
        self.for_each_chunk(w, first as u64, n as u64, |at, bytes| {
            let rows = (bytes.len() as u64 / rb.max(1)) as usize;
            let o = at as usize - first;
            family_ops::ggml_cpu::matvec(
                w.ggml_type(),
                bytes,
                ne0,
                rows,
                ne1,
                ubatch,
                x,
                &mut out[o..o + rows],
            )
            .map_err(|e| read_err(w, e))
        })?;
        Ok(out)
    }

    /// Rows `first..first + n` of `w` times `x` as llama.cpp's CPU build
    /// computes them: bit for bit where `family_ops::ggml_cpu` covers the
    /// type ([`WeightReader::matvec_ggml_rows`]), else `x` converted to the
    /// type's `vec_dot_type` (`family_ops::as_ggml_multiplies`) and each
    /// row dotted in `f64`, rounded once.
    ///
    /// # Errors
    ///
    /// As [`WeightReader::matvec`].
    pub fn matvec_llama_rows(
        &self,
        w: &'w Weight,
        first: usize,
        n: usize,
        x: &[f32],
        ubatch: family_ops::ggml_cpu::Ubatch,
    ) -> Result<Vec<f32>, LoadError> {
        if family_ops::ggml_cpu::is_emulated(w.ggml_type()) {
            return self.matvec_ggml_rows(w, first, n, x, ubatch);
        }
        let xq = family_ops::as_ggml_multiplies(w.ggml_type(), x).map_err(|e| read_err(w, e))?;
        let xq: Vec<f64> = xq.into_iter().map(f64::from).collect();
        Ok(self
            .matvec(w, first, n, &xq)?
            .into_iter()
            .map(|v| v as f32)
            .collect())
    }

    /// `W · x` over all rows of `w`.
    ///
    /// # Errors
    ///
    /// As [`WeightReader::matvec`].
    pub fn matvec_all(&self, w: &'w Weight, x: &[f64]) -> Result<Vec<f64>, LoadError> {
        let rows: u64 = w.dims().iter().skip(1).product();
        self.matvec(w, 0, rows as usize, x)
    }

    /// Rows `first..first + n` of `w` dequantized (a row gather: an
    /// embedding lookup).
    ///
    /// # Errors
    ///
    /// The rows are out of range, the seam failed, or the type cannot be
    /// dequantized.
    pub fn rows(&self, w: &'w Weight, first: usize, n: usize) -> Result<Vec<f32>, LoadError> {
        let ne0 = w.dims()[0] as usize;
        let mut out = vec![0f32; n * ne0];
        self.for_each_chunk(w, first as u64, n as u64, |at, bytes| {
            let o = (at as usize - first) * ne0;
            let len = out.len() - o;
            let take = (bytes.len() / row_bytes(w)? as usize * ne0).min(len);
            family_ops::dequantize(w.ggml_type(), bytes, &mut out[o..o + take])
                .map_err(|e| read_err(w, e))
        })?;
        Ok(out)
    }

    /// A small weight (at most [`VECTOR_MAX_ELEMENTS`]) dequantized whole,
    /// kept for the reader's life: the seam is still asked on every call.
    ///
    /// # Errors
    ///
    /// The weight is larger than the limit (a matrix: use
    /// [`WeightReader::matvec`]), the seam failed, or the type cannot be
    /// dequantized.
    pub fn vector(&self, w: &'w Weight) -> Result<Arc<[f32]>, LoadError> {
        let n: u64 = w.dims().iter().product();
        if n > VECTOR_MAX_ELEMENTS {
            return Err(read_err(
                w,
                format!("{n} elements is a matrix, read by rows, never kept dequantized whole"),
            ));
        }
        let key = std::ptr::from_ref(w) as usize;
        let hit = self
            .vectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(hit) = hit {
            // Asked each time all the same: what a step does per weight.
            resident_weight(w, self.platform, self.queue)?;
            return Ok(hit);
        }
        let rows: u64 = w.dims().iter().skip(1).product();
        let values: Arc<[f32]> = self.rows(w, 0, rows as usize)?.into();
        self.vectors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Arc::clone(&values));
        Ok(values)
    }

    /// Small weights kept dequantized: how many, and their `f32` bytes.
    pub fn kept(&self) -> (usize, u64) {
        let v = self.vectors.lock().unwrap_or_else(|e| e.into_inner());
        (v.len(), v.values().map(|a| a.len() as u64 * 4).sum())
    }
}

/// Row `row` of a lazy table (`expert_streamed`, never staged) dequantized,
/// gathered from its borrow.
///
/// # Errors
///
/// The row is out of range, the weight is not borrowed, or the type cannot
/// be dequantized.
pub fn table_row(table: &Weight, row: u64) -> Result<Vec<f32>, LoadError> {
    let HostBytes::Borrow(borrow) = table.host() else {
        return Err(read_err(table, "not borrowed"));
    };
    let ne0 = table.dims()[0] as usize;
    let mut out = vec![0f32; ne0];
    family_ops::dequantize_row(
        table.ggml_type(),
        borrow.bytes(),
        ne0,
        row as usize,
        &mut out,
    )
    .map_err(|e| match e {
        family_ops::OpsError::RowOutOfRange { row, rows } => LoadError::RowOutOfRange {
            name: table.name().to_owned(),
            row: row as u64,
            rows: rows as u64,
        },
        e => read_err(table, e),
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use platform_fake::{FakeConfig, FakePlatform};
    use seam::gguf::GgmlType;
    use seam::platform::Platform;
    use seam::weight::Role;

    use super::*;

    /// An owned F32 matrix of `rows` rows of `ne0`: w[r][i] = r + i/8.
    fn matrix(ne0: usize, rows: usize) -> Weight {
        let bytes: Vec<u8> = (0..rows)
            .flat_map(|r| (0..ne0).map(move |i| r as f32 + i as f32 / 8.0))
            .flat_map(f32::to_le_bytes)
            .collect();
        Weight::owned(
            "m",
            GgmlType::F32,
            vec![ne0 as u64, rows as u64],
            Role::new("m"),
            bytes,
        )
    }

    #[track_caller]
    fn check(platform: &dyn Platform, ne0: usize, rows: usize) {
        let queue = platform.backend().create_queue().unwrap();
        let w = matrix(ne0, rows);
        let reader = WeightReader::new(platform, &*queue);
        let x: Vec<f64> = (0..ne0).map(|i| 1.0 - i as f64 / 16.0).collect();
        let y = reader.matvec_all(&w, &x).unwrap();
        for (r, &v) in y.iter().enumerate() {
            let want: f64 = (0..ne0).map(|i| (r as f64 + i as f64 / 8.0) * x[i]).sum();
            assert_eq!(v, want, "row {r}");
        }
        assert_eq!(reader.matvec(&w, rows - 2, 2, &x).unwrap(), y[rows - 2..]);
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let y32 = reader.matvec_f32(&w, &x32).unwrap();
        assert!(y32.iter().zip(&y).all(|(&a, &b)| a == b as f32), "{y32:?}");
        let row = reader.rows(&w, rows - 1, 1).unwrap();
        assert_eq!(row[1], (rows - 1) as f32 + 0.125);
        assert!(matches!(
            reader.rows(&w, rows, 1),
            Err(LoadError::RowOutOfRange { .. })
        ));
        // Read back: matvec_all, matvec (2 rows), matvec_f32 and one row,
        // in chunks, on a staging device; nothing where the host reads.
        let t = reader.traffic();
        let row = 4 * ne0 as u64;
        let want = if platform.needs_weight_staging() {
            (2 * rows as u64 + 2 + 1) * row
        } else {
            0
        };
        assert_eq!(t.weight_read_back_bytes, want);
        assert_eq!(t.read_back_bytes, want);
        assert_eq!(t.read_backs == 0, want == 0, "{t:?}");
        assert_eq!(t.kernel_launches, Some(0));
    }

    #[test]
    fn matvec_and_rows_read_the_host_view_or_the_device_copy_in_chunks() {
        check(&platform_host::HostPlatform::new(), 16, 5);
        // Rows of 64 KiB: a 1 MiB chunk holds 16, so 40 rows take 3 chunks.
        check(&FakePlatform::new(FakeConfig::default()), 16384, 40);
    }

    #[test]
    fn only_small_weights_are_kept_dequantized() {
        let platform = FakePlatform::new(FakeConfig::default());
        let queue = platform.backend().create_queue().unwrap();
        let reader = WeightReader::new(&platform, &*queue);
        let small = matrix(8, 2);
        let big = matrix(1024, 1025);
        assert_eq!(reader.vector(&small).unwrap().len(), 16);
        assert_eq!(reader.vector(&small).unwrap().len(), 16);
        assert_eq!(reader.kept(), (1, 64));
        let e = reader.vector(&big).unwrap_err();
        assert!(
            e.to_string().contains("never kept dequantized whole"),
            "{e}"
        );
        assert_eq!(reader.kept(), (1, 64));
    }
}
