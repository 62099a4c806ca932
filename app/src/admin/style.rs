//! The classes the admin page's panels share.

pub(super) const INPUT: &str = "rounded border border-slate-500 bg-white px-2 py-1 text-sm focus:outline-none focus:ring-2 focus:ring-indigo-500";
pub(super) const BUTTON: &str = "rounded bg-indigo-700 px-3 py-1.5 text-sm font-medium text-white hover:bg-indigo-800 focus:outline-none focus:ring-2 focus:ring-indigo-500 focus:ring-offset-2";
pub(super) const H2: &str = "text-xl font-semibold";
pub(super) const CARD: &str = "space-y-3 rounded border border-slate-200 bg-white p-4";
