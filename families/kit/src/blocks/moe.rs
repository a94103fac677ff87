//! The FFN blocks: the SwiGLU FFN (`down(silu(gate · x) · up · x)`, each
//! product times its optional `{1}` scale: a dense FFN or a shared expert)
//! and the routed MoE FFN of `build_moe_ffn` (softmax or sigmoid
//! routing, a selection bias, the picked weights normed and scaled,
//! per-expert scales, the mix, the shared expert added); either SwiGLU
//! clamped where a limit is given ([`SwigluClamps`]).
//!
//! Experts are staged as [`ExpertStaging`] says: on first pick (the
//! router's logits come back, the picks are the host path's own
//! [`family_ops::ggml_cpu::moe`] routing, each picked expert a sub-span
//! borrow staged through the seam) or every stack staged whole before the
//! first token (the routing and the picks stay on the device:
//! [`device_ops::Ops::route`], [`device_ops::Ops::matmul_id`]).

use device_ops::{DType, DeviceRouting, DeviceTensor, Gating};
use family_ops::ggml_cpu::moe;
use seam::weight::{Role, Weight};

use super::context::{BlockContext, op_err};
use crate::{ExpertPart, ExpertStaging, Handle, LoadError};

/// A SwiGLU FFN's weights: gate, up, down, each with its optional `{1}`
/// scale.
#[derive(Clone, Copy, Debug)]
pub struct SwigluWeights {
    /// `[gate, up, down]`.
    pub w: [Handle; 3],
    /// Their scales.
    pub scale: [Option<Handle>; 3],
}

/// The SwiGLU limits of an FFN (`build_ffn`'s `swiglu_limit`): `None`
/// is the plain SwiGLU, `Some(limit)` the clamped one
/// ([`device_ops::Ops::swiglu_clamp`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SwigluClamps {
    /// The routed experts'.
    pub experts: Option<f32>,
    /// The shared expert's (and a dense FFN's).
    pub shared: Option<f32>,
}

impl SwigluClamps {
    /// No clamp anywhere.
    pub const NONE: SwigluClamps = SwigluClamps {
        experts: None,
        shared: None,
    };

    /// A limit as llama.cpp reads it: at most `1e-6` (0, unset) is none.
    pub fn limit(l: f32) -> Option<f32> {
        (l > 1e-6).then_some(l)
    }
}

/// `swiglu(gate, up)`, clamped at `limit` where there is one.
fn activate(
    cx: &BlockContext<'_>,
    gate: &DeviceTensor,
    up: &DeviceTensor,
    limit: Option<f32>,
) -> Result<DeviceTensor, LoadError> {
    match limit {
        Some(l) => cx.ops().swiglu_clamp(gate, up, l),
        None => cx.ops().swiglu(gate, up),
    }
    .map_err(op_err)
}

/// `down(swiglu(gate · x, up · x))` of `x` (`[n, E]`).
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
pub fn swiglu_ffn(
    cx: &BlockContext<'_>,
    f: &SwigluWeights,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    swiglu_ffn_clamped(cx, f, None, x)
}

/// [`swiglu_ffn`] with the SwiGLU clamped at `limit` where there is one.
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
pub fn swiglu_ffn_clamped(
    cx: &BlockContext<'_>,
    f: &SwigluWeights,
    limit: Option<f32>,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let up = cx.matmul_scaled(f.w[1], f.scale[1], x)?;
    let gate = cx.matmul_scaled(f.w[0], f.scale[0], x)?;
    let act = activate(cx, &gate, &up, limit)?;
    cx.matmul_scaled(f.w[2], f.scale[2], &act)
}

