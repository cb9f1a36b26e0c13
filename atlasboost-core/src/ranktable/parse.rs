//! Reading a table: JSON text or a parsed value, validated for a chip, into the typed model.
//! (Apart from the model, so that the model does not depend on the validator, which depends
//! on the model.)

use std::path::Path;

use serde_json::Value;

use super::model::{ClusterTable, RankTable};
use super::validate::{Rule, Violation, errors_fail, validate_value};
use crate::Chip;
use crate::error::{Error, Result};

impl RankTable {
    /// Parses and validates a table from JSON text.
    ///
    /// `origin` names the source in errors (a file path, or e.g. `<stdin>`).
    ///
    /// # Errors
    ///
    /// [`Error::Json`] when the text is not JSON (with line and column), [`Error::Invalid`] with
    /// every violation when it is JSON but not a valid table for `chip`.
    pub fn parse(text: &str, origin: &Path, chip: Chip) -> Result<RankTable> {
        RankTable::parse_bytes(text.as_bytes(), origin, chip)
    }

    /// Parses and validates a table from raw bytes (bytes that are not UTF-8 are a JSON error
    /// with line and column, like any other).
    ///
    /// # Errors
    ///
    /// As [`RankTable::parse`].
    pub fn parse_bytes(bytes: &[u8], origin: &Path, chip: Chip) -> Result<RankTable> {
        let value: Value = serde_json::from_slice(bytes).map_err(|source| Error::Json {
            path: origin.to_path_buf(),
            source,
        })?;
        RankTable::from_value(value, &origin.display().to_string(), chip)
    }

    /// Validates a parsed JSON value and turns it into a table.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with every violation.
    pub fn from_value(value: Value, origin: &str, chip: Chip) -> Result<RankTable> {
        RankTable::from_value_checked(value, origin, chip).map(|(table, _)| table)
    }

    /// [`RankTable::from_value`], also returning the warnings: what HCCL only recommends.
    ///
    /// # Errors
    ///
    /// [`Error::Invalid`] with every violation (warnings too) when one is an error.
    pub fn from_value_checked(
        mut value: Value,
        origin: &str,
        chip: Chip,
    ) -> Result<(RankTable, Vec<Violation>)> {
        let warnings = errors_fail(validate_value(&value, chip), || origin.to_string())?;
        let typed = if value.get("version").is_some() {
            // HCCL reads super_pod_list only in version 1.2; elsewhere keep it verbatim, like
            // any key it ignores.
            let ignored_pods = match value.as_object_mut() {
                Some(top) if top.get("version").and_then(Value::as_str) != Some("1.2") => {
                    top.remove("super_pod_list")
                }
                _ => None,
            };
            serde_json::from_value(value).map(|mut t: ClusterTable| {
                if let Some(pods) = ignored_pods {
                    t.extra.insert("super_pod_list".into(), pods);
                }
                RankTable::Cluster(t)
            })
        } else {
            serde_json::from_value(value).map(RankTable::Legacy)
        };
        let typed = typed.map(|t| (t, warnings));
        // The validator checks every key the typed model needs, so this only fails if the two
        // disagree; report it as a violation rather than panic.
        typed.map_err(|e| Error::Invalid {
            origin: origin.to_string(),
            violations: vec![Violation::new(
                "$".to_string(),
                Rule::Structure,
                format!("table does not fit the rank-table model: {e}"),
            )],
        })
    }
}
