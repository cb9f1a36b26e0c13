//! The exit codes of the `atlasboost` command (SPEC §8), in one place.

/// Exit codes, as documented in the README.
#[derive(Debug)]
pub struct ExitCodes;

impl ExitCodes {
    /// Everything worked; `validate`: the table is valid.
    pub const SUCCESS: u8 = 0;
    /// `validate`: the table breaks at least one rule.
    pub const INVALID_TABLE: u8 = 1;
    /// The command line is malformed (clap's own code for usage errors).
    pub const USAGE: u8 = 2;
    /// atlasboost itself failed: bad input, probe, rendezvous, a file that cannot be read.
    pub const FAILURE: u8 = 125;
    /// The worker command exists but cannot be executed.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The worker command was not found.
    pub const NOT_FOUND: u8 = 127;
}
