//! An epoch's learning statistics: the check that they are finite, and their summary.

use foxhunt_dqn::UpdateStats;

use crate::TrainError;
use crate::report::EpochSummary;

/// Fails with [`TrainError::NonFinite`] at the first update whose statistics are not all
/// finite; `steps[k]` is the step of update `k` within epoch `epoch` of window `window`.
pub(crate) fn check_finite(
    stats: &[UpdateStats],
    steps: &[usize],
    window: usize,
    epoch: usize,
) -> Result<(), TrainError> {
    let Some((k, what)) = stats
        .iter()
        .enumerate()
        .find_map(|(k, s)| s.first_non_finite().map(|w| (k, w)))
    else {
        return Ok(());
    };
    let last_finite = k
        .checked_sub(1)
        .map(|j| {
            let s = stats[j];
            format!(
                "step {}: loss {} mean Q {} mean |TD| {} grad norm {}",
                steps[j], s.loss, s.mean_q, s.td_abs_mean, s.grad_norm
            )
        })
        .unwrap_or_else(|| "none in this epoch".into());
    Err(TrainError::NonFinite {
        window,
        epoch,
        step: steps[k],
        what: what.into(),
        last_finite,
    })
}

/// The epoch's line of the window report: means over its updates (none before the first).
pub(crate) fn summarize(
    epoch: usize,
    stats: &[UpdateStats],
    epsilon: f64,
    val_pnl: f64,
) -> EpochSummary {
    let mean = |f: fn(&UpdateStats) -> f32| {
        (!stats.is_empty()).then(|| stats.iter().map(f).sum::<f32>() / stats.len() as f32)
    };
    EpochSummary {
        epoch,
        loss: mean(|s| s.loss),
        mean_q: mean(|s| s.mean_q),
        td_abs_mean: mean(|s| s.td_abs_mean),
        grad_norm: mean(|s| s.grad_norm),
        epsilon,
        val_pnl,
    }
}
