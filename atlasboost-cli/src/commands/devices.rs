//! This host's `server_id` for the commands that probe it (`probe`, `ranktable`).

use crate::error::CliError;
use crate::settings::DeviceSettings;

/// This host's `server_id`: `--server-id`, else its primary IPv4 address
/// ([`atlasboost::host::server_id`]).
///
/// # Errors
///
/// [`CliError::Host`] when no address can be found (the message says to pass `--server-id`).
pub fn server_id(args: &DeviceSettings) -> Result<String, CliError> {
    atlasboost::host::server_id(args.server_id.as_deref()).map_err(|error| CliError::Host { error })
}
