//! Keyword knobs: `seam.open(path, "cuda:0", pinned_h2d_mib=8)` sets the
//! knob whose environment variable is `VT_PINNED_H2D_MIB`, for that
//! session only.
//!
//! A keyword is the `VT_*` name without its prefix, in either case
//! (`pinned_h2d_mib` or `PINNED_H2D_MIB`). It is read exactly as that
//! environment variable would be (the seam's own resolution: environment,
//! then the config file, then the device default; the same parsing and the
//! same errors, the source printed as `env VT_...`), and it overrides the
//! process's variable of that name. `True`/`False` are `on`/`off`; any
//! other value is its `str()` (`8`, `"auto"`), parsed as the variable's
//! text is (`8.5` is refused as the variable `8.5` would be); `None` is a
//! keyword not given. A keyword that names no knob, or names one twice, is
//! a `PolicyError`.

use std::collections::BTreeMap;

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};
use seam::policy::{KNOBS, Knob};
use seam::ring::RING_KNOBS;
use seam::session::Env;

use crate::errors::PolicyError;

/// Every knob a session resolves.
fn all_knobs() -> impl Iterator<Item = &'static Knob> {
    KNOBS.iter().chain(RING_KNOBS)
}

/// The keyword of a knob: its variable without `VT_`, lower case.
fn keyword(knob: &Knob) -> String {
    knob.env
        .strip_prefix("VT_")
        .unwrap_or(knob.env)
        .to_ascii_lowercase()
}

/// The knob a keyword names, in either case.
fn knob_of(name: &str) -> Option<&'static Knob> {
    let lower = name.to_ascii_lowercase();
    all_knobs().find(|k| keyword(k) == lower)
}

/// The keywords `seam.open` takes as knobs, with the environment variable
/// each one stands for.
#[pyfunction]
pub fn knob_names() -> Vec<(String, &'static str)> {
    all_knobs().map(|k| (keyword(k), k.env)).collect()
}

/// A keyword's value as the text of its environment variable (`None`:
/// not given).
fn env_text(value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    if value.is_none() {
        return Ok(None);
    }
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Some(if b.is_true() { "on" } else { "off" }.to_owned()));
    }
    Ok(Some(value.str()?.to_string()))
}

/// The session's environment: the process's `VT_*` variables with the
/// keyword knobs over them.
///
/// # Errors
///
/// A keyword names no knob, or one knob twice (in two cases).
pub fn session_env(knobs: Option<&Bound<'_, PyDict>>) -> PyResult<Env> {
    let mut vars: BTreeMap<String, String> = std::env::vars()
        .filter(|(name, _)| name.starts_with("VT_"))
        .collect();
    let mut given: BTreeMap<&'static str, String> = BTreeMap::new();
    if let Some(knobs) = knobs {
        for (name, value) in knobs.iter() {
            let name: String = name.extract()?;
            let knob = knob_of(&name).ok_or_else(|| {
                let known: Vec<String> = all_knobs().map(keyword).collect();
                PolicyError::new_err(format!(
                    "unknown knob {name:?} (known: {})",
                    known.join(", ")
                ))
            })?;
            if let Some(first) = given.insert(knob.env, name.clone()) {
                return Err(PolicyError::new_err(format!(
                    "knob {} given twice ({first:?} and {name:?})",
                    knob.env
                )));
            }
            if let Some(text) = env_text(&value)? {
                vars.insert(knob.env.to_owned(), text);
            }
        }
    }
    Ok(Env::Vars(vars))
}
