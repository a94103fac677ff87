//! Reading llama.cpp's goldens (`tests/data/<family>/*.golden.json`: the
//! prompt, the greedy tokens, a row of logits per position) in the
//! families' golden tests, one home for what each of them parsed alike.

use std::path::Path;

use serde_json::Value;

/// The golden at `path`, parsed. Python's `json.dump` writes `-Infinity`,
/// `Infinity` and `NaN` (in the metadata echo, for keys such as
/// `qwen4exp.kda.gate_lower_bound`), which JSON does not have: they are
/// read as `null`.
///
/// # Errors
///
/// The file cannot be read or is not JSON after that.
pub fn read(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .replace(": -Infinity", ": null")
        .replace(": Infinity", ": null")
        .replace(": NaN", ": null");
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The rows of logits under a golden's key (`prefill_logits`,
/// `step_logits`, ...): an array of arrays of numbers.
///
/// # Errors
///
/// The value is not an array of arrays of numbers.
pub fn logit_rows(v: &Value) -> Result<Vec<Vec<f64>>, String> {
    let rows = v.as_array().ok_or("logit rows: not an array")?;
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            row.as_array()
                .ok_or(format!("logit row {i}: not an array"))?
                .iter()
                .map(|x| {
                    x.as_f64()
                        .ok_or(format!("logit row {i}: not a number: {x}"))
                })
                .collect()
        })
        .collect()
}

/// Token ids under a golden's key (`prompt`, `greedy`).
///
/// # Errors
///
/// The value is not an array of integers that fit `u32`.
pub fn token_ids(v: &Value) -> Result<Vec<u32>, String> {
    v.as_array()
        .ok_or("tokens: not an array")?
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or(format!("tokens: not a u32: {t}"))
        })
        .collect()
}

/// The largest absolute difference between our logits and a golden row;
/// infinite when the lengths differ (no tolerance passes it).
pub fn max_abs_diff(ours: &[f32], golden: &[f64]) -> f64 {
    if ours.len() != golden.len() {
        return f64::INFINITY;
    }
    ours.iter()
        .zip(golden)
        .map(|(&x, &y)| (f64::from(x) - y).abs())
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_tokens_and_differences_are_read_and_bad_values_named() {
        let v: Value = serde_json::json!({"rows": [[1.0, -2.5], [0.5, 3.0]], "tokens": [1, 7]});
        assert_eq!(logit_rows(&v["rows"]).unwrap(), [[1.0, -2.5], [0.5, 3.0]]);
        assert_eq!(token_ids(&v["tokens"]).unwrap(), [1, 7]);
        assert!(
            logit_rows(&serde_json::json!([[1.0, "x"]]))
                .unwrap_err()
                .contains("row 0")
        );
        assert!(logit_rows(&serde_json::json!(3)).is_err());
        assert!(token_ids(&serde_json::json!([-1])).is_err());
        assert!(token_ids(&serde_json::json!([4294967296u64])).is_err());
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 1.0]), 1.0);
        assert_eq!(max_abs_diff(&[1.0], &[1.0, 2.0]), f64::INFINITY);
    }
}
