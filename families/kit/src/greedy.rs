//! The greedy decode loop every family's forward pass drives: the prompt
//! one token at a time, then argmax steps.

use crate::LoadError;

/// What [`greedy`] produced.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The greedy tokens.
    pub generated: Vec<u32>,
    /// Logits after every prompt position, then after each greedy step but
    /// the last (the logits each generated token came from are last).
    pub logits: Vec<Vec<f32>>,
}

/// Feeds `prompt` to `step` one token at a time, then decodes `steps`
/// tokens greedily ([`family_ops::argmax`]: ties to the lower id), calling
/// `after_step` after the prompt and after each step.
///
/// # Errors
///
/// An empty prompt, or what `step` returns.
pub fn greedy(
    prompt: &[u32],
    steps: usize,
    step: &mut dyn FnMut(u32) -> Result<Vec<f32>, LoadError>,
    after_step: &mut dyn FnMut(),
) -> Result<Decoded, LoadError> {
    if prompt.is_empty() {
        return Err(LoadError::empty_prompt());
    }
    let mut logits = Vec::with_capacity(prompt.len() + steps);
    for &t in prompt {
        logits.push(step(t)?);
    }
    after_step();
    let mut generated = Vec::with_capacity(steps);
    for i in 0..steps {
        let next = family_ops::argmax(logits.last().expect("a prompt position")) as u32;
        generated.push(next);
        if i + 1 < steps {
            logits.push(step(next)?);
        }
        after_step();
    }
    Ok(Decoded { generated, logits })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_then_argmax_steps_each_fed_back() {
        // Logits favour token (last fed + 1) % 4.
        let mut fed = Vec::new();
        let mut step = |t: u32| {
            fed.push(t);
            let mut l = vec![0.0; 4];
            l[((t + 1) % 4) as usize] = 1.0;
            Ok(l)
        };
        let mut calls = 0;
        let out = greedy(&[2, 0], 3, &mut step, &mut || calls += 1).unwrap();
        assert_eq!(out.generated, [1, 2, 3]);
        assert_eq!(fed, [2, 0, 1, 2]);
        assert_eq!(out.logits.len(), 4);
        assert_eq!(calls, 4);
        let err = greedy(&[], 1, &mut |_| Ok(vec![0.0]), &mut || {}).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
