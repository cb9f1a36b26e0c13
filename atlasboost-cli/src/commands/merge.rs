//! `atlasboost merge`: single-server tables into one cluster table.

use std::path::PathBuf;

use atlasboost_core::ranktable::{MergeInput, RankTable, merge_tables, read_table};

use super::write_output;
use crate::cli::MergeArgs;
use crate::error::CliError;
use crate::printer::Printer;

/// Runs `atlasboost merge`.
///
/// # Errors
///
/// An input that cannot be read or is invalid (named), a server or device IP in two inputs
/// (both named), or a merged table that breaks a rule.
pub fn run(args: &MergeArgs, printer: &Printer) -> Result<(), CliError> {
    let mut inputs = Vec::with_capacity(args.inputs.len());
    for path in &args.inputs {
        inputs.push(MergeInput {
            name: path.display().to_string(),
            table: read_table(path, args.chip)?,
        });
    }
    let merged = merge_tables(&inputs, args.chip)?;
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| default_file_name(&merged));
    write_output(&path, &merged, args.chip, printer)
}

/// `hccl_<S>s_<N>p.json`, the name `merge_hccl.py` gives.
pub fn default_file_name(table: &RankTable) -> PathBuf {
    PathBuf::from(format!(
        "hccl_{}s_{}p.json",
        table.server_count(),
        table.rank_count()
    ))
}