/// A routed MoE FFN's weights and routing.
#[derive(Clone, Copy, Debug)]
pub struct RoutedWeights {
    /// The router (`[E, n_expert]`).
    pub router: Handle,
    /// The selection bias (`[n_expert]`, F32), if any.
    pub bias: Option<Handle>,
    /// The expert stacks `[gate, up, down]`.
    pub stacks: [Handle; 3],
    /// The role of one expert of each stack.
    pub expert_roles: [&'static str; 3],
    /// Per-expert scales of each stack (`[n_expert]`), if any.
    pub stack_scales: [Option<Handle>; 3],
    /// The shared expert, if any.
    pub shared: Option<SwigluWeights>,
}

/// The routing's rule.
#[derive(Clone, Copy, Debug)]
pub struct RoutingRule {
    /// Logits to probabilities.
    pub gating: Gating,
    /// Experts picked per token.
    pub k: usize,
    /// The picked weights divided by their sum.
    pub normalize: bool,
    /// Then times this.
    pub scale: f32,
}

/// The picks of one token's router `logits`, `(expert, weight)` in
/// ggml's order, as the host path makes them.
pub fn pick_experts(logits: &[f32], bias: Option<&[f32]>, rule: &RoutingRule) -> Vec<(usize, f32)> {
    match rule.gating {
        Gating::Sigmoid => moe::route_sigmoid(logits, bias, rule.k, rule.normalize, rule.scale),
        Gating::Softmax => moe::route_softmax(logits, rule.k, rule.normalize, rule.scale),
    }
}

/// The routed FFN's output for `n` tokens (`x` `[n, E]`), plus the shared
/// expert's (experts picked on the host: a token at a time).
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
pub fn routed_ffn(
    cx: &BlockContext<'_>,
    m: &RoutedWeights,
    rule: &RoutingRule,
    staging: ExpertStaging,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    routed_ffn_clamped(cx, m, rule, SwigluClamps::NONE, staging, x)
}

/// [`routed_ffn`] with the experts' and the shared expert's SwiGLU
/// clamped as `clamps` says.
///
/// # Errors
///
/// A weight the seam could not stage, or an op failed.
pub fn routed_ffn_clamped(
    cx: &BlockContext<'_>,
    m: &RoutedWeights,
    rule: &RoutingRule,
    clamps: SwigluClamps,
    staging: ExpertStaging,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let (n, n_embd) = x.rows_cols("moe").map_err(op_err)?;
    let limit = clamps.experts;
    let routed = match staging {
        ExpertStaging::OnPick if n > 1 => {
            let mut out = cx.ops().zeros(DType::F32, &[n, n_embd]).map_err(op_err)?;
            for t in 0..n {
                let xt = cx.rows_of(x, t..t + 1)?;
                let y = routed_on_pick(cx, m, rule, limit, &xt)?;
                cx.ops().write_rows(&mut out, t, &y).map_err(op_err)?;
            }
            out
        }
        ExpertStaging::OnPick => routed_on_pick(cx, m, rule, limit, x)?,
        ExpertStaging::All => routed_on_device(cx, m, rule, limit, x)?,
    };
    match &m.shared {
        Some(s) => {
            let sh = swiglu_ffn_clamped(cx, s, clamps.shared, x)?;
            cx.ops().add(&routed, &sh).map_err(op_err)
        }
        None => Ok(routed),
    }
}

/// The weights of every stack of `m` staged whole, for [`stage_all`].
///
/// # Errors
///
/// A handle that is not an expert stack.
pub fn whole_stacks<'m>(
    cx: &BlockContext<'m>,
    m: &RoutedWeights,
) -> Result<Vec<&'m Weight>, LoadError> {
    m.stacks
        .iter()
        .map(|&s| cx.weights().whole_stack(s))
        .collect()
}

/// Stages `weights` (every dense weight and whole stack, `--stage all`)
/// in parallel, each worker with its own queue.
///
/// # Errors
///
/// The seam failed to stage one.
pub fn stage_all(cx: &BlockContext<'_>, weights: &[&Weight]) -> Result<(), LoadError> {
    /// Threads staging at once, as a load spreads over the ring's lanes.
    const STAGING_WORKERS: usize = 4;
    crate::weights::stage_in_parallel(weights, cx.platform(), STAGING_WORKERS)
}

/// `y` times the per-expert scale `scale[e]` (`y` one expert's output).
fn times_expert_scale(
    cx: &BlockContext<'_>,
    scale: Option<Handle>,
    e: usize,
    y: DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    match scale {
        Some(s) => {
            let s = cx.small(s)?;
            let se = cx.ops().slice_cols(&s, e, 1).map_err(op_err)?;
            cx.ops().mul(&y, &se).map_err(op_err)
        }
        None => Ok(y),
    }
}

