//! The `atlasboost` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    atlasboost_cli::main_entry()
}

/// Whether standard output is closed (`>&-`), noted before Rust's runtime opens `/dev/null`
/// there: a command whose result goes to standard output then says it would be lost.
#[used]
#[unsafe(link_section = ".init_array")]
static NOTE_CLOSED_STDOUT: extern "C" fn() = note_closed_stdout;

extern "C" fn note_closed_stdout() {
    atlasboost_cli::printer::note_closed_stdout();
}
