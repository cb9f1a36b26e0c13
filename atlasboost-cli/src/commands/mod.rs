//! One module per subcommand; each has a `run` that returns what the user asked for or an error.

pub mod devices;
pub mod merge;
pub mod probe;
pub mod ranktable;
pub mod validate;

use std::path::Path;

use atlasboost_core::Chip;
use atlasboost_core::ranktable::{RankTable, write_table};

use crate::error::CliError;
use crate::printer::Printer;

/// Writes a table to `path` (atomically, validated), or to standard output for `-`.
///
/// # Errors
///
/// The writer's errors; [`CliError::Stdout`] if standard output cannot be written.
pub fn write_output(
    path: &Path,
    table: &RankTable,
    chip: Chip,
    printer: &Printer,
) -> Result<(), CliError> {
    // What HCCL only recommends is said, never silently written (errors are refused).
    let warnings = if path == Path::new("-") {
        atlasboost_core::ranktable::validate_table(table, chip)
    } else {
        write_table(path, table, chip)?
    };
    for w in warnings {
        printer.error(&format!("the table: {w}"));
    }
    if path == Path::new("-") {
        return printer
            .out(&table.to_json_pretty())
            .map_err(CliError::Stdout);
    }
    printer.status(&format!(
        "wrote {} ({})",
        path.display(),
        summary(table, chip)
    ));
    Ok(())
}

/// `2 servers, 16 ranks, format 1.0, rules for 910`: what a table is, for status lines.
pub fn summary(table: &RankTable, chip: Chip) -> String {
    format!(
        "{}, {}, format {}, rules for {chip}",
        counted(table.server_count(), "server"),
        counted(table.rank_count(), "rank"),
        table.format(),
    )
}

/// `1 server`, `2 servers`.
pub fn counted(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