/// The experts picked on the host, each staged on first pick.
fn routed_on_pick(
    cx: &BlockContext<'_>,
    m: &RoutedWeights,
    rule: &RoutingRule,
    limit: Option<f32>,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let ops = cx.ops();
    let logits = cx.matmul(m.router, x)?;
    let logits = cx.read_back(&logits)?;
    let bias = m.bias.map(|b| cx.host_vector(b)).transpose()?;
    let picked = pick_experts(&logits, bias.as_deref(), rule);
    let expert = |part: usize, e: usize| -> Result<&Weight, LoadError> {
        cx.weights().expert(
            m.stacks[part],
            e as u64,
            ExpertPart::whole(Role::new(m.expert_roles[part])),
        )
    };
    let k = picked.len();
    let n_embd = x.len();
    let mut outs = ops.zeros(DType::F32, &[k, n_embd]).map_err(op_err)?;
    for (slot, &(e, _)) in picked.iter().enumerate() {
        let up = cx.device().matmul(expert(1, e)?, x)?;
        let up = times_expert_scale(cx, m.stack_scales[1], e, up)?;
        let gate = cx.device().matmul(expert(0, e)?, x)?;
        let gate = times_expert_scale(cx, m.stack_scales[0], e, gate)?;
        let act = activate(cx, &gate, &up, limit)?;
        let y = cx.device().matmul(expert(2, e)?, &act)?;
        let y = times_expert_scale(cx, m.stack_scales[2], e, y)?;
        ops.write_rows(&mut outs, slot, &y).map_err(op_err)?;
    }
    let weights: Vec<f32> = picked.iter().map(|&(_, w)| w).collect();
    let weights = ops.upload_f32(&weights, &[1, k]).map_err(op_err)?;
    let outs = outs.reshape(&[1, k, n_embd]).map_err(op_err)?;
    ops.mix_experts(&outs, &weights).map_err(op_err)
}

/// `y` (`[n, k, cols]`) times each pick's scale of `scale` at `ids`:
/// `[n · k, cols]`.
fn scaled_per_pick(
    cx: &BlockContext<'_>,
    scale: Option<Handle>,
    ids: &DeviceTensor,
    y: DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let (k, cols) = (y.shape()[0] * y.shape()[1], y.shape()[2]);
    match scale {
        Some(s) => {
            let table = cx.small(s)?;
            let n = table.len();
            let table = cx
                .ops()
                .slice_cols(&table, 0, n)
                .and_then(|t| t.reshape(&[n, 1]))
                .map_err(op_err)?;
            let picked = cx
                .ops()
                .gather_rows(&table, ids)
                .and_then(|t| t.reshape(&[k, 1]))
                .map_err(op_err)?;
            cx.ops()
                .mix_experts(&y.reshape(&[k, 1, cols]).map_err(op_err)?, &picked)
                .map_err(op_err)
        }
        None => y.reshape(&[k, cols]).map_err(op_err),
    }
}

/// Routed and multiplied on the device, every stack staged whole.
fn routed_on_device(
    cx: &BlockContext<'_>,
    m: &RoutedWeights,
    rule: &RoutingRule,
    limit: Option<f32>,
    x: &DeviceTensor,
) -> Result<DeviceTensor, LoadError> {
    let ops = cx.ops();
    let logits = cx.matmul(m.router, x)?;
    let bias = m.bias.map(|b| cx.small(b)).transpose()?;
    let routing = DeviceRouting {
        gating: rule.gating,
        k: rule.k,
        bias: bias.as_deref(),
        normalize: rule.normalize,
        scale: rule.scale,
    };
    let (ids, wts) = ops.route(&logits, &routing).map_err(op_err)?;
    let stacks = whole_stacks(cx, m)?;
    let up = cx.device().matmul_id(stacks[1], x, &ids)?;
    let up = scaled_per_pick(cx, m.stack_scales[1], &ids, up)?;
    let gate = cx.device().matmul_id(stacks[0], x, &ids)?;
    let gate = scaled_per_pick(cx, m.stack_scales[0], &ids, gate)?;
    let act = activate(cx, &gate, &up, limit)?;
    let y = cx.device().matmul_id(stacks[2], &act, &ids)?;
    let (n, k, cols) = (y.shape()[0], y.shape()[1], y.shape()[2]);
    let y = scaled_per_pick(cx, m.stack_scales[2], &ids, y)?
        .reshape(&[n, k, cols])
        .map_err(op_err)?;
    ops.mix_experts(&y, &wts).map_err(op_err)
}
