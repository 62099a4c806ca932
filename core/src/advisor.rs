//! The gate advisor (issue 33, seed 000 §07): whether a person's gate on a tool and rule pays,
//! from its recorded decisions and the reversal cost admins set for the tool.
//!
//! Seed 000: with a rejection rate r and a reversal cost k (in approvals: what undoing a wrong
//! call costs, measured in the time of one person's review), a gate saves r × k approvals'
//! worth per gated call and costs one, so it pays when r × k > 1.
//!
//! Invariants:
//! * Pure: counts in, advice out. It never changes anything; a draft it suggests is a
//!   proposal a second person approves.
//! * The advice is only as strong as the evidence: r is bounded by its Wilson score interval
//!   (95 %), and the gate is said to pay (or not) only when the whole interval says so;
//!   fewer than [`MIN_DECISIONS`] decisions, or no reversal cost, give no recommendation.

use serde::{Deserialize, Serialize};

/// Fewer decided gates than this give no recommendation.
pub const MIN_DECISIONS: u32 = 20;

/// The normal quantile of the interval (95 %, two-sided).
pub const Z: f64 = 1.96;

/// The Wilson score interval of `rejected` out of `decided` at [`Z`]; `None` with no
/// decisions.
pub fn wilson(decided: u32, rejected: u32) -> Option<(f64, f64)> {
    if decided == 0 {
        return None;
    }
    let n = f64::from(decided);
    let p = f64::from(rejected.min(decided)) / n;
    let z2 = Z * Z;
    let centre = p + z2 / (2.0 * n);
    let half = Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    let denominator = 1.0 + z2 / n;
    Some((
        ((centre - half) / denominator).max(0.0),
        ((centre + half) / denominator).min(1.0),
    ))
}

/// What the advisor says of one gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Advice {
    /// Fewer than [`MIN_DECISIONS`] decisions.
    TooFew,
    /// No reversal cost is set for the tool: the rate alone cannot say.
    NoCost,
    /// Even the interval's lowest rate × k exceeds one review: keep the person.
    Pays,
    /// Even the interval's highest rate × k is below one review: the person's time is spent
    /// for less than it saves; consider the model reviewer.
    ConsiderReviewer,
    /// The interval straddles the break-even: keep the gate and gather evidence.
    Undecided,
}

impl Advice {
    /// Its code (`too_few`, `no_cost`, `pays`, `consider_reviewer`, `undecided`), as it is
    /// serialized.
    pub fn code(self) -> &'static str {
        match self {
            Self::TooFew => "too_few",
            Self::NoCost => "no_cost",
            Self::Pays => "pays",
            Self::ConsiderReviewer => "consider_reviewer",
            Self::Undecided => "undecided",
        }
    }

    /// The recommendation in plain words.
    pub fn words(self) -> &'static str {
        match self {
            Self::TooFew => "not enough decisions yet",
            Self::NoCost => "set the tool's reversal cost to get a recommendation",
            Self::Pays => "the gate pays",
            Self::ConsiderReviewer => "consider moving this step to the model reviewer",
            Self::Undecided => "the evidence does not decide yet: keep the gate",
        }
    }
}

/// The advice for `rejected` out of `decided` gates at reversal cost `k` (approvals).
pub fn advise(decided: u32, rejected: u32, k: Option<f64>) -> Advice {
    let Some((lo, hi)) = wilson(decided, rejected).filter(|_| decided >= MIN_DECISIONS) else {
        return Advice::TooFew;
    };
    // A cost of nothing says nothing: no gate could pay for it.
    let Some(k) = k.filter(|k| k.is_finite() && *k > 0.0) else {
        return Advice::NoCost;
    };
    if lo * k > 1.0 {
        Advice::Pays
    } else if hi * k < 1.0 {
        Advice::ConsiderReviewer
    } else {
        Advice::Undecided
    }
}

/// Which way the rate moved between the older and the newer half of the window: `rising`,
/// `falling` or `steady` (the two halves' intervals overlap), `None` when either half has no
/// decisions.
pub fn trend(older: (u32, u32), newer: (u32, u32)) -> Option<&'static str> {
    let (a_lo, a_hi) = wilson(older.0, older.1)?;
    let (b_lo, b_hi) = wilson(newer.0, newer.1)?;
    Some(if b_lo > a_hi {
        "rising"
    } else if b_hi < a_lo {
        "falling"
    } else {
        "steady"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_brackets_the_rate_and_narrows_with_evidence() {
        let (lo, hi) = wilson(100, 10).unwrap();
        assert!(lo < 0.1 && 0.1 < hi, "{lo} {hi}");
        let (lo2, hi2) = wilson(1000, 100).unwrap();
        assert!(hi2 - lo2 < hi - lo);
        // Zero rejections still leave a positive upper bound.
        let (lo, hi) = wilson(50, 0).unwrap();
        assert!(lo.abs() < 1e-12 && hi > 0.05 && hi < 0.1, "{lo} {hi}");
        assert_eq!(wilson(0, 0), None);
    }

    #[test]
    fn advice_on_crafted_histories() {
        // r ≈ 0 over many decisions, a cheap reversal: the person costs more than they save.
        assert_eq!(advise(400, 0, Some(50.0)), Advice::ConsiderReviewer);
        // r high: the gate pays even at its lowest plausible rate.
        assert_eq!(advise(100, 40, Some(10.0)), Advice::Pays);
        // Too few decisions, whatever they say.
        assert_eq!(advise(MIN_DECISIONS - 1, 10, Some(10.0)), Advice::TooFew);
        // No reversal cost, or one of nothing.
        assert_eq!(advise(100, 40, None), Advice::NoCost);
        assert_eq!(advise(100, 100, Some(0.0)), Advice::NoCost);
        // r ≈ 0 but an expensive reversal: the interval's upper bound still pays.
        assert_eq!(advise(100, 0, Some(1000.0)), Advice::Undecided);
    }

    #[test]
    fn the_trend_needs_separated_intervals() {
        assert_eq!(trend((100, 5), (100, 40)), Some("rising"));
        assert_eq!(trend((100, 40), (100, 5)), Some("falling"));
        assert_eq!(trend((100, 10), (100, 12)), Some("steady"));
        assert_eq!(trend((0, 0), (100, 12)), None);
    }
}
