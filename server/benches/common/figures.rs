//! The figures `make bench` gathers into `docs/benchmarks.json`: each is one JSON object,
//! appended as one line to the file `BENCH_FIGURES` names (nothing is written when it is
//! unset). `BENCH_DATE` and `BENCH_COMMIT` (set by scripts/bench.sh) stamp each object.

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};

/// One side of a ratio.
pub struct Side {
    pub what: String,
    pub value: f64,
    pub unit: &'static str,
}

/// Appends the figure `name` = `value` with its two sides and its target.
pub fn record(name: &str, value: f64, target: &str, met: bool, over: Side, under: Side) {
    let Ok(path) = std::env::var("BENCH_FIGURES") else {
        return;
    };
    let env = |k: &str| std::env::var(k).unwrap_or_else(|_| "unknown".into());
    let side = |s: Side| json!({"what": s.what, "value": round(s.value), "unit": s.unit});
    let line = json!({
        "figure": name,
        "value": round(value),
        "target": target,
        "met": met,
        "numerator": side(over),
        "denominator": side(under),
        "date": env("BENCH_DATE"),
        "commit": env("BENCH_COMMIT"),
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("BENCH_FIGURES {path}: {e}"));
    writeln!(f, "{line}").unwrap();
}

fn round(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

/// The median of `xs` (the mean of the middle two for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// `min–max` of `xs` with `digits` decimals.
pub fn spread(xs: &[f64], digits: usize) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if lo.is_finite() && hi.is_finite() {
        format!("{lo:.digits$}–{hi:.digits$}")
    } else {
        "n/a".into()
    }
}

/// Milliseconds per call of `d` over `calls`.
pub fn ms_per(d: Duration, calls: usize) -> f64 {
    if calls == 0 {
        return f64::NAN;
    }
    d.as_secs_f64() * 1e3 / calls as f64
}
