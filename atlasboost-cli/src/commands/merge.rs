//! `atlasboost merge`: single-server tables into one cluster table.

use std::path::{Path, PathBuf};

use atlasboost_core::Chip;
use atlasboost_core::ranktable::{
    MergeInput, RankTable, default_chip, merge_tables, read_json, read_json_from,
};

use super::write_output;
use crate::error::CliError;
use crate::printer::Printer;
use crate::settings::MergeSettings;

/// Runs `atlasboost merge`.
///
/// # Errors
///
/// An input that cannot be read or is invalid (named), a server or device IP in two inputs
/// (both named), or a merged table that breaks a rule.
pub fn run(args: &MergeSettings, printer: &Printer) -> Result<(), CliError> {
    let mut inputs = Vec::with_capacity(args.inputs.len());
    let mut chip = args.chip;
    // `-` is standard input (`ranktable -o - | atlasboost merge a.json -`), which is read once.
    if args.inputs.iter().filter(|p| p.as_os_str() == "-").count() > 1 {
        return Err(CliError::Usage(
            "`-` (standard input) is given twice; it can be read once".into(),
        ));
    }
    // The first versioned input's name and version: a table of another version is named as
    // such before it is checked by rules of the first's (a valid 1.2 table read by 1.0's rules
    // would be called invalid, with problems that are not its own).
    let mut first: Option<(String, serde_json::Value)> = None;
    for path in &args.inputs {
        let (value, name) = match path.as_os_str() == "-" {
            true => {
                let name = "<stdin>";
                let (value, _) = read_json_from(std::io::stdin().lock(), Path::new(name))?;
                (value, name.to_string())
            }
            false => (read_json(path)?, path.display().to_string()),
        };
        let version = value.get("version").cloned().unwrap_or_default();
        match &first {
            // The first that has a version (a legacy table, which has none, is named as such
            // by the merge itself).
            None if !version.is_null() => first = Some((name.clone(), version)),
            None => {}
            Some((first_name, first_version))
                if *first_version != version && !version.is_null() =>
            {
                return Err(atlasboost_core::Error::Merge(format!(
                    "{first_name} has version {first_version} but {name} has version {version}"
                ))
                .into());
            }
            Some(_) => {}
        }
        // Without --chip, the first input's version decides the rules for all.
        let rules = *chip.get_or_insert_with(|| default_chip(&value));
        inputs.push(MergeInput {
            table: RankTable::from_value(value, &name, rules)?,
            name,
        });
    }
    let chip = chip.unwrap_or(Chip::Ascend910);
    let merged = merge_tables(&inputs, chip)?;
    let path = args
        .output
        .clone()
        .unwrap_or_else(|| default_file_name(&merged));
    write_output(&path, &merged, chip, printer)
}

/// `hccl_<S>s_<N>p.json`, the name `merge_hccl.py` gives.
pub fn default_file_name(table: &RankTable) -> PathBuf {
    PathBuf::from(format!(
        "hccl_{}s_{}p.json",
        table.server_count(),
        table.rank_count()
    ))
}
