//! Typed reads of a file's metadata for one architecture, with errors
//! naming the full key: required, optional and per-layer keys, the
//! architecture check, and the family's own defaults (an absent optional
//! key is `None`; the family picks the default, so absent keys can take an
//! architecture's own constants rather than neutral ones).

use seam::gguf::{Array, Header, Value};

use crate::error::LoadError;

/// Reads `{arch}.*` keys of one header.
#[derive(Clone, Copy, Debug)]
pub struct Meta<'h> {
    header: &'h Header,
    arch: &'static str,
}

fn array_u64(a: &Array) -> Option<Vec<u64>> {
    fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<u64>) -> Option<Vec<u64>> {
        v.iter().map(|&x| f(x)).collect()
    }
    match a {
        Array::U8(v) => conv(v, |x| Some(x.into())),
        Array::U16(v) => conv(v, |x| Some(x.into())),
        Array::U32(v) => conv(v, |x| Some(x.into())),
        Array::U64(v) => conv(v, Some),
        Array::I8(v) => conv(v, |x| u64::try_from(x).ok()),
        Array::I16(v) => conv(v, |x| u64::try_from(x).ok()),
        Array::I32(v) => conv(v, |x| u64::try_from(x).ok()),
        Array::I64(v) => conv(v, |x| u64::try_from(x).ok()),
        _ => None,
    }
}

