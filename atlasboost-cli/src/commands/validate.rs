//! `atlasboost validate`: every rule HCCL applies, every violation listed.

use atlasboost_core::ranktable::{
    RankTable, Rule, Violation, default_chip, duplicate_keys, read_json_bytes, read_json_from,
};
use atlasboost_core::{Chip, Error};
use std::path::Path;

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
    errors: usize,
    warnings: usize,
    strict: bool,
    violations: &'a [Violation],
}

/// Runs `atlasboost validate`; returns the exit code (0 valid, 1 invalid). Warnings (what HCCL
/// only recommends) leave a table valid, unless `--strict`.
///
/// # Errors
///
/// A file that cannot be read: exit 125 (an error on stderr, no report). One that is not JSON
/// is an invalid table (rule `not-json`, with the parser's line and column), reported as any
/// other, `--json` too; its `chip` is `--chip`'s, or 910 (there is no version to tell).
pub fn run(args: &ValidateSettings, printer: &Printer) -> Result<u8, CliError> {
    // `-` is standard input, as `ranktable -o -` is standard output.
    let stdin = args.file.as_os_str() == "-";
    let file = match stdin {
        true => "<stdin>".to_string(),
        false => args.file.display().to_string(),
    };
    let read = match stdin {
        true => read_json_from(std::io::stdin().lock(), Path::new(&file)),
        false => read_json_bytes(&args.file),
    };
    let (chip, table, violations) = match read {
        Ok((value, bytes)) => {
            let chip = args.chip.unwrap_or_else(|| default_chip(&value));
            // One validation: every violation, errors and warnings, either way.
            let (table, mut violations) = match RankTable::from_value_checked(value, &file, chip) {
                Ok((t, warnings)) => (Some(t), warnings),
                Err(Error::Invalid { violations, .. }) => (None, violations),
                Err(e) => return Err(e.into()),
            };
            // What the parsed value no longer shows: a key given twice, of which only the
            // last counts.
            violations.extend(duplicate_keys(&bytes));
            (chip, table, violations)
        }
        Err(e @ (Error::Json { .. } | Error::ByteOrderMark { .. })) => {
            let why = match &e {
                Error::Json { source, .. } => format!("not JSON: {source}"),
                _ => "not JSON: it starts with a UTF-8 byte-order mark (EF BB BF); save it \
                      without one"
                    .into(),
            };
            let not_json = Violation::new("$".into(), Rule::NotJson, why);
            (args.chip.unwrap_or(Chip::Ascend910), None, vec![not_json])
        }
        Err(e) => return Err(e.into()),
    };
    let errors = violations.iter().filter(|v| v.is_error()).count();
    let warnings = violations.len() - errors;
    let valid = table.is_some() && !(args.strict && warnings > 0);
    let text = if args.json {
        let report = Report {
            file,
            valid,
            chip: chip.as_str(),
            format: table.as_ref().map(|t| t.format().as_str()),
            servers: table.as_ref().map(RankTable::server_count),
            ranks: table.as_ref().map(RankTable::rank_count),
            errors,
            warnings,
            strict: args.strict,
            violations: &violations,
        };
        let mut s =
            serde_json::to_string_pretty(&report).map_err(CliError::json("encode the report"))?;
        s.push('\n');
        s
    } else {
        let mut s = match (&table, valid) {
            (Some(t), true) if warnings == 0 => {
                format!("{file}: valid rank table ({})\n", summary(t, chip))
            }
            (Some(t), true) => format!(
                "{file}: valid rank table ({}), with {} (what HCCL only recommends; --strict \
                 makes them errors):\n",
                summary(t, chip),
                counted(warnings, "warning")
            ),
            (Some(_), false) => format!(
                "{file}: invalid rank table with --strict, {} (rules for {}):\n",
                counted(warnings, "warning"),
                chip
            ),
            (None, _) if warnings == 0 => format!(
                "{file}: invalid rank table, {} (rules for {}):\n",
                counted(errors, "problem"),
                chip
            ),
            (None, _) => format!(
                "{file}: invalid rank table, {} and {} (rules for {}):\n",
                counted(errors, "problem"),
                counted(warnings, "warning"),
                chip
            ),
        };
        for v in &violations {
            s.push_str(&format!("  {v}\n"));
        }
        // HCCL's own check, of the file's name rather than its contents.
        if !stdin && let Some(why) = atlasboost_core::ranktable::hccl_name_problem(&args.file) {
            s.push_str(&format!("note: {file}: {why}\n"));
        }
        // The table does not say its chip: a 910B or A3 table breaks the 910's topology
        // rules, which apply when none is named.
        let topology = [
            Rule::DeviceCount,
            Rule::DeviceIdRange,
            Rule::CrossesGroups,
            Rule::UnequalDeviceCounts,
        ];
        if args.chip.is_none()
            && chip == Chip::Ascend910
            && violations.iter().any(|v| topology.contains(&v.rule))
        {
            s.push_str(
                "note: these are the 910's rules: no --chip was given, and a table does not say its \
                 chip; for an Atlas A2 (910B) or A3 (910_93) table, pass --chip 910b or --chip 910_93\n",
            );
        }
        s
    };
    printer.out(&text).map_err(CliError::Stdout)?;
    Ok(if valid {
        ExitCodes::SUCCESS
    } else {
        ExitCodes::INVALID_TABLE
    })
}
