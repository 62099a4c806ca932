//! Crash-test hooks (debug builds only).

/// Crash-test hook (debug builds only): when `COUNTERSIGN_TEST_CRASH_AT` names this point,
/// the process aborts there, as a SIGKILL would stop it.
pub(super) fn failpoint(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("COUNTERSIGN_TEST_CRASH_AT").is_ok_and(|v| v == name) {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
