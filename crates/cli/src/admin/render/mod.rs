//! How the admin verbs show the worker's answers to people: tables, labelled lines, log
//! entries as text, relative times and sizes. Pure: JSON in, text out.

mod lambdas;
mod logs;
mod sites;
mod stats;
mod text;

pub(super) use lambdas::{combined, figures_of, with_invocations};
pub use lambdas::{render_ls, render_show};
pub(super) use logs::dropped_note;
pub use logs::{clean, render_entry};
pub(super) use sites::describe_site;
pub use sites::render_sites;
pub use stats::render_stats;
pub use text::pretty;

#[cfg(test)]
mod tests;
