//! `atlasboost validate`: every rule HCCL applies, every violation listed.

use atlasboost_core::Error;
use atlasboost_core::ranktable::{RankTable, Violation, default_chip, read_json};
use serde::Serialize;

use super::{counted, summary};
use crate::error::CliError;
use crate::exit::ExitCodes;
use crate::printer::Printer;
use crate::settings::ValidateSettings;

/// The `--json` report.
#[derive(Debug, Serialize)]
struct Report<'a> {
    file: String,
    valid: bool,
    chip: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    format: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    servers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<usize>,
    violations: &'a [Violation],
}

/// Runs `atlasboost validate`; returns the exit code (0 valid, 1 invalid).
///
/// # Errors
///
/// A file that cannot be read, or is not JSON (with the parser's line and column): exit 125.
pub fn run(args: &ValidateSettings, printer: &Printer) -> Result<u8, CliError> {
    let value = read_json(&args.file)?;
    let chip = args.chip.unwrap_or_else(|| default_chip(&value));
    // One validation: `from_value` returns every violation when the table is invalid.
    let (table, violations) =
        match RankTable::from_value(value, &args.file.display().to_string(), chip) {
            Ok(t) => (Some(t), Vec::new()),
            Err(Error::Invalid { violations, .. }) => (None, violations),
            Err(e) => return Err(e.into()),
        };
    let file = args.file.display().to_string();
    let text = if args.json {
        let report = Report {
            file,
            valid: table.is_some(),
            chip: chip.as_str(),
            format: table.as_ref().map(|t| t.format().as_str()),
            servers: table.as_ref().map(RankTable::server_count),
            ranks: table.as_ref().map(RankTable::rank_count),
            violations: &violations,
        };
        let mut s =
            serde_json::to_string_pretty(&report).map_err(CliError::json("encode the report"))?;
        s.push('\n');
        s
    } else if let Some(t) = &table {
        format!("{file}: valid rank table ({})\n", summary(t, chip))
    } else {
        let mut s = format!(
            "{file}: invalid rank table, {} (rules for {}):\n",
            counted(violations.len(), "problem"),
            chip
        );
        for v in &violations {
            s.push_str(&format!("  {v}\n"));
        }
        s
    };
    printer.out(&text).map_err(CliError::Stdout)?;
    Ok(if table.is_some() {
        ExitCodes::SUCCESS
    } else {
        ExitCodes::INVALID_TABLE
    })
}
