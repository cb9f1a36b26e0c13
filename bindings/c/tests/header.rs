//! The checked-in header `include/atlasboost.h` is what cbindgen makes of `src/lib.rs` with
//! `cbindgen.toml`. `ATLASBOOST_UPDATE_HEADER=1 cargo test -p atlasboost-c --test header`
//! rewrites it.

use std::path::Path;

const UPDATE: &str = "ATLASBOOST_UPDATE_HEADER";

fn generate(crate_dir: &Path) -> String {
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .unwrap_or_else(|e| panic!("bindings/c/cbindgen.toml: {e}"));
    // One source file, read directly: no `cargo metadata` (which other cargo runs could be
    // holding up) and nothing from other crates.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src").join("lib.rs"))
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen cannot generate the header: {e}"));
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).unwrap_or_else(|e| panic!("cbindgen wrote something not UTF-8: {e}"))
}

#[test]
fn the_checked_in_header_is_up_to_date() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = crate_dir.join("include").join("atlasboost.h");
    let generated = generate(crate_dir);
    for name in [
        "atlasboost_init",
        "atlasboost_rank",
        "atlasboost_finalize",
        "atlasboost_last_error",
        "ATLASBOOST_ERR_NOT_INITIALIZED",
        "#ifndef ATLASBOOST_H",
    ] {
        assert!(
            generated.contains(name),
            "cbindgen's header has no {name}:\n{generated}"
        );
    }
    if std::env::var_os(UPDATE).is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        eprintln!("{UPDATE}=1: wrote {}", path.display());
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in == generated {
        return;
    }
    let first = checked_in
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| checked_in.lines().count().min(generated.lines().count()));
    panic!(
        "{} is not what cbindgen makes of src/lib.rs (first difference at line {}):\n\
         checked in: {:?}\n\
         generated:  {:?}\n\
         Update it with:\n    {UPDATE}=1 cargo test -p atlasboost-c --test header\n\
         and check the change in.",
        path.display(),
        first + 1,
        checked_in.lines().nth(first).unwrap_or("(end of file)"),
        generated.lines().nth(first).unwrap_or("(end of file)"),
    );
}
