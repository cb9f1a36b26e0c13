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
    if path == Path::new("-") {
        return printer
            .out(&table.to_json_pretty())
            .map_err(CliError::Stdout);
    }
    write_table(path, table, chip)?;
    printer.status(&format!(
        "wrote {} ({} server{}, {} rank{}, format {}, rules for {chip})",
        path.display(),
        table.server_count(),
        if table.server_count() == 1 { "" } else { "s" },
        table.rank_count(),
        if table.rank_count() == 1 { "" } else { "s" },
        table.format(),
    ));
    Ok(())
}