impl<'h> Meta<'h> {
    /// Checks `general.architecture` against `accepted` (the family's name
    /// first, then any alias it also accepts) and reads `{accepted[0]}.*`
    /// keys.
    ///
    /// # Errors
    ///
    /// The key is absent, not a string, or names another architecture.
    pub fn for_arch(header: &'h Header, accepted: &[&'static str]) -> Result<Meta<'h>, LoadError> {
        let arch = accepted[0];
        match header.get("general.architecture") {
            Some(Value::String(s)) => match accepted.iter().find(|a| **a == s.as_str()) {
                Some(&found) => Ok(Meta {
                    header,
                    arch: found,
                }),
                None => Err(LoadError::WrongArchitecture {
                    expected: arch,
                    found: Some(s.clone()),
                }),
            },
            Some(other) => Err(LoadError::KeyType {
                key: "general.architecture".into(),
                expected: "a string",
                found: other.type_name(),
            }),
            None => Err(LoadError::WrongArchitecture {
                expected: arch,
                found: None,
            }),
        }
    }

    /// The architecture the file names (one of those accepted).
    pub fn arch(&self) -> &'static str {
        self.arch
    }

    /// The header.
    pub fn header(&self) -> &'h Header {
        self.header
    }

    /// The full key of `name` (`ssm.conv_kernel` -> `qwen4exp.ssm.conv_kernel`).
    pub fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.arch)
    }

    /// The value of `{arch}.{name}`.
    pub fn get(&self, name: &str) -> Option<&'h Value> {
        self.header.get(&self.key(name))
    }

    /// An error naming `{arch}.{name}`: its value is out of its domain.
    pub fn bad(&self, name: &str, reason: impl Into<String>) -> LoadError {
        LoadError::KeyValue {
            key: self.key(name),
            reason: reason.into(),
        }
    }

    /// An error naming `{arch}.{name}`: required and absent.
    pub fn missing(&self, name: &str) -> LoadError {
        LoadError::MissingKey {
            key: self.key(name),
        }
    }

    fn wrong_type(&self, name: &str, expected: &'static str, v: &Value) -> LoadError {
        LoadError::KeyType {
            key: self.key(name),
            expected,
            found: v.type_name(),
        }
    }

    /// An optional non-negative integer.
    ///
    /// # Errors
    ///
    /// The value is not a non-negative integer.
    pub fn opt_u64(&self, name: &str) -> Result<Option<u64>, LoadError> {
        self.get(name)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.wrong_type(name, "a non-negative integer", v))
            })
            .transpose()
    }

    /// A required non-negative integer.
    ///
    /// # Errors
    ///
    /// Absent, or not a non-negative integer.
    pub fn req_u64(&self, name: &str) -> Result<u64, LoadError> {
        self.opt_u64(name)?.ok_or_else(|| self.missing(name))
    }

    /// A required integer that must be > 0.
    ///
    /// # Errors
    ///
    /// Absent, not an integer, or 0.
    pub fn req_positive(&self, name: &str) -> Result<u64, LoadError> {
        let v = self.req_u64(name)?;
        self.positive(name, v)
    }

    /// `v` if it is > 0, else an error naming the key.
    ///
    /// # Errors
    ///
    /// `v` is 0.
    pub fn positive(&self, name: &str, v: u64) -> Result<u64, LoadError> {
        if v == 0 {
            Err(self.bad(name, "must be > 0"))
        } else {
            Ok(v)
        }
    }

    /// An optional float (F32 or F64).
    ///
    /// # Errors
    ///
    /// The value is not a float.
    pub fn opt_f32(&self, name: &str) -> Result<Option<f32>, LoadError> {
        self.get(name)
            .map(|v| match v {
                Value::F32(x) => Ok(*x),
                Value::F64(x) => Ok(*x as f32),
                other => Err(self.wrong_type(name, "a float", other)),
            })
            .transpose()
    }

    /// An optional array of non-negative integers.
    ///
    /// # Errors
    ///
    /// The value is not such an array.
    pub fn opt_u64_array(&self, name: &str) -> Result<Option<Vec<u64>>, LoadError> {
        self.get(name)
            .map(|v| match v {
                Value::Array(a) => array_u64(a)
                    .ok_or_else(|| self.wrong_type(name, "an array of non-negative integers", v)),
                other => Err(self.wrong_type(name, "an array of non-negative integers", other)),
            })
            .transpose()
    }

    /// A scalar or a per-layer array, as one value per layer. An array has
    /// `block_count` entries (or `n_layer`: trailing MTP blocks left out).
    ///
    /// # Errors
    ///
    /// Not an integer or an integer array, or an array of another length.
    pub fn per_layer(
        &self,
        name: &str,
        n_layer: usize,
        block_count: u64,
    ) -> Result<Option<Vec<u64>>, LoadError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        if let Some(x) = v.as_u64() {
            return Ok(Some(vec![x; n_layer]));
        }
        let expected = "a non-negative integer or a per-layer array of them";
        let Value::Array(a) = v else {
            return Err(self.wrong_type(name, expected, v));
        };
        let values = array_u64(a).ok_or_else(|| self.wrong_type(name, expected, v))?;
        self.check_per_layer_len(name, values.len(), n_layer, block_count)?;
        Ok(Some(values[..n_layer].to_vec()))
    }

    /// Checks a per-layer array's length: `block_count` or `n_layer`.
    ///
    /// # Errors
    ///
    /// Another length.
    pub fn check_per_layer_len(
        &self,
        name: &str,
        len: usize,
        n_layer: usize,
        block_count: u64,
    ) -> Result<(), LoadError> {
        if len == n_layer || len as u64 == block_count {
            Ok(())
        } else {
            Err(self.bad(
                name,
                format!(
                    "a per-layer array of {len} entries; expected {block_count} (block_count) or {n_layer} (layers without MTP)"
                ),
            ))
        }
    }

    /// An optional boolean (or a 0/1 integer).
    ///
    /// # Errors
    ///
    /// The value is neither.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, LoadError> {
        self.get(name)
            .map(|v| match v {
                Value::Bool(b) => Ok(*b),
                other => other
                    .as_u64()
                    .filter(|&x| x <= 1)
                    .map(|x| x == 1)
                    .ok_or_else(|| self.wrong_type(name, "a boolean", other)),
            })
            .transpose()
    }

    /// An optional array of booleans (or of 0/1 integers).
    ///
    /// # Errors
    ///
    /// The value is not such an array.
    pub fn opt_bool_array(&self, name: &str) -> Result<Option<Vec<bool>>, LoadError> {
        self.get(name)
            .map(|v| match v {
                Value::Array(Array::Bool(b)) => Ok(b.clone()),
                Value::Array(a) => array_u64(a)
                    .filter(|v| v.iter().all(|&x| x <= 1))
                    .map(|v| v.into_iter().map(|x| x == 1).collect())
                    .ok_or_else(|| self.wrong_type(name, "an array of booleans", v)),
                other => Err(self.wrong_type(name, "an array of booleans", other)),
            })
            .transpose()
    }

    /// A required non-negative integer outside the architecture's prefix
    /// (`tokenizer.ggml.mask_token_id`), by its full key.
    ///
    /// # Errors
    ///
    /// Absent, or not a non-negative integer.
    pub fn req_u64_global(&self, key: &str) -> Result<u64, LoadError> {
        match self.header.get(key) {
            None => Err(LoadError::MissingKey { key: key.into() }),
            Some(v) => v.as_u64().ok_or_else(|| LoadError::KeyType {
                key: key.into(),
                expected: "a non-negative integer",
                found: v.type_name(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use seam::gguf::{GgufModel, GgufWriter};

    use super::*;

    fn check(pairs: &[(&str, Value)], f: impl FnOnce(Meta<'_>)) {
        let mut w = GgufWriter::new();
        for (k, v) in pairs {
            w.add_metadata(*k, v.clone());
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        w.write_file(&path).unwrap();
        let model = GgufModel::open(&path, seam::borrow::MapOptions { prefault: false }).unwrap();
        f(Meta::for_arch(model.header(), &["fam", "fam-alias"]).unwrap());
    }

    #[test]
    fn keys_are_read_and_refusals_name_the_key() {
        let arch = ("general.architecture", Value::String("fam".into()));
        check(
            &[
                arch.clone(),
                ("fam.n", Value::U32(3)),
                ("fam.z", Value::U32(0)),
                ("fam.s", Value::String("x".into())),
                ("fam.per", Value::Array(Array::U32(vec![1, 2, 3]))),
            ],
            |m| {
                assert_eq!(m.req_u64("n").unwrap(), 3);
                assert_eq!(m.opt_u64("absent").unwrap(), None);
                let e = m.req_u64("absent").unwrap_err();
                assert!(matches!(e, LoadError::MissingKey { key } if key == "fam.absent"));
                let e = m.req_positive("z").unwrap_err();
                assert!(matches!(e, LoadError::KeyValue { key, .. } if key == "fam.z"));
                let e = m.req_u64("s").unwrap_err();
                assert!(matches!(e, LoadError::KeyType { key, .. } if key == "fam.s"));
                assert_eq!(m.per_layer("n", 2, 2).unwrap(), Some(vec![3, 3]));
                assert_eq!(m.per_layer("per", 3, 3).unwrap(), Some(vec![1, 2, 3]));
                assert_eq!(m.per_layer("per", 2, 3).unwrap(), Some(vec![1, 2]));
                let e = m.per_layer("per", 4, 4).unwrap_err();
                assert!(matches!(e, LoadError::KeyValue { key, .. } if key == "fam.per"));
            },
        );
    }

    #[test]
    fn the_architecture_is_checked_and_an_alias_reads_its_own_prefix() {
        check(
            &[
                ("general.architecture", Value::String("fam-alias".into())),
                ("fam-alias.n", Value::U32(7)),
            ],
            |m| {
                assert_eq!(m.arch(), "fam-alias");
                assert_eq!(m.req_u64("n").unwrap(), 7);
            },
        );
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::String("other".into()));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        w.write_file(&path).unwrap();
        let model = GgufModel::open(&path, seam::borrow::MapOptions { prefault: false }).unwrap();
        let e = Meta::for_arch(model.header(), &["fam"]).unwrap_err();
        assert!(
            matches!(&e, LoadError::WrongArchitecture { expected: "fam", found: Some(f) } if f == "other"),
            "{e}"
        );
    }
}
