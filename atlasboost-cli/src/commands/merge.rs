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
    for path in &args.inputs {
        let (value, name) = match path.as_os_str() == "-" {
            true => {
                let name = "<stdin>";
                let (value, _) = read_json_from(std::io::stdin().lock(), Path::new(name))?;
                (value, name.to_string())
            }
            false => (read_json(path)?, path.display().to_string()),
        };
        // Each input by the rules of its own version (unless --chip): a valid 1.2 table read
        // by a 1.0 table's rules would be called invalid, when what is wrong is the pair (the
        // merge names their versions). The merged table: the first input's rules.
        let rules = args.chip.unwrap_or_else(|| default_chip(&value));
        chip.get_or_insert(rules);
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
