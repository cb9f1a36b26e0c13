//! The `atlasboost` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    atlasboost_cli::main_entry()
}
