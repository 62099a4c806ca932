//! Write-path mechanisms a benchmark may turn off (`COUNTERSIGN_STORE_ABLATE`).
//!
//! Invariant: turning any of them off leaves a path that keeps every guarantee (the plain
//! path the mechanism was added beside); only the speed may change.

/// Mechanisms of the Postgres write path that a benchmark may turn off to measure what each
/// pays (issue 34: what does not pay goes; the pipelined commit with its flush barrier and the
/// pool of unflushed connections went that way, docs/performance.md). Every combination
/// keeps every guarantee: what is left is the plain path the mechanism was added beside.
/// SQLite has none of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ablations {
    /// Never write a batch as one statement (`countersign_commit_batch`): the
    /// multi-statement batch only.
    pub no_one_trip: bool,
    /// Never write a read (its step row with its outcome) in the one-trip batch: a batch
    /// holding one takes the multi-statement path.
    pub no_one_trip_reads: bool,
}

impl Ablations {
    /// The names [`Ablations::parse`] accepts.
    pub const NAMES: [&'static str; 2] = ["one_trip", "one_trip_reads"];

    /// A comma-separated list of [`Ablations::NAMES`] (empty: none); an unknown name is an
    /// error naming it.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut out = Self::default();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "one_trip" => out.no_one_trip = true,
                "one_trip_reads" => out.no_one_trip_reads = true,
                other => {
                    return Err(format!(
                        "unknown mechanism {other:?} (expected some of {})",
                        Self::NAMES.join(", ")
                    ));
                }
            }
        }
        Ok(out)
    }
}
